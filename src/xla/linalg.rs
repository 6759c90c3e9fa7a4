//! XLA handlers of linear algebra (docs/linalg.md): the fused linear layer's
//! forward and backward, and the GEMM (for `matmul`, with the TF32 flag). All
//! capturable (docs/abi.md, "CUDA graphs").
//!
//! - `linear_forward`: operands `x`, `w` and optionally `b`; results `y` and, for
//!   the GELUs, `aux` (the pre-activation); attribute `act` (`FK_ACT_*`).
//! - `linear_backward`: operands `dy`, `x`, `w` and, unless `act` is none, `saved`
//!   (relu: the forward's `y`; GELUs: its `aux`); results `dx`, `dw` and
//!   optionally `db`; attribute `act`.
//! - `gemm`: operands `a`, `b`; result `c = alpha op_a(a) op_b(b)`; attributes
//!   `op_a`, `op_b` (`FK_OP_*`), `alpha` (real), `flags` (`FK_GEMM_ALLOW_TF32`).

use super::{
    Call,
    Graph::{Capturable, NotCapturable},
    handlers,
};
use crate::error::{FK_ERROR_INVALID_ARGUMENT, Result};
use crate::ops::linalg as la;
use crate::plan::elementwise::Scalar;
use crate::plan::linalg::{Activation, Trans};

fn activation(c: &Call) -> Result<Activation> {
    act_attr(c, "act")
}

/// The `fk_activation` attribute `name`.
pub(super) fn act_attr(c: &Call, name: &str) -> Result<Activation> {
    act_value(c.attr_i64(name)?, name)
}

/// An `fk_activation` value `v` (named `name` in messages).
pub(super) fn act_value(v: i64, name: &str) -> Result<Activation> {
    Ok(match v {
        0 => Activation::None,
        1 => Activation::Relu,
        2 => Activation::GeluTanh,
        3 => Activation::GeluErf,
        v => crate::bail!(
            FK_ERROR_INVALID_ARGUMENT,
            "{name} = {v} is not a valid fk_activation (FK_ACT_NONE=0, FK_ACT_RELU=1, FK_ACT_GELU_TANH=2, FK_ACT_GELU_ERF=3)"
        ),
    })
}

fn trans(c: &Call, name: &str) -> Result<Trans> {
    Ok(match c.attr_i64_or(name, Some(0))? {
        0 => Trans::N,
        1 => Trans::T,
        2 => Trans::C,
        v => crate::bail!(
            FK_ERROR_INVALID_ARGUMENT,
            "{name} = {v} is not a valid fk_op (FK_OP_N=0, FK_OP_T=1, FK_OP_C=2)"
        ),
    })
}

fn linear_forward(c: &Call) -> Result<()> {
    let act = activation(c)?;
    let nr = if act.has_aux() { 2 } else { 1 };
    c.expect((2, 3), (nr, nr))?;
    let (x, w, y) = (c.arg(0, "x")?, c.arg(1, "w")?, c.ret(0, "y")?);
    // b when the call has 3 operands; aux when act has one (`nr` results)
    let (b, aux) = (c.opt_arg(2, "b")?, c.opt_ret(1, "aux")?);
    la::linear_forward(&x, &w, b.as_ref(), act, &y, aux.as_ref(), &c.stream)
}

fn linear_backward(c: &Call) -> Result<()> {
    let act = activation(c)?;
    let na = if act == Activation::None { 3 } else { 4 };
    c.expect((na, na), (2, 3))?;
    let (dy, x, w) = (c.arg(0, "dy")?, c.arg(1, "x")?, c.arg(2, "w")?);
    let saved = c.opt_arg(3, "saved")?;
    let (dx, dw, db) = (c.ret(0, "dx")?, c.ret(1, "dw")?, c.opt_ret(2, "db")?);
    la::linear_backward(
        &dy,
        &x,
        &w,
        act,
        saved.as_ref(),
        Some(&dx),
        Some(&dw),
        db.as_ref(),
        &c.stream,
    )
}

fn gemm(c: &Call) -> Result<()> {
    c.expect((2, 2), (1, 1))?;
    let (ta, tb) = (trans(c, "op_a")?, trans(c, "op_b")?);
    let alpha = Scalar {
        re: c.attr_f64_or("alpha", Some(1.0))?,
        im: 0.0,
    };
    let flags = c.attr_flags("flags")?;
    let (a, b, out) = (c.arg(0, "a")?, c.arg(1, "b")?, c.ret(0, "c")?);
    la::gemm(
        ta,
        tb,
        alpha,
        &a,
        &b,
        Scalar::default(),
        &out,
        flags,
        &c.stream,
    )
}

handlers! {
    /// Fused linear layer `y = act(x W^T + b)` (fk_linear_forward).
    "linear_forward": fk_xla_linear_forward_cpu, fk_xla_linear_forward_cuda, Capturable, linear_forward;
    /// Backward of the fused linear layer (fk_linear_backward).
    "linear_backward": fk_xla_linear_backward_cpu, fk_xla_linear_backward_cuda, NotCapturable, linear_backward;
    /// `c = alpha op_a(a) op_b(b)` (fk_gemm with beta = 0).
    "gemm": fk_xla_gemm_cpu, fk_xla_gemm_cuda, Capturable, gemm;
}
