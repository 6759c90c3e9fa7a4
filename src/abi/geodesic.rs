//! Geodesic flow entry points (docs/ops.md section 5): the low-rank Christoffel map and
//! a fused leapfrog integrator, with their backwards.
//!
//! Shared rules, stated once here and referenced by each function's doc:
//! - dtypes: f32 or f64; every buffer of one call has the dtype of `v` (`v0`).
//! - shapes: `v, x, f, g` and their gradients `[B, D]`; `U, W, dU, dW` `[D, R]`;
//!   `mu` `[D]`; `traj` `[T, 2, B, D]`. Any B, D, R (B = 0 or D = 0 is a no-op that
//!   still zeroes `dU`/`dW`). Every buffer must be contiguous (row-major).
//! - `c`: the clamp bound, `>= 0`; `INFINITY` disables clamping. The clamp is
//!   `torch.clamp(gamma_raw, -c, c)` (NaN propagates) and its derivative the
//!   inclusive mask `-c <= gamma_raw <= c` (0 where `gamma_raw` is NaN).
//! - `flags`: 0, or a combination of `FK_GEO_ALLOW_TF32` (the f32 forwards on CUDA
//!   may use TF32 tensor cores), `FK_GEO_ALLOW_TF32X3` (the f32 leapfrog forward on
//!   CUDA may use 3xTF32 tensor-core products, f32-level accuracy) and
//!   `FK_GEO_FORCE_GENERIC` (debugging: the generic CUDA kernels); other bits are
//!   `FK_ERROR_INVALID_ARGUMENT`.
//! - aliasing: outputs must not overlap inputs or each other, except the exact
//!   in-place forms named in each function.
//! - `stream`: the op is queued there (NULL = the default stream of `v`'s context);
//!   it never synchronises. On CUDA the backwards, and every op on shapes without
//!   a fast kernel (R > 32 or large D: the cuBLAS route or the generic kernels),
//!   allocate temporary workspaces stream-ordered on `stream` (`cuMemAllocAsync`),
//!   freed on the same stream.
//! - statuses: `FK_ERROR_NULL_POINTER` (a required buffer NULL),
//!   `FK_ERROR_UNSUPPORTED_DTYPE` (`v` not f32/f64), `FK_ERROR_DTYPE_MISMATCH`,
//!   `FK_ERROR_SHAPE_MISMATCH` (wrong rank or extent; the message names the
//!   argument and the expected shape), `FK_ERROR_UNSUPPORTED` (a non-contiguous
//!   buffer), `FK_ERROR_INVALID_ARGUMENT` (`c` negative or NaN, `dt` not finite,
//!   `steps < 1`, unknown `flags`, a stale handle, a read-only output),
//!   `FK_ERROR_DEVICE_MISMATCH`, `FK_ERROR_ALIASING`, and on CUDA
//!   `FK_ERROR_OUT_OF_MEMORY` (workspace), `FK_ERROR_LIBRARY_NOT_FOUND`,
//!   `FK_ERROR_KERNEL_COMPILE`, `FK_ERROR_CUDA`.
//!
//! docs/geodesic.md has the formulas, the kernels' design and performance notes.

#![allow(non_snake_case)]

use super::{fk_buffer, fk_stream, guard, stream_or_default};
use crate::error::fk_status;
use crate::ops::geodesic as geo;
use crate::plan::geodesic::{GEO_ALLOW_TF32, GEO_ALLOW_TF32X3, GEO_FORCE_GENERIC};

/// `flags` bit of the geodesic ops: the CUDA forwards (`fk_christoffel_forward`,
/// `fk_leapfrog_forward`) may use TF32 tensor cores (mma.sync) for the f32 products,
/// about 5e-4 relative error in gamma instead of 1e-7. A permission, not a demand:
/// it takes effect for f32 on CUDA where the fast kernels apply (D <= 512, R <= 32)
/// and in the forwards' cuBLAS route (shapes without a fast kernel); the
/// CPU, f64, the generic kernels and both backwards stay strict IEEE. In the fast TF32
/// kernels a row of `v` holding +-inf gets NaN throughout its gamma (strict f32 may
/// give +-c for some of its features).
pub const FK_GEO_ALLOW_TF32: u32 = 1;

