//! The CUDA runtime, below every op family: the driver, the device's primary
//! context, streams and events, stream-ordered memory, NVRTC and the kernel module
//! cache, the dynamically loaded libraries (cuBLAS / cuBLASLt, cuSOLVER, NCCL) and
//! the kernel-argument structs. The family launchers (`cuda/`) sit above it and
//! name the kernel modules they launch; this layer knows no family.
//!
//! Everything goes through cudarc's thin `result`/`sys` layers with the driver and
//! NVRTC loaded at run time. Before the first driver call `driver()` checks that
//! libcuda can be loaded, so a missing driver is a status, never cudarc's panic.

pub mod cublas;
pub(crate) mod cublas_api;
pub mod cusolver;
pub(crate) mod dynlib;
pub(crate) mod kargs;
pub mod nccl;
pub mod nvrtc;
pub mod runtime;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys};

use crate::addr::Addr;
use crate::addr::raw;
use crate::error::{
    CudaContext as _, Error, FK_ERROR_CUDA_UNAVAILABLE, FK_ERROR_DEVICE_MISMATCH,
    FK_ERROR_INVALID_ARGUMENT, Result, lock,
};

/// The host end of a copy with device memory (`Buffer::copy_host`, the driver's
/// host-to-device and device-to-host copies).
#[derive(Debug, Clone, Copy)]
pub enum HostMem {
    /// Read into the device memory.
    Src(*const u8),
    /// Written from the device memory.
    Dst(*mut u8),
}

/// A kernel module as its launcher names it: `(name, source)`, the source made on
/// first use (embedded in the library; NVRTC compiles it for the device).
pub type ModuleSource = (&'static str, fn() -> String);

/// Where the module cache finds the source of a module it has not loaded: the
/// family layer's catalogue (`cuda::source_of`), passed in by the launch helpers.
pub type Catalog = fn(&str) -> Option<fn() -> String>;

/// Headers the module sources may `#include "..."` (resolved by NVRTC in memory).
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../kernels/common.cuh")),
    (
        "activation.cuh",
        include_str!("../../kernels/activation.cuh"),
    ),
];

/// Loads libcuda and initialises the driver once per process.
pub fn driver() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), Error>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // SAFETY: only probes whether the shared library can be opened.
            if !unsafe { sys::is_culib_present() } {
                crate::bail!(
                    FK_ERROR_CUDA_UNAVAILABLE,
                    "the NVIDIA driver library (libcuda.so.1) could not be loaded: install the NVIDIA driver, or use FK_DEVICE_CPU"
                );
            }
            result::init().cuda("cuInit")
        })
        .clone()
}

/// Number of CUDA devices (an error when no usable driver is present).
pub fn device_count() -> Result<i32> {
    driver()?;
    result::device::get_count().cuda("cuDeviceGetCount")
}

struct Module {
    raw: sys::CUmodule,
}

/// Device memory allocated stream-ordered from the context's pool, freed on the
/// same stream when dropped (behind the work queued there that uses it).
pub(crate) struct Workspace<'a> {
    dev: &'a CudaDevice,
    stream: usize,
    addr: Option<Addr>,
}

impl<'a> Workspace<'a> {
    pub fn new(dev: &'a CudaDevice, bytes: usize, stream: usize) -> Result<Workspace<'a>> {
        let ptr = dev.alloc_async(bytes, stream)?;
        // SAFETY: a fresh allocation of `bytes` bytes of this device (0, no memory,
        // when `bytes` is 0), freed only when this workspace drops, stream-ordered
        // behind the work queued on `stream` that uses it.
        let addr = unsafe { Addr::from_raw(ptr) };
        Ok(Workspace { dev, stream, addr })
    }

    /// The workspace's memory (`None` for 0 bytes), valid for its `bytes` while the
    /// workspace lives and for work queued on its stream before it drops.
    pub fn addr(&self) -> Option<Addr> {
        self.addr
    }
}

impl Drop for Workspace<'_> {
    fn drop(&mut self) {
        self.dev.free_async(raw(self.addr), self.stream);
    }
}

/// Switches the calling thread's stream-capture mode to relaxed for its life
/// (`cuThreadExchangeStreamCaptureMode`), then restores the previous mode. Under
/// it a thread may make the calls that stream capture otherwise forbids while a
/// capture is in progress (`cuMemAlloc`, module loading, the allocations inside
/// `cublasCreate`); fusekit uses it only for one-time setup that touches no
/// capturing stream, so the capture stays valid.
pub(crate) struct RelaxedCapture {
    prev: Option<sys::CUstreamCaptureMode>,
}

