//! The multi-layer perceptron (docs/ops.md section 6): validation, the layout of
//! the `saved` buffer, then dispatch.
//!
//! Layer `i` of `L` computes `h_{i+1} = act_i(h_i W_i^T + b_i)` with `h_0 = x`,
//! `act_i` the hidden activation below the last layer and the output activation
//! on it. Widths: `k_0` (x's features), `n_i` (rows of `W_i`), `k_{i+1} = n_i`.
//!
//! `saved` (opaque to callers) holds, per layer, what the backward needs of it
//! (`SavedLayout`): the activation's derivative information (a bit mask for ReLU,
//! the pre-activation for the GELUs, nothing for none) and the hidden activation
//! `h_{i+1}` the next layer's weight gradient reads.

use crate::addr::Addr;
use crate::buffer::Buffer;
use crate::context::{Context, Device};
use crate::dtype::DType;
use crate::error::{
    FK_ERROR_BUFFER_TOO_SMALL, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_NULL_POINTER,
    FK_ERROR_SHAPE_MISMATCH, Result,
};
use crate::ops::check::{self, Named};
use crate::ops::linalg::{gemm_flags, int32, rows_of, with_last};
use crate::plan::linalg::Activation;
use crate::plan::mlp::{Layer, MAX_LAYERS, MlpPlan, SAVED_ALIGN, SavedLayout, layer_acts};
use crate::stream::Stream;

fn mlp_dtype(d: DType, what: &str) -> Result<()> {
    crate::ensure!(
        matches!(d, DType::F16 | DType::BF16 | DType::F32),
        crate::error::FK_ERROR_UNSUPPORTED_DTYPE,
        "{what} has dtype {d}; the MLP ops take f16, bf16 or f32 (f32 accumulation)"
    );
    Ok(())
}

fn n_layers_arg(n: i32) -> Result<usize> {
    crate::ensure!(
        n >= 1 && n as usize <= MAX_LAYERS,
        FK_ERROR_INVALID_ARGUMENT,
        "n_layers = {n} is outside 1..={MAX_LAYERS} (FK_MLP_MAX_LAYERS)"
    );
    Ok(n as usize)
}

/// Bytes of `saved` for an MLP of `widths` (`n_layers + 1` entries) over `rows`
/// rows on `ctx` (`fk_mlp_saved_size`).
pub fn saved_size(
    _ctx: &Context,
    widths: &[i64],
    rows: i64,
    dtype: DType,
    hidden: Activation,
    out: Activation,
) -> Result<usize> {
    let l = widths.len() - 1;
    mlp_dtype(dtype, "dtype")?;
    crate::ensure!(
        rows >= 0,
        FK_ERROR_INVALID_ARGUMENT,
        "rows = {rows} must be >= 0"
    );
    for (i, &w) in widths.iter().enumerate() {
        crate::ensure!(
            w >= 0,
            FK_ERROR_INVALID_ARGUMENT,
            "widths[{i}] = {w} must be >= 0"
        );
    }
    Ok(SavedLayout::new(widths, rows, dtype, &layer_acts(l, hidden, out))?.bytes)
}

/// Checks `n_layers` for the size query (`fk_mlp_saved_size` reads `n_layers + 1`
/// widths once it is valid).
pub fn check_n_layers(n: i32) -> Result<usize> {
    n_layers_arg(n)
}

/// The shape of the network: `rows`, `widths` and the leading shape of `x`.
struct Net {
    rows: i64,
    widths: Vec<i64>,
}

/// `x` and the weights chain: `weights[i]` is `[n_i, k_i]` with `k_0` x's last
/// dimension and `k_{i+1} = n_i`; biases (each optional) are `[n_i]`.
fn chain(
    x: &Buffer,
    weights: &[&Buffer],
    biases: &[Option<&Buffer>],
    bias_name: &str,
) -> Result<Net> {
    mlp_dtype(x.dtype, "x")?;
    let (rows, k0) = rows_of(x, "x")?;
    let mut widths = vec![k0];
    for (i, w) in weights.iter().enumerate() {
        let name = format!("weights[{i}]");
        check::same_dtype(w, &name, x.dtype, "x")?;
        crate::ensure!(
            w.shape.len() == 2,
            FK_ERROR_SHAPE_MISMATCH,
            "{name} has shape {:?}; layer {i}'s weight must be [out_features, in_features]",
            w.shape
        );
        let k = widths[i];
        let from = if i == 0 {
            format!("x {:?} has {k} features", x.shape)
        } else {
            format!("layer {} gives {k}", i - 1)
        };
        crate::ensure!(
            w.shape[1] == k,
            FK_ERROR_SHAPE_MISMATCH,
            "{name} has shape {:?} but layer {i} takes {k} inputs ({from})",
            w.shape
        );
        widths.push(w.shape[0]);
    }
    for (i, b) in biases.iter().enumerate() {
        let Some(b) = b else { continue };
        let name = format!("{bias_name}[{i}]");
        check::same_dtype(b, &name, x.dtype, "x")?;
        let n = widths[i + 1];
        crate::ensure!(
            b.shape.as_slice() == [n],
            FK_ERROR_SHAPE_MISMATCH,
            "{name} has shape {:?} but layer {i} has {n} outputs (weights[{i}] is {:?}): it must be [{n}]",
            b.shape,
            weights[i].shape
        );
    }
    Ok(Net { rows, widths })
}

