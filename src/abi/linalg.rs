//! Linear-algebra entry points (docs/ops.md section 2): GEMM, the fused linear layer
//! (forward, backward, aux size), the chunked GEMM, the batched Kronecker product.
//!
//! Shared rules, stated once here and referenced by each function's doc:
//! - Matrices are row-major. A matrix operand is `[rows, cols]` or
//!   `[batch, rows, cols]` with unit column stride and a row stride (leading
//!   dimension) of at least `cols`: contiguous buffers, or views such as
//!   `strides = [lda, 1]` / `[batch_stride, lda, 1]`. Other layouts (transposed or
//!   column-strided views) return `FK_ERROR_UNSUPPORTED`; pass the transpose through
//!   `op_*` instead, or make the view contiguous with `fk_copy`.
//! - Enum arguments are validated: `op_*` in `FK_OP_N`, `FK_OP_T`, `FK_OP_C`;
//!   `act` in `FK_ACT_NONE`, `FK_ACT_RELU`, `FK_ACT_GELU_TANH`, `FK_ACT_GELU_ERF`;
//!   unknown values and unknown flag bits are `FK_ERROR_INVALID_ARGUMENT`.
//! - Outputs must not overlap inputs (`FK_ERROR_ALIASING`), must not be read-only
//!   DLPack imports nor self-overlapping (`FK_ERROR_INVALID_ARGUMENT`).
//! - Real dtypes accumulate in f32 (f16, bf16, f32) or f64; f32 uses TF32 tensor
//!   cores only with `FK_GEMM_ALLOW_TF32`. `beta = 0` means C is not read (NaN in
//!   it is ignored), as in BLAS.
//! - On CUDA the products run through cuBLAS / cuBLASLt (loaded at run time:
//!   `libcublas.so.13`, `libcublasLt.so.13` from the CUDA toolkit or the
//!   `nvidia-cublas` wheel, or `FK_CUBLAS_PATH`/`FK_CUBLASLT_PATH`); the small
//!   epilogue and Kronecker kernels are NVRTC-compiled from `kernels/linalg.cu`.
//!   Handles and a 32 MiB workspace are cached per (context, stream) and freed with
//!   the stream (owned streams) or the context; every call is queued on `stream` and
//!   never synchronises (except `fk_gemm_chunked`'s own copy stream, joined back
//!   into `stream` by events).
//! - Statuses common to all: `FK_ERROR_NULL_POINTER` (a required handle NULL),
//!   `FK_ERROR_DTYPE_MISMATCH`, `FK_ERROR_SHAPE_MISMATCH`, `FK_ERROR_DEVICE_MISMATCH`
//!   (buffers or stream on different devices), `FK_ERROR_ALIASING`,
//!   `FK_ERROR_INVALID_ARGUMENT`, `FK_ERROR_UNSUPPORTED` (a layout or a size above
//!   2^31 - 1 that cuBLAS cannot take), and on CUDA `FK_ERROR_LIBRARY_NOT_FOUND`
//!   (cuBLAS, NVRTC or the CUDA headers missing: the message says what to install),
//!   `FK_ERROR_KERNEL_COMPILE`, `FK_ERROR_OUT_OF_MEMORY`, `FK_ERROR_CUDA` (a driver or
//!   cuBLAS call failed: the message names it).

use super::{fk_buffer, fk_scalar, fk_stream, guard, stream_or_default, write_out};
use crate::dtype::{DType, fk_dtype};
use crate::error::{FK_ERROR_INVALID_ARGUMENT, Result, fk_status};
use crate::ops::linalg as la;
use crate::plan::elementwise::Scalar;
use crate::plan::linalg::{Activation, Trans};

/// Operation applied to a GEMM operand (`int32_t`). Values are part of the ABI.
pub type fk_op = i32;
/// `op(X) = X`.
pub const FK_OP_N: fk_op = 0;
/// `op(X) = X^T`.
pub const FK_OP_T: fk_op = 1;
/// `op(X) = X^H`, the conjugate transpose (the same as `FK_OP_T` for real dtypes).
pub const FK_OP_C: fk_op = 2;

