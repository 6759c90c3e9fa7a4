"""DLPack in and out on the CPU: numpy.from_dlpack(buf), torch.from_dlpack(buf),
fusekit.from_dlpack(numpy/torch), legacy capsules, capsule ownership."""

import gc
import weakref

import numpy as np
import pytest

import fusekit as fk
from fusekit import _dlpack as dl

NUMPY_VERSIONED = tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 1)


def _buf(values, dtype="f64"):
    values = np.asarray(values)
    return fk.Buffer.empty("cpu", values.shape, dtype).copy_from(values)


# --- export ---------------------------------------------------------------------


def test_dlpack_device():
    assert _buf([1.0]).__dlpack_device__() == (1, 0)


def test_versioned_capsule_name():
    b = _buf([1.0, 2.0])
    cap = b.__dlpack__(max_version=(1, 0))
    assert dl.capsule_name(cap) == b"dltensor_versioned"
    m = dl.DLManagedTensorVersioned.from_address(dl.take_versioned_pointer(cap))
    assert m.version.major == 1
    assert m.dl_tensor.ndim == 1 and m.dl_tensor.shape[0] == 2
    assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes) == (2, 64, 1)
    del cap  # unconsumed: the destructor calls the deleter (no leak, no crash)
    gc.collect()


def test_legacy_capsule_without_max_version():
    b = _buf([1.0, 2.0])
    cap = b.__dlpack__()
    assert dl.capsule_name(cap) == b"dltensor"
    del cap  # unconsumed: its destructor calls the deleter
    gc.collect()


@pytest.mark.parametrize("legacy", [False, True])
def test_unconsumed_capsule_releases_the_kept_alive_array(legacy):
    a = np.arange(3.0)
    r = weakref.ref(a)
    b = fk.Buffer.from_numpy(a)
    cap = b.__dlpack__() if legacy else b.__dlpack__(max_version=(1, 0))
    b.close()
    del a, b
    gc.collect()
    assert r() is not None  # the capsule holds it
    del cap
    gc.collect()
    assert r() is None


def test_consumer_errors_propagate_through_capsule_destruction():
    # numpy refuses bfloat16 and drops the capsule while its BufferError is
    # propagating: the capsule's destructor must leave that exception alone
    b = fk.Buffer.empty("cpu", (2,), "bf16")
    with pytest.raises((BufferError, RuntimeError), match="dtype"):  # not SystemError
        np.from_dlpack(b)
    torch = pytest.importorskip("torch")
    w = fk.Buffer.from_torch(torch.zeros(2, dtype=torch.bfloat16))  # with a kept-alive owner
    with pytest.raises((BufferError, RuntimeError), match="dtype"):
        np.from_dlpack(w)


def test_c_destructors_are_used():
    if not NUMPY_VERSIONED:
        pytest.skip("numpy < 2.1: the ctypes-callback fallback is used")
    assert dl._numpy_cfuncs() is not None


@pytest.mark.skipif(not NUMPY_VERSIONED, reason="numpy < 2.1 reads only legacy capsules")
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex64, np.complex128])
def test_numpy_from_dlpack_is_zero_copy(dtype):
    b = fk.Buffer.empty("cpu", (3, 4), dtype).copy_from(np.arange(12).reshape(3, 4))
    v = np.from_dlpack(b)
    assert v.dtype == np.dtype(dtype) and v.shape == (3, 4)
    assert v.ctypes.data == b.data_ptr
    np.testing.assert_array_equal(v, np.arange(12).reshape(3, 4))
    v[0, 0] = 7
    assert b.to_numpy()[0, 0] == 7
    # the export keeps the memory alive after the buffer handle is gone
    b.close()
    del b
    gc.collect()
    assert v[0, 0] == 7 and v.sum() == np.arange(12).sum() + 7


@pytest.mark.skipif(not NUMPY_VERSIONED, reason="numpy < 2.1 reads only legacy capsules")
def test_numpy_from_dlpack_strided_view():
    a = np.arange(24.0).reshape(4, 6)
    b = fk.Buffer.from_numpy(a[::2, ::-1])
    v = np.from_dlpack(b)
    np.testing.assert_array_equal(v, a[::2, ::-1])
    assert v.ctypes.data == a[::2, ::-1].ctypes.data


@pytest.mark.skipif(not NUMPY_VERSIONED, reason="numpy < 2.1 reads only legacy capsules")
def test_export_of_wrapped_array_keeps_the_array_alive():
    a = np.arange(6.0)
    r = weakref.ref(a)
    b = fk.Buffer.from_numpy(a)
    v = np.from_dlpack(b)
    del a
    b.close()
    del b
    gc.collect()
    assert r() is not None  # the DLPack export holds it
    np.testing.assert_array_equal(v, np.arange(6.0))
    del v
    gc.collect()
    assert r() is None


@pytest.mark.skipif(not NUMPY_VERSIONED, reason="numpy < 2.1 reads only legacy capsules")
def test_read_only_array_exports_read_only():
    a = np.arange(3.0)
    a.flags.writeable = False
    b = fk.Buffer.from_numpy(a)
    assert b.readonly
    v = np.from_dlpack(b)
    assert not v.flags.writeable
    with pytest.raises(BufferError, match="read-only"):
        b.__dlpack__()  # a legacy capsule cannot say read-only


def test_dl_device_and_copy():
    b = _buf([1.0, 2.0])
    with pytest.raises(BufferError):
        b.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    cap = b.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=True)
    c = fk.from_dlpack(cap)
    assert c.data_ptr != b.data_ptr
    np.testing.assert_array_equal(c.to_numpy(), [1.0, 2.0])


# --- import ---------------------------------------------------------------------


