"""Errors: one Error subclass per status, carrying .status, .status_name (from
fk_status_string) and the library's message, which names the argument."""

import ctypes

import numpy as np
import pytest
from fk_testutil import cuda_available

import fusekit as fk
from fusekit import _lib


def test_every_status_has_a_subclass_named_by_the_library():
    L = _lib.lib()
    for status in range(1, 19):
        cls = _lib.ERRORS[status]
        assert issubclass(cls, fk.Error)
        assert cls.status == status
        name = L.fk_status_string(status).decode()
        assert name.startswith("FK_ERROR_")
        err = cls("x: y")
        assert err.status == status and err.status_name == name
        assert getattr(fk, cls.__name__) is cls
    assert L.fk_status_string(0).decode() == "FK_OK"


def test_unknown_status_gives_the_base_class():
    err = _lib.error_for(999, "fk_future: something new")
    assert type(err) is fk.Error
    assert err.status == 999 and err.status_name == "FK_UNKNOWN_STATUS"
    assert "fk_future: something new" in str(err)


def test_subclasses_are_also_builtin_exceptions():
    assert issubclass(fk.ShapeMismatchError, ValueError)
    assert issubclass(fk.UnsupportedDtypeError, TypeError)
    assert issubclass(fk.OutOfMemoryError, MemoryError)


def _check(excinfo, cls, *words):
    e = excinfo.value
    assert type(e) is cls
    assert e.status == cls.status
    assert e.status_name == _lib.lib().fk_status_string(cls.status).decode()
    for w in words:
        assert w in e.message, f"{w!r} not in {e.message!r}"
    assert e.message in str(e)


def test_shape_mismatch_names_out():
    a = np.ones((2, 3))
    with pytest.raises(fk.ShapeMismatchError) as ei:
        fk.add(a, a, out=np.empty((3, 2)))
    _check(ei, fk.ShapeMismatchError, "fk_add", "out")


def test_shape_mismatch_of_inputs_names_both():
    with pytest.raises(fk.ShapeMismatchError) as ei:
        fk.mul(np.ones((2, 3)), np.ones(4))
    _check(ei, fk.ShapeMismatchError, "fusekit.mul", "a has shape (2, 3)", "b has shape (4,)")


def test_dtype_mismatch_names_argument():
    with pytest.raises(fk.DtypeMismatchError) as ei:
        fk.sub(np.ones(3), np.ones(3, np.float32))
    _check(ei, fk.DtypeMismatchError, "fk_sub", "b")
    with pytest.raises(fk.DtypeMismatchError) as ei:
        fk.exp(np.ones(3), out=np.empty(3, np.float32))
    _check(ei, fk.DtypeMismatchError, "fk_exp", "out")


def test_abs_of_complex_needs_real_out():
    with pytest.raises(fk.DtypeMismatchError) as ei:
        fk.abs(np.ones(3, np.complex64), out=np.empty(3, np.complex64))
    _check(ei, fk.DtypeMismatchError, "fk_abs", "out")


def test_unsupported_numpy_dtype_names_argument():
    with pytest.raises(fk.UnsupportedDtypeError) as ei:
        fk.add(np.ones(3), np.arange(3))
    _check(ei, fk.UnsupportedDtypeError, "fusekit.add", "b", "int64")


def test_relu_complex_is_unsupported_dtype():
    with pytest.raises(fk.UnsupportedDtypeError) as ei:
        fk.relu(np.ones(2, np.complex128))
    _check(ei, fk.UnsupportedDtypeError, "fk_relu", "a")


def test_aliasing_partial_overlap():
    x = np.arange(10.0)
    with pytest.raises(fk.AliasingError) as ei:
        fk.add(x[:-1], x[:-1], out=x[1:])
    _check(ei, fk.AliasingError, "fk_add", "out")


def test_self_overlapping_out_is_invalid():
    x = np.zeros(4)
    out = np.lib.stride_tricks.as_strided(x, shape=(3, 4), strides=(0, 8))
    assert out.flags.writeable
    with pytest.raises(fk.InvalidArgumentError) as ei:
        fk.exp(np.ones((3, 4)), out=out)
    _check(ei, fk.InvalidArgumentError, "fk_exp", "out")


def test_read_only_out():
    a = np.ones(3)
    ro = np.ones(3)
    ro.flags.writeable = False
    with pytest.raises(fk.InvalidArgumentError) as ei:
        fk.add(a, a, out=ro)
    _check(ei, fk.InvalidArgumentError, "fusekit.add", "out", "read-only")
    # a read-only array is fine as an input
    np.testing.assert_array_equal(fk.add(ro, ro), [2, 2, 2])


def test_imaginary_scalar_on_real_dtype():
    with pytest.raises(fk.InvalidArgumentError) as ei:
        fk.scalar_add(np.ones(2), 1j)
    _check(ei, fk.InvalidArgumentError, "fk_scalar_add", "imaginary")
    with pytest.raises(fk.InvalidArgumentError) as ei:
        fk.axpby(1.0, np.ones(2), 2j, np.ones(2))
    _check(ei, fk.InvalidArgumentError, "fk_axpby")


