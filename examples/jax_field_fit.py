"""Fit a fusekit.jax.nn.GaussianField to a 3-D density in JAX, with the optax Shampoo.

The JAX twin of examples/gaussian_field_fit.py: the same torus + blob target and
mean squared error at sample points, but the field is fusekit.jax.nn's (plain
functions: ``field.init(key)`` gives the parameters, ``field(params, points)``
runs fusekit's fused field op through XLA's FFI, its gradient fusekit's fused
backward) and the optimizer is ``fusekit.jax.optim.shampoo`` (statistics, Newton
roots and preconditioning through fusekit.jax's ops; Adam grafting), or optax's
Adam with ``--optimizer adam``. The whole training step, gradient and optimizer
update included, is one ``jax.jit``. The loss is printed as it goes; a PNG
(matplotlib, when importable) shows the loss curve and the z = 0 slice of the
target and of the fit.

    python examples/jax_field_fit.py                      # CPU, 200 steps
    python examples/jax_field_fit.py --smoke              # a few seconds on a CPU
    python examples/jax_field_fit.py --optimizer adam     # optax.adam instead

Exits non-zero unless the loss fell below a quarter of its initial value.
Needs libfusekit (cargo build --release), jax and optax; run from the
repository root, or with bindings/python on PYTHONPATH.
"""

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import fusekit  # noqa: E402
import fusekit.jax.nn as fknn  # noqa: E402
import fusekit.jax.optim as fko  # noqa: E402

BOX = (2.6, 2.6, 1.2)  # the sampled volume [-1.3, 1.3] x [-1.3, 1.3] x [-0.6, 0.6]


def target(p):
    """The torus + blob density at points [B, 3] (as examples/gaussian_fit.c)."""
    x, y, z = p[:, 0], p[:, 1], p[:, 2]
    rho = np.sqrt(x * x + y * y) - 0.8
    torus = np.exp(-(rho * rho + z * z) / (2.0 * 0.12 ** 2))
    u, v, w = (x + 0.5 * y) / 0.22, (y - 0.3 * x) / 0.1, z / 0.15
    return torus + 0.8 * np.exp(-0.5 * (u * u + v * v + w * w))


def sample_points(n: int, rng) -> np.ndarray:
    """A third uniform in the box, half near the torus, the rest near the blob."""
    r = rng.random(n)
    box = (rng.random((n, 3)) - 0.5) * np.asarray(BOX)
    t = 2 * math.pi * rng.random(n)
    g = rng.standard_normal((n, 3))
    rad = 0.8 + 0.15 * g[:, 0]
    torus = np.stack((rad * np.cos(t), rad * np.sin(t), 0.15 * g[:, 2]), -1)
    blob = g * np.asarray([0.25, 0.15, 0.15])
    return np.where((r < 0.34)[:, None], box, np.where((r < 0.85)[:, None], torus, blob))


def slice_grid(px: int) -> np.ndarray:
    """The z = 0 plane over the box, [px*px, 3] (row-major, y down)."""
    xs = np.linspace(-BOX[0] / 2, BOX[0] / 2, px)
    ys = np.linspace(BOX[1] / 2, -BOX[1] / 2, px)
    yy, xx = np.meshgrid(ys, xs, indexing="ij")
    return np.stack((xx, yy, np.zeros_like(xx)), -1).reshape(-1, 3)


