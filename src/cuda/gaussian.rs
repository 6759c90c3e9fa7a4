//! Launcher for `kernels/gaussian.cu` (docs/gaussian.md has the design).

use std::ffi::c_void;

use cudarc::driver::sys;

use super::launch::{Names, defines, dtype_modules, kernel_suffix, launch, per_dtype};
use crate::addr::Addr;
use crate::addr::raw;
use crate::dtype::DType;
use crate::error::{CudaContext as _, FK_ERROR_NULL_POINTER, Result};
use crate::gpu::CudaDevice;
use crate::gpu::kargs::{KernelArgs as _, c_structs, kernel_args};
use crate::plan::gaussian::{Grads, Inputs};
use crate::stream::Stream;

dtype_modules!(pub MODULES, MODULE = "gaussian", source: f32, f64);

const MAHA_FWD: Names = per_dtype!("gs_maha_fwd": f32, f64);
const FIELD_FWD: Names = per_dtype!("gs_field_fwd": f32, f64);
const BWD_MAHA: Names = per_dtype!("gs_bwd_maha": f32, f64);
const BWD_FIELD: Names = per_dtype!("gs_bwd_field": f32, f64);
const FINALIZE: Names = per_dtype!("gs_finalize": f32, f64);

// The kernels' launch constants: stated here and emitted into the module source
// as the `GS_*` #defines kernels/gaussian.cu uses (`source`).
/// Threads per CTA of every kernel.
const THREADS: u32 = 256;
/// Gaussians per shared-memory tile (field forward).
const FWD_TILE: i64 = 256;
/// Points per thread (field forward).
const FWD_PPT: i64 = 2;
/// Gaussians per thread (backward).
const BWD_GPT: i64 = 2;
/// Gaussians per CTA tile (backward).
const BWD_TILE: i64 = THREADS as i64 * BWD_GPT;
/// Points per shared-memory chunk (backward).
const BWD_CHUNK: i64 = 64;
/// Points per chunk (Mahalanobis forward).
const MAHA_CHUNK: i64 = 64;
/// Per-Gaussian partial sums: z (3), z y^T lower (6), dweights.
const K: i64 = 10;

/// A module's source: the element type selector, the launch constants, the argument
/// structs, then `kernels/gaussian.cu`.
fn source(d: DType) -> String {
    format!("#define FK_GS_{} 1\n", kernel_suffix(d))
        + &defines(&[
            ("GS_THREADS", THREADS as i64),
            ("GS_FWD_TILE", FWD_TILE),
            ("GS_FWD_PPT", FWD_PPT),
            ("GS_BWD_GPT", BWD_GPT),
            ("GS_BWD_TILE", BWD_TILE),
            ("GS_BWD_CHUNK", BWD_CHUNK),
            ("GS_MAHA_CHUNK", MAHA_CHUNK),
            ("GS_K", K),
        ])
        + &c_structs(&[
            GsMahaFwdArgs::c_struct,
            GsFieldFwdArgs::c_struct,
            GsBwdArgs::c_struct,
            GsFinalizeArgs::c_struct,
        ])
        + include_str!("../../kernels/gaussian.cu")
}

/// CTAs the backward aims for (about four per multiprocessor on an H100); a
/// constant, so the split, hence the summation order and the bits, does not
/// depend on the GPU model.
const BWD_TARGET_CTAS: i64 = 512;
/// The workspace start is rounded up to this alignment (slack included in the size).
const WS_ALIGN: usize = 256;

/// `s = sqrt(0.5 log2 e)`: the field kernels scale coordinates by it so that
/// `exp(-0.5 m) = exp2(-|s y|^2)`.
fn field_scale() -> f64 {
    (0.5 * std::f64::consts::LOG2_E).sqrt()
}

/// How the backward splits the work (a function of `B` and `N` only).
#[derive(Debug, Clone, Copy)]
struct BwdPlan {
    n_gtiles: i64,
    n_pchunks: i64,
    /// splits of the Gaussian tiles (grid x) and of the point chunks (grid y)
    sg: i64,
    sp: i64,
}

