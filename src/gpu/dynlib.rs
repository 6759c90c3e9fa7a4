//! CUDA libraries loaded at run time, one copy of each per process, called through
//! tables of functions resolved from the handle fusekit chose.
//!
//! cudarc's `sys` functions open their library by name on their first call
//! (`libcublas.so`, `libnvrtc.so`, `libcusolver.so` first). After fusekit had opened
//! a library by full path (an `FK_*_PATH`, a pip wheel), that by-name load could map
//! a second build of it (the toolkit's, found through the loader cache): on the
//! GPU machine a wheel install ran NVRTC and cuSOLVER from `/usr/local/cuda` and
//! from the wheel at once. fusekit therefore uses cudarc for the types only and
//! calls every function of cuBLAS, cuBLASLt, cuSOLVER and NVRTC through a table
//! made by `dyn_lib!` from the library it loaded itself (NCCL has its own table and
//! search in `nccl.rs`, on the helpers below). A test at the end of this file checks
//! that no cudarc `sys` function of these libraries is called directly.
//!
//! `dyn_lib!` declares, from C signatures:
//! - a table struct with one function pointer per function and `resolve(handle)`,
//!   which looks every symbol up (`Err(name)` for the first one missing);
//! - for each function, an `unsafe fn` of the same name and signature that calls
//!   through the table returned by the given getter, so that call sites read like
//!   calls of the C API (the getter is only reached after a successful load).

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

/// Declares a table of C functions and same-named wrappers calling through it;
/// see the module docs.
macro_rules! dyn_lib {
    // A table kept in `static $static`, set once by `install` (the library named
    // `$lib` in messages).
    (
        $(#[$meta:meta])*
        $vis:vis static $static:ident: $table:ident ($lib:literal);
        $( fn $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) -> $ret:ty ; )*
    ) => {
        $vis static $static: ::std::sync::OnceLock<$table> = ::std::sync::OnceLock::new();

        fn installed() -> &'static $table {
            $static
                .get()
                .expect(concat!($lib, " is loaded before its functions are called"))
        }

        impl $table {
            /// Resolves the table from `h` and keeps it for the wrappers; a missing
            /// symbol is `dynlib::not_found(hint, ..)`.
            ///
            /// # Safety
            /// As `resolve`.
            $vis unsafe fn install(
                h: *mut ::std::ffi::c_void,
                hint: &str,
            ) -> $crate::error::Result<()> {
                // SAFETY: forwarded to the caller.
                let t = unsafe { $table::resolve(h) }.map_err(|sym| {
                    $crate::gpu::dynlib::not_found(
                        hint,
                        format!("the library found lacks `{sym}`"),
                    )
                })?;
                let _ = $static.set(t);
                Ok(())
            }
        }

        $crate::gpu::dynlib::dyn_lib! {
            $(#[$meta])*
            $vis struct $table, loaded by installed;
            $( fn $name ( $( $arg : $ty ),* ) -> $ret ; )*
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $table:ident, loaded by $getter:path;
        $( fn $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) -> $ret:ty ; )*
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        $vis struct $table {
            $( pub(crate) $name: unsafe extern "C" fn($($ty),*) -> $ret, )*
        }

        impl $table {
            /// Resolves every function from `h`; `Err` names the first symbol missing.
            ///
            /// # Safety
            /// `h` is a live `dlopen` handle of the library whose C declarations
            /// these signatures copy.
            $vis unsafe fn resolve(
                h: *mut ::std::ffi::c_void,
            ) -> ::std::result::Result<$table, &'static str> {
                Ok($table {
                    $( $name: {
                        // SAFETY: a live handle and a NUL-terminated name.
                        let p = unsafe {
                            $crate::gpu::dynlib::symbol(h, concat!(stringify!($name), "\0"))
                        };
                        if p.is_null() {
                            return Err(stringify!($name));
                        }
                        // SAFETY: the symbol has this C signature (the caller's contract).
                        unsafe {
                            ::std::mem::transmute::<
                                *mut ::std::ffi::c_void,
                                unsafe extern "C" fn($($ty),*) -> $ret,
                            >(p)
                        }
                    }, )*
                })
            }
        }

        $(
            /// Calls this function of the library fusekit loaded.
            ///
            /// # Safety
            /// The C function's contract; the library is loaded.
            #[allow(non_snake_case, clippy::too_many_arguments, dead_code)]
            $vis unsafe fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: forwarded to the caller.
                unsafe { ($getter().$name)($($arg),*) }
            }
        )*
    };
}
pub(crate) use dyn_lib;

