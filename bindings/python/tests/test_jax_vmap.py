"""fusekit.jax under jax.vmap: the batch-parallel ops fold a vmapped axis into their
row axis (one handler call) when only their row operands are batched, and loop
(one call per element) when a shared operand is batched. Values against jnp
references and a loop of the op over the elements, f32 and f64; grad of vmap and
vmap of grad against jax.grad of the references (per-element gradients of the
shared operands under vmap of grad, their sum under grad of vmap); handler calls
counted to show the fold. Skipped when jax is not installed.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import fusekit.jax as fkj  # noqa: E402
from test_jax import chr_ref, field_ref, gaussians, leapfrog_ref, maha_ref, rand  # noqa: E402

N = 3  # the vmapped axis' size
TOL = {jnp.float32: 3e-5, jnp.float64: 1e-11}


def leaves(x):
    return [np.asarray(v, np.float64) for v in jax.tree.leaves(x)]


def rel_close(got, want, tol):
    got, want = leaves(got), leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        assert np.abs(g - w).max() <= tol * max(np.abs(w).max(), 1.0), (np.abs(g - w).max(), tol)


def calls(f, *args):
    """Handler calls of one run of jit(f) (after a first, compiling run)."""
    g = jax.jit(f)
    jax.block_until_ready(g(*args))
    with fkj.count_calls() as n:
        jax.block_until_ready(g(*args))
    return n()


def sq_loss(fn):
    """sum of squares of fn's results, in f64 (keeps the forward alive: its value
    enters the loss, so a run is the forward and the backward)."""
    return lambda *a: sum((o.astype(jnp.float64) ** 2).sum() for o in jax.tree.leaves(fn(*a)))


def loop(fn, in_axes, args):
    """fn over the elements one by one, stacked (the op's unbatched calls)."""
    outs = []
    for i in range(N):
        outs.append(fn(*[x if a is None else x[i] for x, a in zip(args, in_axes)]))
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)


def check_vmap(fn, ref, args, in_axes, dtype, *, folds: bool, fused_backward: bool = True, grads: bool = True):
    """fn under vmap with in_axes against ref and the loop; its handler calls
    (one when it folds, N when it loops); grad of vmap and vmap of grad against
    the reference's."""
    tol = TOL[dtype]
    if isinstance(in_axes, int):
        in_axes = (in_axes,) * len(args)
    vf, vr = jax.vmap(fn, in_axes), jax.vmap(ref, in_axes)
    got = vf(*args)
    rel_close(got, vr(*args), tol)
    rel_close(got, loop(fn, in_axes, args), tol)
    assert calls(vf, *args) == (1 if folds else N)
    # vmap outside jit: the forward folds inside the op's custom_vjp as well
    assert calls(jax.vmap(jax.jit(fn), in_axes), *args) == (1 if folds else N)
    if not grads:
        return
    idx = tuple(range(len(args)))
    # grad of vmap: an unbatched shared operand gets the sum over the elements
    rel_close(jax.jit(jax.grad(sq_loss(vf), idx))(*args), jax.grad(sq_loss(vr), idx)(*args), 10 * tol)
    if fused_backward:
        # one forward and one fused backward when it folds; per element otherwise
        assert calls(jax.grad(sq_loss(vf), idx), *args) == (2 if folds else 2 * N)
    # vmap of grad: every element its own gradients, shared operands included
    pg = jax.jit(jax.vmap(jax.grad(sq_loss(fn), idx), in_axes))(*args)
    rel_close(pg, jax.vmap(jax.grad(sq_loss(ref), idx), in_axes)(*args), 10 * tol)
    for g, x, a in zip(pg, args, in_axes):
        assert g.shape == ((N,) + x.shape if a is None else x.shape)


DTYPES = [jnp.float32, jnp.float64]

# ---------------------------------------------------------------- geodesic


def geo(rng, dtype, b=5, d=6, r=3):
    x = rand(rng, (N, b, d), dtype)
    v = 0.5 * rand(rng, (N, b, d), dtype)
    f = 0.3 * rand(rng, (N, b, d), dtype)
    U = 0.4 * rand(rng, (N, d, r), dtype)
    W = 0.4 * rand(rng, (N, d, r), dtype)
    mu = jnp.asarray(0.1 * rng.random((N, d)), dtype)
    return x, v, f, U, W, mu