impl BwdPlan {
    fn new(b: i64, n: i64) -> BwdPlan {
        let n_gtiles = (n + BWD_TILE - 1) / BWD_TILE;
        let n_pchunks = (b + BWD_CHUNK - 1) / BWD_CHUNK;
        // sg * sp ~ target; the workspace sg*3*B + sp*K*N is smallest at
        // sg = sqrt(target * K * N / (3 * B)).
        let t = BWD_TARGET_CTAS as f64;
        let opt = (t * K as f64 * n as f64 / (3.0 * b.max(1) as f64)).sqrt();
        let sg = (opt.round() as i64).clamp(1, n_gtiles.max(1));
        let sp = ((BWD_TARGET_CTAS + sg - 1) / sg).clamp(1, n_pchunks.max(1));
        let sg = ((BWD_TARGET_CTAS + sp - 1) / sp).clamp(1, n_gtiles.max(1));
        BwdPlan {
            n_gtiles,
            n_pchunks,
            sg,
            sp,
        }
    }
    /// Elements of the per-point and per-Gaussian partials.
    fn elems(&self, b: i64, n: i64) -> (i64, i64) {
        (self.sg * 3 * b, self.sp * K * n)
    }
}

/// Workspace bytes of the backward ops (0 when B or N is 0).
pub fn workspace_bytes(dtype: DType, b: i64, n: i64) -> usize {
    if b == 0 || n == 0 {
        return 0;
    }
    let plan = BwdPlan::new(b, n);
    let (pp, pg) = plan.elems(b, n);
    (pp + pg) as usize * dtype.size() + WS_ALIGN
}

fn memset_zero(dev: &CudaDevice, ptr: Option<Addr>, bytes: usize, stream: &Stream) -> Result<()> {
    let Some(ptr) = ptr else {
        return Ok(());
    };
    if bytes == 0 {
        return Ok(());
    }
    dev.bind()?;
    // SAFETY: `ptr` is a validated output of `bytes` bytes on this device.
    unsafe { sys::cuMemsetD8Async(ptr.get(), 0, bytes, stream.raw as sys::CUstream) }
        .result()
        .cuda("cuMemsetD8Async")
}

kernel_args! {
    /// The Mahalanobis forward's argument.
    struct GsMahaFwdArgs {
        points: u64,
        means: u64,
        chol: u64,
        out: u64,
        B: i64,
        N: i64,
        eps: f64,
        /// threads along N (32..256, a power of two); `GS_THREADS / gx` along points
        gx: i32,
        pad: i32,
    }
}

pub fn mahalanobis_forward(
    dev: &CudaDevice,
    inp: &Inputs,
    out: Option<Addr>,
    stream: &Stream,
) -> Result<()> {
    // Threads along N: enough for N (a warp at least), the rest along points.
    let gx = (inp.n.clamp(1, THREADS as i64) as u64)
        .next_power_of_two()
        .max(32) as i64;
    let mut a = GsMahaFwdArgs {
        points: raw(inp.points),
        means: raw(inp.means),
        chol: raw(inp.chol),
        out: raw(out),
        B: inp.b,
        N: inp.n,
        eps: inp.eps,
        gx: gx as i32,
        pad: 0,
    };
    let grid_x = (inp.n + gx - 1) / gx;
    let chunks = (inp.b + MAHA_CHUNK - 1) / MAHA_CHUNK;
    let grid_y = chunks.clamp(1, 65535);
    let mut params = [&mut a as *mut GsMahaFwdArgs as *mut c_void];
    launch(
        dev,
        MODULE.get(inp.dtype)?,
        MAHA_FWD.get(inp.dtype)?,
        (grid_x as u32, grid_y as u32, 1),
        (THREADS, 1, 1),
        0,
        stream.raw,
        &mut params,
    )
}