/// A library that could not be loaded: `FK_ERROR_LIBRARY_NOT_FOUND`, `hint` (which
/// library, what needs it, how to install it) and why.
pub(crate) fn not_found(hint: &str, why: impl std::fmt::Display) -> crate::error::Error {
    crate::error::Error::new(
        crate::error::FK_ERROR_LIBRARY_NOT_FOUND,
        format!("{hint}: {why}"),
    )
}

/// `dlsym` of a NUL-terminated name (null when absent).
///
/// # Safety
/// `h` is a live `dlopen` handle; `name` ends with a NUL byte.
pub(crate) unsafe fn symbol(h: *mut c_void, name: &str) -> *mut c_void {
    debug_assert!(name.ends_with('\0'));
    // SAFETY: the caller's contract.
    unsafe { libc::dlsym(h, name.as_ptr() as *const c_char) }
}

/// `dlopen` of a path or a soname with `RTLD_NOW` and `flags` (e.g. `RTLD_LOCAL`,
/// `RTLD_GLOBAL`, `RTLD_NOLOAD`); never closed.
pub(crate) fn open(p: &Path, flags: c_int) -> Option<*mut c_void> {
    let cs = CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: loads (or with RTLD_NOLOAD finds) a shared library.
    let h = unsafe { libc::dlopen(cs.as_ptr(), libc::RTLD_NOW | flags) };
    (!h.is_null()).then_some(h)
}

/// A library already in the process, by soname (`RTLD_NOLOAD`).
pub(crate) fn already_loaded(soname: &str) -> Option<*mut c_void> {
    open(Path::new(soname), libc::RTLD_NOLOAD)
}

