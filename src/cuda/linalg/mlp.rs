//! The multi-layer perceptron (docs/ops.md section 6) on the fused linear layer's
//! pieces: per layer one cuBLASLt product with its epilogue (`linear`'s
//! `forward_epilogue`), `mlp_epilogue` for the exact GELU and where cuBLASLt
//! declines; the backward's data-gradient chain on the caller's stream, each
//! product applying the lower layer's activation derivative and bias gradient
//! (`DRELU_BGRAD`, `DGELU_BGRAD`, else the product then `mlp_dz` and
//! `colsum_finish`), and the weight gradients on the slot's side lane, forked and
//! joined by events.
//!
//! `saved` has the layout of `ops::mlp::SavedLayout`, which is what cuBLASLt's
//! `DRELU` (bit mask, `AUX_LD` in bits) and `DGELU` (pre-activation) read and
//! `GELU_AUX` writes; the ReLU mask is written by `mlp_epilogue` from the output
//! (`RELU_AUX`'s bit at z = 0 is not `z > 0`).

use std::ffi::c_void;

use cudarc::driver::sys as ds;

use super::chunked::{record, wait};
use super::linear::{DZ_COLS, DZ_ROWS, Splits, colsum_finish, forward_epilogue, product, wgrad};
use super::{MODULE, slot_of};
use crate::addr::Addr;
use crate::addr::raw;
use crate::cuda::launch::{BLOCK, Names, grid_for, launch, per_dtype};
use crate::dtype::DType;
use crate::error::{CudaContext as _, Result, lock};
use crate::gpu::CudaDevice;
use crate::gpu::cublas::{self, Epilogue, LtCall, Slot};
use crate::gpu::kargs::kernel_args;
use crate::plan::linalg::{Activation, GemmPlan, Trans, dense};
use crate::plan::mlp::{Layer, MlpPlan};
use crate::stream::Stream;

/// The kernels of `FK_MLP_KERNELS` in `kernels/linalg.cu`.
pub(super) const EPILOGUE: Names = per_dtype!("mlp_epilogue": f16, bf16, f32);
pub(super) const DZ: Names = per_dtype!("mlp_dz": f16, bf16, f32);

kernel_args! {
    /// `mlp_epilogue`'s argument.
    pub(super) struct MlpEpiArgs {
        m: i64,
        n: i64,
        src_ld: i64,
        aux_ld: i64,
        src: u64,
        y: u64,
        bias: u64,
        aux: u64,
        act: i32,
    }
}
kernel_args! {
    /// `mlp_dz`'s argument.
    pub(super) struct MlpDzArgs {
        m: i64,
        n: i64,
        rows_per_split: i64,
        aux_ld: i64,
        g: u64,
        aux: u64,
        dz: u64,
        partial: u64,
        act: i32,
    }
}

/// `mlp_epilogue` over `[a.m, a.n]`: one thread per mask byte (8 columns).
fn epilogue_kernel(
    dev: &CudaDevice,
    dtype: DType,
    mut a: MlpEpiArgs,
    stream: &Stream,
) -> Result<()> {
    let groups = if a.act == Activation::Relu as i32 && a.aux != 0 {
        a.aux_ld / 8
    } else {
        (a.n + 7) / 8
    };
    launch(
        dev,
        MODULE,
        EPILOGUE.get(dtype)?,
        (grid_for(dev, a.m * groups), 1, 1),
        (BLOCK, 1, 1),
        0,
        stream.raw,
        &mut [&mut a as *mut MlpEpiArgs as *mut c_void],
    )
}