impl RelaxedCapture {
    pub fn new() -> RelaxedCapture {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges this thread's capture mode; `mode` is a valid in/out value.
        let r = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        RelaxedCapture {
            prev: (r == sys::CUresult::CUDA_SUCCESS).then_some(mode),
        }
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut m) = self.prev.take() {
            // SAFETY: restores the mode saved in `new`.
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m) };
        }
    }
}

/// Whether `stream` (of the current context; 0 is the legacy default stream) is
/// being captured into a CUDA graph. A legacy-stream query that the driver answers
/// with `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (another blocking stream captures)
/// counts as capturing: work queued there would join or break that capture.
pub(crate) fn is_capturing(stream: usize) -> bool {
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: writes the capture status of a stream of the current context.
    let r = unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut st) };
    match r {
        sys::CUresult::CUDA_SUCCESS => {
            st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        }
        sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => true,
        _ => false,
    }
}

/// One CUDA device: its retained primary context, the memory pool owned by this
/// fusekit context, and the per-context module cache.
pub struct CudaDevice {
    pub ordinal: usize,
    cu_device: sys::CUdevice,
    cu_ctx: sys::CUcontext,
    /// The stream-ordered memory pool of this context (`cuMemPoolCreate`); every
    /// owned device buffer comes from it (`cuMemAllocFromPoolAsync`).
    pool: sys::CUmemoryPool,
    /// Peer devices whose primary context this one has enabled peer access to.
    peers_enabled: Mutex<HashSet<usize>>,
    /// Devices granted read/write access to allocations of `pool`.
    pool_access: Mutex<HashSet<usize>>,
    /// Compute capability (major, minor).
    pub arch: (i32, i32),
    pub sm_count: i32,
    modules: Mutex<HashMap<&'static str, Arc<Module>>>,
    /// Keyed by the addresses of the static names (cheap to hash on the per-call path),
    /// with the dynamic shared memory the function is opted in to (0: the default 48 KB).
    functions: Mutex<HashMap<(usize, usize), (sys::CUfunction, u32)>>,
    /// cuBLAS / cuBLASLt handles and workspaces per stream (`cublas.rs`).
    pub(crate) blas: cublas::BlasCache,
    /// cuSOLVER handles per stream (`cusolver.rs`).
    pub(crate) solver: cusolver::SolverCache,
    /// Device-memory allocations of this device that `check_pointer` has already
    /// confirmed, as `[start, end)` address ranges, most recent first (at most
    /// `CHECKED_RANGES`): a pointer into one of them needs no driver query.
    checked: Mutex<Vec<(u64, u64)>>,
    /// Diagnosis switches of this context, read from the environment when it is
    /// created (never a process-global flag, so tests set them on their own context).
    /// `FK_DEBUG_SYNC=1`: every launch synchronises its stream and reports a kernel
    /// fault at the call that caused it (slow; for debugging).
    pub(crate) debug_sync: bool,
    /// `FK_LINALG_FALLBACK=1`, or `set_linalg_fallback`: see there.
    linalg_fallback: AtomicBool,
    /// On with `FK_MLP_FUSED=1`, or `set_mlp_fused(true)`: see there.
    mlp_fused: AtomicBool,
}

