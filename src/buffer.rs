//! Memory handles: owned allocations, pinned host buffers, borrowed wraps of caller
//! memory, DLPack imports; and copies between any two buffers (`copy`).
//!
//! A `Buffer` is a view (dtype, shape, strides, data pointer) onto a `Storage`. The
//! storage is reference counted, so a DLPack export keeps the memory alive after
//! the buffer handle is destroyed.

use std::alloc::Layout;
use std::sync::Arc;

use crate::addr::Addr;
use crate::addr::{ptr, raw};
use crate::context::{Context, Device};
use crate::dtype::DType;
use crate::error::{
    FK_ERROR_DEVICE_MISMATCH, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_NULL_POINTER,
    FK_ERROR_OUT_OF_MEMORY, FK_ERROR_SHAPE_MISMATCH, FK_ERROR_UNSUPPORTED, Result,
};
use crate::gpu::HostMem;
use crate::layout;
use crate::stream::Stream;

/// Who owns the memory behind a buffer.
pub enum Storage {
    /// Host memory allocated by fusekit (CPU backend).
    Host {
        ctx: Arc<Context>,
        ptr: *mut u8,
        layout: Layout,
    },
    /// Device memory allocated by fusekit from the context's pool, stream-ordered:
    /// freed on `stream`.
    Device {
        stream: Arc<Stream>,
        ptr: u64,
        bytes: usize,
    },
    /// Page-locked host memory of a CUDA context (`cuMemHostAlloc`): a copy
    /// endpoint, refused as an op operand.
    Pinned {
        ctx: Arc<Context>,
        ptr: *mut u8,
        bytes: usize,
    },
    /// Caller memory; fusekit never frees it.
    Borrowed,
    /// Memory another library owns (an imported DLPack tensor): the box is its
    /// release, dropped when the last view is gone.
    Foreign(Box<dyn Send + Sync>),
}

// SAFETY: the pointers are plain addresses owned by this storage; all mutation of the
// memory they point to goes through operations the caller orders on streams.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Drop for Storage {
    fn drop(&mut self) {
        match self {
            Storage::Host { ctx, ptr, layout } => {
                // SAFETY: allocated in `Buffer::alloc` with this layout.
                unsafe { std::alloc::dealloc(*ptr, *layout) };
                ctx.mem.on_free(layout.size() as u64);
            }
            Storage::Device { stream, ptr, bytes } => {
                if let Some(d) = &stream.ctx.cuda {
                    d.free_async(*ptr, stream.raw);
                }
                stream.ctx.mem.on_free(*bytes as u64);
            }
            Storage::Pinned { ctx, ptr, bytes } => {
                if let Some(d) = &ctx.cuda {
                    d.host_free(*ptr);
                }
                ctx.mem.on_pinned_free(*bytes as u64);
            }
            Storage::Borrowed | Storage::Foreign(_) => {}
        }
    }
}

pub struct Buffer {
    pub ctx: Arc<Context>,
    pub dtype: DType,
    pub shape: Vec<i64>,
    /// In elements.
    pub strides: Vec<i64>,
    /// Address of the element at index (0, .., 0): host or device memory, `None`
    /// for a buffer without memory (empty). Vouched for where the buffer is made
    /// (`addr`'s contract: live for the storage's life, valid for every element
    /// the shape and strides address).
    pub data: Option<Addr>,
    /// Set for DLPack imports flagged read-only; such a buffer is never an output.
    pub read_only: bool,
    pub storage: Arc<Storage>,
}

impl Buffer {
    /// A writable buffer over `data`, kept alive by `storage`.
    pub(crate) fn new(
        ctx: &Arc<Context>,
        dtype: DType,
        shape: impl Into<Vec<i64>>,
        strides: Vec<i64>,
        data: Option<Addr>,
        storage: Storage,
    ) -> Buffer {
        Buffer {
            ctx: ctx.clone(),
            dtype,
            shape: shape.into(),
            strides,
            data,
            read_only: false,
            storage: Arc::new(storage),
        }
    }

