//! Runtime entry points: memory statistics and the pool, pinned buffers, copies
//! between buffers, peer access, events, communicators and collectives.

use super::{
    buffer_ref, check_out, comm_ref, context_ref, destroy, event_ref, fk_buffer, fk_comm,
    fk_context, fk_event, fk_stream, guard, ndim_arg, new_buffer, new_comm, new_event, slice_in,
    stream_or_default, stream_ref, write_out,
};
use crate::buffer::Buffer;
use crate::comm::{Comm, ReduceOp};
use crate::dtype::{DType, fk_dtype};
use crate::error::{FK_ERROR_INVALID_ARGUMENT, FK_ERROR_NULL_POINTER, Result, fk_status};
use crate::event::Event;

/// Size in bytes of a communicator's unique id (`fk_comm_unique_id`).
pub const FK_COMM_ID_BYTES: usize = 128;

/// Reduction selector of `fk_all_reduce` and `fk_reduce_scatter` (`int32_t`).
pub type fk_reduce_op = i32;
/// Sum.
pub const FK_REDUCE_SUM: fk_reduce_op = 0;
/// Product (real dtypes only).
pub const FK_REDUCE_PROD: fk_reduce_op = 1;
/// Maximum (real dtypes only).
pub const FK_REDUCE_MAX: fk_reduce_op = 2;
/// Minimum (real dtypes only).
pub const FK_REDUCE_MIN: fk_reduce_op = 3;

/// Memory statistics of a context (`fk_context_memory_stats`). The struct may grow
/// in later minor versions (fields are only appended): set `size` to
/// `sizeof(fk_memory_stats)` before the call; the library fills the fields that fit
/// in `size` bytes and leaves `size` and anything beyond its own fields untouched.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fk_memory_stats {
    /// Set by the caller: `sizeof(fk_memory_stats)`.
    pub size: usize,
    /// Bytes of the context's live owned buffers (their sizes as requested): device
    /// memory on CUDA, host memory on the CPU. Pinned buffers are counted apart.
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` since the context was created.
    pub peak_allocated_bytes: u64,
    /// Device memory the context's pool holds (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`),
    /// in use or cached for reuse; equals `allocated_bytes` on the CPU.
    pub reserved_bytes: u64,
    /// Highest `reserved_bytes` (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`).
    pub peak_reserved_bytes: u64,
    /// Pool memory backing live allocations, with the pool's rounding
    /// (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`); equals `allocated_bytes` on the CPU.
    pub pool_used_bytes: u64,
    /// Number of live owned buffers (pinned ones not included).
    pub live_allocations: u64,
    /// Free memory of the device (`cuMemGetInfo`; available host memory on the CPU).
    pub device_free_bytes: u64,
    /// Total memory of the device (host memory on the CPU).
    pub device_total_bytes: u64,
    /// The pool's release threshold (`fk_context_set_release_threshold`).
    pub release_threshold_bytes: u64,
    /// Bytes of live pinned host buffers made through this context.
    pub pinned_bytes: u64,
    /// Number of live pinned host buffers made through this context.
    pub pinned_allocations: u64,
}

// ------------------------------------------------------------------ memory