@pytest.mark.skipif(not NUMPY_VERSIONED, reason="numpy < 2.1 makes only legacy capsules")
def test_import_numpy_versioned_and_consumes_capsule():
    a = np.arange(5.0)
    cap = a.__dlpack__(max_version=(1, 0))
    b = fk.from_dlpack(cap)
    assert dl.capsule_name(cap) == b"used_dltensor_versioned"
    assert b.data_ptr == a.ctypes.data and b.owner is None
    a[2] = -1
    assert b.to_numpy()[2] == -1
    with pytest.raises(fk.InvalidArgumentError, match="consumed only once"):
        fk.from_dlpack(cap)


def test_import_object_with_dlpack_keeps_producer_alive():
    a = np.arange(4.0)
    r = weakref.ref(a)
    b = fk.from_dlpack(a)
    del a
    gc.collect()
    assert r() is not None
    np.testing.assert_array_equal(b.to_numpy(), np.arange(4.0))
    fk.neg(b, out=b)
    np.testing.assert_array_equal(b.to_numpy(), -np.arange(4.0))
    b.close()
    gc.collect()
    assert r() is None  # fusekit called the producer's deleter


def test_import_read_only_refused_as_output():
    a = np.arange(3.0)
    a.flags.writeable = False
    try:
        b = fk.from_dlpack(a)
    except BufferError:
        pytest.skip("this numpy refuses to export read-only arrays")
    assert b.readonly
    with pytest.raises(fk.InvalidArgumentError, match="read-only"):
        fk.exp(b, out=b)


class LegacyProducer:
    """A DLPack 0.x producer: __dlpack__ takes no max_version, returns 'dltensor'."""

    def __init__(self, buf):
        self.buf = buf

    def __dlpack__(self, stream=None):
        return self.buf.__dlpack__()

    def __dlpack_device__(self):
        return self.buf.__dlpack_device__()


def test_import_legacy_producer_zero_copy_and_lifetime():
    src = fk.Buffer.from_numpy(np.arange(6.0).reshape(2, 3))
    arr = src.owner
    r = weakref.ref(arr)
    b = fk.from_dlpack(LegacyProducer(src))
    assert b.data_ptr == arr.ctypes.data
    assert b.shape == (2, 3) and b.strides == (3, 1)
    assert dl.capsule_name(b.owner) == b"dltensor"  # kept alive, unconsumed
    src.close()
    del src, arr
    gc.collect()
    assert r() is not None
    np.testing.assert_array_equal(b.to_numpy(), np.arange(6.0).reshape(2, 3))
    b.close()
    del b
    gc.collect()
    assert r() is None


def test_ops_accept_dlpack_producers():
    out = fk.add(LegacyProducer(_buf([1.0, 2.0])), np.array([10.0, 20.0]))
    assert isinstance(out, fk.Buffer)  # a DLPack producer votes for a Buffer result
    np.testing.assert_array_equal(out.to_numpy(), [11.0, 22.0])


# --- torch ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"])
def test_torch_from_dlpack_of_buffer(dtype):
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    src = (torch.arange(12, dtype=torch.float64).reshape(3, 4) - 5).to(tdt)
    b = fk.Buffer.empty("cpu", (3, 4), dtype)
    b.copy_from(src)
    t = torch.from_dlpack(b)
    assert t.dtype == tdt and t.shape == (3, 4)
    assert t.data_ptr() == b.data_ptr
    assert torch.equal(t, src)
    t.mul_(2)
    back = fk.Buffer.from_torch(torch.empty(3, 4, dtype=tdt))
    fk.copy(b, out=back)
    assert torch.equal(back.owner, src * 2)


def test_torch_legacy_capsule():
    torch = pytest.importorskip("torch")
    b = _buf([1.0, 2.0, 3.0])
    t = torch.utils.dlpack.from_dlpack(b.__dlpack__())  # legacy capsule consumer
    assert t.data_ptr() == b.data_ptr
    b.close()
    gc.collect()
    assert t.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"])
def test_import_from_torch_via_dlpack(dtype):
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    t = torch.linspace(-1, 1, 10, dtype=torch.float64).to(tdt).reshape(2, 5)
    b = fk.from_dlpack(t)
    assert b.dtype.name == dtype and b.shape == (2, 5)
    assert b.data_ptr == t.data_ptr()
    assert b.owner is None  # imported: fusekit owns the DLPack tensor
    fk.scalar_mul(b, 2.0, out=b)
    assert torch.equal(t, (torch.linspace(-1, 1, 10, dtype=torch.float64).to(tdt) * 2).reshape(2, 5))


def test_import_from_torch_strided_and_round_trip():
    torch = pytest.importorskip("torch")
    t = torch.arange(20.0).reshape(4, 5)
    v = t.t()[1:, ::2]
    b = fk.from_dlpack(v)
    assert b.strides == tuple(v.stride())
    back = torch.from_dlpack(b)
    assert torch.equal(back, v)
    assert back.data_ptr() == v.data_ptr()


def test_fallback_without_numpy_destructors(monkeypatch):
    """With a numpy that cannot lend its C destructors, ctypes callbacks stand in."""
    monkeypatch.setattr(dl, "_cfuncs", None)
    monkeypatch.setattr(dl, "_cfuncs_tried", True)
    a = np.arange(4.0)
    r = weakref.ref(a)
    b = fk.Buffer.from_numpy(a)
    del a
    caps = [b.__dlpack__(max_version=(1, 0)), b.__dlpack__()]
    if NUMPY_VERSIONED:
        v = np.from_dlpack(b)
        np.testing.assert_array_equal(v, np.arange(4.0))
        del v
    b.close()
    del b
    gc.collect()
    assert r() is not None
    caps.clear()
    gc.collect()
    assert r() is None
    assert not dl._live
