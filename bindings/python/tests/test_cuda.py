"""CUDA: torch CUDA tensors in and out, stream ordering with torch's current
stream (default and non-default), explicit streams, DLPack on CUDA, the custom
ops on CUDA. Skipped unless torch sees a GPU."""

import functools

import numpy as np
import pytest
from fk_testutil import TORCH_DTYPES, assert_close, torch_rand, torch_ref
from fk_testutil import check_torch_binary, check_torch_unary, torch_elementwise_refs  # elementwise checks

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda.is_available() is False", allow_module_level=True)

import fusekit as fk  # noqa: E402

DEV = torch.device("cuda", 0)
# ~ tens of milliseconds of GPU time: long enough that a fusekit op racing ahead
# of it (on the wrong stream) would read data not yet written.
SLEEP_CYCLES = 200_000_000


@pytest.fixture(scope="module", autouse=True)
def _warm_kernels():
    # compile (or load) the kernels first, so that no op below spends longer in
    # NVRTC than the torch kernels it must wait for
    fk.default_context("cuda:0").warmup()


_rand = functools.partial(torch_rand, device=DEV)
_ref = torch_ref


def _np(x):
    return x.detach().cpu().numpy()


# --- context ----------------------------------------------------------------------


def test_cuda_context():
    with fk.Context("cuda") as ctx:
        assert ctx.is_cuda and ctx.device == "cuda:0"
        assert ctx.name
        major, minor = ctx.compute_capability
        assert (major, minor) == torch.cuda.get_device_capability(0)
        mem = ctx.memory()
        assert 0 < mem.free <= mem.total
        ctx.warmup()
    assert fk.default_context("auto").device == "cuda:0"
    assert fk.device_count() == torch.cuda.device_count()


# --- ops on torch CUDA tensors -------------------------------------------------------


UNARY, BINARY = torch_elementwise_refs()


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_cuda(name, dtype):
    a, out = check_torch_binary(fk, name, dtype, (257, 129), (129,), device=DEV)
    assert out.is_cuda and out.dtype == a.dtype and out.shape == a.shape


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_cuda(name, dtype):
    checked = check_torch_unary(fk, name, dtype, (1000, 1003), device=DEV)
    if checked is not None:
        assert checked[1].is_cuda


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_axpby_scalars_cuda(dtype):
    a = _rand((33, 65), dtype, seed=4)
    b = _rand((33, 65), dtype, seed=5)
    alpha, beta = (0.5 + 1j, -2 - 0.5j) if a.is_complex() else (0.5, -2.0)
    assert_close(_np(_ref(fk.axpby(alpha, a, beta, b))), _np(alpha * _ref(a) + beta * _ref(b)), dtype)
    assert_close(_np(_ref(fk.scalar_add(a, alpha))), _np(_ref(a) + alpha), dtype)
    assert_close(_np(_ref(fk.scalar_mul(a, beta))), _np(_ref(a) * beta), dtype)


def test_strided_and_in_place_cuda():
    base = torch.randn(64, 96, device=DEV, dtype=torch.float64)
    v = base.t()[::3]
    torch.testing.assert_close(fk.exp(v), torch.exp(v))
    ref = base[:, ::2] * 2
    fk.scalar_mul(base[:, ::2], 2.0, out=base[:, ::2])
    torch.testing.assert_close(base[:, ::2], ref)
    out = torch.empty(96, 64, device=DEV, dtype=torch.float64).t()
    fk.add(base, base, out=out)
    torch.testing.assert_close(out, base * 2)


def test_device_mismatch_names_argument():
    with pytest.raises(fk.DeviceMismatchError) as ei:
        fk.add(torch.ones(3, device=DEV), np.ones(3, np.float32))
    assert "b" in ei.value.message


# --- stream ordering ------------------------------------------------------------------


def test_default_current_stream_ordering():
    n = 1 << 22
    a = torch.zeros(n, device=DEV)
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)  # a long torch kernel
    a.fill_(2.0)  # written only after it
    out = fk.scalar_mul(a, 3.0)  # no sync in between
    b = fk.add(out, a)
    torch.cuda.current_stream().synchronize()
    assert bool((out == 6.0).all()) and bool((b == 8.0).all())


def test_non_default_torch_stream_ordering():
    n = 1 << 22
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.zeros(n, device=DEV)
        torch.cuda._sleep(SLEEP_CYCLES)
        a.fill_(2.0)
        out = fk.scalar_mul(a, 3.0)  # must run on s, after the fill
        # queued, not synchronised behind the caller's back
        assert not s.query()
        buf = fk.Buffer.empty("cuda:0", (n,), "f32")  # stream-ordered on s
        fk.exp(fk.Buffer.from_torch(out), out=buf)
    s.synchronize()
    assert bool((out == 6.0).all())
    np.testing.assert_allclose(buf.to_numpy(stream=s)[:5], np.exp(6.0), rtol=1e-6)
    # the cached wrapper of s is what ran the op
    assert fk._core._wrapped[(0, s.cuda_stream)].cuda_stream == s.cuda_stream


