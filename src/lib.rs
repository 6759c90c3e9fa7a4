//! fusekit: fused GPU kernels behind a stable C ABI.
//!
//! One Rust library owns the CUDA resources (the device's primary context, streams,
//! stream-ordered memory, NVRTC-compiled kernel modules) and exposes them through
//! `include/fusekit.h`. Every op also runs on the CPU, the fallback without a GPU
//! and the oracle the CUDA path is tested against.
//!
//! Module map:
//! - `abi`: every `extern "C"` function (pointer checks, panic catching, statuses).
//! - `error`: statuses, `Error`, the thread-local last message.
//! - `dtype`, `layout`: element types; shapes, strides, broadcasting.
//! - `context`, `stream`, `buffer`, `dlpack`: devices, queues, memory handles
//!   (pool statistics, pinned buffers, copies between any two buffers).
//! - `event`, `comm`: events (ordering, timing); communicators and collectives
//!   (NCCL, or a single-rank CPU communicator).
//! - `ops`: per op family, validation then dispatch.
//! - `cpu`: CPU implementations (reference and fallback).
//! - `cuda`: CUDA runtime (module cache, launch helpers) and per-family launchers.

//!
//! The Rust library (rlib) exposes the C ABI (`abi`) and the modules whose
//! constants and types it uses (`context`, `dlpack`, `dtype`, `error`); the rest is
//! crate-private, so that only validated code makes the plans and addresses the
//! backends take (docs/architecture.md, "Soundness"). `testing` holds the few
//! internals the integration tests, benches and examples call.

pub mod abi;
pub(crate) mod addr;
pub(crate) mod buffer;
pub(crate) mod comm;
pub mod context;
pub(crate) mod cpu;
pub(crate) mod cuda;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub(crate) mod event;
pub(crate) mod gpu;
pub(crate) mod host;
pub(crate) mod layout;
pub(crate) mod ops;
pub(crate) mod plan;
pub(crate) mod stream;
/** cbindgen:ignore */
pub(crate) mod xla; // XLA FFI handlers (docs/jax.md), not in fusekit.h

/// Internals the integration tests, benches and examples call (not part of the
/// C ABI, no stability promise): the CPU's GELU formulas, the kernel modules and
/// the NVRTC compiler, the loaded cuBLAS pair.
#[doc(hidden)]
pub mod testing {
    pub use crate::cpu::linalg::{gelu_erf, gelu_erf_grad, gelu_tanh, gelu_tanh_grad};
    pub use crate::cuda::modules;
    pub use crate::gpu::cublas::{loaded_pair, lt_declines_on_this_thread};
    pub use crate::gpu::nvrtc::{
        compile, cuda_include_dir, expand_source, load_nvrtc, nvrtc_version, store_prebuilt,
    };
}
