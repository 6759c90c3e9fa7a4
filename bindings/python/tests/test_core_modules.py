"""The package's core modules (_dtype, _handle, _context, _stream, _buffer,
_invocation) behind ``fusekit._core``, and ``Invocation``'s public way of handing
results back (``output_array``, ``set_result``), as an op written outside the
package uses them."""

import importlib

import numpy as np
import pytest

import fusekit as fk
from fusekit import _core
from fusekit._lib import lib

HOMES = {
    "DType": "fusekit._dtype",
    "as_dtype": "fusekit._dtype",
    "_Handle": "fusekit._handle",
    "Context": "fusekit._context",
    "MemoryInfo": "fusekit._context",
    "default_context": "fusekit._context",
    "Stream": "fusekit._stream",
    "resolve_stream": "fusekit._stream",
    "Buffer": "fusekit._buffer",
    "as_buffer": "fusekit._buffer",
    "from_dlpack": "fusekit._buffer",
    "Invocation": "fusekit._invocation",
    "array_kind": "fusekit._invocation",
}


@pytest.mark.parametrize("name", sorted(HOMES))
def test_core_names_are_the_defining_modules_objects(name):
    home = importlib.import_module(HOMES[name])
    obj = getattr(_core, name)
    assert obj is getattr(home, name)
    if not name.startswith("_") and name in _core.__all__:
        assert getattr(fk, name) is obj
    if name != "MemoryInfo":  # a namedtuple names the module that made it
        assert obj.__module__ == HOMES[name]


def test_core_all_is_importable_from_the_package():
    assert set(_core.__all__) <= set(fk.__all__)
    for name in _core.__all__:
        assert getattr(fk, name) is getattr(_core, name)


def _twice(a, b, *, out=None, out2=None):
    """``(a + b, a - b)`` written with Invocation as an op outside the package would be."""
    with fk.Invocation("test.twice") as inv:
        A = inv.input(a, "a")
        B = inv.input(b, "b")
        shape = inv.broadcast(A, B)
        S = inv.output(out, "out", shape, A.dtype)
        s = inv.output_array
        D = inv.output(out2, "out2", shape, A.dtype)
        d = inv.output_array
        lib().fk_add(A.handle, B.handle, S.handle, inv.stream_handle)
        lib().fk_sub(A.handle, B.handle, D.handle, inv.stream_handle)
        last = inv.result()
        assert last is d  # result() is the last output's array
        return s, d


def test_package_dtype_names_are_the_dtypes():
    for dt in fk.DType:
        assert getattr(fk, dt.name) is dt


def test_output_array_is_each_outputs_array_in_the_callers_kind(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal(4)
    s, d = _twice(a, b)
    assert type(s) is np.ndarray and type(d) is np.ndarray
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(d, a - b)
    # given outputs come back as themselves
    o1, o2 = np.full((3, 4), np.nan), np.full((3, 4), np.nan)
    s, d = _twice(a, b, out=o1, out2=o2)
    assert s is o1 and d is o2
    np.testing.assert_array_equal(o1, a + b)
    np.testing.assert_array_equal(o2, a - b)
    # Buffer in -> Buffer out
    A = fk.Buffer.from_numpy(a)
    s, d = _twice(A, b)
    assert isinstance(s, fk.Buffer) and isinstance(d, fk.Buffer)
    np.testing.assert_array_equal(s.to_numpy(), a + b)
    np.testing.assert_array_equal(d.to_numpy(), a - b)


def test_set_result_hands_back_an_input_written_in_place(rng):
    a = rng.standard_normal(6)
    want = 2 * a
    with fk.Invocation("test.double_in_place") as inv:
        A = inv.input(a, "a")
        assert inv.output_array is None  # no output made yet
        lib().fk_add(A.handle, A.handle, A.handle, inv.stream_handle)
        inv.set_result(a)
        got = inv.result()
    assert got is a
    np.testing.assert_array_equal(a, want)


def test_output_array_with_torch_tensors():
    torch = pytest.importorskip("torch")
    a, b = torch.randn(2, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    s, d = _twice(a, b)
    assert isinstance(s, torch.Tensor) and isinstance(d, torch.Tensor)
    torch.testing.assert_close(s, a + b, rtol=0, atol=0)
    torch.testing.assert_close(d, a - b, rtol=0, atol=0)


@pytest.mark.parametrize("cls, method, module", [
    ("Context", "memory_stats", "fusekit._context"),
    ("Context", "set_release_threshold", "fusekit._context"),
    ("Context", "trim", "fusekit._context"),
    ("Buffer", "pinned", "fusekit._buffer"),
    ("Stream", "wait_event", "fusekit._stream"),
    ("Event", "record", "fusekit._stream"),
])
def test_methods_are_defined_by_their_class(cls, method, module):
    """Each class's module defines its methods (none attached from outside)."""
    c = getattr(fk, cls)
    assert method in c.__dict__, f"{cls}.{method} is not defined in the class body"
    fn = getattr(c.__dict__[method], "__func__", c.__dict__[method])
    assert fn.__module__ == module == c.__module__
