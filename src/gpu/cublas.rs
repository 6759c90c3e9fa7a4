//! cuBLAS and cuBLASLt: run-time loading, handles cached per (context, stream), the
//! workspace, and the calls the linear-algebra launchers make.
//!
//! Loading: one cuBLAS / cuBLASLt pair per process, and every function called
//! through its table (`cublas_api`: the choice of the pair, and why not cudarc's
//! by-name loading); a missing library is `FK_ERROR_LIBRARY_NOT_FOUND` with an
//! install hint.
//!
//! Handles: one cuBLAS and one cuBLASLt handle per context, created on first use
//! (with the thread's capture mode relaxed, so also during a stream capture), behind
//! a mutex; a call holds it while it binds the cuBLAS handle to its stream and
//! workspace (`cublasSetStream`, then `cublasSetWorkspace`, skipped when already
//! bound) and queues its work (cuBLASLt takes stream and workspace per call).
//!
//! Slots: one `Slot` per (context, stream) holds a 32 MiB workspace (stream-ordered
//! from the pool on that stream at first use; plain `cuMemAlloc` memory when the
//! first use is inside a capture, so that it is no graph allocation), a grow-only
//! scratch buffer (the backward's `dz`; not used while the stream captures, see
//! `Slot::scratch`), and the two copy streams of the chunked GEMM (uploads and
//! downloads, so that the two directions use the GPU's two copy engines at once).
//! Work queued on one stream runs in order, so everything a slot owns is reused by
//! the next call on the stream without synchronising; two streams never share a
//! workspace. A slot is locked while a call queues its work (two threads queuing
//! on one stream do not interleave). Slots go with their stream
//! (`fk_stream_destroy` of an owned stream) or with the context. A CUDA graph
//! captured from these calls holds the address of its stream's workspace: replay
//! it while the context (and, for an owned stream, the stream) lives, and not
//! concurrently with other work of the capturing stream.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::cublas::sys as bs;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{result as dr, sys as ds};

use super::CudaDevice;
use super::cublas_api::{api, blas as bsf, lt as ltf};
use crate::addr::Addr;
use crate::addr::ptr;
use crate::dtype::DType;
use crate::error::{
    CudaContext as _, Error, FK_ERROR_CUDA, FK_ERROR_OUT_OF_MEMORY, FK_ERROR_UNSUPPORTED, Result,
    lock,
};
use crate::plan::linalg::{GemmPlan, Trans};

/// cuBLAS workspace per stream (NVIDIA's recommendation for Hopper).
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

// ------------------------------------------------------------------ loading

/// Loads the process's cuBLAS / cuBLASLt pair once (`cublas_api`).
pub fn load() -> Result<()> {
    api().map(|_| ())
}

/// The files and version (`major * 10000 + minor * 100 + patch`) of the cuBLAS /
/// cuBLASLt pair fusekit loaded, loading it if needed.
pub fn loaded_pair() -> Result<(PathBuf, PathBuf, usize)> {
    let a = api()?;
    Ok((a.files.0.clone(), a.files.1.clone(), a.version))
}

fn name_of(s: bs::cublasStatus_t) -> String {
    format!("{s:?}")
}

/// A cuBLAS / cuBLASLt status as an `Error` naming the call.
pub fn blas_err(what: &str, s: bs::cublasStatus_t) -> Error {
    let status = match s {
        bs::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED => FK_ERROR_OUT_OF_MEMORY,
        bs::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => FK_ERROR_UNSUPPORTED,
        _ => FK_ERROR_CUDA,
    };
    Error::new(status, format!("{what} failed: {}", name_of(s)))
}

fn check(what: &str, s: bs::cublasStatus_t) -> Result<()> {
    if s == bs::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(blas_err(what, s))
    }
}

fn lt_status(s: lt::cublasStatus_t) -> bs::cublasStatus_t {
    use bs::cublasStatus_t as S;
    // The same numbering in both libraries' headers (cublas_api.h).
    match s as u32 {
        0 => S::CUBLAS_STATUS_SUCCESS,
        1 => S::CUBLAS_STATUS_NOT_INITIALIZED,
        3 => S::CUBLAS_STATUS_ALLOC_FAILED,
        7 => S::CUBLAS_STATUS_INVALID_VALUE,
        8 => S::CUBLAS_STATUS_ARCH_MISMATCH,
        11 => S::CUBLAS_STATUS_MAPPING_ERROR,
        13 => S::CUBLAS_STATUS_EXECUTION_FAILED,
        15 => S::CUBLAS_STATUS_NOT_SUPPORTED,
        16 => S::CUBLAS_STATUS_LICENSE_ERROR,
        _ => S::CUBLAS_STATUS_INTERNAL_ERROR,
    }
}