@pytest.mark.parametrize("dtype", DTYPES)
def test_christoffel_folds_rows_and_loops_over_shared(rng, dtype):
    _, v, _, U, W, _ = geo(rng, dtype)
    fn = lambda v, U, W: fkj.christoffel(v, U, W, 0.3)  # noqa: E731 - the clamp active on some entries
    ref = lambda v, U, W: chr_ref(v, U, W, 0.3)  # noqa: E731
    assert 0 < float((jnp.abs(chr_ref(v[0], U[0], W[0], float("inf"))) > 0.3).mean()) < 1
    check_vmap(fn, ref, (v, U[0], W[0]), (0, None, None), dtype, folds=True)
    check_vmap(fn, ref, (v, U, W[0]), (0, 0, None), dtype, folds=False)
    check_vmap(fn, ref, (v[0], U[0], W), (None, None, 0), dtype, folds=False)
    check_vmap(fn, ref, (v, U, W), 0, dtype, folds=False, grads=False)
    # another axis
    vt = jnp.moveaxis(v, 0, 2)
    got = jax.vmap(fn, (2, None, None), out_axes=1)(vt, U[0], W[0])
    rel_close(got, jnp.moveaxis(jax.vmap(ref, (0, None, None))(v, U[0], W[0]), 0, 1), TOL[dtype])


@pytest.mark.parametrize("dtype, save_traj", [(jnp.float32, True), (jnp.float64, True), (jnp.float64, False)])
def test_leapfrog_folds_rows_and_loops_over_shared(rng, dtype, save_traj):
    x, v, f, U, W, mu = geo(rng, dtype)

    def fn(x, v, U, W, f, mu):
        return fkj.leapfrog(x, v, U, W, 0.1, 3, f, mu, c=0.4, save_traj=save_traj)

    def ref(x, v, U, W, f, mu):
        return leapfrog_ref(x, v, U, W, 0.1, 3, f, jax.lax.stop_gradient(mu), c=0.4)

    shared = (U[0], W[0])
    check_vmap(fn, ref, (x, v, *shared, f, mu[0]), (0, 0, None, None, 0, None), dtype, folds=True)
    # an unbatched row operand is broadcast into the fold
    check_vmap(fn, ref, (x[0], v, *shared, f[0], mu[0]), (None, 0, None, None, None, None), dtype, folds=True)
    # a batched shared operand: a loop, still right
    check_vmap(fn, ref, (x, v, U, W[0], f, mu[0]), (0, 0, 0, None, 0, None), dtype, folds=False)
    check_vmap(fn, ref, (x, v, *shared, f, mu), (0, 0, None, None, 0, 0), dtype, folds=False)


def test_geodesic_vmap_check_grads(rng):
    x, v, f, U, W, _ = geo(rng, jnp.float64, b=3, d=4, r=2)
    check_grads(jax.vmap(lambda v, U, W: fkj.christoffel(v, U, W, float("inf")), (0, None, None)),
                (v, U[0], W[0]), order=1, modes=["rev"])
    check_grads(jax.vmap(lambda x, v, U, W, f: fkj.leapfrog(x, v, U, W, 0.1, 2, f, c=float("inf")),
                         (0, 0, None, None, 0)), (x, v, U[0], W[0], f), order=1, modes=["rev"])


def test_nested_vmap_folds_both_axes(rng):
    _, v, _, U, W, _ = geo(rng, jnp.float64)
    vv = jnp.stack([v, 2 * v])  # [2, N, B, D]
    inner = jax.vmap(lambda v: fkj.christoffel(v, U[0], W[0]))
    got = jax.vmap(inner)(vv)
    rel_close(got, jax.vmap(jax.vmap(lambda v: chr_ref(v, U[0], W[0], fkj.DEFAULT_C)))(vv), 1e-12)
    assert calls(jax.vmap(inner), vv) == 1
    L = lambda U: (jax.vmap(jax.vmap(lambda v: fkj.christoffel(v, U, W[0])))(vv) ** 2).sum()  # noqa: E731
    Lr = lambda U: (jax.vmap(jax.vmap(lambda v: chr_ref(v, U, W[0], fkj.DEFAULT_C)))(vv) ** 2).sum()  # noqa: E731
    rel_close(jax.grad(L)(U[0]), jax.grad(Lr)(U[0]), 1e-11)
    assert calls(jax.grad(L), U[0]) == 2


