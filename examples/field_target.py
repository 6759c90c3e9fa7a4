"""The target of the Gaussian field fits (gaussian_field_fit.py with torch,
jax_field_fit.py with JAX), in numpy: the torus + blob density of gaussian_fit.c,
the sample points, the z = 0 slice and the PNG of the loss curve and the slices."""

import argparse
import math
import sys
import time

import numpy as np
from plotting import loss_panel, pyplot

BOX = (2.6, 2.6, 1.2)  # the sampled volume [-1.3, 1.3] x [-1.3, 1.3] x [-0.6, 0.6]


def target(p: np.ndarray) -> np.ndarray:
    """The torus + blob density at points [B, 3] (as examples/gaussian_fit.c)."""
    x, y, z = p[:, 0], p[:, 1], p[:, 2]
    rho = np.sqrt(x * x + y * y) - 0.8
    torus = np.exp(-(rho * rho + z * z) / (2.0 * 0.12 ** 2))
    u, v, w = (x + 0.5 * y) / 0.22, (y - 0.3 * x) / 0.1, z / 0.15
    return torus + 0.8 * np.exp(-0.5 * (u * u + v * v + w * w))


def sample_points(n: int, seed: int) -> np.ndarray:
    """``[n, 3]`` float64: a third uniform in the box, half near the torus, the rest near the blob."""
    rng = np.random.default_rng(seed)
    r = rng.random(n)
    box = (rng.random((n, 3)) - 0.5) * np.asarray(BOX)
    t = 2 * math.pi * rng.random(n)
    g = rng.standard_normal((n, 3))
    rad = 0.8 + 0.15 * g[:, 0]
    torus = np.stack((rad * np.cos(t), rad * np.sin(t), 0.15 * g[:, 2]), -1)
    blob = g * np.asarray([0.25, 0.15, 0.15])
    return np.where((r < 0.34)[:, None], box, np.where((r < 0.85)[:, None], torus, blob))


def slice_grid(px: int) -> np.ndarray:
    """The z = 0 plane over the box, ``[px*px, 3]`` (row-major, y down)."""
    xs = np.linspace(-BOX[0] / 2, BOX[0] / 2, px)
    ys = np.linspace(BOX[1] / 2, -BOX[1] / 2, px)
    yy, xx = np.meshgrid(ys, xs, indexing="ij")
    return np.stack((xx, yy, np.zeros_like(xx)), -1).reshape(-1, 3)


def write_plot(path, losses, tgt, fit, px, *, loss_title="loss", fit_title="GaussianField fit, z = 0") -> bool:
    """The loss curve and the z = 0 slices of the target and the fit (numpy
    ``[px*px]`` each) as a PNG; False (and a note) without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(1, 3, figsize=(14, 4.2), layout="constrained")
    loss_panel(ax[0], losses, loss_title)
    extent = (-BOX[0] / 2, BOX[0] / 2, -BOX[1] / 2, BOX[1] / 2)
    vmax = float(max(tgt.max(), fit.max()))
    for a, img, title in ((ax[1], tgt, "target, z = 0"), (ax[2], fit, fit_title)):
        im = a.imshow(np.asarray(img).reshape(px, px), extent=extent, vmin=0.0, vmax=vmax, cmap="magma")
        a.set_title(title)
        a.set_xlabel("x")
        a.set_ylabel("y")
    fig.colorbar(im, ax=ax[1:], shrink=0.9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def report(losses, dt: float, steps: int, fit, ref, extra: str = "") -> None:
    """The closing lines both fits print."""
    print(f"trained in {dt:.2f} s ({1e3 * dt / max(steps, 1):.1f} ms per step{extra}); loss {losses[0]:.6f} -> "
          f"{losses[-1]:.6f} ({losses[0] / losses[-1]:.1f}x lower)")
    print(f"z = 0 slice: relative error of the fit {np.linalg.norm(fit - ref) / np.linalg.norm(ref):.3f}")


def passed(losses) -> bool:
    """Whether the loss fell below a quarter of its initial value (a message when not)."""
    if losses[-1] < 0.25 * losses[0]:
        return True
    print(f"FAILED: the loss did not fall below a quarter of its initial value ({losses[0]} -> {losses[-1]})",
          file=sys.stderr)
    return False


def banner(host: str, field, args, optimizer: str) -> None:
    """The opening lines both fits print."""
    print(host)
    print(f"fitting {field} to a torus + blob density at {args.points} points, {args.steps} {optimizer} steps "
          f"(lr {args.lr})")


def progress(step: int, losses, t0: float) -> None:
    """One line of the loss curve."""
    print(f"step {step:5d}  loss {losses[-1]:.6f}  ({100 * losses[-1] / losses[0]:5.1f}% of the initial)"
          f"  {time.perf_counter() - t0:6.2f} s")


def parser(description: str, *, steps: int, out: str, smoke_steps: int) -> argparse.ArgumentParser:
    """The options both fits take (an example adds its own); :func:`parse` applies ``--smoke``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--gaussians", type=int, default=96)
    ap.add_argument("--points", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--every", type=int, default=0, help="print the loss every K steps (default: ~10 lines)")
    ap.add_argument("--image", type=int, default=160, help="the slice is PX x PX")
    ap.add_argument("--out", default=out, help="PNG path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help=f"a small run (48 Gaussians, 2048 points, {smoke_steps} steps)")
    ap.set_defaults(smoke_steps=smoke_steps)
    return ap


def parse(ap: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """The options, with ``--smoke``'s sizes and ``every`` (~10 lines) filled in."""
    args = ap.parse_args(argv)
    if args.smoke:
        args.gaussians, args.points, args.steps, args.image = 48, 2048, args.smoke_steps, 64
    args.every = args.every or max(1, args.steps // 10)
    return args