thread_local! {
    static DECLINES: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((0, String::new())) };
}

fn declined(why: String) {
    DECLINES.with(|d| {
        let mut d = d.borrow_mut();
        d.0 += 1;
        d.1 = why;
    });
}

/// How many fused-epilogue calls cuBLASLt declined on this thread (each then ran
/// the fallback), and why the last one was declined. For tests and diagnosis.
pub fn lt_declines_on_this_thread() -> (u64, String) {
    DECLINES.with(|d| d.borrow().clone())
}

fn check_lt(what: &str, s: lt::cublasStatus_t) -> Result<()> {
    check(what, lt_status(s))
}

// ------------------------------------------------------------------ slots

/// The context's cuBLAS and cuBLASLt handles (one pair per context, created on
/// first use), and the stream and workspace the cuBLAS handle is bound to now.
struct HandleState {
    blas: bs::cublasHandle_t,
    lt: lt::cublasLtHandle_t,
    bound_stream: usize,
    bound_workspace: u64,
}

/// The handles behind their mutex: a call holds it while it binds the cuBLAS
/// handle to its stream and workspace and queues its work.
pub struct Handles(Mutex<HandleState>);

// SAFETY: the handles are used only while the mutex is held, with the context
// current.
unsafe impl Send for Handles {}
unsafe impl Sync for Handles {}

/// The locked handles, the cuBLAS one bound to a slot's stream and workspace.
pub struct HandleGuard<'a>(std::sync::MutexGuard<'a, HandleState>);

impl HandleGuard<'_> {
    /// The cuBLAS handle (bound to the slot's stream and workspace).
    pub fn blas(&self) -> bs::cublasHandle_t {
        self.0.blas
    }
    /// The cuBLASLt handle (stream and workspace are arguments of each call).
    pub fn lt(&self) -> lt::cublasLtHandle_t {
        self.0.lt
    }
}

/// Per-(context, stream) state; see the module docs.
pub struct Slot {
    pub stream: usize,
    handles: Arc<Handles>,
    pub workspace: u64,
    /// The workspace is plain `cuMemAlloc` memory (the slot was made while the
    /// stream was being captured), freed with `cuMemFree`; else it came from the
    /// pool, stream-ordered on `stream`.
    workspace_plain: bool,
    scratch: u64,
    scratch_bytes: usize,
    copy_stream: usize,
    download_stream: usize,
    side: Option<SideLane>,
    /// cuBLASLt's matmul and layout descriptors of each configuration this slot ran
    /// (`lt_matmul`), made once and reused: only the bias and aux pointers change
    /// between calls of one configuration. Borrowed only inside `lt_matmul`, with
    /// the slot's mutex held.
    descs: RefCell<HashMap<AlgoKey, Descs>>,
}

/// A second stream beside a slot's stream and the two events that fork it from
/// and join it back into that stream (the MLP backward's weight gradients), made
/// on first use and released with the slot. Recorded and waited on inside a call,
/// so under a capture the events are graph edges and the second stream joins the
/// capture until the join.
#[derive(Clone, Copy)]
pub struct SideLane {
    pub stream: usize,
    pub fork: ds::CUevent,
    pub join: ds::CUevent,
}

// SAFETY: the slot's raw values are used only while its mutex is held, with the
// context current.
unsafe impl Send for Slot {}

/// Key of a cached cuBLASLt algorithm: every attribute the heuristic looked at.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct AlgoKey(pub Vec<i64>);

/// The context's cuBLAS state (a field of `CudaDevice`).
#[derive(Default)]
pub struct BlasCache {
    handles: Mutex<Option<Arc<Handles>>>,
    slots: Mutex<HashMap<usize, Arc<Mutex<Slot>>>>,
    /// `None`: cuBLASLt refused this configuration (the caller falls back).
    algos: Mutex<HashMap<AlgoKey, Option<lt::cublasLtMatmulAlgo_t>>>,
}

