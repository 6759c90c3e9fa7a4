"""Optimizer math through the Python bindings (docs/ops.md section 4): matrix powers
(eigendecomposition and Newton) against numpy.linalg.eigh in float64, the report,
non-convergence (FK_ERROR_NOT_CONVERGED); Shampoo statistics and preconditioning;
per-sample gradients against an explicit einsum (and torch autograd), their norms
and the DP-SGD clipped sum; bad inputs; numpy, fusekit Buffers and torch CPU
tensors; CUDA variants when torch sees a GPU (skipped otherwise, as in
test_cuda.py)."""

import contextlib
import math

import numpy as np
import pytest
from fk_testutil import cuda_available, rel_err

import fusekit
from fusekit import _lib

try:
    import torch
except ImportError:  # the torch tests are skipped
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
needs_cuda = pytest.mark.skipif(not cuda_available(), reason="torch.cuda.is_available() is False")

DTYPES = [np.float32, np.float64]


def _tol(dtype) -> float:
    """Relative (Frobenius) error allowed against the float64 references."""
    return 1e-10 if np.dtype(dtype) == np.float64 else 2e-4


def _close(got, want, dtype, factor=1.0, what=""):
    err = rel_err(np.asarray(got), want)
    assert err <= _tol(dtype) * factor, f"{what}: relative error {err:.3g} > {_tol(dtype) * factor:.3g}"


def _spd(rng, n, batch=None):
    """Random symmetric positive definite matrices (eigenvalues in about [0.1, 4])."""
    shape = (n, n + 3) if batch is None else (batch, n, n + 3)
    x = rng.uniform(-1.0, 1.0, size=shape)
    m = x @ np.swapaxes(x, -1, -2) / (n + 3) + 0.1 * np.eye(n)
    return (m + np.swapaxes(m, -1, -2)) / 2


def _spd_with(rng, spectrum):
    """Q diag(spectrum) Q^T for a random orthogonal Q."""
    n = len(spectrum)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    m = q @ np.diag(spectrum) @ q.T
    return (m + m.T) / 2


def _power_ref(a, power, eps):
    """(a + eps I)^power in float64 by numpy.linalg.eigh, with the library's shift
    of a spectrum below eps; returns (result, smallest eigenvalue of a + eps I)."""
    a = np.asarray(a, dtype=np.float64)
    w, q = np.linalg.eigh(a + eps * np.eye(a.shape[-1]))
    lmin = float(w.min())
    w = w + (eps - lmin if lmin < eps else 0.0)
    return (q * w[..., None, :] ** power) @ np.swapaxes(q, -1, -2), lmin


def _as3(x):
    """[B, in] -> [B, 1, in]; [B, T, in] unchanged."""
    x = np.asarray(x, dtype=np.float64)
    return x[:, None, :] if x.ndim == 2 else x


def _psg_ref(a, g):
    """Per-sample gradients G_b = g_b^T a_b [B, out, in] (sum over T), float64."""
    return np.einsum("bto,bti->boi", _as3(g), _as3(a))


def _clipped_ref(grads, max_norm):
    norms = np.sqrt((grads**2).sum(axis=(1, 2)))
    factor = np.where(norms > 0, np.minimum(1.0, max_norm / np.where(norms > 0, norms, 1.0)), 1.0)
    return (factor[:, None, None] * grads).sum(axis=0)


# ---------------------------------------------------------------- matrix power


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 5, 17, 40])
@pytest.mark.parametrize("batch", [None, 3])
def test_matrix_power_eigh(rng, dtype, n, batch):
    a = _spd(rng, n, batch)
    eps = 1e-3
    for power in (-0.25, -0.5, 0.5, 1.0, 2.0, -1.0, 1.0 / 3.0):
        got, rep = fusekit.matrix_power(a.astype(dtype), power, eps, method="eigh", return_report=True)
        assert got.dtype == dtype and got.shape == a.shape
        mats = a if batch is not None else a[None]
        refs = [_power_ref(m, power, eps) for m in mats]
        want = np.stack([r for r, _ in refs]).reshape(a.shape)
        _close(got, want, dtype, what=f"eigh n={n} batch={batch} power={power}")
        assert isinstance(rep, fusekit.MatrixPowerReport)
        assert (rep.method, rep.iterations, rep.converged) == ("eigh", 0, True)
        assert math.isnan(rep.residual)
        lmin = min(l for _, l in refs)
        assert abs(rep.min_eigenvalue - lmin) <= 1e-4 * max(abs(lmin), 1.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 16, 33])
