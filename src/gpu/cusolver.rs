//! cuSOLVER (dense): run-time loading, one handle per (context, stream), and the
//! batched symmetric eigendecomposition the matrix power uses.
//!
//! Loading: one copy per process, beside cuBLAS where it can (`load`); every
//! function is called through `api`, the table of the loaded library.
//!
//! Solvers, chosen by size: `syevjBatched` (Jacobi, one launch for the whole batch)
//! for n <= 32, where it is fastest; `XsyevBatched` for larger batched matrices;
//! `syevd` (divide and conquer) for a single matrix, and per matrix where
//! `XsyevBatched` is not supported.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cusolver::sys as sv;

use super::{CudaDevice, Workspace};
use crate::addr::Addr;
use crate::addr::{ptr, raw};
use crate::dtype::DType;
use crate::error::{
    Error, FK_ERROR_CUDA, FK_ERROR_OUT_OF_MEMORY, FK_ERROR_UNSUPPORTED, Result, lock,
};

/// cuSOLVER's functions (cusolverDn.h), called through the library fusekit loaded
/// (`dynlib`: one copy per process).
mod api {
    use std::ffi::{c_int, c_void};

    use cudarc::cusolver::sys::*;

    crate::gpu::dynlib::dyn_lib! {
        pub(super) static FNS: Fns ("cuSOLVER");
        fn cusolverDnCreate(handle: *mut cusolverDnHandle_t) -> cusolverStatus_t;
        fn cusolverDnCreateParams(params: *mut cusolverDnParams_t) -> cusolverStatus_t;
        fn cusolverDnCreateSyevjInfo(info: *mut syevjInfo_t) -> cusolverStatus_t;
        fn cusolverDnDestroy(handle: cusolverDnHandle_t) -> cusolverStatus_t;
        fn cusolverDnDestroyParams(params: cusolverDnParams_t) -> cusolverStatus_t;
        fn cusolverDnDestroySyevjInfo(info: syevjInfo_t) -> cusolverStatus_t;
        fn cusolverDnSetStream(handle: cusolverDnHandle_t, stream: cudaStream_t) -> cusolverStatus_t;
        fn cusolverDnSsyevd(
            handle: cusolverDnHandle_t, jobz: cusolverEigMode_t, uplo: cublasFillMode_t, n: c_int,
            a: *mut f32, lda: c_int, w: *mut f32, work: *mut f32, lwork: c_int, info: *mut c_int,
        ) -> cusolverStatus_t;
        fn cusolverDnSsyevd_bufferSize(
            handle: cusolverDnHandle_t, jobz: cusolverEigMode_t, uplo: cublasFillMode_t, n: c_int,
            a: *const f32, lda: c_int, w: *const f32, lwork: *mut c_int,
        ) -> cusolverStatus_t;
        fn cusolverDnDsyevd(
            handle: cusolverDnHandle_t, jobz: cusolverEigMode_t, uplo: cublasFillMode_t, n: c_int,
            a: *mut f64, lda: c_int, w: *mut f64, work: *mut f64, lwork: c_int, info: *mut c_int,
        ) -> cusolverStatus_t;
        fn cusolverDnDsyevd_bufferSize(
            handle: cusolverDnHandle_t, jobz: cusolverEigMode_t, uplo: cublasFillMode_t, n: c_int,
            a: *const f64, lda: c_int, w: *const f64, lwork: *mut c_int,
        ) -> cusolverStatus_t;
        fn cusolverDnSsyevjBatched(
            handle: cusolverDnHandle_t, jobz: cusolverEigMode_t, uplo: cublasFillMode_t, n: c_int,
            a: *mut f32, lda: c_int, w: *mut f32, work: *mut f32, lwork: c_int, info: *mut c_int,
            params: syevjInfo_t, batch: c_int,
        ) -> cusolverStatus_t;
        fn cusolverDnSsyevjBatched_bufferSize(
            handle: cusolverDnHandle_t, jobz: cusolverEigMode_t, uplo: cublasFillMode_t, n: c_int,
            a: *const f32, lda: c_int, w: *const f32, lwork: *mut c_int, params: syevjInfo_t, batch: c_int,
        ) -> cusolverStatus_t;
        fn cusolverDnDsyevjBatched(
            handle: cusolverDnHandle_t, jobz: cusolverEigMode_t, uplo: cublasFillMode_t, n: c_int,
            a: *mut f64, lda: c_int, w: *mut f64, work: *mut f64, lwork: c_int, info: *mut c_int,
            params: syevjInfo_t, batch: c_int,
        ) -> cusolverStatus_t;
        fn cusolverDnDsyevjBatched_bufferSize(
            handle: cusolverDnHandle_t, jobz: cusolverEigMode_t, uplo: cublasFillMode_t, n: c_int,
            a: *const f64, lda: c_int, w: *const f64, lwork: *mut c_int, params: syevjInfo_t, batch: c_int,
        ) -> cusolverStatus_t;
        fn cusolverDnXsyevBatched(
            handle: cusolverDnHandle_t, params: cusolverDnParams_t, jobz: cusolverEigMode_t,
            uplo: cublasFillMode_t, n: i64, a_type: cudaDataType, a: *mut c_void, lda: i64,
            w_type: cudaDataType, w: *mut c_void, compute: cudaDataType,
            device_buf: *mut c_void, device_bytes: usize, host_buf: *mut c_void, host_bytes: usize,
            info: *mut c_int, batch: i64,
        ) -> cusolverStatus_t;
        fn cusolverDnXsyevBatched_bufferSize(
            handle: cusolverDnHandle_t, params: cusolverDnParams_t, jobz: cusolverEigMode_t,
            uplo: cublasFillMode_t, n: i64, a_type: cudaDataType, a: *const c_void, lda: i64,
            w_type: cudaDataType, w: *const c_void, compute: cudaDataType,
            device_bytes: *mut usize, host_bytes: *mut usize, batch: i64,
        ) -> cusolverStatus_t;
    }
}