    /// Size in bytes of a contiguous `shape` of `dtype`, refused when it could not
    /// be allocated (more than `isize::MAX`).
    fn alloc_bytes(dtype: DType, shape: &[i64]) -> Result<usize> {
        let bytes = (layout::numel(shape) as u128) * dtype.size() as u128;
        crate::ensure!(
            bytes <= isize::MAX as u128,
            FK_ERROR_OUT_OF_MEMORY,
            "cannot allocate {bytes} bytes"
        );
        Ok(bytes as usize)
    }

    /// Allocates an uninitialised contiguous buffer. On CUDA the allocation is
    /// stream-ordered on `stream` (usable there at once, elsewhere after a sync).
    pub fn alloc(
        ctx: &Arc<Context>,
        dtype: DType,
        shape: &[i64],
        stream: &Arc<Stream>,
    ) -> Result<Buffer> {
        let strides = layout::validate(shape, None, "shape")?;
        stream.check_device(ctx.device)?;
        let bytes = Buffer::alloc_bytes(dtype, shape)?;
        let storage = match &ctx.cuda {
            None => {
                let layout = Layout::from_size_align(bytes.max(1), 64)
                    .map_err(|e| crate::error::Error::new(FK_ERROR_OUT_OF_MEMORY, e.to_string()))?;
                // Zeroed so that reading a never-written buffer is defined behaviour.
                // SAFETY: layout has non-zero size.
                let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
                crate::ensure!(
                    !ptr.is_null(),
                    FK_ERROR_OUT_OF_MEMORY,
                    "host allocation of {bytes} bytes failed"
                );
                ctx.mem.on_alloc(layout.size() as u64);
                Storage::Host {
                    ctx: ctx.clone(),
                    ptr,
                    layout,
                }
            }
            Some(d) => {
                let ptr = d.alloc_async(bytes, stream.raw)?;
                ctx.mem.on_alloc(bytes as u64);
                Storage::Device {
                    stream: stream.clone(),
                    ptr,
                    bytes,
                }
            }
        };
        // SAFETY: a fresh allocation of `bytes` bytes of this context's device (host
        // memory on a CPU context), owned by `storage`, which the buffer keeps alive;
        // the contiguous `shape` addresses exactly those bytes.
        let data = unsafe {
            match &storage {
                Storage::Host { ptr, .. } => Addr::from_ptr(*ptr),
                Storage::Device { ptr, .. } => Addr::from_raw(*ptr),
                _ => unreachable!(),
            }
        };
        Ok(Buffer::new(ctx, dtype, shape, strides, data, storage))
    }

    /// Allocates an uninitialised contiguous buffer of page-locked host memory on a
    /// CUDA context (`cuMemHostAlloc`, portable to every context); on a CPU context
    /// an ordinary host buffer (as `alloc`).
    pub fn alloc_pinned(ctx: &Arc<Context>, dtype: DType, shape: &[i64]) -> Result<Buffer> {
        let Some(d) = &ctx.cuda else {
            return Buffer::alloc(ctx, dtype, shape, &Stream::default_for(ctx));
        };
        let strides = layout::validate(shape, None, "shape")?;
        let bytes = Buffer::alloc_bytes(dtype, shape)?;
        let ptr = d.host_alloc(bytes)?;
        ctx.mem.on_pinned_alloc(bytes as u64);
        let storage = Storage::Pinned {
            ctx: ctx.clone(),
            ptr,
            bytes,
        };
        // SAFETY: a fresh pinned allocation of `bytes` bytes, owned by `storage`,
        // which the buffer keeps alive; the contiguous `shape` addresses exactly them.
        let data = unsafe { Addr::from_ptr(ptr) };
        Ok(Buffer::new(ctx, dtype, shape, strides, data, storage))
    }

