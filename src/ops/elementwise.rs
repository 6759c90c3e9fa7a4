//! The elementwise family (docs/ops.md section 1): validation, then dispatch.
//!
//! Binary `add, sub, mul, div, axpby` with NumPy broadcasting; unary `neg, abs,
//! exp, log, sqrt, sin, cos, tanh, sigmoid, relu, scalar_add, scalar_mul, copy`
//! (the input broadcasts to the output's shape). Any strides on the inputs; the
//! output must not self-overlap and may alias an input only exactly (in place).

use crate::addr::Addr;
use crate::buffer::Buffer;
use crate::context::Device;
use crate::dtype::DType;
use crate::error::{FK_ERROR_DTYPE_MISMATCH, FK_ERROR_SHAPE_MISMATCH, Result};
use crate::layout::{self};
use crate::ops::check;
use crate::plan::elementwise::{BinaryOp, Plan, Scalar, UnaryOp};
use crate::stream::Stream;

fn plan(
    out: &Buffer,
    a: &Buffer,
    b: Option<&Buffer>,
    in_dtype: DType,
    alpha: Scalar,
    beta: Scalar,
) -> Plan {
    let sa = layout::broadcast_strides(&a.shape, &a.strides, &out.shape);
    let sb = match b {
        Some(b) => layout::broadcast_strides(&b.shape, &b.strides, &out.shape),
        None => smallvec::smallvec![0; out.shape.len()],
    };
    let (shape, [so, sa, sb]) = layout::coalesce(&out.shape, [&out.strides, &sa, &sb]);
    let contiguous = shape.len() == 1 && so[0] == 1 && sa[0] == 1 && (b.is_none() || sb[0] == 1);
    Plan {
        n: out.numel(),
        shape,
        so,
        sa,
        sb,
        out: Addr::of(out),
        a: Addr::of(a),
        b: Addr::of_opt(b),
        in_dtype,
        alpha,
        beta,
        contiguous,
    }
}

/// `out = a op b` (with `alpha`, `beta` for `Axpby`).
pub fn binary(
    op: BinaryOp,
    a: &Buffer,
    b: &Buffer,
    out: &Buffer,
    alpha: Scalar,
    beta: Scalar,
    stream: &Stream,
) -> Result<()> {
    let device = out.device();
    check::devices(
        device,
        &[(Some(a), "a"), (Some(b), "b"), (Some(out), "out")],
        stream,
    )?;
    check::binary_dtypes(a, b, out, "out")?;
    check::real_scalar(alpha, a.dtype, "alpha")?;
    check::real_scalar(beta, a.dtype, "beta")?;
    let shape = layout::broadcast_shapes(&a.shape, &b.shape)
        .map_err(|e| e.context("a and b do not broadcast"))?;
    crate::ensure!(
        shape.as_slice() == out.shape.as_slice(),
        FK_ERROR_SHAPE_MISMATCH,
        "out has shape {:?} but a {:?} and b {:?} broadcast to {shape:?}",
        out.shape,
        a.shape,
        b.shape
    );
    out.check_writable("out")?;
    check::disjoint_or_in_place(out, "out", a, "a")?;
    check::disjoint_or_in_place(out, "out", b, "b")?;
    if out.numel() == 0 {
        return Ok(());
    }
    let p = plan(out, a, Some(b), a.dtype, alpha, beta);
    match device {
        Device::Cpu => crate::cpu::elementwise::binary(op, &p),
        Device::Cuda(_) => crate::cuda::elementwise::binary(out.ctx.cuda_dev(), op, &p, stream),
    }
}

/// `out = op(a)` with `a` broadcast to `out`'s shape (`alpha` for the scalar ops).
pub fn unary(op: UnaryOp, a: &Buffer, out: &Buffer, alpha: Scalar, stream: &Stream) -> Result<()> {
    let device = out.device();
    check::devices(device, &[(Some(a), "a"), (Some(out), "out")], stream)?;
    let want = op.out_dtype(a.dtype)?;
    crate::ensure!(
        out.dtype == want,
        FK_ERROR_DTYPE_MISMATCH,
        "out has dtype {} but {} of a {} input gives {want}",
        out.dtype,
        op.name().to_lowercase(),
        a.dtype
    );
    check::real_scalar(alpha, a.dtype, "s")?;
    let shape = layout::broadcast_shapes(&a.shape, &out.shape)
        .map_err(|e| e.context("a does not broadcast to out"))?;
    crate::ensure!(
        shape.as_slice() == out.shape.as_slice(),
        FK_ERROR_SHAPE_MISMATCH,
        "out has shape {:?} but a has shape {:?}, which does not broadcast to it",
        out.shape,
        a.shape
    );
    out.check_writable("out")?;
    check::disjoint_or_in_place(out, "out", a, "a")?;
    if out.numel() == 0 {
        return Ok(());
    }
    let p = plan(out, a, None, a.dtype, alpha, Scalar::default());
    match device {
        Device::Cpu => crate::cpu::elementwise::unary(op, &p),
        Device::Cuda(_) => crate::cuda::elementwise::unary(out.ctx.cuda_dev(), op, &p, stream),
    }
}