/// Fills `*stats` with the context's memory statistics. Set `stats->size` to
/// `sizeof(fk_memory_stats)` first: only the fields that fit in `size` bytes are
/// written (so a caller built against an older, shorter struct stays safe).
/// Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_INVALID_ARGUMENT` (a bad `ctx` handle,
/// or `size` too small to hold any field), `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_context_memory_stats(
    ctx: *const fk_context,
    stats: *mut fk_memory_stats,
) -> fk_status {
    guard("fk_context_memory_stats", || {
        let c = unsafe { context_ref(ctx, "ctx") }?;
        crate::ensure!(!stats.is_null(), FK_ERROR_NULL_POINTER, "stats is NULL");
        // SAFETY: the caller's struct starts with `size_t size`.
        let size = unsafe { (stats as *const usize).read() };
        let first = std::mem::offset_of!(fk_memory_stats, allocated_bytes);
        crate::ensure!(
            size >= first + 8,
            FK_ERROR_INVALID_ARGUMENT,
            "stats->size = {size} holds no field; set it to sizeof(fk_memory_stats) = {}",
            std::mem::size_of::<fk_memory_stats>()
        );
        let m = c.memory_stats()?;
        let full = fk_memory_stats {
            size,
            allocated_bytes: m.allocated,
            peak_allocated_bytes: m.peak_allocated,
            reserved_bytes: m.reserved,
            peak_reserved_bytes: m.peak_reserved,
            pool_used_bytes: m.pool_used,
            live_allocations: m.live_allocations,
            device_free_bytes: m.device_free,
            device_total_bytes: m.device_total,
            release_threshold_bytes: m.release_threshold,
            pinned_bytes: m.pinned,
            pinned_allocations: m.pinned_allocations,
        };
        let end = size.min(std::mem::size_of::<fk_memory_stats>());
        let end = first + (end - first) / 8 * 8;
        // SAFETY: the caller's struct holds `size` bytes; whole u64 fields from
        // `first` to `end` are copied.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&full as *const fk_memory_stats as *const u8).add(first),
                (stats as *mut u8).add(first),
                end - first,
            )
        };
        Ok(())
    })
}

/// Sets the release threshold of the context's memory pool: the bytes the pool
/// keeps reserved at a synchronisation point (stream, event or context
/// synchronise) before it returns memory to the device. It starts at `UINT64_MAX`
/// (keep everything: freed memory is reused at once, as PyTorch's caching allocator
/// does); 0 returns all unused memory at every synchronisation. On the CPU the value
/// is stored and reported, with no effect. Returns `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_INVALID_ARGUMENT` (bad handle), `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_context_set_release_threshold(
    ctx: *const fk_context,
    bytes: u64,
) -> fk_status {
    guard("fk_context_set_release_threshold", || {
        unsafe { context_ref(ctx, "ctx") }?.set_release_threshold(bytes)
    })
}

/// Returns unused memory of the context's pool to the device until at most
/// `keep_bytes` stay reserved (`cuMemPoolTrimTo`). Memory behind live buffers stays,
/// and so does memory whose free is still queued on a stream: synchronise first to
/// release everything. No-op on the CPU. Returns `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_INVALID_ARGUMENT` (bad handle), `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_context_trim(ctx: *const fk_context, keep_bytes: u64) -> fk_status {
    guard("fk_context_trim", || {
        unsafe { context_ref(ctx, "ctx") }?.trim(keep_bytes)
    })
}

// ------------------------------------------------------------------ pinned buffers, copies

/// Allocates an uninitialised, contiguous buffer of page-locked (pinned) host
/// memory (`cuMemHostAlloc`, portable: pinned for every CUDA context of the
/// process), freed by `fk_buffer_destroy` (`cuMemFreeHost`, after the copies that
/// use it have finished: synchronise first). Its memory is host memory:
/// `fk_buffer_data` gives a host pointer the caller may read and write directly,
/// and `fk_buffer_device` reports `FK_DEVICE_CUDA_HOST` with the context's ordinal.
/// Pinned buffers are endpoints of copies (`fk_buffer_copy`,
/// `fk_buffer_copy_{from,to}_host`), which they make truly asynchronous; ops refuse
/// them (`FK_ERROR_DEVICE_MISMATCH`). On a CPU context this is an ordinary host
/// buffer (as `fk_buffer_create`, reported as `FK_DEVICE_CPU`), so the same program
/// runs on either backend. Returns `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_INVALID_ARGUMENT` (dtype, ndim, negative extent, bad handle),
/// `FK_ERROR_OUT_OF_MEMORY` (requested and free host bytes in the message),
/// `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_create_pinned(
    ctx: *const fk_context,
    dtype: fk_dtype,
    ndim: i32,
    shape: *const i64,
    out: *mut *mut fk_buffer,
) -> fk_status {
    guard("fk_buffer_create_pinned", || {
        check_out(out, "out")?;
        let c = unsafe { context_ref(ctx, "ctx") }?;
        let d = DType::from_abi(dtype, "dtype")?;
        let nd = ndim_arg(ndim)?;
        let shape = unsafe { slice_in(shape, nd, "shape") }?;
        let b = Buffer::alloc_pinned(c, d, shape)?;
        unsafe { write_out(out, "out", new_buffer(b)) }
    })
}