def test_matrix_power_newton(rng, dtype, n):
    a = _spd(rng, n, batch=2)
    # the default tolerances: 1e-5 for float32 (the final residuals are
    # close to float32's floor), 1e-12 for float64
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for p in (1, 2, 3, 4, 8):
        got, rep = fusekit.matrix_power(a.astype(dtype), -1.0 / p, 1e-6, method="newton", return_report=True)
        want = np.stack([_power_ref(m, -1.0 / p, 1e-6)[0] for m in a])
        _close(got, want, dtype, factor=1.0 if dtype == np.float64 else 0.5, what=f"newton n={n} p={p}")
        assert rep.method == "newton" and rep.converged
        assert 1 <= rep.iterations <= 100
        assert rep.residual <= tol
        assert math.isnan(rep.min_eigenvalue)


def test_matrix_power_default_tolerances(rng):
    a = _spd(rng, 8)
    _, rep64 = fusekit.matrix_power(a, -0.5, method="newton", return_report=True)
    assert rep64.converged and rep64.residual <= 1e-12
    _, rep32 = fusekit.matrix_power(a.astype(np.float32), -0.5, method="newton", return_report=True)
    assert rep32.converged and rep32.residual <= 1e-5
    # allow_tf32 (ignored on the CPU) loosens float32's default tolerance to 3e-2 and
    # iterates to the precision floor before the strict residual is measured
    got, rep_tf = fusekit.matrix_power(a.astype(np.float32), -0.5, method="newton", allow_tf32=True,
                                       return_report=True)
    assert rep_tf.converged and rep_tf.residual <= 3e-2
    assert rel_err(got, _power_ref(a, -0.5, 0.0)[0]) < 1e-2


def test_matrix_power_identity_and_auto(rng):
    a = _spd(rng, 24)
    for p in (0.25, 0.5, 1.0, 1.7):
        pos = fusekit.matrix_power(a, p, method=fusekit.MATPOW_EIGH)
        neg = fusekit.matrix_power(a, -p, method="EIGH")
        np.testing.assert_allclose(pos @ neg, np.eye(24), atol=1e-11)
    # auto on the CPU is the eigendecomposition, for roots and other powers
    for power in (-0.25, 0.3):
        got, rep = fusekit.matrix_power(a, power, 1e-8, return_report=True)
        assert rep.method == "eigh"
        _close(got, _power_ref(a, power, 1e-8)[0], np.float64)


