"""The runtime API: memory statistics, pinned buffers, buffer copies, events and
communicators (fusekit/runtime.py). CPU tests always run; CUDA tests need
torch.cuda."""

import gc

import numpy as np
import pytest

import fusekit as fk

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

HAS_CUDA = torch is not None and torch.cuda.is_available() and fk.device_count() > 0
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs torch.cuda and a GPU fusekit can use")


@pytest.fixture
def ctx():
    with fk.Context("cpu") as c:
        yield c


@pytest.fixture
def comm(ctx):
    (c,) = fk.Comm.init_all([ctx])
    yield c
    c.close()


# ---------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------


def test_memory_stats_move_with_allocations(ctx):
    s0 = ctx.memory_stats()
    assert isinstance(s0, fk.MemoryStats)
    assert s0.device_total_bytes > 0 and s0.device_free_bytes <= s0.device_total_bytes
    b = fk.Buffer.empty(ctx, (1000,), "float64")
    s1 = ctx.memory_stats()
    assert s1.allocated_bytes == s0.allocated_bytes + 8000
    assert s1.live_allocations == s0.live_allocations + 1
    assert s1.peak_allocated_bytes >= s1.allocated_bytes
    assert s1.reserved_bytes == s1.allocated_bytes  # the CPU has no pool
    b.close()
    s2 = ctx.memory_stats()
    assert s2.allocated_bytes == s0.allocated_bytes
    assert s2.live_allocations == s0.live_allocations
    assert s2.peak_allocated_bytes >= s0.allocated_bytes + 8000
    # the module-level function is the same query
    assert fk.memory_stats(ctx) == ctx.memory_stats()


def test_memory_stats_released_on_gc(ctx):
    base = ctx.memory_stats().allocated_bytes
    b = fk.Buffer.empty(ctx, (256,), "float32")
    assert ctx.memory_stats().allocated_bytes == base + 1024
    del b
    gc.collect()
    assert ctx.memory_stats().allocated_bytes == base


def test_release_threshold_and_trim(ctx):
    assert ctx.memory_stats().release_threshold_bytes == 2**64 - 1
    ctx.set_release_threshold(1 << 20)
    assert ctx.memory_stats().release_threshold_bytes == 1 << 20
    ctx.set_release_threshold(None)
    assert ctx.memory_stats().release_threshold_bytes == 2**64 - 1
    ctx.trim()  # no-op on the CPU
    fk.trim_memory(0, ctx)
    with pytest.raises(fk.InvalidArgumentError):
        ctx.set_release_threshold(-1)
    with pytest.raises(fk.InvalidArgumentError):
        ctx.trim(2**64)


def test_memory_stats_on_closed_context():
    c = fk.Context("cpu")
    c.close()
    with pytest.raises(fk.InvalidArgumentError):
        c.memory_stats()


# ---------------------------------------------------------------------------
# Pinned buffers and copies
# ---------------------------------------------------------------------------


def test_pinned_round_trip_cpu(ctx, rng):
    base = ctx.memory_stats()
    p = fk.Buffer.pinned(ctx, (3, 4), "float32")
    assert p.shape == (3, 4) and p.dtype == fk.float32 and p.is_contiguous
    assert not p.is_pinned and p.device == "cpu"  # an ordinary host buffer on the CPU
    s = ctx.memory_stats()
    assert (s.allocated_bytes + s.pinned_bytes) - (base.allocated_bytes + base.pinned_bytes) == 48
    x = rng.standard_normal((3, 4)).astype(np.float32)
    p.copy_from(x)
    np.testing.assert_array_equal(p.to_numpy(), x)
    np.testing.assert_array_equal(np.from_dlpack(p), x)
    q = fk.pinned_empty(12, np.float32, ctx)
    fk.copy_buffer(q, p)  # same element count, other shape
    np.testing.assert_array_equal(q.to_numpy(), x.ravel())
    p.close()
    q.close()
    s = ctx.memory_stats()
    assert s.allocated_bytes + s.pinned_bytes == base.allocated_bytes + base.pinned_bytes


