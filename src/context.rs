//! Device selection and the per-device runtime.
//!
//! A `Context` is shared (`Arc`) by every stream and buffer made from it, so a
//! context handle may be destroyed before them: the device runtime lives until the
//! last object using it is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{FK_ERROR_INVALID_ARGUMENT, Result};
use crate::gpu::{CudaDevice, ModuleSource};

/// Device kind selector (`int32_t`). Values are part of the ABI.
#[allow(non_camel_case_types)]
pub type fk_device_kind = i32;

/// CUDA when a usable driver and GPU are present, otherwise the CPU.
pub const FK_DEVICE_AUTO: fk_device_kind = 0;
/// The CPU backend (always available).
pub const FK_DEVICE_CPU: fk_device_kind = 1;
/// A CUDA GPU, selected by ordinal.
pub const FK_DEVICE_CUDA: fk_device_kind = 2;
/// Page-locked (pinned) host memory of a CUDA context (`fk_buffer_create_pinned`):
/// reported by `fk_buffer_device` only, never a context's kind. Such buffers are
/// copy endpoints (`fk_buffer_copy`), not operands of ops.
pub const FK_DEVICE_CUDA_HOST: fk_device_kind = 3;

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

/// Bytes fusekit itself holds through one context: owned buffers on the context's
/// device (host memory for a CPU context) and pinned host buffers.
pub struct MemoryStats {
    pub allocated: AtomicU64,
    pub peak: AtomicU64,
    pub count: AtomicU64,
    pub pinned: AtomicU64,
    pub pinned_count: AtomicU64,
    /// The release threshold of a CPU context (stored and reported, no effect).
    pub cpu_release_threshold: AtomicU64,
}

impl Default for MemoryStats {
    fn default() -> Self {
        MemoryStats {
            allocated: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            count: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            pinned_count: AtomicU64::new(0),
            cpu_release_threshold: AtomicU64::new(u64::MAX),
        }
    }
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
    pub fn on_pinned_alloc(&self, bytes: u64) {
        self.pinned.fetch_add(bytes, Ordering::Relaxed);
        self.pinned_count.fetch_add(1, Ordering::Relaxed);
    }
    pub fn on_pinned_free(&self, bytes: u64) {
        self.pinned.fetch_sub(bytes, Ordering::Relaxed);
        self.pinned_count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A snapshot of a context's memory statistics (bytes unless named otherwise).
#[derive(Debug, Clone, Copy, Default)]
pub struct MemorySnapshot {
    /// Live owned buffers (their requested sizes).
    pub allocated: u64,
    pub peak_allocated: u64,
    /// Memory the context's pool holds from the device (CPU: = allocated).
    pub reserved: u64,
    pub peak_reserved: u64,
    /// Pool memory backing live allocations, with the pool's rounding (CPU: = allocated).
    pub pool_used: u64,
    pub live_allocations: u64,
    pub device_free: u64,
    pub device_total: u64,
    pub release_threshold: u64,
    pub pinned: u64,
    pub pinned_allocations: u64,
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
                if crate::gpu::device_count().unwrap_or(0) > 0 {
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
            None => Ok(crate::host::cpu_name()),
            Some(d) => d.name(),
        }
    }

    /// `(free, total)` device memory in bytes; on the CPU, the host's memory.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        match &self.cuda {
            None => Ok(crate::host::host_memory()),
            Some(d) => d.memory_info(),
        }
    }

    /// The context's memory statistics (see `fk_memory_stats`).
    pub fn memory_stats(&self) -> Result<MemorySnapshot> {
        let m = &self.mem;
        let allocated = m.allocated.load(Ordering::Relaxed);
        let peak_allocated = m.peak.load(Ordering::Relaxed);
        let (device_free, device_total) = self.memory_info()?;
        let mut s = MemorySnapshot {
            allocated,
            peak_allocated,
            reserved: allocated,
            peak_reserved: peak_allocated,
            pool_used: allocated,
            live_allocations: m.count.load(Ordering::Relaxed),
            device_free,
            device_total,
            release_threshold: m.cpu_release_threshold.load(Ordering::Relaxed),
            pinned: m.pinned.load(Ordering::Relaxed),
            pinned_allocations: m.pinned_count.load(Ordering::Relaxed),
        };
        if let Some(d) = &self.cuda {
            let p = d.pool_stats()?;
            s.reserved = p.reserved;
            s.peak_reserved = p.reserved_high;
            s.pool_used = p.used;
            s.release_threshold = p.release_threshold;
        }
        Ok(s)
    }

    /// Sets the pool's release threshold (stored only on the CPU).
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        match &self.cuda {
            None => {
                self.mem
                    .cpu_release_threshold
                    .store(bytes, Ordering::Relaxed);
                Ok(())
            }
            Some(d) => d.set_release_threshold(bytes),
        }
    }

    /// Returns unused pool memory to the device until at most `keep` bytes stay
    /// reserved; no-op on the CPU (host buffers are freed when destroyed).
    pub fn trim(&self, keep: u64) -> Result<()> {
        match &self.cuda {
            None => Ok(()),
            Some(d) => d.trim(keep),
        }
    }

    /// Compiles (or loads from the cache) every kernel module of `all` (the family
    /// layer's `cuda::modules()`); no-op on the CPU.
    pub fn warmup<'m>(&self, all: impl Iterator<Item = &'m ModuleSource>) -> Result<()> {
        match &self.cuda {
            None => Ok(()),
            Some(d) => d.warmup(all),
        }
    }
}
