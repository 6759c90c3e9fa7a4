//! NCCL, loaded at run time.
//!
//! cudarc's `nccl` module supplies the types (`ncclUniqueId`, `ncclComm_t`); the
//! functions are resolved here with `dlsym` from a library this module opens
//! itself, because NCCL ships as `libnccl.so.2` (the `nvidia-nccl-cu13` wheel has
//! only that name), which is not among the names cudarc's loader tries, and its
//! loader panics when it finds nothing. A missing NCCL is therefore
//! `FK_ERROR_LIBRARY_NOT_FOUND` with a message saying what to install.
//!
//! Search order (the first that loads wins):
//! 1. `FK_NCCL_PATH`: a full path; when set, nothing else is tried.
//! 2. An NCCL already loaded into the process (e.g. by PyTorch), so one process
//!    never holds two copies.
//! 3. `nvidia/nccl/lib/libnccl.so.2` of the Python environments (see
//!    `nvrtc::nvidia_wheel_dirs`), then `lib64`/`lib` of `CUDA_HOME`, `CUDA_PATH`,
//!    `/usr/local/cuda`, each by full path.
//! 4. The system loader path: `libnccl.so.2`, then `libnccl.so` (e.g. the `libnccl2`
//!    package from NVIDIA's CUDA repository).
//!
//! Enum arguments and the result are passed as C `int` (never as Rust enums, so an
//! unknown result value from a newer NCCL is not undefined behaviour).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use cudarc::nccl::sys::{ncclComm_t, ncclUniqueId};

use super::dynlib::{already_loaded, dlerror, open};
use crate::error::{
    Error, FK_ERROR_CUDA, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_LIBRARY_NOT_FOUND, Result,
};

pub(crate) const NCCL_SONAME: &str = "libnccl.so.2";

type Stream = *mut c_void;

/// The NCCL entry points fusekit uses.
pub struct Nccl {
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    get_last_error: unsafe extern "C" fn(ncclComm_t) -> *const c_char,
    pub get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> c_int,
    pub comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> c_int,
    pub comm_init_all: unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> c_int,
    pub comm_destroy: unsafe extern "C" fn(ncclComm_t) -> c_int,
    pub group_start: unsafe extern "C" fn() -> c_int,
    pub group_end: unsafe extern "C" fn() -> c_int,
    pub all_reduce: Collective,
    pub broadcast: Collective,
    pub all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, ncclComm_t, Stream) -> c_int,
    pub reduce_scatter: Collective,
}

/// `ncclAllReduce`, `ncclBroadcast`, `ncclReduceScatter`: `(send, recv, count,
/// datatype, op or root, comm, stream)`.
type Collective = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    ncclComm_t,
    Stream,
) -> c_int;

// SAFETY: plain function pointers into a library that is never unloaded.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

/// `ncclDataType_t` values.
pub(crate) const NCCL_FLOAT16: c_int = 6;
pub(crate) const NCCL_FLOAT32: c_int = 7;
pub(crate) const NCCL_FLOAT64: c_int = 8;
pub(crate) const NCCL_BFLOAT16: c_int = 9;

/// The library, loaded on first use (the outcome is cached for the process).
pub fn nccl() -> Result<&'static Nccl> {
    static LIB: OnceLock<std::result::Result<Nccl, Error>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(|e| e.clone())
}

fn candidates() -> (Vec<PathBuf>, bool) {
    if let Some(p) = std::env::var_os("FK_NCCL_PATH") {
        return (vec![PathBuf::from(p)], true);
    }
    let mut c = Vec::new();
    for d in super::nvrtc::nvidia_wheel_dirs() {
        c.push(d.join("nccl").join("lib").join(NCCL_SONAME));
        c.push(d.join("cu13").join("lib").join(NCCL_SONAME));
    }
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    for r in roots {
        for lib in ["lib64", "lib"] {
            c.push(r.join(lib).join(NCCL_SONAME));
        }
    }
    (c, false)
}

