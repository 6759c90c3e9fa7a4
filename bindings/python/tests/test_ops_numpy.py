"""Every elementwise op on the CPU backend with numpy arrays, for every dtype numpy
has (float16, float32, float64, complex64, complex128), against numpy references
computed in float64/complex128; broadcasting, strided views, in-place, out=."""

import numpy as np
import pytest
from fk_testutil import NUMPY_DTYPES, assert_close, random_array

import fusekit as fk

DT_IDS = [np.dtype(d).name for d in NUMPY_DTYPES]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
}

# name -> (reference, needs positive real input, supports complex)
UNARY = {
    "neg": (np.negative, False, True),
    "abs": (np.abs, False, True),
    "exp": (np.exp, False, True),
    "log": (np.log, True, True),
    "sqrt": (np.sqrt, True, True),
    "sin": (np.sin, False, True),
    "cos": (np.cos, False, True),
    "tanh": (np.tanh, False, True),
    "sigmoid": (_sigmoid, False, True),
    "relu": (lambda x: np.maximum(x, 0), False, False),
    "copy": (lambda x: x.copy(), False, True),
}


def _away_from_tanh_poles(a):
    """Complex tanh has poles at i*pi/2 + i*k*pi; the library's complex64 tanh
    loses accuracy near them (see test_complex64_tanh_near_pole), so the
    per-dtype accuracy tests keep |Im z| <= 1."""
    return (a.real + 1j * (a.imag * 0.5)).astype(a.dtype)


def _ref_input(x):
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, dtype, rng):
    a = random_array(rng, (7, 13), dtype)
    b = random_array(rng, (7, 13), dtype, positive=(name == "div"))
    out = getattr(fk, name)(a, b)
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.dtype(dtype) and out.shape == (7, 13)
    assert_close(out, BINARY[name](_ref_input(a), _ref_input(b)), np.dtype(dtype).name)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, dtype, rng):
    ref_fn, positive, complex_ok = UNARY[name]
    a = random_array(rng, (5, 11), dtype, positive=positive)
    if name == "tanh" and np.dtype(dtype).kind == "c":
        a = _away_from_tanh_poles(a)
    if np.dtype(dtype).kind == "c" and not complex_ok:
        with pytest.raises(fk.UnsupportedDtypeError, match="a has dtype complex"):
            getattr(fk, name)(a)
        return
    out = getattr(fk, name)(a)
    assert isinstance(out, np.ndarray)
    want_dtype = np.abs(np.zeros(1, dtype)).dtype if name == "abs" else np.dtype(dtype)
    assert out.dtype == want_dtype and out.shape == a.shape
    assert_close(out, ref_fn(_ref_input(a)), np.dtype(dtype).name)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=DT_IDS)
def test_axpby(dtype, rng):
    a = random_array(rng, (9, 3), dtype)
    b = random_array(rng, (9, 3), dtype)
    if np.dtype(dtype).kind == "c":
        alpha, beta = 1.5 - 0.5j, -0.25 + 2j
    else:
        alpha, beta = 1.5, -0.25
    out = fk.axpby(alpha, a, beta, b)
    assert out.dtype == np.dtype(dtype)
    assert_close(out, alpha * _ref_input(a) + beta * _ref_input(b), np.dtype(dtype).name)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", ["scalar_add", "scalar_mul"])
def test_scalar_ops(name, dtype, rng):
    a = random_array(rng, (4, 6), dtype)
    s = (0.75 - 1.25j) if np.dtype(dtype).kind == "c" else 0.75
    out = getattr(fk, name)(a, s)
    ref = _ref_input(a) + s if name == "scalar_add" else _ref_input(a) * s
    assert out.dtype == np.dtype(dtype)
    assert_close(out, ref, np.dtype(dtype).name)


@pytest.mark.parametrize("s", [2, 2.5, True, np.float32(2.5), np.float64(-1.0)])
def test_scalar_python_and_numpy_numbers(s):
    a = np.arange(4.0)
    np.testing.assert_allclose(fk.scalar_mul(a, s), a * float(s))


def test_scalar_complex_on_complex_dtype():
    a = np.array([1 + 1j, 2 - 1j], np.complex128)
    np.testing.assert_allclose(fk.scalar_mul(a, 1j), a * 1j)
    np.testing.assert_allclose(fk.scalar_add(a, np.complex64(1 - 2j)), a + (1 - 2j))


# --- broadcasting -----------------------------------------------------------


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 1, 5), (4, 1)),
        ((4, 5), (5,)),
        ((1,), (6, 2)),
        ((), (3, 2)),
        ((2, 1), ()),
        ((1, 3, 1), (2, 1, 4)),
        ((0, 3), (3,)),
    ],
)
def test_binary_broadcasting(sa, sb, rng):
    a = random_array(rng, sa, np.float64)
    b = random_array(rng, sb, np.float64)
    out = fk.mul(a, b)
    ref = a * b
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-14)
    out2 = fk.axpby(2.0, a, 3.0, b)
    np.testing.assert_allclose(out2, 2 * a + 3 * b, rtol=1e-14)


def test_unary_broadcasts_to_out(rng):
    a = random_array(rng, (1, 5), np.float32)
    out = np.empty((4, 5), np.float32)
    res = fk.copy(a, out=out)
    assert res is out
    np.testing.assert_array_equal(out, np.broadcast_to(a, (4, 5)))
    fk.exp(a, out=out)
    np.testing.assert_allclose(out, np.broadcast_to(np.exp(a), (4, 5)), rtol=1e-6)


