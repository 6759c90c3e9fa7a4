//! Kernel launch helpers shared by every op family's launcher.

use std::ffi::c_void;

use cudarc::driver::{LaunchConfig, result, sys};

use crate::dtype::DType;
use crate::error::{CudaContext as _, FK_ERROR_UNSUPPORTED_DTYPE, Result};
use crate::gpu::CudaDevice;

// ------------------------------------------------------------------ kernel names
//
// One naming scheme for every family: a kernel (or module) built once per element
// type is named `{base}_{suffix}`, the suffix `kernel_suffix(dtype)` last and every
// other qualifier (variant, store, tile) in the base (`gs_maha_fwd_f32`,
// `elementwise_c128`, `kron_w4_f32`, `geo_chr_fwd_tc_r32_d8_f32`; docs/architecture.md).
// `per_dtype!("base": f32, f64)` lists
// the dtypes it is built for, as static strings; `Names::get` looks one up and an
// element type it was not built for is an error, never another dtype's kernel.

/// The suffix of `d` in kernel and module names.
pub const fn kernel_suffix(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::C64 => "c64",
        DType::C128 => "c128",
    }
}

/// The names `{base}_{suffix}` of one kernel (or module) per element type; made by
/// `per_dtype!`.
#[derive(Debug, Clone, Copy)]
pub struct Names {
    pub base: &'static str,
    pub names: &'static [(DType, &'static str)],
}