fn load() -> Result<Nccl> {
    let (cands, exclusive) = candidates();
    let mut tried: Vec<String> = Vec::new();
    let mut found: Option<(*mut c_void, String)> = None;
    if !exclusive {
        for name in [NCCL_SONAME, "libnccl.so"] {
            if let Some(h) = already_loaded(name) {
                found = Some((h, format!("{name} (already loaded)")));
                break;
            }
        }
    }
    if found.is_none() {
        for c in &cands {
            let s = c.display().to_string();
            if c.is_file() {
                if let Some(h) = open(c, libc::RTLD_LOCAL) {
                    found = Some((h, s));
                    break;
                }
                tried.push(format!("{s} ({})", dlerror()));
            } else {
                tried.push(s);
            }
        }
    }
    if found.is_none() && !exclusive {
        for name in [NCCL_SONAME, "libnccl.so"] {
            if let Some(h) = open(Path::new(name), libc::RTLD_LOCAL) {
                found = Some((h, name.to_string()));
                break;
            }
            tried.push(format!("{name} (loader path)"));
        }
    }
    let Some((h, path)) = found else {
        let how = if exclusive {
            "FK_NCCL_PATH is set, so only that file was tried"
        } else {
            "install it with `pip install nvidia-nccl-cu13` (into the active Python environment) or the system package libnccl2 (NVIDIA's CUDA repository), or set FK_NCCL_PATH to the full path of libnccl.so.2"
        };
        return Err(Error::new(
            FK_ERROR_LIBRARY_NOT_FOUND,
            format!(
                "NCCL ({NCCL_SONAME}) could not be loaded: {how}. Tried: {}",
                tried.join(", ")
            ),
        ));
    };
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: h is a live library handle, and the field the symbol is stored
            // in has the C signature of the NCCL function of that name.
            match unsafe { symbol(h, $name) } {
                Some(f) => f,
                None => {
                    return Err(Error::new(
                        FK_ERROR_LIBRARY_NOT_FOUND,
                        format!(
                            "{path} has no symbol {} (NCCL 2.18 or newer is needed)",
                            $name
                        ),
                    ));
                }
            }
        };
    }
    Ok(Nccl {
        get_error_string: sym!("ncclGetErrorString"),
        get_last_error: sym!("ncclGetLastError"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_init_all: sym!("ncclCommInitAll"),
        comm_destroy: sym!("ncclCommDestroy"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        all_reduce: sym!("ncclAllReduce"),
        broadcast: sym!("ncclBroadcast"),
        all_gather: sym!("ncclAllGather"),
        reduce_scatter: sym!("ncclReduceScatter"),
    })
}

/// The address of `name` in library `h` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be an `extern "C"` function pointer type matching the symbol.
unsafe fn symbol<F: Copy>(h: *mut c_void, name: &str) -> Option<F> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    if name.contains('\0') {
        return None;
    }
    // SAFETY: h is a live library handle; the name is NUL-terminated.
    let p = unsafe { super::dynlib::symbol(h, &format!("{name}\0")) };
    if p.is_null() {
        return None;
    }
    // SAFETY: F is a function pointer of the symbol's signature (caller's contract).
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

impl Nccl {
    /// Turns an NCCL result into a status: invalid arguments and usage are
    /// `FK_ERROR_INVALID_ARGUMENT`, everything else `FK_ERROR_CUDA`, with NCCL's
    /// own description and last error message.
    pub(crate) fn check(&self, r: c_int, what: &str, comm: ncclComm_t) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns static or comm-owned NUL-terminated strings.
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let desc = text(unsafe { (self.get_error_string)(r) });
        let last = text(unsafe { (self.get_last_error)(comm) });
        let status = match r {
            4 | 5 => FK_ERROR_INVALID_ARGUMENT,
            _ => FK_ERROR_CUDA,
        };
        Err(Error::new(
            status,
            format!(
                "{what} failed: NCCL error {r} ({desc}){}",
                if last.is_empty() {
                    String::new()
                } else {
                    format!(": {last}")
                }
            ),
        ))
    }
}