kernel_args! {
    /// The field forward's argument.
    struct GsFieldFwdArgs {
        points: u64,
        means: u64,
        chol: u64,
        weights: u64,
        out: u64,
        B: i64,
        N: i64,
        eps: f64,
        scale: f64,
        /// Gaussian splits inside a CTA: 1, 2, 4 or 8
        gs: i32,
        pad: i32,
    }
}

/// Gaussian splits inside a CTA of the field forward: the smallest of 1, 2, 4, 8
/// that gives at least 256 CTAs (a function of `B` only).
fn field_splits(b: i64) -> i64 {
    let mut gs = 1;
    while gs < 8 {
        let per_cta = (THREADS as i64 / gs) * FWD_PPT;
        if (b + per_cta - 1) / per_cta >= 256 {
            break;
        }
        gs *= 2;
    }
    gs
}

pub fn field_forward(
    dev: &CudaDevice,
    inp: &Inputs,
    out: Option<Addr>,
    stream: &Stream,
) -> Result<()> {
    let gs = field_splits(inp.b);
    let per_cta = (THREADS as i64 / gs) * FWD_PPT;
    let mut a = GsFieldFwdArgs {
        points: raw(inp.points),
        means: raw(inp.means),
        chol: raw(inp.chol),
        weights: raw(inp.weights),
        out: raw(out),
        B: inp.b,
        N: inp.n,
        eps: inp.eps,
        scale: field_scale(),
        gs: gs as i32,
        pad: 0,
    };
    let grid = (inp.b + per_cta - 1) / per_cta;
    let mut params = [&mut a as *mut GsFieldFwdArgs as *mut c_void];
    launch(
        dev,
        MODULE.get(inp.dtype)?,
        FIELD_FWD.get(inp.dtype)?,
        (grid as u32, 1, 1),
        (THREADS, 1, 1),
        0,
        stream.raw,
        &mut params,
    )
}

kernel_args! {
    /// Both backwards' argument.
    struct GsBwdArgs {
        points: u64,
        means: u64,
        chol: u64,
        weights: u64,
        /// Mahalanobis: dL/dm `[B,N]`; field: dL/dout `[B]`
        g: u64,
        /// `[sg][3][B]`: per-point sums of z' over split ig's Gaussians
        part_p: u64,
        /// `[sp][GS_K][N]`: per-Gaussian sums over split ip's points
        part_g: u64,
        B: i64,
        N: i64,
        /// ceil(B / GS_BWD_CHUNK)
        n_pchunks: i64,
        eps: f64,
        scale: f64,
        /// ceil(N / GS_BWD_TILE)
        n_gtiles: i32,
        /// splits of the Gaussian tiles (grid x)
        sg: i32,
        /// splits of the point chunks (grid y)
        sp: i32,
        want_p: i32,
        want_g: i32,
        pad: i32,
    }
}

kernel_args! {
    /// The backward's finalize kernel's argument.
    struct GsFinalizeArgs {
        part_p: u64,
        part_g: u64,
        /// each optional (0)
        dpoints: u64,
        dmeans: u64,
        dchol: u64,
        dweights: u64,
        B: i64,
        N: i64,
        /// 1/s of the scaled coordinates
        inv_s: f64,
        /// 1/s^2
        inv_s2: f64,
        sg: i32,
        sp: i32,
    }
}

