//! Optimizer-math entry points (docs/ops.md section 4): the matrix power of symmetric
//! PSD matrices (Shampoo's inverse roots), Shampoo statistics and preconditioning,
//! per-sample gradients of a linear layer (materialised, norms, DP-SGD clipped
//! sum). The memory report of the same section is `fk_context_memory_stats`
//! (free and total device memory, fusekit's allocated and reserved bytes, which
//! include these ops' stream-ordered scratch while it is live).
//!
//! Shared rules, stated once here and referenced by each function's doc:
//! - dtypes: f32 or f64, one per call (`FK_ERROR_UNSUPPORTED_DTYPE`,
//!   `FK_ERROR_DTYPE_MISMATCH`). Buffers must be contiguous (`FK_ERROR_UNSUPPORTED`
//!   otherwise; `fk_copy` makes a view contiguous).
//! - Outputs must not overlap inputs (`FK_ERROR_ALIASING`) and must not be
//!   read-only DLPack imports (`FK_ERROR_INVALID_ARGUMENT`).
//! - `flags`: 0 or `FK_GEMM_ALLOW_TF32` (f32 products on TF32 tensor cores,
//!   relative error ~1e-3; ignored for f64 and on the CPU); unknown bits are
//!   `FK_ERROR_INVALID_ARGUMENT`.
//! - Work is queued on `stream` (NULL: the context's default stream). CUDA scratch
//!   is allocated stream-ordered from the context's pool on that stream and freed
//!   there. Calls that must read results on the host say so (they wait for the
//!   stream).
//! - Statuses common to all: `FK_ERROR_NULL_POINTER` (a required handle NULL),
//!   `FK_ERROR_SHAPE_MISMATCH`, `FK_ERROR_DEVICE_MISMATCH`, `FK_ERROR_INVALID_ARGUMENT`
//!   (a bad scalar or enum, a dead handle), and on CUDA `FK_ERROR_LIBRARY_NOT_FOUND`
//!   (cuBLAS, cuSOLVER, NVRTC or the CUDA headers missing; the message says what to
//!   install), `FK_ERROR_KERNEL_COMPILE`, `FK_ERROR_OUT_OF_MEMORY`, `FK_ERROR_CUDA`,
//!   `FK_ERROR_UNSUPPORTED` (a size above 2^31 - 1).

use super::{fk_buffer, fk_stream, guard, stream_or_default};
use crate::error::fk_status;
use crate::ops::optim as op;
use crate::plan::optim::{Method, Report};

/// Method of `fk_matrix_power` (`int32_t`). Values are part of the ABI.
pub type fk_matpow_method = i32;
/// Newton for inverse roots (`power = -1/p`) of matrices larger than 32 on CUDA
/// (falling back to the eigendecomposition when Newton does not converge); the
/// eigendecomposition otherwise.
pub const FK_MATPOW_AUTO: fk_matpow_method = 0;
/// Eigendecomposition: cuSOLVER `syevjBatched` (n <= 32), `XsyevBatched` (batched)
/// or `syevd`; nalgebra's symmetric QR on the CPU. Any real power.
pub const FK_MATPOW_EIGH: fk_matpow_method = 1;
/// The coupled Newton iteration on GEMMs (tensor cores with `FK_GEMM_ALLOW_TF32` or
/// f64); inverse roots only (`power = -1/p`, integer `1 <= p <= 64`).
pub const FK_MATPOW_NEWTON: fk_matpow_method = 2;

/// What `fk_matrix_power` did (filled when the caller passes a non-NULL pointer).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fk_matpow_report {
    /// The method that produced `out`: `FK_MATPOW_EIGH` or `FK_MATPOW_NEWTON`.
    pub method: fk_matpow_method,
    /// Newton iterations run (0 for the eigendecomposition).
    pub iterations: i32,
    /// 1 when every matrix converged (Newton: residual <= tol, or tol <= 0; eigh:
    /// the solver reported success), else 0.
    pub converged: i32,
    /// Always 0 (padding; keeps the doubles aligned in every language).
    pub reserved: i32,
    /// Newton: the largest `max_ij |M - I|_ij` over the batch after the last checked
    /// iteration (`M = X^p (A + eps I)`, so 0 means `out` is the exact root); NaN when
    /// not checked (tol <= 0) and for the eigendecomposition.
    pub residual: f64,
    /// Eigendecomposition: the smallest eigenvalue of `A + eps I` over the batch
    /// (below `eps` means the spectrum was shifted); NaN for Newton.
    pub min_eigenvalue: f64,
}

