//! The launchers' unit tests of kernels run on the CPU: a kernel module's source
//! built by the host C++ compiler against an emulator of CUDA threads (the
//! Kronecker kernels against `tests/cuda_emu`, the fused MLP kernels against
//! `tests/emu`), in a folder of its own.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A built emulator program; its folder is removed when dropped unless the test's
/// keep variable named it.
pub(crate) struct Emulated {
    pub dir: PathBuf,
    pub exe: PathBuf,
    keep: bool,
}

impl Drop for Emulated {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// What to build: the module `source`, written as `file` beside the emulator's
/// `common.cuh` (`common`, a path in the repository) and kernels/activation.cuh,
/// compiled with the repository's `sources` as C++ `std`, the emulator's folder
/// `emu_dir` on the include path, into the program `name`; in a temporary folder,
/// or in the one the environment variable `keep_env` names (kept).
pub(crate) struct Build<'a> {
    pub name: &'a str,
    pub keep_env: &'a str,
    pub file: &'a str,
    pub source: String,
    pub emu_dir: &'a str,
    pub common: &'a str,
    pub std: &'a str,
    pub sources: &'a [&'a str],
}

impl Build<'_> {
    /// The built program; `None` (a SKIPPED line printed) without a C++ compiler
    /// (`CXX`, else g++). Panics with the compiler's output when the build fails.
    pub(crate) fn run(self) -> Option<Emulated> {
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
        if Command::new(&cxx).arg("--version").output().is_err() {
            println!("SKIPPED: no C++ compiler ({cxx})");
            return None;
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let keep = std::env::var_os(self.keep_env);
        let dir = keep.clone().map_or_else(
            || std::env::temp_dir().join(format!("fusekit-{}-{}", self.name, std::process::id())),
            PathBuf::from,
        );
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(self.file), &self.source).unwrap();
        std::fs::copy(root.join(self.common), dir.join("common.cuh")).unwrap();
        std::fs::copy(
            root.join("kernels/activation.cuh"),
            dir.join("activation.cuh"),
        )
        .unwrap();
        let built = Emulated {
            exe: dir.join(self.name),
            dir,
            keep: keep.is_some(),
        };
        let out = Command::new(&cxx)
            .args([&format!("-std={}", self.std), "-O1", "-w"])
            .arg(format!("-I{}", built.dir.display()))
            .arg(format!("-I{}", root.join(self.emu_dir).display()))
            .args(self.sources.iter().map(|s| root.join(s)))
            .arg("-o")
            .arg(&built.exe)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "compiling the emulated kernels failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(built)
    }
}