/// `out` (`y`, or `dy` with `what` ", the shape of y") has `x`'s dtype and the
/// network's output shape: `x`'s leading shape and the last layer's width.
fn net_output(out: &Buffer, name: &str, what: &str, x: &Buffer, net: &Net) -> Result<()> {
    check::same_dtype(out, name, x.dtype, "x")?;
    let l = net.widths.len() - 1;
    let want = with_last(&x.shape, net.widths[l]);
    crate::ensure!(
        out.shape == want,
        FK_ERROR_SHAPE_MISMATCH,
        "{name} has shape {:?} but must be {want:?}{what} (x's leading shape {:?}, layer {} gives {})",
        out.shape,
        &x.shape[..x.shape.len() - 1],
        l - 1,
        net.widths[l]
    );
    Ok(())
}

/// Fills each layer's saved addresses from the layout (`saved` `None`: inference).
fn layers_of(
    net: &Net,
    acts: &[Activation],
    layout: Option<(&SavedLayout, Addr)>,
    weights: &[&Buffer],
) -> Vec<Layer> {
    acts.iter()
        .enumerate()
        .map(|(i, &act)| {
            // SAFETY: `saved_arg` checked that saved holds the whole layout, so
            // every region lies inside it.
            let at = |off: Option<u64>| {
                layout.and_then(|(_, base)| off.map(|o| unsafe { base.byte_add(o) }))
            };
            let sl = layout.map(|(l, _)| l.layers[i]);
            Layer {
                k: net.widths[i],
                n: net.widths[i + 1],
                act,
                w: Addr::of(weights[i]),
                bias: None,
                aux: at(sl.and_then(|s| s.aux)),
                aux_ld: sl.map_or(0, |s| s.aux_ld),
                hidden: at(sl.and_then(|s| s.hidden)),
                dw: None,
                db: None,
            }
        })
        .collect()
}

/// Checks `saved` against the layout: large enough, contiguous, aligned. Its
/// address is `None` only for an empty buffer, which only an empty layout accepts.
fn saved_arg(
    saved: &Buffer,
    layout: &SavedLayout,
    net: &Net,
    dtype: DType,
) -> Result<Option<Addr>> {
    check::contiguous(saved, "saved")?;
    crate::ensure!(
        saved.nbytes() >= layout.bytes,
        FK_ERROR_BUFFER_TOO_SMALL,
        "saved holds {} bytes but this call needs {} (fk_mlp_saved_size for rows = {}, widths = {:?}, dtype {dtype})",
        saved.nbytes(),
        layout.bytes,
        net.rows,
        net.widths
    );
    let base = Addr::of(saved);
    crate::ensure!(
        base.is_none_or(|a| a.get() % SAVED_ALIGN as u64 == 0),
        FK_ERROR_INVALID_ARGUMENT,
        "saved starts at {:#x}, which is not a multiple of {SAVED_ALIGN} bytes (buffers from fk_buffer_create are)",
        crate::addr::raw(base)
    );
    Ok(base)
}

/// Rows and sizes fit cuBLAS's `int`.
fn cuda_sizes(net: &Net) -> Result<()> {
    int32(net.rows, "rows (the leading dimensions of x multiplied)")?;
    for (i, &w) in net.widths.iter().enumerate() {
        int32(w, &format!("widths[{i}]"))?;
    }
    Ok(())
}

fn named<'a>(
    bufs: &[Option<&'a Buffer>],
    names: &'a [String],
) -> Vec<(Option<&'a Buffer>, &'a str)> {
    bufs.iter()
        .zip(names)
        .map(|(b, n)| (*b, n.as_str()))
        .collect()
}

fn indexed(base: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{base}[{i}]")).collect()
}

