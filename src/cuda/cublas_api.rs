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

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::cublas::sys as bs;
use cudarc::cublaslt::sys as lt;

use crate::error::{Error, FK_ERROR_LIBRARY_NOT_FOUND, Result};

type BlasStatus = bs::cublasStatus_t;
type LtStatus = lt::cublasStatus_t;

macro_rules! api {
    ($( $lib:ident $field:ident = $sym:literal : fn($($arg:ty),* $(,)?) -> $ret:ty; )*) => {
        /// The cuBLAS / cuBLASLt functions fusekit calls, resolved from one pair.
        pub(crate) struct Api {
            $( pub $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
            /// The files the pair was loaded from (cuBLAS, cuBLASLt).
            pub files: (PathBuf, PathBuf),
            /// cuBLAS's version as `major * 10000 + minor * 100 + patch`.
            pub version: usize,
        }

        impl Api {
            /// Resolves every entry point from the two library handles.
            ///
            /// # Safety
            /// `blas` and `lt` are live `dlopen` handles of cuBLAS and cuBLASLt.
            unsafe fn resolve(blas: *mut c_void, lt: *mut c_void) -> std::result::Result<Api, String> {
                Ok(Api {
                    $( $field: {
                        let h = api!(@handle $lib, blas, lt);
                        let name = concat!($sym, "\0");
                        // SAFETY: a live handle and a NUL-terminated name.
                        let p = unsafe { libc::dlsym(h, name.as_ptr() as *const c_char) };
                        if p.is_null() {
                            return Err($sym.to_string());
                        }
                        // SAFETY: the symbol has this C signature in cublas_api.h /
                        // cublasLt.h (the declarations cudarc's sys modules mirror).
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p)
                        }
                    }, )*
                    files: (PathBuf::new(), PathBuf::new()),
                    version: 0,
                })
            }
        }
    };
    (@handle blas, $b:expr, $l:expr) => { $b };
    (@handle lt, $b:expr, $l:expr) => { $l };
}

