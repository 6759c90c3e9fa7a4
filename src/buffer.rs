//! Memory handles: owned allocations, borrowed wraps of caller memory, DLPack imports.
//!
//! A `Buffer` is a view (dtype, shape, strides, data pointer) onto a `Storage`. The
//! storage is reference counted, so a DLPack export keeps the memory alive after
//! the buffer handle is destroyed.

use std::alloc::Layout;
use std::sync::Arc;

use crate::context::{Context, Device};
use crate::dtype::DType;
use crate::error::{
    FK_ERROR_DEVICE_MISMATCH, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_NULL_POINTER,
    FK_ERROR_OUT_OF_MEMORY, FK_ERROR_SHAPE_MISMATCH, FK_ERROR_UNSUPPORTED, Result,
};
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
    /// Device memory allocated by fusekit, stream-ordered: freed on `stream`.
    Device {
        stream: Arc<Stream>,
        ptr: u64,
        bytes: usize,
    },
    /// Caller memory; fusekit never frees it.
    Borrowed,
    /// An imported DLPack tensor; its deleter runs when the last view is gone.
    DLPack(crate::dlpack::Imported),
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
            Storage::Borrowed | Storage::DLPack(_) => {}
        }
    }
}

pub struct Buffer {
    pub ctx: Arc<Context>,
    pub dtype: DType,
    pub shape: Vec<i64>,
    /// In elements.
    pub strides: Vec<i64>,
    /// Address of the element at index (0, .., 0): host or device address.
    pub data: usize,
    /// Set for DLPack imports flagged read-only; such a buffer is never an output.
    pub read_only: bool,
    pub storage: Arc<Storage>,
}

impl Buffer {
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
        let n = layout::numel(shape);
        let bytes = (n as u128) * dtype.size() as u128;
        crate::ensure!(
            bytes <= isize::MAX as u128,
            FK_ERROR_OUT_OF_MEMORY,
            "cannot allocate {bytes} bytes"
        );
        let bytes = bytes as usize;
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
        let data = match &storage {
            Storage::Host { ptr, .. } => *ptr as usize,
            Storage::Device { ptr, .. } => *ptr as usize,
            _ => unreachable!(),
        };
        Ok(Buffer {
            ctx: ctx.clone(),
            dtype,
            shape: shape.to_vec(),
            strides,
            data,
            read_only: false,
            storage: Arc::new(storage),
        })
    }

    /// Wraps caller memory without copying. `strides` (elements) default to contiguous.
    pub fn wrap(
        ctx: &Arc<Context>,
        data: usize,
        dtype: DType,
        shape: &[i64],
        strides: Option<&[i64]>,
    ) -> Result<Buffer> {
        let strides = layout::validate(shape, strides, "shape/strides")?;
        let n = layout::numel(shape);
        crate::ensure!(
            data != 0 || n == 0,
            FK_ERROR_NULL_POINTER,
            "data is NULL but the shape {shape:?} has {n} elements"
        );
        if let (Some(d), true) = (&ctx.cuda, n > 0) {
            d.check_pointer(data, "data")?;
        }
        Ok(Buffer {
            ctx: ctx.clone(),
            dtype,
            shape: shape.to_vec(),
            strides,
            data,
            read_only: false,
            storage: Arc::new(Storage::Borrowed),
        })
    }

    pub fn device(&self) -> Device {
        self.ctx.device
    }
    pub fn numel(&self) -> i64 {
        layout::numel(&self.shape)
    }
    pub fn nbytes(&self) -> usize {
        self.numel() as usize * self.dtype.size()
    }
    pub fn is_contiguous(&self) -> bool {
        layout::is_contiguous(&self.shape, &self.strides)
    }

    /// Byte range `[lo, hi)` of memory this view may touch; `None` when empty.
    pub fn byte_range(&self) -> Option<(usize, usize)> {
        let (lo, hi) = layout::extent(&self.shape, &self.strides)?;
        let sz = self.dtype.size() as i64;
        let lo = self.data as i64 + lo * sz;
        let hi = self.data as i64 + (hi + 1) * sz;
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

    /// Checks that this buffer can be written as an output named `what`.
    pub fn check_writable(&self, what: &str) -> Result<()> {
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

    /// Copies `bytes` from host memory `src` into this (contiguous) buffer, queued on
    /// `stream`; `blocking` waits for the copy to finish.
    pub fn copy_from_host(
        &self,
        src: *const u8,
        bytes: usize,
        stream: &Stream,
        blocking: bool,
    ) -> Result<()> {
        self.check_host_copy(bytes, "copy from host")?;
        self.check_writable("the destination")?;
        stream.check_device(self.device())?;
        if bytes == 0 {
            return Ok(());
        }
        match &self.ctx.cuda {
            None => {
                // SAFETY: caller guarantees src holds `bytes` bytes; ranges may not
                // overlap in a well-formed call, `copy` tolerates it anyway.
                unsafe { std::ptr::copy(src, self.data as *mut u8, bytes) };
                Ok(())
            }
            Some(d) => d.memcpy_htod(self.data as u64, src, bytes, stream.raw, blocking),
        }
    }

    /// Copies this (contiguous) buffer into `bytes` of host memory at `dst`.
    pub fn copy_to_host(
        &self,
        dst: *mut u8,
        bytes: usize,
        stream: &Stream,
        blocking: bool,
    ) -> Result<()> {
        self.check_host_copy(bytes, "copy to host")?;
        stream.check_device(self.device())?;
        if bytes == 0 {
            return Ok(());
        }
        match &self.ctx.cuda {
            None => {
                // SAFETY: as above.
                unsafe { std::ptr::copy(self.data as *const u8, dst, bytes) };
                Ok(())
            }
            Some(d) => d.memcpy_dtoh(dst, self.data as u64, bytes, stream.raw, blocking),
        }
    }
}

/// Checks that every buffer lives on `device` (`names` label them for the message).
pub fn check_same_device(device: Device, bufs: &[(&Buffer, &str)]) -> Result<()> {
    for (b, name) in bufs {
        crate::ensure!(
            b.device() == device,
            FK_ERROR_DEVICE_MISMATCH,
            "{name} is on {} but the operation runs on {device}",
            b.device()
        );
    }
    Ok(())
}
