//! Gaussian field entry points (docs/ops.md section 3; design in docs/gaussian.md).
//!
//! Shared rules, stated once here and in each function's doc:
//! - dtypes: f32 or f64; every buffer of a call has the same dtype.
//! - every buffer is row-major contiguous; outputs must not overlap inputs or
//!   each other; gradients overwrite their outputs (no accumulation).
//! - `eps` (finite, >= 0; the bindings default it to `FK_GAUSSIAN_DEFAULT_EPS`)
//!   is added to the diagonal of each L; the strictly upper part of `chol` is
//!   never read. No check is made that L_ii + eps is non-zero: a singular factor
//!   gives inf/NaN as IEEE arithmetic does.

use super::{context_ref, fk_buffer, fk_context, fk_stream, guard, stream_or_default, write_out};
use crate::dtype::{DType, fk_dtype};
use crate::error::fk_status;
use crate::ops::gaussian as gs;

/// Default `eps` added to the diagonal of every Cholesky factor (the source model's value).
pub const FK_GAUSSIAN_DEFAULT_EPS: f64 = 1e-6;

/// Squared Mahalanobis distances: `out[b,n] = |y|^2` where `(L_n + eps I) y = p_b - mu_n`
/// is solved by forward substitution.
///
/// - `points` `[B,3]`, `means` `[N,3]`, `chol` `[N,3,3]` (lower-triangular L,
///   row-major; the upper part is ignored): f32 or f64, one dtype, contiguous.
/// - `eps`: finite and >= 0, added to the diagonal of L (default `FK_GAUSSIAN_DEFAULT_EPS`).
/// - `out` `[B,N]`, same dtype, contiguous, overlapping no input; overwritten.
/// - `stream`: queued there (NULL = the default stream of `points`' context); no
///   synchronisation, no allocation.
///
/// Statuses: `FK_ERROR_NULL_POINTER` (points, means, chol or out NULL),
/// `FK_ERROR_UNSUPPORTED_DTYPE` (not f32/f64), `FK_ERROR_DTYPE_MISMATCH`,
/// `FK_ERROR_SHAPE_MISMATCH`, `FK_ERROR_UNSUPPORTED` (non-contiguous buffer),
/// `FK_ERROR_INVALID_ARGUMENT` (eps negative or not finite, read-only out, a dead
/// handle), `FK_ERROR_ALIASING` (out overlaps an input), `FK_ERROR_DEVICE_MISMATCH`;
/// on CUDA also `FK_ERROR_LIBRARY_NOT_FOUND`, `FK_ERROR_KERNEL_COMPILE`, `FK_ERROR_CUDA`.
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_mahalanobis_forward(
    points: *const fk_buffer,
    means: *const fk_buffer,
    chol: *const fk_buffer,
    eps: f64,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_mahalanobis_forward", || unsafe {
        let (p, m, c, o) = buffers!(points, means, chol, out);
        let s = stream_or_default(stream, &p.ctx)?;
        gs::mahalanobis_forward(p, m, c, eps, o, &s)
    })
}

/// Backward of `fk_mahalanobis_forward`: given `g = dL/dm` `[B,N]`, with
/// `y = (L+eps I)^-1 (p_b - mu_n)` and `z = (L+eps I)^-T (2 g_bn y)`:
/// `dpoints[b] = sum_n z`, `dmeans[n] = -sum_b z`, and the exact full lower triangle
/// `dchol[n][i][j] = -sum_b z_i y_j` for `i >= j` (the upper part is written as 0:
/// it does not enter the op).
///
/// - `points`, `means`, `chol`, `eps`: as `fk_mahalanobis_forward`; `g` `[B,N]`.
/// - `dpoints` `[B,3]`, `dmeans` `[N,3]`, `dchol` `[N,3,3]`: each optional (NULL =
///   not wanted; all NULL is a no-op); overwritten; no overlap with any input or
///   other output.
/// - `workspace`: on CUDA, a contiguous buffer (any dtype) of at least the bytes
///   `fk_gaussian_backward_workspace_size` gives for this dtype, B and N, where the
///   partial sums go (the reduction is deterministic: same inputs, same bits). On
///   the CPU it is ignored and may be NULL. fusekit allocates nothing.
/// - `stream`: as `fk_mahalanobis_forward`. The workspace is in use until the
///   stream passes this call.
///
/// Statuses: those of `fk_mahalanobis_forward`, plus `FK_ERROR_NULL_POINTER` (g NULL,
/// or workspace NULL on CUDA), `FK_ERROR_BUFFER_TOO_SMALL` (workspace smaller than
/// needed), `FK_ERROR_ALIASING` (an output or the workspace overlaps another argument).
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_mahalanobis_backward(
    points: *const fk_buffer,
    means: *const fk_buffer,
    chol: *const fk_buffer,
    eps: f64,
    g: *const fk_buffer,
    dpoints: *mut fk_buffer,
    dmeans: *mut fk_buffer,
    dchol: *mut fk_buffer,
    workspace: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_mahalanobis_backward", || unsafe {
        let (p, m, c, gb) = buffers!(points, means, chol, g);
        let (dp, dm, dc, ws) = buffers!([dpoints], [dmeans], [dchol], [workspace]);
        let s = stream_or_default(stream, &p.ctx)?;
        gs::mahalanobis_backward(p, m, c, eps, gb, dp, dm, dc, ws, &s)
    })
}