def write_plot(path, losses, tgt, fit, px, label):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written (pip install matplotlib)")
        return False
    fig, ax = plt.subplots(1, 3, figsize=(14, 4.2), layout="constrained")
    ax[0].semilogy(range(len(losses)), losses)
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("MSE loss")
    ax[0].set_title(f"loss ({label})")
    ax[0].grid(True, which="both", alpha=0.3)
    extent = (-BOX[0] / 2, BOX[0] / 2, -BOX[1] / 2, BOX[1] / 2)
    vmax = float(max(tgt.max(), fit.max()))
    for a, img, title in ((ax[1], tgt, "target, z = 0"), (ax[2], fit, "fusekit.jax.nn.GaussianField fit, z = 0")):
        im = a.imshow(img.reshape(px, px), extent=extent, vmin=0.0, vmax=vmax, cmap="magma")
        a.set_title(title)
        a.set_xlabel("x")
        a.set_ylabel("y")
    fig.colorbar(im, ax=ax[1:], shrink=0.9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gaussians", type=int, default=96)
    ap.add_argument("--points", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--optimizer", choices=("shampoo", "adam"), default="shampoo")
    ap.add_argument("--precondition-frequency", type=int, default=10, help="Shampoo's roots every K steps")
    ap.add_argument("--every", type=int, default=0, help="print the loss every K steps (default: ~10 lines)")
    ap.add_argument("--image", type=int, default=160, help="the slice is PX x PX")
    ap.add_argument("--out", default="jax_field_fit.png", help="PNG path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="a small run (48 Gaussians, 2048 points, 60 steps)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.gaussians, args.points, args.steps, args.image = 48, 2048, 60, 64
    every = args.every or max(1, args.steps // 10)

    rng = np.random.default_rng(args.seed)
    pts_np = sample_points(args.points, rng)
    pts = jnp.asarray(pts_np, jnp.float32)
    tgt = jnp.asarray(target(pts_np), jnp.float32)
    field = fknn.GaussianField(args.gaussians, volume_size=BOX)
    params = field.init(jax.random.key(args.seed))
    params["weights"] = jnp.full_like(params["weights"], 0.3)  # a faint field to start from: the target is <= ~1.8
    if args.optimizer == "shampoo":
        opt = fko.shampoo(args.lr, betas=(0.9, 0.999), epsilon=1e-8, precondition_frequency=args.precondition_frequency,
                          grafting="adam")
    else:
        opt = optax.adam(args.lr)
    state = opt.init(params)

    def loss_fn(p):
        return jnp.mean((field(p, pts) - tgt) ** 2)

    @jax.jit
    def step(p, state):
        loss, g = jax.value_and_grad(loss_fn)(p)
        updates, state = opt.update(g, state, p)
        return optax.apply_updates(p, updates), state, loss

    print(f"fusekit {fusekit.__version__} (jax {jax.__version__}) on {jax.devices()[0].platform}")
    print(f"fitting {field} to a torus + blob density at {args.points} points, {args.steps} {args.optimizer} steps "
          f"(lr {args.lr})")
    losses = []
    t0 = time.perf_counter()
    for i in range(args.steps + 1):
        if i < args.steps:
            params, state, loss = step(params, state)
        else:
            loss = jax.jit(loss_fn)(params)
        losses.append(float(loss))
        if i % every == 0 or i == args.steps:
            print(f"step {i:5d}  loss {losses[-1]:.6f}  ({100 * losses[-1] / losses[0]:5.1f}% of the initial)"
                  f"  {time.perf_counter() - t0:6.2f} s")
    dt = time.perf_counter() - t0
    print(f"trained in {dt:.2f} s ({1e3 * dt / max(args.steps, 1):.1f} ms per step, the first one compiling); "
          f"loss {losses[0]:.6f} -> {losses[-1]:.6f} ({losses[0] / losses[-1]:.1f}x lower)")

    grid = slice_grid(args.image)
    fit = np.asarray(jax.jit(field)(params, jnp.asarray(grid, jnp.float32)), np.float64)
    ref = target(grid)
    print(f"z = 0 slice: relative error of the fit {np.linalg.norm(fit - ref) / np.linalg.norm(ref):.3f}")
    if write_plot(args.out, losses, ref, fit, args.image, args.optimizer):
        print(f"wrote {args.out} (loss curve; target and fit on the z = 0 plane)")
    if not losses[-1] < 0.25 * losses[0]:
        print(f"FAILED: the loss did not fall below a quarter of its initial value ({losses[0]} -> {losses[-1]})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