api! {
    blas create = "cublasCreate_v2": fn(*mut bs::cublasHandle_t) -> BlasStatus;
    blas destroy = "cublasDestroy_v2": fn(bs::cublasHandle_t) -> BlasStatus;
    blas set_stream = "cublasSetStream_v2": fn(bs::cublasHandle_t, bs::cudaStream_t) -> BlasStatus;
    blas set_workspace = "cublasSetWorkspace_v2": fn(bs::cublasHandle_t, *mut c_void, usize) -> BlasStatus;
    blas get_property = "cublasGetProperty": fn(bs::libraryPropertyType, *mut c_int) -> BlasStatus;
    blas gemm_strided_batched_ex = "cublasGemmStridedBatchedEx": fn(
        bs::cublasHandle_t, bs::cublasOperation_t, bs::cublasOperation_t, c_int, c_int, c_int,
        *const c_void, *const c_void, bs::cudaDataType, c_int, i64,
        *const c_void, bs::cudaDataType, c_int, i64,
        *const c_void, *mut c_void, bs::cudaDataType, c_int, i64,
        c_int, bs::cublasComputeType_t, bs::cublasGemmAlgo_t,
    ) -> BlasStatus;
    blas ssyrk = "cublasSsyrk_v2": fn(
        bs::cublasHandle_t, bs::cublasFillMode_t, bs::cublasOperation_t, c_int, c_int,
        *const f32, *const f32, c_int, *const f32, *mut f32, c_int,
    ) -> BlasStatus;
    blas dsyrk = "cublasDsyrk_v2": fn(
        bs::cublasHandle_t, bs::cublasFillMode_t, bs::cublasOperation_t, c_int, c_int,
        *const f64, *const f64, c_int, *const f64, *mut f64, c_int,
    ) -> BlasStatus;
    lt lt_create = "cublasLtCreate": fn(*mut lt::cublasLtHandle_t) -> LtStatus;
    lt lt_destroy = "cublasLtDestroy": fn(lt::cublasLtHandle_t) -> LtStatus;
    lt lt_version = "cublasLtGetVersion": fn() -> usize;
    lt matmul = "cublasLtMatmul": fn(
        lt::cublasLtHandle_t, lt::cublasLtMatmulDesc_t, *const c_void,
        *const c_void, lt::cublasLtMatrixLayout_t, *const c_void, lt::cublasLtMatrixLayout_t,
        *const c_void, *const c_void, lt::cublasLtMatrixLayout_t,
        *mut c_void, lt::cublasLtMatrixLayout_t,
        *const lt::cublasLtMatmulAlgo_t, *mut c_void, usize, lt::cudaStream_t,
    ) -> LtStatus;
    lt algo_get_heuristic = "cublasLtMatmulAlgoGetHeuristic": fn(
        lt::cublasLtHandle_t, lt::cublasLtMatmulDesc_t,
        lt::cublasLtMatrixLayout_t, lt::cublasLtMatrixLayout_t,
        lt::cublasLtMatrixLayout_t, lt::cublasLtMatrixLayout_t,
        lt::cublasLtMatmulPreference_t, c_int,
        *mut lt::cublasLtMatmulHeuristicResult_t, *mut c_int,
    ) -> LtStatus;
    lt desc_create = "cublasLtMatmulDescCreate": fn(
        *mut lt::cublasLtMatmulDesc_t, lt::cublasComputeType_t, lt::cudaDataType_t,
    ) -> LtStatus;
    lt desc_destroy = "cublasLtMatmulDescDestroy": fn(lt::cublasLtMatmulDesc_t) -> LtStatus;
    lt desc_set_attribute = "cublasLtMatmulDescSetAttribute": fn(
        lt::cublasLtMatmulDesc_t, lt::cublasLtMatmulDescAttributes_t, *const c_void, usize,
    ) -> LtStatus;
    lt pref_create = "cublasLtMatmulPreferenceCreate": fn(*mut lt::cublasLtMatmulPreference_t) -> LtStatus;
    lt pref_destroy = "cublasLtMatmulPreferenceDestroy": fn(lt::cublasLtMatmulPreference_t) -> LtStatus;
    lt pref_set_attribute = "cublasLtMatmulPreferenceSetAttribute": fn(
        lt::cublasLtMatmulPreference_t, lt::cublasLtMatmulPreferenceAttributes_t, *const c_void, usize,
    ) -> LtStatus;
    lt layout_create = "cublasLtMatrixLayoutCreate": fn(
        *mut lt::cublasLtMatrixLayout_t, lt::cudaDataType, u64, u64, i64,
    ) -> LtStatus;
    lt layout_destroy = "cublasLtMatrixLayoutDestroy": fn(lt::cublasLtMatrixLayout_t) -> LtStatus;
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

fn c_path(p: &Path) -> Option<CString> {
    CString::new(p.as_os_str().as_encoded_bytes()).ok()
}

/// `dlopen` of a path or a soname (`RTLD_NOW | RTLD_LOCAL`, plus `extra`).
fn dlopen(p: &Path, extra: c_int) -> Option<*mut c_void> {
    let cs = c_path(p)?;
    // SAFETY: loads (or, with RTLD_NOLOAD, finds) a shared library; never closed.
    let h = unsafe { libc::dlopen(cs.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL | extra) };
    (!h.is_null()).then_some(h)
}

/// The file a loaded library's symbol `sym` lives in (canonical).
fn file_of(h: *mut c_void, sym: &CStr) -> Option<PathBuf> {
    // SAFETY: a live handle and a NUL-terminated name; dladdr fills `info`.
    unsafe {
        let p = libc::dlsym(h, sym.as_ptr());
        if p.is_null() {
            return None;
        }
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(p, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        let f = PathBuf::from(
            CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned(),
        );
        Some(f.canonicalize().unwrap_or(f))
    }
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
        let Some(b) = dlopen(
            Path::new(&format!("libcublas.so.{major}")),
            libc::RTLD_NOLOAD,
        ) else {
            continue;
        };
        let Some(l) = dlopen(
            Path::new(&format!("libcublasLt.so.{major}")),
            libc::RTLD_NOLOAD,
        ) else {
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
        let Some(l) = dlopen(&lt_path, 0) else {
            tried.push(format!("{} (cuBLASLt would not load)", lt_path.display()));
            continue;
        };
        let Some(b) = dlopen(&blas, 0) else {
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
    // SAFETY: both handles are live dlopen handles of cuBLAS / cuBLASLt.
    let mut api = unsafe { Api::resolve(b, l) }.map_err(|sym| {
        not_found(format!(
            "the cuBLAS / cuBLASLt libraries found lack `{sym}` (a build older than CUDA 12?)"
        ))
    })?;
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
        unsafe { (api.get_property)(prop, x) };
    }
    let blas_version = v[0] as usize * 10000 + v[1] as usize * 100 + v[2] as usize;
    // SAFETY: no arguments.
    let lt_version = unsafe { (api.lt_version)() };
    if blas_version != lt_version {
        return Err(not_found(format!(
            "cuBLAS {} ({}) and cuBLASLt {} ({}) are from different installs; fusekit needs one matching pair: set FK_CUBLAS_PATH and FK_CUBLASLT_PATH to files of one install",
            blas_version,
            blas_file.display(),
            lt_version,
            lt_file.display()
        )));
    }
    api.files = (blas_file, lt_file);
    api.version = blas_version;
    Ok(api)
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

    /// Every cuBLAS / cuBLASLt call goes through `Api`: a call of cudarc's
    /// `sys` functions would open the library by name, maybe a second build.
    #[test]
    fn no_cudarc_cublas_function_is_called() {
        fn walk(d: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        walk(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        assert!(files.len() > 10);
        let mut calls = Vec::new();
        for f in files.iter().filter(|f| !f.ends_with("cublas_api.rs")) {
            let text = std::fs::read_to_string(f).unwrap();
            for prefix in ["bs::", "lt::"] {
                for (i, _) in text.match_indices(prefix) {
                    let rest = &text[i + prefix.len()..];
                    let n = rest
                        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    let ident = &rest[..n];
                    let is_fn = ident.starts_with("cublas") || ident == "is_culib_present";
                    if is_fn && rest[n..].starts_with('(') {
                        calls.push(format!("{}: {prefix}{ident}", f.display()));
                    }
                }
            }
        }
        assert!(
            calls.is_empty(),
            "cudarc cuBLAS functions called directly: {calls:?}"
        );
    }
}
