//! Run-time compilation of `kernels/*.cu` to CUBIN with NVRTC, and the kernel cache.
//!
//! Images are compiled for the device's exact architecture (`sm_XY`), never PTX: PTX
//! from an NVRTC newer than the driver would fail to load. Compiled images are
//! cached on disk (key: SHA-256 over the source, the options, the NVRTC version and
//! the architecture; written to a temporary file and renamed, so readers never see
//! a partial image) and in memory per context (`CudaDevice`).
//!
//! Environment:
//! - `FK_CACHE_DIR`: cache directory (default `$XDG_CACHE_HOME/fusekit` or
//!   `~/.cache/fusekit`); `FK_CACHE_DISABLE=1` switches the disk cache off.
//! - `FK_CUDA_INCLUDE`: folder holding `cuda_fp16.h`; otherwise `CUDA_HOME`,
//!   `CUDA_PATH`, `/usr/local/cuda`, and the `nvidia-cuda-runtime` wheel are searched.
//! - `FK_NVRTC_PATH`: full path of `libnvrtc.so.13`; otherwise the same places.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result as nr, sys as ns};
use sha2::{Digest, Sha256};

use crate::error::{Error, FK_ERROR_KERNEL_COMPILE, FK_ERROR_LIBRARY_NOT_FOUND, Result};

const NVRTC_SONAME: &str = "libnvrtc.so.13";

/// Roots that may hold a CUDA installation or the `nvidia/cu13` wheel folder.
pub(crate) fn cuda_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            roots.push(PathBuf::from(v));
        }
    }
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots.extend(nvidia_wheel_dirs().into_iter().map(|d| d.join("cu13")));
    roots
}

/// The `nvidia` folders of Python environments, where NVIDIA's pip wheels install
/// (`nvidia/cu13` for the CUDA 13 toolkit wheels, `nvidia/nccl` for NCCL):
/// `site-packages` (or `dist-packages`) of `$VIRTUAL_ENV`, `$CONDA_PREFIX`,
/// `~/.local`, `/usr/local`, `/usr` and of the environments whose `bin` folder is on
/// `PATH` (e.g. a virtual environment's `python3` that is not activated), then the
/// `PYTHONPATH` entries (e.g. a `--target` install of the wheels).
pub(crate) fn nvidia_wheel_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(var) {
            prefixes.push(PathBuf::from(v));
        }
    }
    if let Some(h) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(h).join(".local"));
    }
    prefixes.push(PathBuf::from("/usr/local"));
    prefixes.push(PathBuf::from("/usr"));
    if let Some(path) = std::env::var_os("PATH") {
        for p in std::env::split_paths(&path) {
            if p.file_name().is_some_and(|n| n == "bin") {
                if let Some(prefix) = p.parent() {
                    if !prefixes.iter().any(|q| q == prefix) {
                        prefixes.push(prefix.to_path_buf());
                    }
                }
            }
        }
    }
    for p in prefixes {
        for lib in ["lib", "lib64"] {
            if let Ok(rd) = std::fs::read_dir(p.join(lib)) {
                for e in rd.flatten() {
                    let name = e.file_name();
                    if name.to_string_lossy().starts_with("python3") {
                        for site in ["site-packages", "dist-packages"] {
                            dirs.push(e.path().join(site).join("nvidia"));
                        }
                    }
                }
            }
        }
    }
    if let Some(pp) = std::env::var_os("PYTHONPATH") {
        for p in std::env::split_paths(&pp) {
            dirs.push(p.join("nvidia"));
        }
    }
    dirs
}

/// The folder with `cuda_fp16.h`, or an error saying where we looked.
pub fn cuda_include_dir() -> Result<PathBuf> {
    static DIR: OnceLock<std::result::Result<PathBuf, Error>> = OnceLock::new();
    DIR.get_or_init(|| {
        let mut tried = Vec::new();
        let mut candidates = Vec::new();
        if let Some(v) = std::env::var_os("FK_CUDA_INCLUDE") {
            candidates.push(PathBuf::from(v));
        }
        candidates.extend(cuda_roots().into_iter().map(|r| r.join("include")));
        for c in candidates {
            if c.join("cuda_fp16.h").is_file() {
                return Ok(c);
            }
            tried.push(c.display().to_string());
        }
        Err(Error::new(
            FK_ERROR_LIBRARY_NOT_FOUND,
            format!(
                "the CUDA headers (cuda_fp16.h) were not found; install the CUDA toolkit, or `pip install nvidia-cuda-runtime==13.0.96`, or set FK_CUDA_INCLUDE. Looked in: {}",
                tried.join(", ")
            ),
        ))
    })
    .clone()
}

/// Loads libnvrtc once: `FK_NVRTC_PATH`, then the CUDA roots, then the system's
/// loader path. A library loaded by full path satisfies cudarc's later load by
/// soname.
pub fn load_nvrtc() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), Error>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let mut candidates: Vec<PathBuf> = Vec::new();
            if let Some(v) = std::env::var_os("FK_NVRTC_PATH") {
                candidates.push(PathBuf::from(v));
            }
            for r in cuda_roots() {
                for lib in ["lib64", "lib"] {
                    candidates.push(r.join(lib).join(NVRTC_SONAME));
                }
            }
            for c in &candidates {
                if c.is_file() && dlopen_global(c) {
                    // NVRTC opens its builtins library by soname at compile time;
                    // outside the loader path (e.g. a pip wheel) preload it too.
                    if let Some(dir) = c.parent() {
                        if let Ok(rd) = std::fs::read_dir(dir) {
                            for e in rd.flatten() {
                                let n = e.file_name().to_string_lossy().into_owned();
                                if n.starts_with("libnvrtc-builtins.so.") {
                                    dlopen_global(&e.path());
                                }
                            }
                        }
                    }
                    break;
                }
            }
            // SAFETY: probes whether the library can be opened.
            if unsafe { ns::is_culib_present() } {
                return Ok(());
            }
            let tried: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
            Err(Error::new(
                FK_ERROR_LIBRARY_NOT_FOUND,
                format!(
                    "{NVRTC_SONAME} (NVRTC, the CUDA run-time compiler) could not be loaded; install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc==13.0.88`, or set FK_NVRTC_PATH. Looked in the loader path and: {}",
                    tried.join(", ")
                ),
            ))
        })
        .clone()
}

