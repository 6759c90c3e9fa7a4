"""Fit a fusekit.nn.GaussianField to a 3-D density with Adam.

The target is the density of examples/gaussian_fit.c (a torus of radius 0.8 in the
z = 0 plane and a tilted ellipsoidal blob at its centre); the loss is the mean
squared error of the field at sample points. The field, its backward and the
Cholesky parametrisation are the module's (fusekit's fused field op underneath);
the optimizer is torch.optim.Adam. The loss curve is printed as it goes, and a PNG
(matplotlib, when importable) shows the loss curve and the z = 0 slice of the target
and of the fit.

    python examples/gaussian_field_fit.py                    # CPU, ~300 steps
    python examples/gaussian_field_fit.py --smoke            # a few seconds on a CPU
    python examples/gaussian_field_fit.py --device cuda --gaussians 4096 --points 65536 --steps 2000

Exits non-zero unless the loss fell below a quarter of its initial value.
Needs libfusekit (cargo build --release) and the compiled torch ops (see
bindings/python/README.md); run from the repository root, or with
bindings/python on PYTHONPATH.
"""

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))

import torch  # noqa: E402

import fusekit  # noqa: E402
import fusekit.nn as fnn  # noqa: E402

BOX = (2.6, 2.6, 1.2)  # the sampled volume [-1.3, 1.3] x [-1.3, 1.3] x [-0.6, 0.6]


def target(p: torch.Tensor) -> torch.Tensor:
    """The torus + blob density at points [B, 3] (as examples/gaussian_fit.c)."""
    x, y, z = p.unbind(-1)
    rho = torch.sqrt(x * x + y * y) - 0.8
    torus = torch.exp(-(rho * rho + z * z) / (2.0 * 0.12 ** 2))
    u, v, w = (x + 0.5 * y) / 0.22, (y - 0.3 * x) / 0.1, z / 0.15
    return torus + 0.8 * torch.exp(-0.5 * (u * u + v * v + w * w))


def sample_points(n: int, gen: torch.Generator) -> torch.Tensor:
    """A third uniform in the box, half near the torus, the rest near the blob."""
    r = torch.rand(n, generator=gen, dtype=torch.float64)
    box = (torch.rand(n, 3, generator=gen, dtype=torch.float64) - 0.5) * torch.tensor(BOX, dtype=torch.float64)
    t = 2 * math.pi * torch.rand(n, generator=gen, dtype=torch.float64)
    g = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    rad = 0.8 + 0.15 * g[:, 0]
    torus = torch.stack((rad * torch.cos(t), rad * torch.sin(t), 0.15 * g[:, 2]), -1)
    blob = g * torch.tensor([0.25, 0.15, 0.15], dtype=torch.float64)
    pick = torch.where((r < 0.34)[:, None], box, torch.where((r < 0.85)[:, None], torus, blob))
    return pick


def slice_grid(px: int) -> torch.Tensor:
    """The z = 0 plane over the box, [px*px, 3] (row-major, y down)."""
    xs = torch.linspace(-BOX[0] / 2, BOX[0] / 2, px, dtype=torch.float64)
    ys = torch.linspace(BOX[1] / 2, -BOX[1] / 2, px, dtype=torch.float64)
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((xx, yy, torch.zeros_like(xx)), -1).reshape(-1, 3)


def write_plot(path, losses, tgt, fit, px):
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
    ax[0].set_title("loss")
    ax[0].grid(True, which="both", alpha=0.3)
    extent = (-BOX[0] / 2, BOX[0] / 2, -BOX[1] / 2, BOX[1] / 2)
    vmax = float(max(tgt.max(), fit.max()))
    for a, img, title in ((ax[1], tgt, "target, z = 0"), (ax[2], fit, "GaussianField fit, z = 0")):
        im = a.imshow(img.reshape(px, px).numpy(), extent=extent, vmin=0.0, vmax=vmax, cmap="magma")
        a.set_title(title)
        a.set_xlabel("x")
        a.set_ylabel("y")
    fig.colorbar(im, ax=ax[1:], shrink=0.9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--gaussians", type=int, default=96)
    ap.add_argument("--points", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--diagonal", action="store_true", help="diagonal covariances (default: full)")
    ap.add_argument("--every", type=int, default=0, help="print the loss every K steps (default: ~10 lines)")
    ap.add_argument("--image", type=int, default=160, help="the slice is PX x PX")
    ap.add_argument("--out", default="gaussian_field_fit.png", help="PNG path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="a small run (48 Gaussians, 2048 points, 80 steps)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.gaussians, args.points, args.steps, args.image = 48, 2048, 80, 64
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    every = args.every or max(1, args.steps // 10)

    gen = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    pts = sample_points(args.points, gen)
    tgt = target(pts).float().to(dev)
    pts = pts.float().to(dev)
    field = fnn.GaussianField(args.gaussians, volume_size=BOX, full_covariance=not args.diagonal, device=dev)
    with torch.no_grad():  # start from a faint field: the target is at most ~1.8
        field.weights.fill_(0.3)
    opt = torch.optim.Adam(field.parameters(), lr=args.lr)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"fusekit {fusekit.__version__} (torch {torch.__version__}) on {name}")
    print(f"fitting {field} to a torus + blob density at {args.points} points, {args.steps} Adam steps "
          f"(lr {args.lr})")

    losses = []
    t0 = time.perf_counter()
    for step in range(args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = (field(pts) - tgt).square().mean()
        if step < args.steps:
            loss.backward()
            opt.step()
        losses.append(loss.item())
        if step % every == 0 or step == args.steps:
            print(f"step {step:5d}  loss {losses[-1]:.6f}  ({100 * losses[-1] / losses[0]:5.1f}% of the initial)"
                  f"  {time.perf_counter() - t0:6.2f} s")
    dt = time.perf_counter() - t0
    print(f"trained in {dt:.2f} s ({1e3 * dt / max(args.steps, 1):.1f} ms per step); loss {losses[0]:.6f} -> "
          f"{losses[-1]:.6f} ({losses[0] / losses[-1]:.1f}x lower)")

    grid = slice_grid(args.image)
    with torch.no_grad():
        fit = field(grid.float().to(dev)).double().cpu()
    ref = target(grid)
    err = (torch.linalg.vector_norm(fit - ref) / torch.linalg.vector_norm(ref)).item()
    print(f"z = 0 slice: relative error of the fit {err:.3f}")
    if write_plot(args.out, losses, ref, fit, args.image):
        print(f"wrote {args.out} (loss curve; target and fit on the z = 0 plane)")
    if not losses[-1] < 0.25 * losses[0]:
        print(f"FAILED: the loss did not fall below a quarter of its initial value ({losses[0]} -> {losses[-1]})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
