//! DLPack 1.x interop (`DLManagedTensorVersioned`), written from the dlpack.h spec.
//!
//! Import takes ownership of a managed tensor: its deleter runs exactly once, when
//! the last fusekit view of it is gone. If the import fails, ownership stays with
//! the caller (the deleter is not called). Export hands out a managed tensor that
//! keeps the buffer's storage alive until the consumer calls its deleter.

use std::ffi::c_void;
use std::sync::Arc;

use crate::addr::Addr;
use crate::addr::ptr;
use crate::buffer::{Buffer, Storage};
use crate::context::{Context, Device};
use crate::dtype::DType;
use crate::error::{
    FK_ERROR_DEVICE_MISMATCH, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_NULL_POINTER,
    FK_ERROR_UNSUPPORTED, FK_ERROR_UNSUPPORTED_DTYPE, Result,
};
use crate::layout;

pub(crate) const DLPACK_MAJOR: u32 = 1;
pub(crate) const DLPACK_MINOR: u32 = 1;
pub(crate) const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;

pub(crate) const KDL_CPU: i32 = 1;
pub(crate) const KDL_CUDA: i32 = 2;
pub(crate) const KDL_CUDA_HOST: i32 = 3;
pub(crate) const KDL_CUDA_MANAGED: i32 = 13;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

/// An imported managed tensor, deleted when dropped (a buffer's storage keeps it
/// as the owner of foreign memory).
struct Imported(*mut DLManagedTensorVersioned);

// SAFETY: the producer's tensor is plain memory plus a deleter that the DLPack
// contract lets any thread call once; nothing else touches the pointer.
unsafe impl Send for Imported {}
unsafe impl Sync for Imported {}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: the producer gave us this pointer with a valid (or NULL) deleter
        // and the right to call it once.
        unsafe {
            if let Some(del) = (*self.0).deleter {
                del(self.0);
            }
        }
    }
}

fn device_accepts(ctx: &Context, dev: DLDevice) -> bool {
    match ctx.device {
        Device::Cpu => matches!(dev.device_type, KDL_CPU | KDL_CUDA_HOST),
        Device::Cuda(o) => {
            matches!(dev.device_type, KDL_CUDA | KDL_CUDA_MANAGED) && dev.device_id == o as i32
        }
    }
}

