"""fusekit.jax on CUDA: the handlers against the CPU ones, TF32 from the matmul
precision, and replay from XLA's CUDA graphs. Skipped unless jax has a CUDA
backend (test_jax.py runs the rest on jax's default backend, CUDA there too).

On the GPU machine (jax with the CUDA plugin)::

    FK_REQUIRE_GPU=1 python -m pytest -q bindings/python/tests/test_jax.py bindings/python/tests/test_jax_gpu.py
"""

import os
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import fusekit.jax as fkj  # noqa: E402
from jax_testutil import run_script  # noqa: E402

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
    from jax_testutil import linear_and_field_operands, timed_runs
    backward = sys.argv[1] == "backward"
    fkj.warmup("cuda")  # no kernel compiles while XLA captures
    args = linear_and_field_operands(np.random.default_rng(0), 64, 32, 16, 256, 8)

    def fwd(x, w, p, m, L, wt):
        y = fkj.linear(fkj.tanh(fkj.add(x, 1.0)), w, activation="relu")
        return fkj.exp(fkj.mul(y, 0.01)), fkj.gaussian_field(p, m, L, wt)

    def loss(x, w, p, m, L, wt):
        y, f = fwd(x, w, p, m, L, wt)
        return y.sum() + f.sum()

    # backward: the Gaussian field's fused backward (workspace from XLA, capturable;
    # XLA keeps only that handler: one call per run); the linear backward allocates
    # scratch under capture and is kept out of graphs
    f = jax.jit(jax.grad(loss, argnums=(2,)) if backward else fwd)
    timed_runs(f, args, lambda exp: 2e-3)
    """
)


def _graph_run(mode: str, graphs: bool, script: str = GRAPH_SCRIPT, env=None, args=()):
    flags = (
        "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
        if graphs
        else "--xla_gpu_enable_command_buffer="
    )
    stdout = run_script(script, mode, *args, env={**(env or {}), "XLA_FLAGS": flags})
    line = [ln for ln in stdout.splitlines() if ln.startswith("RUNS")][-1]
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
    assert plain == runs * per_run and per_run >= (5 if mode == "forward" else 1)
    assert graphed <= 4 * per_run, "handlers were not replayed from XLA's CUDA graphs"


# ---------------------------------------------------------------- geodesic and optimizer math


def geo_problem(rng, b, d, r, dtype):
    def n(*s, scale=1.0):
        return jnp.asarray(scale * rng.standard_normal(s), dtype)

    return n(b, d), n(b, d, scale=0.5), n(d, r, scale=0.3), n(d, r, scale=0.3), n(b, d, scale=0.3), \
        jnp.asarray(0.1 * rng.random(d), dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("shape", [(300, 64, 16), (257, 96, 40)])  # a fast kernel; R > 32: the cuBLAS route
def test_geodesic_cuda_matches_cpu(rng, dtype, shape):
    x0, v0, U, W, f, mu = geo_problem(rng, *shape, dtype)
    tol = 2e-4 if dtype == jnp.float32 else 1e-10
    with jax.default_matmul_precision("highest"):
        chr_ = jax.jit(lambda v, U, W: fkj.christoffel(v, U, W, 2.0))
        close(chr_(*on(GPU, v0, U, W)), chr_(*on(CPU, v0, U, W)), tol)
        g = jax.jit(jax.grad(lambda v, U, W: (fkj.christoffel(v, U, W, 2.0) ** 2).sum(), argnums=(0, 1, 2)))
        for a, b in zip(g(*on(GPU, v0, U, W)), g(*on(CPU, v0, U, W))):
            close(a, b, tol * float(jnp.abs(b).max() + 1))
        for save in (True, False):
            lf = jax.jit(lambda *p: fkj.leapfrog(*p[:4], 0.05, 4, p[4], p[5], save_traj=save))
            for a, b in zip(lf(*on(GPU, x0, v0, U, W, f, mu)), lf(*on(CPU, x0, v0, U, W, f, mu))):
                close(a, b, tol)

            def loss(*p):
                x, v = fkj.leapfrog(*p[:4], 0.05, 4, p[4], p[5], save_traj=save)
                return (x**2).sum() + (v**2).sum()

            g = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))
            for a, b in zip(g(*on(GPU, x0, v0, U, W, f, mu)), g(*on(CPU, x0, v0, U, W, f, mu))):
                close(a, b, tol * float(jnp.abs(b).max() + 1))


def test_geodesic_precision_reaches_the_kernels(rng):
    """TF32 for the Christoffel forward and the leapfrog forward, 3xTF32 for the
    leapfrog forward, chosen by jax's matmul precision (f32, a fast-kernel shape)."""
    x0, v0, U, W, f, _ = geo_problem(rng, 4096, 256, 32, jnp.float32)
    want_chr = np.asarray(fkj.christoffel(*on(CPU, *(x.astype(jnp.float64) for x in (v0, U, W))), c=float("inf")))
    # The leapfrog runs unclamped (c = inf) for 8 steps: with U, W at geo_problem's
    # scale 0.3 the quadratic force blows the velocities up, and on the H200 the
    # float64 reference itself came out NaN (every precision "NaN"); at 0.1 the
    # velocities stay finite (|v| up to ~3.3 in a numpy model of these sizes) and
    # the force still moves them.
    Ul, Wl = U / 3, W / 3
    x64 = on(CPU, *(x.astype(jnp.float64) for x in (x0, v0, Ul, Wl, f)))
    want_lf = np.asarray(fkj.leapfrog(*x64[:4], 0.05, 8, x64[4], c=float("inf"))[1])
    err_chr, err_lf = {}, {}
    for prec in ("highest", "tensorfloat32", "high"):
        with jax.default_matmul_precision(prec):
            got = jax.jit(lambda v, U, W: fkj.christoffel(v, U, W, float("inf")))(*on(GPU, v0, U, W))
            err_chr[prec] = float(np.abs(np.asarray(got, np.float64) - want_chr).max() / np.abs(want_chr).max())
            got = jax.jit(lambda *p: fkj.leapfrog(*p[:4], 0.05, 8, p[4], c=float("inf"))[1])(
                *on(GPU, x0, v0, Ul, Wl, f))
            err_lf[prec] = float(np.abs(np.asarray(got, np.float64) - want_lf).max() / np.abs(want_lf).max())
    print("relative errors, christoffel:", err_chr, "leapfrog:", err_lf)
    assert err_chr["highest"] < 1e-5 and err_chr["tensorfloat32"] > 4 * err_chr["highest"]
    assert err_chr["high"] == pytest.approx(err_chr["highest"], rel=0, abs=1e-6)  # no 3xTF32 Christoffel: strict
    assert err_lf["highest"] < 1e-5 and err_lf["tensorfloat32"] > 4 * err_lf["highest"]
    assert err_lf["high"] < 1e-5 and err_lf["tensorfloat32"] > 4 * err_lf["high"]  # 3xTF32: f32-level