def test_explicit_stream_overrides_current():
    ctx = fk.default_context("cuda:0")
    a = torch.full((1 << 20,), 2.0, device=DEV)
    torch.cuda.synchronize()
    with fk.Stream(ctx) as fs:
        assert fs.owned and fs.cuda_stream != 0
        out = fk.sqrt(a, stream=fs)
        fs.synchronize()
        assert bool((out == 2.0**0.5).all())
    s2 = torch.cuda.Stream()
    out2 = fk.neg(a, stream=s2)  # a torch stream object
    s2.synchronize()
    assert bool((out2 == -2.0).all())
    w = fk.Stream.wrap(ctx, s2)
    assert not w.owned and w.cuda_stream == s2.cuda_stream
    out3 = fk.neg(a, stream=w)
    w.synchronize()
    assert bool((out3 == -2.0).all())


# --- buffers and DLPack on CUDA -----------------------------------------------------------


def test_cuda_buffer_round_trip():
    b = fk.Buffer.empty("cuda", (4, 5), "c64")
    assert b.is_cuda and b.device == "cuda:0"
    src = (np.arange(20) + 1j * np.arange(20)).reshape(4, 5).astype(np.complex64)
    b.copy_from(src)
    np.testing.assert_array_equal(b.to_numpy(), src)
    b.copy_from(src[0])  # broadcast
    np.testing.assert_array_equal(b.to_numpy(), np.broadcast_to(src[0], (4, 5)))
    t = torch.zeros(5, 4, device=DEV, dtype=torch.complex64)
    v = fk.Buffer.from_torch(t.t())  # non-contiguous CUDA buffer
    v.copy_from(src)
    np.testing.assert_array_equal(v.to_numpy(), src)
    assert torch.equal(t.t().cpu(), torch.from_numpy(src))
    assert b.__dlpack_device__() == (2, 0)
    with pytest.raises((BufferError, RuntimeError, TypeError, ValueError)):
        np.from_dlpack(b)


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_from_dlpack_cuda(dtype):
    a = _rand((7, 9), dtype, seed=6)
    ab = fk.Buffer.from_torch(a)
    out = fk.scalar_mul(ab, 2.0)  # Buffer in -> Buffer out
    assert isinstance(out, fk.Buffer) and out.is_cuda
    t = torch.from_dlpack(out)
    assert t.is_cuda and t.dtype == a.dtype and t.data_ptr() == out.data_ptr
    assert_close(_np(_ref(t)), _np(_ref(a) * 2), dtype)


def test_dlpack_export_orders_producer_stream_before_consumer():
    """Over 12 fresh torch streams: torch hands them out round-robin from its pool,
    and ordering through torch's events on ExternalStream missed 7 of the first 9
    (fusekit orders with its own events now)."""
    n = 1 << 22
    for i in range(12):
        s1 = torch.cuda.Stream()
        with torch.cuda.stream(s1):
            a = torch.zeros(n, device=DEV)
            torch.cuda._sleep(SLEEP_CYCLES)
            a.fill_(1.0)
            out = fk.scalar_add(fk.Buffer.from_torch(a), 4.0)  # Buffer, written on s1
        # consumer on the default stream: torch passes its stream, fusekit orders s1 before it
        t = torch.from_dlpack(out)
        total = t.sum()
        assert float(total) == 5.0 * n, f"stream {i}"
        s1.synchronize()


def test_import_torch_cuda_via_dlpack():
    n = 1 << 20
    s = torch.cuda.Stream()
    ctx = fk.default_context("cuda:0")
    with fk.Stream(ctx) as fs, torch.cuda.stream(s):
        t = torch.zeros(n, device=DEV, dtype=torch.float64)
        torch.cuda._sleep(SLEEP_CYCLES)
        t.fill_(3.0)
        # fusekit passes fs to torch's __dlpack__(stream=...), which orders torch's
        # current stream (s) before it; then the op runs on fs
        b = fk.from_dlpack(t, stream=fs)
        assert b.is_cuda and b.data_ptr == t.data_ptr()
        r = fk.scalar_mul(b, 2.0, stream=fs)
        np.testing.assert_array_equal(r.to_numpy(stream=fs)[:3], [6.0, 6.0, 6.0])
        assert float(torch.from_dlpack(r).sum()) == 6.0 * n


def test_cuda_custom_ops():
    import fusekit.torch.elementwise as fto

    a = torch.randn(5, 6, device=DEV, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, device=DEV, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: fto.axpby(2.0, a, -1.0, b), (a, b))
    with torch.no_grad():
        a[a.abs() < 1e-3] = 0.5
    assert torch.autograd.gradcheck(fto.relu, (a,))
    cf = torch.compile(lambda a, b: fto.relu(fto.axpby(2.0, a, -1.0, b)) * 3, fullgraph=True)
    torch.testing.assert_close(cf(a.detach(), b.detach()), torch.relu(2 * a - b).detach() * 3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_gpu_uses_its_own_context_and_stream():
    d1 = torch.device("cuda", 1)
    a = torch.ones(1000, device=d1)
    with torch.cuda.device(1):
        out = fk.scalar_mul(a, 2.0)
    assert out.device == d1 and bool((out == 2).all())
    out2 = fk.exp(a)  # current device 0, tensor on 1: the tensor's device decides
    assert out2.device == d1
    torch.testing.assert_close(out2, torch.exp(a))
