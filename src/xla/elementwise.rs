//! XLA handlers of the elementwise family (docs/ops.md section 1): binary ops with
//! NumPy broadcasting as fusekit defines it, `axpby`, and unary ops. Capturable
//! (docs/abi.md, "CUDA graphs").
//!
//! Operands `a` (and `b`), result `out`; `axpby` takes the attributes `alpha`,
//! `beta` (reals; `alpha_im`, `beta_im` optional, 0 by default).

use super::{Call, Graph::Capturable, handlers};
use crate::error::Result;
use crate::ops::elementwise as ew;
use crate::plan::elementwise::{BinaryOp, Scalar, UnaryOp};

const ONE: Scalar = Scalar { re: 1.0, im: 0.0 };

fn binary(c: &Call, op: BinaryOp, alpha: Scalar, beta: Scalar) -> Result<()> {
    c.expect((2, 2), (1, 1))?;
    let (a, b, out) = (c.arg(0, "a")?, c.arg(1, "b")?, c.ret(0, "out")?);
    ew::binary(op, &a, &b, &out, alpha, beta, &c.stream)
}

fn unary(c: &Call, op: UnaryOp) -> Result<()> {
    c.expect((1, 1), (1, 1))?;
    let (a, out) = (c.arg(0, "a")?, c.ret(0, "out")?);
    ew::unary(op, &a, &out, Scalar::default(), &c.stream)
}

fn axpby(c: &Call) -> Result<()> {
    let alpha = Scalar {
        re: c.attr_f64("alpha")?,
        im: c.attr_f64_or("alpha_im", Some(0.0))?,
    };
    let beta = Scalar {
        re: c.attr_f64("beta")?,
        im: c.attr_f64_or("beta_im", Some(0.0))?,
    };
    binary(c, BinaryOp::Axpby, alpha, beta)
}

handlers! {
    /// `out = a + b` (fk_add).
    "add": fk_xla_add_cpu, fk_xla_add_cuda, Capturable, |c| binary(c, BinaryOp::Add, ONE, ONE);
    /// `out = a - b` (fk_sub).
    "sub": fk_xla_sub_cpu, fk_xla_sub_cuda, Capturable, |c| binary(c, BinaryOp::Sub, ONE, ONE);
    /// `out = a * b` (fk_mul).
    "mul": fk_xla_mul_cpu, fk_xla_mul_cuda, Capturable, |c| binary(c, BinaryOp::Mul, ONE, ONE);
    /// `out = a / b` (fk_div).
    "div": fk_xla_div_cpu, fk_xla_div_cuda, Capturable, |c| binary(c, BinaryOp::Div, ONE, ONE);
    /// `out = alpha a + beta b` (fk_axpby); attributes `alpha`, `beta`.
    "axpby": fk_xla_axpby_cpu, fk_xla_axpby_cuda, Capturable, axpby;
    /// `out = -a` (fk_neg).
    "neg": fk_xla_neg_cpu, fk_xla_neg_cuda, Capturable, |c| unary(c, UnaryOp::Neg);
    /// `out = |a|` (fk_abs; real out for complex a).
    "abs": fk_xla_abs_cpu, fk_xla_abs_cuda, Capturable, |c| unary(c, UnaryOp::Abs);
    /// `out = exp(a)` (fk_exp).
    "exp": fk_xla_exp_cpu, fk_xla_exp_cuda, Capturable, |c| unary(c, UnaryOp::Exp);
    /// `out = log(a)` (fk_log).
    "log": fk_xla_log_cpu, fk_xla_log_cuda, Capturable, |c| unary(c, UnaryOp::Log);
    /// `out = sqrt(a)` (fk_sqrt).
    "sqrt": fk_xla_sqrt_cpu, fk_xla_sqrt_cuda, Capturable, |c| unary(c, UnaryOp::Sqrt);
    /// `out = sin(a)` (fk_sin).
    "sin": fk_xla_sin_cpu, fk_xla_sin_cuda, Capturable, |c| unary(c, UnaryOp::Sin);
    /// `out = cos(a)` (fk_cos).
    "cos": fk_xla_cos_cpu, fk_xla_cos_cuda, Capturable, |c| unary(c, UnaryOp::Cos);
    /// `out = tanh(a)` (fk_tanh).
    "tanh": fk_xla_tanh_cpu, fk_xla_tanh_cuda, Capturable, |c| unary(c, UnaryOp::Tanh);
    /// `out = 1 / (1 + exp(-a))` (fk_sigmoid).
    "sigmoid": fk_xla_sigmoid_cpu, fk_xla_sigmoid_cuda, Capturable, |c| unary(c, UnaryOp::Sigmoid);
    /// `out = max(a, 0)` (fk_relu).
    "relu": fk_xla_relu_cpu, fk_xla_relu_cuda, Capturable, |c| unary(c, UnaryOp::Relu);
}