/// Layer `l` of the forward: `out = act(input W^T + b)` (`[m, n]`), its
/// derivative information into `l.aux` when kept.
fn forward_layer(
    dev: &CudaDevice,
    slot: &Slot,
    p: &MlpPlan,
    l: &Layer,
    input: Option<Addr>,
    out: Option<Addr>,
    stream: &Stream,
) -> Result<()> {
    let (m, k, n) = (p.rows, l.k, l.n);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let erf = l.act == Activation::GeluErf;
    let act = l.act as i32;
    // Column-major: out^T [n, m] = W [n, k] (stored as W^T [k, n], transposed) input^T [k, m].
    if k > 0 && !dev.linalg_fallback() {
        // the exact GELU: z (to aux when kept, at its pitch) then mlp_epilogue
        let (d, ldd) = match (erf, l.aux) {
            (true, Some(aux)) => (Some(aux), l.aux_ld),
            _ => (out, n),
        };
        // ReLU: cuBLASLt's RELU_AUX mask is not `z > 0` where z is exactly (+-)0
        // (inferred, not documented: a width-1 ReLU layer below and no bias make
        // whole rows of z 0, and the H100's first run had that layer's db off by
        // 126% while its dW, blind to those rows, matched), so the product applies
        // the ReLU alone and mlp_epilogue derives the mask from y = max(z, 0):
        // y > 0 exactly where z > 0 (docs/ops.md section 6), NaN giving 0.
        let relu_mask = l.act == Activation::Relu && l.aux.is_some();
        let call = LtCall {
            dtype: p.dtype,
            trans_a: true,
            trans_b: false,
            m: n as u64,
            n: m as u64,
            k: k as u64,
            a: l.w,
            lda: k,
            b: input,
            ldb: k,
            d,
            ldd,
            epilogue: forward_epilogue(l.act, l.bias.is_some(), l.aux.is_some() && !relu_mask),
            bias: l.bias,
            aux: if erf || relu_mask { None } else { l.aux },
            aux_ld: l.aux_ld,
            tf32: p.allow_tf32,
        };
        if cublas::lt_matmul(dev, slot, &call)? {
            if relu_mask {
                // the mask of y (in place, y not rewritten: `y` 0)
                let a = MlpEpiArgs {
                    m,
                    n,
                    src_ld: n,
                    aux_ld: l.aux_ld,
                    src: raw(out),
                    y: 0,
                    bias: 0,
                    aux: raw(l.aux),
                    act,
                };
                return epilogue_kernel(dev, p.dtype, a, stream);
            }
            if !erf {
                return Ok(());
            }
            let a = MlpEpiArgs {
                m,
                n,
                src_ld: ldd,
                aux_ld: 0,
                src: raw(d),
                y: raw(out),
                bias: 0,
                aux: 0,
                act,
            };
            return epilogue_kernel(dev, p.dtype, a, stream);
        }
    }
    // Fallback: z = input W^T + b into out in one rounding (the bias broadcast
    // into out, then the product accumulating onto it, beta = 1: adding b to an
    // already rounded z rounded twice, and for f16/bf16 moved ReLU masks near
    // z = 0 off the CPU's and cuBLASLt's [z > 0]), then the derivative information
    // and activation in one pass.
    if let Some(bias) = l.bias {
        let a = MlpEpiArgs {
            m,
            n,
            src_ld: 0,
            aux_ld: 0,
            src: 0,
            y: raw(out),
            bias: raw(Some(bias)),
            aux: 0,
            act: Activation::None as i32,
        };
        epilogue_kernel(dev, p.dtype, a, stream)?;
    }
    let beta = if l.bias.is_some() { 1.0 } else { 0.0 };
    cublas::gemm_ex(
        slot,
        &GemmPlan::new(
            p.dtype,
            Trans::N,
            dense(input, m, k, 0),
            Trans::T,
            dense(l.w, n, k, 0),
            dense(out, m, n, 0),
            1.0,
            beta,
            1,
            p.allow_tf32,
        ),
    )?;
    if l.act == Activation::None {
        return Ok(());
    }
    let a = MlpEpiArgs {
        m,
        n,
        src_ld: n,
        aux_ld: l.aux_ld,
        src: raw(out),
        y: raw(out),
        bias: 0,
        aux: raw(l.aux),
        act,
    };
    epilogue_kernel(dev, p.dtype, a, stream)
}