/// Loads cuSOLVER once per process (it needs cuBLAS, loaded first): a copy already
/// in the process, `FK_CUSOLVER_PATH`, the folder cuBLAS came from (one install),
/// the CUDA roots and the `nvidia-cusolver` wheel, then the loader path
/// (`dynlib::find`); a missing library is `FK_ERROR_LIBRARY_NOT_FOUND`.
pub fn load() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), Error>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            super::cublas::load()?;
            let sonames = ["libcusolver.so.12", "libcusolver.so.11"];
            let mut paths = Vec::new();
            if let Ok((blas, _, _)) = super::cublas::loaded_pair() {
                if let Some(dir) = blas.parent() {
                    paths.extend(sonames.iter().map(|n| dir.join(n)));
                }
            }
            for r in super::nvrtc::cuda_roots() {
                for n in sonames {
                    for sub in ["lib64", "lib"] {
                        paths.push(r.join(sub).join(n));
                    }
                    if let Some(nv) = r.parent() {
                        paths.push(nv.join("cusolver").join("lib").join(n));
                    }
                }
            }
            let hint = "libcusolver.so.12 (cuSOLVER, needed by fk_matrix_power's eigendecomposition on CUDA) could not be loaded; install the CUDA toolkit, or `pip install \"nvidia-cusolver>=12,<13\"` (CUDA 13) into the active virtual environment, or set FK_CUSOLVER_PATH";
            let (h, _) = super::dynlib::find(
                &sonames,
                "FK_CUSOLVER_PATH",
                &paths,
                c"cusolverDnCreate",
                0,
                hint,
            )?;
            // SAFETY: a live handle of cuSOLVER.
            unsafe { api::Fns::install(h, hint) }
        })
        .clone()
}

fn check(what: &str, s: sv::cusolverStatus_t) -> Result<()> {
    use sv::cusolverStatus_t as S;
    let status = match s {
        S::CUSOLVER_STATUS_SUCCESS => return Ok(()),
        S::CUSOLVER_STATUS_ALLOC_FAILED => FK_ERROR_OUT_OF_MEMORY,
        S::CUSOLVER_STATUS_NOT_SUPPORTED => FK_ERROR_UNSUPPORTED,
        _ => FK_ERROR_CUDA,
    };
    Err(Error::new(status, format!("{what} failed: {s:?}")))
}

