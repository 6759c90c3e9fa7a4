//! Core entry points: versions, statuses and messages, contexts, streams, buffers,
//! DLPack.

use std::ffi::{c_char, c_void};

use super::{
    buffer_ref, check_out, context_ref, destroy, fk_buffer, fk_context, fk_stream, guard, ndim_arg,
    new_buffer, new_context, new_stream, slice_in, stream_or_default, stream_ref, write_out,
};
use crate::buffer::Buffer;
use crate::context::{Context, fk_device_kind};
use crate::dtype::{DType, fk_dtype};
use crate::error::{
    FK_ERROR_ABI_MISMATCH, FK_ERROR_BUFFER_TOO_SMALL, FK_ERROR_NULL_POINTER, FK_OK, fk_status,
};
use crate::gpu::HostMem;
use crate::stream::Stream;

/// ABI version of this header: `major * 1000 + minor`. A library accepts callers
/// with the same major version and a minor version no newer than its own.
pub const FK_ABI_VERSION: u32 = 1002;

/// Returns the ABI version the library was built with (compare with `FK_ABI_VERSION`).
#[unsafe(no_mangle)]
pub extern "C" fn fk_abi_version() -> u32 {
    FK_ABI_VERSION
}

static VERSION: &str = concat!("fusekit ", env!("CARGO_PKG_VERSION"), "\0");

/// Returns a static, NUL-terminated version string, e.g. `"fusekit 0.1.0"`.
#[unsafe(no_mangle)]
pub extern "C" fn fk_version_string() -> *const c_char {
    VERSION.as_ptr() as *const c_char
}

/// Returns the static name of a status, e.g. `"FK_ERROR_SHAPE_MISMATCH"`
/// (`"FK_UNKNOWN_STATUS"` for values this library does not know).
#[unsafe(no_mangle)]
pub extern "C" fn fk_status_string(status: fk_status) -> *const c_char {
    // Names are ASCII; keep NUL-terminated copies with 'static lifetime.
    static NAMES: std::sync::OnceLock<Vec<(fk_status, std::ffi::CString)>> =
        std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        let mut v: Vec<_> = crate::error::ALL_STATUSES
            .iter()
            .map(|&s| {
                (
                    s,
                    std::ffi::CString::new(crate::error::status_name(s)).unwrap_or_default(),
                )
            })
            .collect();
        v.push((
            i32::MIN,
            std::ffi::CString::new("FK_UNKNOWN_STATUS").unwrap_or_default(),
        ));
        v
    });
    names
        .iter()
        .find(|(s, _)| *s == status)
        .or_else(|| names.last())
        .map(|(_, c)| c.as_ptr())
        .unwrap_or(std::ptr::null())
}

/// Returns this thread's last error message: `"<function>: <cause>"`, naming the
/// argument at fault. Empty when no call on this thread has failed. The pointer
/// stays valid until the next failing fusekit call on this thread; successful calls
/// leave the message unchanged.
#[unsafe(no_mangle)]
pub extern "C" fn fk_last_error_message() -> *const c_char {
    crate::error::last_error_ptr()
}

/// Copies a string into a caller buffer (the shared protocol of every
/// string-returning entry point): `*needed` (optional) receives the size including
/// the terminating NUL; with `buf` NULL nothing else happens; a `capacity` below that
/// writes a truncated, NUL-terminated prefix and returns `FK_ERROR_BUFFER_TOO_SMALL`.
unsafe fn copy_string(s: &str, buf: *mut c_char, capacity: usize, needed: *mut usize) -> fk_status {
    let bytes = s.as_bytes();
    if !needed.is_null() {
        // SAFETY: caller-provided out-parameter.
        unsafe { *needed = bytes.len() + 1 };
    }
    if buf.is_null() {
        return FK_OK;
    }
    if capacity == 0 {
        return FK_ERROR_BUFFER_TOO_SMALL;
    }
    let n = bytes.len().min(capacity - 1);
    // SAFETY: buf holds `capacity` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    if n < bytes.len() {
        FK_ERROR_BUFFER_TOO_SMALL
    } else {
        FK_OK
    }
}