/// Copies `src` into `dst`, queued on `stream` (asynchronous: synchronise the stream,
/// or wait on an event recorded after it, before reading `dst` on another stream or
/// on the host). Both buffers must be contiguous with the same dtype and number of
/// elements (shapes may differ). Any pair of buffers works:
///
/// - CPU and CPU (contexts of `FK_DEVICE_CPU`): `stream` must be NULL or a CPU
///   stream; the copy runs inside the call.
/// - host (a CPU buffer, or a pinned buffer) and device, device and device on one
///   GPU, pinned and pinned: `cuMemcpyAsync` on a stream of the device side (of
///   either pinned side when no device memory takes part). A CPU buffer is pageable
///   memory, which makes the copy synchronous with the host (as in CUDA); a pinned
///   buffer makes it truly asynchronous.
/// - device memory of two GPUs: `cuMemcpyPeerAsync` on a stream of either device.
///   When `fk_device_can_access_peer` says yes both ways, the first such copy
///   enables peer access between the two devices (and their contexts' pools) and
///   the copy goes directly over NVLink or PCIe; otherwise the driver stages it
///   through host memory. Order work on the other device with events.
///
/// `stream` NULL means the legacy default stream of `dst`'s device (of `src`'s when
/// only `src` is on a GPU). The same buffer as `dst` and `src` is a no-op.
/// Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_DTYPE_MISMATCH`,
/// `FK_ERROR_SHAPE_MISMATCH` (element counts differ), `FK_ERROR_UNSUPPORTED`
/// (a non-contiguous buffer), `FK_ERROR_INVALID_ARGUMENT` (read-only `dst`, bad
/// handle), `FK_ERROR_ALIASING` (partial overlap), `FK_ERROR_DEVICE_MISMATCH`
/// (`stream` on a device the copy cannot run on), `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_copy(
    dst: *const fk_buffer,
    src: *const fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_buffer_copy", || {
        let d = unsafe { buffer_ref(dst, "dst") }?;
        let s = unsafe { buffer_ref(src, "src") }?;
        let st = if stream.is_null() {
            None
        } else {
            Some(unsafe { stream_ref(stream, "stream") }?)
        };
        crate::buffer::copy(d, s, st)
    })
}

/// Whether CUDA device `device` can read and write memory of device `peer` directly
/// (`cuDeviceCanAccessPeer`; 1 when `device == peer`), written to `*out` as 1 or 0.
/// Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_INVALID_ARGUMENT` (an ordinal outside
/// `0..fk_device_count`), `FK_ERROR_CUDA_UNAVAILABLE` (no driver or GPU),
/// `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_device_can_access_peer(
    device: i32,
    peer: i32,
    out: *mut i32,
) -> fk_status {
    guard("fk_device_can_access_peer", || {
        crate::ensure!(!out.is_null(), FK_ERROR_NULL_POINTER, "out is NULL");
        let n = crate::gpu::device_count()?;
        for (v, name) in [(device, "device"), (peer, "peer")] {
            crate::ensure!(
                (0..n).contains(&v),
                FK_ERROR_INVALID_ARGUMENT,
                "{name} = {v} but {n} CUDA device(s) are present"
            );
        }
        let yes = crate::gpu::runtime::can_access_peer(device as usize, peer as usize)?;
        unsafe { write_out(out, "out", yes as i32) }
    })
}

// ------------------------------------------------------------------ events

/// Creates an event on the context's device (a CUDA event with timing; on the CPU
/// a host timestamp taken when recorded). Release with `fk_event_destroy`.
/// Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_INVALID_ARGUMENT` (bad handle),
/// `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_event_create(
    ctx: *const fk_context,
    out: *mut *mut fk_event,
) -> fk_status {
    guard("fk_event_create", || {
        check_out(out, "out")?;
        let c = unsafe { context_ref(ctx, "ctx") }?;
        let e = Event::create(c)?;
        unsafe { write_out(out, "out", new_event(e)) }
    })
}

/// Releases an event (NULL is a no-op); work that waits on it is unaffected.
/// Returns `FK_ERROR_INVALID_ARGUMENT` for a handle that is not a live event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_event_destroy(event: *mut fk_event) -> fk_status {
    guard("fk_event_destroy", || unsafe { destroy(event) })
}

