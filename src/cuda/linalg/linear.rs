//! The fused linear layer: cuBLASLt with a fused epilogue, or cuBLAS then
//! `linear_epilogue`; the backward's `linear_dz` and `colsum_finish`, then cuBLAS.

use std::ffi::c_void;

use super::{MODULE, slot_of};
use crate::addr::Addr;
use crate::addr::raw;
use crate::cuda::launch::{BLOCK, Names, grid_for, launch, per_dtype};
use crate::dtype::DType;
use crate::error::{Result, lock};
use crate::gpu::CudaDevice;
use crate::gpu::cublas::{self, Epilogue, LtCall, Slot};
use crate::gpu::kargs::kernel_args;
use crate::plan::linalg::{Activation, GemmPlan, LinearBwdPlan, LinearPlan, Mat, Trans, dense};
use crate::plan::mlp::{Layer, MlpPlan};
use crate::stream::Stream;

/// The kernels of `FK_LINEAR_KERNELS` in `kernels/linalg.cu`, one per dtype the
/// fused linear layer takes (`ops::linalg` admits no other).
pub(super) const EPILOGUE: Names = per_dtype!("linear_epilogue": f16, bf16, f32);
pub(super) const DZ: Names = per_dtype!("linear_dz": f16, bf16, f32);
pub(super) const COLSUM_FINISH: Names = per_dtype!("colsum_finish": f16, bf16, f32);

kernel_args! {
    /// `linear_epilogue`'s argument; `src`: the GEMM's output (`y` itself: in place; or
    /// `aux`, already holding z when `bias` is 0 and `aux` is 0 here).
    pub(super) struct EpiArgs {
        m: i64,
        n: i64,
        src: u64,
        y: u64,
        bias: u64,
        aux: u64,
        act: i32,
    }
}
/// `linear_epilogue`: `y = act(src + b)`, `aux = src + b` (bias, aux optional).
fn epilogue_kernel(
    dev: &CudaDevice,
    p: &LinearPlan,
    mut a: EpiArgs,
    stream: &Stream,
) -> Result<()> {
    let grid = grid_for(dev, p.m * p.n);
    launch(
        dev,
        MODULE,
        EPILOGUE.get(p.dtype)?,
        (grid, 1, 1),
        (BLOCK, 1, 1),
        0,
        stream.raw,
        &mut [&mut a as *mut EpiArgs as *mut c_void],
    )
}

/// The cuBLASLt epilogue of a forward layer `act(z + b)`: `has_bias`, and `aux`
/// whether the layer keeps its derivative information (the pre-activation for the
/// tanh GELU, the bit mask for ReLU). The exact GELU, which cuBLASLt lacks, gets
/// the product and bias only (its activation is fusekit's kernel).
pub(super) fn forward_epilogue(act: Activation, has_bias: bool, aux: bool) -> Epilogue {
    match (act, has_bias, aux) {
        (Activation::None | Activation::GeluErf, false, _) => Epilogue::Default,
        (Activation::None | Activation::GeluErf, true, _) => Epilogue::Bias,
        (Activation::Relu, false, false) => Epilogue::Relu,
        (Activation::Relu, true, false) => Epilogue::ReluBias,
        (Activation::Relu, false, true) => Epilogue::ReluAux,
        (Activation::Relu, true, true) => Epilogue::ReluAuxBias,
        (Activation::GeluTanh, false, false) => Epilogue::Gelu,
        (Activation::GeluTanh, true, false) => Epilogue::GeluBias,
        (Activation::GeluTanh, false, true) => Epilogue::GeluAux,
        (Activation::GeluTanh, true, true) => Epilogue::GeluAuxBias,
    }
}

/// `c = op_a(a) op_b(b)` through cuBLAS: one matrix each, f32 accumulation (TF32
/// tensor cores for f32 when `tf32`).
pub(super) fn product(
    g: &Slot,
    dtype: DType,
    (op_a, a): (Trans, Mat),
    (op_b, b): (Trans, Mat),
    c: Mat,
    tf32: bool,
) -> Result<()> {
    cublas::gemm_ex(
        g,
        &GemmPlan::new(dtype, op_a, a, op_b, b, c, 1.0, 0.0, 1, tf32),
    )
}

