"""fusekit.jax: fusekit's ops as XLA custom calls inside jax.jit, with gradients
and vmap. Skipped when jax is not installed.

Runs on jax's default backend: the CPU here and in CI, CUDA on a GPU machine
(the GPU-only checks, CUDA graphs among them, are in test_jax_gpu.py). References
are jax.numpy (f32 and f64, jax_enable_x64 on) or numpy in f64 where a product is
involved (jnp's GPU matmul would use TF32).
"""

import re
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import fusekit.jax as fkj  # noqa: E402
from jax_testutil import run_script  # noqa: E402

TOL = {jnp.float32: 2e-5, jnp.float64: 1e-12, jnp.complex64: 2e-5, jnp.complex128: 1e-12}


def rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return jnp.asarray(x, dtype=dtype)


def close(got, want, tol):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


# ---------------------------------------------------------------- elementwise


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.complex64])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_matches_jnp_with_broadcasting(rng, op, dtype):
    ref = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide}[op]
    f = getattr(fkj, op)
    for sa, sb in [((4, 5), (4, 5)), ((3, 4, 5), (5,)), ((4, 1), (1, 6)), ((), (3,))]:
        a, b = rand(rng, sa, dtype), rand(rng, sb, dtype) + 3
        got = jax.jit(f)(a, b)
        assert got.dtype == dtype and got.shape == ref(a, b).shape
        close(got, ref(a, b), TOL[dtype])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("op", ["neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "relu"])
def test_unary_matches_jnp(rng, op, dtype):
    ref = {"neg": jnp.negative, "abs": jnp.abs, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt,
           "sin": jnp.sin, "cos": jnp.cos, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid,
           "relu": jax.nn.relu}[op]
    a = rand(rng, (7, 3), dtype)
    if op in ("log", "sqrt"):
        a = jnp.abs(a) + 0.1
    close(jax.jit(getattr(fkj, op))(a), ref(a), TOL[dtype])


def test_abs_of_complex_is_real(rng):
    a = rand(rng, (5,), jnp.complex128)
    got = fkj.abs(a)
    assert got.dtype == jnp.float64
    close(got, jnp.abs(a), 1e-12)


def test_axpby_and_python_numbers(rng):
    a, b = rand(rng, (3, 4), jnp.float32), rand(rng, (4,), jnp.float32)
    close(fkj.axpby(2.0, a, -0.5, b), 2 * a - 0.5 * b, 1e-6)
    c = rand(rng, (4,), jnp.complex128)
    close(fkj.axpby(1j, c, 2, c), 1j * c + 2 * c, 1e-12)
    # a Python number takes the array's dtype, on either side
    assert fkj.add(a, 2).dtype == jnp.float32
    close(fkj.sub(1.0, a), 1.0 - a, 1e-6)


def test_elementwise_errors_in_jax_terms(rng):
    a32, a64 = rand(rng, (3,), jnp.float32), rand(rng, (3,), jnp.float64)
    with pytest.raises(TypeError, match=r"fusekit.jax.add: a has dtype float32 but b has dtype float64; fusekit does not promote"):
        fkj.add(a32, a64)
    with pytest.raises(ValueError, match=r"Incompatible shapes for broadcasting: \(3,\) and \(4,\)"):
        fkj.mul(a32, rand(rng, (4,), jnp.float32))
    with pytest.raises(TypeError, match="a has dtype int32; this op takes"):
        fkj.exp(jnp.arange(3, dtype=jnp.int32))
    with pytest.raises(TypeError, match="relu"):
        fkj.relu(rand(rng, (3,), jnp.complex64))


def test_elementwise_grads(rng):
    a, b = rand(rng, (3, 4), jnp.float64), rand(rng, (4,), jnp.float64) + 3
    for f in (fkj.add, fkj.sub, fkj.mul, fkj.div):
        check_grads(f, (a, b), order=1, modes=["rev"])
    check_grads(lambda x, y: fkj.axpby(2.0, x, -3.0, y), (a, b), order=1, modes=["rev"])
    for f in (fkj.exp, fkj.sin, fkj.tanh, fkj.sigmoid, fkj.neg):
        check_grads(f, (a,), order=2, modes=["rev"])
    check_grads(fkj.log, (jnp.abs(a) + 1,), order=1, modes=["rev"])


def test_elementwise_vmap_is_one_call(rng):
    a, b = rand(rng, (6, 3, 4), jnp.float32), rand(rng, (4,), jnp.float32)
    close(jax.vmap(fkj.add, in_axes=(0, None))(a, b), a + b, 1e-6)
    close(jax.vmap(fkj.mul, in_axes=(None, 0))(b, a), a * b, 1e-6)
    close(jax.vmap(fkj.exp)(a), jnp.exp(a), 2e-6)
    # the batch axis need not lead
    close(jax.vmap(fkj.sub, in_axes=(2, None), out_axes=2)(a, b[:3]), a - b[None, :3, None], 1e-6)
    with fkj.count_calls() as n:
        jax.jit(jax.vmap(fkj.add, in_axes=(0, None)))(a, b).block_until_ready()
    assert n() == 1  # expand_dims: one batched call, not one per element


# ---------------------------------------------------------------- matmul


def f64(x):
    return np.asarray(x, dtype=np.float64)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_matmul_values_and_batches(rng, dtype):
    a, b = rand(rng, (5, 7), dtype), rand(rng, (7, 3), dtype)
    tol = 1e-5 if dtype == jnp.float32 else 1e-12
    close(fkj.matmul(a, b, precision="highest"), f64(a) @ f64(b), tol)
    ab, bb = rand(rng, (4, 5, 7), dtype), rand(rng, (4, 7, 3), dtype)
    close(fkj.matmul(ab, bb, precision="highest"), f64(ab) @ f64(bb), tol)
    close(fkj.matmul(ab, b, precision="highest"), f64(ab) @ f64(b), tol)


def test_matmul_grads_and_vmap(rng):
    a, b = rand(rng, (5, 7), jnp.float64), rand(rng, (7, 3), jnp.float64)
    check_grads(fkj.matmul, (a, b), order=1, modes=["rev"])
    check_grads(fkj.matmul, (rand(rng, (2, 5, 7), jnp.float64), b), order=1, modes=["rev"])
    av = rand(rng, (6, 5, 7), jnp.float64)
    close(jax.vmap(fkj.matmul, in_axes=(0, None))(av, b), f64(av) @ f64(b), 1e-12)
    bv = rand(rng, (6, 7, 3), jnp.float64)
    close(jax.vmap(fkj.matmul)(av, bv), f64(av) @ f64(bv), 1e-12)


def _flags_in_hlo(fn, *args) -> set:
    text = jax.jit(fn).lower(*args).as_text()
    return set(re.findall(r"flags = (\d) : i64", text))


def test_precision_follows_jax_config_and_argument(rng):
    a = rand(rng, (4, 4), jnp.float32)
    assert _flags_in_hlo(fkj.matmul, a, a) == {"0"}  # unset: strict
    with jax.default_matmul_precision("tensorfloat32"):
        assert _flags_in_hlo(fkj.matmul, a, a) == {"1"}
        assert _flags_in_hlo(lambda x, y: fkj.matmul(x, y, precision="highest"), a, a) == {"0"}
    with jax.default_matmul_precision("float32"):
        assert _flags_in_hlo(fkj.matmul, a, a) == {"0"}
        assert _flags_in_hlo(lambda x, y: fkj.matmul(x, y, precision=jax.lax.Precision.DEFAULT), a, a) == {"1"}
    # the backward's products follow the same choice
    with jax.default_matmul_precision("tensorfloat32"):
        assert _flags_in_hlo(jax.grad(lambda x: fkj.matmul(x, x).sum()), a) == {"1"}
    assert fkj.allow_tf32(True) and not fkj.allow_tf32("highest") and not fkj.allow_tf32("high")
    with pytest.raises(ValueError, match="not understood"):
        fkj.allow_tf32("fast-ish")


def test_matmul_errors(rng):
    with pytest.raises(TypeError, match="contracting dimensions"):
        fkj.matmul(rand(rng, (2, 3), jnp.float32), rand(rng, (4, 2), jnp.float32))
    with pytest.raises(ValueError, match="2-D or 3-D"):
        fkj.matmul(rand(rng, (3,), jnp.float32), rand(rng, (3, 2), jnp.float32))


# ---------------------------------------------------------------- fused linear


def linear_ref(x, w, b, act):
    z = x @ w.T + (0 if b is None else b)
    return {"none": z, "relu": jax.nn.relu(z), "gelu_tanh": jax.nn.gelu(z, approximate=True),
            "gelu": jax.nn.gelu(z, approximate=False)}[act]


@pytest.mark.parametrize("act", ["none", "relu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_forward_and_fused_backward(rng, act, bias):
    x, w = rand(rng, (2, 5, 8), jnp.float32), rand(rng, (6, 8), jnp.float32)
    b = rand(rng, (6,), jnp.float32) if bias else None
    with jax.default_matmul_precision("highest"):
        want = linear_ref(x, w, b, act)
        argnums = (0, 1, 2) if bias else (0, 1)
        loss_ref = lambda *p: (linear_ref(*(p + ((None,) if not bias else ())), act) ** 2).sum()  # noqa: E731
        g_ref = jax.grad(loss_ref, argnums=argnums)(*((x, w, b) if bias else (x, w)))
    close(jax.jit(lambda *p: fkj.linear(*p, activation=act))(x, w, b), want, 1e-4)
    loss = lambda *p: (fkj.linear(*(p + ((None,) if not bias else ())), activation=act) ** 2).sum()  # noqa: E731
    g = jax.jit(jax.grad(loss, argnums=argnums))(*((x, w, b) if bias else (x, w)))
    for got, ref in zip(g, g_ref):
        close(got, ref, 2e-4)


def test_linear_vmap_and_errors(rng):
    x, w, b = rand(rng, (3, 4, 8), jnp.float32), rand(rng, (6, 8), jnp.float32), rand(rng, (6,), jnp.float32)
    with jax.default_matmul_precision("highest"):
        want = linear_ref(x, w, b, "relu")
    close(jax.vmap(lambda xi: fkj.linear(xi, w, b, "relu"))(x), want, 1e-4)
    with pytest.raises(TypeError, match="x has dtype float64; this op takes float16, bfloat16, float32"):
        fkj.linear(x.astype(jnp.float64), w.astype(jnp.float64))
    with pytest.raises(ValueError, match=r"w must be \[n, 8\]"):
        fkj.linear(x, w[:, :5])
    with pytest.raises(ValueError, match="activation 'swish'"):
        fkj.linear(x, w, activation="swish")


# ---------------------------------------------------------------- Gaussian field


def gaussians(rng, b, n, dtype):
    p = rng.standard_normal((b, 3))
    m = rng.standard_normal((n, 3))
    L = np.tril(rng.standard_normal((n, 3, 3)) * 0.2)
    L[:, [0, 1, 2], [0, 1, 2]] = 0.6 + rng.random((n, 3))
    w = rng.standard_normal(n)
    return tuple(jnp.asarray(v, dtype) for v in (p, m, L, w))


def maha_ref(p, m, L, eps):
    Le = jnp.tril(L) + eps * jnp.eye(3, dtype=L.dtype)
    d = p[:, None, :] - m[None, :, :]  # [B, N, 3]
    y = jax.vmap(lambda Ln, dn: jax.scipy.linalg.solve_triangular(Ln, dn.T, lower=True).T, in_axes=(0, 1), out_axes=1)(Le, d)
    return (y**2).sum(-1)


def field_ref(p, m, L, w, eps):
    return (w * jnp.exp(-0.5 * maha_ref(p, m, L, eps))).sum(-1)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_gaussian_values(rng, dtype):
    p, m, L, w = gaussians(rng, 33, 5, dtype)
    tol = 1e-4 if dtype == jnp.float32 else 1e-11
    with jax.default_matmul_precision("highest"):
        close(jax.jit(fkj.mahalanobis, static_argnums=3)(p, m, L, 0.01), maha_ref(p, m, L, 0.01), tol)
        close(jax.jit(fkj.gaussian_field, static_argnums=4)(p, m, L, w, 0.01), field_ref(p, m, L, w, 0.01), tol)


def test_gaussian_grads_are_fusekits_fused_backward(rng):
    p, m, L, w = gaussians(rng, 9, 4, jnp.float64)
    check_grads(lambda *a: fkj.mahalanobis(*a, eps=0.05), (p, m, L), order=1, modes=["rev"])
    check_grads(lambda *a: fkj.gaussian_field(*a, eps=0.05), (p, m, L, w), order=1, modes=["rev"])
    # the backward is the fused one: one handler call for the field's four gradients
    f = jax.jit(jax.grad(lambda *a: fkj.gaussian_field(*a).sum(), argnums=(0, 1, 2, 3)))
    f(p, m, L, w)
    with fkj.count_calls() as n:
        jax.block_until_ready(f(p, m, L, w))
    assert n() == 1  # the fused backward (XLA drops the forward, whose value is unused)


def test_gaussian_vmap(rng):
    p, m, L, w = gaussians(rng, 8, 3, jnp.float64)
    pb = jnp.stack([p, p + 1, p * 2])
    with jax.default_matmul_precision("highest"):
        want = jnp.stack([field_ref(q, m, L, w, 0.0) for q in pb])
    close(jax.vmap(lambda q: fkj.gaussian_field(q, m, L, w))(pb), want, 1e-11)


def test_gaussian_errors_in_python_and_from_the_handler(rng):
    p, m, L, w = gaussians(rng, 4, 2, jnp.float64)
    with pytest.raises(ValueError, match=r"points must be \[B, 3\], got shape \(4, 2\)"):
        fkj.mahalanobis(p[:, :2], m, L)
    with pytest.raises(ValueError, match=r"chol must be \[N, 3, 3\] with N = 2 from means"):
        fkj.mahalanobis(p, m, L[:1])
    with pytest.raises(TypeError, match="points has dtype float64 but weights has dtype float32"):
        fkj.gaussian_field(p, m, L, w.astype(jnp.float32))
    # eps is checked by fusekit itself, in the handler: its message reaches Python
    with pytest.raises(Exception, match=r"fk_xla_mahalanobis_forward_(cpu|cuda): eps = -1 .*FK_ERROR_INVALID_ARGUMENT"):
        jax.block_until_ready(fkj.mahalanobis(p, m, L, eps=-1.0))


def test_handler_validates_like_the_c_abi(rng):
    """An ffi_call that skips fusekit.jax's checks is refused by the handler with
    fusekit's own message (the same validation as fk_add)."""
    fkj._register()
    a = rand(rng, (3, 3), jnp.float32)
    call = jax.ffi.ffi_call("fusekit_add", jax.ShapeDtypeStruct((2, 2), jnp.float32), vmap_method="sequential")
    with pytest.raises(Exception, match=re.escape("out has shape [2, 2] but a [3, 3] and b [3, 3] broadcast to [3, 3] (FK_ERROR_SHAPE_MISMATCH)")):
        jax.block_until_ready(call(a, a))


# ---------------------------------------------------------------- geodesic flow

HP = jax.lax.Precision.HIGHEST


def geo_problem(rng, b, d, r, dtype, force=True):
    x0, v0 = rand(rng, (b, d), dtype), 0.5 * rand(rng, (b, d), dtype)
    U, W = 0.4 * rand(rng, (d, r), dtype), 0.4 * rand(rng, (d, r), dtype)
    f = 0.3 * rand(rng, (b, d), dtype) if force else None
    mu = jnp.asarray(0.1 * rng.random(d), dtype)
    return x0, v0, U, W, f, mu


def chr_ref(v, U, W, c):
    return jnp.clip(jnp.matmul(jnp.matmul(v, U, precision=HP) ** 2, W.T, precision=HP), -c, c)


def leapfrog_ref(x, v, U, W, dt, steps, f=None, mu=None, c=fkj.DEFAULT_C):
    h = dt / 2
    f = 0 if f is None else f
    mu = 0 if mu is None else mu
    for _ in range(steps):
        vh = v + h * (f - chr_ref(v, U, W, c) - mu * v)
        x = x + dt * vh
        v = vh + h * (f - chr_ref(vh, U, W, c) - mu * vh)
    return x, v


def rel_close(got, want, tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.abs(got - want).max() <= tol * max(np.abs(want).max(), 1e-30), (np.abs(got - want).max(), tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_christoffel_values(rng, dtype):
    _, v, U, W, _, _ = geo_problem(rng, 9, 6, 3, dtype)
    tol = 2e-5 if dtype == jnp.float32 else 1e-13
    for c in (fkj.DEFAULT_C, 0.02, float("inf")):
        got = jax.jit(fkj.christoffel, static_argnums=3)(v, U, W, c)
        assert got.dtype == dtype
        close(got, chr_ref(v, U, W, c), tol)


def test_christoffel_grads_are_fusekits_backward(rng):
    _, v, U, W, _, _ = geo_problem(rng, 7, 5, 3, jnp.float64)
    check_grads(lambda *a: fkj.christoffel(*a, c=float("inf")), (v, U, W), order=1, modes=["rev"])
    # with the clamp active on some entries: against jax.grad of the jnp reference
    g = rand(rng, v.shape, jnp.float64)
    loss = lambda fn: lambda *a: (fn(*a, 0.02) * g).sum()  # noqa: E731
    got = jax.jit(jax.grad(loss(fkj.christoffel), argnums=(0, 1, 2)))(v, U, W)
    want = jax.grad(loss(chr_ref), argnums=(0, 1, 2))(v, U, W)
    assert 0 < float((jnp.abs(chr_ref(v, U, W, float("inf"))) > 0.02).mean()) < 1
    for a, b in zip(got, want):
        rel_close(a, b, 1e-10)
    with fkj.count_calls() as n:
        jax.block_until_ready(jax.jit(jax.grad(loss(fkj.christoffel), argnums=(0, 1, 2)))(v, U, W))
    assert n() == 1  # one fused backward for the three gradients


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_leapfrog_values(rng, dtype):
    x0, v0, U, W, f, mu = geo_problem(rng, 6, 5, 3, dtype)
    tol = 5e-5 if dtype == jnp.float32 else 1e-12
    fn = jax.jit(fkj.leapfrog, static_argnums=(4, 5), static_argnames=("c",))
    for args in ((f, mu), (f, None), (None, mu), (None, None)):
        x, v = fn(x0, v0, U, W, 0.1, 3, *args, c=0.5)
        xr, vr = leapfrog_ref(x0, v0, U, W, 0.1, 3, *args, c=0.5)
        close(x, xr, tol)
        close(v, vr, tol)


@pytest.mark.parametrize("save_traj", [True, False])
def test_leapfrog_grads_are_fusekits_backward(rng, save_traj):
    x0, v0, U, W, f, mu = geo_problem(rng, 5, 4, 2, jnp.float64)
    gx, gv = rand(rng, x0.shape, jnp.float64), rand(rng, v0.shape, jnp.float64)

    def loss(fn, **kw):
        def lf(x0, v0, U, W, f):
            x, v = fn(x0, v0, U, W, 0.1, 3, f, mu, 0.3, **kw)
            return (x * gx).sum() + (v * gv).sum()

        return lf

    got = jax.jit(jax.grad(loss(fkj.leapfrog, save_traj=save_traj), argnums=(0, 1, 2, 3, 4)))(x0, v0, U, W, f)
    want = jax.grad(loss(leapfrog_ref), argnums=(0, 1, 2, 3, 4))(x0, v0, U, W, f)
    for a, b in zip(got, want):
        rel_close(a, b, 1e-10)
    check_grads(lambda x0, v0, U, W, f: fkj.leapfrog(x0, v0, U, W, 0.1, 2, f, c=float("inf"), save_traj=save_traj),
                (x0, v0, U, W, f), order=1, modes=["rev"])
    # mu gets no gradient (fusekit's backward has none): stopped, so zero
    dmu = jax.grad(lambda m: fkj.leapfrog(x0, v0, U, W, 0.1, 2, f, m)[1].sum())(mu)
    assert not np.asarray(dmu).any()


def test_geodesic_precision_flags(rng):
    _, v, U, W, _, _ = geo_problem(rng, 4, 4, 2, jnp.float32)
    chr_ = lambda v: fkj.christoffel(v, U, W)  # noqa: E731
    lf = lambda v: fkj.leapfrog(v, v, U, W, 0.1, 2)[1]  # noqa: E731
    assert _flags_in_hlo(chr_, v) == {"0"} and _flags_in_hlo(lf, v) == {"0"}
    with jax.default_matmul_precision("tensorfloat32"):
        assert _flags_in_hlo(chr_, v) == {"1"} and _flags_in_hlo(lf, v) == {"1"}
    with jax.default_matmul_precision("high"):  # 3xTF32 where the op has it: the leapfrog forward
        assert _flags_in_hlo(chr_, v) == {"0"} and _flags_in_hlo(lf, v) == {"4"}
    assert _flags_in_hlo(lambda v: fkj.christoffel(v, U, W, precision=True), v) == {"1"}
    assert _flags_in_hlo(lambda v: fkj.leapfrog(v, v, U, W, 0.1, 2, precision="TF32_TF32_F32_X3")[0], v) == {"4"}
    assert fkj.precision_mode(jax.lax.Precision.HIGH) == "tf32x3" and not fkj.allow_tf32("high")
    # CPU results do not depend on it (on the CPU device: jax's default is CUDA on a GPU machine)
    v, U, W = jax.device_put((v, U, W), jax.devices("cpu")[0])
    with jax.default_matmul_precision("tensorfloat32"):
        close(fkj.christoffel(v, U, W), chr_ref(v, U, W, fkj.DEFAULT_C), 2e-5)


def test_geodesic_vmap_and_errors(rng):
    x0, v0, U, W, f, mu = geo_problem(rng, 4, 5, 3, jnp.float64)
    vs = jnp.stack([v0, 2 * v0, -v0])
    close(jax.vmap(lambda v: fkj.christoffel(v, U, W))(vs), jnp.stack([chr_ref(v, U, W, 5.0) for v in vs]), 1e-13)
    got = jax.vmap(lambda v: fkj.leapfrog(x0, v, U, W, 0.1, 2, f)[1])(vs)
    close(got, jnp.stack([leapfrog_ref(x0, v, U, W, 0.1, 2, f)[1] for v in vs]), 1e-12)
    with pytest.raises(ValueError, match=r"christoffel: U must be \[D, R\] with D = 5 from v, got shape \(4, 3\)"):
        fkj.christoffel(v0, U[:4], W)
    with pytest.raises(ValueError, match=r"W must be \[D, R\] = \[5, 3\] like U"):
        fkj.christoffel(v0, U, W[:, :2])
    with pytest.raises(TypeError, match="v has dtype float64 but W has dtype float32"):
        fkj.christoffel(v0, U, W.astype(jnp.float32))
    with pytest.raises(TypeError, match="v has dtype int32; this op takes float32, float64"):
        fkj.christoffel(v0.astype(jnp.int32), U, W)
    with pytest.raises(ValueError, match=r"leapfrog: f must be \[B, D\] = \[4, 5\] like v0"):
        fkj.leapfrog(x0, v0, U, W, 0.1, 2, f[:3])
    with pytest.raises(ValueError, match=r"mu must be \[D\] with D = 5"):
        fkj.leapfrog(x0, v0, U, W, 0.1, 2, mu=mu[:2])
    with pytest.raises(ValueError, match="steps must be >= 1"):
        fkj.leapfrog(x0, v0, U, W, 0.1, 0)
    with pytest.raises(TypeError, match="steps must be an integer"):
        fkj.leapfrog(x0, v0, U, W, 0.1, 2.0)
    # what only fusekit checks comes from the handler, in fusekit's words
    with pytest.raises(Exception, match=r"fk_xla_christoffel_forward_(cpu|cuda): c = -1.*FK_ERROR_INVALID_ARGUMENT"):
        jax.block_until_ready(fkj.christoffel(v0, U, W, c=-1.0))
    with pytest.raises(Exception, match=r"fk_xla_leapfrog_forward_(cpu|cuda): dt = inf must be finite"):
        jax.block_until_ready(fkj.leapfrog(x0, v0, U, W, float("inf"), 2))


# ---------------------------------------------------------------- optimizer math


def spd(rng, n, dtype, batch=(), cond=30.0):
    q, _ = np.linalg.qr(rng.standard_normal(batch + (n, n)))
    lam = np.geomspace(1.0, cond, n)
    return jnp.asarray((q * lam[..., None, :]) @ np.swapaxes(q, -1, -2), dtype)


def power_ref(a, p, eps=0.0):
    a = np.asarray(a, np.float64) + eps * np.eye(a.shape[-1])
    lam, q = np.linalg.eigh(a)
    return (q * lam[..., None, :] ** p) @ np.swapaxes(q, -1, -2)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_matrix_power_newton_and_eigh(rng, dtype):
    a = spd(rng, 6, dtype, batch=(3,))
    tol = 2e-5 if dtype == jnp.float32 else 1e-11
    for p in (-0.5, -0.25):
        got = jax.jit(fkj.matrix_power, static_argnums=(1, 2), static_argnames="max_iter")(a, p, 1e-3, max_iter=30)
        rel_close(got, power_ref(a, p, 1e-3), tol)
    for p in (0.5, -1 / 3, 2.0):
        rel_close(fkj.matrix_power(a, p, method="eigh"), power_ref(a, p), tol)
    # one call under vmap for 2-D matrices (a batch of them)
    with fkj.count_calls() as n:
        got = jax.block_until_ready(jax.jit(jax.vmap(lambda m: fkj.matrix_power(m, -0.5, max_iter=30)))(a))
    assert n() == 1
    rel_close(got, power_ref(a, -0.5), tol)


def test_matrix_power_errors(rng):
    a = spd(rng, 4, jnp.float64)
    with pytest.raises(ValueError, match=r"a must hold square matrices, got shape \(4, 3\)"):
        fkj.matrix_power(a[:, :3], -0.5)
    with pytest.raises(ValueError, match="method 'qr'"):
        fkj.matrix_power(a, -0.5, method="qr")
    with pytest.raises(TypeError, match="a has dtype int32"):
        fkj.matrix_power(a.astype(jnp.int32), -0.5)
    msg = r"fk_xla_matrix_power_(cpu|cuda): power = 0.5: the Newton method computes inverse roots only"
    with pytest.raises(Exception, match=msg):
        jax.block_until_ready(fkj.matrix_power(a, 0.5))
    with pytest.raises(TypeError, match="fusekit.jax.matrix_power is not differentiable"):
        jax.grad(lambda m: fkj.matrix_power(m, -0.5).sum())(a)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_shampoo_stats_values(rng, dtype):
    tol = 2e-5 if dtype == jnp.float32 else 1e-12
    for batch in ((), (2,)):
        g = rand(rng, batch + (3, 5), dtype)
        l, r = spd(rng, 3, dtype, batch), spd(rng, 5, dtype, batch)
        lu = jnp.triu(l) + 7 * jnp.tril(l, -1)  # only the upper triangle is read
        lo, ro = jax.jit(fkj.shampoo_stats, static_argnums=(3, 4))(g, lu, r, 0.25, 0.9)
        wl, wr = fkj._stats_ref(g, l, r, 0.25, 0.9)
        close(lo, wl, tol)
        close(ro, wr, tol)
        assert np.array_equal(np.asarray(lo), np.swapaxes(np.asarray(lo), -1, -2))
        lo, ro = fkj.shampoo_stats(g, None, r, beta=0.0)
        assert lo is None
        close(ro, fkj._stats_ref(g, None, r, 1.0, 0.0)[1], tol)
    # the update is in place in XLA's terms: donating l makes it the result's buffer
    g, l = rand(rng, (3, 5), jnp.float64), spd(rng, 3, jnp.float64)
    want = fkj._stats_ref(g, l, None, 1.0, 1.0)[0]
    step = jax.jit(lambda g, l: fkj.shampoo_stats(g, l)[0], donate_argnums=1)
    close(step(g, jnp.array(l)), want, 1e-12)


def test_shampoo_grads_and_vmap(rng):
    g = rand(rng, (3, 4), jnp.float64)
    l, r = spd(rng, 3, jnp.float64), spd(rng, 4, jnp.float64)
    check_grads(lambda *a: fkj.shampoo_stats(*a, alpha=0.5, beta=0.9), (g, l, r), order=1, modes=["rev"])
    check_grads(fkj.shampoo_precondition, (g, l, r), order=1, modes=["rev"])
    hp = dict(precision=HP)
    close(fkj.shampoo_precondition(g, l, r), jnp.matmul(jnp.matmul(l, g, **hp), r, **hp), 1e-12)
    close(fkj.shampoo_precondition(g, l), jnp.matmul(l, g, **hp), 1e-12)
    gs = rand(rng, (5, 3, 4), jnp.float64)
    want = jnp.matmul(jnp.matmul(l, gs, **hp), r, **hp)
    close(jax.vmap(lambda x: fkj.shampoo_precondition(x, l, r))(gs), want, 1e-12)
    close(fkj.shampoo_precondition(gs, l[None], r), want, 1e-12)
    ls = jnp.stack([l] * 5)
    lo = jax.vmap(lambda x, m: fkj.shampoo_stats(x, m)[0])(gs, ls)
    close(lo, fkj._stats_ref(gs, ls, None, 1.0, 1.0)[0], 1e-12)
    with pytest.raises(ValueError, match="give l, r or both"):
        fkj.shampoo_stats(g)
    with pytest.raises(ValueError, match=r"r must be \[4, 4\] for grad of shape \(3, 4\)"):
        fkj.shampoo_stats(g, r=l)
    with pytest.raises(ValueError, match=r"l_root must be \[3, 3\]"):
        fkj.shampoo_precondition(g, r)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("seq", [False, True])
def test_per_sample_ops(rng, dtype, seq):
    lead = (6, 3) if seq else (6,)
    a, g = rand(rng, lead + (5,), dtype), rand(rng, lead + (4,), dtype)
    tol = 5e-5 if dtype == jnp.float32 else 1e-12
    G = fkj._psg_ref(a, g)
    close(jax.jit(fkj.per_sample_grads)(a, g), G, tol)
    sq = (G**2).sum((-1, -2))
    rel_close(jax.jit(fkj.per_sample_grad_norms)(a, g), sq, tol)
    C = float(np.median(np.sqrt(np.asarray(sq))))
    s = jnp.minimum(1.0, C / jnp.sqrt(sq))
    out, sq2 = jax.jit(fkj.dp_clipped_grad_sum, static_argnums=2, static_argnames="return_norms")(
        a, g, C, return_norms=True)
    rel_close(out, (s[:, None, None] * G).sum(0), tol)
    rel_close(sq2, sq, tol)


def test_per_sample_grads_and_errors(rng):
    a, g = rand(rng, (5, 3), jnp.float64), rand(rng, (5, 2), jnp.float64)
    check_grads(fkj.per_sample_grads, (a, g), order=1, modes=["rev"])
    check_grads(fkj.per_sample_grad_norms, (a, g), order=1, modes=["rev"])
    check_grads(lambda a, g: fkj.dp_clipped_grad_sum(a, g, 1.0), (a, g), order=1, modes=["rev"])
    at, gt = rand(rng, (3, 2, 3), jnp.float64), rand(rng, (3, 2, 2), jnp.float64)
    got = jax.grad(lambda a: fkj.per_sample_grad_norms(a, gt).sum())(at)
    rel_close(got, jax.grad(lambda a: fkj._norms_ref(a, gt).sum())(at), 1e-12)
    ab = jnp.stack([a, 2 * a])
    close(jax.vmap(lambda x: fkj.per_sample_grad_norms(x, g))(ab), jnp.stack([fkj._norms_ref(x, g) for x in ab]), 1e-12)
    with pytest.raises(ValueError, match=r"same leading dimensions, got \(5, 3\) and \(4, 2\)"):
        fkj.per_sample_grad_norms(a, g[:4])
    with pytest.raises(TypeError, match="a has dtype float64 but g has dtype float32"):
        fkj.dp_clipped_grad_sum(a, g.astype(jnp.float32), 1.0)
    with pytest.raises(Exception, match=r"fk_xla_dp_clipped_grad_sum_(cpu|cuda): max_norm = -1"):
        jax.block_until_ready(fkj.dp_clipped_grad_sum(a, g, -1.0))


# ---------------------------------------------------------------- the rest


def test_call_counter(rng):
    a = rand(rng, (4,), jnp.float32)
    f = jax.jit(lambda x: fkj.exp(fkj.add(x, x)))
    f(a).block_until_ready()
    before = fkj.call_count()
    with fkj.count_calls() as n:
        for _ in range(3):
            f(a).block_until_ready()
        assert n() == 6
    f(a).block_until_ready()
    assert fkj.call_count() == before + 6  # off again: not counted


def test_version_gate(monkeypatch):
    monkeypatch.setattr(jax, "__version_info__", (0, 4, 30), raising=False)
    monkeypatch.delenv("FUSEKIT_JAX_ANY_VERSION", raising=False)
    with pytest.raises(ImportError, match=r"fusekit.jax supports jax >= 0.10.2 and < 0.12.0 .*this is jax"):
        fkj._check_version()
    monkeypatch.setenv("FUSEKIT_JAX_ANY_VERSION", "1")
    fkj._check_version()


SHARD_MAP_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import fusekit.jax as fkj
    assert len(jax.devices()) == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    from jax_testutil import linear_and_field_operands
    x, w, p, m, L, wt = linear_and_field_operands(np.random.default_rng(0), 16, 8, 5, 32, 4)

    def local(x, p):
        y = fkj.linear(fkj.tanh(x), w, activation="relu")
        return y, fkj.gaussian_field(p, m, L, wt)

    def loss(w_, x):
        return (fkj.linear(x, w_, activation="gelu") ** 2).sum()

    f = jax.jit(shard_map(local, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=(P("d"), P("d"))))
    y, fld = f(x, p)
    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(y, jax.nn.relu(jnp.tanh(x) @ w.T), rtol=1e-4, atol=1e-4)
        d2 = ((p[:, None] - m[None]) ** 2).sum(-1)
        np.testing.assert_allclose(fld, jnp.exp(-0.5 * d2).sum(-1), rtol=1e-5, atol=1e-5)
        # w is replicated (invariant): its gradient is the sum over the shards
        g = jax.jit(shard_map(jax.grad(loss), mesh=mesh, in_specs=(P(), P("d")), out_specs=P()))(w, x)
        want = jax.grad(lambda w_: (jax.nn.gelu(x @ w_.T, approximate=False) ** 2).sum())(w)
    np.testing.assert_allclose(g, want, rtol=2e-4, atol=2e-4)
    print("SHARD_MAP_OK", len({s.device for s in y.addressable_shards}))
    """
)


#: four host devices (the XLA flag must be set before jax starts: a subprocess)
FOUR_CPUS = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}


def test_shard_map_over_four_cpu_devices():
    """Each shard's handlers run on XLA's threads, sharing fusekit's CPU context."""
    assert "SHARD_MAP_OK 4" in run_script(SHARD_MAP_SCRIPT, env=FOUR_CPUS, timeout=300)


SHARD_MAP_BATCH_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    import fusekit.jax as fkj
    assert len(jax.devices()) == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    rng = np.random.default_rng(1)
    r = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float64)
    x0, v0, f = r(16, 6), 0.5 * r(16, 6), 0.3 * r(16, 6)
    U, W = 0.4 * r(6, 3), 0.4 * r(6, 3)
    a, g = r(16, 5), r(16, 4)
    HP = jax.lax.Precision.HIGHEST

    def chr_ref(v, U, W, c):
        return jnp.clip(jnp.matmul(jnp.matmul(v, U, precision=HP) ** 2, W.T, precision=HP), -c, c)

    def lf_ref(x, v, U, W, f):
        for _ in range(2):
            vh = v + 0.05 * (f - chr_ref(v, U, W, 5.0))
            x = x + 0.1 * vh
            v = vh + 0.05 * (f - chr_ref(vh, U, W, 5.0))
        return x, v

    # batch-parallel ops along the batch (rows / samples) of the mesh
    def local(v, x, f, a, g):
        return fkj.christoffel(v, U, W), fkj.leapfrog(x, v, U, W, 0.1, 2, f), fkj.per_sample_grad_norms(a, g)

    spec = P("d")
    fn = jax.jit(shard_map(local, mesh=mesh, in_specs=(spec,) * 5, out_specs=(spec, (spec, spec), spec)))
    gam, (xT, vT), sq = fn(v0, x0, f, a, g)
    np.testing.assert_allclose(gam, chr_ref(v0, U, W, 5.0), rtol=1e-12, atol=1e-12)
    xr, vr = lf_ref(x0, v0, U, W, f)
    np.testing.assert_allclose(xT, xr, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(vT, vr, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sq, (a * a).sum(-1) * (g * g).sum(-1), rtol=1e-12)
    assert len({s.device for s in sq.addressable_shards}) == 4

    # U, W replicated: their gradients are the sums over the shards of the batch;
    # the DP clipped sum per shard, psum'ed
    def loss(U_, W_, x, v, f):
        xT, vT = fkj.leapfrog(x, v, U_, W_, 0.1, 2, f)
        return (xT ** 2).sum() + (fkj.christoffel(v, U_, W_) * vT).sum()

    gspec = (P(), P(), spec, spec, spec)
    grads = jax.jit(shard_map(jax.grad(loss, argnums=(0, 1, 3)), mesh=mesh, in_specs=gspec,
                              out_specs=(P(), P(), spec)))(U, W, x0, v0, f)

    def loss_ref(U_, W_, x, v, f):
        xT, vT = lf_ref(x, v, U_, W_, f)
        return (xT ** 2).sum() + (chr_ref(v, U_, W_, 5.0) * vT).sum()

    want = jax.grad(loss_ref, argnums=(0, 1, 3))(U, W, x0, v0, f)
    for got_, want_ in zip(grads, want):
        np.testing.assert_allclose(got_, want_, rtol=1e-10, atol=1e-12)

    clip = jax.jit(shard_map(lambda a, g: jax.lax.psum(fkj.dp_clipped_grad_sum(a, g, 1.0), "d"), mesh=mesh,
                             in_specs=(spec, spec), out_specs=P()))
    np.testing.assert_allclose(clip(a, g), fkj.dp_clipped_grad_sum(a, g, 1.0), rtol=1e-12, atol=1e-12)
    print("SHARD_MAP_BATCH_OK")
    """
)


def test_shard_map_batch_parallel_ops_over_four_cpu_devices():
    """The geodesic ops and the per-sample ops sharded along their batch over four
    host devices: values, and the replicated parameters' gradients summed over the
    shards by JAX (f64, against jnp)."""
    assert "SHARD_MAP_BATCH_OK" in run_script(SHARD_MAP_BATCH_SCRIPT, env=FOUR_CPUS, timeout=300)
