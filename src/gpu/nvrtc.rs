//! Run-time compilation of `kernels/*.cu` to CUBIN with NVRTC, and the kernel cache.
//!
//! Images are compiled for the device's exact architecture (`sm_XY`), never PTX: PTX
//! from an NVRTC newer than the driver would fail to load. Compiled images are
//! cached on disk (key: SHA-256 over the source, the options with the CUDA include
//! folder's location left out, the NVRTC version and the architecture; written to a
//! temporary file and renamed, so readers never see a partial image) and in memory
//! per context (`CudaDevice`).
//!
//! Prebuilt images: a read-only folder `fusekit-kernels` next to the loaded library
//! (the Python wheel ships one with every module for sm_80 and sm_90) holds images
//! named exactly as the disk cache names them, plus a file `nvrtc-version` (e.g.
//! `13.0`, the NVRTC that made them, which enters the key). It is searched first,
//! before the disk cache and without loading NVRTC; an architecture or a source it
//! lacks compiles at run time as usual. Made by `store_prebuilt` (the kernel compile
//! test, tests/kernels_compile.rs, with `FK_PREBUILT_OUT`).
//!
//! Environment:
//! - `FK_CACHE_DIR`: cache directory (default `$XDG_CACHE_HOME/fusekit` or
//!   `~/.cache/fusekit`); `FK_CACHE_DISABLE=1` switches the disk cache and the
//!   prebuilt images off (every module compiles in each process).
//! - `FK_PREBUILT_DIR`: a prebuilt-images folder to search instead of the one next
//!   to the library.
//! - `FK_CUDA_INCLUDE`: folder holding `cuda_fp16.h`; otherwise `CUDA_HOME`,
//!   `CUDA_PATH`, the active environment's `nvidia-cuda-runtime` wheel,
//!   `/usr/local/cuda` and other environments' wheels are searched (`cuda_roots`).
//! - `FK_NVRTC_PATH`: full path of `libnvrtc.so.13`; otherwise the same places.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::sys as ns;
use sha2::{Digest, Sha256};

use crate::error::{Error, FK_ERROR_KERNEL_COMPILE, FK_ERROR_LIBRARY_NOT_FOUND, Result};

const NVRTC_SONAME: &str = "libnvrtc.so.13";

/// Roots that may hold a CUDA installation or the `nvidia/cu13` wheel folder, in
/// order: `CUDA_HOME`, `CUDA_PATH`, the wheels of the active environment
/// (`$VIRTUAL_ENV`, `$CONDA_PREFIX`: e.g. those `pip install fusekit[cuda]` put there
/// at the tested versions), `/usr/local/cuda`, then the other environments' wheels.
pub(crate) fn cuda_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            roots.push(PathBuf::from(v));
        }
    }
    let active: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    let (mine, others): (Vec<PathBuf>, Vec<PathBuf>) = nvidia_wheel_dirs()
        .into_iter()
        .partition(|d| active.iter().any(|a| d.starts_with(a)));
    roots.extend(mine.into_iter().map(|d| d.join("cu13")));
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots.extend(others.into_iter().map(|d| d.join("cu13")));
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

/// NVRTC's functions (nvrtc.h), called through the library fusekit loaded
/// (`dynlib`: one copy per process).
mod api {
    use std::ffi::{c_char, c_int};

    use cudarc::nvrtc::sys::*;

    crate::gpu::dynlib::dyn_lib! {
        pub(super) static FNS: Fns ("NVRTC");
        fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> nvrtcResult;
        fn nvrtcCreateProgram(
            prog: *mut nvrtcProgram, src: *const c_char, name: *const c_char, num_headers: c_int,
            headers: *const *const c_char, include_names: *const *const c_char,
        ) -> nvrtcResult;
        fn nvrtcCompileProgram(prog: nvrtcProgram, num_options: c_int, options: *const *const c_char) -> nvrtcResult;
        fn nvrtcGetProgramLogSize(prog: nvrtcProgram, size: *mut usize) -> nvrtcResult;
        fn nvrtcGetProgramLog(prog: nvrtcProgram, log: *mut c_char) -> nvrtcResult;
        fn nvrtcGetCUBINSize(prog: nvrtcProgram, size: *mut usize) -> nvrtcResult;
        fn nvrtcGetCUBIN(prog: nvrtcProgram, cubin: *mut c_char) -> nvrtcResult;
        fn nvrtcDestroyProgram(prog: *mut nvrtcProgram) -> nvrtcResult;
    }
}

