//! cuBLAS and cuBLASLt: run-time loading, handles cached per (context, stream), the
//! workspace, and the calls the linear-algebra launchers make.
//!
//! Loading: `libcublasLt.so.13` then `libcublas.so.13` are opened by full path
//! (`FK_CUBLASLT_PATH` / `FK_CUBLAS_PATH`, then the CUDA roots and the
//! `nvidia-cublas` wheel's `nvidia/cu13/lib`, as for NVRTC), then cudarc's own
//! by-name load finds them. Both are probed with `is_culib_present()` before the
//! first call, so a missing library is `FK_ERROR_LIBRARY_NOT_FOUND` with an install
//! hint, never cudarc's panic.
//!
//! Handles: one `Slot` per (context, stream) holds a cuBLAS handle bound to that
//! stream once (`cublasSetStream`), a cuBLASLt handle (its stream is per call), a
//! 32 MiB workspace allocated stream-ordered on that stream at first use and given
//! to both, a grow-only scratch buffer (the backward's `dz`), and the two copy
//! streams of the chunked GEMM (uploads and downloads, so that the two directions
//! use the GPU's two copy engines at once). Work queued on one stream runs in order, so everything a slot
//! owns is reused by the next call on the stream without synchronising. A slot is
//! locked while a call queues its work (two threads queuing on one stream do not
//! interleave). Slots go with their stream (`fk_stream_destroy` of an owned stream)
//! or with the context.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::sys as bs;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{result as dr, sys as ds};

use super::CudaDevice;
use crate::dtype::DType;
use crate::error::{
    CudaContext as _, Error, FK_ERROR_CUDA, FK_ERROR_LIBRARY_NOT_FOUND, FK_ERROR_OUT_OF_MEMORY,
    FK_ERROR_UNSUPPORTED, Result,
};
use crate::ops::linalg::{GemmPlan, Trans};

/// cuBLAS workspace per stream (NVIDIA's recommendation for Hopper).
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

// ------------------------------------------------------------------ loading

/// Opens `lib` (e.g. `libcublas.so`) by full path: `env`, then `<root>/lib64`,
/// `<root>/lib` of every CUDA root (toolkits, the CUDA 13 wheels' `nvidia/cu13`),
/// then the CUDA 12 wheel layout (`nvidia/<wheel>/lib`); major version 13 first,
/// then 12 (the same API for everything fusekit calls). Returns the places tried.
pub(crate) fn preload(env: &str, lib: &str, wheel: &str) -> Vec<String> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os(env) {
        candidates.push(PathBuf::from(v));
    }
    for major in ["13", "12"] {
        let soname = format!("{lib}.{major}");
        for r in super::nvrtc::cuda_roots() {
            for sub in ["lib64", "lib"] {
                candidates.push(r.join(sub).join(&soname));
            }
            if let Some(nv) = r.parent() {
                candidates.push(nv.join(wheel).join("lib").join(&soname));
            }
        }
    }
    for c in &candidates {
        if c.is_file() && super::nvrtc::dlopen_global(c) {
            break;
        }
    }
    candidates.iter().map(|c| c.display().to_string()).collect()
}

/// Loads cuBLASLt and cuBLAS once per process.
pub fn load() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), Error>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let tried_lt = preload("FK_CUBLASLT_PATH", "libcublasLt.so", "cublas");
            let tried = preload("FK_CUBLAS_PATH", "libcublas.so", "cublas");
            // SAFETY: only probe whether the libraries can be opened.
            let (has_lt, has_blas) = unsafe { (lt::is_culib_present(), bs::is_culib_present()) };
            if has_lt && has_blas {
                return Ok(());
            }
            let (name, env, tried) = if !has_lt {
                ("libcublasLt.so.13", "FK_CUBLASLT_PATH", tried_lt)
            } else {
                ("libcublas.so.13", "FK_CUBLAS_PATH", tried)
            };
            Err(Error::new(
                FK_ERROR_LIBRARY_NOT_FOUND,
                format!(
                    "{name} (cuBLAS, needed by the linear-algebra ops on CUDA) could not be loaded; install the CUDA toolkit, or `pip install \"nvidia-cublas>=13,<14\"` into the active virtual environment, or set {env}. Looked in the loader path and: {}",
                    tried.join(", ")
                ),
            ))
        })
        .clone()
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