/// The forward: the fused path's one kernel where it applies and is allowed (`mlp_fused::takes`),
/// else layer by layer on the caller's stream. Without `saved` the hidden
/// activations alternate between two regions of the call's scratch.
pub fn mlp_forward(dev: &CudaDevice, p: &MlpPlan, stream: &Stream) -> Result<()> {
    if let Some(f) = super::mlp_fused::takes(dev, p)? {
        return super::mlp_fused::forward(dev, f, p, stream);
    }
    let slot = slot_of(dev, stream)?;
    let mut g = lock(&slot);
    let last = p.layers.len() - 1;
    let hidden = &p.layers[..last];
    let inference = hidden.iter().any(|l| l.hidden.is_none());
    let widest = hidden.iter().map(|l| l.n).max().unwrap_or(0);
    let region = (p.rows as u64 * widest as u64 * p.dtype.size() as u64).next_multiple_of(256);
    // Lives to the end of the call (under capture: the call's own allocation).
    let scratch_mem = if inference && region > 0 {
        Some(g.scratch(dev, 2 * region as usize)?)
    } else {
        None
    };
    let scratch = scratch_mem.as_ref().and_then(|s| s.addr());
    let mut input = p.x;
    for (i, l) in p.layers.iter().enumerate() {
        let out = if i == last {
            p.y
        } else {
            // SAFETY: the scratch holds two regions of `region` bytes.
            l.hidden
                .or_else(|| scratch.map(|s| unsafe { s.byte_add((i % 2) as u64 * region) }))
        };
        forward_layer(dev, &g, p, l, input, out, stream)?;
        input = out;
    }
    Ok(())
}

/// `mlp_dz` over `[m, l.n]`: `dz = g * act'` (`dz` None: not written, `g` is the
/// gradient) and the column partials when `partial` is given, then
/// `colsum_finish` into `db`.
#[allow(clippy::too_many_arguments)]
fn dz_and_db(
    dev: &CudaDevice,
    p: &MlpPlan,
    l: &Layer,
    g: Option<Addr>,
    dz: Option<Addr>,
    db: Option<Addr>,
    partial: Option<Addr>,
    stream: &Stream,
) -> Result<()> {
    let (m, n) = (p.rows, l.n);
    let write = dz.is_some() && l.act != Activation::None;
    if n == 0 || !write && db.is_none() {
        return Ok(());
    }
    let s = Splits::new(dev, m, n);
    let mut a = MlpDzArgs {
        m,
        n,
        rows_per_split: s.rows_per_split as i64,
        aux_ld: l.aux_ld,
        g: raw(g),
        aux: raw(l.aux),
        dz: if write { raw(dz) } else { 0 },
        partial: if db.is_some() { raw(partial) } else { 0 },
        act: l.act as i32,
    };
    launch(
        dev,
        MODULE,
        DZ.get(p.dtype)?,
        (s.gx as u32, s.splits as u32, 1),
        (DZ_COLS as u32, DZ_ROWS as u32, 1),
        0,
        stream.raw,
        &mut [&mut a as *mut MlpDzArgs as *mut c_void],
    )?;
    match db {
        Some(db) => colsum_finish(dev, p.dtype, n, s.splits, partial, db, stream),
        None => Ok(()),
    }
}

/// Layer `i`'s data gradient `dh_i = dz_i W_i` (`[m, k_i]`) into `out`, with the
/// derivative of the layer below (`below`, when given) applied and its bias
/// gradient written: one cuBLASLt call with `DRELU(_BGRAD)` / `DGELU(_BGRAD)`
/// where it can, else the product and `mlp_dz` (in place) with `colsum_finish`.
#[allow(clippy::too_many_arguments)]
fn dgrad(
    dev: &CudaDevice,
    slot: &Slot,
    p: &MlpPlan,
    l: &Layer,
    dz: Option<Addr>,
    out: Option<Addr>,
    below: Option<&Layer>,
    partial: Option<Addr>,
    stream: &Stream,
) -> Result<()> {
    let (m, k, n) = (p.rows, l.k, l.n);
    if k == 0 {
        return Ok(());
    }
    let fused = below.and_then(|b| match (b.act, b.aux, b.db.is_some()) {
        (Activation::Relu, Some(_), false) => Some(Epilogue::DRelu),
        (Activation::Relu, Some(_), true) => Some(Epilogue::DReluBgrad),
        (Activation::GeluTanh, Some(_), false) => Some(Epilogue::DGelu),
        (Activation::GeluTanh, Some(_), true) => Some(Epilogue::DGeluBgrad),
        _ => None,
    });
    // Column-major: out^T [k, m] = W^T [k, n] (W stored row-major [n, k]) dz^T [n, m].
    if let (Some(epilogue), Some(b), true) = (fused, below, n > 0 && !dev.linalg_fallback()) {
        let call = LtCall {
            dtype: p.dtype,
            trans_a: false,
            trans_b: false,
            m: k as u64,
            n: m as u64,
            k: n as u64,
            a: l.w,
            lda: k,
            b: dz,
            ldb: n,
            d: out,
            ldd: k,
            epilogue,
            bias: b.db,
            aux: b.aux,
            aux_ld: b.aux_ld,
            tf32: p.allow_tf32,
        };
        if cublas::lt_matmul(dev, slot, &call)? {
            return Ok(());
        }
    }
    product(
        slot,
        p.dtype,
        (Trans::N, dense(dz, m, n, 0)),
        (Trans::N, dense(l.w, n, k, 0)),
        dense(out, m, k, 0),
        p.allow_tf32,
    )?;
    match below {
        Some(b) => dz_and_db(dev, p, b, out, out, b.db, partial, stream),
        None => Ok(()),
    }
}