/// The event handle `event`, then `stream` (NULL: the default stream of the
/// event's device).
unsafe fn event_and_stream<'a>(
    event: *const fk_event,
    stream: *const fk_stream,
) -> Result<(&'a Event, std::sync::Arc<crate::stream::Stream>)> {
    let e = unsafe { event_ref(event, "event") }?;
    let s = unsafe { stream_or_default(stream, &e.ctx) }?;
    Ok((e, s))
}

/// Records `event` on `stream` (NULL = the default stream of the event's device):
/// it completes when the work queued there before it has completed. On the CPU it
/// takes the host time now (every op before it has finished). Recording again
/// moves the event. Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_INVALID_ARGUMENT`
/// (bad handle), `FK_ERROR_DEVICE_MISMATCH` (a stream of another device),
/// `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_event_record(
    event: *const fk_event,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_event_record", || {
        let (e, s) = unsafe { event_and_stream(event, stream) }?;
        e.record(&s)
    })
}

/// Makes work queued on `stream` after this call wait until `event` completes,
/// without blocking the host (`cuStreamWaitEvent`). The event may belong to another
/// device (cross-device ordering). An event never recorded is complete. A CPU
/// stream waiting on a CUDA event blocks the host until the event completes; a CUDA
/// stream waiting on a CPU event does nothing (it is complete). `stream` NULL is the
/// legacy default stream of the event's device. Returns `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_INVALID_ARGUMENT` (bad handle), `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_stream_wait_event(
    stream: *const fk_stream,
    event: *const fk_event,
) -> fk_status {
    guard("fk_stream_wait_event", || {
        let (e, s) = unsafe { event_and_stream(event, stream) }?;
        e.wait_on(&s)
    })
}

/// Blocks the host until `event` completes (at once on the CPU, or when the event
/// was never recorded). A kernel fault queued before it surfaces here.
/// Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_INVALID_ARGUMENT` (bad handle),
/// `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_event_synchronize(event: *const fk_event) -> fk_status {
    guard("fk_event_synchronize", || {
        unsafe { event_ref(event, "event") }?.synchronize()
    })
}

/// Writes 1 to `*done` when `event` has completed (or was never recorded), else 0;
/// never blocks. Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_INVALID_ARGUMENT` (bad
/// handle), `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_event_query(event: *const fk_event, done: *mut i32) -> fk_status {
    guard("fk_event_query", || {
        let e = unsafe { event_ref(event, "event") }?;
        crate::ensure!(!done.is_null(), FK_ERROR_NULL_POINTER, "done is NULL");
        let d = e.query()?;
        unsafe { write_out(done, "done", d as i32) }
    })
}

/// Writes the time from `start` to `end` in milliseconds to `*ms` (CUDA: GPU time
/// between the two records, resolution about 0.5 us; CPU: host time between the two
/// `fk_event_record` calls, so events recorded in order give `*ms >= 0`). Blocks
/// until `end` has completed. Returns `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_INVALID_ARGUMENT` (an event not yet recorded, bad handle),
/// `FK_ERROR_DEVICE_MISMATCH` (events of different devices), `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_event_elapsed_ms(
    start: *const fk_event,
    end: *const fk_event,
    ms: *mut f32,
) -> fk_status {
    guard("fk_event_elapsed_ms", || {
        let s = unsafe { event_ref(start, "start") }?;
        let e = unsafe { event_ref(end, "end") }?;
        crate::ensure!(!ms.is_null(), FK_ERROR_NULL_POINTER, "ms is NULL");
        let v = Event::elapsed_ms(s, e)?;
        unsafe { write_out(ms, "ms", v) }
    })
}

// ------------------------------------------------------------------ communicators