/// Loads libnvrtc once (`dynlib::find`): a copy already in the process,
/// `FK_NVRTC_PATH`, the CUDA roots (the active environment's wheels, then the
/// toolkits), then the system's loader path. NVRTC opens its builtins library by
/// soname when it compiles, so the `libnvrtc-builtins` beside the chosen NVRTC is
/// loaded too (outside the loader path, e.g. in a pip wheel, it would not be found).
pub fn load_nvrtc() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), Error>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let paths: Vec<PathBuf> = cuda_roots()
                .into_iter()
                .flat_map(|r| ["lib64", "lib"].map(|l| r.join(l).join(NVRTC_SONAME)))
                .collect();
            let hint = format!(
                "{NVRTC_SONAME} (NVRTC, the CUDA run-time compiler) could not be loaded; install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc==13.0.88`, or set FK_NVRTC_PATH"
            );
            let (h, file) = super::dynlib::find(
                &[NVRTC_SONAME],
                "FK_NVRTC_PATH",
                &paths,
                c"nvrtcVersion",
                libc::RTLD_GLOBAL,
                &hint,
            )?;
            if let Some(dir) = file.parent() {
                if let Ok(rd) = std::fs::read_dir(dir) {
                    for e in rd.flatten() {
                        let n = e.file_name().to_string_lossy().into_owned();
                        if n.starts_with("libnvrtc-builtins.so.") {
                            let _ = super::dynlib::open(&e.path(), libc::RTLD_GLOBAL);
                        }
                    }
                }
            }
            // SAFETY: a live handle of NVRTC.
            unsafe { api::Fns::install(h, &hint) }
        })
        .clone()
}

/// NVRTC's `(major, minor)` version.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    load_nvrtc()?;
    let (mut a, mut b) = (0, 0);
    // SAFETY: writes two ints.
    unsafe { api::nvrtcVersion(&mut a, &mut b) }
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

fn cache_disabled() -> bool {
    std::env::var("FK_CACHE_DISABLE")
        .map(|v| !v.is_empty() && v != "0")
        .unwrap_or(false)
}

fn cache_dir() -> Option<PathBuf> {
    if cache_disabled() {
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
    let err = |what: &str, e: ns::nvrtcResult| {
        Error::new(
            FK_ERROR_KERNEL_COMPILE,
            format!("{what} for kernel module {name}: {e:?}"),
        )
    };
    let ok = |what: &str, r: ns::nvrtcResult| {
        if r == ns::nvrtcResult::NVRTC_SUCCESS {
            Ok(())
        } else {
            Err(err(what, r))
        }
    };
    let mut prog: ns::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: writes a new program; the strings are NUL-terminated and outlive it.
    ok("nvrtcCreateProgram", unsafe {
        api::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    let copts: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(o.as_str()).unwrap_or_default())
        .collect();
    let ptrs: Vec<*const std::ffi::c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    // SAFETY: prog is live until nvrtcDestroyProgram below; the options outlive it.
    let res = unsafe {
        let compiled = api::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr());
        let out = if compiled == ns::nvrtcResult::NVRTC_SUCCESS {
            let mut size = 0usize;
            ok("nvrtcGetCUBINSize", api::nvrtcGetCUBINSize(prog, &mut size)).and_then(|_| {
                let mut buf = vec![0u8; size];
                ok(
                    "nvrtcGetCUBIN",
                    api::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _),
                )
                .map(|_| buf)
            })
        } else {
            let mut size = 0usize;
            let mut log = String::new();
            if api::nvrtcGetProgramLogSize(prog, &mut size) == ns::nvrtcResult::NVRTC_SUCCESS {
                let mut buf = vec![0u8; size.max(1)];
                if api::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut _)
                    == ns::nvrtcResult::NVRTC_SUCCESS
                {
                    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
                    log = String::from_utf8_lossy(&buf[..end]).into_owned();
                }
            }
            Err(Error::new(
                FK_ERROR_KERNEL_COMPILE,
                format!(
                    "NVRTC failed to compile kernel module {name} for {arch} ({compiled:?}):\n{log}"
                ),
            ))
        };
        api::nvrtcDestroyProgram(&mut prog);
        out
    };
    res
}