/// `dlopen(path, RTLD_NOW | RTLD_GLOBAL)`; the handle is kept for the process's life,
/// and a later load by soname (cudarc's, NVRTC's own) finds this library.
pub(crate) fn dlopen_global(path: &Path) -> bool {
    let Ok(cs) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: loads a shared library by path; never closed.
    !unsafe { libc::dlopen(cs.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }.is_null()
}

/// NVRTC's `(major, minor)` version.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    load_nvrtc()?;
    let (mut a, mut b) = (0, 0);
    // SAFETY: writes two ints.
    unsafe { ns::nvrtcVersion(&mut a, &mut b) }
        .result()
        .map_err(|e| {
            Error::new(
                FK_ERROR_LIBRARY_NOT_FOUND,
                format!("nvrtcVersion failed: {e:?}"),
            )
        })?;
    Ok((a, b))
}

/// Inlines `#include "x.cuh"` lines of our own headers (NVRTC then needs no
/// in-memory header table, and the cache key covers the headers too).
pub fn expand_source(source: &str) -> String {
    let mut out = String::with_capacity(source.len() * 2);
    for line in source.lines() {
        let t = line.trim();
        let inc = t
            .strip_prefix("#include \"")
            .and_then(|r| r.strip_suffix('"'))
            .and_then(|name| super::HEADERS.iter().find(|(n, _)| *n == name));
        match inc {
            Some((name, text)) => {
                out.push_str(&format!("// ---- begin {name}\n"));
                out.push_str(&expand_source(text));
                out.push_str(&format!("// ---- end {name}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// NVRTC options for `arch` (e.g. `sm_90`). Fast math is never implied.
pub fn options(arch: &str, include: &Path) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        format!("--include-path={}", include.display()),
        "--device-as-default-execution-space".into(),
        "-DFK_NVRTC=1".into(),
    ]
}

fn cache_dir() -> Option<PathBuf> {
    if std::env::var("FK_CACHE_DISABLE")
        .map(|v| !v.is_empty() && v != "0")
        .unwrap_or(false)
    {
        return None;
    }
    if let Some(d) = std::env::var_os("FK_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("fusekit"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("fusekit"))
}

/// Compiles `source` (module `name`) to a CUBIN for `arch`.
pub fn compile(name: &str, source: &str, arch: &str) -> Result<Vec<u8>> {
    load_nvrtc()?;
    let include = cuda_include_dir()?;
    let src = CString::new(expand_source(source)).unwrap_or_default();
    let cname = CString::new(format!("{name}.cu")).unwrap_or_default();
    let opts = options(arch, &include);
    let err = |what: &str, e: nr::NvrtcError| {
        Error::new(
            FK_ERROR_KERNEL_COMPILE,
            format!("{what} for kernel module {name}: {e:?}"),
        )
    };
    let prog = nr::create_program(&src, Some(&cname)).map_err(|e| err("nvrtcCreateProgram", e))?;
    // SAFETY: prog is live until destroy_program below.
    let res = unsafe {
        let compiled = nr::compile_program(prog, &opts);
        let out = match compiled {
            Ok(()) => {
                let mut size = 0usize;
                ns::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| err("nvrtcGetCUBINSize", e))
                    .and_then(|_| {
                        let mut buf = vec![0u8; size];
                        ns::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _)
                            .result()
                            .map_err(|e| err("nvrtcGetCUBIN", e))
                            .map(|_| buf)
                    })
            }
            Err(e) => {
                let log = nr::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> =
                            l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                        String::from_utf8_lossy(&bytes).into_owned()
                    })
                    .unwrap_or_default();
                Err(Error::new(
                    FK_ERROR_KERNEL_COMPILE,
                    format!(
                        "NVRTC failed to compile kernel module {name} for {arch} ({e:?}):\n{log}"
                    ),
                ))
            }
        };
        let _ = nr::destroy_program(prog);
        out
    };
    res
}

/// `compile` behind the on-disk cache.
pub fn compile_cached(name: &str, source: &str, arch: &str) -> Result<Vec<u8>> {
    let Some(dir) = cache_dir() else {
        return compile(name, source, arch);
    };
    let include = cuda_include_dir()?;
    let (maj, min) = nvrtc_version()?;
    let mut h = Sha256::new();
    h.update(expand_source(source).as_bytes());
    h.update(options(arch, &include).join("\u{1}").as_bytes());
    h.update(format!("nvrtc {maj}.{min} {arch}").as_bytes());
    let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("{name}-{arch}-{}.cubin", &key[..32]));
    if let Ok(image) = std::fs::read(&path) {
        if !image.is_empty() {
            return Ok(image);
        }
    }
    let image = compile(name, source, arch)?;
    // Cache failures are not errors: the image is compiled and usable.
    let _ = std::fs::create_dir_all(&dir).and_then(|_| {
        let tmp = dir.join(format!(
            ".{name}-{}-{}.tmp",
            std::process::id(),
            key.get(..8).unwrap_or("")
        ));
        std::fs::write(&tmp, &image)?;
        std::fs::rename(&tmp, &path)
    });
    Ok(image)
}