/// Activation of the fused linear layer (`int32_t`). Values are part of the ABI.
pub type fk_activation = i32;
/// No activation: `y = x W^T + b`.
pub const FK_ACT_NONE: fk_activation = 0;
/// `y = max(z, 0)` (NaN propagates).
pub const FK_ACT_RELU: fk_activation = 1;
/// GELU, tanh approximation, as cuBLASLt's epilogue computes it:
/// `0.5 z (1 + tanh(0.7978845608 (z + 0.044715 z^3)))` (torch's
/// `gelu(approximate="tanh")`). Value 2 was formerly named `FK_ACT_GELU`; that name
/// was removed (not kept as an alias) because it did not say which GELU it meant.
pub const FK_ACT_GELU_TANH: fk_activation = 2;
/// GELU, exact: `0.5 z (1 + erf(z / sqrt(2)))` (torch's default `gelu`). On CUDA
/// the product runs through cuBLASLt's `BIAS` epilogue and a fusekit kernel
/// applies the activation (cuBLASLt has only the tanh GELU).
pub const FK_ACT_GELU_ERF: fk_activation = 3;

/// `fk_gemm` flag: f32 and complex64 products may use TF32 tensor cores (inputs
/// rounded to a 10-bit mantissa, f32 accumulation; relative error ~1e-3). Ignored
/// for other dtypes and on the CPU.
pub const FK_GEMM_ALLOW_TF32: u32 = 1;

// cbindgen copies literal values only; the crate's constant must agree.
const _: () = assert!(FK_GEMM_ALLOW_TF32 == crate::plan::linalg::GEMM_ALLOW_TF32);

fn trans(v: fk_op, what: &str) -> Result<Trans> {
    Ok(match v {
        FK_OP_N => Trans::N,
        FK_OP_T => Trans::T,
        FK_OP_C => Trans::C,
        _ => crate::bail!(
            FK_ERROR_INVALID_ARGUMENT,
            "{what} = {v} is not a valid fk_op (FK_OP_N=0, FK_OP_T=1, FK_OP_C=2)"
        ),
    })
}

fn activation(v: fk_activation) -> Result<Activation> {
    activation_arg(v, "act")
}

/// The activation argument `what` (`act`, `hidden_act`, ...).
pub(super) fn activation_arg(v: fk_activation, what: &str) -> Result<Activation> {
    Ok(match v {
        FK_ACT_NONE => Activation::None,
        FK_ACT_RELU => Activation::Relu,
        FK_ACT_GELU_TANH => Activation::GeluTanh,
        FK_ACT_GELU_ERF => Activation::GeluErf,
        _ => crate::bail!(
            FK_ERROR_INVALID_ARGUMENT,
            "{what} = {v} is not a valid fk_activation (FK_ACT_NONE=0, FK_ACT_RELU=1, FK_ACT_GELU_TANH=2, FK_ACT_GELU_ERF=3)"
        ),
    })
}

/// General matrix product `C = alpha op(A) op(B) + beta C`, batched.
///
/// - `a`: `op(A)` is `[m, k]`, so `a` is `[m, k]` for `FK_OP_N` and `[k, m]` for
///   `FK_OP_T`/`FK_OP_C`, or `[batch, ., .]`; `b` likewise gives `op(B)` `[k, n]`;
///   `c` is `[m, n]` or `[batch, m, n]`. An input with batch 1 (or 2-D) is used for
///   every matrix of `c`'s batch; otherwise the batches must match.
/// - dtypes: f16, bf16 (f32 accumulation), f32, f64, complex64, complex128; `a`,
///   `b`, `c` share one. `alpha`, `beta`: `im` must be 0 for real dtypes.
///   On CUDA every dtype runs in cuBLAS (complex128 in its ZGEMM).
/// - `flags`: 0 or `FK_GEMM_ALLOW_TF32`.
/// - Layout, aliasing, streams and statuses: see the module rules; `k = 0` gives
///   `C = beta C`.
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_gemm(
    op_a: fk_op,
    op_b: fk_op,
    alpha: fk_scalar,
    a: *const fk_buffer,
    b: *const fk_buffer,
    beta: fk_scalar,
    c: *mut fk_buffer,
    flags: u32,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_gemm", || unsafe {
        gemm(op_a, op_b, alpha, a, b, beta, c, None, flags, stream)
    })
}