/// The file name of `name`'s image for `arch` in the disk cache and in a prebuilt
/// folder: `<name>-<arch>-<key>.cubin`, the key a SHA-256 over the expanded source,
/// the options (the include folder's location left out, so that images made on
/// another machine match), the NVRTC version and the architecture.
pub fn cache_file_name(name: &str, source: &str, arch: &str, nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(expand_source(source).as_bytes());
    h.update(
        options(arch, Path::new("<cuda-include>"))
            .join("\u{1}")
            .as_bytes(),
    );
    h.update(format!("nvrtc {}.{} {arch}", nvrtc.0, nvrtc.1).as_bytes());
    let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("{name}-{arch}-{}.cubin", &key[..32])
}

/// The file of a prebuilt folder naming the NVRTC version that made its images.
pub const PREBUILT_VERSION_FILE: &str = "nvrtc-version";
/// The prebuilt folder's name next to the library.
pub const PREBUILT_DIR_NAME: &str = "fusekit-kernels";

/// The folder of the loaded fusekit library (found through `dladdr`).
fn library_dir() -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the address of one of our own functions and fills `info`.
    let ok = unsafe { libc::dladdr(library_dir as *const libc::c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let file = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(std::ffi::OsStr::new(
        std::str::from_utf8(file.to_bytes()).ok()?,
    ));
    std::fs::canonicalize(&path)
        .unwrap_or(path)
        .parent()
        .map(Path::to_path_buf)
}

/// The prebuilt folder searched: `FK_PREBUILT_DIR`, else `fusekit-kernels` next to the
/// library; with its NVRTC version. `None` when there is none (read once).
fn prebuilt_dir() -> Option<&'static (PathBuf, (i32, i32))> {
    static DIR: OnceLock<Option<(PathBuf, (i32, i32))>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = match std::env::var_os("FK_PREBUILT_DIR") {
            Some(d) => PathBuf::from(d),
            None => library_dir()?.join(PREBUILT_DIR_NAME),
        };
        let version =
            parse_nvrtc_version(&std::fs::read_to_string(dir.join(PREBUILT_VERSION_FILE)).ok()?)?;
        Some((dir, version))
    })
    .as_ref()
}

