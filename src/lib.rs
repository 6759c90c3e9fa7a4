//! fusekit: fused GPU kernels behind a stable C ABI.
//!
//! One Rust library owns the CUDA resources (the device's primary context, streams,
//! stream-ordered memory, NVRTC-compiled kernel modules) and exposes them through
//! `include/fusekit.h`. Every op also runs on the CPU, the fallback without a GPU
//! and the oracle the CUDA path is tested against.
//!
//! Module map, from the top down (a module imports only those below it):
//! - `abi`, `xla`: every `extern "C"` function (pointer checks, panic catching,
//!   statuses); the XLA FFI handlers.
//! - `ops`: per op family, validation then dispatch to a backend.
//! - `cpu`, `cuda`: the backends, one module per family each: the CPU
//!   implementations (reference and fallback) and the CUDA launchers.
//! - `context`, `stream`, `buffer`, `dlpack`, `event`, `comm`: devices, queues,
//!   memory handles (pool statistics, pinned buffers, copies between any two
//!   buffers), events, communicators and collectives (NCCL or a single-rank CPU
//!   communicator).
//! - `gpu`: the CUDA runtime (driver, device, memory pool, NVRTC and the module
//!   cache, the loaded libraries), which knows no op family.
//! - `plan`: per family, what validated code hands a backend.
//! - `addr`, `dtype`, `layout`, `error`, `host`: addresses, element types, shapes
//!   and broadcasting, statuses and the thread-local last message, host facts.
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
/// C ABI, no stability promise).
#[doc(hidden)]
pub mod testing;