/// Copies this thread's last error message into `buf` (`capacity` bytes).
/// `needed` (optional) receives the size including the NUL. With `buf` NULL this is
/// a size query and returns `FK_OK`. Returns `FK_ERROR_BUFFER_TOO_SMALL` (after
/// writing a truncated, NUL-terminated prefix) when `capacity` is too small. This
/// call never changes the last message.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_last_error_message_copy(
    buf: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> fk_status {
    let msg = crate::error::last_error();
    // SAFETY: forwarded caller pointers.
    unsafe { copy_string(&msg, buf, capacity, needed) }
}

/// Size in bytes of one element of `dtype`.
/// Returns `FK_ERROR_INVALID_ARGUMENT` for an unknown dtype, `FK_ERROR_NULL_POINTER`
/// when `out` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_dtype_size(dtype: fk_dtype, out: *mut usize) -> fk_status {
    guard("fk_dtype_size", || {
        let d = DType::from_abi(dtype, "dtype")?;
        unsafe { write_out(out, "out", d.size()) }
    })
}

/// Number of CUDA devices usable by fusekit; 0 (and `FK_OK`) when there is no
/// driver or no GPU. `out` must not be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_device_count(out: *mut i32) -> fk_status {
    guard("fk_device_count", || {
        let n = crate::gpu::device_count().unwrap_or(0);
        unsafe { write_out(out, "out", n) }
    })
}

// ------------------------------------------------------------------ contexts

/// Creates a context on a device.
///
/// - `abi_version`: pass `FK_ABI_VERSION`; a different major version, or a minor
///   version newer than the library's, returns `FK_ERROR_ABI_MISMATCH`.
/// - `kind`: `FK_DEVICE_CPU`, `FK_DEVICE_CUDA` (device `ordinal`) or `FK_DEVICE_AUTO`
///   (CUDA device `ordinal` when a driver and GPU are usable, else the CPU).
/// - `out`: receives the new context; release it with `fk_context_destroy`.
///
/// A CUDA context retains the device's primary context (the one the CUDA runtime
/// and PyTorch use); fusekit never creates its own CUDA context.
/// Returns `FK_ERROR_INVALID_ARGUMENT` (unknown kind, bad ordinal),
/// `FK_ERROR_CUDA_UNAVAILABLE` (no driver or no GPU for `FK_DEVICE_CUDA`),
/// `FK_ERROR_CUDA`, `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_context_create(
    abi_version: u32,
    kind: fk_device_kind,
    ordinal: i32,
    out: *mut *mut fk_context,
) -> fk_status {
    guard("fk_context_create", || {
        check_out(out, "out")?;
        crate::ensure!(
            abi_version / 1000 == FK_ABI_VERSION / 1000 && abi_version <= FK_ABI_VERSION,
            FK_ERROR_ABI_MISMATCH,
            "the caller was built for ABI version {abi_version} but this library implements {FK_ABI_VERSION} (same major version and an older or equal minor version required)"
        );
        let ctx = Context::create(kind, ordinal)?;
        unsafe { write_out(out, "out", new_context(ctx)) }
    })
}

/// Releases a context handle (NULL is a no-op). Streams and buffers made from it
/// stay valid: the device runtime lives until the last of them is destroyed. When
/// the last reference to a CUDA context goes, fusekit waits for the device's queued
/// work before unloading its kernel modules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_context_destroy(ctx: *mut fk_context) -> fk_status {
    guard("fk_context_destroy", || unsafe { destroy(ctx) })
}

/// Reports the context's device: `kind` receives `FK_DEVICE_CPU` or
/// `FK_DEVICE_CUDA`, `ordinal` the CUDA ordinal (0 on the CPU). Either out-pointer
/// may be NULL. Returns `FK_ERROR_NULL_POINTER` when `ctx` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_context_device(
    ctx: *const fk_context,
    kind: *mut fk_device_kind,
    ordinal: *mut i32,
) -> fk_status {
    guard("fk_context_device", || {
        let c = unsafe { context_ref(ctx, "ctx") }?;
        if !kind.is_null() {
            unsafe { *kind = c.device.kind_abi() };
        }
        if !ordinal.is_null() {
            unsafe { *ordinal = c.device.ordinal() as i32 };
        }
        Ok(())
    })
}

