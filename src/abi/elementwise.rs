//! Elementwise entry points (docs/ops.md section 1).
//!
//! Shared rules, stated once here and referenced by each function's doc:
//! - dtypes: f16, bf16, f32, f64, complex64, complex128; `a`, `b` and `out` share
//!   one dtype (except `fk_abs` of complex input, whose `out` is the real type).
//! - shapes: `a` and `b` broadcast as in NumPy, and `out` has exactly the broadcast
//!   shape (unary ops: `a` broadcasts to `out`'s shape). Inputs may have any
//!   strides; `out` must not self-overlap and may alias an input only exactly
//!   (same data pointer, shape and strides: in place).
//! - `stream`: the op is queued there (NULL = the default stream of `out`'s
//!   context); it neither synchronises nor allocates.
//! - CUDA graphs: every elementwise op is capturable from its first call on any
//!   stream (docs/abi.md, "CUDA graphs").
//! - statuses: `FK_ERROR_NULL_POINTER` (a, b or out NULL), `FK_ERROR_DTYPE_MISMATCH`,
//!   `FK_ERROR_SHAPE_MISMATCH`, `FK_ERROR_DEVICE_MISMATCH` (buffers or stream on
//!   different devices), `FK_ERROR_ALIASING` (partial overlap of out and an input),
//!   `FK_ERROR_INVALID_ARGUMENT` (self-overlapping or read-only out, non-zero
//!   imaginary part of a scalar for a real dtype), `FK_ERROR_UNSUPPORTED_DTYPE`,
//!   and on CUDA `FK_ERROR_LIBRARY_NOT_FOUND`, `FK_ERROR_KERNEL_COMPILE`,
//!   `FK_ERROR_CUDA`.

use super::{fk_buffer, fk_scalar, fk_stream, guard, stream_or_default};
use crate::error::{Result, fk_status};
use crate::ops::elementwise as ew;
use crate::plan::elementwise::{BinaryOp, Scalar, UnaryOp};

const ZERO: fk_scalar = fk_scalar { re: 0.0, im: 0.0 };
const ONE: fk_scalar = fk_scalar { re: 1.0, im: 0.0 };

unsafe fn binary(
    op: BinaryOp,
    a: *const fk_buffer,
    b: *const fk_buffer,
    out: *const fk_buffer,
    alpha: fk_scalar,
    beta: fk_scalar,
    stream: *const fk_stream,
) -> Result<()> {
    let (a, b, o) = unsafe { buffers!(a, b, out) };
    let s = unsafe { stream_or_default(stream, &o.ctx) }?;
    ew::binary(op, a, b, o, Scalar::from(alpha), Scalar::from(beta), &s)
}

unsafe fn unary(
    op: UnaryOp,
    a: *const fk_buffer,
    out: *const fk_buffer,
    alpha: fk_scalar,
    stream: *const fk_stream,
) -> Result<()> {
    let (a, o) = unsafe { buffers!(a, out) };
    let s = unsafe { stream_or_default(stream, &o.ctx) }?;
    ew::unary(op, a, o, Scalar::from(alpha), &s)
}

/// `out = a + b`. See the module rules for dtypes, broadcasting, aliasing, streams and statuses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_add(
    a: *const fk_buffer,
    b: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_add", || unsafe {
        binary(BinaryOp::Add, a, b, out, ONE, ONE, stream)
    })
}

/// `out = a - b`. See the module rules for dtypes, broadcasting, aliasing, streams and statuses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_sub(
    a: *const fk_buffer,
    b: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_sub", || unsafe {
        binary(BinaryOp::Sub, a, b, out, ONE, ONE, stream)
    })
}

/// `out = a * b` (complex product for complex dtypes). See the module rules for dtypes, broadcasting, aliasing, streams and statuses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_mul(
    a: *const fk_buffer,
    b: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_mul", || unsafe {
        binary(BinaryOp::Mul, a, b, out, ONE, ONE, stream)
    })
}

/// `out = a / b`, IEEE semantics (division by zero gives inf or NaN; complex division is scaled by |re|+|im| of `b`, as cuComplex). See the module rules for dtypes, broadcasting, aliasing, streams and statuses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_div(
    a: *const fk_buffer,
    b: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_div", || unsafe {
        binary(BinaryOp::Div, a, b, out, ONE, ONE, stream)
    })
}

/// Fused `out = alpha*a + beta*b` in one pass (complex scalars for complex dtypes;
/// half types compute in f32). See the module rules for everything else.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_axpby(
    alpha: fk_scalar,
    a: *const fk_buffer,
    beta: fk_scalar,
    b: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_axpby", || unsafe {
        binary(BinaryOp::Axpby, a, b, out, alpha, beta, stream)
    })
}

/// `out = a + s`. See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_scalar_add(
    a: *const fk_buffer,
    s: fk_scalar,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_scalar_add", || unsafe {
        unary(UnaryOp::ScalarAdd, a, out, s, stream)
    })
}

/// `out = a * s`. See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_scalar_mul(
    a: *const fk_buffer,
    s: fk_scalar,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_scalar_mul", || unsafe {
        unary(UnaryOp::ScalarMul, a, out, s, stream)
    })
}

/// `out = -a`. See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_neg(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_neg", || unsafe {
        unary(UnaryOp::Neg, a, out, ZERO, stream)
    })
}

/// `out = |a|`; for complex input `out` has the real dtype (f32 for complex64, f64 for complex128) and holds the magnitude. See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_abs(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_abs", || unsafe {
        unary(UnaryOp::Abs, a, out, ZERO, stream)
    })
}

/// `out = exp(a)` (complex supported). See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_exp(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_exp", || unsafe {
        unary(UnaryOp::Exp, a, out, ZERO, stream)
    })
}

/// `out = log(a)`, natural logarithm (complex: principal branch). See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_log(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_log", || unsafe {
        unary(UnaryOp::Log, a, out, ZERO, stream)
    })
}

/// `out = sqrt(a)` (complex: principal root). See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_sqrt(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_sqrt", || unsafe {
        unary(UnaryOp::Sqrt, a, out, ZERO, stream)
    })
}

/// `out = sin(a)` (complex supported). See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_sin(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_sin", || unsafe {
        unary(UnaryOp::Sin, a, out, ZERO, stream)
    })
}

/// `out = cos(a)` (complex supported). See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_cos(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_cos", || unsafe {
        unary(UnaryOp::Cos, a, out, ZERO, stream)
    })
}

/// `out = tanh(a)` (complex supported). See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_tanh(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_tanh", || unsafe {
        unary(UnaryOp::Tanh, a, out, ZERO, stream)
    })
}

/// `out = 1 / (1 + exp(-a))` (complex supported). See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_sigmoid(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_sigmoid", || unsafe {
        unary(UnaryOp::Sigmoid, a, out, ZERO, stream)
    })
}

/// `out = max(a, 0)`, NaN propagating; complex input returns `FK_ERROR_UNSUPPORTED_DTYPE`. See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_relu(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_relu", || unsafe {
        unary(UnaryOp::Relu, a, out, ZERO, stream)
    })
}

/// `out = a`: a strided copy that also broadcasts `a` to `out`'s shape (e.g. to make a non-contiguous view contiguous). See the module rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_copy(
    a: *const fk_buffer,
    out: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_copy", || unsafe {
        unary(UnaryOp::Copy, a, out, ZERO, stream)
    })
}