/// Matrix power of symmetric positive semi-definite matrices, batched:
/// `out = (A + eps I)^power` (Shampoo's inverse p-th root is `power = -1/p`).
///
/// Eigendecomposition (docs/ops.md section 4.1): `A + eps I = Q diag(lambda) Q^T`; when the smallest
/// eigenvalue is below `eps` the spectrum is shifted up by `eps - lambda_min`;
/// `out = Q diag(lambda^power) Q^T`. Only the upper triangle of `A` is read.
///
/// Newton: `X0 = z^(1/p) I`, `M0 = z (A + eps I)`, `z = (1+p) / (2 |A + eps I|_F)`;
/// each iteration `T = ((p+1) I - M) / p`, `X = X T`, `M = T^p M`, so that
/// `M = X^p (A + eps I)` and `X -> (A + eps I)^(-1/p)` as `M -> I`. All of `A` is
/// read (it must be symmetric). There is no spectrum shift: `A + eps I` must be
/// positive definite, else the iteration does not converge.
///
/// - `a` `[n, n]` or `[batch, n, n]`, f32 or f64; `out` the same shape and dtype.
/// - `power`: finite. `eps`: finite, >= 0.
/// - `method`: `FK_MATPOW_AUTO`, `FK_MATPOW_EIGH` or `FK_MATPOW_NEWTON`.
/// - `max_iter` (Newton, >= 1; e.g. 100) and `tol` (Newton: stop when every matrix
///   has `max |M - I| <= tol`, e.g. 1e-5 for f32, 1e-12 for f64, 3e-2 with TF32;
///   also stops when the residual stops shrinking at the precision floor).
///   With `tol > 0` the iteration checks the residual every step, which waits for the
///   stream; `tol <= 0` runs exactly `max_iter` iterations, fully asynchronous. Both
///   are ignored by `FK_MATPOW_EIGH`.
/// - `flags`: 0 or `FK_GEMM_ALLOW_TF32`: Newton's f32 GEMMs on TF32 tensor cores
///   (2-6x faster; `out` then has ~1e-3 relative error, and the reported residual
///   is measured strictly on `X^p (A + eps I)` at the end, ~2e-2: use a tol such as
///   3e-2).
/// - `report`: optional (NULL = not wanted), filled on `FK_OK` and on
///   `FK_ERROR_NOT_CONVERGED`.
/// - `stream`: see the module rules. The eigendecomposition waits for the stream
///   (cuSOLVER's convergence flags are read on the host).
///
/// Statuses: the common ones; `FK_ERROR_SHAPE_MISMATCH` (not square, out's shape),
/// `FK_ERROR_INVALID_ARGUMENT` (power/eps/tol not valid, unknown method or flags,
/// max_iter < 1 for Newton, a power that is not an inverse root with
/// `FK_MATPOW_NEWTON`), `FK_ERROR_ALIASING` (out overlaps a), and
/// `FK_ERROR_NOT_CONVERGED` (Newton: tol not reached; eigh: the solver failed):
/// `out` then holds the last iterate and `report` says how far it got.
/// `FK_MATPOW_AUTO` never returns an unconverged Newton result: it recomputes
/// with the eigendecomposition.
/// - CUDA graphs: capturable with `FK_MATPOW_NEWTON` (or AUTO choosing Newton) and
///   `tol <= 0` (exactly `max_iter` iterations; `report` is filled on the host as
///   outside capture: iterations = max_iter, converged = 1, residual NaN). EIGH, and
///   Newton with `tol > 0`, return `FK_ERROR_UNSUPPORTED` on a capturing stream
///   before anything is queued (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn fk_matrix_power(
    a: *const fk_buffer,
    power: f64,
    eps: f64,
    method: fk_matpow_method,
    max_iter: i32,
    tol: f64,
    flags: u32,
    out: *mut fk_buffer,
    report: *mut fk_matpow_report,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_matrix_power", || unsafe {
        let m = Method::from_abi(method)?;
        let (a, o) = buffers!(a, out);
        let s = stream_or_default(stream, &o.ctx)?;
        let fill = |r: &Report| {
            if !report.is_null() {
                report.write(fk_matpow_report {
                    method: r.method as i32,
                    iterations: r.iterations,
                    converged: r.converged as i32,
                    reserved: 0,
                    residual: r.residual,
                    min_eigenvalue: r.min_eigenvalue,
                });
            }
        };
        let r = op::matrix_power(a, power, eps, m, max_iter, tol, flags, o, &s, &fill);
        r.map(|_| ())
    })
}

