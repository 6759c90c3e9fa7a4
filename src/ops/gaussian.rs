//! The Gaussian field family (docs/ops.md section 3): validation, then dispatch.
//!
//! Inputs (f32 or f64, one dtype for every buffer of a call, row-major and
//! contiguous): `points [B,3]`, `means [N,3]`, `chol [N,3,3]` (lower-triangular
//! factor L, row-major; the strictly upper part is ignored), `weights [N]`, and
//! `eps` (finite, >= 0) added to the diagonal of L.
//!
//! - `mahalanobis_forward`: `out[b,n] = |(L_n + eps I)^-1 (p_b - mu_n)|^2`.
//! - `mahalanobis_backward`: given `g = dL/dm [B,N]`, any of `dpoints [B,3]`,
//!   `dmeans [N,3]`, `dchol [N,3,3]` (exact full lower triangle; the upper part
//!   is written as 0).
//! - `field_forward`: `out[b] = sum_n w_n exp(-0.5 m[b,n])`, fused.
//! - `field_backward`: given `dout = dL/dout [B]`, any of `dpoints`, `dmeans`,
//!   `dchol`, `dweights [N]`, fused (no `[B,N]` intermediate).
//!
//! Gradients overwrite their outputs (they are not accumulated into). The CUDA
//! backwards reduce over points and Gaussians deterministically through a
//! caller-provided workspace (`backward_workspace_bytes`); see docs/gaussian.md.

use crate::addr::Addr;
use crate::buffer::Buffer;
use crate::context::{Context, Device};
use crate::dtype::DType;
use crate::error::{
    FK_ERROR_BUFFER_TOO_SMALL, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_NULL_POINTER,
    FK_ERROR_UNSUPPORTED_DTYPE, Result,
};
use crate::ops::check::{self, Named};
use crate::plan::gaussian::{Grads, Inputs};
use crate::stream::Stream;

/// The element types of the Gaussian ops.
const DTYPES: [DType; 2] = [DType::F32, DType::F64];
const OPS: &str = "the Gaussian ops";

/// An input of the call's dtype (that of `points`), shape and contiguous.
fn input(buf: &Buffer, name: &str, dtype: DType, want: &[i64], form: &str) -> Result<()> {
    check::same_dtype(buf, name, dtype, "points")?;
    check::shape(buf, name, want, form)?;
    check::contiguous(buf, name)
}

/// Checks the shared inputs; returns them with `B` and `N`.
fn inputs(
    points: &Buffer,
    means: &Buffer,
    chol: &Buffer,
    weights: Option<&Buffer>,
    eps: f64,
) -> Result<Inputs> {
    let dtype = check::dtype_in(points, "points", &DTYPES, OPS)?;
    check::same_dtype(means, "means", dtype, "points")?;
    check::same_dtype(chol, "chol", dtype, "points")?;
    if let Some(w) = weights {
        check::same_dtype(w, "weights", dtype, "points")?;
    }
    let b = check::shape_like(points, "points", &[None, Some(3)], "[B, 3]")?[0];
    let n = check::shape_like(means, "means", &[None, Some(3)], "[N, 3]")?[0];
    check::shape(chol, "chol", &[n, 3, 3], "[N, 3, 3] (N from means)")?;
    if let Some(w) = weights {
        check::shape(w, "weights", &[n], "[N] (N from means)")?;
    }
    check::contiguous(points, "points")?;
    check::contiguous(means, "means")?;
    check::contiguous(chol, "chol")?;
    if let Some(w) = weights {
        check::contiguous(w, "weights")?;
    }
    check::finite_nonneg(eps, "eps")?;
    Ok(Inputs {
        dtype,
        b,
        n,
        points: Addr::of(points),
        means: Addr::of(means),
        chol: Addr::of(chol),
        weights: Addr::of_opt(weights),
        eps,
    })
}

/// Checks an output: dtype, shape, contiguity, writability, and no overlap with
/// any input or earlier output.
fn output(
    buf: &Buffer,
    name: &str,
    dtype: DType,
    want: &[i64],
    form: &str,
    others: &[Named],
) -> Result<()> {
    check::dense_output(buf, name, (dtype, "points"), (want, form), others)
}

/// Bytes of workspace the backward ops need for `b` points and `n` Gaussians of
/// `dtype` on `ctx` (0 on the CPU, and whenever `b` or `n` is 0).
pub fn backward_workspace_bytes(ctx: &Context, dtype: DType, b: i64, n: i64) -> Result<usize> {
    crate::ensure!(
        DTYPES.contains(&dtype),
        FK_ERROR_UNSUPPORTED_DTYPE,
        "dtype is {dtype}; {OPS} take f32 or f64"
    );
    crate::ensure!(
        b >= 0 && n >= 0,
        FK_ERROR_INVALID_ARGUMENT,
        "B = {b} and N = {n} must be >= 0"
    );
    Ok(match ctx.device {
        Device::Cpu => 0,
        Device::Cuda(_) => crate::cuda::gaussian::workspace_bytes(dtype, b, n),
    })
}

