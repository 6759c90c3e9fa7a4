//! Device selection and the per-device runtime.
//!
//! A `Context` is shared (`Arc`) by every stream and buffer made from it, so a
//! context handle may be destroyed before them: the device runtime lives until the
//! last object using it is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cuda::CudaDevice;
use crate::error::{FK_ERROR_INVALID_ARGUMENT, Result};

/// Device kind selector (`int32_t`). Values are part of the ABI.
#[allow(non_camel_case_types)]
pub type fk_device_kind = i32;

/// CUDA when a usable driver and GPU are present, otherwise the CPU.
pub const FK_DEVICE_AUTO: fk_device_kind = 0;
/// The CPU backend (always available).
pub const FK_DEVICE_CPU: fk_device_kind = 1;
/// A CUDA GPU, selected by ordinal.
pub const FK_DEVICE_CUDA: fk_device_kind = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

impl Device {
    pub fn kind_abi(self) -> fk_device_kind {
        match self {
            Device::Cpu => FK_DEVICE_CPU,
            Device::Cuda(_) => FK_DEVICE_CUDA,
        }
    }
    pub fn ordinal(self) -> usize {
        match self {
            Device::Cpu => 0,
            Device::Cuda(o) => o,
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(o) => write!(f, "cuda:{o}"),
        }
    }
}

/// Bytes fusekit itself holds on a device (owned buffers).
#[derive(Default)]
pub struct MemoryStats {
    pub allocated: AtomicU64,
    pub peak: AtomicU64,
    pub count: AtomicU64,
}

impl MemoryStats {
    pub fn on_alloc(&self, bytes: u64) {
        let now = self.allocated.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
    pub fn on_free(&self, bytes: u64) {
        self.allocated.fetch_sub(bytes, Ordering::Relaxed);
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct Context {
    pub device: Device,
    /// Present exactly when `device` is `Cuda`.
    pub cuda: Option<CudaDevice>,
    pub mem: MemoryStats,
}

impl Context {
    /// Creates a context for `kind` / `ordinal` (see `FK_DEVICE_*`).
    pub fn create(kind: fk_device_kind, ordinal: i32) -> Result<Arc<Context>> {
        match kind {
            FK_DEVICE_CPU => Ok(Self::cpu()),
            FK_DEVICE_CUDA => {
                crate::ensure!(
                    ordinal >= 0,
                    FK_ERROR_INVALID_ARGUMENT,
                    "ordinal = {ordinal} must be >= 0"
                );
                Self::cuda(ordinal as usize)
            }
            FK_DEVICE_AUTO => {
                if crate::cuda::device_count().unwrap_or(0) > 0 {
                    Self::cuda(ordinal.max(0) as usize)
                } else {
                    Ok(Self::cpu())
                }
            }
            _ => crate::bail!(
                FK_ERROR_INVALID_ARGUMENT,
                "kind = {kind} is not a valid fk_device_kind (FK_DEVICE_AUTO=0, FK_DEVICE_CPU=1, FK_DEVICE_CUDA=2)"
            ),
        }
    }

    pub fn cpu() -> Arc<Context> {
        Arc::new(Context {
            device: Device::Cpu,
            cuda: None,
            mem: MemoryStats::default(),
        })
    }

    pub fn cuda(ordinal: usize) -> Result<Arc<Context>> {
        let dev = CudaDevice::open(ordinal)?;
        Ok(Arc::new(Context {
            device: Device::Cuda(ordinal),
            cuda: Some(dev),
            mem: MemoryStats::default(),
        }))
    }

    /// The CUDA runtime of this context; an internal error when called on a CPU
    /// context (callers dispatch on `device` first).
    pub fn cuda_dev(&self) -> &CudaDevice {
        self.cuda
            .as_ref()
            .expect("cuda_dev() called on a CPU context")
    }

    pub fn name(&self) -> Result<String> {
        match &self.cuda {
            None => Ok(crate::cpu::cpu_name()),
            Some(d) => d.name(),
        }
    }

    /// `(free, total)` device memory in bytes; on the CPU, the host's memory.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        match &self.cuda {
            None => Ok(crate::cpu::host_memory()),
            Some(d) => d.memory_info(),
        }
    }

    /// Compiles (or loads from the cache) every kernel module; no-op on the CPU.
    pub fn warmup(&self) -> Result<()> {
        match &self.cuda {
            None => Ok(()),
            Some(d) => d.warmup(),
        }
    }
}