/// Writes a new unique id (`FK_COMM_ID_BYTES` bytes, NCCL's `ncclGetUniqueId`) to
/// `out`, for `fk_comm_init_rank`. Pass the same bytes to every rank (threads, or
/// processes through any channel). Needs NCCL even when only CPU communicators are
/// made (the CPU ignores the id's contents). Returns `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_LIBRARY_NOT_FOUND` (no libnccl.so.2: the message says what to install:
/// `pip install nvidia-nccl-cu13` or the system package libnccl2; `FK_NCCL_PATH`
/// names the file), `FK_ERROR_CUDA` (NCCL failed; its message is included).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_comm_unique_id(out: *mut u8) -> fk_status {
    guard("fk_comm_unique_id", || {
        crate::ensure!(!out.is_null(), FK_ERROR_NULL_POINTER, "out is NULL");
        let id = Comm::unique_id()?;
        // SAFETY: the caller provides FK_COMM_ID_BYTES writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(id.as_ptr(), out, FK_COMM_ID_BYTES) };
        Ok(())
    })
}

/// Creates rank `rank` (`0 <= rank < nranks`) of a communicator of `nranks` ranks
/// from `id` (`FK_COMM_ID_BYTES` bytes from `fk_comm_unique_id`), on `ctx`'s device.
/// On CUDA (`ncclCommInitRank`) this blocks until all `nranks` ranks have called it
/// with the same id; to create several ranks from one thread, wrap the calls in
/// `fk_comm_group_start` / `fk_comm_group_end`. A CPU context supports `nranks == 1`
/// only (a single-rank communicator whose collectives are copies; `id` is not
/// read beyond the NULL check). Release with `fk_comm_destroy`.
/// Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_INVALID_ARGUMENT` (nranks < 1, rank
/// out of range, bad handle, NCCL's invalid-usage errors), `FK_ERROR_UNSUPPORTED`
/// (nranks > 1 on a CPU context), `FK_ERROR_LIBRARY_NOT_FOUND` (no NCCL),
/// `FK_ERROR_CUDA` (NCCL failed; its message is included).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_comm_init_rank(
    ctx: *const fk_context,
    nranks: i32,
    id: *const u8,
    rank: i32,
    out: *mut *mut fk_comm,
) -> fk_status {
    guard("fk_comm_init_rank", || {
        check_out(out, "out")?;
        let c = unsafe { context_ref(ctx, "ctx") }?;
        crate::ensure!(!id.is_null(), FK_ERROR_NULL_POINTER, "id is NULL");
        let mut bytes = [0u8; FK_COMM_ID_BYTES];
        // SAFETY: the caller provides FK_COMM_ID_BYTES readable bytes.
        unsafe { std::ptr::copy_nonoverlapping(id, bytes.as_mut_ptr(), FK_COMM_ID_BYTES) };
        let comm = Comm::init_rank(c, nranks, &bytes, rank)?;
        unsafe { write_out(out, "out", new_comm(comm)) }
    })
}

/// Creates a communicator of `n` ranks in this process, rank `i` on `ctxs[i]`'s
/// device, and writes the `n` handles to `comms_out[0..n]` (nothing is written on
/// failure). CUDA contexts must be on `n` distinct devices (`ncclCommInitAll`); a
/// single CPU context gives a single-rank communicator. Drive the ranks from one
/// thread inside `fk_comm_group_start` / `fk_comm_group_end`, or one thread each.
/// Release each with `fk_comm_destroy`. Returns `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_INVALID_ARGUMENT` (n < 1, two contexts on one device, bad handles),
/// `FK_ERROR_DEVICE_MISMATCH` (CPU and CUDA contexts mixed), `FK_ERROR_UNSUPPORTED`
/// (more than one CPU context), `FK_ERROR_LIBRARY_NOT_FOUND` (no NCCL),
/// `FK_ERROR_CUDA` (NCCL failed; its message is included).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_comm_init_all(
    ctxs: *const *const fk_context,
    n: i32,
    comms_out: *mut *mut fk_comm,
) -> fk_status {
    guard("fk_comm_init_all", || {
        crate::ensure!(
            n >= 1,
            FK_ERROR_INVALID_ARGUMENT,
            "n = {n}: at least one context is needed"
        );
        crate::ensure!(
            !comms_out.is_null(),
            FK_ERROR_NULL_POINTER,
            "comms_out is NULL"
        );
        let ptrs = unsafe { slice_in(ctxs, n as usize, "ctxs") }?;
        let mut list = Vec::with_capacity(ptrs.len());
        for (i, p) in ptrs.iter().enumerate() {
            list.push(unsafe { context_ref(*p, &format!("ctxs[{i}]")) }?.clone());
        }
        let comms = Comm::init_all(&list)?;
        for (i, c) in comms.into_iter().enumerate() {
            // SAFETY: the caller provides n writable slots.
            unsafe { comms_out.add(i).write(new_comm(c)) };
        }
        Ok(())
    })
}