/// `y = act(x W^T + b)`: one cuBLASLt call with a fused epilogue; where cuBLASLt
/// declines, cuBLAS's GEMM then `linear_epilogue`. The exact GELU, which cuBLASLt
/// lacks, is its `BIAS` epilogue writing `z` (to `aux` when kept, else to `y`),
/// then `linear_epilogue` for `y = gelu_erf(z)`.
pub fn linear_forward(dev: &CudaDevice, p: &LinearPlan, stream: &Stream) -> Result<()> {
    let slot = slot_of(dev, stream)?;
    let g = lock(&slot);
    let has_bias = p.bias.is_some();
    let erf = p.act == Activation::GeluErf;
    let epilogue = forward_epilogue(p.act, has_bias, p.aux.is_some());
    // Column-major: y^T [n, m] = W [n, k] (stored as W^T [k, n], transposed) x^T [k, m].
    if p.k > 0 && !dev.linalg_fallback() {
        let d = if erf { p.aux.or(p.y) } else { p.y };
        let call = LtCall {
            dtype: p.dtype,
            trans_a: true,
            trans_b: false,
            m: p.n as u64,
            n: p.m as u64,
            k: p.k as u64,
            a: p.w,
            lda: p.k,
            b: p.x,
            ldb: p.k,
            d,
            ldd: p.n,
            epilogue,
            bias: p.bias,
            aux: if erf { None } else { p.aux },
            aux_ld: p.n,
            tf32: false,
        };
        if cublas::lt_matmul(dev, &g, &call)? {
            if !erf {
                return Ok(());
            }
            let a = EpiArgs {
                m: p.m,
                n: p.n,
                src: raw(d),
                y: raw(p.y),
                bias: 0,
                aux: 0,
                act: p.act as i32,
            };
            return epilogue_kernel(dev, p, a, stream);
        }
    }
    // Fallback: z = x W^T into y, then bias, aux and activation in one pass.
    product(
        &g,
        p.dtype,
        (Trans::N, dense(p.x, p.m, p.k, 0)),
        (Trans::T, dense(p.w, p.n, p.k, 0)),
        dense(p.y, p.m, p.n, 0),
        false,
    )?;
    if p.act == Activation::None && !has_bias && p.aux.is_none() {
        return Ok(());
    }
    let a = EpiArgs {
        m: p.m,
        n: p.n,
        src: raw(p.y),
        y: raw(p.y),
        bias: raw(p.bias),
        aux: raw(p.aux),
        act: p.act as i32,
    };
    epilogue_kernel(dev, p, a, stream)
}

kernel_args! {
    /// `linear_dz`'s argument.
    pub(super) struct DzArgs {
        m: i64,
        n: i64,
        rows_per_split: i64,
        dy: u64,
        saved: u64,
        dz: u64,
        partial: u64,
        act: i32,
    }
}
kernel_args! {
    /// `colsum_finish`'s argument.
    pub(super) struct FinishArgs {
        n: i64,
        splits: i64,
        partial: u64,
        out: u64,
    }
}
/// `linear_dz`'s block: `DZ_COLS` columns by `DZ_ROWS` row lanes (its
/// `__launch_bounds__` and shared tile; `kernels/linalg.cu` asserts the numbers).
pub(super) const DZ_COLS: i64 = 32;
pub(super) const DZ_ROWS: i64 = 8;

/// How the column sums of an `[m, n]` gradient split (`linear_dz`, `mlp_dz`): `gx`
/// blocks of `DZ_COLS` columns by `splits` blocks of `rows_per_split` rows, about 8
/// blocks per multiprocessor with a row per row lane or more.
pub(super) struct Splits {
    pub gx: u64,
    pub splits: u64,
    pub rows_per_split: u64,
}

impl Splits {
    pub fn new(dev: &CudaDevice, m: i64, n: i64) -> Splits {
        let gx = (n as u64).div_ceil(DZ_COLS as u64).max(1);
        let target = dev.sm_count.max(1) as u64 * 8;
        let splits = target
            .div_ceil(gx)
            .clamp(1, (m as u64).div_ceil(DZ_ROWS as u64).max(1))
            .min(65535);
        let rows_per_split = (m as u64).div_ceil(splits).max(1);
        let splits = (m as u64).div_ceil(rows_per_split).max(1);
        Splits {
            gx,
            splits,
            rows_per_split,
        }
    }
}