/// A cuSOLVER handle bound to one stream.
struct Handle {
    raw: sv::cusolverDnHandle_t,
    params: sv::cusolverDnParams_t,
    syevj: sv::syevjInfo_t,
}

// SAFETY: used only while its mutex is held, with the context current.
unsafe impl Send for Handle {}

impl Handle {
    fn release(&mut self) {
        // SAFETY: created in SolverCache::handle, destroyed once.
        unsafe {
            if !self.syevj.is_null() {
                api::cusolverDnDestroySyevjInfo(self.syevj);
            }
            if !self.params.is_null() {
                api::cusolverDnDestroyParams(self.params);
            }
            if !self.raw.is_null() {
                api::cusolverDnDestroy(self.raw);
            }
        }
        self.raw = std::ptr::null_mut();
        self.params = std::ptr::null_mut();
        self.syevj = std::ptr::null_mut();
    }
}

/// The context's cuSOLVER handles, one per stream (a field of `CudaDevice`).
#[derive(Default)]
pub struct SolverCache {
    handles: Mutex<HashMap<usize, Arc<Mutex<Handle>>>>,
}

impl SolverCache {
    fn handle(&self, dev: &CudaDevice, stream: usize) -> Result<Arc<Mutex<Handle>>> {
        let mut map = lock(&self.handles);
        if let Some(h) = map.get(&stream) {
            return Ok(h.clone());
        }
        load()?;
        dev.bind()?;
        let mut h = Handle {
            raw: std::ptr::null_mut(),
            params: std::ptr::null_mut(),
            syevj: std::ptr::null_mut(),
        };
        // SAFETY: out-parameters of fresh objects; the context is current.
        let made = unsafe {
            check("cusolverDnCreate", api::cusolverDnCreate(&mut h.raw))
                .and_then(|_| {
                    check(
                        "cusolverDnSetStream",
                        api::cusolverDnSetStream(h.raw, stream as sv::cudaStream_t),
                    )
                })
                .and_then(|_| {
                    check(
                        "cusolverDnCreateParams",
                        api::cusolverDnCreateParams(&mut h.params),
                    )
                })
                .and_then(|_| {
                    check(
                        "cusolverDnCreateSyevjInfo",
                        api::cusolverDnCreateSyevjInfo(&mut h.syevj),
                    )
                })
        };
        if let Err(e) = made {
            h.release();
            return Err(e);
        }
        let h = Arc::new(Mutex::new(h));
        map.insert(stream, h.clone());
        Ok(h)
    }

    /// Releases the handle of `stream` (an owned stream about to be destroyed).
    pub fn evict(&self, stream: usize) {
        let h = lock(&self.handles).remove(&stream);
        if let Some(h) = h {
            lock(&h).release();
        }
    }

    /// Releases every handle (the context is going away).
    pub fn clear(&self) {
        let all: Vec<_> = lock(&self.handles).drain().collect();
        for (_, h) in all {
            lock(&h).release();
        }
    }
}

/// Eigendecomposition of `batch` symmetric `n x n` matrices at `q` (column-major
/// with leading dimension n; only the lower triangle is read, which is the upper
/// triangle of the row-major input): on return `q` holds the eigenvectors (column
/// j, i.e. row j of the row-major view, is eigenvector j) and `w` the eigenvalues
/// in ascending order. Returns cuSOLVER's `info` per matrix (0: converged), which
/// waits for the stream.
pub fn syev_batched(
    dev: &CudaDevice,
    stream: usize,
    dtype: DType,
    n: i64,
    batch: i64,
    q: Addr,
    w: Addr,
) -> Result<Vec<i32>> {
    let h = dev.solver.handle(dev, stream)?;
    let h = lock(&h);
    dev.bind()?;
    let info = Workspace::new(dev, (batch as usize * 4).max(16), stream)?;
    let es = dtype.size() as u64;
    let (ni, bi) = (n as i32, batch as i32);
    let info_ptr = ptr::<i32>(info.addr());
    if n <= 32 {
        // SAFETY: q, w and info are device allocations of `batch` matrices, vectors
        // and ints; the handle is bound to `stream`.
        unsafe {
            if dtype == DType::F32 {
                f32::syevj_batched(&h, dev, stream, ni, bi, q, w, info_ptr)
            } else {
                f64::syevj_batched(&h, dev, stream, ni, bi, q, w, info_ptr)
            }
        }?;
    } else if batch == 1 || !batched_ok(&h, dtype, n, batch, q, w, info_ptr, dev, stream)? {
        for b in 0..batch as u64 {
            // SAFETY: b < batch: matrix b of q ([batch, n, n]) and vector b of w
            // ([batch, n]).
            let (qb, wb) = unsafe {
                (
                    q.byte_add(b * (n * n) as u64 * es),
                    w.byte_add(b * n as u64 * es),
                )
            };
            let ib = unsafe { info_ptr.add(b as usize) };
            syevd(&h, dtype, n, qb, wb, ib, dev, stream)?;
        }
    }
    let mut host = vec![0i32; batch as usize];
    dev.memcpy_dtoh(
        host.as_mut_ptr() as *mut u8,
        raw(info.addr()),
        batch as usize * 4,
        stream,
        true,
    )?;
    Ok(host)
}