impl BlasCache {
    /// The context's handles, created on first use. Creation runs with the
    /// thread's capture mode relaxed: `cublasCreate` / `cublasLtCreate` allocate
    /// device memory, which a capture in progress (on this thread's stream, or a
    /// global-mode capture on any thread) would otherwise forbid. They touch no
    /// capturing stream, so the capture stays valid.
    fn handles(&self, dev: &CudaDevice) -> Result<Arc<Handles>> {
        let mut h = lock(&self.handles);
        if let Some(h) = h.as_ref() {
            return Ok(h.clone());
        }
        load()?;
        dev.bind()?;
        let _relaxed = super::RelaxedCapture::new();
        let mut blas: bs::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: writes a new handle; the context is current.
        check("cublasCreate", unsafe { bsf::cublasCreate_v2(&mut blas) })?;
        let mut lth: lt::cublasLtHandle_t = std::ptr::null_mut();
        // SAFETY: as above.
        if let Err(e) = check_lt("cublasLtCreate", unsafe { ltf::cublasLtCreate(&mut lth) }) {
            // SAFETY: created above.
            unsafe { bsf::cublasDestroy_v2(blas) };
            return Err(e);
        }
        let made = Arc::new(Handles(Mutex::new(HandleState {
            blas,
            lt: lth,
            bound_stream: 0,
            bound_workspace: 0,
        })));
        *h = Some(made.clone());
        Ok(made)
    }

    /// The slot of `stream`, created (workspace) on first use. Legal while the
    /// stream is being captured: the handles are the context's (see `handles`), and
    /// a workspace first needed during a capture is plain device memory
    /// (`CudaDevice::alloc_plain`, not a graph allocation) that lives with the slot.
    pub fn slot(&self, dev: &CudaDevice, stream: usize) -> Result<Arc<Mutex<Slot>>> {
        if let Some(s) = lock(&self.slots).get(&stream) {
            return Ok(s.clone());
        }
        dev.bind()?;
        let handles = self.handles(dev)?;
        let capturing = super::is_capturing(stream);
        let workspace = if capturing {
            dev.alloc_plain(WORKSPACE_BYTES)?
        } else {
            dev.alloc_async(WORKSPACE_BYTES, stream)?
        };
        let slot = Slot {
            stream,
            handles,
            workspace,
            workspace_plain: capturing,
            scratch: 0,
            scratch_bytes: 0,
            copy_stream: 0,
            download_stream: 0,
            side: None,
            descs: RefCell::new(HashMap::new()),
        };
        let slot = Arc::new(Mutex::new(slot));
        let mut slots = lock(&self.slots);
        // Another thread may have raced us to the same stream: keep the first.
        let kept = slots.entry(stream).or_insert_with(|| slot.clone()).clone();
        drop(slots);
        if !Arc::ptr_eq(&kept, &slot) {
            if let Ok(m) = Arc::try_unwrap(slot) {
                m.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .release(dev, true);
            }
        }
        Ok(kept)
    }

    /// Releases the slot of `stream` (an owned stream about to be destroyed); its
    /// memory is freed stream-ordered behind the work already queued there.
    pub fn evict(&self, dev: &CudaDevice, stream: usize) {
        let slot = lock(&self.slots).remove(&stream);
        if let Some(s) = slot {
            let mut g = lock(&s);
            g.release(dev, true);
        }
    }

    /// Releases every slot and the handles (the context is going away; the device
    /// is idle).
    pub fn clear(&self, dev: &CudaDevice) {
        let slots: Vec<_> = lock(&self.slots).drain().collect();
        for (_, s) in slots {
            let mut g = lock(&s);
            g.release(dev, false);
        }
        let h = lock(&self.handles).take();
        if let Some(h) = h {
            if dev.bind().is_err() {
                return;
            }
            let mut st = lock(&h.0);
            // The handles exist, so the library loaded.
            if api().is_err() {
                return;
            }
            // SAFETY: created in `handles`, destroyed once (the slots are gone).
            unsafe {
                if !st.blas.is_null() {
                    bsf::cublasDestroy_v2(st.blas);
                    st.blas = std::ptr::null_mut();
                }
                if !st.lt.is_null() {
                    ltf::cublasLtDestroy(st.lt);
                    st.lt = std::ptr::null_mut();
                }
            }
        }
    }

    pub fn cached_algo(&self, key: &AlgoKey) -> Option<Option<lt::cublasLtMatmulAlgo_t>> {
        lock(&self.algos).get(key).copied()
    }

    pub fn store_algo(&self, key: AlgoKey, v: Option<lt::cublasLtMatmulAlgo_t>) {
        lock(&self.algos).insert(key, v);
    }
}

/// Scratch memory of one call: the slot's cached buffer, or (while the stream is
/// being captured) a stream-ordered allocation of this call, freed on the stream
/// when dropped (inside a capture: a graph allocation and its free).
pub struct CallScratch<'d> {
    addr: Option<Addr>,
    _owned: Option<super::Workspace<'d>>,
}