fn parse_nvrtc_version(text: &str) -> Option<(i32, i32)> {
    let (a, b) = text.trim().split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// `name`'s image for `arch` from the prebuilt folder `dir` made by NVRTC `version`,
/// if it has one (a CUBIN: an ELF file).
pub fn prebuilt_image(
    dir: &Path,
    version: (i32, i32),
    name: &str,
    source: &str,
    arch: &str,
) -> Option<Vec<u8>> {
    let image = std::fs::read(dir.join(cache_file_name(name, source, arch, version))).ok()?;
    image.starts_with(b"\x7fELF").then_some(image)
}

/// Writes `image` (`name` compiled for `arch` by the loaded NVRTC) into the prebuilt
/// folder `dir`, with the folder's `nvrtc-version` file.
pub fn store_prebuilt(
    dir: &Path,
    name: &str,
    source: &str,
    arch: &str,
    image: &[u8],
) -> Result<()> {
    let version = nvrtc_version()?;
    let io = |e: std::io::Error| {
        Error::new(
            crate::error::FK_ERROR_IO,
            format!(
                "writing the prebuilt image of {name} for {arch} into {}: {e}",
                dir.display()
            ),
        )
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let stamp = format!("{}.{}\n", version.0, version.1);
    let file = dir.join(PREBUILT_VERSION_FILE);
    match std::fs::read_to_string(&file) {
        Ok(old) if old != stamp => {
            return Err(Error::new(
                crate::error::FK_ERROR_INVALID_ARGUMENT,
                format!(
                    "{} holds images of NVRTC {}, not of the loaded NVRTC {}.{}",
                    dir.display(),
                    old.trim(),
                    version.0,
                    version.1
                ),
            ));
        }
        Ok(_) => {}
        Err(_) => std::fs::write(&file, stamp).map_err(io)?,
    }
    std::fs::write(
        dir.join(cache_file_name(name, source, arch, version)),
        image,
    )
    .map_err(io)
}

/// `compile` behind the prebuilt images and the on-disk cache.
pub fn compile_cached(name: &str, source: &str, arch: &str) -> Result<Vec<u8>> {
    if cache_disabled() {
        return compile(name, source, arch);
    }
    if let Some((dir, version)) = prebuilt_dir() {
        if let Some(image) = prebuilt_image(dir, *version, name, source, arch) {
            return Ok(image);
        }
    }
    let Some(dir) = cache_dir() else {
        return compile(name, source, arch);
    };
    let file = cache_file_name(name, source, arch, nvrtc_version()?);
    let path = dir.join(&file);
    if let Ok(image) = std::fs::read(&path) {
        if !image.is_empty() {
            return Ok(image);
        }
    }
    let image = compile(name, source, arch)?;
    // Cache failures are not errors: the image is compiled and usable.
    let _ = std::fs::create_dir_all(&dir).and_then(|_| {
        let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, &image)?;
        std::fs::rename(&tmp, &path)
    });
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fk-prebuilt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn cache_file_name_covers_source_arch_and_nvrtc_version() {
        let a = cache_file_name("m", "__global__ void k() {}", "sm_90", (13, 0));
        assert!(a.starts_with("m-sm_90-") && a.ends_with(".cubin"), "{a}");
        assert_eq!(a.len(), "m-sm_90-".len() + 32 + ".cubin".len());
        assert_eq!(
            a,
            cache_file_name("m", "__global__ void k() {}", "sm_90", (13, 0))
        );
        assert_ne!(
            a,
            cache_file_name("m", "__global__ void k(){}", "sm_90", (13, 0))
        );
        assert_ne!(
            a,
            cache_file_name("m", "__global__ void k() {}", "sm_90", (13, 1))
        );
        let other_arch = cache_file_name("m", "__global__ void k() {}", "sm_80", (13, 0));
        assert!(other_arch.starts_with("m-sm_80-"));
        assert_ne!(a[8..], other_arch[8..]);
    }

    #[test]
    fn prebuilt_image_is_found_by_key_and_version_only() {
        let d = scratch("lookup");
        let src = "__global__ void k() {}";
        let elf = b"\x7fELF fake cubin".to_vec();
        std::fs::write(d.join(cache_file_name("m", src, "sm_90", (13, 0))), &elf).unwrap();
        assert_eq!(prebuilt_image(&d, (13, 0), "m", src, "sm_90"), Some(elf));
        // another architecture, NVRTC version, or source: not there (compiles at run time)
        assert_eq!(prebuilt_image(&d, (13, 0), "m", src, "sm_100"), None);
        assert_eq!(prebuilt_image(&d, (13, 1), "m", src, "sm_90"), None);
        assert_eq!(
            prebuilt_image(&d, (13, 0), "m", "// changed", "sm_90"),
            None
        );
        // a file that is not a CUBIN is ignored
        std::fs::write(d.join(cache_file_name("n", src, "sm_90", (13, 0))), b"junk").unwrap();
        assert_eq!(prebuilt_image(&d, (13, 0), "n", src, "sm_90"), None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn nvrtc_version_file_parses() {
        assert_eq!(parse_nvrtc_version("13.0\n"), Some((13, 0)));
        assert_eq!(parse_nvrtc_version(" 12.9 "), Some((12, 9)));
        assert_eq!(parse_nvrtc_version("13"), None);
        assert_eq!(parse_nvrtc_version("x.y"), None);
    }

    #[test]
    fn active_environment_wheels_come_before_usr_local_cuda() {
        // the environment variables are read, not changed: compare with what is set
        let roots = cuda_roots();
        let usr = roots
            .iter()
            .position(|r| r == Path::new("/usr/local/cuda"))
            .unwrap();
        for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
            if let Some(prefix) = std::env::var_os(var) {
                for (i, r) in roots.iter().enumerate() {
                    if r.starts_with(&prefix) {
                        assert!(i < usr, "{} after /usr/local/cuda", r.display());
                    }
                }
            }
        }
        for r in &roots[usr + 1..] {
            assert!(
                r.ends_with("nvidia/cu13"),
                "{} after /usr/local/cuda",
                r.display()
            );
        }
    }

    #[test]
    fn library_dir_is_the_folder_of_this_binary() {
        let dir = library_dir().expect("dladdr found no file for this code");
        let exe = std::env::current_exe().unwrap();
        assert_eq!(dir, std::fs::canonicalize(exe).unwrap().parent().unwrap());
    }
}