/// Copies the device's name (e.g. `"NVIDIA H100 80GB HBM3"`, or a CPU description)
/// into `buf` with the protocol of `fk_last_error_message_copy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_context_name(
    ctx: *const fk_context,
    buf: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> fk_status {
    let mut name = String::new();
    let s = guard("fk_context_name", || {
        name = unsafe { context_ref(ctx, "ctx") }?.name()?;
        Ok(())
    });
    if s != FK_OK {
        return s;
    }
    let s = unsafe { copy_string(&name, buf, capacity, needed) };
    if s != FK_OK {
        crate::error::set_last_error(&format!(
            "fk_context_name: buf holds {capacity} bytes but the name needs {}",
            name.len() + 1
        ));
    }
    s
}

/// Compute capability of a CUDA context's device (`major`, `minor`, e.g. 9 and 0);
/// 0 and 0 on the CPU. Returns `FK_ERROR_NULL_POINTER` for NULL arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_context_compute_capability(
    ctx: *const fk_context,
    major: *mut i32,
    minor: *mut i32,
) -> fk_status {
    guard("fk_context_compute_capability", || {
        let c = unsafe { context_ref(ctx, "ctx") }?;
        let (a, b) = c.cuda.as_ref().map(|d| d.arch).unwrap_or((0, 0));
        unsafe {
            write_out(major, "major", a)?;
            write_out(minor, "minor", b)
        }
    })
}

/// Free and total memory of the context's device in bytes (host memory for a CPU
/// context). Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_context_memory(
    ctx: *const fk_context,
    free_bytes: *mut u64,
    total_bytes: *mut u64,
) -> fk_status {
    guard("fk_context_memory", || {
        let c = unsafe { context_ref(ctx, "ctx") }?;
        let (f, t) = c.memory_info()?;
        unsafe {
            write_out(free_bytes, "free_bytes", f)?;
            write_out(total_bytes, "total_bytes", t)
        }
    })
}

/// Compiles (or loads from the kernel cache) every kernel module now, so that no
/// later op pays for compilation. No-op on the CPU. Returns
/// `FK_ERROR_LIBRARY_NOT_FOUND` (no libnvrtc or CUDA headers; the message says what
/// to install), `FK_ERROR_KERNEL_COMPILE`, `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_context_warmup(ctx: *const fk_context) -> fk_status {
    guard("fk_context_warmup", || {
        unsafe { context_ref(ctx, "ctx") }?.warmup(crate::cuda::modules())
    })
}

// ------------------------------------------------------------------ streams

/// Creates a stream owned by fusekit (a non-blocking CUDA stream; on the CPU, a
/// queue that runs each op to completion inside its call). Release with
/// `fk_stream_destroy`. Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_stream_create(
    ctx: *const fk_context,
    out: *mut *mut fk_stream,
) -> fk_status {
    guard("fk_stream_create", || {
        check_out(out, "out")?;
        let c = unsafe { context_ref(ctx, "ctx") }?;
        let s = Stream::create(c)?;
        unsafe { write_out(out, "out", new_stream(s)) }
    })
}

/// Wraps a caller's `CUstream` / `cudaStream_t` (NULL = the legacy default stream)
/// without taking ownership: fusekit never destroys it, and it must outlive the
/// handle and every buffer allocated on it. Ops queued on it order with the
/// caller's own work (e.g. `torch.cuda.current_stream().cuda_stream`).
/// Returns `FK_ERROR_UNSUPPORTED` on a CPU context, `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_stream_wrap(
    ctx: *const fk_context,
    cu_stream: *mut c_void,
    out: *mut *mut fk_stream,
) -> fk_status {
    guard("fk_stream_wrap", || {
        check_out(out, "out")?;
        let c = unsafe { context_ref(ctx, "ctx") }?;
        let s = Stream::wrap(c, cu_stream as usize)?;
        unsafe { write_out(out, "out", new_stream(s)) }
    })
}

/// Releases a stream handle (NULL is a no-op). An owned CUDA stream is destroyed
/// once no buffer allocated on it remains; queued work still completes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_stream_destroy(stream: *mut fk_stream) -> fk_status {
    guard("fk_stream_destroy", || unsafe { destroy(stream) })
}

/// Blocks until all work queued on `stream` has finished. This is where a fault
/// inside a kernel surfaces (`FK_ERROR_CUDA`). Returns `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_stream_synchronize(stream: *const fk_stream) -> fk_status {
    guard("fk_stream_synchronize", || {
        unsafe { stream_ref(stream, "stream") }?.synchronize()
    })
}

