//! The geodesic flow family (docs/ops.md section 5): validation, then dispatch.
//!
//! - `christoffel_forward`: `gamma = clamp((v U)^2 W^T, -c, c)`.
//! - `christoffel_backward`: `dv, dU, dW` (each optional) given `g = dL/dgamma`.
//! - `leapfrog_forward`: `T` kick-drift-kick steps with optional force `f` and
//!   per-feature friction `mu`, optional trajectory `[T, 2, B, D]`
//!   (`traj[t, 0] = x_{t+1}`, `traj[t, 1] = v_{t+1}`: the state after step `t`).
//! - `leapfrog_backward`: gradients of a loss on `(x_T, v_T)` w.r.t. `x0, v0, f, U,
//!   W` (each optional), from the trajectory when given, else recomputed.
//!
//! Every buffer is a contiguous row-major matrix (vector for `mu`, 4-D for the
//! trajectory) of one dtype, f32 or f64, on one device. Outputs may not overlap
//! inputs or each other, except the exact in-place forms `gamma == v`,
//! `x_out == x0`, `v_out == v0`.

use crate::addr::Addr;
use crate::buffer::Buffer;
use crate::context::Device;
use crate::dtype::DType;
use crate::error::{FK_ERROR_INVALID_ARGUMENT, FK_ERROR_SHAPE_MISMATCH, Result};
use crate::ops::check::{self, Named};
use crate::plan::geodesic::{GEO_KNOWN_FLAGS, Job, Kind};
use crate::stream::Stream;

/// A named buffer argument.
type Arg<'a> = Named<'a>;

/// The element types of the geodesic ops.
const DTYPES: [DType; 2] = [DType::F32, DType::F64];

/// Checks rank, dtype (that of `vname`) and contiguity of `b`, returns its shape.
fn check_buf<'a>(
    b: &'a Buffer,
    name: &str,
    ndim: usize,
    what: &str,
    dtype: DType,
    vname: &str,
) -> Result<&'a [i64]> {
    check::rank(b, name, ndim, what)?;
    check::same_dtype(b, name, dtype, vname)?;
    check::contiguous(b, name)?;
    Ok(&b.shape)
}

fn check_scalars(c: f64, flags: u32) -> Result<()> {
    crate::ensure!(
        c >= 0.0,
        FK_ERROR_INVALID_ARGUMENT,
        "c = {c} must be >= 0 (the clamp bound; +inf disables clamping)"
    );
    crate::ensure!(
        flags & !GEO_KNOWN_FLAGS == 0,
        FK_ERROR_INVALID_ARGUMENT,
        "flags = {flags:#x} has unknown bits (known: FK_GEO_ALLOW_TF32 = 1, FK_GEO_FORCE_GENERIC = 2, FK_GEO_ALLOW_TF32X3 = 4)"
    );
    Ok(())
}

fn check_steps(dt: f64, steps: i64) -> Result<usize> {
    crate::ensure!(
        dt.is_finite(),
        FK_ERROR_INVALID_ARGUMENT,
        "dt = {dt} must be finite"
    );
    crate::ensure!(
        steps >= 1,
        FK_ERROR_INVALID_ARGUMENT,
        "steps (T) = {steps} must be >= 1"
    );
    Ok(steps as usize)
}

/// `v` (or `v0`): the [B, D] matrix that fixes dtype, B and D.
fn check_v(v: &Buffer, name: &str) -> Result<(DType, usize, usize)> {
    let dtype = check::dtype_in(v, name, &DTYPES, "the geodesic ops (f32 and f64)")?;
    check::rank(v, name, 2, "a [B, D] matrix")?;
    check::contiguous(v, name)?;
    Ok((dtype, v.shape[0] as usize, v.shape[1] as usize))
}

/// `U`, `W`: both [D, R]; returns R.
fn check_uw(u: &Buffer, w: &Buffer, vname: &str, dtype: DType, d: usize) -> Result<usize> {
    let us = check_buf(u, "U", 2, "a [D, R] matrix", dtype, vname)?;
    crate::ensure!(
        us[0] as usize == d,
        FK_ERROR_SHAPE_MISMATCH,
        "U has shape {us:?} but {vname} has {d} columns"
    );
    let ws = check_buf(w, "W", 2, "a [D, R] matrix", dtype, vname)?;
    crate::ensure!(
        ws == us,
        FK_ERROR_SHAPE_MISMATCH,
        "W has shape {ws:?} but U has shape {us:?} (both must be [D, R])"
    );
    Ok(us[1] as usize)
}