fn cuda_type(d: DType) -> sv::cudaDataType {
    if d == DType::F32 {
        sv::cudaDataType::CUDA_R_32F
    } else {
        sv::cudaDataType::CUDA_R_64F
    }
}

/// `XsyevBatched`; `Ok(false)` when this cuSOLVER does not support it for the
/// shape (the caller loops `syevd`).
#[allow(clippy::too_many_arguments)]
fn batched_ok(
    h: &Handle,
    dtype: DType,
    n: i64,
    batch: i64,
    q: Addr,
    w: Addr,
    info: *mut i32,
    dev: &CudaDevice,
    stream: usize,
) -> Result<bool> {
    let t = cuda_type(dtype);
    let vec = sv::cusolverEigMode_t::CUSOLVER_EIG_MODE_VECTOR;
    let lower = sv::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER;
    let (mut dbytes, mut hbytes) = (0usize, 0usize);
    // SAFETY: size query on valid handles.
    let s = unsafe {
        api::cusolverDnXsyevBatched_bufferSize(
            h.raw,
            h.params,
            vec,
            lower,
            n,
            t,
            q.ptr::<c_void>(),
            n,
            t,
            w.ptr::<c_void>(),
            t,
            &mut dbytes,
            &mut hbytes,
            batch,
        )
    };
    if matches!(
        s,
        sv::cusolverStatus_t::CUSOLVER_STATUS_NOT_SUPPORTED
            | sv::cusolverStatus_t::CUSOLVER_STATUS_INVALID_VALUE
    ) {
        return Ok(false);
    }
    check("cusolverDnXsyevBatched_bufferSize", s)?;
    let work = Workspace::new(dev, dbytes.max(16), stream)?;
    let mut hwork = vec![0u8; hbytes.max(1)];
    // SAFETY: workspaces of the queried sizes; the host workspace outlives the call
    // (cuSOLVER uses it synchronously before returning).
    let s = unsafe {
        api::cusolverDnXsyevBatched(
            h.raw,
            h.params,
            vec,
            lower,
            n,
            t,
            q.ptr::<c_void>(),
            n,
            t,
            w.ptr::<c_void>(),
            t,
            ptr::<c_void>(work.addr()),
            dbytes,
            hwork.as_mut_ptr() as *mut c_void,
            hbytes,
            info,
            batch,
        )
    };
    if s == sv::cusolverStatus_t::CUSOLVER_STATUS_NOT_SUPPORTED {
        return Ok(false);
    }
    check("cusolverDnXsyevBatched", s)?;
    // The host workspace must stay alive until the stream has used it.
    dev.stream_synchronize(stream)?;
    drop(hwork);
    Ok(true)
}

/// One matrix through `syevd` (divide and conquer).
#[allow(clippy::too_many_arguments)]
fn syevd(
    h: &Handle,
    dtype: DType,
    n: i64,
    q: Addr,
    w: Addr,
    info: *mut i32,
    dev: &CudaDevice,
    stream: usize,
) -> Result<()> {
    // SAFETY: q, w and info are device allocations of one matrix, vector and int;
    // the handle is bound to `stream`.
    unsafe {
        if dtype == DType::F32 {
            f32::syevd(h, dev, stream, n as i32, q, w, info)
        } else {
            f64::syevd(h, dev, stream, n as i32, q, w, info)
        }
    }
}

