#!/usr/bin/env python3
"""fusekit.jax inside ``jax.jit`` against XLA's ``jit`` of the same formula in
``jax.numpy``: whole training steps, side by side in one run.

Each step is ``jit(value_and_grad(loss))`` plus a plain SGD update of the
parameters (returned, so nothing is dead code), the same on both sides:

- field: the Gaussian-field fit (MSE of the field at B points against a target),
  parameters means, Cholesky factors and weights; N=1000, B=500 and N=4096,
  B=16384. fusekit: ``fusekit.jax.gaussian_field`` (one fused op each way); XLA:
  ``sum_n w_n exp(-|(L_n + eps I)^-1 (p - mu_n)|^2 / 2)`` with the 3x3 triangular
  solve written out (the fastest form for XLA; ``solve_triangular`` is far slower).
- leapfrog: T kick-drift-kick steps of the low-rank Christoffel flow, MSE of x_T
  and v_T against targets, gradients to U and W; B=2000, D=256, R=16, T=4 (and
  B=65536, D=512, R=32, T=8 with ``--large``). fusekit: ``fusekit.jax.leapfrog``;
  XLA: the loop in ``jnp`` (``clip((v U)^2 W^T, -c, c)``).
- mlp: hidden-ReLU MLPs, MSE against a target, gradients to every weight and bias;
  hidden 256 / 2 layers / batch 64 f32, 1024 / 4 / 256 f32, 2048 / 4 / 256 bf16.
  fusekit: ``fusekit.jax.mlp`` (the whole network one fused op each way); XLA:
  ``x @ w.T + b`` and ``relu`` per layer.

f32 products at matched precision: both sides under
``jax.default_matmul_precision("highest")`` (fusekit strict f32, XLA no TF32);
``--precision`` sets another (``"default"`` or ``"tensorfloat32"``: TF32 on both).

Per step: ``step ms``, the median over 7 rounds of (wall time of ``n`` back-to-back
steps, then ``block_until_ready``) / ``n``: the device time when the host
dispatches faster than the device runs (the usual case for a jitted step), else
the host's; ``in-loop ms``, the median over 5 rounds of one ``jit`` running
``K`` steps in a ``lax.fori_loop`` (the parameters carried), divided by ``K``:
the step's device time with jax's per-dispatch host cost out of it (what a
training loop written as a scan pays); ``host us``, the median wall time of one
dispatch (the call returning, before the result is ready) with the device idle
at its start. Inputs are random (never zeros); before timing, the two sides'
losses and gradients are compared (relative 2e-3 in f32 at ``highest``, 2e-2 at
a lower matmul precision, 5e-2 in bf16), so a wrong step is never timed.

Without a CUDA jax backend (or with ``--smoke``) tiny cases run on jax's CPU
backend in seconds (CI runs it so; timings meaningless there).

    python3 benches/bench_jax.py [--smoke] [--large] [--cases REGEX] [--json OUT]
                                 [--precision highest]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fusekit.jax as fkj  # noqa: E402
from bench_info import git_commit  # noqa: E402

EPS = 1e-3
LR = 1e-3
ROWS = []


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- formulas in jax.numpy


def field_jnp(p, m, L, w, eps):
    """The Gaussian field with the 3x3 lower-triangular solve written out."""
    d = p[:, None, :] - m[None, :, :]  # [B, N, 3]
    l00, l11, l22 = L[:, 0, 0] + eps, L[:, 1, 1] + eps, L[:, 2, 2] + eps
    y0 = d[..., 0] / l00
    y1 = (d[..., 1] - L[:, 1, 0] * y0) / l11
    y2 = (d[..., 2] - L[:, 2, 0] * y0 - L[:, 2, 1] * y1) / l22
    return (w * jnp.exp(-0.5 * (y0 * y0 + y1 * y1 + y2 * y2))).sum(-1)


def chr_jnp(v, U, W, c):
    return jnp.clip(((v @ U) ** 2) @ W.T, -c, c)


def leapfrog_jnp(x, v, U, W, f, mu, dt, steps, c):
    h = dt / 2
    for _ in range(steps):
        vh = v + h * (f - chr_jnp(v, U, W, c) - mu * v)
        x = x + dt * vh
        v = vh + h * (f - chr_jnp(vh, U, W, c) - mu * vh)
    return x, v


def mlp_jnp(x, ws, bs):
    for i, (w, b) in enumerate(zip(ws, bs)):
        x = (x @ w.T).astype(jnp.float32) + b.astype(jnp.float32)
        x = (jnp.maximum(x, 0) if i < len(ws) - 1 else x).astype(w.dtype)
    return x


# ---------------------------------------------------------------- cases


def sgd_step(loss):
    """One step: (params, data) -> (params - LR grad, loss), not jitted."""

    def step(params, data):
        value, g = jax.value_and_grad(loss)(params, data)
        return jax.tree.map(lambda p, gp: p - jnp.asarray(LR, p.dtype) * gp, params, g), value

    return step


def in_loop(step, k: int):
    """``jit`` of ``k`` steps in a ``fori_loop``: (params, data) -> (params, last loss)."""

    def many(params, data):
        def body(_, carry):
            return step(carry[0], data)

        return jax.lax.fori_loop(0, k, body, step(params, data))

    return jax.jit(many)


def field_case(n, b, key):
    ks = jax.random.split(key, 6)
    p = jax.random.uniform(ks[0], (b, 3), jnp.float32, -1, 1)
    params = {"means": jax.random.uniform(ks[1], (n, 3), jnp.float32, -1, 1),
              "chol": jnp.tril(0.05 * jax.random.normal(ks[2], (n, 3, 3)), -1)
              + jnp.eye(3) * (0.2 + 0.1 * jax.random.uniform(ks[3], (n, 1, 1))),
              "weights": 0.5 * jax.random.normal(ks[4], (n,))}
    target = jax.random.uniform(ks[5], (b,), jnp.float32)

    def loss_fk(q, data):
        return jnp.mean((fkj.gaussian_field(data[0], q["means"], q["chol"], q["weights"], EPS) - data[1]) ** 2)

    def loss_xla(q, data):
        return jnp.mean((field_jnp(data[0], q["means"], q["chol"], q["weights"], EPS) - data[1]) ** 2)

    return f"field N={n} B={b} f32", params, (p, target), loss_fk, loss_xla, 2e-3


def leapfrog_case(b, d, r, steps, key):
    ks = jax.random.split(key, 7)
    dt, c = 0.05, 5.0
    x, v = (0.5 * jax.random.normal(k, (b, d)) for k in ks[:2])
    f = 0.3 * jax.random.normal(ks[2], (b, d))
    mu = 0.1 * jax.random.uniform(ks[3], (d,))
    params = {"U": 0.15 * jax.random.normal(ks[4], (d, r)), "W": 0.15 * jax.random.normal(ks[5], (d, r))}
    tx, tv = (0.5 * jax.random.normal(k, (b, d)) for k in jax.random.split(ks[6]))

    def mse(xT, vT, data):
        return jnp.mean((xT - data[4]) ** 2) + jnp.mean((vT - data[5]) ** 2)

    def loss_fk(q, data):
        xT, vT = fkj.leapfrog(data[0], data[1], q["U"], q["W"], dt, steps, data[2], data[3], c)
        return mse(xT, vT, data)

    def loss_xla(q, data):
        return mse(*leapfrog_jnp(data[0], data[1], q["U"], q["W"], data[2], data[3], dt, steps, c), data)

    return f"leapfrog B={b} D={d} R={r} T={steps} f32", params, (x, v, f, mu, tx, tv), loss_fk, loss_xla, 2e-3


def mlp_case(widths, b, dtype, key):
    ks = jax.random.split(key, 2 * len(widths))
    ws = [(jax.random.uniform(ks[2 * i], (n, k), jnp.float32, -1, 1) / np.sqrt(k)).astype(dtype)
          for i, (k, n) in enumerate(zip(widths[:-1], widths[1:]))]
    bs = [(0.1 * jax.random.normal(ks[2 * i + 1], (n,))).astype(dtype) for i, n in enumerate(widths[1:])]
    x = jax.random.normal(ks[-2], (b, widths[0])).astype(dtype)
    t = (0.5 * jax.random.normal(ks[-1], (b, widths[-1]))).astype(dtype)

    def loss_fk(q, data):
        y = fkj.mlp(data[0], q["w"], q["b"], "relu")
        return jnp.mean((y.astype(jnp.float32) - data[1].astype(jnp.float32)) ** 2)

    def loss_xla(q, data):
        y = mlp_jnp(data[0], q["w"], q["b"])
        return jnp.mean((y.astype(jnp.float32) - data[1].astype(jnp.float32)) ** 2)

    name = f"mlp hidden {widths[1]} x{len(widths) - 1} batch {b} {jnp.dtype(dtype).name}"
    return name, {"w": ws, "b": bs}, (x, t), loss_fk, loss_xla, 2e-3 if dtype == jnp.float32 else 5e-2


# ---------------------------------------------------------------- timing


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-30))


def time_step(step, params, data, n: int, rounds: int = 7):
    out = step(params, data)  # compile
    jax.block_until_ready(out)
    for _ in range(3):
        out = jax.block_until_ready(step(params, data))
    per = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            out = step(params, data)
        jax.block_until_ready(out)
        per.append((time.perf_counter() - t) / n * 1e3)
    host = []
    for _ in range(max(rounds, 15)):
        jax.block_until_ready(out)
        t = time.perf_counter()
        out = step(params, data)
        host.append((time.perf_counter() - t) * 1e6)
    jax.block_until_ready(out)
    return statistics.median(per), statistics.median(host)


def time_in_loop(step, params, data, k: int, rounds: int = 5):
    many = in_loop(step, k)
    jax.block_until_ready(many(params, data))  # compile
    per = []
    for _ in range(rounds):
        t = time.perf_counter()
        jax.block_until_ready(many(params, data))
        per.append((time.perf_counter() - t) / (k + 1) * 1e3)
    return statistics.median(per)


def run_case(case, n, precision="highest"):
    name, params, data, loss_fk, loss_xla, tol = case
    if precision != "highest":
        tol = max(tol, 2e-2)
    fk, xla = sgd_step(loss_fk), sgd_step(loss_xla)
    (lf, gf), (lx, gx) = (jax.jit(jax.value_and_grad(f))(params, data) for f in (loss_fk, loss_xla))
    err = rel(lf, lx)
    gerr = max(rel(a, b) for a, b in zip(jax.tree.leaves(gf), jax.tree.leaves(gx)))
    if not (gerr <= tol and err <= tol):
        raise SystemExit(f"{name}: fusekit and XLA disagree (loss {err:.2e}, gradients {gerr:.2e} > {tol})")
    row = {"case": name, "grad_rel_err": gerr}
    for side, step in (("fusekit", fk), ("xla", xla)):
        ms, host = time_step(jax.jit(step), params, data, n)
        row[f"{side}_ms"], row[f"{side}_host_us"] = ms, host
        row[f"{side}_loop_ms"] = time_in_loop(step, params, data, n)
    row["ratio"] = row["fusekit_ms"] / row["xla_ms"]
    row["loop_ratio"] = row["fusekit_loop_ms"] / row["xla_loop_ms"]
    ROWS.append(row)
    log(f"bench_jax {name:<38} fusekit {row['fusekit_ms']:8.3f} ms (in-loop {row['fusekit_loop_ms']:7.3f}, "
        f"{row['fusekit_host_us']:6.1f} us host) | xla {row['xla_ms']:8.3f} ms (in-loop {row['xla_loop_ms']:7.3f}, "
        f"{row['xla_host_us']:6.1f} us host) | ratio {row['ratio']:5.2f} (in-loop {row['loop_ratio']:5.2f}) | "
        f"grads agree to {gerr:.1e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on jax's CPU backend")
    ap.add_argument("--large", action="store_true", help="also the large leapfrog step (B=65536, D=512, R=32, T=8)")
    ap.add_argument("--cases", default=".", help="regex on case names")
    ap.add_argument("--precision", default="highest", help="jax.default_matmul_precision for both sides")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    cuda = fkj._has_cuda() and not args.smoke
    if not cuda:
        args.smoke = True
        jax.config.update("jax_platforms", "cpu")
    dev = jax.devices()[0]
    info = {"device": getattr(dev, "device_kind", str(dev)), "platform": dev.platform, "jax": jax.__version__,
            "commit": git_commit(), "precision": args.precision, "host": platform.node(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    log(f"bench_jax on {info['device']} ({info['platform']}), jax {info['jax']}, commit {info['commit']}, "
        f"precision {args.precision}, {info['date']}")
    key = jax.random.key(0)
    if args.smoke:
        cases = [lambda: field_case(17, 40, key), lambda: leapfrog_case(24, 16, 4, 2, key),
                 lambda: mlp_case([16, 32, 32, 8], 12, jnp.float32, key)]
        n = 5
    else:
        cases = [lambda: field_case(1000, 500, key), lambda: field_case(4096, 16384, key),
                 lambda: leapfrog_case(2000, 256, 16, 4, key),
                 lambda: mlp_case([256] * 3, 64, jnp.float32, key), lambda: mlp_case([1024] * 5, 256, jnp.float32, key),
                 lambda: mlp_case([2048] * 5, 256, jnp.bfloat16, key)]
        if args.large:
            cases.insert(3, lambda: leapfrog_case(65536, 512, 32, 8, key))
        n = 50
    with jax.default_matmul_precision(args.precision):
        for make in cases:
            case = make()
            if re.search(args.cases, case[0]):
                run_case(case, n, args.precision)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"info": info, "smoke": args.smoke, "rows": ROWS}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