/// Per-(context, stream) cuBLAS state; see the module docs.
pub struct Slot {
    pub stream: usize,
    pub blas: bs::cublasHandle_t,
    pub lt: lt::cublasLtHandle_t,
    pub workspace: u64,
    scratch: u64,
    scratch_bytes: usize,
    copy_stream: usize,
    download_stream: usize,
}

// SAFETY: the handles are used only while the slot's mutex is held, with the
// context current.
unsafe impl Send for Slot {}

/// Key of a cached cuBLASLt algorithm: every attribute the heuristic looked at.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct AlgoKey(pub Vec<i64>);

/// The context's cuBLAS state (a field of `CudaDevice`).
#[derive(Default)]
pub struct BlasCache {
    slots: Mutex<HashMap<usize, Arc<Mutex<Slot>>>>,
    /// `None`: cuBLASLt refused this configuration (the caller falls back).
    algos: Mutex<HashMap<AlgoKey, Option<lt::cublasLtMatmulAlgo_t>>>,
}

fn is_capturing(stream: usize) -> bool {
    let mut st = ds::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: writes the capture status of a stream of the current context.
    let r = unsafe { ds::cuStreamIsCapturing(stream as ds::CUstream, &mut st) };
    r == ds::CUresult::CUDA_SUCCESS
        && st != ds::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

fn no_capture(stream: usize, what: &str) -> Result<()> {
    crate::ensure!(
        !is_capturing(stream),
        FK_ERROR_UNSUPPORTED,
        "{what} would be created while the stream is being captured into a CUDA graph; run one linear-algebra op on this stream before capturing"
    );
    Ok(())
}

impl BlasCache {
    /// The slot of `stream`, created (handles, workspace) on first use.
    pub fn slot(&self, dev: &CudaDevice, stream: usize) -> Result<Arc<Mutex<Slot>>> {
        if let Some(s) = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&stream)
        {
            return Ok(s.clone());
        }
        load()?;
        dev.bind()?;
        no_capture(stream, "the cuBLAS handles and workspace")?;
        let mut blas: bs::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: writes a new handle; the context is current.
        check("cublasCreate", unsafe { bs::cublasCreate_v2(&mut blas) })?;
        let mut lth: lt::cublasLtHandle_t = std::ptr::null_mut();
        // SAFETY: as above.
        if let Err(e) = check_lt("cublasLtCreate", unsafe { lt::cublasLtCreate(&mut lth) }) {
            // SAFETY: created above.
            unsafe { bs::cublasDestroy_v2(blas) };
            return Err(e);
        }
        let mut slot = Slot {
            stream,
            blas,
            lt: lth,
            workspace: 0,
            scratch: 0,
            scratch_bytes: 0,
            copy_stream: 0,
            download_stream: 0,
        };
        let init = (|| -> Result<()> {
            slot.workspace = dev.alloc_async(WORKSPACE_BYTES, stream)?;
            // SAFETY: valid handle, stream of this context, workspace of its size.
            unsafe {
                check(
                    "cublasSetStream",
                    bs::cublasSetStream_v2(blas, stream as bs::cudaStream_t),
                )?;
                check(
                    "cublasSetWorkspace",
                    bs::cublasSetWorkspace_v2(blas, slot.workspace as *mut c_void, WORKSPACE_BYTES),
                )?;
            }
            Ok(())
        })();
        if let Err(e) = init {
            slot.release(dev, true);
            return Err(e);
        }
        let slot = Arc::new(Mutex::new(slot));
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        // Another thread may have raced us to the same stream: keep the first.
        let kept = slots.entry(stream).or_insert_with(|| slot.clone()).clone();
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
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&stream);
        if let Some(s) = slot {
            let mut g = s.lock().unwrap_or_else(|e| e.into_inner());
            g.release(dev, true);
        }
    }

    /// Releases every slot (the context is going away; the device is idle).
    pub fn clear(&self, dev: &CudaDevice) {
        let slots: Vec<_> = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for (_, s) in slots {
            let mut g = s.lock().unwrap_or_else(|e| e.into_inner());
            g.release(dev, false);
        }
    }

    pub fn cached_algo(&self, key: &AlgoKey) -> Option<Option<lt::cublasLtMatmulAlgo_t>> {
        self.algos
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
    }

    pub fn store_algo(&self, key: AlgoKey, v: Option<lt::cublasLtMatmulAlgo_t>) {
        self.algos
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, v);
    }
}