    /// Wraps caller memory without copying. `strides` (elements) default to contiguous.
    ///
    /// # Safety
    ///
    /// `fk_buffer_wrap`'s contract: `data` is NULL (empty shapes only) or memory of
    /// `ctx`'s device (host memory for a CPU context) that is valid for every element
    /// `shape` and `strides` address and outlives the buffer and every plan made
    /// from it. The checks here catch what can be caught (NULL, a shape that
    /// wraps the address space, memory CUDA does not know), not a short allocation.
    pub unsafe fn wrap(
        ctx: &Arc<Context>,
        data: *mut std::ffi::c_void,
        dtype: DType,
        shape: &[i64],
        strides: Option<&[i64]>,
    ) -> Result<Buffer> {
        let strides = layout::validate(shape, strides, "shape/strides")?;
        let data_num = data as usize;
        layout::check_addresses(shape, &strides, dtype.size(), data_num, "shape/strides")?;
        let n = layout::numel(shape);
        crate::ensure!(
            !data.is_null() || n == 0,
            FK_ERROR_NULL_POINTER,
            "data is NULL but the shape {shape:?} has {n} elements"
        );
        if let (Some(d), true) = (&ctx.cuda, n > 0) {
            d.check_pointer(data_num, "data")?;
        }
        // SAFETY: the caller's contract above.
        let data = unsafe { Addr::from_ptr(data) };
        Ok(Buffer::new(
            ctx,
            dtype,
            shape,
            strides,
            data,
            Storage::Borrowed,
        ))
    }

    /// The device of the buffer's context (for a pinned buffer, the CUDA device whose
    /// context allocated it; see `is_pinned`).
    pub fn device(&self) -> Device {
        self.ctx.device
    }
    /// Whether this is a pinned host buffer from `alloc_pinned` on a CUDA context.
    pub fn is_pinned(&self) -> bool {
        matches!(*self.storage, Storage::Pinned { .. })
    }
    /// The `fk_device_kind` reported by `fk_buffer_device`: `FK_DEVICE_CUDA_HOST` for
    /// pinned buffers, the context's kind otherwise.
    pub fn device_kind_abi(&self) -> crate::context::fk_device_kind {
        if self.is_pinned() {
            crate::context::FK_DEVICE_CUDA_HOST
        } else {
            self.ctx.device.kind_abi()
        }
    }
    /// Refuses pinned host buffers as operands of ops (`what` names the argument).
    pub fn check_not_pinned(&self, what: &str) -> Result<()> {
        crate::ensure!(
            !self.is_pinned(),
            FK_ERROR_DEVICE_MISMATCH,
            "{what} is a pinned host buffer (FK_DEVICE_CUDA_HOST, from fk_buffer_create_pinned of {}); ops take device buffers: copy it with fk_buffer_copy first",
            self.ctx.device
        );
        Ok(())
    }
    pub fn numel(&self) -> i64 {
        layout::numel(&self.shape)
    }
    /// `numel` times the element size, saturating at `usize::MAX`: a view with zero
    /// strides may have more elements than bytes fit in `usize`.
    pub fn nbytes(&self) -> usize {
        (self.numel() as usize).saturating_mul(self.dtype.size())
    }
    pub fn is_contiguous(&self) -> bool {
        layout::is_contiguous(&self.shape, &self.strides)
    }

    /// Byte range `[lo, hi)` of memory this view may touch; `None` when empty.
    pub fn byte_range(&self) -> Option<(usize, usize)> {
        let (lo, hi) = layout::extent(&self.shape, &self.strides)?;
        let sz = self.dtype.size() as i64;
        let base = raw(self.data) as i64;
        let (lo, hi) = (base + lo * sz, base + (hi + 1) * sz);
        Some((lo as usize, hi as usize))
    }