/// `flags` bit of the geodesic ops, for testing and debugging: the CUDA backend
/// uses its generic kernels even where a fast configuration or the cuBLAS route
/// would run (same results to rounding, several times slower). Ignored on the CPU.
pub const FK_GEO_FORCE_GENERIC: u32 = 2;

/// `flags` bit of the geodesic ops: the CUDA leapfrog forward may compute its f32
/// products as 3xTF32 on the tensor cores (each operand split into a TF32 high part
/// and a TF32 low part; hi*hi + hi*lo + lo*hi, f32 accumulation): f32-level accuracy
/// (H100, B = 65536, D = 512, R = 32, T = 8: 5.5e-7 relative against f64, where the
/// FFMA kernel has 1.0e-7 and TF32 1.4e-4), about 1.6x faster than the FFMA kernel.
/// A permission, not a demand: it takes effect for f32 on CUDA where the fast kernels
/// apply (D <= 512, R <= 32) and their shared memory fits, for `steps >= 2` (at one
/// step the FFMA kernel is faster); everything else, including
/// `fk_christoffel_forward`, the backwards and the recomputed forward inside
/// `fk_leapfrog_backward`, stays strict IEEE. With `FK_GEO_ALLOW_TF32` also set, TF32
/// (the faster) is used.
pub const FK_GEO_ALLOW_TF32X3: u32 = 4;

// cbindgen copies literal values only; the crate's constants must agree.
const _: () = assert!(FK_GEO_ALLOW_TF32 == GEO_ALLOW_TF32);
const _: () = assert!(FK_GEO_FORCE_GENERIC == GEO_FORCE_GENERIC);
const _: () = assert!(FK_GEO_ALLOW_TF32X3 == GEO_ALLOW_TF32X3);

/// Christoffel forward: `p = v U` `[B, R]`, `s = p*p`, `gamma_raw = s W^T` `[B, D]`,
/// `gamma = clamp(gamma_raw, -c, c)` (`c = 5` in the source model; `INFINITY`
/// disables clamping).
///
/// `v` `[B, D]`, `U` and `W` `[D, R]`, `gamma` `[B, D]` (output), all required,
/// f32 or f64 (one dtype), any B, D, R. `c >= 0`. `gamma` may be `v` itself (in
/// place); no other overlap.
/// `flags`: 0, or `FK_GEO_ALLOW_TF32` (f32 forwards on CUDA may use TF32 tensor
/// cores, ~5e-4 relative error; ignored by the backwards) and/or
/// `FK_GEO_FORCE_GENERIC` (debugging: the generic CUDA kernels). Buffers are contiguous row-major; `stream` NULL = the default stream
/// of `v`'s context; the call queues work and never synchronises.
/// Statuses: `FK_ERROR_NULL_POINTER` (a required buffer is NULL),
/// `FK_ERROR_UNSUPPORTED_DTYPE` (`v` not f32/f64), `FK_ERROR_DTYPE_MISMATCH` (a buffer
/// of another dtype than `v`), `FK_ERROR_SHAPE_MISMATCH` (wrong rank or extent; the
/// message names the argument and the expected shape), `FK_ERROR_UNSUPPORTED` (a
/// non-contiguous buffer), `FK_ERROR_INVALID_ARGUMENT` (`c` negative or NaN,
/// unknown `flags` bits, a stale handle, a read-only output), `FK_ERROR_DEVICE_MISMATCH`
/// (buffers or stream on different devices), `FK_ERROR_ALIASING` (a forbidden
/// overlap), and on CUDA `FK_ERROR_OUT_OF_MEMORY` (workspace), `FK_ERROR_LIBRARY_NOT_FOUND`,
/// `FK_ERROR_KERNEL_COMPILE`, `FK_ERROR_CUDA`.
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_christoffel_forward(
    v: *const fk_buffer,
    U: *const fk_buffer,
    W: *const fk_buffer,
    c: f64,
    flags: u32,
    gamma: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_christoffel_forward", || unsafe {
        let (v, u, w, o) = buffers!(v, U, W, gamma);
        let s = stream_or_default(stream, &v.ctx)?;
        geo::christoffel_forward(v, u, w, c, flags, o, &s)
    })
}