def spd(rng, n, dtype, batch=()):
    q, _ = np.linalg.qr(rng.standard_normal(batch + (n, n)))
    lam = np.geomspace(1.0, 100.0, n)
    return jnp.asarray((q * lam[..., None, :]) @ np.swapaxes(q, -1, -2), dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_optim_cuda_matches_cpu(rng, dtype):
    tol = 2e-4 if dtype == jnp.float32 else 1e-10
    a = spd(rng, 48, dtype, (3,))
    mp = jax.jit(lambda a: fkj.matrix_power(a, -0.25, 1e-4, max_iter=30))
    close(mp(*on(GPU, a)), mp(*on(CPU, a)), tol)
    eig = jax.jit(lambda a: fkj.matrix_power(a, 0.5, method="eigh"))
    close(eig(*on(GPU, a)), eig(*on(CPU, a)), tol * 10)
    g = jnp.asarray(rng.standard_normal((3, 48, 40)), dtype)
    l, r = a, spd(rng, 40, dtype, (3,))
    st = jax.jit(lambda g, l, r: fkj.shampoo_stats(g, l, r, 0.1, 0.9))
    for x, y in zip(st(*on(GPU, g, l, r)), st(*on(CPU, g, l, r))):
        close(x, y, tol * 10)
    pc = jax.jit(fkj.shampoo_precondition)
    close(pc(*on(GPU, g, l, r)), pc(*on(CPU, g, l, r)), tol * 10)
    for lead in ((64,), (64, 5)):
        pa = jnp.asarray(rng.standard_normal(lead + (96,)), dtype)
        pg = jnp.asarray(rng.standard_normal(lead + (80,)), dtype)
        for fn in (fkj.per_sample_grads, fkj.per_sample_grad_norms,
                   lambda a, g: fkj.dp_clipped_grad_sum(a, g, 10.0, return_norms=True)):
            for x, y in zip(jax.tree_util.tree_leaves(jax.jit(fn)(*on(GPU, pa, pg))),
                            jax.tree_util.tree_leaves(jax.jit(fn)(*on(CPU, pa, pg)))):
                close(x, y, tol * float(jnp.abs(y).max() + 1))


GRAPH_SCRIPT_MORE = textwrap.dedent(
    """
    import sys, jax, jax.numpy as jnp, numpy as np
    import fusekit.jax as fkj
    from jax_testutil import timed_runs
    mode = sys.argv[1]
    fkj.warmup("cuda")
    rng = np.random.default_rng(0)
    r = lambda *s: jnp.asarray(0.3 * rng.standard_normal(s), jnp.float32)
    q, _ = np.linalg.qr(rng.standard_normal((64, 64)))
    A = jnp.asarray((q * np.geomspace(1, 50, 64)) @ q.T, jnp.float32)
    args = (r(512, 128), r(512, 128), r(128, 16), r(128, 16), r(512, 128), r(64, 48), r(256, 96), r(256, 80), A)

    def geodesic(x, v, U, W, f, *_):
        def loss(x, v, U, W, f):
            xT, vT = fkj.leapfrog(x, v, U, W, 0.05, 4, f)
            return (xT ** 2).sum() + (fkj.christoffel(vT, U, W) ** 2).sum()
        return jax.grad(loss, argnums=(0, 1, 2, 3, 4))(x, v, U, W, f)

    def optim(*p):
        G, a, g, A = p[5], p[6], p[7], p[8]
        L, R = fkj.shampoo_stats(G, A, jnp.eye(48, dtype=jnp.float32), 0.1, 0.9)
        Lr = fkj.matrix_power(L, -0.25, 1e-3, max_iter=25)
        return (fkj.shampoo_precondition(G, Lr, R), fkj.per_sample_grad_norms(a, g),
                fkj.dp_clipped_grad_sum(a, g, 1.0), fkj.per_sample_grads(a, g))

    def eigh(*p):
        # the eigendecomposition's handler is declared not capturable
        return fkj.exp(fkj.matrix_power(p[8], 0.5, method="eigh"))

    f = jax.jit({"geodesic": geodesic, "optim": optim, "eigh": eigh}[mode])
    timed_runs(f, args, lambda exp: 2e-3 * float(np.abs(exp).max()))
    """
)


@pytest.mark.parametrize("mode", ["geodesic", "optim"])
def test_scratch_handlers_are_kept_out_of_cuda_graphs(mode):
    """The geodesic and optimizer handlers take stream-ordered scratch while
    captured, which CUDA refuses inside the child graph XLA nests a handler's
    capture in (CUDA_ERROR_NOT_SUPPORTED, seen on the H100 for the linear
    backward): they declare no command-buffer trait, so with command buffers on
    the program still runs, matches the CPU, and enters them on every run."""
    runs, plain = _graph_run(mode, graphs=False, script=GRAPH_SCRIPT_MORE)
    _, graphed = _graph_run(mode, graphs=True, script=GRAPH_SCRIPT_MORE)
    per_run = plain // runs
    print(f"{mode}: {runs} runs, {per_run} handler calls per run; without graphs {plain}, with graphs {graphed}")
    assert plain == runs * per_run and per_run >= 3
    assert graphed >= runs * per_run, "a handler with scratch under capture was traced into XLA's graphs"


def test_eigh_handler_is_kept_out_of_cuda_graphs():
    """matrix_power(method="eigh") reads cuSOLVER's flags on the host: its handler
    declares no command-buffer trait, so XLA runs it on every execution (and the
    program still works with command buffers on)."""
    runs, plain = _graph_run("eigh", graphs=False, script=GRAPH_SCRIPT_MORE)
    _, graphed = _graph_run("eigh", graphs=True, script=GRAPH_SCRIPT_MORE)
    print(f"eigh: {runs} runs; without graphs {plain}, with graphs {graphed}")
    assert plain == 2 * runs  # matrix_power_eigh and exp
    assert graphed >= runs  # the eigendecomposition is entered on every run


# ---------------------------------------------------------------- the fused MLP


def mlp_net(rng, widths, dtype, bias):
    ws = [jnp.asarray(rng.standard_normal((n, k)) / np.sqrt(k), dtype) for k, n in zip(widths[:-1], widths[1:])]
    bs = [jnp.asarray(0.1 * rng.standard_normal(n), dtype) if has else None for n, has in zip(widths[1:], bias)]
    return ws, bs


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-4), (jnp.float16, 2e-2), (jnp.bfloat16, 8e-2)])
@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "none"])
def test_mlp_cuda_matches_cpu(rng, dtype, tol, act):
    """fusekit.jax.mlp on CUDA against the CPU handlers, values and every gradient
    of the fused backward, on odd shapes (rows 3 x 37, widths 29 -> 64 -> 50 -> 7,
    the middle layer without bias), strict f32."""
    x = jnp.asarray(rng.standard_normal((3, 37, 29)), dtype)
    ws, bs = mlp_net(rng, (29, 64, 50, 7), dtype, (True, False, True))
    f = jax.jit(lambda x, ws, bs: fkj.mlp(x, ws, bs, act, "gelu_tanh", precision="highest"))
    close(np.asarray(f(*on(GPU, x, ws, bs)), np.float64), np.asarray(f(*on(CPU, x, ws, bs)), np.float64), tol)
    loss = lambda x, ws, bs: (fkj.mlp(x, ws, bs, act, precision="highest").astype(jnp.float32) ** 2).sum()  # noqa: E731
    g = jax.jit(jax.grad(loss, (0, 1, 2)))
    for a, b in zip(jax.tree.leaves(g(*on(GPU, x, ws, bs))), jax.tree.leaves(g(*on(CPU, x, ws, bs)))):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = np.abs(b).max() + 1e-30
        close(a / scale, b / scale, tol * 4)