    /// True when this view is exactly `other` (same address, dtype, shape, strides).
    pub fn same_view(&self, other: &Buffer) -> bool {
        self.data == other.data
            && self.dtype == other.dtype
            && self.shape == other.shape
            && self.strides == other.strides
    }

    pub fn overlaps(&self, other: &Buffer) -> bool {
        match (self.byte_range(), other.byte_range()) {
            (Some((a0, a1)), Some((b0, b1))) => a0 < b1 && b0 < a1,
            _ => false,
        }
    }

    /// Checks that this buffer can be written as an op output named `what` (not a
    /// pinned host buffer, not read-only, not self-overlapping).
    pub fn check_writable(&self, what: &str) -> Result<()> {
        self.check_not_pinned(what)?;
        self.check_writable_memory(what)
    }

    /// Checks that this buffer's memory can be written (copies: pinned is fine).
    pub fn check_writable_memory(&self, what: &str) -> Result<()> {
        crate::ensure!(
            !self.read_only,
            FK_ERROR_INVALID_ARGUMENT,
            "{what} is a read-only DLPack tensor and cannot be written"
        );
        crate::ensure!(
            !layout::may_self_overlap(&self.shape, &self.strides),
            FK_ERROR_INVALID_ARGUMENT,
            "{what} has strides {:?} for shape {:?}, under which several elements share memory; outputs must not self-overlap",
            self.strides,
            self.shape
        );
        Ok(())
    }

    /// Requires a contiguous buffer of exactly `bytes` bytes (copies to/from host).
    fn check_host_copy(&self, bytes: usize, what: &str) -> Result<()> {
        crate::ensure!(
            self.is_contiguous(),
            FK_ERROR_UNSUPPORTED,
            "{what}: buffer with shape {:?} and strides {:?} is not contiguous; copy it with fk_copy into a contiguous buffer first",
            self.shape,
            self.strides
        );
        crate::ensure!(
            bytes == self.nbytes(),
            FK_ERROR_SHAPE_MISMATCH,
            "{what}: bytes = {bytes} but the buffer holds {} bytes ({} x {})",
            self.nbytes(),
            self.numel(),
            self.dtype
        );
        Ok(())
    }

    /// Copies `bytes` between host memory and this (contiguous) buffer, in the
    /// direction `host` names, queued on `stream`; `blocking` waits for the copy to
    /// finish.
    ///
    /// # Safety
    /// The host memory must be valid for `bytes` bytes (it may be NULL when `bytes`
    /// is 0) until the copy has finished (on return when `blocking`, else when
    /// `stream` reaches it): for reads (`HostMem::Src`), or for writes and not read
    /// meanwhile (`HostMem::Dst`).
    pub unsafe fn copy_host(
        &self,
        host: HostMem,
        bytes: usize,
        stream: &Stream,
        blocking: bool,
    ) -> Result<()> {
        match host {
            HostMem::Src(_) => {
                self.check_host_copy(bytes, "copy from host")?;
                self.check_writable_memory("the destination")?;
            }
            HostMem::Dst(_) => self.check_host_copy(bytes, "copy to host")?,
        }
        stream.check_device(self.device())?;
        if bytes == 0 {
            return Ok(());
        }
        let data = self.data;
        let dev = raw(data);
        match (&self.ctx.cuda, host) {
            // SAFETY (both): the caller guarantees the host memory holds `bytes`
            // bytes; ranges may not overlap in a well-formed call, `copy` tolerates
            // it anyway.
            (None, HostMem::Src(src)) => unsafe { std::ptr::copy(src, ptr(data), bytes) },
            (None, HostMem::Dst(dst)) => unsafe { std::ptr::copy(ptr(data), dst, bytes) },
            (Some(d), _) if self.is_pinned() => {
                let (to, from) = match host {
                    HostMem::Src(src) => (dev, src as u64),
                    HostMem::Dst(dst) => (dst as u64, dev),
                };
                d.memcpy_async(to, from, bytes, stream.raw)?;
                if blocking {
                    stream.synchronize()?;
                }
            }
            (Some(d), _) => d.memcpy_host(host, dev, bytes, stream.raw, blocking)?,
        }
        Ok(())
    }
}