def test_zero_d_arrays():
    a = np.array(2.0)
    out = fk.sqrt(a)
    assert out.shape == () and out.dtype == np.float64
    assert out == pytest.approx(np.sqrt(2.0))


def test_empty_arrays():
    a = np.empty((0, 4))
    assert fk.exp(a).shape == (0, 4)
    assert fk.add(a, np.ones(4)).shape == (0, 4)


# --- non-contiguous views ---------------------------------------------------


def _views(rng, dtype):
    base = random_array(rng, (6, 10), dtype)
    return {
        "transposed": base.T,
        "step2": base[::2, ::3],
        "negative": base[::-1, ::-2],
        "column": base[:, 3],
        "broadcast0": np.broadcast_to(base[0], (4, 10)),
    }


@pytest.mark.parametrize("dtype", [np.float32, np.complex128, np.float16], ids=["float32", "complex128", "float16"])
@pytest.mark.parametrize("view", ["transposed", "step2", "negative", "column", "broadcast0"])
def test_strided_inputs(view, dtype, rng):
    a = _views(rng, dtype)[view]
    b = random_array(rng, a.shape, dtype)
    assert_close(fk.add(a, b), _ref_input(a) + _ref_input(b), np.dtype(dtype).name)
    assert_close(fk.sin(a), np.sin(_ref_input(a)), np.dtype(dtype).name)
    c = fk.copy(a)
    assert c.flags.c_contiguous
    np.testing.assert_array_equal(c, a)


@pytest.mark.parametrize("view", ["transposed", "step2", "negative", "column"])
def test_strided_output(view, rng):
    base = random_array(rng, (6, 10), np.float64)
    before = base.copy()
    out = {
        "transposed": base.T,
        "step2": base[::2, ::3],
        "negative": base[::-1, ::-2],
        "column": base[:, 3],
    }[view]
    a = random_array(rng, out.shape, np.float64)
    b = random_array(rng, out.shape, np.float64)
    res = fk.sub(a, b, out=out)
    assert res is out
    np.testing.assert_allclose(out, a - b, rtol=1e-14)
    # elements outside the view are untouched
    mask = np.ones(base.shape, bool)
    {
        "transposed": lambda m: m.__setitem__((slice(None), slice(None)), False),
        "step2": lambda m: m.__setitem__((slice(None, None, 2), slice(None, None, 3)), False),
        "negative": lambda m: m.__setitem__((slice(None, None, -1), slice(None, None, -2)), False),
        "column": lambda m: m.__setitem__((slice(None), 3), False),
    }[view](mask)
    np.testing.assert_array_equal(base[mask], before[mask])


# --- in place -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=DT_IDS)
def test_in_place_binary(dtype, rng):
    a = random_array(rng, (8, 3), dtype)
    b = random_array(rng, (8, 3), dtype)
    ref = _ref_input(a) * _ref_input(b)
    res = fk.mul(a, b, out=a)
    assert res is a
    assert_close(a, ref, np.dtype(dtype).name)
    ref = 2 * _ref_input(a) - _ref_input(b)
    fk.axpby(2.0, a, -1.0, b, out=b)
    assert_close(b, ref, np.dtype(dtype).name)


def test_in_place_unary_and_strided(rng):
    base = random_array(rng, (6, 8), np.float64, positive=True)
    view = base[::2, 1::2]
    ref = np.sqrt(view)
    fk.sqrt(view, out=view)
    np.testing.assert_allclose(view, ref, rtol=1e-14)
    x = random_array(rng, (5,), np.float32)
    ref = np.maximum(x, 0)
    fk.relu(x, out=x)
    np.testing.assert_array_equal(x, ref)
    fk.scalar_add(x, 1.0, out=x)
    np.testing.assert_allclose(x, ref + 1, rtol=1e-6)


def test_out_returns_the_callers_object(rng):
    a = random_array(rng, (3, 4), np.float32)
    out = np.zeros((3, 4), np.float32)
    assert fk.add(a, a, out=out) is out
    np.testing.assert_allclose(out, 2 * a)


# --- IEEE semantics -------------------------------------------------------------


def test_division_by_zero_is_ieee():
    a = np.array([1.0, -1.0, 0.0], np.float64)
    out = fk.div(a, np.zeros(3))
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


def test_relu_propagates_nan():
    x = np.array([-1.0, np.nan, 2.0], np.float32)
    out = fk.relu(x)
    assert out[0] == 0 and np.isnan(out[1]) and out[2] == 2


def test_complex_division_and_abs():
    a = np.array([1 + 2j, 3 - 4j, 1e200 + 1e200j], np.complex128)
    b = np.array([2 - 1j, 1e-3 + 0j, 1e200 - 1e200j], np.complex128)
    np.testing.assert_allclose(fk.div(a, b), a / b, rtol=1e-14)
    m = fk.abs(np.array([3 + 4j, -5j], np.complex64))
    assert m.dtype == np.float32
    np.testing.assert_allclose(m, [5.0, 5.0], rtol=1e-7)


def test_lists_are_accepted_as_inputs():
    out = fk.add([1.0, 2.0], np.array([3.0, 4.0]))
    np.testing.assert_array_equal(out, [4.0, 6.0])


def test_complex64_tanh_near_pole():
    z = np.array([0.001 + 1.5707963j, -0.003 - 1.570811j], np.complex64)
    np.testing.assert_allclose(fk.tanh(z), np.tanh(z.astype(np.complex128)), rtol=1e-5)