def test_mlp_tf32_follows_precision(rng):
    """The MLP's f32 products: strict at "highest", TF32 at "tensorfloat32" (a
    measurably larger error against f64 on CUDA)."""
    x = jnp.asarray(rng.standard_normal((256, 512)), jnp.float32)
    ws, bs = mlp_net(rng, (512, 512, 256), jnp.float32, (True, True))
    h = np.asarray(x, np.float64)  # the f64 reference: relu hidden, no output activation
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = h @ np.asarray(w, np.float64).T + np.asarray(b, np.float64)
        h = np.maximum(h, 0) if i < len(ws) - 1 else h
    want = h
    err = {}
    for prec in ("highest", "tensorfloat32"):
        with jax.default_matmul_precision(prec):
            got = jax.jit(fkj.mlp)(*on(GPU, x, ws, bs))
        err[prec] = float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())
    print("MLP relative error, strict f32:", err["highest"], "TF32:", err["tensorfloat32"])
    assert err["highest"] < 1e-5
    assert err["tensorfloat32"] > 4 * err["highest"]


GRAPH_SCRIPT_MLP = textwrap.dedent(
    """
    import sys, jax, jax.numpy as jnp, numpy as np
    import fusekit.jax as fkj
    from jax_testutil import timed_runs
    backward = sys.argv[1] == "backward"
    dtype = jnp.dtype(sys.argv[2] if len(sys.argv) > 2 else "float32")
    fkj.warmup("cuda")
    rng = np.random.default_rng(0)
    r = lambda *s: jnp.asarray(rng.standard_normal(s) / np.sqrt(s[-1]), dtype)
    args = (r(300, 48), [r(64, 48), r(64, 64), r(5, 64)], [r(64), None, r(5)])

    def fwd(x, ws, bs):
        return fkj.mlp(x, ws, bs, "gelu_tanh", precision="highest")

    def grad(x, ws, bs):
        return jax.grad(lambda *p: (fwd(*p) ** 2).sum(), (0, 1))(x, ws, bs)

    f = jax.jit(grad if backward else fwd)
    tol = 2e-3 if dtype == jnp.float32 else 5e-2
    timed_runs(f, args, lambda exp: tol * float(np.abs(exp).max()))
    """
)


