//! XLA handlers of the optimizer-math family (docs/optim.md, docs/ops.md section
//! 4): the matrix power, Shampoo statistics and preconditioning, per-sample
//! gradients, their norms and the DP-SGD clipped sum. `flags` (0 when absent) is
//! `FK_GEMM_ALLOW_TF32` = 1 or 0 everywhere it is read.
//!
//! Capturability follows docs/abi.md's "CUDA graphs" table:
//!
//! - `matrix_power`: the coupled Newton iteration with `tol <= 0` (fixed here):
//!   exactly `max_iter` iterations, nothing read on the host: capturable. Operand
//!   `a [n,n]` or `[batch,n,n]`, result `out` (a's shape); attributes `power`
//!   (`-1/p`, integer `1 <= p <= 64`), `eps`, `max_iter`, `flags`.
//! - `matrix_power_eigh`: the eigendecomposition (any power; it waits for the
//!   stream to read cuSOLVER's flags): **not capturable**, and declared so, so XLA
//!   keeps it out of its CUDA graphs. Operand `a`, result `out`; attributes
//!   `power`, `eps`. Not converging is fusekit's `FK_ERROR_NOT_CONVERGED`.
//! - `shampoo_stats`: operands `grad [m,n]` or `[batch,m,n]`, then `l` (`has_l`)
//!   and `r` (`has_r`); results the updated `l` and / or `r` (same order):
//!   `L' = beta L + alpha G G^T`, `R' = beta R + alpha G^T G`. A result is first
//!   copied from its operand (on the stream, an elementwise copy) unless XLA
//!   aliased them (`input_output_aliases`) or `beta = 0`; then updated in place.
//!   Attributes `alpha`, `beta`, `flags`. Not capturable (see mod.rs).
//! - `shampoo_precondition`: operands `grad`, then `l_root` (`has_l`) and
//!   `r_root` (`has_r`); result `out = L_root grad R_root`; `flags`. Not capturable (see mod.rs).
//! - `per_sample_grads`: operands `a [B,in]` / `[B,T,in]`, `g [B,out]` /
//!   `[B,T,out]`; result `out [B,out,in]`; `flags`. Not capturable (see mod.rs).
//! - `per_sample_grad_norms`: operands `a`, `g`; result `sq_norms [B]`.
//!   Not capturable (see mod.rs).
//! - `dp_clipped_grad_sum`: operands `a`, `g`; results `out [out,in]` and
//!   optionally `sq_norms [B]`; attributes `max_norm`, `flags`. Not capturable (see mod.rs).

use super::{Call, Graph::NotCapturable, handlers};
use crate::buffer::Buffer;
use crate::error::Result;
use crate::ops::elementwise as ew;
use crate::ops::optim as op;
use crate::plan::elementwise::{Scalar, UnaryOp};
use crate::plan::optim::Method;

fn matrix_power(c: &Call) -> Result<()> {
    c.expect((1, 1), (1, 1))?;
    let (a, out) = (c.arg(0, "a")?, c.ret(0, "out")?);
    let max_iter = c.attr_i64("max_iter")?;
    let max_iter = i32::try_from(max_iter)
        .map_err(|_| super::invalid(format!("max_iter = {max_iter} does not fit in 32 bits")))?;
    op::matrix_power(
        &a,
        c.attr_f64("power")?,
        c.attr_f64_or("eps", Some(0.0))?,
        Method::Newton,
        max_iter,
        0.0,
        c.attr_flags("flags")?,
        &out,
        &c.stream,
        &|_| {},
    )
    .map(|_| ())
}

fn matrix_power_eigh(c: &Call) -> Result<()> {
    c.expect((1, 1), (1, 1))?;
    let (a, out) = (c.arg(0, "a")?, c.ret(0, "out")?);
    op::matrix_power(
        &a,
        c.attr_f64("power")?,
        c.attr_f64_or("eps", Some(0.0))?,
        Method::Eigh,
        1,
        0.0,
        0,
        &out,
        &c.stream,
        &|_| {},
    )
    .map(|_| ())
}

/// The result that a statistic is updated in: its operand's value first, unless
/// XLA aliased the two or `beta = 0` (then nothing of it is read).
fn updated(
    src: Option<Buffer>,
    dst: Option<Buffer>,
    beta: f64,
    c: &Call,
) -> Result<Option<Buffer>> {
    if let (Some(s), Some(d)) = (&src, &dst)
        && beta != 0.0
        && !d.same_view(s)
    {
        ew::unary(UnaryOp::Copy, s, d, Scalar::default(), &c.stream)?;
    }
    Ok(dst)
}