/// Shampoo statistics: `L = beta L + alpha G G^T` and `R = beta R + alpha G^T G`
/// (symmetric rank-k updates; `alpha = beta = 1` accumulates, `beta = decay`,
/// `alpha = 1 - decay` is the exponential moving average).
///
/// - `grad` `[m, n]` or `[batch, m, n]` (f32 or f64).
/// - `l` `[m, m]` / `[batch, m, m]` and `r` `[n, n]` / `[batch, n, n]`: updated in
///   place, each optional (NULL = not wanted) but not both. Only their upper
///   triangle is read (with `beta = 0` nothing is read; NaN there is ignored); both
///   triangles are written, exactly symmetric.
/// - `alpha`, `beta`: finite.
/// - CUDA: cuBLAS SYRK per matrix (a strided batched GEMM when batch > 1), then the
///   lower triangle is mirrored from the upper.
/// - The same as `fk_shampoo_stats_ex` with `flags = 0`.
///
/// Statuses: the common ones; `FK_ERROR_NULL_POINTER` (grad NULL, or l and r both
/// NULL), `FK_ERROR_ALIASING` (l or r overlaps grad, or each other).
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_shampoo_stats(
    grad: *const fk_buffer,
    alpha: f64,
    beta: f64,
    l: *mut fk_buffer,
    r: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_shampoo_stats", || unsafe {
        stats(grad, alpha, beta, l, r, 0, stream)
    })
}

/// Shampoo statistics with flags (ABI 1.2): `fk_shampoo_stats` plus
///
/// - `flags`: 0 or `FK_GEMM_ALLOW_TF32`. With TF32 (f32 on CUDA) the products run on
///   tensor cores as a GEMM (SYRK has no TF32 mode): each element of `grad` is
///   rounded to TF32 once and the products are summed in f32, so the update is the
///   statistic of the rounded gradient (symmetric positive semidefinite up to f32
///   summation), about 1e-3 relative error per element against the f32 one.
///
/// Statuses: those of `fk_shampoo_stats`; `FK_ERROR_INVALID_ARGUMENT` for unknown
/// flag bits.
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_shampoo_stats_ex(
    grad: *const fk_buffer,
    alpha: f64,
    beta: f64,
    l: *mut fk_buffer,
    r: *mut fk_buffer,
    flags: u32,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_shampoo_stats_ex", || unsafe {
        stats(grad, alpha, beta, l, r, flags, stream)
    })
}

/// The body of `fk_shampoo_stats` and `fk_shampoo_stats_ex`.
unsafe fn stats(
    grad: *const fk_buffer,
    alpha: f64,
    beta: f64,
    l: *mut fk_buffer,
    r: *mut fk_buffer,
    flags: u32,
    stream: *const fk_stream,
) -> crate::error::Result<()> {
    // SAFETY: the caller's handles, checked by the helpers.
    unsafe {
        let (g, lb, rb) = buffers!(grad, [l], [r]);
        let s = stream_or_default(stream, &g.ctx)?;
        op::shampoo_stats(g, alpha, beta, lb, rb, flags, &s)
    }
}

/// Shampoo preconditioning: `out = L_root grad R_root`.
///
/// - `grad` `[m, n]` or `[batch, m, n]`; `out` the same shape.
/// - `l_root` `[m, m]` and `r_root` `[n, n]` (or with grad's batch, or batch 1 for
///   all): each optional (NULL = the identity), e.g. from `fk_matrix_power`.
/// - `flags`: 0 or `FK_GEMM_ALLOW_TF32`.
/// - With both roots, `tmp = grad R_root` goes to stream-ordered scratch
///   (`batch*m*n` elements), then `out = L_root tmp`.
///
/// Statuses: the common ones; `FK_ERROR_NULL_POINTER` (grad or out NULL),
/// `FK_ERROR_ALIASING` (out overlaps grad or a root).
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_shampoo_precondition(
    l_root: *const fk_buffer,
    grad: *const fk_buffer,
    r_root: *const fk_buffer,
    out: *mut fk_buffer,
    flags: u32,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_shampoo_precondition", || unsafe {
        let (l, g, r, o) = buffers!([l_root], grad, [r_root], out);
        let s = stream_or_default(stream, &o.ctx)?;
        op::shampoo_precondition(l, g, r, o, flags, &s)
    })
}

