"""Context, Stream and Buffer on the CPU backend."""

import numpy as np
import pytest
from fk_testutil import NUMPY_DTYPES

import fusekit as fk
from fusekit import _lib


def test_versions():
    assert fk.abi_version() // 1000 == fk.ABI_VERSION // 1000
    assert fk.version_string().startswith("fusekit ")
    assert fk.device_count() >= 0


def test_cpu_context_properties():
    with fk.Context("cpu") as ctx:
        assert ctx.device == "cpu" and not ctx.is_cuda
        assert ctx.kind == _lib.DEVICE_CPU and ctx.ordinal == 0
        assert isinstance(ctx.name, str) and ctx.name
        assert ctx.compute_capability == (0, 0)
        mem = ctx.memory()
        assert mem.total > 0 and 0 <= mem.free <= mem.total
        ctx.warmup()
        assert "cpu" in repr(ctx)
    assert ctx.closed
    ctx.close()  # idempotent


def test_default_context_is_shared_and_recreated():
    a = fk.default_context("cpu")
    assert fk.default_context("cpu") is a
    if fk.device_count() == 0:
        assert fk.default_context("auto") is a
        assert fk.default_context() is a


def test_dtype_conversions():
    assert fk.DType.float32.itemsize == 4 and fk.DType.complex128.itemsize == 16
    assert fk.DType.complex64.real is fk.DType.float32
    for name, dt in [("f16", fk.float16), ("bf16", fk.bfloat16), ("float64", fk.float64), ("c64", fk.complex64)]:
        assert fk._core.as_dtype(name) is dt
    assert fk._core.as_dtype(np.float32) is fk.float32
    assert fk._core.as_dtype(np.dtype("complex128")) is fk.complex128
    assert fk._core.as_dtype(int(fk.float16)) is fk.float16
    for dt in fk.DType:
        assert _lib.dtype_size(int(dt)) == dt.itemsize
    with pytest.raises(fk.UnsupportedDtypeError):
        fk._core.as_dtype("int32")


@pytest.mark.parametrize("dtype", list(fk.DType), ids=[d.name for d in fk.DType])
def test_empty_properties(dtype, cpu):
    with fk.Buffer.empty(cpu, (3, 4, 5), dtype) as b:
        assert b.dtype is dtype
        assert b.shape == (3, 4, 5) and b.ndim == 3
        assert b.strides == (20, 5, 1)
        assert b.size == 60 and b.nbytes == 60 * dtype.itemsize
        assert b.is_contiguous
        assert b.device == "cpu" and not b.is_cuda
        assert b.data_ptr != 0
        assert b.context is cpu
        assert b.owner is None
        assert len(b) == 3
    assert b.closed


def test_empty_zero_d_and_device_string():
    b = fk.Buffer.empty("cpu", (), "float64")
    assert b.shape == () and b.size == 1
    b.copy_from(3.5)
    assert b.to_numpy() == 3.5


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=[np.dtype(d).name for d in NUMPY_DTYPES])
def test_copy_from_and_to_numpy(dtype, rng, cpu):
    src = (rng.standard_normal((4, 6)) * (1 + 1j if np.dtype(dtype).kind == "c" else 1)).astype(dtype)
    b = fk.Buffer.empty(cpu, src.shape, dtype)
    assert b.copy_from(src) is b
    out = b.to_numpy()
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, src)
    # broadcasting and strided sources
    b.copy_from(src[0])
    np.testing.assert_array_equal(b.to_numpy(), np.broadcast_to(src[0], src.shape))
    b.copy_from(src[::-1])
    np.testing.assert_array_equal(b.to_numpy(), src[::-1])
    # numbers and lists convert to the buffer's dtype
    b.copy_from(2)
    assert (b.to_numpy() == 2).all()


def test_wrap_numpy_zero_copy(rng):
    a = rng.standard_normal((3, 5))
    b = fk.Buffer.from_numpy(a)
    assert b.data_ptr == a.ctypes.data
    assert b.strides == (5, 1) and b.owner is a
    a[1, 2] = 42.0
    assert b.to_numpy()[1, 2] == 42.0
    fk.scalar_mul(b, 2.0, out=b)
    assert a[1, 2] == 84.0


