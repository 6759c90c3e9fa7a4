//! One cuBLAS / cuBLASLt pair per process, and the table of the entry points
//! fusekit calls in it.
//!
//! cudarc's `cublas::sys` / `cublaslt::sys` functions open their library by name
//! (`libcublas.so` first) on their first call. After fusekit had opened a pair by
//! full path (`FK_CUBLAS_PATH`, a wheel), that by-name load could map a second build
//! (the toolkit's, found through the loader cache), so that one process held two
//! cuBLAS libraries, possibly each with its own cuBLASLt. fusekit therefore resolves
//! every cuBLAS / cuBLASLt function it calls from the pair it chose itself
//! (`Api`), and uses cudarc only for the types. The choice, made once:
//! 1. a pair already in the process (`dlopen(RTLD_NOLOAD)` by soname, e.g. the one
//!    PyTorch loaded): fusekit shares it; `FK_CUBLAS_PATH` naming another file is
//!    an error rather than a second copy;
//! 2. `FK_CUBLAS_PATH`;
//! 3. the CUDA roots (`CUDA_HOME`, `CUDA_PATH`, `/usr/local/cuda`, the CUDA 13
//!    wheels' `nvidia/cu13`; `lib64` and `lib`), then the CUDA 12 wheel layout;
//!    major version 13 first, then 12;
//! 4. the loader path, by soname.
//!
//! cuBLASLt comes from `FK_CUBLASLT_PATH`, else from the folder cuBLAS came from
//! (else the loader path), and is opened first, so that cuBLAS's own dependency on
//! `libcublasLt.so.<major>` resolves (by soname) to the same file. The two must
//! report the same version (`cublasGetProperty` against `cublasLtGetVersion`),
//! else loading fails with both paths named.

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::cublas::sys as bs;

use super::dynlib::{already_loaded, file_of, open};

use crate::error::{Error, FK_ERROR_LIBRARY_NOT_FOUND, Result};

/// The pair fusekit loaded, with the two function tables.
pub(crate) struct Api {
    pub blas: blas::Fns,
    pub lt: lt::Fns,
    /// The files the pair was loaded from (cuBLAS, cuBLASLt).
    pub files: (PathBuf, PathBuf),
    /// cuBLAS's version as `major * 10000 + minor * 100 + patch`.
    pub version: usize,
}

/// The loaded pair, for the wrappers (reached only after `api()` succeeded: every
/// call needs a handle, and handles are made after loading).
fn loaded() -> &'static Api {
    api().expect("cuBLAS is loaded before its functions are called")
}

/// cuBLAS's functions (cublas_api.h), called through the loaded pair.
pub(crate) mod blas {
    use std::ffi::{c_int, c_void};

    use cudarc::cublas::sys::*;

    fn fns() -> &'static Fns {
        &super::loaded().blas
    }

    crate::gpu::dynlib::dyn_lib! {
        pub(crate) struct Fns, loaded by fns;
        fn cublasCreate_v2(handle: *mut cublasHandle_t) -> cublasStatus_t;
        fn cublasDestroy_v2(handle: cublasHandle_t) -> cublasStatus_t;
        fn cublasSetStream_v2(handle: cublasHandle_t, stream: cudaStream_t) -> cublasStatus_t;
        fn cublasSetWorkspace_v2(handle: cublasHandle_t, workspace: *mut c_void, bytes: usize) -> cublasStatus_t;
        fn cublasGetProperty(t: libraryPropertyType, value: *mut c_int) -> cublasStatus_t;
        fn cublasGemmStridedBatchedEx(
            handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
            m: c_int, n: c_int, k: c_int, alpha: *const c_void,
            a: *const c_void, a_type: cudaDataType, lda: c_int, stride_a: i64,
            b: *const c_void, b_type: cudaDataType, ldb: c_int, stride_b: i64,
            beta: *const c_void, c: *mut c_void, c_type: cudaDataType, ldc: c_int, stride_c: i64,
            batch: c_int, compute: cublasComputeType_t, algo: cublasGemmAlgo_t,
        ) -> cublasStatus_t;
        fn cublasSsyrk_v2(
            handle: cublasHandle_t, uplo: cublasFillMode_t, trans: cublasOperation_t, n: c_int, k: c_int,
            alpha: *const f32, a: *const f32, lda: c_int, beta: *const f32, c: *mut f32, ldc: c_int,
        ) -> cublasStatus_t;
        fn cublasDsyrk_v2(
            handle: cublasHandle_t, uplo: cublasFillMode_t, trans: cublasOperation_t, n: c_int, k: c_int,
            alpha: *const f64, a: *const f64, lda: c_int, beta: *const f64, c: *mut f64, ldc: c_int,
        ) -> cublasStatus_t;
    }
}

