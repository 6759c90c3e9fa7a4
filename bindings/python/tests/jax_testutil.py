"""Helpers of test_jax.py and test_jax_gpu.py, and of the scripts they run in fresh
interpreters (XLA flags must be set before jax starts): those import this module
too (the tests folder is on their ``sys.path``). jax is imported inside the
functions, so importing this module needs no jax."""

import os
import subprocess
import sys


def run_script(script: str, *args: str, env=None, timeout: int = 600) -> str:
    """Runs the Python source ``script`` with ``args`` in a fresh interpreter that
    sees this process's ``sys.path``; ``env`` adds variables (``XLA_FLAGS`` is
    appended to). Asserts it succeeded; returns its standard output."""
    e = dict(os.environ)
    for k, v in (env or {}).items():
        if k == "XLA_FLAGS":  # appended, replacing the inherited value of a flag set again
            names = {t.split("=")[0] for t in v.split()}
            kept = [t for t in e.get(k, "").split() if t.split("=")[0] not in names]
            v = " ".join(kept + v.split())
        e[k] = v
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-c", script, *args], env=e, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def linear_and_field_operands(rng, rows: int, feats: int, outs: int, points: int, gaussians: int):
    """float32 jax arrays ``x [rows, feats]``, ``w [outs, feats]``, ``p [points, 3]``,
    ``m [gaussians, 3]`` (normal), unit Cholesky factors and unit weights."""
    import jax.numpy as jnp

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    x, w, p, m = normal(rows, feats), normal(outs, feats), normal(points, 3), normal(gaussians, 3)
    return x, w, p, m, jnp.tile(jnp.eye(3, dtype=jnp.float32), (gaussians, 1, 1)), jnp.ones(gaussians, jnp.float32)


def timed_runs(f, args, atol, runs: int = 40) -> None:
    """Runs ``f(*args)`` once, then ``runs`` times counting fusekit's handler
    entries; checks the last result against the CPU handlers' (``rtol`` 2e-3,
    ``atol(expected)``) and prints ``RUNS <runs> HANDLER_ENTRIES <count>``."""
    import jax
    import numpy as np

    import fusekit.jax as fkj

    out = jax.block_until_ready(f(*args))
    with fkj.count_calls() as n:
        for _ in range(runs):
            out = jax.block_until_ready(f(*args))
    calls = n()
    want = f(*(jax.device_put(v, jax.devices("cpu")[0]) for v in args))  # the CPU handlers
    for got, exp in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(want)):
        got, exp = np.asarray(got, np.float64), np.asarray(exp, np.float64)
        np.testing.assert_allclose(got, exp, rtol=2e-3, atol=atol(exp))
    print("RUNS", runs, "HANDLER_ENTRIES", calls)