impl Slot {
    /// Destroys the handles and frees the memory (`ordered`: free on the slot's
    /// stream, behind its queued work; otherwise the device is idle).
    fn release(&mut self, dev: &CudaDevice, ordered: bool) {
        if dev.bind().is_err() {
            return;
        }
        // SAFETY: handles created in BlasCache::slot, destroyed once.
        unsafe {
            if !self.blas.is_null() {
                bs::cublasDestroy_v2(self.blas);
                self.blas = std::ptr::null_mut();
            }
            if !self.lt.is_null() {
                lt::cublasLtDestroy(self.lt);
                self.lt = std::ptr::null_mut();
            }
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
        for s in [&mut self.copy_stream, &mut self.download_stream] {
            if *s != 0 {
                dev.stream_destroy(*s);
                *s = 0;
            }
        }
    }

    /// A scratch buffer of at least `bytes` on this slot's stream (grown as needed;
    /// valid for work queued on the stream until the next call that grows it).
    pub fn scratch(&mut self, dev: &CudaDevice, bytes: usize) -> Result<u64> {
        if bytes <= self.scratch_bytes {
            return Ok(self.scratch);
        }
        no_capture(self.stream, "a larger scratch buffer")?;
        if self.scratch != 0 {
            dev.free_async(self.scratch, self.stream);
            self.scratch = 0;
            self.scratch_bytes = 0;
        }
        // 1/8 headroom so that slowly growing sizes do not reallocate every call
        let want = (bytes + bytes / 8).next_multiple_of(1 << 20);
        self.scratch = dev.alloc_async(want, self.stream)?;
        self.scratch_bytes = want;
        Ok(self.scratch)
    }

    /// The upload (host-to-device) copy stream of the chunked GEMM (created on
    /// first use).
    pub fn copy_stream(&mut self, dev: &CudaDevice) -> Result<usize> {
        if self.copy_stream == 0 {
            self.copy_stream = dev.stream_create()?;
        }
        Ok(self.copy_stream)
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

/// Scalars as cuBLAS reads them for the compute type (host pointer mode).
enum HostScalar {
    F32(f32),
    F64(f64),
    C32([f32; 2]),
    C64([f64; 2]),
}

impl HostScalar {
    fn new(d: DType, re: f64, im: f64) -> HostScalar {
        match d {
            DType::F16 | DType::BF16 | DType::F32 => HostScalar::F32(re as f32),
            DType::F64 => HostScalar::F64(re),
            DType::C64 => HostScalar::C32([re as f32, im as f32]),
            DType::C128 => HostScalar::C64([re, im]),
        }
    }
    fn ptr(&self) -> *const c_void {
        match self {
            HostScalar::F32(v) => v as *const f32 as *const c_void,
            HostScalar::F64(v) => v as *const f64 as *const c_void,
            HostScalar::C32(v) => v.as_ptr() as *const c_void,
            HostScalar::C64(v) => v.as_ptr() as *const c_void,
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
    // SAFETY: the plan was validated (every pointer and stride addresses the
    // operands), the handle is bound to the slot's stream, the scalars outlive the
    // call (host pointer mode reads them before returning).
    let s = unsafe {
        bs::cublasGemmStridedBatchedEx(
            slot.blas,
            bs_op(p.op_b),
            bs_op(p.op_a),
            p.n as i32,
            p.m as i32,
            p.k as i32,
            alpha.ptr(),
            p.b.ptr as *const c_void,
            t,
            p.b.ld as i32,
            p.b.batch_stride,
            p.a.ptr as *const c_void,
            t,
            p.a.ld as i32,
            p.a.batch_stride,
            beta.ptr(),
            p.c.ptr as *mut c_void,
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
    pub a: usize,
    pub lda: i64,
    pub b: usize,
    pub ldb: i64,
    pub d: usize,
    pub ldd: i64,
    pub epilogue: Epilogue,
    pub bias: usize,
    pub aux: usize,
    pub aux_ld: i64,
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
fn alignment(p: usize) -> i64 {
    if p == 0 {
        256
    } else {
        (1i64 << p.trailing_zeros().min(8)).min(256)
    }
}

struct Descs {
    op: lt::cublasLtMatmulDesc_t,
    layouts: [lt::cublasLtMatrixLayout_t; 3],
    pref: lt::cublasLtMatmulPreference_t,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: created in lt_matmul, destroyed once (null ones skipped).
        unsafe {
            if !self.op.is_null() {
                lt::cublasLtMatmulDescDestroy(self.op);
            }
            for l in self.layouts {
                if !l.is_null() {
                    lt::cublasLtMatrixLayoutDestroy(l);
                }
            }
            if !self.pref.is_null() {
                lt::cublasLtMatmulPreferenceDestroy(self.pref);
            }
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
        lt::cublasLtMatmulDescSetAttribute(d, a, v as *const T as *const c_void, size_of::<T>())
    })
}

unsafe fn set_pref<T>(
    d: lt::cublasLtMatmulPreference_t,
    a: lt::cublasLtMatmulPreferenceAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: v is a value of the attribute's type.
    check_lt("cublasLtMatmulPreferenceSetAttribute", unsafe {
        lt::cublasLtMatmulPreferenceSetAttribute(
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
        alignment(c.a),
        alignment(c.b),
        alignment(c.d),
        alignment(c.bias),
        alignment(c.aux),
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
    let t = lt_type(c.dtype);
    let mut descs = Descs {
        op: std::ptr::null_mut(),
        layouts: [std::ptr::null_mut(); 3],
        pref: std::ptr::null_mut(),
    };
    // SAFETY: descriptors are created here and destroyed by `descs`; attribute
    // values have the documented types (int32 ops, uint32 epilogue, pointers).
    unsafe {
        check_lt(
            "cublasLtMatmulDescCreate",
            lt::cublasLtMatmulDescCreate(
                &mut descs.op,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                lt::cudaDataType_t::CUDA_R_32F,
            ),
        )?;
        let (ta, tb) = (c.trans_a as i32, c.trans_b as i32);
        set_desc(descs.op, A::CUBLASLT_MATMUL_DESC_TRANSA, &ta)?;
        set_desc(descs.op, A::CUBLASLT_MATMUL_DESC_TRANSB, &tb)?;
        let epi = c.epilogue as u32;
        set_desc(descs.op, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
        if c.bias != 0 {
            let p = c.bias as *const c_void;
            set_desc(descs.op, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p)?;
        }
        if c.aux != 0 {
            let p = c.aux as *const c_void;
            set_desc(descs.op, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p)?;
            set_desc(descs.op, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &c.aux_ld)?;
        }
        let (ar, ac) = if c.trans_a { (c.k, c.m) } else { (c.m, c.k) };
        let (br, bc) = if c.trans_b { (c.n, c.k) } else { (c.k, c.n) };
        let dims = [(ar, ac, c.lda), (br, bc, c.ldb), (c.m, c.n, c.ldd)];
        for (l, (r, cols, ld)) in descs.layouts.iter_mut().zip(dims) {
            check_lt(
                "cublasLtMatrixLayoutCreate",
                lt::cublasLtMatrixLayoutCreate(l, t, r, cols, ld),
            )?;
        }
        let algo = match cached {
            Some(Some(a)) => a,
            _ => {
                check_lt(
                    "cublasLtMatmulPreferenceCreate",
                    lt::cublasLtMatmulPreferenceCreate(&mut descs.pref),
                )?;
                let ws = WORKSPACE_BYTES as u64;
                set_pref(descs.pref, P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws)?;
                let al = |p: usize| alignment(p) as u32;
                set_pref(
                    descs.pref,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    &al(c.a),
                )?;
                set_pref(
                    descs.pref,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    &al(c.b),
                )?;
                set_pref(
                    descs.pref,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    &al(c.d),
                )?;
                set_pref(
                    descs.pref,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                    &al(c.d),
                )?;
                let mut res: lt::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
                let mut count = 0i32;
                let s = lt::cublasLtMatmulAlgoGetHeuristic(
                    slot.lt,
                    descs.op,
                    descs.layouts[0],
                    descs.layouts[1],
                    descs.layouts[2],
                    descs.layouts[2],
                    descs.pref,
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
        let s = lt::cublasLtMatmul(
            slot.lt,
            descs.op,
            &one as *const f32 as *const c_void,
            c.a as *const c_void,
            descs.layouts[0],
            c.b as *const c_void,
            descs.layouts[1],
            &zero as *const f32 as *const c_void,
            c.d as *const c_void,
            descs.layouts[2],
            c.d as *mut c_void,
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

/// Makes the driver's error type usable with `?` after raw driver calls.
pub fn driver(what: &str, r: ds::CUresult) -> Result<()> {
    r.result().cuda(what)
}