def test_the_fold_is_one_custom_call_in_the_hlo(rng):
    _, v, _, U, W, _ = geo(rng, jnp.float32)
    folded = jax.jit(jax.vmap(lambda v: fkj.christoffel(v, U[0], W[0]))).lower(v).as_text()
    assert folded.count("fusekit_christoffel_forward") == 1 and "while" not in folded
    looped = jax.jit(jax.vmap(lambda v, U: fkj.christoffel(v, U, W[0]))).lower(v, U).as_text()
    assert "while" in looped


# ---------------------------------------------------------------- Gaussian ops


@pytest.mark.parametrize("dtype", DTYPES)
def test_gaussian_ops_fold_points(rng, dtype):
    parts = [gaussians(rng, 6, 4, dtype) for _ in range(N)]
    p, m, L, w = (jnp.stack(xs) for xs in zip(*parts))
    with jax.default_matmul_precision("highest"):
        maha = lambda p, m, L: fkj.mahalanobis(p, m, L, 0.01)  # noqa: E731
        mref = lambda p, m, L: maha_ref(p, m, L, 0.01)  # noqa: E731
        check_vmap(maha, mref, (p, m[0], L[0]), (0, None, None), dtype, folds=True)
        check_vmap(maha, mref, (p[0], m, L[0]), (None, 0, None), dtype, folds=False)
        field = lambda p, m, L, w: fkj.gaussian_field(p, m, L, w, 0.01)  # noqa: E731
        fref = lambda p, m, L, w: field_ref(p, m, L, w, 0.01)  # noqa: E731
        check_vmap(field, fref, (p, m[0], L[0], w[0]), (0, None, None, None), dtype, folds=True)
        check_vmap(field, fref, (p, m[0], L[0], w), (0, None, None, 0), dtype, folds=False)
        check_vmap(field, fref, (p, m, L, w), 0, dtype, folds=False, grads=False)


# ---------------------------------------------------------------- linear


def test_linear_folds_x(rng):
    dtype = jnp.float32
    x, w, b = rand(rng, (N, 5, 6), dtype), rand(rng, (4, 6), dtype), rand(rng, (4,), dtype)
    hp = jax.lax.Precision.HIGHEST
    for act, jact in (("gelu", lambda y: jax.nn.gelu(y, approximate=False)), ("relu", jax.nn.relu)):
        fn = lambda x, w, b: fkj.linear(x, w, b, act)  # noqa: E731
        ref = lambda x, w, b: jact(jnp.matmul(x, w.T, precision=hp) + b)  # noqa: E731
        check_vmap(fn, ref, (x, w, b), (0, None, None), dtype, folds=True)
        check_vmap(fn, ref, (x[:, 0], w, b), (0, None, None), dtype, folds=True)  # 1-D x per element
        check_vmap(fn, ref, (x, jnp.stack([w, 2 * w, -w]), b), (0, 0, None), dtype, folds=False)


# ---------------------------------------------------------------- per-sample ops


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [False, True])
def test_per_sample_ops_fold_samples(rng, dtype, seq):
    shape = (N, 5, 3) if seq else (N, 5)
    a, g = rand(rng, shape + (4,), dtype), rand(rng, shape + (2,), dtype)
    with jax.default_matmul_precision("highest"):
        for fn, ref in ((fkj.per_sample_grads, fkj._psg_ref), (fkj.per_sample_grad_norms, fkj._norms_ref)):
            # the backward is jnp's (no handler call)
            check_vmap(fn, ref, (a, g), (0, 0), dtype, folds=True, fused_backward=False)
            check_vmap(fn, ref, (a[0], g), (None, 0), dtype, folds=True, fused_backward=False)
        # the clipped sum sums over the samples of each element: a loop
        clip = lambda a, g: fkj.dp_clipped_grad_sum(a, g, 1.0, return_norms=True)  # noqa: E731
        check_vmap(clip, lambda a, g: fkj._clipped_ref(a, g, 1.0), (a, g), (0, 0), dtype, folds=False,
                   fused_backward=False)