/// cuSOLVER's real symmetric eigensolvers (eigenvectors, lower triangle) of one
/// element type: its `S` functions for f32, `D` for f64.
trait Syev {
    /// `syevjBatched` (Jacobi) on `batch` matrices `n x n` at `q`, eigenvalues to
    /// `w`, a status per matrix to `info`.
    ///
    /// # Safety
    /// `q`, `w`, `info` are device allocations of those sizes; the handle is bound
    /// to `stream`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn syevj_batched(
        h: &Handle,
        dev: &CudaDevice,
        stream: usize,
        n: i32,
        batch: i32,
        q: Addr,
        w: Addr,
        info: *mut i32,
    ) -> Result<()>;
    /// `syevd` (divide and conquer) on one matrix.
    ///
    /// # Safety
    /// As `syevj_batched` with `batch` 1.
    #[allow(clippy::too_many_arguments)]
    unsafe fn syevd(
        h: &Handle,
        dev: &CudaDevice,
        stream: usize,
        n: i32,
        q: Addr,
        w: Addr,
        info: *mut i32,
    ) -> Result<()>;
}

/// The two calls of one of cuSOLVER's legacy eigensolvers on `n x n` matrices at `q`
/// (eigenvectors, lower triangle; eigenvalues to `w`, a status to `info`): `$size`
/// asks for the workspace in elements of `$t`, then `$run` runs with it. The operands
/// follow the first `;`; after a second `;` come the trailing arguments both calls
/// take (`syevjBatched`'s parameters and batch).
/// Evaluates to the run's `Result<()>`; for the bodies of `Syev`'s unsafe methods,
/// whose contract covers both calls.
macro_rules! legacy_syev {
    ($t:ty, $size:ident, $run:ident; $h:expr, $dev:expr, $stream:expr, $n:expr, $q:expr, $w:expr, $info:expr $(; $($extra:expr),+)?) => {{
        let vec = sv::cusolverEigMode_t::CUSOLVER_EIG_MODE_VECTOR;
        let lower = sv::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER;
        let (a, w) = ($q.ptr::<$t>(), $w.ptr::<$t>());
        let mut lwork = 0i32;
        // SAFETY (both calls): the caller's contract; the workspace has the size
        // cuSOLVER asked for.
        check(stringify!($size), unsafe {
            api::$size($h.raw, vec, lower, $n, a, $n, w, &mut lwork $($(, $extra)+)?)
        })?;
        let bytes = (lwork as usize * size_of::<$t>()).max(16);
        let work = Workspace::new($dev, bytes, $stream)?;
        check(stringify!($run), unsafe {
            api::$run($h.raw, vec, lower, $n, a, $n, w, ptr::<$t>(work.addr()), lwork, $info $($(, $extra)+)?)
        })
    }};
}

macro_rules! syev {
    ($t:ty, $syevj_size:ident, $syevj:ident, $syevd_size:ident, $syevd:ident) => {
        impl Syev for $t {
            unsafe fn syevj_batched(
                h: &Handle,
                dev: &CudaDevice,
                stream: usize,
                n: i32,
                batch: i32,
                q: Addr,
                w: Addr,
                info: *mut i32,
            ) -> Result<()> {
                legacy_syev!($t, $syevj_size, $syevj; h, dev, stream, n, q, w, info; h.syevj, batch)
            }

            unsafe fn syevd(
                h: &Handle,
                dev: &CudaDevice,
                stream: usize,
                n: i32,
                q: Addr,
                w: Addr,
                info: *mut i32,
            ) -> Result<()> {
                legacy_syev!($t, $syevd_size, $syevd; h, dev, stream, n, q, w, info)
            }
        }
    };
}
syev!(
    f32,
    cusolverDnSsyevjBatched_bufferSize,
    cusolverDnSsyevjBatched,
    cusolverDnSsyevd_bufferSize,
    cusolverDnSsyevd
);
syev!(
    f64,
    cusolverDnDsyevjBatched_bufferSize,
    cusolverDnDsyevjBatched,
    cusolverDnDsyevd_bufferSize,
    cusolverDnDsyevd
);
