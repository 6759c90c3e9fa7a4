//! Internals the integration tests, benches and examples call (not part of the
//! C ABI, no stability promise): the CPU's GELU formulas, the kernel modules and
//! the NVRTC compiler, the loaded cuBLAS pair.

pub use crate::cpu::linalg::{gelu_erf, gelu_erf_grad, gelu_tanh, gelu_tanh_grad};
pub use crate::cuda::modules;
pub use crate::gpu::cublas::{loaded_pair, lt_declines_on_this_thread};
pub use crate::gpu::nvrtc::{
    compile, cuda_include_dir, expand_source, load_nvrtc, nvrtc_version, store_prebuilt,
};