fn shampoo_stats(c: &Call) -> Result<()> {
    let (has_l, has_r) = (c.attr_bool("has_l", false)?, c.attr_bool("has_r", false)?);
    let n = has_l as usize + has_r as usize;
    c.expect((1 + n, 1 + n), (n, n))?;
    let mut args = c.operands();
    let grad = args.next("grad")?;
    let (l, r) = (args.opt(has_l, "l")?, args.opt(has_r, "r")?);
    let mut rets = c.results();
    let (lo, ro) = (rets.opt(has_l, "l_out")?, rets.opt(has_r, "r_out")?);
    let beta = c.attr_f64("beta")?;
    let lo = updated(l, lo, beta, c)?;
    let ro = updated(r, ro, beta, c)?;
    op::shampoo_stats(
        &grad,
        c.attr_f64("alpha")?,
        beta,
        lo.as_ref(),
        ro.as_ref(),
        c.attr_flags("flags")?,
        &c.stream,
    )
}

fn shampoo_precondition(c: &Call) -> Result<()> {
    let (has_l, has_r) = (c.attr_bool("has_l", false)?, c.attr_bool("has_r", false)?);
    let na = 1 + has_l as usize + has_r as usize;
    c.expect((na, na), (1, 1))?;
    let mut args = c.operands();
    let grad = args.next("grad")?;
    let (l, r) = (args.opt(has_l, "l_root")?, args.opt(has_r, "r_root")?);
    let out = c.ret(0, "out")?;
    op::shampoo_precondition(
        l.as_ref(),
        &grad,
        r.as_ref(),
        &out,
        c.attr_flags("flags")?,
        &c.stream,
    )
}

fn per_sample_grads(c: &Call) -> Result<()> {
    c.expect((2, 2), (1, 1))?;
    let (a, g, out) = (c.arg(0, "a")?, c.arg(1, "g")?, c.ret(0, "out")?);
    op::per_sample_grads(&a, &g, &out, c.attr_flags("flags")?, &c.stream)
}

fn per_sample_grad_norms(c: &Call) -> Result<()> {
    c.expect((2, 2), (1, 1))?;
    let (a, g, n) = (c.arg(0, "a")?, c.arg(1, "g")?, c.ret(0, "sq_norms")?);
    op::per_sample_grad_norms(&a, &g, &n, &c.stream)
}

fn dp_clipped_grad_sum(c: &Call) -> Result<()> {
    c.expect((2, 2), (1, 2))?;
    let (a, g, out) = (c.arg(0, "a")?, c.arg(1, "g")?, c.ret(0, "out")?);
    let n = c.opt_ret(1, "sq_norms")?;
    op::dp_clipped_grad_sum(
        &a,
        &g,
        c.attr_f64("max_norm")?,
        &out,
        n.as_ref(),
        c.attr_flags("flags")?,
        &c.stream,
    )
}

handlers! {
    /// Inverse p-th root by the coupled Newton iteration, `max_iter` iterations
    /// unchecked (fk_matrix_power with FK_MATPOW_NEWTON and tol = 0).
    "matrix_power": fk_xla_matrix_power_cpu, fk_xla_matrix_power_cuda, NotCapturable, matrix_power;
    /// Any real power by the eigendecomposition (fk_matrix_power with FK_MATPOW_EIGH).
    "matrix_power_eigh": fk_xla_matrix_power_eigh_cpu, fk_xla_matrix_power_eigh_cuda, NotCapturable, matrix_power_eigh;
    /// Shampoo statistics (fk_shampoo_stats_ex).
    "shampoo_stats": fk_xla_shampoo_stats_cpu, fk_xla_shampoo_stats_cuda, NotCapturable, shampoo_stats;
    /// Shampoo preconditioning `out = L_root grad R_root` (fk_shampoo_precondition).
    "shampoo_precondition": fk_xla_shampoo_precondition_cpu, fk_xla_shampoo_precondition_cuda, NotCapturable, shampoo_precondition;
    /// Per-sample gradients of a linear layer, materialised (fk_per_sample_grads).
    "per_sample_grads": fk_xla_per_sample_grads_cpu, fk_xla_per_sample_grads_cuda, NotCapturable, per_sample_grads;
    /// Squared norms of the per-sample gradients (fk_per_sample_grad_norms).
    "per_sample_grad_norms": fk_xla_per_sample_grad_norms_cpu, fk_xla_per_sample_grad_norms_cuda, NotCapturable, per_sample_grad_norms;
    /// The DP-SGD clipped sum (fk_dp_clipped_grad_sum).
    "dp_clipped_grad_sum": fk_xla_dp_clipped_grad_sum_cpu, fk_xla_dp_clipped_grad_sum_cuda, NotCapturable, dp_clipped_grad_sum;
}
