"""Linear algebra through the Python bindings (CPU backend): GEMM, the fused linear
layer, the Kronecker product, errors. The torch custom op and GEMM on torch CUDA
tensors are in test_linalg_torch.py (a separate module, so that these run without
torch)."""

import math

import numpy as np
import pytest

import fusekit


def _rand(rng, shape, dtype=np.float64):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("op_a,op_b", [("N", "N"), ("T", "N"), ("N", "C"), ("C", "T")])
def test_gemm_numpy(rng, dtype, op_a, op_b):
    m, n, k = 5, 7, 6
    op = {"N": lambda x: x, "T": lambda x: x.T, "C": lambda x: x.conj().T}
    a = _rand(rng, (m, k) if op_a == "N" else (k, m), dtype)
    b = _rand(rng, (k, n) if op_b == "N" else (n, k), dtype)
    c0 = _rand(rng, (m, n), dtype)
    want = 0.5 * op[op_a](a) @ op[op_b](b) - 2.0 * c0
    c = c0.copy()
    got = fusekit.gemm(a, b, op_a=op_a, op_b=op_b, alpha=0.5, beta=-2.0, c=c)
    assert got is c
    tol = 1e-5 if dtype in (np.float32, np.complex64) else 1e-12
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol * 10)
    # allocated output, batched with a broadcast operand
    a3 = _rand(rng, (3, m, k), dtype)
    b_kn = b if op_b == "N" else b.T.copy()
    out = fusekit.gemm(a3, b_kn)
    assert out.shape == (3, m, n)
    np.testing.assert_allclose(out, a3 @ b_kn, rtol=tol, atol=tol * 10)


def test_gemm_errors(rng):
    a = _rand(rng, (3, 4), np.float32)
    with pytest.raises(fusekit.ShapeMismatchError, match="inner dimensions"):
        fusekit.gemm(a, a)
    with pytest.raises(fusekit.InvalidArgumentError, match="op_a = 7"):
        fusekit.gemm(a, a.T.copy(), op_a=7)
    with pytest.raises(fusekit.UnsupportedError, match="row-major"):
        fusekit.gemm(a, a.T)  # a transposed view: pass op_b="T" instead


def test_kron_numpy(rng):
    a, b = _rand(rng, (3, 2)), _rand(rng, (4, 5))
    np.testing.assert_allclose(fusekit.kron(a, b), np.kron(a, b), rtol=1e-14)
    a3, b3 = _rand(rng, (2, 3, 2)), _rand(rng, (2, 2, 2))
    got = fusekit.kron(a3, b3)
    assert got.shape == (2, 6, 4)
    for i in range(2):
        np.testing.assert_allclose(got[i], np.kron(a3[i], b3[i]), rtol=1e-14)


_ERF = np.vectorize(math.erf)


def _gelu(z):
    """The exact GELU in float64 (torch's default ``gelu``)."""
    return 0.5 * z * (1 + _ERF(z / math.sqrt(2)))


def _gelu_tanh(z):
    return 0.5 * z * (1 + np.tanh(0.7978845608028654 * (z + 0.044715 * z**3)))


_GELUS = {"gelu": _gelu, "gelu_tanh": _gelu_tanh}


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh"])
def test_linear_numpy(rng, act):
    x, w, b = _rand(rng, (2, 3, 8), np.float32), _rand(rng, (5, 8), np.float32), _rand(rng, (5,), np.float32)
    z = x.astype(np.float64) @ w.T.astype(np.float64) + b
    gelu = _GELUS.get(act)
    want = {"none": z, "relu": np.maximum(z, 0)}[act] if gelu is None else gelu(z)
    if gelu is not None:
        y, aux = fusekit.linear_forward(x, w, b, act=act, want_aux=True)
        np.testing.assert_allclose(aux, z, rtol=1e-5, atol=1e-5)
    else:
        y = fusekit.linear_forward(x, w, b, act=act)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert fusekit.linear_aux_size(act, "float32", 6, 5) == (120 if gelu is not None else 0)
    dy = _rand(rng, y.shape, np.float32)
    saved = {"none": None, "relu": y}[act] if gelu is None else aux
    dx, dw, db = fusekit.linear_backward(dy, x, w, act=act, saved=saved)
    if gelu is not None:
        h = 1e-6
        grad = (gelu(z + h) - gelu(z - h)) / (2 * h)
    else:
        grad = {"none": np.ones_like(z), "relu": (z > 0).astype(np.float64)}[act]
    dz = dy.astype(np.float64) * grad
    np.testing.assert_allclose(dx, dz @ w.astype(np.float64), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, dz.reshape(-1, 5).T @ x.reshape(-1, 8).astype(np.float64), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, dz.reshape(-1, 5).sum(0), rtol=1e-4, atol=1e-4)
    only_db = fusekit.linear_backward(dy, x, w, act=act, saved=saved, dx=False, dw=None)
    assert only_db[0] is None and only_db[1] is None
    np.testing.assert_allclose(only_db[2], db, rtol=1e-6)


def test_linear_gelu_names_are_torchs():
    # "gelu" is the exact (erf) GELU, "gelu_tanh" the approximation; they differ by
    # ~1e-4 around |z| = 2, far above float32 rounding, so neither passes for the other
    z = np.array([[-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 2.7, 4.0]], np.float32)
    eye = np.eye(1, dtype=np.float32)
    for act, other in (("gelu", "gelu_tanh"), ("gelu_tanh", "gelu")):
        y = fusekit.linear_forward(z.T, eye, act=act)[:, 0]
        np.testing.assert_allclose(y, _GELUS[act](z[0].astype(np.float64)), rtol=1e-6, atol=1e-7)
        assert np.abs(y - _GELUS[other](z[0].astype(np.float64))).max() > 5e-5
    assert fusekit.ops.linalg.LINEAR_ACTIVATIONS == {"none": 0, "relu": 1, "gelu": 3, "gelu_tanh": 2}


def test_linear_errors(rng):
    x = _rand(rng, (4, 3), np.float64)
    w = _rand(rng, (2, 3), np.float64)
    with pytest.raises(fusekit.UnsupportedDtypeError, match="fk_gemm"):
        fusekit.linear_forward(x, w)
    with pytest.raises(fusekit.InvalidArgumentError, match="act = -1"):
        fusekit.linear_forward(x.astype(np.float32), w.astype(np.float32), act="swish")
    with pytest.raises(fusekit.InvalidArgumentError, match="act = 4 is not a valid fk_activation"):
        fusekit.linear_forward(x.astype(np.float32), w.astype(np.float32), act=4)