/// `colsum_finish`: `out[c] = sum over the splits of partial[split, c]`, `c < n`.
pub(super) fn colsum_finish(
    dev: &CudaDevice,
    dtype: DType,
    n: i64,
    splits: u64,
    partial: Option<Addr>,
    out: Addr,
    stream: &Stream,
) -> Result<()> {
    let mut a = FinishArgs {
        n,
        splits: splits as i64,
        partial: raw(partial),
        out: out.get(),
    };
    launch(
        dev,
        MODULE,
        COLSUM_FINISH.get(dtype)?,
        (grid_for(dev, n), 1, 1),
        (BLOCK, 1, 1),
        0,
        stream.raw,
        &mut [&mut a as *mut FinishArgs as *mut c_void],
    )
}

/// The backward: `linear_dz` (dz and column partials of db, one pass over dy),
/// `colsum_finish` (db), then cuBLAS for `dx = dz W` and `dW = dz^T x`.
pub fn linear_backward(dev: &CudaDevice, p: &LinearBwdPlan, stream: &Stream) -> Result<()> {
    let slot = slot_of(dev, stream)?;
    let mut g = lock(&slot);
    let es = p.dtype.size();
    let need_dz = p.dx.is_some() || p.dw.is_some();
    let write_dz = need_dz && p.act != Activation::None;
    let Splits {
        gx,
        splits,
        rows_per_split,
    } = Splits::new(dev, p.m, p.n);
    let dz_bytes = if write_dz {
        (p.m as usize * p.n as usize * es).next_multiple_of(256)
    } else {
        0
    };
    let partial_bytes = if p.db.is_some() {
        splits as usize * p.n as usize * 4
    } else {
        0
    };
    // Lives to the end of the call: under capture it is the call's own
    // stream-ordered allocation, freed (on the stream) after the last GEMM.
    let scratch_mem = if dz_bytes + partial_bytes > 0 {
        Some(g.scratch(dev, dz_bytes + partial_bytes)?)
    } else {
        None
    };
    let scratch = scratch_mem.as_ref().and_then(|s| s.addr());
    let dz = if write_dz { scratch } else { p.dy };
    // db's column partials follow dz in the scratch
    // SAFETY: the scratch holds dz_bytes + partial_bytes; the partials start after dz.
    let partial = scratch.map(|s| unsafe { s.byte_add(dz_bytes as u64) });
    if write_dz || p.db.is_some() {
        let mut a = DzArgs {
            m: p.m,
            n: p.n,
            rows_per_split: rows_per_split as i64,
            dy: raw(p.dy),
            saved: raw(p.saved),
            dz: if write_dz { raw(dz) } else { 0 },
            partial: if p.db.is_some() { raw(partial) } else { 0 },
            act: p.act as i32,
        };
        launch(
            dev,
            MODULE,
            DZ.get(p.dtype)?,
            (gx as u32, splits as u32, 1),
            (DZ_COLS as u32, DZ_ROWS as u32, 1),
            0,
            stream.raw,
            &mut [&mut a as *mut DzArgs as *mut c_void],
        )?;
    }
    if let Some(db) = p.db {
        colsum_finish(dev, p.dtype, p.n, splits, partial, db, stream)?;
    }
    if let Some(dx) = p.dx {
        // dx [m, k] = dz [m, n] W [n, k]
        product(
            &g,
            p.dtype,
            (Trans::N, dense(dz, p.m, p.n, 0)),
            (Trans::N, dense(p.w, p.n, p.k, 0)),
            dense(Some(dx), p.m, p.k, 0),
            false,
        )?;
    }
    if let Some(dw) = p.dw {
        // dW [n, k] = dz^T [n, m] x [m, k]
        product(
            &g,
            p.dtype,
            (Trans::T, dense(dz, p.m, p.n, 0)),
            (Trans::N, dense(p.x, p.m, p.k, 0)),
            dense(Some(dw), p.n, p.k, 0),
            false,
        )?;
    }
    Ok(())
}

/// Layer `l`'s weight gradient `dW = dz^T h` (`[n, k]`) on the side lane's slot (the
/// MLP op's general and fused backwards).
pub(super) fn wgrad(
    side: &Slot,
    p: &MlpPlan,
    l: &Layer,
    dz: Option<Addr>,
    h: Option<Addr>,
) -> Result<()> {
    let (m, k, n) = (p.rows, l.k, l.n);
    if n == 0 || k == 0 {
        return Ok(());
    }
    product(
        side,
        p.dtype,
        (Trans::T, dense(dz, m, n, 0)),
        (Trans::N, dense(h, m, k, 0)),
        dense(l.dw, n, k, 0),
        p.allow_tf32,
    )
}