/// Both backwards: `field` selects the fused field backward (`g` is `dout [B]`)
/// over the Mahalanobis one (`g` is `[B,N]`). `ws` is the caller's workspace.
pub fn backward(
    dev: &CudaDevice,
    inp: &Inputs,
    field: bool,
    g: Option<Addr>,
    grads: &Grads,
    ws: Option<Addr>,
    stream: &Stream,
) -> Result<()> {
    let (b, n, sz) = (inp.b, inp.n, inp.dtype.size());
    if b == 0 || n == 0 {
        // Empty sums: every requested gradient is zero.
        memset_zero(dev, grads.dpoints, (b * 3) as usize * sz, stream)?;
        memset_zero(dev, grads.dmeans, (n * 3) as usize * sz, stream)?;
        memset_zero(dev, grads.dchol, (n * 9) as usize * sz, stream)?;
        memset_zero(dev, grads.dweights, n as usize * sz, stream)?;
        return Ok(());
    }
    let plan = BwdPlan::new(b, n);
    let (pp_elems, _) = plan.elems(b, n);
    let Some(ws) = ws else {
        crate::bail!(
            FK_ERROR_NULL_POINTER,
            "the Gaussian backward needs a workspace for B = {b}, N = {n}"
        );
    };
    // SAFETY: `ops::gaussian` checked that the workspace holds `workspace_bytes`:
    // the alignment padding, then the per-point partials, then the per-Gaussian ones.
    let (part_p, part_g) = unsafe {
        let part_p = ws.align_up(WS_ALIGN as u64);
        (part_p, part_p.byte_add(pp_elems as u64 * sz as u64))
    };
    let scale = if field { field_scale() } else { 1.0 };
    let mut a = GsBwdArgs {
        points: raw(inp.points),
        means: raw(inp.means),
        chol: raw(inp.chol),
        weights: raw(inp.weights),
        g: raw(g),
        part_p: part_p.get(),
        part_g: part_g.get(),
        B: b,
        N: n,
        n_pchunks: plan.n_pchunks,
        eps: inp.eps,
        scale,
        n_gtiles: plan.n_gtiles as i32,
        sg: plan.sg as i32,
        sp: plan.sp as i32,
        want_p: grads.dpoints.is_some() as i32,
        want_g: grads.per_gaussian() as i32,
        pad: 0,
    };
    let kernel = if field { BWD_FIELD } else { BWD_MAHA }.get(inp.dtype)?;
    let mut params = [&mut a as *mut GsBwdArgs as *mut c_void];
    launch(
        dev,
        MODULE.get(inp.dtype)?,
        kernel,
        (plan.sg as u32, plan.sp as u32, 1),
        (THREADS, 1, 1),
        0,
        stream.raw,
        &mut params,
    )?;
    let mut f = GsFinalizeArgs {
        part_p: part_p.get(),
        part_g: part_g.get(),
        dpoints: raw(grads.dpoints),
        dmeans: raw(grads.dmeans),
        dchol: raw(grads.dchol),
        dweights: raw(grads.dweights),
        B: b,
        N: n,
        inv_s: 1.0 / scale,
        inv_s2: 1.0 / (scale * scale),
        sg: plan.sg as i32,
        sp: plan.sp as i32,
    };
    let items = (b * 3).max(n);
    let grid = super::launch::grid_for(dev, items);
    let mut params = [&mut f as *mut GsFinalizeArgs as *mut c_void];
    launch(
        dev,
        MODULE.get(inp.dtype)?,
        FINALIZE.get(inp.dtype)?,
        (grid, 1, 1),
        (THREADS, 1, 1),
        0,
        stream.raw,
        &mut params,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_bounded() {
        for (b, n) in [
            (1, 1),
            (7, 5),
            (16384, 4096),
            (1 << 20, 65536),
            (100, 1 << 20),
            (1 << 24, 3),
        ] {
            let p = BwdPlan::new(b, n);
            assert!(p.sg >= 1 && p.sg <= p.n_gtiles.max(1), "{b} {n} {p:?}");
            assert!(p.sp >= 1 && p.sp <= p.n_pchunks.max(1) && p.sp <= 65535);
            assert!(p.sg * p.sp <= 2 * BWD_TARGET_CTAS, "{b} {n} {p:?}");
        }
        // the scale case stays far from O(B*N)
        let bytes = workspace_bytes(DType::F32, 1 << 20, 65536);
        assert!(bytes < 400 << 20, "{bytes}");
        assert_eq!(field_splits(16384), 8);
        assert_eq!(field_splits(1 << 20), 1);
    }
}