/// The raw `CUstream` behind a stream handle (NULL for the legacy default stream
/// and on the CPU). Returns `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_stream_handle(
    stream: *const fk_stream,
    out: *mut *mut c_void,
) -> fk_status {
    guard("fk_stream_handle", || {
        let s = unsafe { stream_ref(stream, "stream") }?;
        unsafe { write_out(out, "out", s.raw as *mut c_void) }
    })
}

// ------------------------------------------------------------------ buffers

/// Allocates an uninitialised, contiguous buffer of `ndim` dimensions
/// (`0 <= ndim <= 8`; `shape` may be NULL when `ndim` is 0). On CUDA the allocation
/// is stream-ordered on `stream` (NULL = the legacy default stream): usable at once
/// on that stream, on others after synchronising, and freed on that stream by
/// `fk_buffer_destroy`. Returns `FK_ERROR_INVALID_ARGUMENT` (dtype, ndim, negative
/// extent), `FK_ERROR_NULL_POINTER`, `FK_ERROR_DEVICE_MISMATCH` (stream of another
/// device), `FK_ERROR_OUT_OF_MEMORY` (the message gives requested and free bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_create(
    ctx: *const fk_context,
    dtype: fk_dtype,
    ndim: i32,
    shape: *const i64,
    stream: *const fk_stream,
    out: *mut *mut fk_buffer,
) -> fk_status {
    guard("fk_buffer_create", || {
        check_out(out, "out")?;
        let c = unsafe { context_ref(ctx, "ctx") }?;
        let d = DType::from_abi(dtype, "dtype")?;
        let nd = ndim_arg(ndim)?;
        let shape = unsafe { slice_in(shape, nd, "shape") }?;
        let s = unsafe { stream_or_default(stream, c) }?;
        let b = Buffer::alloc(c, d, shape, &s)?;
        unsafe { write_out(out, "out", new_buffer(b)) }
    })
}

/// Wraps caller memory as a buffer without copying; fusekit never frees it and it
/// must outlive the handle. `data` is a host pointer for a CPU context and a device
/// (or managed, or pinned host) pointer for a CUDA context; it may be NULL only for
/// an empty shape. `strides` (optional, NULL = contiguous) are in elements and may
/// be zero or negative. Returns `FK_ERROR_INVALID_ARGUMENT`, `FK_ERROR_NULL_POINTER`,
/// `FK_ERROR_DEVICE_MISMATCH` (a CUDA context given memory CUDA does not know, or
/// memory of another GPU).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_wrap(
    ctx: *const fk_context,
    data: *mut c_void,
    dtype: fk_dtype,
    ndim: i32,
    shape: *const i64,
    strides: *const i64,
    out: *mut *mut fk_buffer,
) -> fk_status {
    guard("fk_buffer_wrap", || {
        check_out(out, "out")?;
        let c = unsafe { context_ref(ctx, "ctx") }?;
        let d = DType::from_abi(dtype, "dtype")?;
        let nd = ndim_arg(ndim)?;
        let shape = unsafe { slice_in(shape, nd, "shape") }?;
        let strides = if strides.is_null() {
            None
        } else {
            Some(unsafe { slice_in(strides, nd, "strides") }?)
        };
        // SAFETY: this entry point's contract (the doc comment above): `data` is
        // memory of the context's device valid for the shape and strides, outliving
        // the handle.
        let b = unsafe { Buffer::wrap(c, data, d, shape, strides) }?;
        unsafe { write_out(out, "out", new_buffer(b)) }
    })
}

/// Releases a buffer handle (NULL is a no-op). Owned CUDA memory is freed
/// stream-ordered on the stream it was allocated on; work queued on other streams
/// that uses it must be ordered before this call. Memory shared with a DLPack
/// export stays alive until the consumer's deleter runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_destroy(buf: *mut fk_buffer) -> fk_status {
    guard("fk_buffer_destroy", || unsafe { destroy(buf) })
}