impl CallScratch<'_> {
    /// The scratch memory (at least the bytes asked for; `None` for none).
    pub fn addr(&self) -> Option<Addr> {
        self.addr
    }

    /// Scratch the caller owns (a workspace it passed in): nothing is allocated or
    /// freed.
    pub fn borrowed(addr: Addr) -> Self {
        CallScratch {
            addr: Some(addr),
            _owned: None,
        }
    }
}

impl Slot {
    /// The context's handles, locked, with the cuBLAS handle bound to this slot's
    /// stream and workspace (`cublasSetStream` resets the workspace, so the
    /// workspace is set after it); both calls are skipped when already bound.
    pub fn handle(&self) -> Result<HandleGuard<'_>> {
        let mut st = lock(&self.handles.0);
        if st.bound_stream != self.stream || st.bound_workspace != self.workspace {
            st.bound_stream = 0;
            st.bound_workspace = 0;
            // SAFETY: valid handle; a stream of this context; a workspace of
            // WORKSPACE_BYTES owned by this slot.
            unsafe {
                check(
                    "cublasSetStream",
                    bsf::cublasSetStream_v2(st.blas, self.stream as bs::cudaStream_t),
                )?;
                check(
                    "cublasSetWorkspace",
                    bsf::cublasSetWorkspace_v2(
                        st.blas,
                        self.workspace as *mut c_void,
                        WORKSPACE_BYTES,
                    ),
                )?;
            }
            st.bound_stream = self.stream;
            st.bound_workspace = self.workspace;
        }
        Ok(HandleGuard(st))
    }

    /// Frees the memory (`ordered`: pool memory freed on the slot's stream, behind
    /// its queued work; otherwise the device is idle) and unbinds the handles from
    /// the slot's stream.
    fn release(&mut self, dev: &CudaDevice, ordered: bool) {
        {
            let mut st = lock(&self.handles.0);
            if st.bound_stream == self.stream {
                st.bound_stream = 0;
                st.bound_workspace = 0;
            }
        }
        if dev.bind().is_err() {
            return;
        }
        if self.workspace != 0 && self.workspace_plain {
            dev.free_plain(self.workspace);
            self.workspace = 0;
        }
        for p in [self.workspace, self.scratch] {
            if p == 0 {
                continue;
            }
            if ordered {
                dev.free_async(p, self.stream);
            } else {
                // SAFETY: allocated by alloc_async; the device is idle.
                let _ = unsafe { dr::free_sync(p) };
            }
        }
        self.workspace = 0;
        self.scratch = 0;
        self.scratch_bytes = 0;
        self.descs.get_mut().clear();
        if let Some(side) = self.side.take() {
            for e in [side.fork, side.join] {
                // SAFETY: created in side_lane, destroyed once (CUDA defers it
                // until the work that records or waits on it is done).
                unsafe { ds::cuEventDestroy_v2(e) };
            }
            dev.stream_destroy(side.stream);
        }
        for s in [&mut self.copy_stream, &mut self.download_stream] {
            if *s != 0 {
                dev.stream_destroy(*s);
                *s = 0;
            }
        }
    }

    /// Scratch of at least `bytes` for work queued on this slot's stream, valid
    /// until the returned value is dropped. Outside a capture it is the slot's
    /// grow-only buffer (valid for work queued on the stream until the next call
    /// that grows it). While the stream is being captured the cached buffer is
    /// neither used nor grown (a graph would keep its address after a later call
    /// freed it): the call gets its own stream-ordered allocation, which the capture
    /// records as a graph allocation freed after the call's last use.
    pub fn scratch<'d>(&mut self, dev: &'d CudaDevice, bytes: usize) -> Result<CallScratch<'d>> {
        if super::is_capturing(self.stream) {
            let ws = super::Workspace::new(dev, bytes.max(16), self.stream)?;
            return Ok(CallScratch {
                addr: ws.addr(),
                _owned: Some(ws),
            });
        }
        if bytes > self.scratch_bytes {
            if self.scratch != 0 {
                dev.free_async(self.scratch, self.stream);
                self.scratch = 0;
                self.scratch_bytes = 0;
            }
            // 1/8 headroom so that slowly growing sizes do not reallocate every call
            let want = (bytes + bytes / 8).next_multiple_of(1 << 20);
            self.scratch = dev.alloc_async(want, self.stream)?;
            self.scratch_bytes = want;
        }
        Ok(CallScratch {
            // SAFETY: the slot's cached allocation of `scratch_bytes` >= `bytes` of
            // this device, freed only by a later call that grows it or by the
            // slot's drop, both stream-ordered behind the work queued with it.
            addr: unsafe { Addr::from_raw(self.scratch) },
            _owned: None,
        })
    }

    /// The upload (host-to-device) copy stream of the chunked GEMM (created on
    /// first use).
    pub fn copy_stream(&mut self, dev: &CudaDevice) -> Result<usize> {
        if self.copy_stream == 0 {
            self.copy_stream = dev.stream_create()?;
        }
        Ok(self.copy_stream)
    }

    /// The slot's side lane (created on first use, with the thread's capture mode
    /// relaxed: stream and event creation touch no capturing stream).
    pub fn side_lane(&mut self, dev: &CudaDevice) -> Result<SideLane> {
        if let Some(s) = self.side {
            return Ok(s);
        }
        dev.bind()?;
        let _relaxed = super::RelaxedCapture::new();
        let mut ev = [std::ptr::null_mut(); 2];
        for (i, e) in ev.iter_mut().enumerate() {
            // SAFETY: writes a new event of the current context.
            let r =
                unsafe { ds::cuEventCreate(e, ds::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) };
            if let Err(err) = r.result().cuda("cuEventCreate") {
                for made in &ev[..i] {
                    // SAFETY: created just above.
                    unsafe { ds::cuEventDestroy_v2(*made) };
                }
                return Err(err);
            }
        }
        let stream = match dev.stream_create() {
            Ok(s) => s,
            Err(e) => {
                for made in ev {
                    // SAFETY: created just above.
                    unsafe { ds::cuEventDestroy_v2(made) };
                }
                return Err(e);
            }
        };
        let lane = SideLane {
            stream,
            fork: ev[0],
            join: ev[1],
        };
        self.side = Some(lane);
        Ok(lane)
    }

    /// The download (device-to-host) copy stream of the chunked GEMM (created on
    /// first use): a stream of its own, so that downloads never queue behind
    /// uploads (and the two directions' copy engines run at once).
    pub fn download_stream(&mut self, dev: &CudaDevice) -> Result<usize> {
        if self.download_stream == 0 {
            self.download_stream = dev.stream_create()?;
        }
        Ok(self.download_stream)
    }
}