/// The file (canonical path) that defines `sym` of a loaded library.
pub(crate) fn file_of(h: *mut c_void, sym: &CStr) -> Option<PathBuf> {
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

/// The loader's last error message.
pub(crate) fn dlerror() -> String {
    // SAFETY: dlerror returns a thread-local string or null.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            String::new()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// Finds the one copy of a library the process will use, in this order:
/// 1. a copy already in the process (any of `sonames`, `RTLD_NOLOAD`; e.g. loaded
///    by PyTorch): shared, so that the process never holds two; with `env` set to
///    another file this is an error rather than a second copy;
/// 2. the file named by the environment variable `env` (then nothing else);
/// 3. `paths`, the existing files among them in order;
/// 4. `sonames` through the loader path.
///
/// Opened with `RTLD_NOW | RTLD_LOCAL | extra`. Returns the handle and the file it
/// came from, or `not_found(hint, ..)` with what was tried.
pub(crate) fn find(
    sonames: &[&str],
    env: &str,
    paths: &[PathBuf],
    probe: &CStr,
    extra: c_int,
    hint: &str,
) -> crate::error::Result<(*mut c_void, PathBuf)> {
    search(sonames, env, paths, probe, extra).map_err(|why| not_found(hint, why))
}

fn search(
    sonames: &[&str],
    env: &str,
    paths: &[PathBuf],
    probe: &CStr,
    extra: c_int,
) -> std::result::Result<(*mut c_void, PathBuf), String> {
    let forced = std::env::var_os(env).map(PathBuf::from);
    for name in sonames {
        if let Some(h) = already_loaded(name) {
            let have = file_of(h, probe).unwrap_or_else(|| PathBuf::from(name));
            if let Some(want) = &forced {
                let want = want.canonicalize().unwrap_or_else(|_| want.clone());
                if want != have {
                    return Err(format!(
                        "{env} is {} but this process has already loaded {} from {}; fusekit uses one copy per process: unset {env} or make it name the loaded file",
                        want.display(),
                        name,
                        have.display()
                    ));
                }
            }
            return Ok((h, have));
        }
    }
    let mut tried = Vec::new();
    let by_path: Vec<PathBuf> = match &forced {
        Some(p) => vec![p.clone()],
        None => paths.to_vec(),
    };
    for p in &by_path {
        if !p.is_file() {
            tried.push(format!("{} (no such file)", p.display()));
            continue;
        }
        match open(p, libc::RTLD_LOCAL | extra) {
            Some(h) => return Ok((h, file_of(h, probe).unwrap_or_else(|| p.clone()))),
            None => tried.push(format!("{} ({})", p.display(), dlerror())),
        }
    }
    if forced.is_some() {
        return Err(format!(
            "{env} is set, so only that file was tried: {}",
            tried.join(", ")
        ));
    }
    for name in sonames {
        match open(Path::new(name), libc::RTLD_LOCAL | extra) {
            Some(h) => return Ok((h, file_of(h, probe).unwrap_or_else(|| PathBuf::from(name)))),
            None => tried.push(format!("{name} (loader path)")),
        }
    }
    Err(format!("tried {}", tried.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library not found is `FK_ERROR_LIBRARY_NOT_FOUND` with the caller's hint
    /// and what was tried (the message cuSOLVER's and NVRTC's loaders return).
    #[test]
    fn find_failure_names_hint_and_tries() {
        let missing = PathBuf::from("/nonexistent/libfk_missing.so.0");
        let e = find(
            &["libfk_missing.so.0"],
            "FK_TEST_MISSING_LIBRARY_PATH",
            std::slice::from_ref(&missing),
            c"fk_missing",
            0,
            "libfk_missing.so.0 (a test) could not be loaded; install nothing",
        )
        .err()
        .expect("a library that does not exist is not found");
        assert_eq!(e.status, crate::error::FK_ERROR_LIBRARY_NOT_FOUND);
        assert_eq!(
            e.message,
            "libfk_missing.so.0 (a test) could not be loaded; install nothing: tried \
             /nonexistent/libfk_missing.so.0 (no such file), libfk_missing.so.0 (loader path)"
        );
    }

    /// Every cuBLAS, cuBLASLt, cuSOLVER and NVRTC call goes through a `dyn_lib!`
    /// table: a call of cudarc's `sys` (or `result`) functions would open the
    /// library by name, maybe a second build.
    #[test]
    fn no_cudarc_library_function_is_called() {
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
        for f in files.iter().filter(|f| !f.ends_with("dynlib.rs")) {
            let text = std::fs::read_to_string(f).unwrap();
            for prefix in [
                "bs::",
                "lt::",
                "sv::",
                "ns::",
                "nr::",
                "cublas::sys::",
                "cublaslt::sys::",
                "cusolver::sys::",
                "nvrtc::sys::",
                "nvrtc::result::",
            ] {
                for (i, _) in text.match_indices(prefix) {
                    let rest = &text[i + prefix.len()..];
                    let n = rest
                        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    let ident = &rest[..n];
                    let is_fn = ["cublas", "cusolver", "nvrtc"]
                        .iter()
                        .any(|l| ident.starts_with(l))
                        || ident == "is_culib_present"
                        || prefix == "nr::"
                        || prefix == "nvrtc::result::";
                    if is_fn && rest[n..].starts_with('(') {
                        calls.push(format!("{}: {prefix}{ident}", f.display()));
                    }
                }
            }
        }
        assert!(
            calls.is_empty(),
            "cudarc functions of cuBLAS, cuBLASLt, cuSOLVER or NVRTC called directly: {calls:?}"
        );
    }
}