/// `out` is contiguous, writable and overlaps none of `others` (first overlap
/// named).
fn output(out: &Buffer, name: &str, others: &[Named]) -> Result<()> {
    check::contiguous(out, name)?;
    out.check_writable(name)?;
    check::disjoint(out, name, others)
}

/// The plan of `x` through `layers`, with `y`, `dy` and `dx` absent (the forward
/// names `y`, the backward `dy` and `dx`).
fn plan(x: &Buffer, net: &Net, tf32: bool, layers: Vec<Layer>) -> MlpPlan {
    MlpPlan {
        dtype: x.dtype,
        rows: net.rows,
        allow_tf32: tf32 && x.dtype == DType::F32,
        layers,
        x: Addr::of(x),
        y: None,
        dy: None,
        dx: None,
        workspace: None,
    }
}

/// The forward (`fk_mlp_forward`).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    x: &Buffer,
    weights: &[&Buffer],
    biases: &[Option<&Buffer>],
    hidden_act: Activation,
    out_act: Activation,
    flags: u32,
    y: &Buffer,
    saved: Option<&Buffer>,
    stream: &Stream,
) -> Result<()> {
    let l = weights.len();
    let device = y.device();
    let tf32 = gemm_flags(flags)?;
    let (wn, bn) = (indexed("weights", l), indexed("biases", l));
    let mut devs = vec![(Some(x), "x"), (saved, "saved")];
    devs.extend(named(
        &weights.iter().map(|w| Some(*w)).collect::<Vec<_>>(),
        &wn,
    ));
    devs.extend(named(biases, &bn));
    check::devices(device, &devs, stream)?;
    let net = chain(x, weights, biases, "biases")?;
    net_output(y, "y", "", x, &net)?;
    let mut inputs: Vec<Named> = vec![(x, "x")];
    inputs.extend(weights.iter().zip(&wn).map(|(w, n)| (*w, n.as_str())));
    inputs.extend(
        biases
            .iter()
            .zip(&bn)
            .filter_map(|(b, n)| b.map(|b| (b, n.as_str()))),
    );
    for &(b, name) in &inputs {
        check::contiguous(b, name)?;
    }
    output(y, "y", &inputs)?;
    let acts = layer_acts(l, hidden_act, out_act);
    let layout = SavedLayout::new(&net.widths, net.rows, x.dtype, &acts)?;
    let saved_base = match saved {
        Some(s) => {
            s.check_writable("saved")?;
            let base = saved_arg(s, &layout, &net, x.dtype)?;
            inputs.push((y, "y"));
            output(s, "saved", &inputs)?;
            base.map(|b| (&layout, b))
        }
        None => None,
    };
    if net.rows == 0 || net.widths[l] == 0 && saved.is_none() {
        return Ok(());
    }
    let mut layers = layers_of(&net, &acts, saved_base, weights);
    for (layer, b) in layers.iter_mut().zip(biases) {
        layer.bias = Addr::of_opt(*b);
    }
    let p = MlpPlan {
        y: Addr::of(y),
        ..plan(x, &net, tf32, layers)
    };
    match device {
        Device::Cpu => crate::cpu::mlp::forward(&p),
        Device::Cuda(_) => {
            cuda_sizes(&net)?;
            crate::cuda::linalg::mlp_forward(y.ctx.cuda_dev(), &p, stream)
        }
    }
}

