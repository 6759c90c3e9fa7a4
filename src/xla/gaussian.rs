//! XLA handlers of the Gaussian field family (docs/gaussian.md): Mahalanobis
//! distances and the fused field, forward and backward. All capturable
//! (docs/abi.md, "CUDA graphs"). Attribute `eps` (real) everywhere.
//!
//! - `mahalanobis_forward`: operands `points [B,3]`, `means [N,3]`, `chol [N,3,3]`;
//!   result `out [B,N]`.
//! - `mahalanobis_backward`: operands as the forward and `g [B,N]`; results
//!   `dpoints`, `dmeans`, `dchol`, `workspace`.
//! - `field_forward`: operands `points`, `means`, `chol`, `weights [N]`; result
//!   `out [B]`.
//! - `field_backward`: operands as the forward and `dout [B]`; results `dpoints`,
//!   `dmeans`, `dchol`, `dweights`, `workspace`.
//!
//! `workspace` is a result XLA allocates for the CUDA backward's deterministic
//! reductions, at least `fk_xla_gaussian_workspace_bytes` bytes (any dtype of the
//! call; empty on the CPU).

use super::{Call, Graph::Capturable, handlers};
use crate::error::Result;
use crate::ops::gaussian as g;

fn mahalanobis_forward(c: &Call) -> Result<()> {
    c.expect((3, 3), (1, 1))?;
    let (p, m, l) = (c.arg(0, "points")?, c.arg(1, "means")?, c.arg(2, "chol")?);
    let out = c.ret(0, "out")?;
    g::mahalanobis_forward(&p, &m, &l, c.attr_f64("eps")?, &out, &c.stream)
}

fn mahalanobis_backward(c: &Call) -> Result<()> {
    c.expect((4, 4), (4, 4))?;
    let (p, m, l) = (c.arg(0, "points")?, c.arg(1, "means")?, c.arg(2, "chol")?);
    let grad = c.arg(3, "g")?;
    let (dp, dm, dl) = (
        c.ret(0, "dpoints")?,
        c.ret(1, "dmeans")?,
        c.ret(2, "dchol")?,
    );
    let ws = c.workspace(3)?;
    g::mahalanobis_backward(
        &p,
        &m,
        &l,
        c.attr_f64("eps")?,
        &grad,
        Some(&dp),
        Some(&dm),
        Some(&dl),
        ws.as_ref(),
        &c.stream,
    )
}

fn field_forward(c: &Call) -> Result<()> {
    c.expect((4, 4), (1, 1))?;
    let (p, m, l) = (c.arg(0, "points")?, c.arg(1, "means")?, c.arg(2, "chol")?);
    let w = c.arg(3, "weights")?;
    let out = c.ret(0, "out")?;
    g::field_forward(&p, &m, &l, &w, c.attr_f64("eps")?, &out, &c.stream)
}

fn field_backward(c: &Call) -> Result<()> {
    c.expect((5, 5), (5, 5))?;
    let (p, m, l) = (c.arg(0, "points")?, c.arg(1, "means")?, c.arg(2, "chol")?);
    let (w, dout) = (c.arg(3, "weights")?, c.arg(4, "dout")?);
    let (dp, dm, dl) = (
        c.ret(0, "dpoints")?,
        c.ret(1, "dmeans")?,
        c.ret(2, "dchol")?,
    );
    let dw = c.ret(3, "dweights")?;
    let ws = c.workspace(4)?;
    g::field_backward(
        &p,
        &m,
        &l,
        &w,
        c.attr_f64("eps")?,
        &dout,
        Some(&dp),
        Some(&dm),
        Some(&dl),
        Some(&dw),
        ws.as_ref(),
        &c.stream,
    )
}

handlers! {
    /// Squared Mahalanobis distances (fk_mahalanobis_forward).
    "mahalanobis_forward": fk_xla_mahalanobis_forward_cpu, fk_xla_mahalanobis_forward_cuda, Capturable, mahalanobis_forward;
    /// Backward of the Mahalanobis distances (fk_mahalanobis_backward).
    "mahalanobis_backward": fk_xla_mahalanobis_backward_cpu, fk_xla_mahalanobis_backward_cuda, Capturable, mahalanobis_backward;
    /// Fused Gaussian field (fk_gaussian_field_forward).
    "field_forward": fk_xla_gaussian_field_forward_cpu, fk_xla_gaussian_field_forward_cuda, Capturable, field_forward;
    /// Fused backward of the Gaussian field (fk_gaussian_field_backward).
    "field_backward": fk_xla_gaussian_field_backward_cpu, fk_xla_gaussian_field_backward_cuda, Capturable, field_backward;
}