def test_non_number_scalar():
    with pytest.raises(fk.InvalidArgumentError) as ei:
        fk.scalar_mul(np.ones(2), "two")
    _check(ei, fk.InvalidArgumentError, "fusekit.scalar_mul", "s must be a number")
    with pytest.raises(fk.InvalidArgumentError) as ei:
        fk.axpby(None, np.ones(2), 1.0, np.ones(2))
    _check(ei, fk.InvalidArgumentError, "alpha")


def test_python_scalar_as_array_argument():
    with pytest.raises(fk.InvalidArgumentError) as ei:
        fk.add(np.ones(2), 2.0)
    _check(ei, fk.InvalidArgumentError, "fusekit.add", "b is a scalar")


def test_byte_strides_not_multiple_of_itemsize():
    rec = np.zeros(5, dtype=[("x", np.float64), ("y", np.float32)])
    col = rec["x"]
    assert col.strides == (12,)
    with pytest.raises(fk.InvalidArgumentError) as ei:
        fk.exp(col)
    _check(ei, fk.InvalidArgumentError, "fusekit.exp", "a", "byte strides (12,)", "item size 8")


def test_non_native_byte_order():
    a = np.ones(3, dtype=">f8")
    with pytest.raises(fk.UnsupportedDtypeError) as ei:
        fk.neg(a)
    _check(ei, fk.UnsupportedDtypeError, "a", "byte order")


def test_too_many_dimensions():
    a = np.ones((1,) * 9)
    with pytest.raises(fk.InvalidArgumentError) as ei:
        fk.neg(a)
    _check(ei, fk.InvalidArgumentError, "9 dimensions")


def test_null_pointer_through_the_raw_prototypes():
    L = _lib.lib()
    with pytest.raises(fk.NullPointerError) as ei:
        L.fk_add(None, None, None, None)
    _check(ei, fk.NullPointerError, "fk_add", "a")
    with pytest.raises(fk.NullPointerError) as ei:
        L.fk_context_create(_lib.ABI_VERSION, _lib.DEVICE_CPU, 0, None)
    _check(ei, fk.NullPointerError, "fk_context_create")


def test_abi_mismatch():
    h = _lib.ctx_p()
    with pytest.raises(fk.AbiMismatchError) as ei:
        _lib.lib().fk_context_create(2000, _lib.DEVICE_CPU, 0, ctypes.byref(h))
    _check(ei, fk.AbiMismatchError, "fk_context_create")


def test_bad_device_strings():
    for dev in ["tpu", "cuda:x", "cpu:1", 3.5]:
        with pytest.raises(fk.InvalidArgumentError):
            fk.Context(dev)


@pytest.mark.skipif(cuda_available(), reason="needs a machine without a usable GPU")
def test_cuda_unavailable():
    if fk.device_count() > 0:
        pytest.skip("fusekit sees a GPU")
    with pytest.raises(fk.CudaUnavailableError) as ei:
        fk.Context("cuda")
    _check(ei, fk.CudaUnavailableError, "fk_context_create")
    assert fk.Context("auto").device == "cpu"


def test_stream_wrap_on_cpu_is_unsupported(cpu):
    with pytest.raises(fk.UnsupportedError) as ei:
        fk.Stream.wrap(cpu, 0)
    _check(ei, fk.UnsupportedError, "fk_stream_wrap")


def test_closed_handles_raise():
    b = fk.Buffer.empty("cpu", (2,), "f32")
    b.close()
    with pytest.raises(fk.InvalidArgumentError, match="closed"):
        fk.exp(b)
    c = fk.Context("cpu")
    c.close()
    with pytest.raises(fk.InvalidArgumentError, match="closed"):
        fk.Buffer.empty(c, (2,), "f32")


def test_last_error_message_copy_protocol():
    L = _lib.lib()
    with pytest.raises(fk.ShapeMismatchError):
        fk.add(np.ones(2), np.ones(2), out=np.empty(3))
    expect = _lib.last_error_message()
    needed = ctypes.c_size_t(0)
    assert L.fk_last_error_message_copy(None, 0, ctypes.byref(needed)) == 0
    assert needed.value == len(expect.encode()) + 1
    small = ctypes.create_string_buffer(5)
    st = L.fk_last_error_message_copy(small, 5, ctypes.byref(needed))
    assert st == fk.BufferTooSmallError.status
    assert small.value == expect.encode()[:4]
    full = ctypes.create_string_buffer(needed.value)
    assert L.fk_last_error_message_copy(full, needed.value, None) == 0
    assert full.value.decode() == expect


def test_errors_in_threads_keep_their_own_message():
    import threading

    msgs = {}

    def worker(i):
        try:
            fk.add(np.ones(2), np.ones(2), out=np.empty(i + 3))
        except fk.ShapeMismatchError as e:
            msgs[i] = e.message

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i in range(4):
        assert f"out has shape [{i + 3}]" in msgs[i]