/// cuBLASLt's functions (cublasLt.h), called through the loaded pair.
pub(crate) mod lt {
    use std::ffi::{c_int, c_void};

    use cudarc::cublaslt::sys::*;

    fn fns() -> &'static Fns {
        &super::loaded().lt
    }

    crate::gpu::dynlib::dyn_lib! {
        pub(crate) struct Fns, loaded by fns;
        fn cublasLtCreate(handle: *mut cublasLtHandle_t) -> cublasStatus_t;
        fn cublasLtDestroy(handle: cublasLtHandle_t) -> cublasStatus_t;
        fn cublasLtGetVersion() -> usize;
        fn cublasLtMatmul(
            handle: cublasLtHandle_t, desc: cublasLtMatmulDesc_t, alpha: *const c_void,
            a: *const c_void, a_desc: cublasLtMatrixLayout_t, b: *const c_void, b_desc: cublasLtMatrixLayout_t,
            beta: *const c_void, c: *const c_void, c_desc: cublasLtMatrixLayout_t,
            d: *mut c_void, d_desc: cublasLtMatrixLayout_t,
            algo: *const cublasLtMatmulAlgo_t, workspace: *mut c_void, workspace_bytes: usize, stream: cudaStream_t,
        ) -> cublasStatus_t;
        fn cublasLtMatmulAlgoGetHeuristic(
            handle: cublasLtHandle_t, desc: cublasLtMatmulDesc_t,
            a: cublasLtMatrixLayout_t, b: cublasLtMatrixLayout_t,
            c: cublasLtMatrixLayout_t, d: cublasLtMatrixLayout_t,
            pref: cublasLtMatmulPreference_t, requested: c_int,
            results: *mut cublasLtMatmulHeuristicResult_t, returned: *mut c_int,
        ) -> cublasStatus_t;
        fn cublasLtMatmulDescCreate(
            desc: *mut cublasLtMatmulDesc_t, compute: cublasComputeType_t, scale: cudaDataType_t,
        ) -> cublasStatus_t;
        fn cublasLtMatmulDescDestroy(desc: cublasLtMatmulDesc_t) -> cublasStatus_t;
        fn cublasLtMatmulDescSetAttribute(
            desc: cublasLtMatmulDesc_t, attr: cublasLtMatmulDescAttributes_t, buf: *const c_void, bytes: usize,
        ) -> cublasStatus_t;
        fn cublasLtMatmulPreferenceCreate(pref: *mut cublasLtMatmulPreference_t) -> cublasStatus_t;
        fn cublasLtMatmulPreferenceDestroy(pref: cublasLtMatmulPreference_t) -> cublasStatus_t;
        fn cublasLtMatmulPreferenceSetAttribute(
            pref: cublasLtMatmulPreference_t, attr: cublasLtMatmulPreferenceAttributes_t,
            buf: *const c_void, bytes: usize,
        ) -> cublasStatus_t;
        fn cublasLtMatrixLayoutCreate(
            layout: *mut cublasLtMatrixLayout_t, t: cudaDataType, rows: u64, cols: u64, ld: i64,
        ) -> cublasStatus_t;
        fn cublasLtMatrixLayoutDestroy(layout: cublasLtMatrixLayout_t) -> cublasStatus_t;
    }
}

