//! XLA handlers of the multi-layer perceptron (docs/ops.md section 6): the whole
//! network's forward and backward, one call each way (fk_mlp_forward /
//! fk_mlp_backward). Attributes everywhere: `n_layers` (`L`, 1 to
//! `FK_MLP_MAX_LAYERS`), `hidden_act`, `out_act` (`FK_ACT_*`), `flags`
//! (`FK_GEMM_ALLOW_TF32`, 0 when absent).
//!
//! - `mlp_forward`: operands `x`, the `L` weights, then the biases of the layers
//!   whose bit is set in the attribute `bias_mask` (bit `i`: layer `i` has a bias;
//!   0 when absent), in layer order; results `y` and `saved` (at least
//!   `fk_xla_mlp_saved_bytes` bytes, any dtype of the call). Capturable: with
//!   `saved` given the forward allocates nothing.
//! - `mlp_backward`: operands `dy`, `x`, the `L` weights, `saved`; results `dx`
//!   when the attribute `want_dx` is 1 (default 1), then the weight gradients of
//!   the layers set in `dw_mask`, then the bias gradients of the layers set in
//!   `db_mask` (each in layer order; both masks 0 when absent), and last
//!   `workspace`, the call's scratch (at least `fk_xla_mlp_workspace_bytes` bytes,
//!   any dtype of the call; empty on the CPU). Capturable: with `workspace` given
//!   the backward allocates nothing.

use super::linalg::act_value;
use super::{Call, Graph::Capturable, Platform, context, handlers};
use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{FK_ERROR_INVALID_ARGUMENT, FK_ERROR_NULL_POINTER, Result, fk_status};
use crate::ops::mlp;
use crate::plan::linalg::Activation;
use crate::plan::mlp::MAX_LAYERS;

fn n_layers(c: &Call) -> Result<usize> {
    let v = c.attr_i64("n_layers")?;
    crate::ensure!(
        i32::try_from(v).is_ok(),
        FK_ERROR_INVALID_ARGUMENT,
        "n_layers = {v} is outside 1..={MAX_LAYERS} (FK_MLP_MAX_LAYERS)"
    );
    mlp::check_n_layers(v as i32)
}

fn acts(c: &Call) -> Result<(Activation, Activation)> {
    Ok((
        act_value(c.attr_i64("hidden_act")?, "hidden_act")?,
        act_value(c.attr_i64("out_act")?, "out_act")?,
    ))
}

/// The layer bit mask `name` (0 when absent): no bit at or above `l`.
fn mask(c: &Call, name: &str, l: usize) -> Result<u64> {
    let m = c.attr_i64_or(name, Some(0))? as u64;
    crate::ensure!(
        l >= 64 || m >> l == 0,
        FK_ERROR_INVALID_ARGUMENT,
        "{name} = {m:#x} has a bit at or above n_layers = {l}"
    );
    Ok(m)
}

fn has(m: u64, i: usize) -> bool {
    m >> i & 1 == 1
}

fn mlp_forward(c: &Call) -> Result<()> {
    let l = n_layers(c)?;
    let (hidden, out) = acts(c)?;
    let flags = c.attr_flags("flags")?;
    let bias = mask(c, "bias_mask", l)?;
    let na = 1 + l + bias.count_ones() as usize;
    c.expect((na, na), (2, 2))?;
    let mut ops = c.operands();
    let x = ops.next("x")?;
    let mut w = Vec::with_capacity(l);
    for i in 0..l {
        w.push(ops.next(&format!("weights[{i}]"))?);
    }
    let mut b = Vec::with_capacity(l);
    for i in 0..l {
        b.push(ops.opt(has(bias, i), &format!("biases[{i}]"))?);
    }
    let (y, saved) = (c.ret(0, "y")?, c.ret(1, "saved")?);
    let w: Vec<&Buffer> = w.iter().collect();
    let b: Vec<Option<&Buffer>> = b.iter().map(Option::as_ref).collect();
    mlp::forward(&x, &w, &b, hidden, out, flags, &y, Some(&saved), &c.stream)
}

fn mlp_backward(c: &Call) -> Result<()> {
    let l = n_layers(c)?;
    let (hidden, out) = acts(c)?;
    let flags = c.attr_flags("flags")?;
    let want_dx = c.attr_bool("want_dx", true)?;
    let (dwm, dbm) = (mask(c, "dw_mask", l)?, mask(c, "db_mask", l)?);
    let nr = want_dx as usize + (dwm.count_ones() + dbm.count_ones()) as usize + 1;
    c.expect((3 + l, 3 + l), (nr, nr))?;
    let (dy, x) = (c.arg(0, "dy")?, c.arg(1, "x")?);
    let w = (0..l)
        .map(|i| c.arg(2 + i, &format!("weights[{i}]")))
        .collect::<Result<Vec<_>>>()?;
    let saved = c.arg(2 + l, "saved")?;
    let mut rets = c.results();
    let dx = rets.opt(want_dx, "dx")?;
    let mut dw = Vec::with_capacity(l);
    for i in 0..l {
        dw.push(rets.opt(has(dwm, i), &format!("dweights[{i}]"))?);
    }
    let mut db = Vec::with_capacity(l);
    for i in 0..l {
        db.push(rets.opt(has(dbm, i), &format!("dbiases[{i}]"))?);
    }
    let ws = c.workspace(nr - 1)?;
    let w: Vec<&Buffer> = w.iter().collect();
    let dw: Vec<Option<&Buffer>> = dw.iter().map(Option::as_ref).collect();
    let db: Vec<Option<&Buffer>> = db.iter().map(Option::as_ref).collect();
    mlp::backward(
        &dy,
        &x,
        &w,
        hidden,
        out,
        flags,
        Some(&saved),
        dx.as_ref(),
        &dw,
        &db,
        ws.as_ref(),
        &c.stream,
    )
}

