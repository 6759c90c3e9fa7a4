//! Kernel launch helpers shared by every op family's launcher.

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use super::CudaDevice;
use crate::error::{CudaContext as _, Result};

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
    launch_ex(
        dev,
        module,
        function,
        grid,
        block,
        shared_bytes,
        stream,
        params,
        false,
    )
}

/// `launch`, and with `early` on sm_90+ a programmatic dependent launch: the kernel
/// may be scheduled while the previous kernel on the stream is still finishing, and
/// must execute `griddepcontrol.wait` (`fk_grid_dependency_wait()` in common.cuh)
/// before it touches memory; that hides the launch gap between the two kernels.
#[allow(clippy::too_many_arguments)]
pub fn launch_ex(
    dev: &CudaDevice,
    module: &'static str,
    function: &'static str,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_bytes: u32,
    stream: usize,
    params: &mut [*mut c_void],
    early: bool,
) -> Result<()> {
    // (opted in to `shared_bytes` of dynamic shared memory above 48 KB, once per size)
    let f = dev.function_for_smem(module, function, shared_bytes)?;
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
    if dev.debug_sync && !super::is_capturing(stream) {
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