/// The process's cuBLAS / cuBLASLt pair, loaded on first use (see the module docs).
pub(crate) fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, Error>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(|e| e.clone())
}

const MAJORS: [&str; 2] = ["13", "12"];

fn not_found(msg: String) -> Error {
    Error::new(FK_ERROR_LIBRARY_NOT_FOUND, msg)
}

/// Where cuBLAS of major version `major` may be, in order: the CUDA roots'
/// `lib64` and `lib`, the CUDA 12 wheel layout.
fn search_paths(major: &str) -> Vec<PathBuf> {
    let soname = format!("libcublas.so.{major}");
    let mut v = Vec::new();
    for r in super::nvrtc::cuda_roots() {
        for sub in ["lib64", "lib"] {
            v.push(r.join(sub).join(&soname));
        }
        if let Some(nv) = r.parent() {
            v.push(nv.join("cublas").join("lib").join(&soname));
        }
    }
    v
}

/// The major version in a cuBLAS / cuBLASLt file name (`libcublas.so.13.1.0.3`).
fn major_of(p: &Path) -> Option<&'static str> {
    let name = p.file_name()?.to_str()?;
    MAJORS
        .into_iter()
        .find(|m| name.contains(&format!(".so.{m}")))
}

/// cuBLASLt for a cuBLAS file: `FK_CUBLASLT_PATH`, else the same folder.
pub(crate) fn lt_beside(blas: &Path) -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("FK_CUBLASLT_PATH") {
        return Some(PathBuf::from(v));
    }
    let major = major_of(blas)?;
    let f = blas.parent()?.join(format!("libcublasLt.so.{major}"));
    f.is_file().then_some(f)
}

fn load() -> std::result::Result<Api, Error> {
    let env = std::env::var_os("FK_CUBLAS_PATH").map(PathBuf::from);
    // 1. a pair already in the process
    for major in MAJORS {
        let Some(b) = already_loaded(&format!("libcublas.so.{major}")) else {
            continue;
        };
        let Some(l) = already_loaded(&format!("libcublasLt.so.{major}")) else {
            continue;
        };
        if let (Some(want), Some(have)) = (&env, file_of(b, c"cublasCreate_v2")) {
            let want = want.canonicalize().unwrap_or_else(|_| want.clone());
            if want != have {
                return Err(not_found(format!(
                    "FK_CUBLAS_PATH is {} but this process has already loaded cuBLAS from {}; fusekit uses one cuBLAS per process: unset FK_CUBLAS_PATH or make it name the loaded file",
                    want.display(),
                    have.display()
                )));
            }
        }
        return finish(b, l);
    }
    // 2. FK_CUBLAS_PATH, 3. the CUDA roots and wheels, 4. the loader path
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = match &env {
        Some(p) => vec![p.clone()],
        None => MAJORS.into_iter().flat_map(search_paths).collect(),
    };
    if env.is_none() {
        candidates.extend(MAJORS.map(|m| PathBuf::from(format!("libcublas.so.{m}"))));
    }
    for blas in candidates {
        let by_name = blas.parent().is_none_or(|p| p.as_os_str().is_empty());
        if !by_name && !blas.is_file() {
            tried.push(blas.display().to_string());
            continue;
        }
        let lt_path = if by_name {
            std::env::var_os("FK_CUBLASLT_PATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(format!(
                        "libcublasLt.so.{}",
                        major_of(&blas).unwrap_or("13")
                    ))
                })
        } else {
            match lt_beside(&blas) {
                Some(l) => l,
                None => {
                    tried.push(format!(
                        "{} (no libcublasLt beside it; set FK_CUBLASLT_PATH)",
                        blas.display()
                    ));
                    continue;
                }
            }
        };
        let Some(l) = open(&lt_path, libc::RTLD_LOCAL) else {
            tried.push(format!("{} (cuBLASLt would not load)", lt_path.display()));
            continue;
        };
        let Some(b) = open(&blas, libc::RTLD_LOCAL) else {
            tried.push(format!("{} (would not load)", blas.display()));
            continue;
        };
        return finish(b, l);
    }
    let hint = match &env {
        Some(p) => format!("FK_CUBLAS_PATH={} could not be loaded", p.display()),
        None => "install the CUDA toolkit, or `pip install \"nvidia-cublas>=13,<14\"` into the active virtual environment, or set FK_CUBLAS_PATH (and FK_CUBLASLT_PATH)".to_string(),
    };
    Err(not_found(format!(
        "libcublas.so.13 (cuBLAS, needed by the linear-algebra ops on CUDA) could not be loaded: {hint}. Looked in: {}",
        tried.join(", ")
    )))
}