// ------------------------------------------------------------------ cuBLAS GEMM

fn bs_op(t: Trans) -> bs::cublasOperation_t {
    match t {
        Trans::N => bs::cublasOperation_t::CUBLAS_OP_N,
        Trans::T => bs::cublasOperation_t::CUBLAS_OP_T,
        Trans::C => bs::cublasOperation_t::CUBLAS_OP_C,
    }
}

fn bs_type(d: DType) -> bs::cudaDataType {
    use bs::cudaDataType as T;
    match d {
        DType::F16 => T::CUDA_R_16F,
        DType::BF16 => T::CUDA_R_16BF,
        DType::F32 => T::CUDA_R_32F,
        DType::F64 => T::CUDA_R_64F,
        DType::C64 => T::CUDA_C_32F,
        DType::C128 => T::CUDA_C_64F,
    }
}

/// `cuComplex` as CUDA declares it (`float2`, 8-byte aligned).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq)]
struct CuComplex([f32; 2]);

/// `cuDoubleComplex` as CUDA declares it (`double2`, 16-byte aligned). cuBLAS
/// reads a complex128 `alpha`/`beta` with aligned 16-byte loads (`movdqa`): a
/// `[f64; 2]` (8-byte aligned) at an address 8 mod 16 made cuBLAS 13.0 fault
/// inside `cublasLtZZZMatmul` (the complex128 crash; docs/linalg.md).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, PartialEq)]
struct CuDoubleComplex([f64; 2]);

// The layouts of CUDA's `float2` / `double2` (vector_types.h).
const _: () = assert!(size_of::<CuComplex>() == 8 && align_of::<CuComplex>() == 8);
const _: () = assert!(size_of::<CuDoubleComplex>() == 16 && align_of::<CuDoubleComplex>() == 16);

/// Scalars as cuBLAS reads them for the compute type (host pointer mode), each
/// with the size and alignment of the CUDA type it stands for.
enum HostScalar {
    F32(f32),
    F64(f64),
    C32(CuComplex),
    C64(CuDoubleComplex),
}

impl HostScalar {
    fn new(d: DType, re: f64, im: f64) -> HostScalar {
        match d {
            DType::F16 | DType::BF16 | DType::F32 => HostScalar::F32(re as f32),
            DType::F64 => HostScalar::F64(re),
            DType::C64 => HostScalar::C32(CuComplex([re as f32, im as f32])),
            DType::C128 => HostScalar::C64(CuDoubleComplex([re, im])),
        }
    }
    fn ptr(&self) -> *const c_void {
        match self {
            HostScalar::F32(v) => v as *const f32 as *const c_void,
            HostScalar::F64(v) => v as *const f64 as *const c_void,
            HostScalar::C32(v) => v as *const CuComplex as *const c_void,
            HostScalar::C64(v) => v as *const CuDoubleComplex as *const c_void,
        }
    }
}