/// A [B, D] companion of `v` (same shape).
fn check_like(b: &Buffer, name: &str, vname: &str, v: &Buffer, dtype: DType) -> Result<()> {
    let s = check_buf(b, name, 2, "a [B, D] matrix", dtype, vname)?;
    crate::ensure!(
        s == v.shape.as_slice(),
        FK_ERROR_SHAPE_MISMATCH,
        "{name} has shape {s:?} but {vname} has shape {:?}",
        v.shape
    );
    Ok(())
}

/// The given ones of optional [B, D] companions of `v` (`check_like`).
fn check_likes(
    bufs: &[(Option<&Buffer>, &str)],
    vname: &str,
    v: &Buffer,
    dtype: DType,
) -> Result<()> {
    for &(b, name) in bufs {
        if let Some(b) = b {
            check_like(b, name, vname, v, dtype)?;
        }
    }
    Ok(())
}

/// `dU`, `dW` where given: [D, R] matrices of `U`'s shape.
fn check_param_grads(
    du: Option<&Buffer>,
    dw: Option<&Buffer>,
    u: &Buffer,
    dtype: DType,
    vname: &str,
) -> Result<()> {
    for (x, name) in [(du, "dU"), (dw, "dW")] {
        if let Some(x) = x {
            let s = check_buf(x, name, 2, "a [D, R] matrix", dtype, vname)?;
            crate::ensure!(
                s == u.shape.as_slice(),
                FK_ERROR_SHAPE_MISMATCH,
                "{name} has shape {s:?} but U has shape {:?}",
                u.shape
            );
        }
    }
    Ok(())
}

fn check_mu(mu: &Buffer, dtype: DType, d: usize) -> Result<()> {
    check_buf(mu, "mu", 1, "a [D] vector", dtype, "v0")?;
    check::shape(mu, "mu", &[d as i64], "[D]")
}

fn check_traj(traj: &Buffer, dtype: DType, steps: usize, b: usize, d: usize) -> Result<()> {
    let want = [steps as i64, 2, b as i64, d as i64];
    check::shape(traj, "traj", &want, "[T, 2, B, D]")?;
    check_buf(traj, "traj", 4, "[T, 2, B, D]", dtype, "v0")?;
    Ok(())
}

/// The given ones of optional buffers.
fn given<'a>(bufs: &[(Option<&'a Buffer>, &'a str)]) -> Vec<Arg<'a>> {
    bufs.iter()
        .filter_map(|&(b, n)| b.map(|b| (b, n)))
        .collect()
}

/// Devices of every buffer and of the stream; outputs writable; no forbidden
/// overlaps (`inplace` lists the (output, input) pairs that may be the same view).
fn check_common(
    device: Device,
    inputs: &[Arg],
    outputs: &[Arg],
    inplace: &[(&str, &str)],
    stream: &Stream,
) -> Result<()> {
    let all: Vec<(Option<&Buffer>, &str)> = inputs
        .iter()
        .chain(outputs)
        .map(|&(b, n)| (Some(b), n))
        .collect();
    check::devices(device, &all, stream)?;
    for (i, &(o, on)) in outputs.iter().enumerate() {
        o.check_writable(on)?;
        for &(inp, iname) in inputs {
            if inplace.contains(&(on, iname)) {
                check::disjoint_or_in_place(o, on, inp, &format!("the input {iname}"))?;
            } else {
                check::disjoint(o, on, &[(inp, &format!("the input {iname}"))])?;
            }
        }
        for &(o2, on2) in &outputs[..i] {
            check::disjoint(o, on, &[(o2, &format!("the output {on2}"))])?;
        }
    }
    Ok(())
}

/// Runs `kind` on the backend of `v`'s device, unless there is nothing to compute
/// (`work` false).
fn dispatch(kind: Kind, job: &Job, v: &Buffer, stream: &Stream, work: bool) -> Result<()> {
    if !work {
        return Ok(());
    }
    match v.device() {
        Device::Cpu => crate::cpu::geodesic::run(kind, job),
        Device::Cuda(_) => crate::cuda::geodesic::run(v.ctx.cuda_dev(), kind, job, stream),
    }
}