/// The backward (`fk_mlp_backward`).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    dy: &Buffer,
    x: &Buffer,
    weights: &[&Buffer],
    hidden_act: Activation,
    out_act: Activation,
    flags: u32,
    saved: Option<&Buffer>,
    dx: Option<&Buffer>,
    dweights: &[Option<&Buffer>],
    dbiases: &[Option<&Buffer>],
    workspace: Option<&Buffer>,
    stream: &Stream,
) -> Result<()> {
    let l = weights.len();
    let device = dy.device();
    let tf32 = gemm_flags(flags)?;
    let (wn, dwn, dbn) = (
        indexed("weights", l),
        indexed("dweights", l),
        indexed("dbiases", l),
    );
    let mut devs = vec![
        (Some(x), "x"),
        (saved, "saved"),
        (dx, "dx"),
        (workspace, "workspace"),
    ];
    devs.extend(named(
        &weights.iter().map(|w| Some(*w)).collect::<Vec<_>>(),
        &wn,
    ));
    devs.extend(named(dweights, &dwn));
    devs.extend(named(dbiases, &dbn));
    check::devices(device, &devs, stream)?;
    let net = chain(x, weights, dbiases, "dbiases")?;
    net_output(dy, "dy", ", the shape of y", x, &net)?;
    if let Some(g) = dx {
        check::same_dtype(g, "dx", x.dtype, "x")?;
        crate::ensure!(
            g.shape == x.shape,
            FK_ERROR_SHAPE_MISMATCH,
            "dx has shape {:?} but x has {:?}",
            g.shape,
            x.shape
        );
    }
    for (i, g) in dweights.iter().enumerate() {
        let Some(g) = g else { continue };
        check::same_dtype(g, &dwn[i], x.dtype, "x")?;
        crate::ensure!(
            g.shape == weights[i].shape,
            FK_ERROR_SHAPE_MISMATCH,
            "dweights[{i}] has shape {:?} but weights[{i}] has {:?}",
            g.shape,
            weights[i].shape
        );
    }
    let acts = layer_acts(l, hidden_act, out_act);
    let layout = SavedLayout::new(&net.widths, net.rows, x.dtype, &acts)?;
    let mut inputs: Vec<Named> = vec![(dy, "dy"), (x, "x")];
    inputs.extend(weights.iter().zip(&wn).map(|(w, n)| (*w, n.as_str())));
    let saved_base = match saved {
        _ if layout.bytes == 0 => None,
        None => crate::bail!(
            FK_ERROR_NULL_POINTER,
            "saved is NULL but the backward of this network ({} layers, hidden_act = {}, out_act = {}) needs the {} bytes fk_mlp_forward saved",
            l,
            hidden_act.name(),
            out_act.name(),
            layout.bytes
        ),
        Some(s) => {
            let base = saved_arg(s, &layout, &net, x.dtype)?;
            inputs.push((s, "saved"));
            base.map(|b| (&layout, b))
        }
    };
    for &(b, name) in &inputs {
        check::contiguous(b, name)?;
    }
    // every output: contiguous, writable, disjoint from the inputs and the
    // outputs named after it
    let mut outs: Vec<Named> = Vec::new();
    outs.extend(dx.map(|d| (d, "dx")));
    for (i, (w, b)) in dweights.iter().zip(dbiases).enumerate() {
        outs.extend(w.map(|w| (w, dwn[i].as_str())));
        outs.extend(b.map(|b| (b, dbn[i].as_str())));
    }
    for (j, &(o, name)) in outs.iter().enumerate() {
        let others: Vec<Named> = inputs.iter().chain(&outs[j + 1..]).copied().collect();
        output(o, name, &others)?;
    }
    if let Some(ws) = workspace {
        let others: Vec<Named> = inputs.iter().chain(&outs).copied().collect();
        output(ws, "workspace", &others)?;
        if matches!(device, Device::Cuda(_)) {
            let need =
                crate::cuda::linalg::mlp_backward_workspace_bytes(&net.widths, net.rows, x.dtype);
            crate::ensure!(
                ws.nbytes() >= need,
                FK_ERROR_INVALID_ARGUMENT,
                "workspace has {} bytes but must have at least {need} (fk_xla_mlp_workspace_bytes for these widths, {} rows, {})",
                ws.nbytes(),
                net.rows,
                x.dtype.name()
            );
        }
    }
    if outs.is_empty() || net.rows == 0 {
        // nothing wanted, or no rows: the gradients of an empty batch are 0
        return zero_grads(device, &outs, stream, dy);
    }
    let mut layers = layers_of(&net, &acts, saved_base, weights);
    for (i, layer) in layers.iter_mut().enumerate() {
        layer.dw = Addr::of_opt(dweights[i]);
        layer.db = Addr::of_opt(dbiases[i]);
    }
    let p = MlpPlan {
        dy: Addr::of(dy),
        dx: Addr::of_opt(dx),
        workspace: workspace.and_then(|w| Addr::of(w).map(|a| (a, w.nbytes()))),
        ..plan(x, &net, tf32, layers)
    };
    match device {
        Device::Cpu => crate::cpu::mlp::backward(&p),
        Device::Cuda(_) => {
            cuda_sizes(&net)?;
            crate::cuda::linalg::mlp_backward(dy.ctx.cuda_dev(), &p, stream)
        }
    }
}

/// An empty batch: every wanted weight and bias gradient is 0 (`dx` is empty).
fn zero_grads(device: Device, outs: &[Named], stream: &Stream, dy: &Buffer) -> Result<()> {
    for &(o, _) in outs {
        if o.numel() == 0 {
            continue;
        }
        match device {
            Device::Cpu => crate::cpu::mlp::zero(Addr::of(o), o.nbytes()),
            Device::Cuda(_) => {
                crate::cuda::linalg::mlp_zero(dy.ctx.cuda_dev(), Addr::of(o), o.nbytes(), stream)?
            }
        }
    }
    Ok(())
}