/// `fk_gemm` (`budget` None) and `fk_gemm_chunked` (staging within `budget` bytes):
/// the arguments resolved, then the product.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm(
    op_a: fk_op,
    op_b: fk_op,
    alpha: fk_scalar,
    a: *const fk_buffer,
    b: *const fk_buffer,
    beta: fk_scalar,
    c: *mut fk_buffer,
    budget: Option<u64>,
    flags: u32,
    stream: *const fk_stream,
) -> Result<()> {
    let (ta, tb) = (trans(op_a, "op_a")?, trans(op_b, "op_b")?);
    let (a, b, c) = unsafe { buffers!(a, b, c) };
    let s = unsafe { stream_or_default(stream, &c.ctx) }?;
    let (alpha, beta) = (Scalar::from(alpha), Scalar::from(beta));
    match budget {
        None => la::gemm(ta, tb, alpha, a, b, beta, c, flags, &s),
        Some(bytes) => la::gemm_chunked(ta, tb, alpha, a, b, beta, c, bytes, flags, &s),
    }
}

/// `fk_gemm` computed in tiles so that the device memory it allocates for staging
/// stays within `device_budget_bytes`: `a`, `b` and `c` may live in pinned host
/// memory (`fk_buffer_wrap` of memory from `cudaHostAlloc`/`cuMemHostAlloc`, or
/// registered with `cudaHostRegister`), and are streamed to the GPU tile by tile
/// (`c` is read only when `beta != 0`), copies on a second stream overlapping the
/// products on `stream` (ordered by events; `stream` sees the finished `c`). The
/// product may be larger than the GPU's memory.
///
/// - Shapes, dtypes, `alpha`, `beta`, `flags`: as `fk_gemm`.
/// - `device_budget_bytes`: the staging tiles' bytes (double-buffered panels of the
///   host-resident operands); operands already in device memory are used in place
///   and cost nothing. The cuBLAS workspace (32 MiB per stream, shared by every
///   linear-algebra call) is not counted. On the CPU the budget is ignored.
/// - Statuses: as `fk_gemm`, and `FK_ERROR_OUT_OF_MEMORY` when the budget cannot
///   hold even the smallest tiles (the message gives the minimum).
/// - CUDA graphs: capturable only when every operand is device memory (then it is
///   `fk_gemm`); with a host operand `FK_ERROR_UNSUPPORTED` on a capturing stream,
///   before anything is queued (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_gemm_chunked(
    op_a: fk_op,
    op_b: fk_op,
    alpha: fk_scalar,
    a: *const fk_buffer,
    b: *const fk_buffer,
    beta: fk_scalar,
    c: *mut fk_buffer,
    device_budget_bytes: u64,
    flags: u32,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_gemm_chunked", || unsafe {
        let budget = Some(device_budget_bytes);
        gemm(op_a, op_b, alpha, a, b, beta, c, budget, flags, stream)
    })
}

/// Bytes of the `aux` buffer `fk_linear_forward` fills for the backward, for an
/// output of `m` rows (the leading dimensions of `x` multiplied) and `n` features:
/// `m * n * sizeof(dtype)` for `FK_ACT_GELU_TANH` and `FK_ACT_GELU_ERF` (aux holds
/// the pre-activation `z = x W^T + b`, shaped and typed like `y`), 0 for
/// `FK_ACT_RELU` (the backward reads the output `y` itself: `relu'(z) = [y > 0]`)
/// and for `FK_ACT_NONE`.
///
/// Statuses: `FK_ERROR_NULL_POINTER` (`bytes` NULL), `FK_ERROR_INVALID_ARGUMENT`
/// (unknown `act` or `dtype`, negative sizes), `FK_ERROR_UNSUPPORTED_DTYPE` (not
/// f16, bf16 or f32).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_linear_aux_size(
    act: fk_activation,
    dtype: fk_dtype,
    m: i64,
    n: i64,
    bytes: *mut usize,
) -> fk_status {
    guard("fk_linear_aux_size", || unsafe {
        let act = activation(act)?;
        let d = DType::from_abi(dtype, "dtype")?;
        let v = la::aux_size(act, d, m, n)?;
        write_out(bytes, "bytes", v)
    })
}