def test_pinned_bad_inputs(ctx):
    with pytest.raises(fk.UnsupportedDtypeError):
        fk.pinned_empty((2,), "int8", ctx)
    with pytest.raises(fk.InvalidArgumentError):
        fk.pinned_empty((2, -1), "float32", ctx)
    with pytest.raises(fk.InvalidArgumentError):
        fk.pinned_empty(tuple([1] * 9), "float32", ctx)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex64, np.complex128])
def test_copy_buffer_numpy(dtype, rng):
    src = (rng.standard_normal(24) * 3).astype(dtype)
    dst = np.zeros((4, 6), dtype=dtype)
    out = fk.copy_buffer(dst, src)
    assert out is dst
    np.testing.assert_array_equal(dst.ravel(), src)


def test_copy_buffer_buffers_and_torch(ctx, rng):
    src = rng.standard_normal((5, 2))
    b = fk.Buffer.empty(ctx, (10,), "float64")
    assert fk.copy_buffer(b, src) is b
    np.testing.assert_array_equal(b.to_numpy(), src.ravel())
    dst = np.empty((2, 5))
    fk.copy_buffer(dst, b)
    np.testing.assert_array_equal(dst, src.reshape(2, 5))
    fk.copy_buffer(b, b)  # the same buffer: a no-op
    if torch is not None:
        t = torch.zeros(10, dtype=torch.float64)
        fk.copy_buffer(t, b)
        np.testing.assert_array_equal(t.numpy(), src.ravel())


def test_copy_buffer_bad_inputs(rng):
    a = rng.standard_normal(6)
    with pytest.raises(fk.DtypeMismatchError):
        fk.copy_buffer(np.zeros(6, np.float32), a)
    with pytest.raises(fk.ShapeMismatchError):
        fk.copy_buffer(np.zeros(5), a)
    with pytest.raises(fk.UnsupportedError):
        fk.copy_buffer(np.zeros(3), a[::2])  # not contiguous
    ro = np.zeros(6)
    ro.flags.writeable = False
    with pytest.raises(fk.InvalidArgumentError):
        fk.copy_buffer(ro, a)
    z = np.zeros(8)
    with pytest.raises(fk.AliasingError):
        fk.copy_buffer(z[2:8], z[0:6])  # partial overlap
    with pytest.raises(fk.InvalidArgumentError):
        fk.copy_buffer(np.zeros(6), 3.0)
    with pytest.raises(fk.DeviceMismatchError):
        fk.copy_buffer(np.zeros(6), a, stream=12345)  # a CUDA stream for a host copy


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU answer")
def test_device_can_access_peer_without_gpu():
    with pytest.raises((fk.CudaUnavailableError, fk.InvalidArgumentError)):
        fk.device_can_access_peer(0, 0)


def test_device_can_access_peer_bad_arguments():
    with pytest.raises(fk.InvalidArgumentError):
        fk.device_can_access_peer("zero", 0)
    with pytest.raises(fk.Error):
        fk.device_can_access_peer(0, 10_000)


# ---------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------


def test_events_order_and_elapsed(ctx):
    with fk.Event(ctx) as start, fk.Event(ctx) as end:
        assert start.query()  # never recorded: complete
        start.record()
        fk.exp(np.linspace(0, 1, 100_000))
        end.record()
        end.synchronize()
        assert end.query()
        ms = start.elapsed_ms(end)
        assert ms >= 0.0
        assert fk.event_elapsed_ms(start, end) == ms
        assert start.elapsed_time(end) == ms
        # reversed order gives the negative time
        assert end.elapsed_ms(start) == pytest.approx(-ms, abs=1e-3)
        # re-recording moves the event
        start.record()
        assert end.elapsed_ms(start) >= 0.0
    assert start.closed and end.closed


def test_event_module_functions_and_stream_wait(ctx):
    ev = fk.event_create(ctx)
    s = fk.Stream(ctx)
    assert fk.event_record(ev, s) is ev
    fk.event_synchronize(ev)
    assert fk.event_query(ev)
    s.wait_event(ev)
    fk.stream_wait_event(s, ev)
    fk.stream_wait_event(None, ev)
    ev.wait(s)
    fk.event_destroy(ev)
    assert ev.closed
    fk.event_destroy(ev)  # idempotent
    s.close()


