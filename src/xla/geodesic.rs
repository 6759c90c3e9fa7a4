//! XLA handlers of the geodesic flow family (docs/geodesic.md, docs/ops.md section
//! 5): the Christoffel map and the fused leapfrog, forward and backward. All
//! capturable, the cuBLAS routes included (docs/abi.md, "CUDA graphs"); their
//! CUDA scratch is allocated stream-ordered on XLA's stream.
//!
//! Attributes everywhere: `c` (real, the clamp bound; `inf` disables it) and
//! `flags` (`FK_GEO_ALLOW_TF32` = 1, `FK_GEO_ALLOW_TF32X3` = 4; 0 when absent).
//! The leapfrogs add `dt` (real) and `steps` (integer). Optional operands are
//! present when their `has_*` attribute is 1 (0 when absent); optional results are
//! chosen by a `want` bit mask.
//!
//! - `christoffel_forward`: operands `v [B,D]`, `U [D,R]`, `W [D,R]`; result
//!   `gamma [B,D]`.
//! - `christoffel_backward`: operands `v`, `U`, `W`, `g [B,D]`; results, in this
//!   order, those of `dv`, `dU`, `dW` that `want` names (bits 1, 2, 4; default 7).
//! - `leapfrog_forward`: operands `x0`, `v0`, `U`, `W`, then `f [B,D]` (`has_f`)
//!   and `mu [D]` (`has_mu`); results `x_out`, `v_out` and optionally
//!   `traj [T,2,B,D]` (a third result).
//! - `leapfrog_backward`: operands `v0`, `U`, `W`, then `f` (`has_f`), `mu`
//!   (`has_mu`), `traj` (`has_traj`), then `gx`, `gv` `[B,D]`; results, in this
//!   order, those of `dx0`, `dv0`, `df`, `dU`, `dW` that `want` names (bits 1, 2,
//!   4, 8, 16; default 31).

use super::{Call, Graph::NotCapturable, handlers};
use crate::buffer::Buffer;
use crate::error::{FK_ERROR_INVALID_ARGUMENT, Result};
use crate::ops::geodesic as geo;

/// The `want` mask of a backward with `n` optional gradients (all when absent).
fn want(c: &Call, n: u32) -> Result<u32> {
    let all = (1u32 << n) - 1;
    let w = c.attr_i64_or("want", Some(all as i64))?;
    crate::ensure!(
        (0..=all as i64).contains(&w),
        FK_ERROR_INVALID_ARGUMENT,
        "want = {w} has bits outside the {n} gradients of this backward (0 to {all})"
    );
    Ok(w as u32)
}

/// The results named by `want`'s bits, in bit order (None where not wanted).
fn wanted<const N: usize>(c: &Call, want: u32, names: [&str; N]) -> Result<[Option<Buffer>; N]> {
    let n = want.count_ones() as usize;
    c.expect((c.n_args(), c.n_args()), (n, n))?;
    let mut rets = c.results();
    let mut out: [Option<Buffer>; N] = std::array::from_fn(|_| None);
    for (i, name) in names.iter().enumerate() {
        out[i] = rets.opt(want >> i & 1 == 1, name)?;
    }
    Ok(out)
}

/// The leapfrog's attributes `dt`, `steps`, `c` and `flags`, read in that order.
fn leapfrog_attrs(c: &Call) -> Result<(f64, i64, f64, u32)> {
    Ok((
        c.attr_f64("dt")?,
        c.attr_i64("steps")?,
        c.attr_f64("c")?,
        c.attr_flags("flags")?,
    ))
}

fn christoffel_forward(c: &Call) -> Result<()> {
    c.expect((3, 3), (1, 1))?;
    let (v, u, w) = (c.arg(0, "v")?, c.arg(1, "U")?, c.arg(2, "W")?);
    let gamma = c.ret(0, "gamma")?;
    let (cl, flags) = (c.attr_f64("c")?, c.attr_flags("flags")?);
    geo::christoffel_forward(&v, &u, &w, cl, flags, &gamma, &c.stream)
}