/// The most multiprocessors `mlp_backward_workspace_bytes` provides for (the
/// general path's column partials grow with their number); a call checks its
/// exact need against the workspace it got.
const WORKSPACE_MAX_SMS: u64 = 1024;

/// Alignment of the scratch inside a caller's workspace (which may start at any
/// address XLA hands out).
const WORKSPACE_ALIGN: u64 = 256;

/// Bytes of a caller's backward workspace (`MlpPlan::workspace`) that serve either
/// path, for any gradients wanted, on any device of up to `WORKSPACE_MAX_SMS`
/// multiprocessors: a function of the shapes alone (`widths`: `k_0, n_0, ...,
/// n_{L-1}`), so a host can size it before it knows the device.
pub fn mlp_backward_workspace_bytes(widths: &[i64], rows: i64, dtype: DType) -> usize {
    let (m, es) = (rows.max(0) as u64, dtype.size() as u64);
    let ns = || widths[1..].iter().map(|&n| n.max(0) as u64);
    let dz: u64 = ns().map(|n| (m * n * es).next_multiple_of(256)).sum();
    let general = ns()
        .map(|n| {
            let gx = n.div_ceil(DZ_COLS as u64).max(1);
            let splits = (WORKSPACE_MAX_SMS * 8)
                .div_ceil(gx)
                .clamp(1, m.div_ceil(DZ_ROWS as u64).max(1))
                .min(65535);
            splits * n * 4
        })
        .max()
        .unwrap_or(0);
    let fused = super::mlp_fused::max_blocks(rows) * ns().sum::<u64>() * 4;
    (dz + general.max(fused)).max(256) as usize + WORKSPACE_ALIGN as usize
}

/// The call's scratch of `bytes`: inside the caller's workspace where the plan
/// carries one (nothing allocated, so XLA can capture the call into its graphs),
/// else the slot's (`Slot::scratch`).
pub(super) fn call_scratch<'d>(
    g: &mut Slot,
    dev: &'d CudaDevice,
    p: &MlpPlan,
    bytes: usize,
) -> Result<cublas::CallScratch<'d>> {
    let Some((base, have)) = p.workspace else {
        return g.scratch(dev, bytes);
    };
    let pad = base.get().next_multiple_of(WORKSPACE_ALIGN) - base.get();
    crate::ensure!(
        have as u64 >= pad + bytes as u64,
        crate::error::FK_ERROR_INVALID_ARGUMENT,
        "workspace has {have} bytes but this backward needs {} (its scratch and {pad} bytes of alignment); size it with fk_xla_mlp_workspace_bytes",
        pad + bytes as u64
    );
    // SAFETY: the workspace holds `have` bytes, at least the padding and `bytes`.
    Ok(cublas::CallScratch::borrowed(unsafe {
        base.align_up(WORKSPACE_ALIGN)
    }))
}