def test_event_released_on_gc(ctx):
    ev = fk.Event(ctx)
    ev.record()
    del ev
    gc.collect()


def test_event_bad_inputs(ctx):
    a, b = fk.Event(ctx), fk.Event(ctx)
    with pytest.raises(fk.InvalidArgumentError):
        a.elapsed_ms(b)  # never recorded
    a.record()
    with pytest.raises(fk.InvalidArgumentError):
        a.elapsed_ms(b)
    with pytest.raises(fk.InvalidArgumentError):
        a.elapsed_ms("later")
    b.close()
    with pytest.raises(fk.InvalidArgumentError):
        b.record()
    with pytest.raises(fk.InvalidArgumentError):
        fk.stream_wait_event(None, "event")
    with pytest.raises(fk.DeviceMismatchError):
        a.record(stream=12345)  # a CUDA stream for a CPU event


# ---------------------------------------------------------------------------
# Communicators (single-rank CPU)
# ---------------------------------------------------------------------------


def test_comm_unique_id_needs_nccl():
    try:
        uid = fk.Comm.unique_id()
    except fk.LibraryNotFoundError:
        pytest.skip("NCCL (libnccl.so.2) is not installed")
    assert isinstance(uid, bytes) and len(uid) == fk.COMM_ID_BYTES
    assert fk.comm_unique_id() != uid


def test_comm_init(ctx):
    (c,) = fk.Comm.init_all([ctx])
    assert (c.rank, c.size) == (0, 1)
    assert (fk.comm_rank(c), fk.comm_size(c)) == (0, 1)
    assert c.device == "cpu"
    c.close()
    assert c.closed
    # the CPU ignores the id's contents
    with fk.Comm.init_rank(ctx, 1, bytes(fk.COMM_ID_BYTES), 0) as c1:
        assert (c1.rank, c1.size) == (0, 1)
    c2 = fk.comm_init_rank("cpu", 1, b"\x01" * fk.COMM_ID_BYTES, 0)
    fk.comm_destroy(c2)
    (c3,) = fk.comm_init_all("cpu")
    del c3
    gc.collect()


def test_comm_init_bad_inputs(ctx):
    uid = bytes(fk.COMM_ID_BYTES)
    with pytest.raises(fk.UnsupportedError):
        fk.Comm.init_rank(ctx, 2, uid, 0)
    with pytest.raises(fk.InvalidArgumentError):
        fk.Comm.init_rank(ctx, 1, uid, 1)
    with pytest.raises(fk.InvalidArgumentError):
        fk.Comm.init_rank(ctx, 0, uid, 0)
    with pytest.raises(fk.InvalidArgumentError):
        fk.Comm.init_rank(ctx, 1, b"short", 0)
    with pytest.raises(fk.InvalidArgumentError):
        fk.Comm.init_all([])
    with pytest.raises(fk.Error):
        fk.Comm.init_all([ctx, fk.Context("cpu")])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_all_reduce_single_rank(comm, rng, dtype, op):
    x = rng.standard_normal((3, 4)).astype(dtype)
    y = fk.all_reduce(x, op=op, comm=comm)
    assert isinstance(y, np.ndarray) and y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)  # one rank: the reduction is the input
    out = np.zeros_like(x)
    assert fk.all_reduce(x, out, op, comm=comm) is out
    np.testing.assert_array_equal(out, x)
    z = x.copy()
    assert fk.all_reduce(z, z, op, comm=comm) is z  # in place
    np.testing.assert_array_equal(z, x)


def test_all_reduce_complex_sum(comm, rng):
    x = (rng.standard_normal(5) + 1j * rng.standard_normal(5)).astype(np.complex64)
    np.testing.assert_array_equal(fk.all_reduce(x, comm=comm), x)
    with pytest.raises(fk.UnsupportedDtypeError):
        fk.all_reduce(x, op="max", comm=comm)