/// Christoffel backward, given `g = dL/dgamma` `[B, D]`: with `p, s, gamma_raw` of
/// the forward (recomputed), `g' = g * 1[-c <= gamma_raw <= c]`, `dW = g'^T s`,
/// `dp = 2 p * (g' W)`, `dv = dp U^T` `[B, D]`, `dU = v^T dp` `[D, R]`.
///
/// `v`, `U`, `W`, `g` required; `dv`, `dU`, `dW` each optional (NULL = not wanted;
/// all NULL is a no-op). Outputs are overwritten (not accumulated) and must not
/// overlap inputs or each other. `dU`/`dW` sum over the batch deterministically
/// (per-block partial sums, then a fixed-order second pass; no atomics), so
/// repeated calls give bit-identical results. `v`, `g` `[B, D]`; `U`, `W`, `dU`, `dW`
/// `[D, R]`; one dtype, f32 or f64. On CUDA a workspace of (blocks x D' x R')
/// elements per wanted parameter gradient is allocated stream-ordered on `stream`
/// (fast kernels: D rounded up to 128, 256, 512 or 1024 and R to 8, 16 or 32; the
/// generic kernels: D' = D, R' = R).
/// `flags`: 0, or `FK_GEO_ALLOW_TF32` (f32 forwards on CUDA may use TF32 tensor
/// cores, ~5e-4 relative error; ignored by the backwards) and/or
/// `FK_GEO_FORCE_GENERIC` (debugging: the generic CUDA kernels). Buffers are contiguous row-major; `stream` NULL = the default stream
/// of `v`'s context; the call queues work and never synchronises.
/// Statuses: `FK_ERROR_NULL_POINTER` (a required buffer is NULL),
/// `FK_ERROR_UNSUPPORTED_DTYPE` (`v` not f32/f64), `FK_ERROR_DTYPE_MISMATCH` (a buffer
/// of another dtype than `v`), `FK_ERROR_SHAPE_MISMATCH` (wrong rank or extent; the
/// message names the argument and the expected shape), `FK_ERROR_UNSUPPORTED` (a
/// non-contiguous buffer), `FK_ERROR_INVALID_ARGUMENT` (`c` negative or NaN,
/// unknown `flags` bits, a stale handle, a read-only output), `FK_ERROR_DEVICE_MISMATCH`
/// (buffers or stream on different devices), `FK_ERROR_ALIASING` (a forbidden
/// overlap), and on CUDA `FK_ERROR_OUT_OF_MEMORY` (workspace), `FK_ERROR_LIBRARY_NOT_FOUND`,
/// `FK_ERROR_KERNEL_COMPILE`, `FK_ERROR_CUDA`.
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_christoffel_backward(
    v: *const fk_buffer,
    U: *const fk_buffer,
    W: *const fk_buffer,
    g: *const fk_buffer,
    c: f64,
    flags: u32,
    dv: *mut fk_buffer,
    dU: *mut fk_buffer,
    dW: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_christoffel_backward", || unsafe {
        let (v, u, w, g) = buffers!(v, U, W, g);
        let (dv, du, dw) = buffers!([dv], [dU], [dW]);
        let s = stream_or_default(stream, &v.ctx)?;
        geo::christoffel_backward(v, u, w, g, c, flags, dv, du, dw, &s)
    })
}