/// Checks the workspace of a backward call; returns its address (`None` when none
/// is needed).
fn workspace_arg(
    ws: Option<&Buffer>,
    ctx: &Context,
    inp: &Inputs,
    others: &[Named],
) -> Result<Option<Addr>> {
    let need = backward_workspace_bytes(ctx, inp.dtype, inp.b, inp.n)?;
    if need == 0 {
        return Ok(None);
    }
    let Some(ws) = ws else {
        crate::bail!(
            FK_ERROR_NULL_POINTER,
            "workspace is NULL but this call needs {need} bytes of it on {} for B = {}, N = {} ({}); get the size from fk_gaussian_backward_workspace_size",
            ctx.device,
            inp.b,
            inp.n,
            inp.dtype
        );
    };
    check::contiguous(ws, "workspace")?;
    ws.check_writable("workspace")?;
    crate::ensure!(
        ws.nbytes() >= need,
        FK_ERROR_BUFFER_TOO_SMALL,
        "workspace holds {} bytes but this call needs {need} (fk_gaussian_backward_workspace_size)",
        ws.nbytes()
    );
    check::disjoint(ws, "workspace", others)?;
    Ok(Addr::of(ws))
}

/// `out[b,n] = |(L_n + eps I)^-1 (p_b - mu_n)|^2`.
pub fn mahalanobis_forward(
    points: &Buffer,
    means: &Buffer,
    chol: &Buffer,
    eps: f64,
    out: &Buffer,
    stream: &Stream,
) -> Result<()> {
    let device = points.device();
    check::devices(
        device,
        &[
            (Some(means), "means"),
            (Some(chol), "chol"),
            (Some(out), "out"),
        ],
        stream,
    )?;
    let inp = inputs(points, means, chol, None, eps)?;
    output(
        out,
        "out",
        inp.dtype,
        &[inp.b, inp.n],
        "[B, N] (B from points, N from means)",
        &[(points, "points"), (means, "means"), (chol, "chol")],
    )?;
    if inp.b == 0 || inp.n == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => crate::cpu::gaussian::mahalanobis_forward(&inp, Addr::of(out)),
        Device::Cuda(_) => crate::cuda::gaussian::mahalanobis_forward(
            points.ctx.cuda_dev(),
            &inp,
            Addr::of(out),
            stream,
        ),
    }
}

/// Backward of `mahalanobis_forward` given `g = dL/dm [B,N]`.
#[allow(clippy::too_many_arguments)]
pub fn mahalanobis_backward(
    points: &Buffer,
    means: &Buffer,
    chol: &Buffer,
    eps: f64,
    g: &Buffer,
    dpoints: Option<&Buffer>,
    dmeans: Option<&Buffer>,
    dchol: Option<&Buffer>,
    workspace: Option<&Buffer>,
    stream: &Stream,
) -> Result<()> {
    backward(
        Backward {
            points,
            means,
            chol,
            weights: None,
            eps,
            g,
            dpoints,
            dmeans,
            dchol,
            dweights: None,
            workspace,
        },
        stream,
    )
}

/// The arguments of a backward: `weights` (and `dweights`) present for the field
/// backward, whose `g` is `dout [B]`; absent for the Mahalanobis one (`g [B,N]`).
struct Backward<'a> {
    points: &'a Buffer,
    means: &'a Buffer,
    chol: &'a Buffer,
    weights: Option<&'a Buffer>,
    eps: f64,
    g: &'a Buffer,
    dpoints: Option<&'a Buffer>,
    dmeans: Option<&'a Buffer>,
    dchol: Option<&'a Buffer>,
    dweights: Option<&'a Buffer>,
    workspace: Option<&'a Buffer>,
}