/// Bytes of the `saved` result of the `mlp_forward` handler (and operand of
/// `mlp_backward`) on `kind` (`FK_DEVICE_CPU` / `FK_DEVICE_CUDA`), for `n_layers`
/// layers of `widths` (`n_layers + 1` entries: `k_0, n_0, ..., n_{L-1}`) over
/// `rows` rows of `dtype` with the activations `hidden_act` / `out_act`, written to
/// `*bytes`: the number `fk_mlp_saved_size` gives on a context of that kind, with
/// its checks and statuses, and no device opened.
///
/// # Safety
/// `widths` is NULL or holds `n_layers + 1` entries; `bytes` is NULL or writable.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn fk_xla_mlp_saved_bytes(
    kind: crate::context::fk_device_kind,
    n_layers: i32,
    widths: *const i64,
    rows: i64,
    dtype: crate::dtype::fk_dtype,
    hidden_act: i32,
    out_act: i32,
    bytes: *mut usize,
) -> fk_status {
    crate::abi::guard("fk_xla_mlp_saved_bytes", || {
        super::platform_of(kind)?;
        let l = mlp::check_n_layers(n_layers)?;
        crate::ensure!(!widths.is_null(), FK_ERROR_NULL_POINTER, "widths is NULL");
        // SAFETY: the caller's array of n_layers + 1 widths.
        let widths = unsafe { std::slice::from_raw_parts(widths, l + 1) };
        let d = DType::from_abi(dtype, "dtype")?;
        let (h, o) = (
            act_value(hidden_act as i64, "hidden_act")?,
            act_value(out_act as i64, "out_act")?,
        );
        // The layout is the same on both backends today (ops::mlp::saved_size reads
        // no property of its context), so the CPU context answers for CUDA too,
        // without opening a device.
        let v = mlp::saved_size(&*context(Platform::Cpu, 0)?, widths, rows, d, h, o)?;
        crate::ensure!(!bytes.is_null(), FK_ERROR_NULL_POINTER, "bytes is NULL");
        // SAFETY: non-NULL out-parameter of the caller.
        unsafe { bytes.write(v) };
        Ok(())
    })
}

/// Bytes of the `workspace` result of the `mlp_backward` handler on `kind`
/// (`FK_DEVICE_CPU`: 0; `FK_DEVICE_CUDA`: enough for either CUDA path and any
/// gradients wanted, on any device), for `n_layers` layers of `widths` (`n_layers +
/// 1` entries: `k_0, n_0, ..., n_{L-1}`) over `rows` rows of `dtype`, written to
/// `*bytes`. No device is opened.
///
/// # Safety
/// `widths` is NULL or holds `n_layers + 1` entries; `bytes` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_xla_mlp_workspace_bytes(
    kind: crate::context::fk_device_kind,
    n_layers: i32,
    widths: *const i64,
    rows: i64,
    dtype: crate::dtype::fk_dtype,
    bytes: *mut usize,
) -> fk_status {
    crate::abi::guard("fk_xla_mlp_workspace_bytes", || {
        let p = super::platform_of(kind)?;
        let l = mlp::check_n_layers(n_layers)?;
        crate::ensure!(!widths.is_null(), FK_ERROR_NULL_POINTER, "widths is NULL");
        // SAFETY: the caller's array of n_layers + 1 widths.
        let widths = unsafe { std::slice::from_raw_parts(widths, l + 1) };
        let d = DType::from_abi(dtype, "dtype")?;
        crate::ensure!(
            rows >= 0 && widths.iter().all(|&w| w >= 0),
            FK_ERROR_INVALID_ARGUMENT,
            "rows = {rows} and widths = {widths:?} must not be negative"
        );
        let v = match p {
            Platform::Cpu => 0,
            Platform::Cuda => crate::cuda::linalg::mlp_backward_workspace_bytes(widths, rows, d),
        };
        crate::ensure!(!bytes.is_null(), FK_ERROR_NULL_POINTER, "bytes is NULL");
        // SAFETY: non-NULL out-parameter of the caller.
        unsafe { bytes.write(v) };
        Ok(())
    })
}

handlers! {
    /// Forward of a multi-layer perceptron (fk_mlp_forward), with `saved`.
    "mlp_forward": fk_xla_mlp_forward_cpu, fk_xla_mlp_forward_cuda, Capturable, mlp_forward;
    /// Backward of the multi-layer perceptron (fk_mlp_backward).
    "mlp_backward": fk_xla_mlp_backward_cpu, fk_xla_mlp_backward_cuda, Capturable, mlp_backward;
}