/// Releases a communicator (NULL is a no-op; `ncclCommDestroy` on CUDA). Destroy
/// every rank of a clique, after the collectives that use it have completed.
/// Returns `FK_ERROR_INVALID_ARGUMENT` for a handle that is not a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_comm_destroy(comm: *mut fk_comm) -> fk_status {
    guard("fk_comm_destroy", || unsafe { destroy(comm) })
}

/// This communicator's rank (0-based). Returns `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_INVALID_ARGUMENT` (bad handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_comm_rank(comm: *const fk_comm, out: *mut i32) -> fk_status {
    guard("fk_comm_rank", || {
        let c = unsafe { comm_ref(comm, "comm") }?;
        unsafe { write_out(out, "out", c.rank) }
    })
}

/// The number of ranks of the communicator's clique. Returns
/// `FK_ERROR_NULL_POINTER`, `FK_ERROR_INVALID_ARGUMENT` (bad handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_comm_size(comm: *const fk_comm, out: *mut i32) -> fk_status {
    guard("fk_comm_size", || {
        let c = unsafe { comm_ref(comm, "comm") }?;
        unsafe { write_out(out, "out", c.nranks) }
    })
}

/// Starts a group of communicator calls on this thread (`ncclGroupStart`): the
/// collectives (or `fk_comm_init_rank` calls) until the matching
/// `fk_comm_group_end` are issued together, which one thread driving several
/// devices needs to avoid a deadlock. Groups nest. Without NCCL (CPU
/// communicators only) this just counts. Returns `FK_ERROR_CUDA` (NCCL failed).
#[unsafe(no_mangle)]
pub extern "C" fn fk_comm_group_start() -> fk_status {
    guard("fk_comm_group_start", crate::comm::group_start)
}

/// Ends the innermost group opened on this thread (`ncclGroupEnd`); when the
/// outermost group ends the grouped collectives are queued on their streams (not
/// completed) and grouped initialisations are complete. Returns
/// `FK_ERROR_INVALID_ARGUMENT` (no open group on this thread), `FK_ERROR_CUDA`
/// (NCCL failed, e.g. a grouped call's error).
#[unsafe(no_mangle)]
pub extern "C" fn fk_comm_group_end() -> fk_status {
    guard("fk_comm_group_end", crate::comm::group_end)
}

unsafe fn collective_args<'a>(
    comm: *const fk_comm,
    recv: *const fk_buffer,
    stream: *const fk_stream,
) -> Result<(&'a Comm, &'a Buffer, std::sync::Arc<crate::stream::Stream>)> {
    let c = unsafe { comm_ref(comm, "comm") }?;
    let r = unsafe { buffer_ref(recv, "recv") }?;
    let s = unsafe { stream_or_default(stream, &c.ctx) }?;
    Ok((c, r, s))
}

/// All-reduce: every rank's `recv` becomes the element-wise `op` (`FK_REDUCE_SUM`,
/// `_PROD`, `_MAX`, `_MIN`) over all ranks' `send`. `send` and `recv` are contiguous
/// buffers of the communicator's device with the same dtype and number of elements;
/// in place when `send == recv`. dtypes f16, bf16, f32, f64; complex64/complex128
/// with `FK_REDUCE_SUM` only (summed as pairs of reals). Queued on `stream` (NULL =
/// the default stream of the communicator's device); inside a group the call only
/// records the operation. Every rank must call it. Returns `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_INVALID_ARGUMENT` (op, read-only recv, bad handles),
/// `FK_ERROR_DTYPE_MISMATCH`, `FK_ERROR_UNSUPPORTED_DTYPE` (complex with a
/// reduction other than sum), `FK_ERROR_SHAPE_MISMATCH` (element counts),
/// `FK_ERROR_UNSUPPORTED` (non-contiguous), `FK_ERROR_DEVICE_MISMATCH` (a buffer
/// or the stream on another device, or a pinned buffer), `FK_ERROR_ALIASING`
/// (partial overlap), `FK_ERROR_LIBRARY_NOT_FOUND`, `FK_ERROR_CUDA` (NCCL failed).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_all_reduce(
    comm: *const fk_comm,
    send: *const fk_buffer,
    recv: *const fk_buffer,
    op: fk_reduce_op,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_all_reduce", || {
        let (c, r, s) = unsafe { collective_args(comm, recv, stream) }?;
        let sb = unsafe { buffer_ref(send, "send") }?;
        let op = ReduceOp::from_abi(op, "op")?;
        c.all_reduce(sb, r, op, &s)
    })
}