/// Leapfrog (kick-drift-kick), `steps` = T >= 1 steps fused in one launch:
/// ```text
/// for t in 0..T:
///     vh = v + 0.5*dt*(f - Gamma(v) - mu*v)
///     x  = x + dt*vh
///     v  = vh + 0.5*dt*(f - Gamma(vh) - mu*vh)
/// ```
/// with `Gamma` the clamped Christoffel map of `fk_christoffel_forward` (`U`, `W`,
/// `c`). `x0`, `v0` `[B, D]`, `U`, `W` `[D, R]`, `x_out`, `v_out` `[B, D]` required;
/// `f` `[B, D]` optional (NULL = zero force; constant over the steps), `mu` `[D]`
/// optional (per-feature friction; NULL = 0), `traj` `[T, 2, B, D]` optional output:
/// `traj[t][0] = x` and `traj[t][1] = v` after step t (so `traj[T-1]` is the final
/// state), kept for `fk_leapfrog_backward`. `dt` finite.
///
/// `x_out` may be `x0` and `v_out` may be `v0` (in place); no other overlap. One
/// dtype, f32 or f64; any B, D, R.
/// `flags`: 0, or `FK_GEO_ALLOW_TF32` (f32 forwards on CUDA may use TF32 tensor
/// cores, ~5e-4 relative error; ignored by the backwards), `FK_GEO_ALLOW_TF32X3`
/// (this op on CUDA may use 3xTF32 tensor-core products for f32, f32-level accuracy)
/// and/or `FK_GEO_FORCE_GENERIC` (debugging: the generic CUDA kernels). Buffers are contiguous row-major; `stream` NULL = the default stream
/// of `v0`'s context; the call queues work and never synchronises.
/// Statuses: `FK_ERROR_NULL_POINTER` (a required buffer is NULL),
/// `FK_ERROR_UNSUPPORTED_DTYPE` (`v0` not f32/f64), `FK_ERROR_DTYPE_MISMATCH` (a buffer
/// of another dtype than `v0`), `FK_ERROR_SHAPE_MISMATCH` (wrong rank or extent; the
/// message names the argument and the expected shape), `FK_ERROR_UNSUPPORTED` (a
/// non-contiguous buffer), `FK_ERROR_INVALID_ARGUMENT` (`c` negative or NaN, `dt` not finite, `steps < 1`,
/// unknown `flags` bits, a stale handle, a read-only output), `FK_ERROR_DEVICE_MISMATCH`
/// (buffers or stream on different devices), `FK_ERROR_ALIASING` (a forbidden
/// overlap), and on CUDA `FK_ERROR_OUT_OF_MEMORY` (workspace), `FK_ERROR_LIBRARY_NOT_FOUND`,
/// `FK_ERROR_KERNEL_COMPILE`, `FK_ERROR_CUDA`.
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_leapfrog_forward(
    x0: *const fk_buffer,
    v0: *const fk_buffer,
    f: *const fk_buffer,
    U: *const fk_buffer,
    W: *const fk_buffer,
    mu: *const fk_buffer,
    dt: f64,
    steps: i64,
    c: f64,
    flags: u32,
    x_out: *mut fk_buffer,
    v_out: *mut fk_buffer,
    traj: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_leapfrog_forward", || unsafe {
        let (x0, v0, f, u, w, mu) = buffers!(x0, v0, [f], U, W, [mu]);
        let (xo, vo, tr) = buffers!(x_out, v_out, [traj]);
        let s = stream_or_default(stream, &v0.ctx)?;
        geo::leapfrog_forward(x0, v0, f, u, w, mu, dt, steps, c, flags, xo, vo, tr, &s)
    })
}

