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

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))

import torch  # noqa: E402
from field_target import (BOX, banner, parse, parser, passed, progress, report, sample_points, slice_grid,  # noqa: E402
                          target, write_plot)

import fusekit  # noqa: E402
import fusekit.nn as fnn  # noqa: E402

def main(argv=None) -> int:
    ap = parser(__doc__.split("\n\n")[0], steps=300, out="gaussian_field_fit.png", smoke_steps=80)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--diagonal", action="store_true", help="diagonal covariances (default: full)")
    args = parse(ap, argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device(args.device)

    torch.manual_seed(args.seed)
    pts = sample_points(args.points, args.seed)
    tgt = torch.from_numpy(target(pts)).float().to(dev)
    pts = torch.from_numpy(pts).float().to(dev)
    field = fnn.GaussianField(args.gaussians, volume_size=BOX, full_covariance=not args.diagonal, device=dev)
    with torch.no_grad():  # start from a faint field: the target is at most ~1.8
        field.weights.fill_(0.3)
    opt = torch.optim.Adam(field.parameters(), lr=args.lr)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    banner(f"fusekit {fusekit.__version__} (torch {torch.__version__}) on {name}", field, args, "Adam")

    losses = []
    t0 = time.perf_counter()
    for step in range(args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = (field(pts) - tgt).square().mean()
        if step < args.steps:
            loss.backward()
            opt.step()
        losses.append(loss.item())
        if step % args.every == 0 or step == args.steps:
            progress(step, losses, t0)
    dt = time.perf_counter() - t0
    grid = slice_grid(args.image)
    with torch.no_grad():
        fit = field(torch.from_numpy(grid).float().to(dev)).double().cpu().numpy()
    ref = target(grid)
    report(losses, dt, args.steps, fit, ref)
    if write_plot(args.out, losses, ref, fit, args.image):
        print(f"wrote {args.out} (loss curve; target and fit on the z = 0 plane)")
    return 0 if passed(losses) else 1


if __name__ == "__main__":
    sys.exit(main())
