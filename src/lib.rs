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

pub mod abi;
pub mod buffer;
pub mod comm;
pub mod context;
pub mod cpu;
pub mod cuda;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod event;
pub mod layout;
pub mod ops;
pub mod stream;