def test_mlp_forward_is_replayed_from_cuda_graphs():
    """The MLP forward handler declares the command-buffer trait (workspace from
    the pool, capturable): with command buffers on, XLA replays it from a graph."""
    runs, plain = _graph_run("forward", graphs=False, script=GRAPH_SCRIPT_MLP)
    _, graphed = _graph_run("forward", graphs=True, script=GRAPH_SCRIPT_MLP)
    print(f"mlp forward: {runs} runs; handler entries without graphs {plain}, with graphs {graphed}")
    assert plain == runs
    assert graphed <= 4, "the MLP forward was not replayed from XLA's CUDA graphs"


@pytest.mark.parametrize("fused,dtype", [("0", "float32"), ("1", "bfloat16")])
def test_mlp_backward_is_replayed_from_cuda_graphs(fused, dtype):
    """The MLP backward takes its scratch from XLA (the `workspace` result) and so
    declares the command-buffer trait: with command buffers on, XLA replays the
    forward and the backward (its side stream for the weight gradients included)
    from a graph, on the general path (f32) and on the fully fused one (bf16 with
    FK_MLP_FUSED=1, which widths 48, 64 and 5 take), and the values still match
    the CPU."""
    env, a = {"FK_MLP_FUSED": fused}, (dtype,)
    runs, plain = _graph_run("backward", graphs=False, script=GRAPH_SCRIPT_MLP, env=env, args=a)
    _, graphed = _graph_run("backward", graphs=True, script=GRAPH_SCRIPT_MLP, env=env, args=a)
    print(f"mlp backward (FK_MLP_FUSED={fused}): {runs} runs; handler entries without graphs {plain}, "
          f"with graphs {graphed}")
    assert plain == 2 * runs  # forward and backward
    assert graphed <= 8, "the MLP backward was not replayed from XLA's CUDA graphs"