def test_wrap_numpy_strides_map_bytes_to_elements():
    a = np.zeros((6, 8), np.float32)
    assert fk.Buffer.from_numpy(a.T).strides == (1, 8)
    assert fk.Buffer.from_numpy(a[::2, ::-3]).strides == (16, -3)
    v = fk.Buffer.from_numpy(a[::-1])
    assert v.strides == (-8, 1)
    assert v.data_ptr == a[::-1].ctypes.data  # the first element, not the lowest address
    assert not fk.Buffer.from_numpy(a.T).is_contiguous


def test_non_contiguous_buffer_round_trip(rng):
    a = rng.standard_normal((4, 6))
    v = fk.Buffer.from_numpy(a[:, ::2])
    np.testing.assert_array_equal(v.to_numpy(), a[:, ::2])
    c = v.contiguous()
    assert c.is_contiguous and c is not v
    np.testing.assert_array_equal(c.to_numpy(), a[:, ::2])
    v.copy_from(np.ones((4, 3)))
    np.testing.assert_array_equal(a[:, ::2], 1.0)


def test_buffer_in_buffer_out(rng, cpu):
    a = fk.Buffer.empty(cpu, (3, 4), "f64").copy_from(rng.standard_normal((3, 4)))
    b = fk.Buffer.empty(cpu, (4,), "f64").copy_from(rng.standard_normal(4))
    out = fk.add(a, b)
    assert isinstance(out, fk.Buffer)
    assert out.shape == (3, 4)
    np.testing.assert_allclose(out.to_numpy(), a.to_numpy() + b.to_numpy())
    # mixed Buffer and numpy: Buffer out
    out2 = fk.mul(a, np.full((3, 4), 2.0))
    assert isinstance(out2, fk.Buffer)
    np.testing.assert_allclose(out2.to_numpy(), 2 * a.to_numpy())
    # abs of a complex Buffer gives a real Buffer
    z = fk.Buffer.empty(cpu, (2,), "c128").copy_from(np.array([3 + 4j, 1j]))
    m = fk.abs(z)
    assert m.dtype is fk.float64
    np.testing.assert_allclose(m.to_numpy(), [5, 1])


def test_zeros(cpu):
    z = fk.Buffer.zeros(cpu, (2, 3), "c64")
    np.testing.assert_array_equal(z.to_numpy(), np.zeros((2, 3), np.complex64))


def test_bfloat16_to_numpy_is_refused(cpu):
    b = fk.Buffer.empty(cpu, (2,), "bf16")
    with pytest.raises(fk.UnsupportedDtypeError, match="bfloat16"):
        b.to_numpy()


def test_cpu_stream(cpu, rng):
    with fk.Stream(cpu) as s:
        assert s.owned and s.context is cpu
        assert s.cuda_stream == 0
        a = rng.standard_normal(5)
        out = fk.exp(a, stream=s)
        s.synchronize()
        np.testing.assert_allclose(out, np.exp(a))
        b = fk.Buffer.empty(cpu, (5,), "f64", stream=s)
        b.copy_from(a, stream=s)
        np.testing.assert_array_equal(b.to_numpy(stream=s), a)
    assert s.closed


def test_cuda_stream_argument_on_cpu_is_refused(rng):
    with pytest.raises(fk.DeviceMismatchError, match="stream"):
        fk.exp(rng.standard_normal(3), stream=1234)


def test_repr():
    b = fk.Buffer.from_numpy(np.zeros((2, 3), np.float32))
    assert "float32[2, 3]" in repr(b) and "borrowed" in repr(b)
    b.close()
    assert "closed" in repr(b)


def test_from_array_dispatch():
    a = np.arange(3.0)
    b = fk.Buffer.from_array(a)
    assert b.owner is a
    assert fk.Buffer.from_array(b) is b
    c = fk.Buffer.from_array([1.0, 2.0])  # via numpy.asarray (a copy)
    np.testing.assert_array_equal(c.to_numpy(), [1.0, 2.0])
    with pytest.raises(fk.InvalidArgumentError, match="scalar"):
        fk.Buffer.from_array(1.0)