/// An environment switch: set, not empty and not `"0"`.
fn env_switch(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// How many allocation ranges `check_pointer` remembers per device. A framework's
/// caching allocator (PyTorch's) carves tensors out of a few large segments, so a
/// handful of ranges covers most of the pointers a program passes.
const CHECKED_RANGES: usize = 32;

// SAFETY: CUDA handles are usable from any thread once the context is current;
// `bind()` makes it current before every use, and the maps are behind mutexes.
unsafe impl Send for CudaDevice {}
unsafe impl Sync for CudaDevice {}
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl CudaDevice {
    /// Retains the primary context of device `ordinal` (shared with the CUDA
    /// runtime and PyTorch); never creates a context of its own.
    pub fn open(ordinal: usize) -> Result<CudaDevice> {
        let count = device_count()?;
        crate::ensure!(
            count > 0,
            FK_ERROR_CUDA_UNAVAILABLE,
            "the NVIDIA driver is loaded but reports no CUDA device"
        );
        crate::ensure!(
            (ordinal as i64) < count as i64,
            FK_ERROR_INVALID_ARGUMENT,
            "ordinal = {ordinal} but only {count} CUDA device(s) are present"
        );
        // A context may be created while another stream of the process is being
        // captured (PyTorch's torch.cuda.graph with fusekit's first call inside it):
        // its one-time setup (primary context, memory pool) touches no capturing
        // stream, so it runs in relaxed capture mode and leaves the capture valid.
        let _relaxed = RelaxedCapture::new();
        let cu_device = result::device::get(ordinal as i32).cuda("cuDeviceGet")?;
        // SAFETY: valid device handle.
        let cu_ctx =
            unsafe { result::primary_ctx::retain(cu_device) }.cuda("cuDevicePrimaryCtxRetain")?;
        let attr =
            |a| unsafe { result::device::get_attribute(cu_device, a) }.cuda("cuDeviceGetAttribute");
        use sys::CUdevice_attribute_enum as A;
        let attrs = (|| {
            Ok::<_, Error>((
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
                attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            ))
        })();
        let (major, minor, sm_count, pool) = match attrs
            .and_then(|(a, b, c)| Ok((a, b, c, runtime::pool_create(cu_ctx, ordinal)?)))
        {
            Ok(v) => v,
            Err(e) => {
                // SAFETY: retained above; nothing else holds it for us.
                let _ = unsafe { result::primary_ctx::release(cu_device) };
                return Err(e);
            }
        };
        let dev = CudaDevice {
            ordinal,
            cu_device,
            cu_ctx,
            pool,
            peers_enabled: Mutex::new(HashSet::new()),
            pool_access: Mutex::new(HashSet::new()),
            arch: (major, minor),
            sm_count,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            blas: Default::default(),
            solver: Default::default(),
            checked: Mutex::new(Vec::new()),
            debug_sync: env_switch("FK_DEBUG_SYNC"),
            linalg_fallback: AtomicBool::new(env_switch("FK_LINALG_FALLBACK")),
            mlp_fused: AtomicBool::new(env_switch("FK_MLP_FUSED")),
        };
        dev.bind()?;
        Ok(dev)
    }

    /// Sends this context's fused linear layer down its fallback path (a plain GEMM
    /// plus fusekit's epilogue kernel) instead of cuBLASLt's fused epilogues; for
    /// tests. Other contexts are unaffected; a context starts with
    /// `FK_LINALG_FALLBACK` as it was when the context was created.
    pub fn set_linalg_fallback(&self, on: bool) {
        self.linalg_fallback.store(on, Ordering::Relaxed);
    }

    /// Whether the fused linear layer takes its fallback path (`set_linalg_fallback`).
    pub fn linalg_fallback(&self) -> bool {
        self.linalg_fallback.load(Ordering::Relaxed)
    }

    /// Lets this context's MLP calls take the fully fused path where it applies
    /// (`on`), or keeps them on the general path (per-layer cuBLASLt calls, the
    /// default: on the H200 the fused kernels are still slower, docs/ops.md 6.4).
    /// A context starts with it on when `FK_MLP_FUSED=1` was set as the context
    /// was created.
    pub fn set_mlp_fused(&self, on: bool) {
        self.mlp_fused.store(on, Ordering::Relaxed);
    }

    /// Whether MLP calls may take the fully fused path (`set_mlp_fused`).
    pub fn mlp_fused(&self) -> bool {
        self.mlp_fused.load(Ordering::Relaxed)
    }

    /// Makes the primary context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        match result::ctx::get_current() {
            Ok(Some(c)) if c == self.cu_ctx => Ok(()),
            // SAFETY: the context is retained for the life of self.
            _ => unsafe { result::ctx::set_current(self.cu_ctx) }.cuda("cuCtxSetCurrent"),
        }
    }

    pub fn name(&self) -> Result<String> {
        result::device::get_name(self.cu_device).cuda("cuDeviceGetName")
    }

    pub fn memory_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (free, total) = result::mem_get_info().cuda("cuMemGetInfo")?;
        Ok((free as u64, total as u64))
    }

    pub fn stream_create(&self) -> Result<usize> {
        self.bind()?;
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .cuda("cuStreamCreate")?;
        Ok(s as usize)
    }

    pub fn stream_destroy(&self, raw: usize) {
        self.blas.evict(self, raw);
        self.solver.evict(raw);
        if self.bind().is_ok() {
            // SAFETY: an owned stream created by stream_create; destroyed once.
            let _ = unsafe { result::stream::destroy(raw as sys::CUstream) };
        }
    }

    /// Whether `raw` is being captured into a CUDA graph (see `is_capturing`).
    pub fn is_capturing(&self, raw: usize) -> Result<bool> {
        self.bind()?;
        Ok(is_capturing(raw))
    }

    /// `FK_ERROR_UNSUPPORTED` naming `entry` and `why` when `raw` is being captured
    /// into a CUDA graph; called before an op that cannot be captured queues anything,
    /// so the capture stays valid.
    pub fn refuse_capture(&self, raw: usize, entry: &str, why: &str) -> Result<()> {
        crate::ensure!(
            !self.is_capturing(raw)?,
            crate::error::FK_ERROR_UNSUPPORTED,
            "{entry} cannot be captured into a CUDA graph: {why}; nothing was queued and the capture is still valid (run this call outside the capture)"
        );
        Ok(())
    }

    /// `bytes` of plain device memory (`cuMemAlloc`, outside the stream-ordered
    /// pool), allocated with the thread's capture mode relaxed, so that it is legal
    /// while a stream is being captured and does not become a graph node. Freed by
    /// `free_plain`.
    pub fn alloc_plain(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        let _relaxed = RelaxedCapture::new();
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: ptr is a valid out-param; the context is current.
        unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) }
            .result()
            .map_err(|e| {
                let mut err = Error::from(e);
                if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    err.status = crate::error::FK_ERROR_OUT_OF_MEMORY;
                }
                err.message = format!(
                    "cuMemAlloc of {bytes} bytes on cuda:{} failed: {}",
                    self.ordinal, err.message
                );
                err
            })?;
        Ok(ptr)
    }

    /// Frees memory of `alloc_plain` (`cuMemFree`, which waits for work using it).
    pub fn free_plain(&self, ptr: u64) {
        if ptr == 0 || self.bind().is_err() {
            return;
        }
        let _relaxed = RelaxedCapture::new();
        // SAFETY: ptr came from alloc_plain and is freed once.
        let _ = unsafe { sys::cuMemFree_v2(ptr) };
    }

    pub fn stream_synchronize(&self, raw: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: a stream handle of this context (or the legacy default stream).
        unsafe { result::stream::synchronize(raw as sys::CUstream) }.cuda("cuStreamSynchronize")
    }

    /// Allocates `bytes` from this context's memory pool, stream-ordered on `stream`.
    /// Out of memory is `FK_ERROR_OUT_OF_MEMORY` with the requested and free bytes.
    pub fn alloc_async(&self, bytes: usize, stream: usize) -> Result<u64> {
        if bytes == 0 {
            return Ok(0);
        }
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the pool and stream belong to this context; ptr is a valid out-param.
        let r = unsafe {
            sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, self.pool, stream as sys::CUstream)
        }
        .result();
        match r {
            Ok(()) => Ok(ptr),
            Err(e) => {
                let mut err = Error::from(e);
                let (free, total) = result::mem_get_info().unwrap_or((0, 0));
                if e.0 == sys::CUresult::CUDA_ERROR_INVALID_VALUE && bytes > total {
                    // Some drivers answer an impossible size with INVALID_VALUE.
                    err.status = crate::error::FK_ERROR_OUT_OF_MEMORY;
                }
                err.message = format!(
                    "cuMemAllocFromPoolAsync of {bytes} bytes on cuda:{} failed ({free} bytes free of {total}): {}",
                    self.ordinal, err.message
                );
                Err(err)
            }
        }
    }

    pub fn free_async(&self, ptr: u64, stream: usize) {
        if ptr == 0 || self.bind().is_err() {
            return;
        }
        // SAFETY: ptr came from alloc_async and is freed once.
        let _ = unsafe { result::free_async(ptr, stream as sys::CUstream) };
    }

    /// Checks that `ptr` is memory this device can address (device memory of this
    /// device, managed memory, or registered host memory).
    ///
    /// The query (`cuPointerGetAttributes`, about 2.5 us) is made once per device
    /// allocation: the allocation's address range is remembered and later pointers
    /// into it pass without a driver call. The check guards against host pointers
    /// and other devices' memory; like the query itself it cannot tell whether the
    /// memory is still allocated (a range freed by its owner stays remembered until
    /// pushed out).
    pub fn check_pointer(&self, ptr: usize, what: &str) -> Result<()> {
        let p = ptr as u64;
        {
            let mut c = lock(&self.checked);
            if let Some(i) = c.iter().position(|&(a, b)| a <= p && p < b) {
                if i > 0 {
                    let r = c.remove(i);
                    c.insert(0, r);
                }
                return Ok(());
            }
        }
        self.bind()?;
        // cuPointerGetAttributes, unlike cuPointerGetAttribute, answers memory CUDA
        // does not know with memory type 0 instead of an error, so probing plain host
        // memory raises no CUDA API error (which compute-sanitizer would report).
        let mut mem_type: u32 = 0;
        let mut ord: i32 = -1;
        let mut start: sys::CUdeviceptr = 0;
        let mut size: usize = 0;
        let mut attrs = [
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        ];
        let mut data = [
            &mut mem_type as *mut u32 as *mut std::ffi::c_void,
            &mut ord as *mut i32 as *mut std::ffi::c_void,
            &mut start as *mut sys::CUdeviceptr as *mut std::ffi::c_void,
            &mut size as *mut usize as *mut std::ffi::c_void,
        ];
        // SAFETY: `data[i]` points to storage of the type of attribute `attrs[i]`.
        unsafe {
            sys::cuPointerGetAttributes(
                attrs.len() as u32,
                attrs.as_mut_ptr(),
                data.as_mut_ptr(),
                ptr as u64,
            )
        }
        .result()
        .cuda("cuPointerGetAttributes")?;
        crate::ensure!(
            mem_type != 0,
            FK_ERROR_DEVICE_MISMATCH,
            "{what} = {ptr:#x} is not memory CUDA knows (plain host memory?); cuda:{} buffers need device, managed or pinned host memory",
            self.ordinal
        );
        if mem_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            crate::ensure!(
                ord == self.ordinal as i32,
                FK_ERROR_DEVICE_MISMATCH,
                "{what} = {ptr:#x} is memory of cuda:{ord}, not cuda:{}",
                self.ordinal
            );
            if size > 0 && start <= p && p < start + size as u64 {
                let mut c = lock(&self.checked);
                c.insert(0, (start, start + size as u64));
                c.truncate(CHECKED_RANGES);
            }
        }
        Ok(())
    }

    /// Copies `bytes` between host memory and device address `dev` in the direction
    /// `host` names, queued on `stream`; `blocking` waits for it.
    pub fn memcpy_host(
        &self,
        host: HostMem,
        dev: u64,
        bytes: usize,
        stream: usize,
        blocking: bool,
    ) -> Result<()> {
        self.bind()?;
        let s = stream as sys::CUstream;
        // SAFETY: caller checked sizes; the host memory holds `bytes` bytes.
        unsafe {
            match host {
                HostMem::Src(src) => sys::cuMemcpyHtoDAsync_v2(dev, src as *const _, bytes, s)
                    .result()
                    .cuda("cuMemcpyHtoDAsync")?,
                HostMem::Dst(dst) => sys::cuMemcpyDtoHAsync_v2(dst as *mut _, dev, bytes, s)
                    .result()
                    .cuda("cuMemcpyDtoHAsync")?,
            }
        }
        if blocking {
            self.stream_synchronize(stream)
        } else {
            Ok(())
        }
    }

    /// `memcpy_host` from device address `src` into host memory `dst`.
    pub fn memcpy_dtoh(
        &self,
        dst: *mut u8,
        src: u64,
        bytes: usize,
        stream: usize,
        blocking: bool,
    ) -> Result<()> {
        self.memcpy_host(HostMem::Dst(dst), src, bytes, stream, blocking)
    }

    /// `sm_XY` for NVRTC.
    pub fn arch_name(&self) -> String {
        format!("sm_{}{}", self.arch.0, self.arch.1)
    }

    fn module(&self, name: &'static str, catalog: Catalog) -> Result<Arc<Module>> {
        let mut mods = lock(&self.modules);
        if let Some(m) = mods.get(name) {
            return Ok(m.clone());
        }
        let source = catalog(name).ok_or_else(|| {
            Error::new(
                crate::error::FK_ERROR_INTERNAL,
                format!("no kernel module named {name}"),
            )
        })?;
        let image = nvrtc::compile_cached(name, &source(), &self.arch_name())?;
        self.load_module(&mut mods, name, &image)
    }

    fn load_module(
        &self,
        mods: &mut HashMap<&'static str, Arc<Module>>,
        name: &'static str,
        image: &[u8],
    ) -> Result<Arc<Module>> {
        self.bind()?;
        // A module first used while a stream is being captured loads here: relax
        // this thread's capture mode so that the load (which may allocate the
        // module's globals) is legal; it touches no capturing stream.
        let _relaxed = RelaxedCapture::new();
        // SAFETY: image is a complete CUBIN for this device's architecture.
        let raw = unsafe { result::module::load_data(image.as_ptr() as *const _) }
            .cuda(&format!("cuModuleLoadData({name})"))?;
        let m = Arc::new(Module { raw });
        mods.insert(name, m.clone());
        Ok(m)
    }

    /// Looks up `function` in kernel module `module`, compiling it on first use (its
    /// source from `catalog`), opted in to `smem_bytes` of dynamic shared memory
    /// where that is above the default 48 KB. `cuFuncSetAttribute` is a driver call
    /// of several microseconds on the per-launch path, so it is made once per
    /// function and larger size (remembered beside the handle); the caller checks
    /// `smem_bytes` against the device's opt-in limit.
    pub fn function_for_smem(
        &self,
        module: &'static str,
        function: &'static str,
        smem_bytes: u32,
        catalog: Catalog,
    ) -> Result<sys::CUfunction> {
        const DEFAULT_SMEM: u32 = 48 << 10;
        let key = (module.as_ptr() as usize, function.as_ptr() as usize);
        let cached = lock(&self.functions).get(&key).copied();
        let (f, opted) = match cached {
            Some(e) => e,
            None => {
                let m = self.module(module, catalog)?;
                let cname = std::ffi::CString::new(function).unwrap_or_default();
                let _relaxed = RelaxedCapture::new();
                // SAFETY: module is loaded.
                let f = unsafe { result::module::get_function(m.raw, cname) }
                    .cuda(&format!("cuModuleGetFunction({module}::{function})"))?;
                lock(&self.functions).entry(key).or_insert((f, 0));
                (f, 0)
            }
        };
        if smem_bytes > DEFAULT_SMEM && smem_bytes > opted {
            self.bind()?;
            let _relaxed = RelaxedCapture::new();
            // SAFETY: a function of this context.
            unsafe {
                result::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem_bytes as i32,
                )
            }
            .cuda(&format!(
                "cuFuncSetAttribute({module}::{function}, MAX_DYNAMIC_SHARED_SIZE_BYTES = {smem_bytes})"
            ))?;
            let mut g = lock(&self.functions);
            let e = g.entry(key).or_insert((f, 0));
            e.1 = e.1.max(smem_bytes);
        }
        Ok(f)
    }

    /// Compiles every module of `all` not yet loaded, in parallel (NVRTC is
    /// thread-safe across programs), then loads them.
    pub fn warmup<'m>(&self, all: impl Iterator<Item = &'m ModuleSource>) -> Result<()> {
        let mut mods = lock(&self.modules);
        let arch = self.arch_name();
        let todo: Vec<_> = all.filter(|(n, _)| !mods.contains_key(n)).collect();
        let compiled: Vec<Result<Vec<u8>>> = std::thread::scope(|sc| {
            let jobs: Vec<_> = todo
                .iter()
                .map(|(name, source)| {
                    let arch = &arch;
                    sc.spawn(move || nvrtc::compile_cached(name, &source(), arch))
                })
                .collect();
            jobs.into_iter()
                .map(|j| {
                    j.join().unwrap_or_else(|_| {
                        Err(Error::new(
                            crate::error::FK_ERROR_INTERNAL,
                            "NVRTC worker panicked",
                        ))
                    })
                })
                .collect()
        });
        for ((name, _), image) in todo.iter().zip(compiled) {
            self.load_module(&mut mods, name, &image?)?;
        }
        Ok(())
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Kernels still queued (e.g. on a borrowed stream) may use the modules: wait
        // for the device before unloading them. Only the last reference gets here.
        if self.bind().is_ok() && result::ctx::synchronize().is_ok() {
            self.blas.clear(self);
            self.solver.clear();
            let mods = self.modules.get_mut().unwrap_or_else(|e| e.into_inner());
            for (_, m) in mods.drain() {
                // SAFETY: no function of this module is used after the device is gone.
                let _ = unsafe { result::module::unload(m.raw) };
            }
        }
        // Every buffer of this pool holds the context, so none is outstanding; were
        // one still queued, the driver releases the pool once it is freed.
        if self.bind().is_ok() {
            // SAFETY: created in open(), destroyed once.
            let _ = unsafe { sys::cuMemPoolDestroy(self.pool) }.result();
        }
        // SAFETY: retained in open().
        let _ = unsafe { result::primary_ctx::release(self.cu_device) };
    }
}