/// Validates and runs either backward.
fn backward(a: Backward, stream: &Stream) -> Result<()> {
    let field = a.weights.is_some();
    let gname = if field { "dout" } else { "g" };
    let device = a.points.device();
    check::devices(
        device,
        &[
            (Some(a.means), "means"),
            (Some(a.chol), "chol"),
            (a.weights, "weights"),
            (Some(a.g), gname),
            (a.dpoints, "dpoints"),
            (a.dmeans, "dmeans"),
            (a.dchol, "dchol"),
            (a.dweights, "dweights"),
            (a.workspace, "workspace"),
        ],
        stream,
    )?;
    let inp = inputs(a.points, a.means, a.chol, a.weights, a.eps)?;
    if field {
        input(a.g, gname, inp.dtype, &[inp.b], "[B] (B from points)")?;
    } else {
        let form = "[B, N] (B from points, N from means)";
        input(a.g, gname, inp.dtype, &[inp.b, inp.n], form)?;
    }
    let mut seen: Vec<Named> = vec![(a.points, "points"), (a.means, "means"), (a.chol, "chol")];
    if let Some(w) = a.weights {
        seen.push((w, "weights"));
    }
    seen.push((a.g, gname));
    let grads = backward_outputs(&inp, a.dpoints, a.dmeans, a.dchol, a.dweights, &mut seen)?;
    if !grads.any() {
        return Ok(());
    }
    let ws = workspace_arg(a.workspace, &a.points.ctx, &inp, &seen)?;
    let g = Addr::of(a.g);
    match device {
        Device::Cpu if field => crate::cpu::gaussian::field_backward(&inp, g, &grads),
        Device::Cpu => crate::cpu::gaussian::mahalanobis_backward(&inp, g, &grads),
        Device::Cuda(_) => crate::cuda::gaussian::backward(
            a.points.ctx.cuda_dev(),
            &inp,
            field,
            g,
            &grads,
            ws,
            stream,
        ),
    }
}

/// Validates the optional gradient outputs, adding each to `seen`.
fn backward_outputs<'a>(
    inp: &Inputs,
    dpoints: Option<&'a Buffer>,
    dmeans: Option<&'a Buffer>,
    dchol: Option<&'a Buffer>,
    dweights: Option<&'a Buffer>,
    seen: &mut Vec<Named<'a>>,
) -> Result<Grads> {
    let (b, n) = (inp.b, inp.n);
    let mut grad = |buf: Option<&'a Buffer>, name: &'static str, want: &[i64], form: &str| {
        let Some(buf) = buf else {
            return Ok(None);
        };
        output(buf, name, inp.dtype, want, form, seen)?;
        seen.push((buf, name));
        Ok::<_, crate::error::Error>(Addr::of(buf))
    };
    // (in this order: an overlap names the later of the two)
    Ok(Grads {
        dpoints: grad(dpoints, "dpoints", &[b, 3], "[B, 3] (B from points)")?,
        dmeans: grad(dmeans, "dmeans", &[n, 3], "[N, 3] (N from means)")?,
        dchol: grad(dchol, "dchol", &[n, 3, 3], "[N, 3, 3] (N from means)")?,
        dweights: grad(dweights, "dweights", &[n], "[N] (N from means)")?,
    })
}

/// `out[b] = sum_n w_n exp(-0.5 m[b,n])`, fused.
pub fn field_forward(
    points: &Buffer,
    means: &Buffer,
    chol: &Buffer,
    weights: &Buffer,
    eps: f64,
    out: &Buffer,
    stream: &Stream,
) -> Result<()> {
    let device = points.device();
    check::devices(
        device,
        &[
            (Some(means), "means"),
            (Some(chol), "chol"),
            (Some(weights), "weights"),
            (Some(out), "out"),
        ],
        stream,
    )?;
    let inp = inputs(points, means, chol, Some(weights), eps)?;
    output(
        out,
        "out",
        inp.dtype,
        &[inp.b],
        "[B] (B from points)",
        &[
            (points, "points"),
            (means, "means"),
            (chol, "chol"),
            (weights, "weights"),
        ],
    )?;
    if inp.b == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => crate::cpu::gaussian::field_forward(&inp, Addr::of(out)),
        Device::Cuda(_) => {
            crate::cuda::gaussian::field_forward(points.ctx.cuda_dev(), &inp, Addr::of(out), stream)
        }
    }
}

/// Backward of `field_forward` given `dout = dL/dout [B]`, fused.
#[allow(clippy::too_many_arguments)]
pub fn field_backward(
    points: &Buffer,
    means: &Buffer,
    chol: &Buffer,
    weights: &Buffer,
    eps: f64,
    dout: &Buffer,
    dpoints: Option<&Buffer>,
    dmeans: Option<&Buffer>,
    dchol: Option<&Buffer>,
    dweights: Option<&Buffer>,
    workspace: Option<&Buffer>,
    stream: &Stream,
) -> Result<()> {
    backward(
        Backward {
            points,
            means,
            chol,
            weights: Some(weights),
            eps,
            g: dout,
            dpoints,
            dmeans,
            dchol,
            dweights,
            workspace,
        },
        stream,
    )
}