/// Fused linear layer `y = act(x W^T + b)` in one cuBLASLt call (epilogues
/// `BIAS`, `RELU_BIAS`, `GELU_BIAS`, `GELU_AUX_BIAS`; a GEMM plus an epilogue
/// kernel where cuBLASLt declines the layout). `FK_ACT_GELU_ERF`, which cuBLASLt
/// lacks, is the `BIAS` epilogue (writing `z` to `aux` when given) followed by
/// fusekit's activation kernel.
///
/// - `x`: `[..., k]` (leading dimensions flattened into `m` rows); `w`: `[n, k]`;
///   `b`: `[n]`, optional (NULL = no bias); `y`: `[..., n]` (x's leading shape).
/// - `act`: `FK_ACT_NONE`, `FK_ACT_RELU`, `FK_ACT_GELU_TANH` (tanh approximation),
///   `FK_ACT_GELU_ERF` (exact).
/// - `aux`: optional, GELUs only (must be NULL otherwise): receives the
///   pre-activation `z`, shaped and typed like `y` (`fk_linear_aux_size` bytes), for
///   `fk_linear_backward`. Leave it NULL for inference.
/// - dtypes: f16, bf16, f32 (f32 accumulation, bias added and activation applied in
///   f32 before rounding); every buffer shares one; all must be contiguous.
/// - Statuses: see the module rules; `FK_ERROR_UNSUPPORTED_DTYPE` for f64/complex
///   (use `fk_gemm`).
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_linear_forward(
    x: *const fk_buffer,
    w: *const fk_buffer,
    b: *const fk_buffer,
    act: fk_activation,
    y: *mut fk_buffer,
    aux: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_linear_forward", || unsafe {
        let act = activation(act)?;
        let (x, w, y, b, aux) = buffers!(x, w, y, [b], [aux]);
        let s = stream_or_default(stream, &y.ctx)?;
        la::linear_forward(x, w, b, act, y, aux, &s)
    })
}

/// Backward of `fk_linear_forward`, given `dy = dL/dy`:
/// `dz = dy * act'(z)`, `dx = dz W`, `dw = dz^T x`, `db = sum over rows of dz`.
///
/// - `dy`: `[..., n]`; `x`: `[..., k]`; `w`: `[n, k]`, as in the forward.
/// - `saved`: what the forward left for the backward: for `FK_ACT_RELU` the
///   forward's output `y`; for the GELUs the pre-activation the forward wrote
///   to `aux`; ignored for `FK_ACT_NONE` (may be NULL). Shaped and typed like `dy`.
/// - `dx` (`x`'s shape), `dw` (`w`'s shape), `db` (`[n]`): each optional (NULL = not
///   wanted), overwritten (not accumulated); all NULL is a no-op.
/// - dtypes: f16, bf16, f32 (one for all; f32 accumulation, `db` summed in f32).
///   Every buffer must be contiguous.
/// - On CUDA `dz` lives in a per-stream scratch buffer of the context (grown as
///   needed, `m * n` elements); `dx` and `dw` are cuBLAS products.
/// - Statuses: see the module rules; `FK_ERROR_NULL_POINTER` also when `saved` is
///   NULL for relu or a GELU.
/// - CUDA graphs: capturable from the first call on any stream; under capture `dz`
///   is a stream-ordered allocation of the call (graph alloc/free nodes), not the
///   cached scratch (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_linear_backward(
    dy: *const fk_buffer,
    x: *const fk_buffer,
    w: *const fk_buffer,
    act: fk_activation,
    saved: *const fk_buffer,
    dx: *mut fk_buffer,
    dw: *mut fk_buffer,
    db: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_linear_backward", || unsafe {
        let act = activation(act)?;
        let (dy, x, w, saved) = buffers!(dy, x, w, [saved]);
        let (dx, dw, db) = buffers!([dx], [dw], [db]);
        let s = stream_or_default(stream, &dy.ctx)?;
        la::linear_backward(dy, x, w, act, saved, dx, dw, db, &s)
    })
}

/// Batched Kronecker product: `out[i] = kron(a[i], b[i])`, i.e.
/// `out[i, r*p + s, c*q + t] = a[i, r, c] * b[i, s, t]`.
///
/// - `a`: `[m, n]` or `[batch, m, n]`; `b`: `[p, q]` or `[batch, p, q]` (a batch of
///   1, or a 2-D operand, is used for every matrix); `out`: `[m*p, n*q]` when both
///   are 2-D, else `[batch, m*p, n*q]`.
/// - dtypes: f16, bf16, f32, f64, complex64, complex128 (one for all; half types
///   multiply in f32 and round once).
/// - Inputs may have any strides (zero and negative included); `out` must be
///   contiguous.
/// - Statuses: see the module rules.
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_kron(
    a: *const fk_buffer,
    b: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_kron", || unsafe {
        let (a, b, o) = buffers!(a, b, out);
        let s = stream_or_default(stream, &o.ctx)?;
        la::kron(a, b, o, &s)
    })
}