/// Imports a DLPack tensor: `managed` points to a `DLManagedTensorVersioned`
/// (DLPack 1.x) on the context's device. On success fusekit owns it and calls its
/// deleter once the buffer (and any export of it) is destroyed; on failure the
/// caller keeps ownership. Read-only tensors (flag bit 0) are refused as op outputs.
/// Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_UNSUPPORTED` (DLPack major version),
/// `FK_ERROR_DEVICE_MISMATCH`, `FK_ERROR_UNSUPPORTED_DTYPE`, `FK_ERROR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_from_dlpack(
    ctx: *const fk_context,
    managed: *mut c_void,
    out: *mut *mut fk_buffer,
) -> fk_status {
    guard("fk_buffer_from_dlpack", || {
        check_out(out, "out")?;
        let c = unsafe { context_ref(ctx, "ctx") }?;
        let b = unsafe { crate::dlpack::import(c, managed as *mut _) }?;
        unsafe { write_out(out, "out", new_buffer(b)) }
    })
}

/// Exports a buffer as a new `DLManagedTensorVersioned` (DLPack 1.1) written to
/// `*out`. The consumer must call its `deleter` exactly once; the memory stays valid
/// until then, even after `fk_buffer_destroy`. Returns `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_to_dlpack(
    buf: *const fk_buffer,
    out: *mut *mut c_void,
) -> fk_status {
    guard("fk_buffer_to_dlpack", || {
        check_out(out, "out")?;
        let b = unsafe { buffer_ref(buf, "buf") }?;
        unsafe { write_out(out, "out", crate::dlpack::export(b) as *mut c_void) }
    })
}

/// Copies `bytes` bytes of host memory `src` into a contiguous buffer and waits
/// for the copy. `bytes` must equal the buffer's size. The copy is queued on
/// `stream` (NULL = default), so it follows earlier work there.
/// Returns `FK_ERROR_NULL_POINTER`, `FK_ERROR_SHAPE_MISMATCH` (size),
/// `FK_ERROR_UNSUPPORTED` (non-contiguous buffer), `FK_ERROR_DEVICE_MISMATCH`,
/// `FK_ERROR_INVALID_ARGUMENT` (read-only buffer), `FK_ERROR_CUDA`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_copy_from_host(
    buf: *const fk_buffer,
    src: *const c_void,
    bytes: usize,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_buffer_copy_from_host", || unsafe {
        host_copy(buf, HostMem::Src(src as *const u8), bytes, stream, true)
    })
}

/// As `fk_buffer_copy_from_host`, but only queues the copy on `stream`: `src` must
/// stay valid and unchanged until the stream reaches it (pinned memory makes the
/// copy truly asynchronous; pageable memory is staged by the driver).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_copy_from_host_async(
    buf: *const fk_buffer,
    src: *const c_void,
    bytes: usize,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_buffer_copy_from_host_async", || unsafe {
        host_copy(buf, HostMem::Src(src as *const u8), bytes, stream, false)
    })
}

/// The four host copies: `bytes` bytes between `buf` and host memory, queued on
/// `stream` (NULL = default), waited for when `blocking`.
unsafe fn host_copy(
    buf: *const fk_buffer,
    host: HostMem,
    bytes: usize,
    stream: *const fk_stream,
    blocking: bool,
) -> crate::error::Result<()> {
    let b = unsafe { buffer_ref(buf, "buf") }?;
    let (null, name) = match host {
        HostMem::Src(p) => (p.is_null(), "src"),
        HostMem::Dst(p) => (p.is_null(), "dst"),
    };
    crate::ensure!(!null || bytes == 0, FK_ERROR_NULL_POINTER, "{name} is NULL");
    let s = unsafe { stream_or_default(stream, &b.ctx) }?;
    // SAFETY: the caller of the C entry point guarantees the host memory (its
    // contract).
    unsafe { b.copy_host(host, bytes, &s, blocking) }
}

/// Copies a contiguous buffer into `bytes` bytes of host memory `dst` and waits for
/// the copy (queued after earlier work on `stream`, NULL = default). Returns the
/// statuses of `fk_buffer_copy_from_host`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_copy_to_host(
    buf: *const fk_buffer,
    dst: *mut c_void,
    bytes: usize,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_buffer_copy_to_host", || unsafe {
        host_copy(buf, HostMem::Dst(dst as *mut u8), bytes, stream, true)
    })
}

/// As `fk_buffer_copy_to_host`, but only queues the copy: `dst` is written when the
/// stream reaches it; synchronise before reading it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_copy_to_host_async(
    buf: *const fk_buffer,
    dst: *mut c_void,
    bytes: usize,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_buffer_copy_to_host_async", || unsafe {
        host_copy(buf, HostMem::Dst(dst as *mut u8), bytes, stream, false)
    })
}

