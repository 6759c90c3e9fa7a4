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

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from field_target import (BOX, banner, parse, parser, passed, progress, report, sample_points, slice_grid,  # noqa: E402
                          target, write_plot)

import fusekit  # noqa: E402
import fusekit.jax.nn as fknn  # noqa: E402
import fusekit.jax.optim as fko  # noqa: E402

def main(argv=None) -> int:
    ap = parser(__doc__.split("\n\n")[0], steps=200, out="jax_field_fit.png", smoke_steps=60)
    ap.add_argument("--optimizer", choices=("shampoo", "adam"), default="shampoo")
    ap.add_argument("--precondition-frequency", type=int, default=10, help="Shampoo's roots every K steps")
    args = parse(ap, argv)

    pts_np = sample_points(args.points, args.seed)
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

    banner(f"fusekit {fusekit.__version__} (jax {jax.__version__}) on {jax.devices()[0].platform}", field, args,
           args.optimizer)
    losses = []
    t0 = time.perf_counter()
    for i in range(args.steps + 1):
        if i < args.steps:
            params, state, loss = step(params, state)
        else:
            loss = jax.jit(loss_fn)(params)
        losses.append(float(loss))
        if i % args.every == 0 or i == args.steps:
            progress(i, losses, t0)
    dt = time.perf_counter() - t0
    grid = slice_grid(args.image)
    fit = np.asarray(jax.jit(field)(params, jnp.asarray(grid, jnp.float32)), np.float64)
    ref = target(grid)
    report(losses, dt, args.steps, fit, ref, ", the first one compiling")
    if write_plot(args.out, losses, ref, fit, args.image, loss_title=f"loss ({args.optimizer})",
                  fit_title="fusekit.jax.nn.GaussianField fit, z = 0"):
        print(f"wrote {args.out} (loss curve; target and fit on the z = 0 plane)")
    return 0 if passed(losses) else 1


if __name__ == "__main__":
    sys.exit(main())