/// Broadcast: every rank's `recv` becomes the `send` of rank `root`. `send` is read
/// on the root only and may be NULL on the other ranks; in place when
/// `send == recv`. Same buffer rules as `fk_all_reduce` (equal element counts; any
/// dtype, complex included). Returns `FK_ERROR_NULL_POINTER` (also `send` NULL on
/// the root), `FK_ERROR_INVALID_ARGUMENT` (root outside `0..nranks`, read-only
/// recv, bad handles), `FK_ERROR_DTYPE_MISMATCH`, `FK_ERROR_SHAPE_MISMATCH`,
/// `FK_ERROR_UNSUPPORTED`, `FK_ERROR_DEVICE_MISMATCH`, `FK_ERROR_ALIASING`,
/// `FK_ERROR_LIBRARY_NOT_FOUND`, `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_broadcast(
    comm: *const fk_comm,
    send: *const fk_buffer,
    recv: *const fk_buffer,
    root: i32,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_broadcast", || {
        let (c, r, s) = unsafe { collective_args(comm, recv, stream) }?;
        let sb = if send.is_null() {
            None
        } else {
            Some(unsafe { buffer_ref(send, "send") }?)
        };
        c.broadcast(sb, r, root, &s)
    })
}

/// All-gather: every rank's `recv` (nranks times `send`'s elements) becomes the
/// concatenation of all ranks' `send` in rank order; in place when `send` is the
/// rank's slice of `recv` (a wrap of `recv`'s memory at offset `rank * n`). Same
/// buffer rules as `fk_all_reduce` (any dtype). Returns `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_INVALID_ARGUMENT`, `FK_ERROR_DTYPE_MISMATCH`,
/// `FK_ERROR_SHAPE_MISMATCH` (recv is not nranks times send),
/// `FK_ERROR_UNSUPPORTED`, `FK_ERROR_DEVICE_MISMATCH`, `FK_ERROR_ALIASING`,
/// `FK_ERROR_LIBRARY_NOT_FOUND`, `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_all_gather(
    comm: *const fk_comm,
    send: *const fk_buffer,
    recv: *const fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_all_gather", || {
        let (c, r, s) = unsafe { collective_args(comm, recv, stream) }?;
        let sb = unsafe { buffer_ref(send, "send") }?;
        c.all_gather(sb, r, &s)
    })
}

/// Reduce-scatter: `send` holds nranks times `recv`'s elements; rank `r`'s `recv`
/// becomes slice `r` of the element-wise `op` over all ranks' `send`. In place when
/// `recv` is the rank's slice of `send`. Same dtype rules as `fk_all_reduce`.
/// Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_INVALID_ARGUMENT`,
/// `FK_ERROR_DTYPE_MISMATCH`, `FK_ERROR_UNSUPPORTED_DTYPE`,
/// `FK_ERROR_SHAPE_MISMATCH` (send is not nranks times recv),
/// `FK_ERROR_UNSUPPORTED`, `FK_ERROR_DEVICE_MISMATCH`, `FK_ERROR_ALIASING`,
/// `FK_ERROR_LIBRARY_NOT_FOUND`, `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_reduce_scatter(
    comm: *const fk_comm,
    send: *const fk_buffer,
    recv: *const fk_buffer,
    op: fk_reduce_op,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_reduce_scatter", || {
        let (c, r, s) = unsafe { collective_args(comm, recv, stream) }?;
        let sb = unsafe { buffer_ref(send, "send") }?;
        let op = ReduceOp::from_abi(op, "op")?;
        c.reduce_scatter(sb, r, op, &s)
    })
}