/// `gamma = clamp((v U)^2 W^T, -c, c)`; `gamma` may be `v` itself (in place).
pub fn christoffel_forward(
    v: &Buffer,
    u: &Buffer,
    w: &Buffer,
    c: f64,
    flags: u32,
    gamma: &Buffer,
    stream: &Stream,
) -> Result<()> {
    let (dtype, b, d) = check_v(v, "v")?;
    let r = check_uw(u, w, "v", dtype, d)?;
    check_like(gamma, "gamma", "v", v, dtype)?;
    check_scalars(c, flags)?;
    check_common(
        v.device(),
        &[(v, "v"), (u, "U"), (w, "W")],
        &[(gamma, "gamma")],
        &[("gamma", "v")],
        stream,
    )?;
    let job = Job {
        c,
        flags,
        v0: Addr::of(v),
        u: Addr::of(u),
        w: Addr::of(w),
        gamma: Addr::of(gamma),
        ..Job::absent(dtype, b, d, r)
    };
    dispatch(Kind::ChristoffelForward, &job, v, stream, b > 0 && d > 0)
}

/// `dv = dp U^T`, `dU = v^T dp`, `dW = g'^T s` for `g = dL/dgamma` (each output optional).
#[allow(clippy::too_many_arguments)]
pub fn christoffel_backward(
    v: &Buffer,
    u: &Buffer,
    w: &Buffer,
    g: &Buffer,
    c: f64,
    flags: u32,
    dv: Option<&Buffer>,
    du: Option<&Buffer>,
    dw: Option<&Buffer>,
    stream: &Stream,
) -> Result<()> {
    let (dtype, b, d) = check_v(v, "v")?;
    let r = check_uw(u, w, "v", dtype, d)?;
    check_like(g, "g", "v", v, dtype)?;
    check_likes(&[(dv, "dv")], "v", v, dtype)?;
    check_param_grads(du, dw, u, dtype, "v")?;
    check_scalars(c, flags)?;
    let outs = given(&[(dv, "dv"), (du, "dU"), (dw, "dW")]);
    check_common(
        v.device(),
        &[(v, "v"), (u, "U"), (w, "W"), (g, "g")],
        &outs,
        &[],
        stream,
    )?;
    let job = Job {
        c,
        flags,
        v0: Addr::of(v),
        u: Addr::of(u),
        w: Addr::of(w),
        g: Addr::of(g),
        dv: Addr::of_opt(dv),
        du: Addr::of_opt(du),
        dw: Addr::of_opt(dw),
        ..Job::absent(dtype, b, d, r)
    };
    dispatch(
        Kind::ChristoffelBackward,
        &job,
        v,
        stream,
        !outs.is_empty() && d > 0,
    )
}

/// What both leapfrogs take first (the forward's `x0`, then `v0`, `f`, `U`, `W`, `mu`
/// and the scalars), checked in that order; the job over them.
#[allow(clippy::too_many_arguments)]
fn leapfrog_job(
    x0: Option<&Buffer>,
    v0: &Buffer,
    f: Option<&Buffer>,
    u: &Buffer,
    w: &Buffer,
    mu: Option<&Buffer>,
    dt: f64,
    steps: i64,
    c: f64,
    flags: u32,
) -> Result<Job> {
    let (dtype, b, d) = check_v(v0, "v0")?;
    check_likes(&[(x0, "x0"), (f, "f")], "v0", v0, dtype)?;
    let r = check_uw(u, w, "v0", dtype, d)?;
    if let Some(mu) = mu {
        check_mu(mu, dtype, d)?;
    }
    let steps = check_steps(dt, steps)?;
    check_scalars(c, flags)?;
    Ok(Job {
        c,
        dt,
        steps,
        flags,
        x0: Addr::of_opt(x0),
        v0: Addr::of(v0),
        f: Addr::of_opt(f),
        u: Addr::of(u),
        w: Addr::of(w),
        mu: Addr::of_opt(mu),
        ..Job::absent(dtype, b, d, r)
    })
}