/// One GEMM (batched, strided) through `cublasGemmStridedBatchedEx` on the slot's
/// stream. Row-major `C = op(A) op(B)` is computed as the column-major
/// `C^T = op(B)^T op(A)^T`: cuBLAS's first operand is B with `op_b`, its second A
/// with `op_a` (a row-major `[r, c]` matrix with row stride `ld` is a column-major
/// `[c, r]` one with leading dimension `ld`).
pub fn gemm_ex(slot: &Slot, p: &GemmPlan) -> Result<()> {
    use bs::cublasComputeType_t as C;
    let compute = match p.dtype {
        DType::F64 | DType::C128 => C::CUBLAS_COMPUTE_64F,
        DType::F32 | DType::C64 if p.allow_tf32 => C::CUBLAS_COMPUTE_32F_FAST_TF32,
        _ => C::CUBLAS_COMPUTE_32F,
    };
    let alpha = HostScalar::new(p.dtype, p.alpha.re, p.alpha.im);
    let beta = HostScalar::new(p.dtype, p.beta.re, p.beta.im);
    let t = bs_type(p.dtype);
    let h = slot.handle()?;
    let [a, b, c] = [p.a, p.b, p.c].map(|m| ptr::<c_void>(m.addr));
    // SAFETY: the plan was validated (every pointer and stride addresses the
    // operands), the handle is bound to the slot's stream, the scalars outlive the
    // call (host pointer mode reads them before returning).
    let s = unsafe {
        bsf::cublasGemmStridedBatchedEx(
            h.blas(),
            bs_op(p.op_b),
            bs_op(p.op_a),
            p.n as i32,
            p.m as i32,
            p.k as i32,
            alpha.ptr(),
            b,
            t,
            p.b.ld as i32,
            p.b.batch_stride,
            a,
            t,
            p.a.ld as i32,
            p.a.batch_stride,
            beta.ptr(),
            c,
            t,
            p.c.ld as i32,
            p.c.batch_stride,
            p.batch as i32,
            compute,
            bs::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    check("cublasGemmStridedBatchedEx", s)
}

// ------------------------------------------------------------------ cuBLASLt

/// cuBLASLt epilogues used here (values of `cublasLtEpilogue_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    Default = 1,
    Relu = 2,
    Bias = 4,
    ReluBias = 6,
    Gelu = 32,
    GeluBias = 36,
    GeluAux = 160,
    GeluAuxBias = 164,
    /// ReLU keeping its bit mask in aux (`AUX_LD` in bits, a multiple of 128).
    ReluAux = 130,
    ReluAuxBias = 134,
    /// `D = D * relu'(mask in aux)`; `_BGRAD` also writes the bias gradient (the
    /// sums of D's rows, after the derivative) to the bias pointer.
    DRelu = 136,
    DReluBgrad = 152,
    /// `D = D * gelu_tanh'(pre-activation in aux)`; `_BGRAD` as `DReluBgrad`.
    DGelu = 192,
    DGeluBgrad = 208,
}

/// One column-major cuBLASLt product `D = alpha op(A) op(B) (+ epilogue)`, with
/// `D` `m x n` (no C input: beta = 0), f16 / bf16 / f32 storage, f32 compute.
pub struct LtCall {
    pub dtype: DType,
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub a: Option<Addr>,
    pub lda: i64,
    pub b: Option<Addr>,
    pub ldb: i64,
    pub d: Option<Addr>,
    pub ldd: i64,
    pub epilogue: Epilogue,
    /// `None`: no such operand (the epilogue tells which it reads).
    pub bias: Option<Addr>,
    pub aux: Option<Addr>,
    pub aux_ld: i64,
    /// f32 products may use TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    pub tf32: bool,
}

fn lt_type(d: DType) -> lt::cudaDataType_t {
    use lt::cudaDataType_t as T;
    match d {
        DType::F16 => T::CUDA_R_16F,
        DType::BF16 => T::CUDA_R_16BF,
        _ => T::CUDA_R_32F,
    }
}

/// Largest power of two dividing `p`, at most 256.
fn alignment(p: *mut c_void) -> i64 {
    if p.is_null() {
        256
    } else {
        (1i64 << p.addr().trailing_zeros().min(8)).min(256)
    }
}

/// The descriptors of one matmul configuration: the operation (compute type,
/// transposes, epilogue) and the layouts of A, B and D; host objects of
/// cuBLASLt, cached per slot (`Slot::descs`).
struct Descs {
    op: lt::cublasLtMatmulDesc_t,
    layouts: [lt::cublasLtMatrixLayout_t; 3],
}

// SAFETY: cuBLASLt descriptors are host memory with no thread affinity; a slot's
// are used only with its mutex held.
unsafe impl Send for Descs {}

impl Drop for Descs {
    fn drop(&mut self) {
        // Descriptors exist, so the library loaded.
        if api().is_err() {
            return;
        }
        // SAFETY: created in Descs::new, destroyed once (null ones skipped).
        unsafe {
            if !self.op.is_null() {
                ltf::cublasLtMatmulDescDestroy(self.op);
            }
            for l in self.layouts {
                if !l.is_null() {
                    ltf::cublasLtMatrixLayoutDestroy(l);
                }
            }
        }
    }
}

impl Descs {
    /// The descriptors of `c` (its pointers excepted: `lt_matmul` sets the bias
    /// and aux pointers of each call).
    fn new(c: &LtCall) -> Result<Descs> {
        use lt::cublasLtMatmulDescAttributes_t as A;
        let t = lt_type(c.dtype);
        let mut d = Descs {
            op: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
        };
        // SAFETY: descriptors are created here and destroyed by `d`'s drop (also on
        // an early return); attribute values have the documented types (int32
        // ops, uint32 epilogue, int64 leading dimension).
        unsafe {
            check_lt(
                "cublasLtMatmulDescCreate",
                ltf::cublasLtMatmulDescCreate(
                    &mut d.op,
                    if c.tf32 && c.dtype == DType::F32 {
                        lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
                    } else {
                        lt::cublasComputeType_t::CUBLAS_COMPUTE_32F
                    },
                    lt::cudaDataType_t::CUDA_R_32F,
                ),
            )?;
            let (ta, tb) = (c.trans_a as i32, c.trans_b as i32);
            set_desc(d.op, A::CUBLASLT_MATMUL_DESC_TRANSA, &ta)?;
            set_desc(d.op, A::CUBLASLT_MATMUL_DESC_TRANSB, &tb)?;
            let epi = c.epilogue as u32;
            set_desc(d.op, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
            if c.aux.is_some() {
                set_desc(d.op, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &c.aux_ld)?;
            }
            let (ar, ac) = if c.trans_a { (c.k, c.m) } else { (c.m, c.k) };
            let (br, bc) = if c.trans_b { (c.n, c.k) } else { (c.k, c.n) };
            let dims = [(ar, ac, c.lda), (br, bc, c.ldb), (c.m, c.n, c.ldd)];
            for (l, (r, cols, ld)) in d.layouts.iter_mut().zip(dims) {
                check_lt(
                    "cublasLtMatrixLayoutCreate",
                    ltf::cublasLtMatrixLayoutCreate(l, t, r, cols, ld),
                )?;
            }
        }
        Ok(d)
    }
}

/// A heuristic query's preference, destroyed on drop.
struct Pref(lt::cublasLtMatmulPreference_t);

impl Drop for Pref {
    fn drop(&mut self) {
        if !self.0.is_null() && api().is_ok() {
            // SAFETY: created in lt_matmul, destroyed once.
            unsafe { ltf::cublasLtMatmulPreferenceDestroy(self.0) };
        }
    }
}

unsafe fn set_desc<T>(
    d: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: v is a value of the attribute's type.
    check_lt("cublasLtMatmulDescSetAttribute", unsafe {
        ltf::cublasLtMatmulDescSetAttribute(d, a, v as *const T as *const c_void, size_of::<T>())
    })
}

unsafe fn set_pref<T>(
    d: lt::cublasLtMatmulPreference_t,
    a: lt::cublasLtMatmulPreferenceAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: v is a value of the attribute's type.
    check_lt("cublasLtMatmulPreferenceSetAttribute", unsafe {
        ltf::cublasLtMatmulPreferenceSetAttribute(
            d,
            a,
            v as *const T as *const c_void,
            size_of::<T>(),
        )
    })
}

/// Runs `c` through cuBLASLt on the slot's stream. `Ok(false)`: cuBLASLt declined
/// the configuration (no algorithm for it); nothing was queued and the caller
/// falls back to a plain GEMM plus an epilogue kernel.
pub fn lt_matmul(dev: &CudaDevice, slot: &Slot, c: &LtCall) -> Result<bool> {
    use lt::cublasLtMatmulDescAttributes_t as A;
    use lt::cublasLtMatmulPreferenceAttributes_t as P;
    let [a, b, d, bias, aux] = [c.a, c.b, c.d, c.bias, c.aux].map(ptr::<c_void>);
    let key = AlgoKey(vec![
        c.dtype as i64,
        c.trans_a as i64,
        c.trans_b as i64,
        c.m as i64,
        c.n as i64,
        c.k as i64,
        c.lda,
        c.ldb,
        c.ldd,
        c.epilogue as i64,
        c.aux_ld,
        alignment(a),
        alignment(b),
        alignment(d),
        alignment(bias),
        alignment(aux),
        c.tf32 as i64,
        // with or without each pointer: the cached descriptors (Descs::new) differ
        bias.is_null() as i64,
        aux.is_null() as i64,
    ]);
    let cached = dev.blas.cached_algo(&key);
    let describe = |what: &str| {
        format!(
            "{what} for {:?} {:?} m={} n={} k={} trans_a={} trans_b={} ld={}/{}/{}",
            c.epilogue, c.dtype, c.m, c.n, c.k, c.trans_a, c.trans_b, c.lda, c.ldb, c.ldd
        )
    };
    if cached == Some(None) {
        declined(describe("cached decline"));
        return Ok(false);
    }
    let h = slot.handle()?;
    let mut cache = slot.descs.borrow_mut();
    let descs = match cache.entry(key.clone()) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => e.insert(Descs::new(c)?),
    };
    // SAFETY: the descriptors are the slot's (destroyed only with its cache);
    // attribute values have the documented types (device pointers). The key tells
    // configurations with and without each pointer apart, so a cached descriptor
    // never holds a pointer its call lacks.
    unsafe {
        if !bias.is_null() {
            let p = bias.cast_const();
            set_desc(descs.op, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p)?;
        }
        if !aux.is_null() {
            let p = aux.cast_const();
            set_desc(descs.op, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p)?;
        }
        let algo = match cached {
            Some(Some(a)) => a,
            _ => {
                let mut pref = Pref(std::ptr::null_mut());
                check_lt(
                    "cublasLtMatmulPreferenceCreate",
                    ltf::cublasLtMatmulPreferenceCreate(&mut pref.0),
                )?;
                let ws = WORKSPACE_BYTES as u64;
                set_pref(pref.0, P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws)?;
                let al = |p: *mut c_void| alignment(p) as u32;
                set_pref(
                    pref.0,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    &al(a),
                )?;
                set_pref(
                    pref.0,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    &al(b),
                )?;
                set_pref(
                    pref.0,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    &al(d),
                )?;
                set_pref(
                    pref.0,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                    &al(d),
                )?;
                let mut res: lt::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
                let mut count = 0i32;
                let s = ltf::cublasLtMatmulAlgoGetHeuristic(
                    h.lt(),
                    descs.op,
                    descs.layouts[0],
                    descs.layouts[1],
                    descs.layouts[2],
                    descs.layouts[2],
                    pref.0,
                    1,
                    &mut res,
                    &mut count,
                );
                let s = lt_status(s);
                if s != bs::cublasStatus_t::CUBLAS_STATUS_SUCCESS || count == 0 {
                    if matches!(
                        s,
                        bs::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                            | bs::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED
                            | bs::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE
                    ) {
                        dev.blas.store_algo(key, None);
                        declined(describe(&format!("heuristic: {s:?}, {count} algorithms")));
                        return Ok(false);
                    }
                    return Err(blas_err("cublasLtMatmulAlgoGetHeuristic", s));
                }
                dev.blas.store_algo(key.clone(), Some(res.algo));
                res.algo
            }
        };
        let (one, zero) = (1.0f32, 0.0f32);
        let s = ltf::cublasLtMatmul(
            h.lt(),
            descs.op,
            &one as *const f32 as *const c_void,
            a,
            descs.layouts[0],
            b,
            descs.layouts[1],
            &zero as *const f32 as *const c_void,
            d,
            descs.layouts[2],
            d,
            descs.layouts[2],
            &algo,
            slot.workspace as *mut c_void,
            WORKSPACE_BYTES,
            slot.stream as lt::cudaStream_t,
        );
        let s = lt_status(s);
        if matches!(
            s,
            bs::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED
                | bs::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE
        ) {
            dev.blas.store_algo(key, None);
            declined(describe(&format!("cublasLtMatmul: {s:?}")));
            return Ok(false);
        }
        check("cublasLtMatmul", s)?;
    }
    Ok(true)
}