fn christoffel_backward(c: &Call) -> Result<()> {
    c.expect((4, 4), (0, 3))?;
    let (v, u, w) = (c.arg(0, "v")?, c.arg(1, "U")?, c.arg(2, "W")?);
    let g = c.arg(3, "g")?;
    let [dv, du, dw] = wanted(c, want(c, 3)?, ["dv", "dU", "dW"])?;
    let (cl, flags) = (c.attr_f64("c")?, c.attr_flags("flags")?);
    geo::christoffel_backward(
        &v,
        &u,
        &w,
        &g,
        cl,
        flags,
        dv.as_ref(),
        du.as_ref(),
        dw.as_ref(),
        &c.stream,
    )
}

fn leapfrog_forward(c: &Call) -> Result<()> {
    let (has_f, has_mu) = (c.attr_bool("has_f", false)?, c.attr_bool("has_mu", false)?);
    let na = 4 + has_f as usize + has_mu as usize;
    c.expect((na, na), (2, 3))?;
    let mut args = c.operands();
    let (x0, v0) = (args.next("x0")?, args.next("v0")?);
    let (u, w) = (args.next("U")?, args.next("W")?);
    let (f, mu) = (args.opt(has_f, "f")?, args.opt(has_mu, "mu")?);
    let (xo, vo) = (c.ret(0, "x_out")?, c.ret(1, "v_out")?);
    let traj = c.opt_ret(2, "traj")?;
    let (dt, steps, cl, flags) = leapfrog_attrs(c)?;
    let (f, mu, traj) = (f.as_ref(), mu.as_ref(), traj.as_ref());
    geo::leapfrog_forward(
        &x0, &v0, f, &u, &w, mu, dt, steps, cl, flags, &xo, &vo, traj, &c.stream,
    )
}

fn leapfrog_backward(c: &Call) -> Result<()> {
    let has_f = c.attr_bool("has_f", false)?;
    let has_mu = c.attr_bool("has_mu", false)?;
    let has_traj = c.attr_bool("has_traj", false)?;
    let na = 5 + has_f as usize + has_mu as usize + has_traj as usize;
    c.expect((na, na), (0, 5))?;
    let mut args = c.operands();
    let (v0, u, w) = (args.next("v0")?, args.next("U")?, args.next("W")?);
    let f = args.opt(has_f, "f")?;
    let mu = args.opt(has_mu, "mu")?;
    let traj = args.opt(has_traj, "traj")?;
    let (gx, gv) = (args.next("gx")?, args.next("gv")?);
    let [dx0, dv0, df, du, dw] = wanted(c, want(c, 5)?, ["dx0", "dv0", "df", "dU", "dW"])?;
    let (dt, steps, cl, flags) = leapfrog_attrs(c)?;
    let (f, mu, traj) = (f.as_ref(), mu.as_ref(), traj.as_ref());
    let (dx0, dv0, df, du, dw) = (
        dx0.as_ref(),
        dv0.as_ref(),
        df.as_ref(),
        du.as_ref(),
        dw.as_ref(),
    );
    geo::leapfrog_backward(
        &v0,
        f,
        &u,
        &w,
        mu,
        dt,
        steps,
        cl,
        flags,
        traj,
        Some(&gx),
        Some(&gv),
        dx0,
        dv0,
        df,
        du,
        dw,
        &c.stream,
    )
}

handlers! {
    /// Clamped Christoffel map `gamma = clamp((v U)^2 W^T, -c, c)` (fk_christoffel_forward).
    "christoffel_forward": fk_xla_christoffel_forward_cpu, fk_xla_christoffel_forward_cuda, NotCapturable, christoffel_forward;
    /// Backward of the Christoffel map (fk_christoffel_backward).
    "christoffel_backward": fk_xla_christoffel_backward_cpu, fk_xla_christoffel_backward_cuda, NotCapturable, christoffel_backward;
    /// Fused kick-drift-kick leapfrog, `steps` steps (fk_leapfrog_forward).
    "leapfrog_forward": fk_xla_leapfrog_forward_cpu, fk_xla_leapfrog_forward_cuda, NotCapturable, leapfrog_forward;
    /// Backward of the leapfrog (fk_leapfrog_backward).
    "leapfrog_backward": fk_xla_leapfrog_backward_cpu, fk_xla_leapfrog_backward_cuda, NotCapturable, leapfrog_backward;
}