/// Resolves the table from the two handles and checks that they are one install.
fn finish(b: *mut c_void, l: *mut c_void) -> std::result::Result<Api, Error> {
    let lacks = |sym: &str| {
        not_found(format!(
            "the cuBLAS / cuBLASLt libraries found lack `{sym}` (a build older than CUDA 12?)"
        ))
    };
    // SAFETY: live dlopen handles of cuBLAS and of cuBLASLt.
    let blas_fns = unsafe { blas::Fns::resolve(b) }.map_err(lacks)?;
    // SAFETY: as above.
    let lt_fns = unsafe { lt::Fns::resolve(l) }.map_err(lacks)?;
    let blas_file = file_of(b, c"cublasCreate_v2").unwrap_or_default();
    let lt_file = file_of(l, c"cublasLtCreate").unwrap_or_default();
    let mut v = [0 as c_int; 3];
    for (i, x) in v.iter_mut().enumerate() {
        let prop = match i {
            0 => bs::libraryPropertyType::MAJOR_VERSION,
            1 => bs::libraryPropertyType::MINOR_VERSION,
            _ => bs::libraryPropertyType::PATCH_LEVEL,
        };
        // SAFETY: writes one int.
        unsafe { (blas_fns.cublasGetProperty)(prop, x) };
    }
    let blas_version = v[0] as usize * 10000 + v[1] as usize * 100 + v[2] as usize;
    // SAFETY: no arguments.
    let lt_version = unsafe { (lt_fns.cublasLtGetVersion)() };
    if blas_version != lt_version {
        return Err(not_found(format!(
            "cuBLAS {} ({}) and cuBLASLt {} ({}) are from different installs; fusekit needs one matching pair: set FK_CUBLAS_PATH and FK_CUBLASLT_PATH to files of one install",
            blas_version,
            blas_file.display(),
            lt_version,
            lt_file.display()
        )));
    }
    Ok(Api {
        blas: blas_fns,
        lt: lt_fns,
        files: (blas_file, lt_file),
        version: blas_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cublaslt_is_taken_from_the_folder_of_cublas() {
        let dir = std::env::temp_dir().join(format!("fk-cublas-pair-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let blas = dir.join("libcublas.so.13");
        std::fs::write(&blas, b"").unwrap();
        // no cuBLASLt beside it: none (the loader then reports the folder)
        if std::env::var_os("FK_CUBLASLT_PATH").is_none() {
            assert_eq!(lt_beside(&blas), None);
            std::fs::write(dir.join("libcublasLt.so.13"), b"").unwrap();
            assert_eq!(lt_beside(&blas), Some(dir.join("libcublasLt.so.13")));
            // the major version of the cuBLAS file picks cuBLASLt's
            let blas12 = dir.join("libcublas.so.12.4.5");
            std::fs::write(&blas12, b"").unwrap();
            assert_eq!(lt_beside(&blas12), None);
        }
        assert_eq!(major_of(Path::new("/x/libcublas.so.13.1.0.3")), Some("13"));
        assert_eq!(major_of(Path::new("/x/libcublas.so.12")), Some("12"));
        assert_eq!(major_of(Path::new("/x/libcublas.so")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn search_paths_put_version_13_layouts_first() {
        let p = search_paths("13");
        assert!(p.iter().all(|f| f.ends_with("libcublas.so.13")));
        assert!(p.iter().any(|f| f.starts_with("/usr/local/cuda")));
    }
}