def test_matrix_power_shifts_indefinite_and_rank_deficient(rng):
    n = 12
    indefinite = _spd_with(rng, [-0.5] + list(range(1, n)))
    deficient = _spd_with(rng, [1.0 + i if i < n // 2 else 0.0 for i in range(n)])
    for m, eps in ((indefinite, 1e-3), (deficient, 1e-4)):
        got, rep = fusekit.matrix_power(m, -0.25, eps, method="eigh", return_report=True)
        want, lmin = _power_ref(m, -0.25, eps)
        assert np.isfinite(got).all()
        _close(got, want, np.float64, factor=1e3)
        assert abs(rep.min_eigenvalue - lmin) < 1e-8
    _, rep = fusekit.matrix_power(indefinite, -0.25, 1e-3, method="eigh", return_report=True)
    assert rep.min_eigenvalue < 0  # the spectrum was shifted


def test_matrix_power_unchecked_newton(rng):
    a = _spd(rng, 10)
    got, rep = fusekit.matrix_power(a, -0.5, method="newton", max_iter=40, tol=0.0, return_report=True)
    assert (rep.iterations, rep.converged) == (40, True)
    assert math.isnan(rep.residual)
    _close(got, _power_ref(a, -0.5, 0.0)[0], np.float64)


@pytest.mark.parametrize("given_out", [False, True])
def test_matrix_power_not_converged_raises_with_report(rng, given_out):
    a = _spd(rng, 10)
    out = np.full_like(a, np.nan) if given_out else None
    with pytest.raises(fusekit.NotConvergedError) as ei:
        fusekit.matrix_power(a, -0.5, method="newton", max_iter=2, tol=1e-12, out=out)
    e = ei.value
    assert isinstance(e, fusekit.Error) and isinstance(e, RuntimeError)
    assert e.status == _lib.ERROR_NOT_CONVERGED == 18
    assert e.status_name == "FK_ERROR_NOT_CONVERGED"
    assert "fk_matrix_power" in e.message and "did not converge" in e.message and "residual" in e.message
    assert "FK_ERROR_NOT_CONVERGED" in str(e)
    assert isinstance(e.report, fusekit.MatrixPowerReport)
    assert (e.report.method, e.report.iterations, e.report.converged) == ("newton", 2, False)
    assert 1e-12 < e.report.residual < math.inf
    # out holds the last iterate
    assert isinstance(e.out, np.ndarray) and e.out.shape == a.shape and np.isfinite(e.out).all()
    if given_out:
        assert e.out is out
    # auto never returns an unconverged Newton result (and on the CPU it is eigh)
    fusekit.matrix_power(a, -0.5, max_iter=2, tol=1e-12)


def test_matrix_power_out_and_buffers(rng):
    a = _spd(rng, 6, batch=2)
    out = np.empty_like(a)
    got = fusekit.matrix_power(a, -0.5, out=out)
    assert got is out
    _close(out, np.stack([_power_ref(m, -0.5, 0.0)[0] for m in a]), np.float64)
    # fusekit Buffers in, Buffer out
    buf = fusekit.as_buffer(a)
    res, rep = fusekit.matrix_power(buf, -0.5, return_report=True)
    assert isinstance(res, fusekit.Buffer) and res.shape == a.shape
    np.testing.assert_allclose(res.to_numpy(), out, rtol=1e-12, atol=1e-14)
    assert rep.method == "eigh"
    # an empty batch
    empty = fusekit.matrix_power(np.empty((0, 4, 4), np.float32), -0.5, method="newton")
    assert empty.shape == (0, 4, 4)


@contextlib.contextmanager
def _raises(cls, *words):
    """pytest.raises for a fusekit error class that also checks the status, its
    name (in the message too) and words of the library's message."""
    with pytest.raises(cls) as ei:
        yield ei
    e = ei.value
    assert type(e) is cls
    assert e.status == cls.status
    assert e.status_name == _lib.lib().fk_status_string(cls.status).decode()
    assert e.status_name in str(e)
    for w in words:
        assert w in e.message, f"{w!r} not in {e.message!r}"


def test_matrix_power_bad_inputs():
    a = np.eye(3, dtype=np.float32) * 2
    with _raises(fusekit.InvalidArgumentError, "fusekit.matrix_power", "method = 'cholesky'"):
        fusekit.matrix_power(a, -0.5, method="cholesky")
    with _raises(fusekit.InvalidArgumentError, "fk_matrix_power", "method = 7"):
        fusekit.matrix_power(a, -0.5, method=7)
    with _raises(fusekit.InvalidArgumentError, "power"):
        fusekit.matrix_power(a, float("nan"))
    with _raises(fusekit.InvalidArgumentError, "fusekit.matrix_power", "power must be a real number"):
        fusekit.matrix_power(a, "half")
    with _raises(fusekit.InvalidArgumentError, "eps"):
        fusekit.matrix_power(a, -0.5, -1.0)
    with _raises(fusekit.InvalidArgumentError, "eps"):
        fusekit.matrix_power(a, -0.5, float("inf"))
    with _raises(fusekit.InvalidArgumentError, "max_iter"):
        fusekit.matrix_power(a, -0.5, method="newton", max_iter=0)
    with _raises(fusekit.InvalidArgumentError, "fusekit.matrix_power", "max_iter = 4294967296"):
        fusekit.matrix_power(a, -0.5, max_iter=2**32)
    with _raises(fusekit.InvalidArgumentError, "tol"):
        fusekit.matrix_power(a, -0.5, method="newton", tol=float("nan"))
    with _raises(fusekit.InvalidArgumentError, "inverse roots"):
        fusekit.matrix_power(a, 0.3, method="newton")
    with _raises(fusekit.AliasingError, "out overlaps a"):
        fusekit.matrix_power(a, -0.5, out=a)
    with _raises(fusekit.ShapeMismatchError, "square"):
        fusekit.matrix_power(np.ones((3, 4), np.float32), -0.5)
    with _raises(fusekit.ShapeMismatchError, "out has shape [4, 4]"):
        fusekit.matrix_power(a, -0.5, out=np.empty((4, 4), np.float32))
    with _raises(fusekit.ShapeMismatchError, "a has shape [3]"):
        fusekit.matrix_power(np.ones(3, np.float32), -0.5)
    with _raises(fusekit.DtypeMismatchError, "out has dtype f64"):
        fusekit.matrix_power(a, -0.5, out=np.empty((3, 3)))
    with _raises(fusekit.UnsupportedDtypeError, "a has dtype f16"):
        fusekit.matrix_power(a.astype(np.float16), -0.5)
    with _raises(fusekit.UnsupportedError, "not contiguous"):
        fusekit.matrix_power(np.ones((3, 6), np.float32)[:, ::2], -0.5)
    with _raises(fusekit.InvalidArgumentError, "read-only"):
        ro = np.empty((3, 3), np.float32)
        ro.flags.writeable = False
        fusekit.matrix_power(a, -0.5, out=ro)


# ---------------------------------------------------------------- Shampoo


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,m,n", [(None, 5, 3), (3, 8, 13), (None, 1, 1), (2, 17, 4)])
def test_shampoo_stats(rng, dtype, batch, m, n):
    lead = () if batch is None else (batch,)
    g = rng.uniform(-1, 1, size=lead + (m, n))
    l0, r0 = _spd(rng, m, batch), _spd(rng, n, batch)
    gt = np.swapaxes(g, -1, -2)
    for alpha, beta in ((1.0, 1.0), (0.1, 0.9), (2.0, 0.0)):
        l, r = l0.astype(dtype), r0.astype(dtype)
        if beta == 0.0:
            l[...] = np.nan  # not read with beta = 0
            r[...] = np.nan
        res = fusekit.shampoo_stats(g.astype(dtype), l, r, alpha, beta)
        assert res[0] is l and res[1] is r
        what = f"stats {batch}x{m}x{n} alpha={alpha} beta={beta}"
        _close(l, beta * l0 + alpha * g @ gt, dtype, what=what + " L")
        _close(r, beta * r0 + alpha * gt @ g, dtype, what=what + " R")
        np.testing.assert_array_equal(l, np.swapaxes(l, -1, -2))  # exactly symmetric
        np.testing.assert_array_equal(r, np.swapaxes(r, -1, -2))
    # one side only, by keyword
    r = r0.astype(dtype)
    assert fusekit.shampoo_stats(g.astype(dtype), r=r, beta=0.5) == (None, r)
    _close(r, 0.5 * r0 + gt @ g, dtype, what="R only")
    l = l0.astype(dtype)
    assert fusekit.shampoo_stats(g.astype(dtype), l)[0] is l
    _close(l, l0 + g @ gt, dtype, what="L only")
    # allow_tf32 (fk_shampoo_stats_ex): the CPU computes strictly, bit for bit the same
    l1, l2 = l0.astype(dtype), l0.astype(dtype)
    fusekit.shampoo_stats(g.astype(dtype), l1, alpha=0.5, beta=0.5)
    fusekit.shampoo_stats(g.astype(dtype), l2, alpha=0.5, beta=0.5, allow_tf32=True)
    np.testing.assert_array_equal(l1, l2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_shampoo_precondition(rng, dtype):
    batch, m, n = 3, 6, 9
    g = rng.uniform(-1, 1, size=(batch, m, n))
    l = _spd(rng, m)  # batch 1: shared by every gradient
    r = _spd(rng, n, batch)
    for use_l, use_r in ((True, True), (True, False), (False, True), (False, False)):
        want = g.copy()
        if use_l:
            want = l @ want
        if use_r:
            want = want @ r
        got = fusekit.shampoo_precondition(g.astype(dtype), l.astype(dtype) if use_l else None,
                                           r_root=r.astype(dtype) if use_r else None)
        assert got.dtype == dtype and got.shape == g.shape
        _close(got, want, dtype, what=f"precondition l={use_l} r={use_r}")
    out = np.full((batch, m, n), np.nan, dtype)
    assert fusekit.shampoo_precondition(g.astype(dtype), None, r[0].astype(dtype), out=out) is out
    _close(out, g @ r[0], dtype)


def test_shampoo_step_end_to_end(rng):
    """stats -> inverse fourth roots -> preconditioned gradient, as an optimizer does."""
    m, n, eps = 7, 5, 1e-4
    L, R = np.zeros((m, m)), np.zeros((n, n))
    gs = [rng.standard_normal((m, n)) for _ in range(4)]
    for g in gs:
        fusekit.shampoo_stats(g, L, R, alpha=0.1, beta=0.9)
    Lr = sum(0.1 * 0.9 ** (3 - i) * g @ g.T for i, g in enumerate(gs))
    Rr = sum(0.1 * 0.9 ** (3 - i) * g.T @ g for i, g in enumerate(gs))
    _close(L, Lr, np.float64)
    _close(R, Rr, np.float64)
    lroot = fusekit.matrix_power(L, -0.25, eps, method="eigh")
    rroot = fusekit.matrix_power(R, -0.25, eps, method="newton")
    upd = fusekit.shampoo_precondition(gs[-1], lroot, rroot)
    want = _power_ref(Lr, -0.25, eps)[0] @ gs[-1] @ _power_ref(Rr, -0.25, eps)[0]
    _close(upd, want, np.float64, factor=1e2)


def test_shampoo_bad_inputs():
    g = np.zeros((4, 3), np.float32)
    l = np.zeros((4, 4), np.float32)
    r = np.zeros((3, 3), np.float32)
    with _raises(fusekit.NullPointerError, "fk_shampoo_stats", "both NULL"):
        fusekit.shampoo_stats(g)
    with _raises(fusekit.InvalidArgumentError, "alpha"):
        fusekit.shampoo_stats(g, l, r, alpha=float("nan"))
    with _raises(fusekit.InvalidArgumentError, "fusekit.shampoo_stats", "beta must be a real number"):
        fusekit.shampoo_stats(g, l, r, beta=1j)
    with _raises(fusekit.ShapeMismatchError, "l has shape [3, 3]", "[4, 4]"):
        fusekit.shampoo_stats(g, r)
    with _raises(fusekit.DtypeMismatchError, "l has dtype f64"):
        fusekit.shampoo_stats(g, l.astype(np.float64))
    sq = np.zeros((3, 3), np.float32)
    with _raises(fusekit.AliasingError, "l overlaps grad"):
        fusekit.shampoo_stats(sq, sq)
    with _raises(fusekit.ShapeMismatchError, "l_root has shape [3, 3]"):
        fusekit.shampoo_precondition(g, r, r)
    with _raises(fusekit.AliasingError, "out overlaps grad"):
        fusekit.shampoo_precondition(g, l, r, out=g)
    with _raises(fusekit.ShapeMismatchError, "out has shape [4, 4]"):
        fusekit.shampoo_precondition(g, l, r, out=l)


# ---------------------------------------------------------------- per-sample gradients

CASES = [(5, None, 7, 3), (4, 6, 5, 9), (1, 1, 1, 1), (9, None, 16, 8), (3, 2, 33, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,t,din,dout", CASES)
def test_per_sample_grads_norms_and_clipped_sum(rng, dtype, b, t, din, dout):
    lead = (b,) if t is None else (b, t)
    a = rng.uniform(-1, 1, size=lead + (din,))
    g = rng.uniform(-1, 1, size=lead + (dout,))
    if b > 2:
        a[0] = 0.0  # a zero gradient: norm 0, clipping factor 1
    grads = _psg_ref(a, g)
    norms = (grads**2).sum(axis=(1, 2))
    A, G = a.astype(dtype), g.astype(dtype)
    what = f"B={b} T={t} in={din} out={dout}"

    got = fusekit.per_sample_grads(A, G)
    assert got.shape == (b, dout, din) and got.dtype == dtype
    _close(got, grads, dtype, what="grads " + what)
    got_n = fusekit.per_sample_grad_norms(A, G)
    assert got_n.shape == (b,) and got_n.dtype == dtype
    _close(got_n, norms, dtype, what="norms " + what)

    sorted_norms = np.sort(np.sqrt(norms))
    for c in (sorted_norms[len(sorted_norms) // 2], 0.0, 1e9):
        s, n2 = fusekit.dp_clipped_grad_sum(A, G, c, sq_norms=True)
        assert s.shape == (dout, din) and n2.shape == (b,)
        if c == 0.0:
            assert (s == 0).all()
        else:
            _close(s, _clipped_ref(grads, c), dtype, what=f"clipped C={c} " + what)
        _close(n2, norms, dtype, what="clipped norms " + what)
    # sq_norms not wanted: the sum alone; given arrays: written and returned
    s = fusekit.dp_clipped_grad_sum(A, G, 1.0)
    assert isinstance(s, np.ndarray)
    _close(s, _clipped_ref(grads, 1.0), dtype)
    out, nb = np.full((dout, din), np.nan, dtype), np.full((b,), np.nan, dtype)
    res = fusekit.dp_clipped_grad_sum(A, G, 1.0, out=out, sq_norms=nb)
    assert res[0] is out and res[1] is nb
    _close(nb, norms, dtype)
    out3 = np.full((b, dout, din), np.nan, dtype)
    assert fusekit.per_sample_grads(A, G, out=out3) is out3
    _close(out3, grads, dtype)


def test_per_sample_buffers_and_allow_tf32(rng):
    a = rng.uniform(-1, 1, size=(4, 3, 6)).astype(np.float32)
    g = rng.uniform(-1, 1, size=(4, 3, 2)).astype(np.float32)
    res = fusekit.per_sample_grads(fusekit.as_buffer(a), fusekit.as_buffer(g), allow_tf32=True)
    assert isinstance(res, fusekit.Buffer) and res.shape == (4, 2, 6)
    _close(res.to_numpy(), _psg_ref(a, g), np.float32)
    s, n = fusekit.dp_clipped_grad_sum(fusekit.as_buffer(a), fusekit.as_buffer(g), 0.5, sq_norms=True,
                                       allow_tf32=True)
    assert isinstance(s, fusekit.Buffer) and isinstance(n, fusekit.Buffer)
    _close(s.to_numpy(), _clipped_ref(_psg_ref(a, g), 0.5), np.float32)


def test_per_sample_bad_inputs():
    a = np.zeros((5, 7), np.float32)
    g = np.zeros((5, 2), np.float32)
    with _raises(fusekit.ShapeMismatchError, "fk_per_sample_grads", "g has shape [4, 2]"):
        fusekit.per_sample_grads(a, np.zeros((4, 2), np.float32))
    with _raises(fusekit.ShapeMismatchError, "out has shape [2, 7]", "[5, 2, 7]"):
        fusekit.per_sample_grads(a, g, out=np.zeros((2, 7), np.float32))
    with _raises(fusekit.UnsupportedDtypeError, "a has dtype f16"):
        fusekit.per_sample_grads(a.astype(np.float16), g.astype(np.float16))
    with _raises(fusekit.DtypeMismatchError, "g has dtype f64"):
        fusekit.per_sample_grads(a, g.astype(np.float64))
    with _raises(fusekit.ShapeMismatchError, "a has shape [5, 1, 1, 7]"):
        fusekit.per_sample_grads(a.reshape(5, 1, 1, 7), g)
    with _raises(fusekit.ShapeMismatchError, "sq_norms has shape [4]"):
        fusekit.per_sample_grad_norms(a, g, out=np.zeros(4, np.float32))
    with _raises(fusekit.InvalidArgumentError, "max_norm"):
        fusekit.dp_clipped_grad_sum(a, g, -1.0)
    with _raises(fusekit.InvalidArgumentError, "max_norm"):
        fusekit.dp_clipped_grad_sum(a, g, float("nan"))
    with _raises(fusekit.InvalidArgumentError, "fusekit.dp_clipped_grad_sum", "max_norm must be a real number"):
        fusekit.dp_clipped_grad_sum(a, g, None)
    with _raises(fusekit.ShapeMismatchError, "out has shape [5, 2, 7]"):
        fusekit.dp_clipped_grad_sum(a, g, 1.0, out=np.zeros((5, 2, 7), np.float32))
    a2 = np.zeros((2, 7), np.float32)
    with _raises(fusekit.AliasingError, "out overlaps a"):
        fusekit.dp_clipped_grad_sum(a2, np.zeros((2, 2), np.float32), 1.0, out=a2.reshape(2, 7))
    with _raises(fusekit.AliasingError, "sq_norms overlaps g"):
        fusekit.dp_clipped_grad_sum(a, g, 1.0, sq_norms=g.reshape(-1)[:5])


# ---------------------------------------------------------------- torch (CPU)


@needs_torch
@pytest.mark.parametrize("tdtype", ["float32", "float64"])
def test_torch_cpu_matrix_power_and_shampoo(tdtype):
    dt = getattr(torch, tdtype)
    rng = np.random.default_rng(3)
    a = torch.tensor(_spd(rng, 9, 2), dtype=dt)
    out, rep = fusekit.matrix_power(a, -0.25, 1e-6, return_report=True)
    assert isinstance(out, torch.Tensor) and out.dtype == dt and out.device.type == "cpu"
    assert rep.method == "eigh"
    want = np.stack([_power_ref(m, -0.25, 1e-6)[0] for m in a.double().numpy()])
    _close(out.numpy(), want, np.dtype(tdtype))
    out_n, rep_n = fusekit.matrix_power(a, -0.25, 1e-6, method="newton", tol=1e-5 if tdtype == "float32" else None,
                                        return_report=True)
    assert rep_n.method == "newton" and rep_n.converged
    _close(out_n.numpy(), want, np.dtype(tdtype), factor=0.5 if tdtype == "float32" else 1.0)
    # torch's inputs may require grad (read only); an out that requires grad is refused
    a.requires_grad_(True)
    assert isinstance(fusekit.matrix_power(a, 0.5), torch.Tensor)
    with _raises(fusekit.InvalidArgumentError, "requires grad"):
        fusekit.matrix_power(a.detach(), 0.5, out=torch.empty(2, 9, 9, dtype=dt, requires_grad=True))
    # non-convergence carries a torch out
    with pytest.raises(fusekit.NotConvergedError) as ei:
        fusekit.matrix_power(a.detach(), -0.5, method="newton", max_iter=1, tol=1e-14)
    assert isinstance(ei.value.out, torch.Tensor) and ei.value.report.iterations == 1

    # Shampoo statistics in place: both tensors written and their versions bumped
    g = torch.tensor(rng.standard_normal((2, 9, 4)), dtype=dt)
    L, R = torch.zeros(2, 9, 9, dtype=dt), torch.zeros(2, 4, 4, dtype=dt)
    vl, vr = L._version, R._version
    assert fusekit.shampoo_stats(g, L, R) == (L, R)
    assert L._version > vl and R._version > vr
    torch.testing.assert_close(L, g @ g.transpose(-1, -2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(R, g.transpose(-1, -2) @ g, rtol=1e-5, atol=1e-5)
    pre = fusekit.shampoo_precondition(g, fusekit.matrix_power(L, -0.25, 1e-3),
                                       fusekit.matrix_power(R, -0.25, 1e-3), allow_tf32=True)
    assert isinstance(pre, torch.Tensor) and pre.shape == g.shape
    want = (np.stack([_power_ref(m, -0.25, 1e-3)[0] for m in L.double().numpy()]) @ g.double().numpy()
            @ np.stack([_power_ref(m, -0.25, 1e-3)[0] for m in R.double().numpy()]))
    _close(pre.numpy(), want, np.dtype(tdtype), factor=10)


@needs_torch
@pytest.mark.parametrize("tdtype", ["float32", "float64"])
@pytest.mark.parametrize("seq", [None, 5])
def test_torch_cpu_per_sample_against_autograd(tdtype, seq):
    """The per-sample gradients are the gradients torch's autograd gives each
    sample's loss sum(y_b * g_b) with y = a W^T."""
    dt = getattr(torch, tdtype)
    gen = torch.Generator().manual_seed(0)
    B, din, dout = 6, 7, 3
    lead = (B,) if seq is None else (B, seq)
    a = torch.randn(*lead, din, generator=gen, dtype=dt)
    g = torch.randn(*lead, dout, generator=gen, dtype=dt)
    W = torch.randn(dout, din, generator=gen, dtype=dt, requires_grad=True)
    ref = []
    for b in range(B):
        (gw,) = torch.autograd.grad((torch.nn.functional.linear(a[b], W) * g[b]).sum(), W)
        ref.append(gw)
    ref = torch.stack(ref)
    grads = fusekit.per_sample_grads(a, g)
    assert isinstance(grads, torch.Tensor) and grads.dtype == dt
    tol = 1e-5 if tdtype == "float32" else 1e-12
    torch.testing.assert_close(grads, ref, rtol=tol, atol=tol)
    torch.testing.assert_close(fusekit.per_sample_grad_norms(a, g), (ref**2).sum(dim=(1, 2)), rtol=tol * 10, atol=tol)
    out = torch.empty(dout, din, dtype=dt)
    vo = out._version
    s, n = fusekit.dp_clipped_grad_sum(a, g, 1.5, out=out, sq_norms=True)
    assert s is out and out._version > vo and isinstance(n, torch.Tensor)
    factor = torch.clamp(1.5 / ref.flatten(1).norm(dim=1), max=1.0)
    torch.testing.assert_close(out, (factor[:, None, None] * ref).sum(0), rtol=tol * 10, atol=tol * 10)


# ---------------------------------------------------------------- CUDA (torch tensors on the GPU)


def _cuda(x, dtype):
    return torch.tensor(np.asarray(x), dtype=getattr(torch, dtype), device="cuda")


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("method", ["eigh", "newton", "auto"])
@pytest.mark.parametrize("n,batch", [(5, None), (24, 3), (40, None), (48, 3)])
def test_cuda_matrix_power(dtype, method, n, batch):
    rng = np.random.default_rng(n)
    a = _spd(rng, n, batch)
    # float32: 1e-5, a margin over the default 1e-6 (the CPU's float32 residuals
    # reach 9.5e-7; cuBLAS sums in another order)
    got, rep = fusekit.matrix_power(_cuda(a, dtype), -0.25, 1e-6, method=method,
                                    tol=1e-5 if dtype == "float32" else None, return_report=True)
    assert got.is_cuda and got.dtype == getattr(torch, dtype)
    mats = a if batch is not None else a[None]
    want = np.stack([_power_ref(m, -0.25, 1e-6)[0] for m in mats]).reshape(a.shape)
    _close(got.cpu().numpy(), want, np.dtype(dtype), factor=1e2 if dtype == "float64" else 1.0)
    assert rep.converged
    if method != "auto":
        assert rep.method == method
    else:
        assert rep.method in ("eigh", "newton")


@needs_cuda
def test_cuda_matrix_power_tf32_and_not_converged():
    rng = np.random.default_rng(7)
    a = _spd(rng, 64, 2)
    want = np.stack([_power_ref(m, -0.25, 1e-6)[0] for m in a])
    got, rep = fusekit.matrix_power(_cuda(a, "float32"), -0.25, 1e-6, method="newton", allow_tf32=True,
                                    return_report=True)
    assert rep.method == "newton" and rep.converged and rep.residual <= 3e-2
    assert rel_err(got.cpu().numpy(), want) < 1e-2
    with pytest.raises(fusekit.NotConvergedError) as ei:
        fusekit.matrix_power(_cuda(a, "float64"), -0.5, method="newton", max_iter=2, tol=1e-12)
    e = ei.value
    assert e.status_name == "FK_ERROR_NOT_CONVERGED"
    assert (e.report.method, e.report.iterations, e.report.converged) == ("newton", 2, False)
    assert e.out.is_cuda and torch.isfinite(e.out).all()
    # auto recomputes with the eigendecomposition instead of raising
    _, rep = fusekit.matrix_power(_cuda(a, "float64"), -0.5, max_iter=2, tol=1e-12, return_report=True)
    assert rep.converged and rep.method == "eigh"


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_shampoo(dtype):
    rng = np.random.default_rng(11)
    g = rng.uniform(-1, 1, size=(3, 20, 13))
    l0, r0 = _spd(rng, 20, 3), _spd(rng, 13, 3)
    G, L, R = _cuda(g, dtype), _cuda(l0, dtype), _cuda(r0, dtype)
    fusekit.shampoo_stats(G, L, R, 0.1, 0.9)
    gt = np.swapaxes(g, -1, -2)
    _close(L.cpu().numpy(), 0.9 * l0 + 0.1 * g @ gt, np.dtype(dtype))
    _close(R.cpu().numpy(), 0.9 * r0 + 0.1 * gt @ g, np.dtype(dtype))
    assert torch.equal(L, L.transpose(-1, -2)) and torch.equal(R, R.transpose(-1, -2))
    # TF32 statistics (float32 only on the tensor cores): ~1e-3 of the product, symmetric
    L2, R2 = _cuda(l0, dtype), _cuda(r0, dtype)
    fusekit.shampoo_stats(G[0], L2[0], R2[0], 0.1, 0.9, allow_tf32=True)
    want = 0.9 * l0[0] + 0.1 * g[0] @ gt[0]
    assert np.abs(L2[0].cpu().numpy() - want).max() <= 4e-3 * np.abs(0.1 * g[0] @ gt[0]).max()
    assert torch.equal(L2[0], L2[0].T) and torch.equal(R2[0], R2[0].T)
    out = fusekit.shampoo_precondition(G, L[0], R)  # l_root shared (batch 1), r_root batched
    assert out.is_cuda
    _close(out.cpu().numpy(), L[0].double().cpu().numpy() @ g @ R.double().cpu().numpy(), np.dtype(dtype))
    # a root on another device
    with _raises(fusekit.DeviceMismatchError, "l_root"):
        fusekit.shampoo_precondition(G, L[0].cpu(), R)


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("b,t,din,dout", CASES + [(8, None, 64, 32), (16, 4, 128, 64)])
def test_cuda_per_sample(dtype, b, t, din, dout):
    rng = np.random.default_rng(b * 100 + din)
    lead = (b,) if t is None else (b, t)
    a = rng.uniform(-1, 1, size=lead + (din,))
    g = rng.uniform(-1, 1, size=lead + (dout,))
    if b > 2:
        a[0] = 0.0
    grads = _psg_ref(a, g)
    norms = (grads**2).sum(axis=(1, 2))
    A, G = _cuda(a, dtype), _cuda(g, dtype)
    got = fusekit.per_sample_grads(A, G)
    assert got.is_cuda
    _close(got.cpu().numpy(), grads, np.dtype(dtype))
    _close(fusekit.per_sample_grad_norms(A, G).cpu().numpy(), norms, np.dtype(dtype))
    c = float(np.median(np.sqrt(norms)))
    s, n = fusekit.dp_clipped_grad_sum(A, G, c, sq_norms=True)
    assert s.is_cuda and n.is_cuda
    _close(s.cpu().numpy(), _clipped_ref(grads, c), np.dtype(dtype))
    _close(n.cpu().numpy(), norms, np.dtype(dtype))


@needs_cuda
def test_cuda_per_sample_on_a_non_default_torch_stream():
    """Inputs produced by a torch kernel on a side stream are read after it: the op
    runs on torch's current stream."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.ones(64, 256, device="cuda")
        torch.cuda._sleep(50_000_000)
        a.mul_(2.0)
        g = torch.ones(64, 128, device="cuda")
        out = fusekit.per_sample_grads(a, g)
        total = fusekit.dp_clipped_grad_sum(a, g, 1e9)
    s.synchronize()
    assert torch.all(out == 2.0)
    assert torch.all(total == 128.0)