/// Per-sample gradients of a linear layer `y = a W^T`, materialised:
/// `out[b] = g_b^T a_b` `[B, out, in]`.
///
/// - `a` `[B, in]` or `[B, T, in]` (activations), `g` `[B, out]` or `[B, T, out]`
///   (gradients of the layer's output), same leading dimensions; `out`
///   `[B, out, in]`.
/// - `flags`: 0 or `FK_GEMM_ALLOW_TF32` (sequences only; one step is an exact
///   outer product).
/// - CUDA: one step is a write-bound outer-product kernel (16-byte streaming stores
///   when `in` and the pointers allow); sequences are one batched GEMM with `k = T`.
///
/// Statuses: the common ones; `FK_ERROR_NULL_POINTER` (a, g or out NULL),
/// `FK_ERROR_ALIASING` (out overlaps a or g).
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_per_sample_grads(
    a: *const fk_buffer,
    g: *const fk_buffer,
    out: *mut fk_buffer,
    flags: u32,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_per_sample_grads", || unsafe {
        let (a, g, o) = buffers!(a, g, out);
        let s = stream_or_default(stream, &o.ctx)?;
        op::per_sample_grads(a, g, o, flags, &s)
    })
}

/// Squared Frobenius norms of the per-sample gradients without materialising them:
/// `sq_norms[b] = |g_b^T a_b|_F^2`, as `|g_b|^2 |a_b|^2` for 2-D inputs and the Gram
/// form `<a_b a_b^T, g_b g_b^T>` for sequences (accumulated in f64).
///
/// - `a`, `g`: as `fk_per_sample_grads`; `sq_norms` `[B]`.
/// - CUDA: one kernel for 2-D inputs; sequences add two batched GEMMs into
///   stream-ordered scratch of `2*B*T*T` elements (cheaper than materialising when
///   `T*T < out*in`).
///
/// Statuses: the common ones; `FK_ERROR_NULL_POINTER`, `FK_ERROR_ALIASING`
/// (sq_norms overlaps a or g).
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_per_sample_grad_norms(
    a: *const fk_buffer,
    g: *const fk_buffer,
    sq_norms: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_per_sample_grad_norms", || unsafe {
        let (a, g, n) = buffers!(a, g, sq_norms);
        let s = stream_or_default(stream, &n.ctx)?;
        op::per_sample_grad_norms(a, g, n, &s)
    })
}

/// The DP-SGD clipped sum in one pass:
/// `out = sum_b min(1, max_norm / |G_b|_F) G_b` with `G_b = g_b^T a_b`, never
/// materialising the `G_b` (a zero gradient keeps factor 1).
///
/// - `a`, `g`: as `fk_per_sample_grads`; `out` `[out, in]` (overwritten).
/// - `max_norm`: finite, >= 0 (the clipping bound C).
/// - `sq_norms` `[B]`: optional (NULL = not wanted), receives `|G_b|_F^2`.
/// - `flags`: 0 or `FK_GEMM_ALLOW_TF32` (the final GEMM).
/// - CUDA: one kernel computes the norms and scales `g` (2-D inputs; sequences use
///   the Gram norms of `fk_per_sample_grad_norms` and a scaling kernel) into
///   stream-ordered scratch of `B*T*out` elements, then one GEMM `out = gs^T a` over
///   the `B*T` rows.
///
/// Statuses: the common ones; `FK_ERROR_NULL_POINTER` (a, g or out NULL),
/// `FK_ERROR_ALIASING` (out or sq_norms overlaps an input or each other).
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn fk_dp_clipped_grad_sum(
    a: *const fk_buffer,
    g: *const fk_buffer,
    max_norm: f64,
    out: *mut fk_buffer,
    sq_norms: *mut fk_buffer,
    flags: u32,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_dp_clipped_grad_sum", || unsafe {
        let (a, g, o, n) = buffers!(a, g, out, [sq_norms]);
        let s = stream_or_default(stream, &o.ctx)?;
        op::dp_clipped_grad_sum(a, g, max_norm, o, n, flags, &s)
    })
}