def test_broadcast_single_rank(comm, rng):
    x = rng.standard_normal(7)
    np.testing.assert_array_equal(fk.broadcast(x, root=0, comm=comm), x)
    out = np.zeros(7)
    fk.broadcast(x, out, 0, comm=comm)
    np.testing.assert_array_equal(out, x)
    z = x.copy()
    fk.broadcast(z, z, comm=comm)
    np.testing.assert_array_equal(z, x)
    c = (rng.standard_normal(3) + 1j).astype(np.complex128)
    np.testing.assert_array_equal(fk.broadcast(c, comm=comm), c)


def test_all_gather_and_reduce_scatter_single_rank(comm, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    g = fk.all_gather(x, comm=comm)
    assert g.shape == (2, 3)
    np.testing.assert_array_equal(g, x)
    r = fk.reduce_scatter(x, comm=comm)
    assert r.shape == (2, 3)
    np.testing.assert_array_equal(r, x)
    out = np.zeros(6, np.float32)
    fk.all_gather(x, out, comm=comm)
    np.testing.assert_array_equal(out, x.ravel())
    out2 = np.zeros(6, np.float32)
    fk.reduce_scatter(x, out2, op="min", comm=comm)
    np.testing.assert_array_equal(out2, x.ravel())
    s = np.float64(2.5)
    np.testing.assert_array_equal(fk.all_gather(np.array(s), comm=comm), [2.5])


def test_collectives_buffers_and_torch(comm, ctx, rng):
    x = rng.standard_normal(8)
    b = fk.Buffer.empty(ctx, (8,), "float64").copy_from(x)
    y = fk.all_reduce(b, comm=comm)
    assert isinstance(y, fk.Buffer)
    np.testing.assert_array_equal(y.to_numpy(), x)
    if torch is not None:
        t = torch.from_numpy(x.copy())
        r = fk.all_reduce(t, comm=comm)
        assert isinstance(r, torch.Tensor)
        np.testing.assert_array_equal(r.numpy(), x)
        tb = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
        rb = fk.all_gather(tb, comm=comm)
        assert rb.dtype == torch.bfloat16 and torch.equal(rb, tb)


def test_comm_group(comm, rng):
    x = rng.standard_normal(4)
    out = np.zeros(4)
    with fk.Comm.group():
        fk.all_reduce(x, out, comm=comm)
        with fk.comm_group():  # groups nest
            pass
    np.testing.assert_array_equal(out, x)
    fk.comm_group_start()
    fk.comm_group_end()
    with pytest.raises(fk.InvalidArgumentError):
        fk.comm_group_end()  # no open group
    with pytest.raises(ZeroDivisionError):
        with fk.Comm.group():
            1 / 0
    with pytest.raises(fk.InvalidArgumentError):
        fk.comm_group_end()  # the failed block closed its group


def test_collectives_bad_inputs(comm, rng):
    x = rng.standard_normal(6)
    with pytest.raises(fk.InvalidArgumentError):
        fk.all_reduce(x, op="avg", comm=comm)
    with pytest.raises(fk.InvalidArgumentError):
        fk.all_reduce(x, op=7, comm=comm)
    with pytest.raises(fk.InvalidArgumentError):
        fk.all_reduce(x, comm="not a comm")
    with pytest.raises(fk.DtypeMismatchError):
        fk.all_reduce(x, np.zeros(6, np.float32), comm=comm)
    with pytest.raises(fk.ShapeMismatchError):
        fk.all_reduce(x, np.zeros(5), comm=comm)
    with pytest.raises(fk.ShapeMismatchError):
        fk.all_gather(x, np.zeros(12), comm=comm)
    with pytest.raises(fk.UnsupportedError):
        fk.all_reduce(x[::2], comm=comm)
    with pytest.raises(fk.InvalidArgumentError):
        fk.broadcast(x, root=1, comm=comm)
    with pytest.raises(fk.InvalidArgumentError):
        fk.broadcast(None, comm=comm)  # neither send nor recv
    with pytest.raises(fk.NullPointerError):
        fk.broadcast(None, np.zeros(6), root=0, comm=comm)  # the root needs send
    ro = np.zeros(6)
    ro.flags.writeable = False
    with pytest.raises(fk.InvalidArgumentError):
        fk.all_reduce(x, ro, comm=comm)
    z = np.zeros(8)
    with pytest.raises(fk.AliasingError):
        fk.all_reduce(z[0:6], z[2:8], comm=comm)
    comm.close()
    with pytest.raises(fk.InvalidArgumentError):
        fk.all_reduce(x, comm=comm)


# ---------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------


@cuda_only
def test_pinned_to_device_copy_cuda(rng):
    ctx = fk.default_context("cuda:0")
    base = ctx.memory_stats()
    n = 1 << 16
    x = rng.standard_normal(n).astype(np.float32)
    p = fk.pinned_empty((n,), "float32", ctx)
    assert p.is_pinned and p.device == "cuda_host:0"
    assert p.__dlpack_device__() == (3, 0)
    s = ctx.memory_stats()
    assert s.pinned_bytes == base.pinned_bytes + 4 * n
    assert s.pinned_allocations == base.pinned_allocations + 1
    p.copy_from(x)
    np.testing.assert_array_equal(p.to_numpy(), x)
    d = torch.empty(n, device="cuda", dtype=torch.float32)
    fk.copy_buffer(d, p)  # on torch's current stream
    q = fk.pinned_empty((n,), "float32", ctx)
    fk.copy_buffer(q, d)
    torch.cuda.current_stream().synchronize()
    np.testing.assert_array_equal(d.cpu().numpy(), x)
    np.testing.assert_array_equal(q.to_numpy(), x)
    np.testing.assert_array_equal(np.from_dlpack(q), x)
    with pytest.raises(fk.DeviceMismatchError):
        fk.relu(p)  # ops refuse pinned buffers
    # device buffer -> pinned through Buffer.copy_from as well
    p.copy_from(d)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(p.to_numpy(), x)
    p.close()
    q.close()
    assert ctx.memory_stats().pinned_allocations == base.pinned_allocations


@cuda_only
def test_memory_stats_cuda():
    ctx = fk.default_context("cuda:0")
    s0 = ctx.memory_stats()
    b = fk.Buffer.empty(ctx, (1 << 20,), "float32")
    s1 = ctx.memory_stats()
    assert s1.allocated_bytes == s0.allocated_bytes + (4 << 20)
    assert s1.reserved_bytes >= s1.pool_used_bytes >= 4 << 20
    b.close()
    torch.cuda.synchronize()
    ctx.set_release_threshold(0)
    ctx.trim(0)
    ctx.set_release_threshold(None)
    assert ctx.memory_stats().allocated_bytes == s0.allocated_bytes


@cuda_only
def test_events_time_fusekit_op_on_torch_stream():
    x = torch.randn(1 << 22, device="cuda")
    ref = torch.relu(x)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        start, end = fk.Event("cuda"), fk.Event("cuda")
        start.record()  # torch's current stream (side)
        fk.relu(x, out=x)  # also on side
        end.record(side)
        ms = start.elapsed_ms(end)
    assert ms >= 0.0
    assert end.query()
    torch.testing.assert_close(x, ref)
    # cross-stream ordering: a fusekit stream waits for torch's stream
    y = torch.randn(1 << 20, device="cuda")
    ev = fk.Event("cuda")
    with fk.Stream("cuda") as s:
        torch.cuda.current_stream().wait_stream(torch.cuda.current_stream())
        ev.record()  # torch's current stream
        s.wait_event(ev)
        fk.neg(y, out=y, stream=s)
        s.synchronize()
    assert torch.isfinite(y).all()


@cuda_only
def test_collectives_cuda_single_rank():
    try:
        (c,) = fk.Comm.init_all(["cuda:0"])
    except fk.LibraryNotFoundError:
        pytest.skip("NCCL is not installed")
    x = torch.arange(8, device="cuda", dtype=torch.float32)
    torch.testing.assert_close(fk.all_reduce(x, comm=c), x)
    torch.testing.assert_close(fk.all_gather(x, comm=c), x)
    torch.cuda.synchronize()
    c.close()