/// Gaussian field, fused: `out[b] = sum_n weights[n] * exp(-0.5 m[b,n])` with `m` the
/// squared Mahalanobis distance of `fk_mahalanobis_forward`; no `[B,N]` array is
/// ever written, so B and N may be large together (1M points x 65536 Gaussians).
///
/// - `points` `[B,3]`, `means` `[N,3]`, `chol` `[N,3,3]`, `weights` `[N]`: f32 or
///   f64, one dtype, contiguous. `eps` as `fk_mahalanobis_forward`.
/// - `out` `[B]`, same dtype; overwritten (0 when N = 0).
/// - `stream`: queued there (NULL = the default stream); no synchronisation, no
///   allocation. The sum over Gaussians is in a fixed order (deterministic).
///
/// Statuses: those of `fk_mahalanobis_forward` (weights NULL: `FK_ERROR_NULL_POINTER`).
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_gaussian_field_forward(
    points: *const fk_buffer,
    means: *const fk_buffer,
    chol: *const fk_buffer,
    weights: *const fk_buffer,
    eps: f64,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_gaussian_field_forward", || unsafe {
        let (p, m, c, w, o) = buffers!(points, means, chol, weights, out);
        let s = stream_or_default(stream, &p.ctx)?;
        gs::field_forward(p, m, c, w, eps, o, &s)
    })
}

/// Backward of `fk_gaussian_field_forward`, fused (no `[B,N]` intermediate): given
/// `dout = dL/dout` `[B]`, with `e = exp(-0.5 m[b,n])` it applies the Mahalanobis
/// backward to `g[b,n] = -0.5 dout[b] weights[n] e` and gives
/// `dweights[n] = sum_b dout[b] e`.
///
/// - inputs as `fk_gaussian_field_forward`; `dout` `[B]`.
/// - `dpoints` `[B,3]`, `dmeans` `[N,3]`, `dchol` `[N,3,3]` (exact full lower
///   triangle, upper part written as 0), `dweights` `[N]`: each optional (NULL = not
///   wanted; all NULL is a no-op); overwritten.
/// - `workspace`: as `fk_mahalanobis_backward` (size from
///   `fk_gaussian_backward_workspace_size`; not O(B*N): about 270 MB in f32 for
///   B = 1M, N = 65536); ignored on the CPU. Sums are deterministic.
///
/// Statuses: those of `fk_mahalanobis_backward` (dout in place of g).
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_gaussian_field_backward(
    points: *const fk_buffer,
    means: *const fk_buffer,
    chol: *const fk_buffer,
    weights: *const fk_buffer,
    eps: f64,
    dout: *const fk_buffer,
    dpoints: *mut fk_buffer,
    dmeans: *mut fk_buffer,
    dchol: *mut fk_buffer,
    dweights: *mut fk_buffer,
    workspace: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_gaussian_field_backward", || unsafe {
        let (p, m, c, w, d) = buffers!(points, means, chol, weights, dout);
        let (dp, dm, dc, dw) = buffers!([dpoints], [dmeans], [dchol], [dweights]);
        let ws = buffers!([workspace]);
        let s = stream_or_default(stream, &p.ctx)?;
        gs::field_backward(p, m, c, w, eps, d, dp, dm, dc, dw, ws, &s)
    })
}

/// Bytes of workspace `fk_mahalanobis_backward` and `fk_gaussian_field_backward`
/// need on `ctx` for `num_points` (B) points and `num_gaussians` (N) Gaussians of `dtype`, written to `*bytes`:
/// 0 on a CPU context and when B or N is 0; on CUDA about
/// `(3 sg B + 10 sp N) * sizeof(dtype)` with `sg * sp` about 512 (never O(B*N)).
/// It depends only on the arguments, so one workspace serves every call of that
/// size or smaller.
///
/// Statuses: `FK_ERROR_NULL_POINTER` (ctx or bytes NULL), `FK_ERROR_INVALID_ARGUMENT`
/// (unknown dtype value, negative B or N), `FK_ERROR_UNSUPPORTED_DTYPE` (not f32/f64).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_gaussian_backward_workspace_size(
    ctx: *const fk_context,
    dtype: fk_dtype,
    num_points: i64,
    num_gaussians: i64,
    bytes: *mut usize,
) -> fk_status {
    guard("fk_gaussian_backward_workspace_size", || unsafe {
        let c = context_ref(ctx, "ctx")?;
        let d = DType::from_abi(dtype, "dtype")?;
        let need = gs::backward_workspace_bytes(c, d, num_points, num_gaussians)?;
        write_out(bytes, "bytes", need)
    })
}
