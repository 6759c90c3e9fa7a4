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

use crate::buffer::{Buffer, check_same_device};
use crate::context::{Context, Device};
use crate::dtype::DType;
use crate::error::{
    FK_ERROR_ALIASING, FK_ERROR_BUFFER_TOO_SMALL, FK_ERROR_DTYPE_MISMATCH,
    FK_ERROR_INVALID_ARGUMENT, FK_ERROR_NULL_POINTER, FK_ERROR_SHAPE_MISMATCH,
    FK_ERROR_UNSUPPORTED, FK_ERROR_UNSUPPORTED_DTYPE, Result,
};
use crate::stream::Stream;

/// Validated inputs, as addresses the backends read.
#[derive(Debug, Clone, Copy)]
pub struct Inputs {
    pub dtype: DType,
    /// Number of points.
    pub b: i64,
    /// Number of Gaussians.
    pub n: i64,
    pub points: usize,
    pub means: usize,
    pub chol: usize,
    /// 0 for the Mahalanobis ops.
    pub weights: usize,
    pub eps: f64,
}

/// Backward outputs; 0 = not wanted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Grads {
    pub dpoints: usize,
    pub dmeans: usize,
    pub dchol: usize,
    pub dweights: usize,
}

impl Grads {
    pub fn any(&self) -> bool {
        self.dpoints != 0 || self.dmeans != 0 || self.dchol != 0 || self.dweights != 0
    }
    /// Whether any per-Gaussian sum (over points) is wanted.
    pub fn per_gaussian(&self) -> bool {
        self.dmeans != 0 || self.dchol != 0 || self.dweights != 0
    }
}

fn shape_str(s: &[i64]) -> String {
    format!("{s:?}")
}

fn check_dtype(buf: &Buffer, name: &str, dtype: DType) -> Result<()> {
    crate::ensure!(
        buf.dtype == dtype,
        FK_ERROR_DTYPE_MISMATCH,
        "{name} has dtype {} but points has dtype {dtype} (every buffer of the call must share it)",
        buf.dtype
    );
    Ok(())
}

fn check_shape(buf: &Buffer, name: &str, want: &[i64], form: &str) -> Result<()> {
    crate::ensure!(
        buf.shape.as_slice() == want,
        FK_ERROR_SHAPE_MISMATCH,
        "{name} has shape {} but must be {form} = {}",
        shape_str(&buf.shape),
        shape_str(want)
    );
    Ok(())
}

fn check_contiguous(buf: &Buffer, name: &str) -> Result<()> {
    crate::ensure!(
        buf.is_contiguous(),
        FK_ERROR_UNSUPPORTED,
        "{name} (shape {:?}, strides {:?}) is not contiguous; the Gaussian ops need row-major contiguous buffers (copy it with fk_copy first)",
        buf.shape,
        buf.strides
    );
    Ok(())
}

/// Checks the shared inputs; returns them with `B` and `N`.
fn inputs(
    points: &Buffer,
    means: &Buffer,
    chol: &Buffer,
    weights: Option<&Buffer>,
    eps: f64,
) -> Result<Inputs> {
    let dtype = points.dtype;
    crate::ensure!(
        matches!(dtype, DType::F32 | DType::F64),
        FK_ERROR_UNSUPPORTED_DTYPE,
        "points has dtype {dtype}; the Gaussian ops take f32 or f64"
    );
    check_dtype(means, "means", dtype)?;
    check_dtype(chol, "chol", dtype)?;
    if let Some(w) = weights {
        check_dtype(w, "weights", dtype)?;
    }
    crate::ensure!(
        points.shape.len() == 2 && points.shape[1] == 3,
        FK_ERROR_SHAPE_MISMATCH,
        "points has shape {} but must be [B, 3]",
        shape_str(&points.shape)
    );
    crate::ensure!(
        means.shape.len() == 2 && means.shape[1] == 3,
        FK_ERROR_SHAPE_MISMATCH,
        "means has shape {} but must be [N, 3]",
        shape_str(&means.shape)
    );
    let (b, n) = (points.shape[0], means.shape[0]);
    check_shape(chol, "chol", &[n, 3, 3], "[N, 3, 3] (N from means)")?;
    if let Some(w) = weights {
        check_shape(w, "weights", &[n], "[N] (N from means)")?;
    }
    check_contiguous(points, "points")?;
    check_contiguous(means, "means")?;
    check_contiguous(chol, "chol")?;
    if let Some(w) = weights {
        check_contiguous(w, "weights")?;
    }
    crate::ensure!(
        eps.is_finite() && eps >= 0.0,
        FK_ERROR_INVALID_ARGUMENT,
        "eps = {eps} must be finite and >= 0"
    );
    Ok(Inputs {
        dtype,
        b,
        n,
        points: points.data,
        means: means.data,
        chol: chol.data,
        weights: weights.map_or(0, |w| w.data),
        eps,
    })
}