/// Checks that every buffer lives on `device` (`names` label them for the message)
/// and that none is a pinned host buffer (ops refuse those; see `check_writable`
/// for outputs).
pub fn check_same_device(device: Device, bufs: &[(&Buffer, &str)]) -> Result<()> {
    for (b, name) in bufs {
        b.check_not_pinned(name)?;
        crate::ensure!(
            b.device() == device,
            FK_ERROR_DEVICE_MISMATCH,
            "{name} is on {} but the operation runs on {device}",
            b.device()
        );
    }
    Ok(())
}

/// Where a copy endpoint's memory lives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Place {
    /// Host memory of a CPU context (pageable).
    Host,
    /// A pinned host buffer of the CUDA context on this ordinal.
    Pinned(usize),
    /// Memory of a CUDA context on this ordinal (owned, borrowed or DLPack).
    Device(usize),
}

impl Place {
    fn of(b: &Buffer) -> Place {
        match b.ctx.device {
            Device::Cpu => Place::Host,
            Device::Cuda(o) if b.is_pinned() => Place::Pinned(o),
            Device::Cuda(o) => Place::Device(o),
        }
    }
    fn describe(self) -> String {
        match self {
            Place::Host => "cpu".into(),
            Place::Pinned(o) => format!("pinned host memory (cuda:{o})"),
            Place::Device(o) => format!("cuda:{o}"),
        }
    }
}

/// How `copy` runs: the devices whose streams may order it and the one that runs it
/// with a NULL stream.
struct Route {
    allowed: Vec<usize>,
    default: Option<Arc<Context>>,
}

fn route(dst: &Buffer, src: &Buffer) -> Route {
    let (pd, ps) = (Place::of(dst), Place::of(src));
    let ctx_of = |b: &Buffer| Some(b.ctx.clone());
    match (pd, ps) {
        (Place::Host, Place::Host) => Route {
            allowed: vec![],
            default: None,
        },
        // Device memory on one side: that device's stream runs it (both, for peers).
        (Place::Device(a), Place::Device(b)) if a != b => Route {
            allowed: vec![a, b],
            default: ctx_of(dst),
        },
        (Place::Device(a), _) => Route {
            allowed: vec![a],
            default: ctx_of(dst),
        },
        (_, Place::Device(b)) => Route {
            allowed: vec![b],
            default: ctx_of(src),
        },
        // Pinned on one or both sides, no device memory: any of their contexts.
        (Place::Pinned(a), Place::Pinned(b)) => Route {
            allowed: if a == b { vec![a] } else { vec![a, b] },
            default: ctx_of(dst),
        },
        (Place::Pinned(a), Place::Host) => Route {
            allowed: vec![a],
            default: ctx_of(dst),
        },
        (Place::Host, Place::Pinned(b)) => Route {
            allowed: vec![b],
            default: ctx_of(src),
        },
    }
}