impl Names {
    /// The name for `d`; `FK_ERROR_UNSUPPORTED_DTYPE` if it is not built for `d`.
    pub fn get(&self, d: DType) -> Result<&'static str> {
        match self.names.iter().find(|(t, _)| *t == d) {
            Some((_, name)) => Ok(name),
            None => crate::bail!(
                FK_ERROR_UNSUPPORTED_DTYPE,
                "no {}_* kernel for dtype {d} (built for {})",
                self.base,
                self.names
                    .iter()
                    .map(|(t, _)| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// `per_dtype!("gs_maha_fwd": f32, f64)`: the `Names` `gs_maha_fwd_f32`,
/// `gs_maha_fwd_f64` (suffixes spelled as `kernel_suffix`, checked by a test); a base
/// built by `concat!` goes in brackets: `per_dtype!([concat!("kron_", "w8")]: f16)`.
macro_rules! per_dtype {
    ($base:literal: $($dt:ident),+ $(,)?) => {
        $crate::cuda::launch::per_dtype!([$base]: $($dt),+)
    };
    ([$base:expr]: $($dt:ident),+ $(,)?) => {
        $crate::cuda::launch::Names {
            base: $base,
            names: &[$(($crate::cuda::launch::per_dtype!(@dtype $dt), concat!($base, "_", stringify!($dt)))),+],
        }
    };
    (@dtype f16) => { $crate::dtype::DType::F16 };
    (@dtype bf16) => { $crate::dtype::DType::BF16 };
    (@dtype f32) => { $crate::dtype::DType::F32 };
    (@dtype f64) => { $crate::dtype::DType::F64 };
    (@dtype c64) => { $crate::dtype::DType::C64 };
    (@dtype c128) => { $crate::dtype::DType::C128 };
}
pub(crate) use per_dtype;

/// `dtype_modules!(pub MODULES, MODULE = "gaussian", source: f32, f64)`: a family's
/// kernel modules, one per element type, named `{base}_{suffix}`, as
/// `MODULES: [(name, source)]` (what `cuda::modules` chains) and the `Names`
/// `MODULE` to look one up; `source(dtype)` makes a module's source.
macro_rules! dtype_modules {
    ($vis:vis $modules:ident, $names:ident = $base:literal, $source:path: $($dt:ident),+ $(,)?) => {
        /// One kernel module per element type: `(name, source)`.
        $vis const $modules: [(&str, fn() -> String); [$(stringify!($dt)),+].len()] = [
            $((concat!($base, "_", stringify!($dt)), || $source($crate::cuda::launch::per_dtype!(@dtype $dt)))),+
        ];
        /// The module of each element type.
        const $names: $crate::cuda::launch::Names = $crate::cuda::launch::per_dtype!($base: $($dt),+);
    };
}
pub(crate) use dtype_modules;

/// `#define NAME VALUE` lines: constants a kernel module takes from its launcher,
/// stated once in Rust and prepended to the source NVRTC compiles.
pub fn defines(defs: &[(&str, i64)]) -> String {
    defs.iter()
        .map(|(name, v)| format!("#define {name} {v}\n"))
        .collect()
}

/// Threads per block of the memory-bound grid-stride kernels.
pub(crate) const BLOCK: u32 = 256;

/// Blocks for a grid-stride loop over `items` work items: enough to fill every
/// multiprocessor (8 resident blocks of `BLOCK` threads each), never more than needed.
pub fn grid_for(dev: &CudaDevice, items: i64) -> u32 {
    let needed = (items.max(1) + BLOCK as i64 - 1) / BLOCK as i64;
    let full = dev.sm_count.max(1) as i64 * 8;
    needed.min(full).max(1) as u32
}

/// Launches `module::function` on `stream` with `params` (pointers to each argument).
#[allow(clippy::too_many_arguments)]
pub fn launch(
    dev: &CudaDevice,
    module: &'static str,
    function: &'static str,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_bytes: u32,
    stream: usize,
    params: &mut [*mut c_void],
) -> Result<()> {
    let config = LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: shared_bytes,
    };
    launch_ex(dev, module, function, config, stream, params, false)
}

/// `launch` (grid, block and dynamic shared memory as cudarc's `LaunchConfig`),
/// and with `early` on sm_90+ a programmatic dependent launch: the kernel
/// may be scheduled while the previous kernel on the stream is still finishing, and
/// must execute `griddepcontrol.wait` (`fk_grid_dependency_wait()` in common.cuh)
/// before it touches memory; that hides the launch gap between the two kernels.
pub fn launch_ex(
    dev: &CudaDevice,
    module: &'static str,
    function: &'static str,
    config: LaunchConfig,
    stream: usize,
    params: &mut [*mut c_void],
    early: bool,
) -> Result<()> {
    let LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: shared_bytes,
    } = config;
    // (opted in to `shared_bytes` of dynamic shared memory above 48 KB, once per size)
    let f = dev.function_for_smem(module, function, shared_bytes, super::source_of)?;
    dev.bind()?;
    // SAFETY: `params` match the kernel's signature (each launcher pairs a repr(C)
    // argument struct with its kernel), and the function belongs to this context.
    unsafe {
        if early && dev.arch.0 >= 9 {
            // SAFETY: a zeroed attribute is valid plain data; the id and value set
            // here are the programmatic-serialisation pair.
            let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block.0,
                blockDimY: block.1,
                blockDimZ: block.2,
                sharedMemBytes: shared_bytes,
                hStream: stream as sys::CUstream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut()).result()
        } else {
            result::launch_kernel(
                f,
                grid,
                block,
                shared_bytes,
                stream as sys::CUstream,
                params,
            )
        }
    }
    .cuda(&format!("launching {module}::{function}"))?;
    // (Not while the stream is being captured: a synchronisation would break it.)
    if dev.debug_sync && !crate::gpu::is_capturing(stream) {
        dev.stream_synchronize(stream).map_err(|mut e| {
            e.message = format!(
                "kernel {module}::{function} faulted (FK_DEBUG_SYNC): {}",
                e.message
            );
            e
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: Names = per_dtype!("k": f16, bf16, f32, f64, c64, c128);

    fn src(d: DType) -> String {
        format!("// {d}")
    }
    dtype_modules!(MODS, MOD = "fam", src: f32, c64);

    #[test]
    fn dtype_modules_name_each_module_once() {
        assert_eq!(
            MODS.map(|(n, s)| (n, s())),
            [
                ("fam_f32", "// f32".to_string()),
                ("fam_c64", "// complex64".to_string())
            ]
        );
        assert_eq!(MOD.get(DType::C64).unwrap(), "fam_c64");
        assert!(MOD.get(DType::F64).is_err());
    }

    #[test]
    fn names_follow_the_suffix_scheme_and_never_fall_back() {
        for d in crate::dtype::ALL_DTYPES {
            assert_eq!(NAMES.get(d).unwrap(), format!("k_{}", kernel_suffix(d)));
        }
        let two: Names = per_dtype!("gs_maha_fwd": f32, f64);
        assert_eq!(two.get(DType::F64).unwrap(), "gs_maha_fwd_f64");
        let e = two.get(DType::F16).unwrap_err();
        assert_eq!(e.status, FK_ERROR_UNSUPPORTED_DTYPE);
        assert_eq!(
            e.message,
            "no gs_maha_fwd_* kernel for dtype f16 (built for f32, f64)"
        );
        assert_eq!(
            defines(&[("GS_THREADS", 256), ("GS_K", 10)]),
            "#define GS_THREADS 256\n#define GS_K 10\n"
        );
    }
}