/// Imports `managed` into a buffer on `ctx`.
///
/// # Safety
/// `managed` must be NULL or point to a valid `DLManagedTensorVersioned` whose
/// tensor's memory is on its stated device, valid for every element its shape and
/// strides address, and live until its deleter runs (the DLPack contract).
pub unsafe fn import(ctx: &Arc<Context>, managed: *mut DLManagedTensorVersioned) -> Result<Buffer> {
    crate::ensure!(
        !managed.is_null(),
        FK_ERROR_NULL_POINTER,
        "managed tensor is NULL"
    );
    // SAFETY: non-null, valid per the contract.
    let m = unsafe { &*managed };
    crate::ensure!(
        m.version.major == DLPACK_MAJOR,
        FK_ERROR_UNSUPPORTED,
        "DLPack version {}.{} is not supported (fusekit reads major version {DLPACK_MAJOR})",
        m.version.major,
        m.version.minor
    );
    let t = &m.dl_tensor;
    crate::ensure!(
        device_accepts(ctx, t.device),
        FK_ERROR_DEVICE_MISMATCH,
        "DLPack tensor is on device type {} id {} but the context is {}",
        t.device.device_type,
        t.device.device_id,
        ctx.device
    );
    let dtype = DType::from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes).ok_or_else(|| {
        crate::error::Error::new(
            FK_ERROR_UNSUPPORTED_DTYPE,
            format!(
                "DLPack dtype (code {}, bits {}, lanes {}) is not one of fusekit's element types",
                t.dtype.code, t.dtype.bits, t.dtype.lanes
            ),
        )
    })?;
    crate::ensure!(
        t.ndim >= 0 && t.ndim as usize <= layout::FK_MAX_DIMS,
        FK_ERROR_INVALID_ARGUMENT,
        "DLPack ndim = {} is outside 0..={}",
        t.ndim,
        layout::FK_MAX_DIMS
    );
    let nd = t.ndim as usize;
    crate::ensure!(
        nd == 0 || !t.shape.is_null(),
        FK_ERROR_NULL_POINTER,
        "DLPack shape is NULL with ndim = {nd}"
    );
    // SAFETY: shape/strides hold ndim entries per the DLPack contract.
    let shape: Vec<i64> = if nd == 0 {
        vec![]
    } else {
        unsafe { std::slice::from_raw_parts(t.shape, nd) }.to_vec()
    };
    let strides: Option<Vec<i64>> = if t.strides.is_null() || nd == 0 {
        None
    } else {
        Some(unsafe { std::slice::from_raw_parts(t.strides, nd) }.to_vec())
    };
    let strides = layout::validate(&shape, strides.as_deref(), "DLPack tensor")?;
    let data_num = (t.data as usize).wrapping_add(t.byte_offset as usize);
    layout::check_addresses(&shape, &strides, dtype.size(), data_num, "DLPack tensor")?;
    let n = layout::numel(&shape);
    crate::ensure!(
        !t.data.is_null() || n == 0,
        FK_ERROR_NULL_POINTER,
        "DLPack data is NULL with {n} elements"
    );
    // SAFETY: the DLPack contract above: the tensor's memory (its data plus
    // byte_offset) is valid for its shape and strides until the deleter runs, which
    // `storage` (kept alive by the buffer) defers; a NULL data was refused above
    // unless the tensor is empty.
    let data = unsafe { Addr::from_raw(data_num as u64) };
    let storage = Storage::Foreign(Box::new(Imported(managed)));
    let mut b = Buffer::new(ctx, dtype, shape, strides, data, storage);
    b.read_only = m.flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0;
    Ok(b)
}

/// What an exported tensor owns; `manager_ctx` points at it.
struct Export {
    shape: Vec<i64>,
    strides: Vec<i64>,
    _storage: Arc<Storage>,
}

unsafe extern "C" fn export_deleter(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // Never unwind into the consumer.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: both boxes were made in `export` and are freed exactly once here.
        unsafe {
            let managed = Box::from_raw(m);
            drop(Box::from_raw(managed.manager_ctx as *mut Export));
        }
    });
}

/// Exports `buf` as a new managed tensor (the consumer must call its deleter).
pub fn export(buf: &Buffer) -> *mut DLManagedTensorVersioned {
    let mut ex = Box::new(Export {
        shape: buf.shape.clone(),
        strides: buf.strides.clone(),
        _storage: buf.storage.clone(),
    });
    let (code, bits, lanes) = buf.dtype.to_dlpack();
    let device = match buf.device() {
        Device::Cuda(_) if buf.is_pinned() => DLDevice {
            device_type: KDL_CUDA_HOST,
            device_id: 0,
        },
        Device::Cpu => DLDevice {
            device_type: KDL_CPU,
            device_id: 0,
        },
        Device::Cuda(o) => DLDevice {
            device_type: KDL_CUDA,
            device_id: o as i32,
        },
    };
    let tensor = DLTensor {
        data: ptr(buf.data),
        device,
        ndim: buf.shape.len() as i32,
        dtype: DLDataType { code, bits, lanes },
        shape: ex.shape.as_mut_ptr(),
        strides: ex.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    let managed = Box::new(DLManagedTensorVersioned {
        version: DLPackVersion {
            major: DLPACK_MAJOR,
            minor: DLPACK_MINOR,
        },
        manager_ctx: Box::into_raw(ex) as *mut c_void,
        deleter: Some(export_deleter),
        flags: if buf.read_only {
            DLPACK_FLAG_BITMASK_READ_ONLY
        } else {
            0
        },
        dl_tensor: tensor,
    });
    Box::into_raw(managed)
}