/// The backward: the fused path where it applies (`mlp_fused::takes`); else `dz` of the top layer (`mlp_dz` from `dy`), then for each layer
/// from the top down to the lowest one wanted its weight gradient on the side
/// lane (forked once `dz_i` is queued) and its data gradient on the caller's
/// stream, which yields `dz_{i-1}` and `db_{i-1}`; the side lane joins back
/// before the call returns.
pub fn mlp_backward(dev: &CudaDevice, p: &MlpPlan, stream: &Stream) -> Result<()> {
    if let Some(f) = super::mlp_fused::takes(dev, p)? {
        return super::mlp_fused::backward(dev, f, p, stream);
    }
    let slot = slot_of(dev, stream)?;
    let mut g = lock(&slot);
    let (m, es) = (p.rows as u64, p.dtype.size() as u64);
    let top = p.layers.len() - 1;
    let lowest = p.lowest();
    // scratch: dz_i of each layer from `lowest` up (the top one only when its
    // activation changes dy), then one set of column partials
    let mut dz_off = vec![None; p.layers.len()];
    let mut at = 0u64;
    for (i, l) in p.layers.iter().enumerate().skip(lowest) {
        if i == top && l.act == Activation::None {
            continue;
        }
        dz_off[i] = Some(at);
        at += (m * l.n as u64 * es).next_multiple_of(256);
    }
    let partial_off = at;
    let widest = p.layers.iter().map(|l| Splits::new(dev, p.rows, l.n));
    let partial_bytes = widest
        .zip(&p.layers)
        .map(|(s, l)| s.splits * l.n as u64 * 4)
        .max()
        .unwrap_or(0);
    let scratch_mem = call_scratch(&mut g, dev, p, (at + partial_bytes).max(256) as usize)?;
    let base = scratch_mem.addr();
    // SAFETY (both): the scratch holds every dz region, then the partials.
    let partial = base.map(|b| unsafe { b.byte_add(partial_off) });
    let dz: Vec<Option<Addr>> = dz_off
        .iter()
        .map(|o| o.and_then(|o| base.map(|b| unsafe { b.byte_add(o) })))
        .collect();
    let dz_of = |i: usize| if i == top { dz[i].or(p.dy) } else { dz[i] };
    let t = &p.layers[top];
    dz_and_db(dev, p, t, p.dy, dz[top], t.db, partial, stream)?;
    let side = if p.layers.iter().any(|l| l.dw.is_some()) {
        Some(g.side_lane(dev)?)
    } else {
        None
    };
    let mut side_slot = None;
    for i in (lowest..=top).rev() {
        let l = &p.layers[i];
        if let (Some(lane), Some(_)) = (side, l.dw) {
            // fork: the side lane waits for dz_i (queued on the caller's stream)
            record(lane.fork, stream.raw)?;
            wait(lane.stream, lane.fork)?;
            if side_slot.is_none() {
                // after the fork: under a capture the side stream now captures too
                side_slot = Some(dev.blas.slot(dev, lane.stream)?);
            }
            let s = side_slot.as_ref().unwrap();
            wgrad(&lock(s), p, l, dz_of(i), p.input(i))?;
        }
        if i > lowest {
            let below = &p.layers[i - 1];
            dgrad(
                dev,
                &g,
                p,
                l,
                dz_of(i),
                dz[i - 1],
                Some(below),
                partial,
                stream,
            )?;
        } else if i == 0 && p.dx.is_some() {
            dgrad(dev, &g, p, l, dz_of(i), p.dx, None, partial, stream)?;
        }
    }
    if let (Some(lane), Some(_)) = (side, side_slot) {
        // join: the caller's stream waits for the weight gradients
        record(lane.join, lane.stream)?;
        wait(stream.raw, lane.join)?;
    }
    drop(scratch_mem);
    Ok(())
}

/// Zeroes `bytes` bytes at `addr` on `stream` (an empty batch's gradients).
pub fn mlp_zero(dev: &CudaDevice, addr: Option<Addr>, bytes: usize, stream: &Stream) -> Result<()> {
    dev.bind()?;
    // SAFETY: a validated output of `bytes` bytes of this device.
    unsafe { ds::cuMemsetD8Async(raw(addr), 0, bytes, stream.raw as ds::CUstream) }
        .result()
        .cuda("cuMemsetD8Async")
}