/// Copies `src` into `dst` (contiguous, same dtype, same number of elements; shapes
/// may differ), queued on `stream` (`None`: the default stream of the CUDA side, or
/// immediately when both are CPU buffers). Covers every pair: CPU and CPU, host
/// (CPU or pinned) and device, device and device on one GPU (`cuMemcpyAsync`), and
/// across GPUs (`cuMemcpyPeerAsync`, direct when the devices are peer capable,
/// staged through host memory by the driver otherwise).
pub fn copy(dst: &Buffer, src: &Buffer, stream: Option<&Arc<Stream>>) -> Result<()> {
    same_dtype(dst, "dst", src.dtype, "src")?;
    crate::ensure!(
        dst.numel() == src.numel(),
        FK_ERROR_SHAPE_MISMATCH,
        "dst has shape {:?} ({} elements) but src has shape {:?} ({} elements)",
        dst.shape,
        dst.numel(),
        src.shape,
        src.numel()
    );
    for (b, name) in [(dst, "dst"), (src, "src")] {
        crate::ensure!(
            b.is_contiguous(),
            FK_ERROR_UNSUPPORTED,
            "{name} with shape {:?} and strides {:?} is not contiguous; fk_buffer_copy copies contiguous buffers (use fk_copy for strided views on one device)",
            b.shape,
            b.strides
        );
    }
    dst.check_writable_memory("dst")?;
    let r = route(dst, src);
    let (pd, ps) = (Place::of(dst), Place::of(src));
    let what = format!("a copy from {} to {}", ps.describe(), pd.describe());
    let stream: Option<Arc<Stream>> = match stream {
        Some(s) => {
            let ok = match s.ctx.device {
                Device::Cpu => r.allowed.is_empty(),
                Device::Cuda(o) => r.allowed.contains(&o),
            };
            if !ok {
                let want = if r.allowed.is_empty() {
                    "NULL or a stream of a CPU context".to_string()
                } else {
                    r.allowed
                        .iter()
                        .map(|o| format!("cuda:{o}"))
                        .collect::<Vec<_>>()
                        .join(" or ")
                };
                crate::bail!(
                    FK_ERROR_DEVICE_MISMATCH,
                    "stream is on {} but {what} runs on a stream of {want}",
                    s.ctx.device
                );
            }
            // A CPU stream orders nothing: CPU copies run inside the call.
            s.ctx.cuda.is_some().then(|| s.clone())
        }
        None => r.default.as_ref().map(Stream::default_for),
    };
    let bytes = dst.nbytes();
    if bytes == 0 {
        return Ok(());
    }
    if dst.overlaps(src) {
        crate::ensure!(
            dst.data == src.data,
            crate::error::FK_ERROR_ALIASING,
            "dst and src overlap partially ({bytes} bytes at {:#x} and {:#x})",
            raw(dst.data),
            raw(src.data)
        );
        return Ok(()); // the same memory: nothing to do
    }
    let Some(stream) = stream else {
        // CPU to CPU: both are host memory of CPU contexts; ops ran synchronously.
        // SAFETY: both buffers hold `bytes` bytes and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(ptr::<u8>(src.data), ptr(dst.data), bytes) };
        return Ok(());
    };
    let sdev = stream.ctx.cuda_dev();
    match (pd, ps) {
        (Place::Device(a), Place::Device(b)) if a != b => {
            let (dd, sd) = (dst.ctx.cuda_dev(), src.ctx.cuda_dev());
            dd.ensure_peer(sd)?;
            dd.memcpy_peer_async(raw(dst.data), sd, raw(src.data), bytes, sdev, stream.raw)
        }
        _ => sdev.memcpy_async(raw(dst.data), raw(src.data), bytes, stream.raw),
    }
}

/// `buf` has the dtype `dtype` of the argument `other`.
pub fn same_dtype(buf: &Buffer, name: &str, dtype: DType, other: &str) -> Result<()> {
    crate::ensure!(
        buf.dtype == dtype,
        crate::error::FK_ERROR_DTYPE_MISMATCH,
        "{name} has dtype {} but {other} has dtype {dtype}",
        buf.dtype
    );
    Ok(())
}

// A buffer's address, for the plans: the operand's own (made where the buffer was).
impl Addr {
    /// The address of `buf`'s first element (`None` if it has no memory): vouched
    /// for where the buffer was made.
    pub fn of(buf: &Buffer) -> Option<Addr> {
        buf.data
    }

    /// The address `buf` of an optional operand, `None` when it is absent.
    pub fn of_opt(buf: Option<&Buffer>) -> Option<Addr> {
        buf.and_then(Addr::of)
    }
}