/// Leapfrog backward: gradients of a loss L(x_T, v_T) of `fk_leapfrog_forward` with
/// the same `v0, f, U, W, mu, dt, steps, c`, given `gx = dL/dx_T` and
/// `gv = dL/dv_T` (`[B, D]`, each optional: NULL = zero). Outputs, each optional
/// (NULL = not wanted): `dx0`, `dv0`, `df` `[B, D]`, `dU`, `dW` `[D, R]`; they are
/// overwritten, not accumulated, and must not overlap inputs or each other.
/// (`x0` is not an argument: nothing depends on it but `x_T = x0 + ...`, so
/// `dx0 = gx`.)
///
/// `traj` (optional) is the `[T, 2, B, D]` trajectory written by the forward; with
/// it the backward reads the velocities `v_t` from it (T*B*D elements read, no
/// extra memory). Without it the backward recomputes them: the CPU keeps `T*D`
/// values per row in flight; CUDA recomputes each tile of rows on chip and keeps
/// its states in a per-block workspace of `(T-1)*rows_per_block*D` elements (a few
/// MB, independent of B). Either way each step costs two Christoffel forwards and
/// two Christoffel backwards (about 3x the forward's work; 4x without `traj`).
/// Shapes without a fast kernel (R > 32, D > 1024, f64 with large D*R) run on CUDA
/// through cuBLAS, with a workspace that grows with B: 4 `[B, R]` and 3 `[B, D]`
/// (one `[B, D]` more without `dv0`), plus `(T-1)` `[B, D]` without `traj`; where
/// that memory is not available, the generic kernels run instead.
/// `dU`/`dW` are deterministic (no atomics). One dtype, f32 or f64; any B, D, R.
/// `flags`: 0, or `FK_GEO_ALLOW_TF32` (f32 forwards on CUDA may use TF32 tensor
/// cores, ~5e-4 relative error; ignored by the backwards) and/or
/// `FK_GEO_FORCE_GENERIC` (debugging: the generic CUDA kernels). Buffers are contiguous row-major; `stream` NULL = the default stream
/// of `v0`'s context; the call queues work and never synchronises.
/// Statuses: `FK_ERROR_NULL_POINTER` (a required buffer is NULL),
/// `FK_ERROR_UNSUPPORTED_DTYPE` (`v0` not f32/f64), `FK_ERROR_DTYPE_MISMATCH` (a buffer
/// of another dtype than `v0`), `FK_ERROR_SHAPE_MISMATCH` (wrong rank or extent; the
/// message names the argument and the expected shape), `FK_ERROR_UNSUPPORTED` (a
/// non-contiguous buffer), `FK_ERROR_INVALID_ARGUMENT` (`c` negative or NaN, `dt` not finite, `steps < 1`,
/// unknown `flags` bits, a stale handle, a read-only output), `FK_ERROR_DEVICE_MISMATCH`
/// (buffers or stream on different devices), `FK_ERROR_ALIASING` (a forbidden
/// overlap), and on CUDA `FK_ERROR_OUT_OF_MEMORY` (workspace), `FK_ERROR_LIBRARY_NOT_FOUND`,
/// `FK_ERROR_KERNEL_COMPILE`, `FK_ERROR_CUDA`.
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_leapfrog_backward(
    v0: *const fk_buffer,
    f: *const fk_buffer,
    U: *const fk_buffer,
    W: *const fk_buffer,
    mu: *const fk_buffer,
    dt: f64,
    steps: i64,
    c: f64,
    flags: u32,
    traj: *const fk_buffer,
    gx: *const fk_buffer,
    gv: *const fk_buffer,
    dx0: *mut fk_buffer,
    dv0: *mut fk_buffer,
    df: *mut fk_buffer,
    dU: *mut fk_buffer,
    dW: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_leapfrog_backward", || unsafe {
        let (v0, f, u, w, mu) = buffers!(v0, [f], U, W, [mu]);
        let (tr, gx, gv) = buffers!([traj], [gx], [gv]);
        let (dx0, dv0, df, du, dw) = buffers!([dx0], [dv0], [df], [dU], [dW]);
        let s = stream_or_default(stream, &v0.ctx)?;
        geo::leapfrog_backward(
            v0, f, u, w, mu, dt, steps, c, flags, tr, gx, gv, dx0, dv0, df, du, dw, &s,
        )
    })
}
