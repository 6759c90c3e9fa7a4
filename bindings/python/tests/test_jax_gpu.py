"""fusekit.jax on CUDA: the handlers against the CPU ones, TF32 from the matmul
precision, and replay from XLA's CUDA graphs. Skipped unless jax has a CUDA
backend (test_jax.py runs the rest on jax's default backend, CUDA there too).

On the GPU machine (jax with the CUDA plugin)::

    FK_REQUIRE_GPU=1 python -m pytest -q bindings/python/tests/test_jax.py bindings/python/tests/test_jax_gpu.py
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import fusekit.jax as fkj  # noqa: E402

if not fkj._has_cuda():
    if os.environ.get("FK_REQUIRE_GPU") == "1":
        raise RuntimeError("FK_REQUIRE_GPU=1 but jax has no CUDA backend")
    pytest.skip("jax has no CUDA backend", allow_module_level=True)

CPU, GPU = jax.devices("cpu")[0], jax.devices("cuda")[0]


def on(dev, *xs):
    return [jax.device_put(x, dev) for x in xs]


def close(got, want, tol):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


def gaussians(rng, b, n, dtype):
    p = rng.standard_normal((b, 3))
    m = rng.standard_normal((n, 3))
    L = np.tril(rng.standard_normal((n, 3, 3)) * 0.2)
    L[:, [0, 1, 2], [0, 1, 2]] = 0.6 + rng.random((n, 3))
    return tuple(jnp.asarray(v, dtype) for v in (p, m, L, rng.standard_normal(n)))


def test_handlers_are_registered_for_cuda():
    fkj._register()
    assert "CUDA" in fkj._registered


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_cuda_matches_cpu(rng, dtype):
    tol = 1e-4 if dtype == jnp.float32 else 1e-10
    a, b = jnp.asarray(rng.standard_normal((64, 33)), dtype), jnp.asarray(rng.standard_normal((33,)), dtype)
    for f in (fkj.add, fkj.mul, fkj.div, lambda x, y: fkj.axpby(2.0, x, -1.0, y)):
        close(f(*on(GPU, a, b)), f(*on(CPU, a, b)), tol)
    for f in (fkj.exp, fkj.tanh, fkj.sigmoid, fkj.relu):
        close(f(*on(GPU, a)), f(*on(CPU, a)), tol)
    close(fkj.matmul(*on(GPU, a, a.T), precision="highest"), fkj.matmul(*on(CPU, a, a.T)), tol * 10)
    p, m, L, w = gaussians(rng, 300, 17, dtype)
    for f in (lambda *x: fkj.mahalanobis(*x[:3], eps=0.01), lambda *x: fkj.gaussian_field(*x, eps=0.01)):
        close(f(*on(GPU, p, m, L, w)), f(*on(CPU, p, m, L, w)), tol)
        g = jax.grad(lambda *x: f(*x).sum(), argnums=(0, 1, 2))
        for x, y in zip(g(*on(GPU, p, m, L, w)), g(*on(CPU, p, m, L, w))):
            close(x, y, tol * 10)


@pytest.mark.parametrize("act", ["none", "relu", "gelu_tanh", "gelu"])
def test_linear_cuda_matches_cpu(rng, act):
    x, w, b = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((4, 32, 64), (48, 64), (48,)))
    f = jax.jit(lambda *p: fkj.linear(*p, activation=act))
    close(f(*on(GPU, x, w, b)), f(*on(CPU, x, w, b)), 1e-4)
    g = jax.jit(jax.grad(lambda *p: (fkj.linear(*p, activation=act) ** 2).sum(), argnums=(0, 1, 2)))
    for u, v in zip(g(*on(GPU, x, w, b)), g(*on(CPU, x, w, b))):
        close(u, v, 2e-3 * float(jnp.abs(v).max() + 1))


def test_matmul_tf32_follows_precision(rng):
    a = rng.standard_normal((512, 512))
    b = rng.standard_normal((512, 512))
    want = a @ b
    a32, b32 = on(GPU, jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    err = {}
    for prec in ("highest", "tensorfloat32"):
        with jax.default_matmul_precision(prec):
            err[prec] = float(np.abs(np.asarray(jax.jit(fkj.matmul)(a32, b32), np.float64) - want).max())
    print("max error, strict f32:", err["highest"], "TF32:", err["tensorfloat32"])
    assert err["highest"] < 1e-3
    assert err["tensorfloat32"] > 4 * err["highest"]


GRAPH_SCRIPT = textwrap.dedent(
    """
    import sys, jax, jax.numpy as jnp, numpy as np
    import fusekit.jax as fkj
    backward = sys.argv[1] == "backward"
    fkj.warmup("cuda")  # no kernel compiles while XLA captures
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((16, 32)), jnp.float32)
    p = jnp.asarray(rng.standard_normal((256, 3)), jnp.float32)
    m = jnp.asarray(rng.standard_normal((8, 3)), jnp.float32)
    L = jnp.tile(jnp.eye(3, dtype=jnp.float32), (8, 1, 1))
    wt = jnp.ones(8, jnp.float32)

    def fwd(x, w, p, m, L, wt):
        y = fkj.linear(fkj.tanh(fkj.add(x, 1.0)), w, activation="relu")
        return fkj.exp(fkj.mul(y, 0.01)), fkj.gaussian_field(p, m, L, wt)

    def loss(x, w, p, m, L, wt):
        y, f = fwd(x, w, p, m, L, wt)
        return y.sum() + f.sum()

    f = jax.jit(jax.grad(loss, argnums=(0, 1, 2)) if backward else fwd)
    args = (x, w, p, m, L, wt)
    out = jax.block_until_ready(f(*args))
    R = 40
    with fkj.count_calls() as n:
        for i in range(R):
            out = jax.block_until_ready(f(*args))
    calls = n()
    want = f(*(jax.device_put(v, jax.devices("cpu")[0]) for v in args))  # the CPU handlers
    for got, exp in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(exp), rtol=2e-3, atol=2e-3)
    print("RUNS", R, "HANDLER_ENTRIES", calls)
    """
)


def _graph_run(mode: str, graphs: bool):
    env = dict(os.environ)
    flags = (
        "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
        if graphs
        else "--xla_gpu_enable_command_buffer="
    )
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p])
    r = subprocess.run(
        [sys.executable, "-c", GRAPH_SCRIPT, mode], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RUNS")][-1]
    _, runs, _, calls = line.split()
    return int(runs), int(calls)


@pytest.mark.parametrize("mode", ["forward", "backward"])
def test_handlers_are_replayed_from_cuda_graphs(mode):
    """With command buffers on, XLA traces each handler into a CUDA graph and
    replays it: the handlers are entered a few times (the traces), not once per
    run. The same program without command buffers enters them on every run."""
    runs, plain = _graph_run(mode, graphs=False)
    _, graphed = _graph_run(mode, graphs=True)
    per_run = plain // runs
    print(f"{mode}: {runs} runs, {per_run} handler calls per run; entries without graphs {plain}, with graphs {graphed}")
    assert plain == runs * per_run and per_run >= 5
    assert graphed <= 4 * per_run, "handlers were not replayed from XLA's CUDA graphs"