/// The buffer's element type. Returns `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_dtype(buf: *const fk_buffer, out: *mut fk_dtype) -> fk_status {
    unsafe { buffer_query("fk_buffer_dtype", buf, out, |b| b.dtype.to_abi()) }
}

/// The buffer's number of dimensions (0..=8). Returns `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_ndim(buf: *const fk_buffer, out: *mut i32) -> fk_status {
    unsafe { buffer_query("fk_buffer_ndim", buf, out, |b| b.shape.len() as i32) }
}

/// Writes the buffer's `ndim` extents to `out` (may be NULL when ndim is 0).
/// Returns `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_shape(buf: *const fk_buffer, out: *mut i64) -> fk_status {
    guard("fk_buffer_shape", || {
        let b = unsafe { buffer_ref(buf, "buf") }?;
        unsafe { write_array(out, &b.shape) }
    })
}

/// Writes the buffer's `ndim` strides (in elements) to `out` (may be NULL when ndim
/// is 0). Returns `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_strides(buf: *const fk_buffer, out: *mut i64) -> fk_status {
    guard("fk_buffer_strides", || {
        let b = unsafe { buffer_ref(buf, "buf") }?;
        unsafe { write_array(out, &b.strides) }
    })
}

/// The body of a buffer getter: `get` of the buffer behind `buf` written to `out`.
unsafe fn buffer_query<T>(
    name: &str,
    buf: *const fk_buffer,
    out: *mut T,
    get: impl FnOnce(&Buffer) -> T,
) -> fk_status {
    guard(name, || {
        let b = unsafe { buffer_ref(buf, "buf") }?;
        unsafe { write_out(out, "out", get(b)) }
    })
}

unsafe fn write_array(out: *mut i64, v: &[i64]) -> crate::error::Result<()> {
    if v.is_empty() {
        return Ok(());
    }
    crate::ensure!(!out.is_null(), FK_ERROR_NULL_POINTER, "out is NULL");
    // SAFETY: caller provides ndim writable entries.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, v.len()) };
    Ok(())
}

/// The address of the buffer's first element (host or device). Returns
/// `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_data(buf: *const fk_buffer, out: *mut *mut c_void) -> fk_status {
    unsafe { buffer_query("fk_buffer_data", buf, out, |b| crate::addr::ptr(b.data)) }
}

/// The buffer's device (`kind`, `ordinal`; either may be NULL): the context's
/// `FK_DEVICE_CPU` or `FK_DEVICE_CUDA` and ordinal, or `FK_DEVICE_CUDA_HOST` and the
/// context's ordinal for a pinned buffer (`fk_buffer_create_pinned`). Returns
/// `FK_ERROR_NULL_POINTER` when `buf` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_device(
    buf: *const fk_buffer,
    kind: *mut fk_device_kind,
    ordinal: *mut i32,
) -> fk_status {
    guard("fk_buffer_device", || {
        let b = unsafe { buffer_ref(buf, "buf") }?;
        if !kind.is_null() {
            unsafe { *kind = b.device_kind_abi() };
        }
        if !ordinal.is_null() {
            unsafe { *ordinal = b.device().ordinal() as i32 };
        }
        Ok(())
    })
}

/// Number of elements (product of the shape). Returns `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_numel(buf: *const fk_buffer, out: *mut i64) -> fk_status {
    unsafe { buffer_query("fk_buffer_numel", buf, out, |b| b.numel()) }
}

/// Size of the elements in bytes (numel times element size; `SIZE_MAX` when that
/// does not fit, e.g. a zero-stride view of 2^62 complex128). Returns
/// `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_nbytes(buf: *const fk_buffer, out: *mut usize) -> fk_status {
    unsafe { buffer_query("fk_buffer_nbytes", buf, out, |b| b.nbytes()) }
}

/// Whether the buffer is row-major contiguous (1) or not (0). Returns
/// `FK_ERROR_NULL_POINTER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_buffer_is_contiguous(
    buf: *const fk_buffer,
    out: *mut i32,
) -> fk_status {
    unsafe {
        buffer_query("fk_buffer_is_contiguous", buf, out, |b| {
            b.is_contiguous() as i32
        })
    }
}