/// Checks an output: dtype, shape, contiguity, writability, and no overlap with
/// any input or earlier output.
fn check_output(
    buf: &Buffer,
    name: &str,
    dtype: DType,
    want: &[i64],
    form: &str,
    others: &[(&Buffer, &str)],
) -> Result<()> {
    check_dtype(buf, name, dtype)?;
    check_shape(buf, name, want, form)?;
    check_contiguous(buf, name)?;
    buf.check_writable(name)?;
    for (o, oname) in others {
        crate::ensure!(
            !buf.overlaps(o),
            FK_ERROR_ALIASING,
            "{name} overlaps {oname}; outputs must not share memory with inputs or other outputs"
        );
    }
    Ok(())
}

fn devices(device: Device, bufs: &[(Option<&Buffer>, &str)], stream: &Stream) -> Result<()> {
    let present: Vec<(&Buffer, &str)> = bufs
        .iter()
        .filter_map(|(b, n)| b.map(|b| (b, *n)))
        .collect();
    check_same_device(device, &present)?;
    stream.check_device(device)
}

/// Bytes of workspace the backward ops need for `b` points and `n` Gaussians of
/// `dtype` on `ctx` (0 on the CPU, and whenever `b` or `n` is 0).
pub fn backward_workspace_bytes(ctx: &Context, dtype: DType, b: i64, n: i64) -> Result<usize> {
    crate::ensure!(
        matches!(dtype, DType::F32 | DType::F64),
        FK_ERROR_UNSUPPORTED_DTYPE,
        "dtype is {dtype}; the Gaussian ops take f32 or f64"
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

/// Checks the workspace of a backward call; returns its address (0 when none is
/// needed).
fn workspace_arg(
    ws: Option<&Buffer>,
    ctx: &Context,
    inp: &Inputs,
    others: &[(&Buffer, &str)],
) -> Result<usize> {
    let need = backward_workspace_bytes(ctx, inp.dtype, inp.b, inp.n)?;
    if need == 0 {
        return Ok(0);
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
    check_contiguous(ws, "workspace")?;
    ws.check_writable("workspace")?;
    crate::ensure!(
        ws.nbytes() >= need,
        FK_ERROR_BUFFER_TOO_SMALL,
        "workspace holds {} bytes but this call needs {need} (fk_gaussian_backward_workspace_size)",
        ws.nbytes()
    );
    for (o, oname) in others {
        crate::ensure!(
            !ws.overlaps(o),
            FK_ERROR_ALIASING,
            "workspace overlaps {oname}"
        );
    }
    Ok(ws.data)
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
    devices(
        device,
        &[
            (Some(means), "means"),
            (Some(chol), "chol"),
            (Some(out), "out"),
        ],
        stream,
    )?;
    let inp = inputs(points, means, chol, None, eps)?;
    check_output(
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
        Device::Cpu => crate::cpu::gaussian::mahalanobis_forward(&inp, out.data),
        Device::Cuda(_) => crate::cuda::gaussian::mahalanobis_forward(
            points.ctx.cuda_dev(),
            &inp,
            out.data,
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
    let device = points.device();
    devices(
        device,
        &[
            (Some(means), "means"),
            (Some(chol), "chol"),
            (Some(g), "g"),
            (dpoints, "dpoints"),
            (dmeans, "dmeans"),
            (dchol, "dchol"),
            (workspace, "workspace"),
        ],
        stream,
    )?;
    let inp = inputs(points, means, chol, None, eps)?;
    check_dtype(g, "g", inp.dtype)?;
    check_shape(
        g,
        "g",
        &[inp.b, inp.n],
        "[B, N] (B from points, N from means)",
    )?;
    check_contiguous(g, "g")?;
    let mut seen: Vec<(&Buffer, &str)> = vec![
        (points, "points"),
        (means, "means"),
        (chol, "chol"),
        (g, "g"),
    ];
    let grads = backward_outputs(&inp, dpoints, dmeans, dchol, None, &mut seen)?;
    if !grads.any() {
        return Ok(());
    }
    let ws = workspace_arg(workspace, &points.ctx, &inp, &seen)?;
    match device {
        Device::Cpu => crate::cpu::gaussian::mahalanobis_backward(&inp, g.data, &grads),
        Device::Cuda(_) => crate::cuda::gaussian::backward(
            points.ctx.cuda_dev(),
            &inp,
            false,
            g.data,
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
    seen: &mut Vec<(&'a Buffer, &'static str)>,
) -> Result<Grads> {
    let (b, n, d) = (inp.b, inp.n, inp.dtype);
    let mut grads = Grads::default();
    let specs: [(Option<&'a Buffer>, &'static str, Vec<i64>, &str); 4] = [
        (dpoints, "dpoints", vec![b, 3], "[B, 3] (B from points)"),
        (dmeans, "dmeans", vec![n, 3], "[N, 3] (N from means)"),
        (dchol, "dchol", vec![n, 3, 3], "[N, 3, 3] (N from means)"),
        (dweights, "dweights", vec![n], "[N] (N from means)"),
    ];
    for (i, (buf, name, shape, form)) in specs.into_iter().enumerate() {
        if let Some(buf) = buf {
            check_output(buf, name, d, &shape, form, seen)?;
            seen.push((buf, name));
            match i {
                0 => grads.dpoints = buf.data,
                1 => grads.dmeans = buf.data,
                2 => grads.dchol = buf.data,
                _ => grads.dweights = buf.data,
            }
        }
    }
    Ok(grads)
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
    devices(
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
    check_output(
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
        Device::Cpu => crate::cpu::gaussian::field_forward(&inp, out.data),
        Device::Cuda(_) => {
            crate::cuda::gaussian::field_forward(points.ctx.cuda_dev(), &inp, out.data, stream)
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
    let device = points.device();
    devices(
        device,
        &[
            (Some(means), "means"),
            (Some(chol), "chol"),
            (Some(weights), "weights"),
            (Some(dout), "dout"),
            (dpoints, "dpoints"),
            (dmeans, "dmeans"),
            (dchol, "dchol"),
            (dweights, "dweights"),
            (workspace, "workspace"),
        ],
        stream,
    )?;
    let inp = inputs(points, means, chol, Some(weights), eps)?;
    check_dtype(dout, "dout", inp.dtype)?;
    check_shape(dout, "dout", &[inp.b], "[B] (B from points)")?;
    check_contiguous(dout, "dout")?;
    let mut seen: Vec<(&Buffer, &str)> = vec![
        (points, "points"),
        (means, "means"),
        (chol, "chol"),
        (weights, "weights"),
        (dout, "dout"),
    ];
    let grads = backward_outputs(&inp, dpoints, dmeans, dchol, dweights, &mut seen)?;
    if !grads.any() {
        return Ok(());
    }
    let ws = workspace_arg(workspace, &points.ctx, &inp, &seen)?;
    match device {
        Device::Cpu => crate::cpu::gaussian::field_backward(&inp, dout.data, &grads),
        Device::Cuda(_) => crate::cuda::gaussian::backward(
            points.ctx.cuda_dev(),
            &inp,
            true,
            dout.data,
            &grads,
            ws,
            stream,
        ),
    }
}