/// `T` fused kick-drift-kick steps; `x_out`/`v_out` may be `x0`/`v0` (in place).
#[allow(clippy::too_many_arguments)]
pub fn leapfrog_forward(
    x0: &Buffer,
    v0: &Buffer,
    f: Option<&Buffer>,
    u: &Buffer,
    w: &Buffer,
    mu: Option<&Buffer>,
    dt: f64,
    steps: i64,
    c: f64,
    flags: u32,
    x_out: &Buffer,
    v_out: &Buffer,
    traj: Option<&Buffer>,
    stream: &Stream,
) -> Result<()> {
    let base = leapfrog_job(Some(x0), v0, f, u, w, mu, dt, steps, c, flags)?;
    let (dtype, b, d) = (base.dtype, base.b, base.d);
    check_like(x_out, "x_out", "v0", v0, dtype)?;
    check_like(v_out, "v_out", "v0", v0, dtype)?;
    if let Some(t) = traj {
        check_traj(t, dtype, base.steps, b, d)?;
    }
    let mut ins: Vec<Arg> = vec![(x0, "x0"), (v0, "v0"), (u, "U"), (w, "W")];
    ins.extend(given(&[(f, "f"), (mu, "mu")]));
    let mut outs: Vec<Arg> = vec![(x_out, "x_out"), (v_out, "v_out")];
    outs.extend(given(&[(traj, "traj")]));
    check_common(
        v0.device(),
        &ins,
        &outs,
        &[("x_out", "x0"), ("v_out", "v0")],
        stream,
    )?;
    let job = Job {
        x_out: Addr::of(x_out),
        v_out: Addr::of(v_out),
        traj: Addr::of_opt(traj),
        ..base
    };
    dispatch(Kind::LeapfrogForward, &job, v0, stream, b > 0 && d > 0)
}

/// Gradients of a loss on `(x_T, v_T)` (given `gx = dL/dx_T`, `gv = dL/dv_T`, each
/// optional = zero) w.r.t. `x0, v0, f, U, W` (each optional).
#[allow(clippy::too_many_arguments)]
pub fn leapfrog_backward(
    v0: &Buffer,
    f: Option<&Buffer>,
    u: &Buffer,
    w: &Buffer,
    mu: Option<&Buffer>,
    dt: f64,
    steps: i64,
    c: f64,
    flags: u32,
    traj: Option<&Buffer>,
    gx: Option<&Buffer>,
    gv: Option<&Buffer>,
    dx0: Option<&Buffer>,
    dv0: Option<&Buffer>,
    df: Option<&Buffer>,
    du: Option<&Buffer>,
    dw: Option<&Buffer>,
    stream: &Stream,
) -> Result<()> {
    let base = leapfrog_job(None, v0, f, u, w, mu, dt, steps, c, flags)?;
    let (dtype, b, d) = (base.dtype, base.b, base.d);
    if let Some(t) = traj {
        check_traj(t, dtype, base.steps, b, d)?;
    }
    let likes = [
        (gx, "gx"),
        (gv, "gv"),
        (dx0, "dx0"),
        (dv0, "dv0"),
        (df, "df"),
    ];
    check_likes(&likes, "v0", v0, dtype)?;
    check_param_grads(du, dw, u, dtype, "v0")?;
    let mut ins: Vec<Arg> = vec![(v0, "v0"), (u, "U"), (w, "W")];
    ins.extend(given(&[
        (f, "f"),
        (mu, "mu"),
        (traj, "traj"),
        (gx, "gx"),
        (gv, "gv"),
    ]));
    let outs = given(&[
        (dx0, "dx0"),
        (dv0, "dv0"),
        (df, "df"),
        (du, "dU"),
        (dw, "dW"),
    ]);
    check_common(v0.device(), &ins, &outs, &[], stream)?;
    let job = Job {
        gx: Addr::of_opt(gx),
        gv: Addr::of_opt(gv),
        traj: Addr::of_opt(traj),
        dx: Addr::of_opt(dx0),
        dv: Addr::of_opt(dv0),
        df: Addr::of_opt(df),
        du: Addr::of_opt(du),
        dw: Addr::of_opt(dw),
        ..base
    };
    dispatch(
        Kind::LeapfrogBackward,
        &job,
        v0,
        stream,
        !outs.is_empty() && d > 0,
    )
}
