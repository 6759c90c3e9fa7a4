//! Launchers of the optimizer-math family: the CUDA backend of the Newton
//! iteration (`Ops`), the cuSOLVER eigendecomposition path, SYRK statistics, and
//! the per-sample-gradient kernels of `kernels/optim.cu`.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublas::sys as bs;
use cudarc::driver::LaunchConfig;
use cudarc::driver::sys as ds;

use super::launch::{BLOCK, Names, defines, launch, launch_ex, per_dtype};
use crate::addr::Addr;
use crate::addr::{ptr, raw};
use crate::dtype::DType;
use crate::error::{CudaContext as _, Result};
use crate::gpu::cublas::{self, Slot};
use crate::gpu::kargs::{KernelArgs as _, c_structs, kernel_args};
use crate::gpu::{CudaDevice, Workspace};
use crate::plan::linalg::{GemmPlan, Trans, dense};
use crate::plan::optim::{Method, PowPlan, Report, SamplePlan, Scratch, StatsPlan};
use crate::stream::Stream;

const MODULE: &str = "optim";

/// One kernel module for the family: `(name, source)`.
pub const MODULES: [(&str, fn() -> String); 1] = [(MODULE, source)];

/// Threads of the widest `ps_norms_vec` block (one 16-byte vector per thread and
/// row): its `__launch_bounds__`.
const VEC_MAX_BLOCK: i64 = 1024;

/// The module's source: the launch constants as #defines, the argument structs, then
/// `kernels/optim.cu`.
fn source() -> String {
    defines(&[
        ("FK_BLOCK", BLOCK as i64),
        ("PS_VEC_MAX_BLOCK", VEC_MAX_BLOCK),
    ]) + &c_structs(&[
        PartialArgs::c_struct,
        FinishArgs::c_struct,
        StartArgs::c_struct,
        AffineArgs::c_struct,
        EigPrepArgs::c_struct,
        EigScaleArgs::c_struct,
        MirrorArgs::c_struct,
        OuterArgs::c_struct,
        NormArgs::c_struct,
        GramArgs::c_struct,
        ScaleRowsArgs::c_struct,
    ]) + include_str!("../../kernels/optim.cu")
}

const EIG_PREPARE: Names = per_dtype!("eig_prepare": f32, f64);
const MP_PARTIALS: Names = per_dtype!("mp_partials": f32, f64);
const MP_START: Names = per_dtype!("mp_start": f32, f64);
const MP_AFFINE: Names = per_dtype!("mp_affine": f32, f64);
const EIG_SCALE: Names = per_dtype!("eig_scale": f32, f64);
const SYM_MIRROR: Names = per_dtype!("sym_mirror": f32, f64);
const PS_OUTER: Names = per_dtype!("ps_outer": f32, f64);
const PS_NORMS: Names = per_dtype!("ps_norms": f32, f64);
const PS_NORMS_VEC: Names = per_dtype!("ps_norms_vec": f32, f64);
const PS_NORMS_WARP: Names = per_dtype!("ps_norms_warp": f32, f64);
const PS_GRAM_DOT: Names = per_dtype!("ps_gram_dot": f32, f64);
const PS_SCALE_ROWS: Names = per_dtype!("ps_scale_rows": f32, f64);

// The kernels' argument structs, in kernels/optim.cu's order.
kernel_args! {
    struct PartialArgs {
        n: i64,
        batch: i64,
        chunks: i64,
        src: u64,
        shift: f64,
        /// double [batch, chunks]
        partial: u64,
        /// 0: sum of squares, 1: max |v|
        mode: i32,
    }
}
kernel_args! {
    struct FinishArgs {
        batch: i64,
        chunks: i64,
        partial: u64,
        /// mode 0: double [batch, 2] = (z, z^(1/p)); mode 1: double [batch]
        out: u64,
        mode: i32,
        p: i32,
    }
}
kernel_args! {
    struct StartArgs {
        n: i64,
        batch: i64,
        a: u64,
        x: u64,
        m: u64,
        /// double [batch, 2] from mp_finish
        scale: u64,
        eps: f64,
    }
}
kernel_args! {
    struct AffineArgs {
        n: i64,
        batch: i64,
        m: u64,
        t: u64,
        p: i32,
    }
}
kernel_args! {
    struct EigPrepArgs {
        n: i64,
        batch: i64,
        a: u64,
        q: u64,
        eps: f64,
    }
}
kernel_args! {
    struct EigScaleArgs {
        n: i64,
        batch: i64,
        q: u64,
        w: u64,
        s: u64,
        power: f64,
        eps: f64,
    }
}
kernel_args! {
    struct MirrorArgs {
        /// tiles per side
        n: i64,
        batch: i64,
        tiles: i64,
        m: u64,
    }
}
kernel_args! {
    struct OuterArgs {
        batch: i64,
        din: i64,
        dout: i64,
        a: u64,
        g: u64,
        out: u64,
        /// 1: din % (16 / sizeof(T)) == 0 and every pointer 16-byte aligned
        vec: i32,
    }
}
kernel_args! {
    struct NormArgs {
        batch: i64,
        din: i64,
        dout: i64,
        a: u64,
        g: u64,
        /// T [batch] or 0
        norms: u64,
        /// T [batch, dout] scaled g, or 0 (norms only)
        gs: u64,
        max_norm: f64,
    }
}
kernel_args! {
    struct GramArgs {
        /// tt = T * T
        batch: i64,
        tt: i64,
        ga: u64,
        gg: u64,
        norms: u64,
    }
}
kernel_args! {
    struct ScaleRowsArgs {
        /// elements of g per sample (T * dout)
        batch: i64,
        per_sample: i64,
        g: u64,
        gs: u64,
        norms: u64,
        max_norm: f64,
    }
}

/// Blocks of a row loop over `rows` rows (each block takes whole rows).
fn row_grid(dev: &CudaDevice, rows: i64) -> u32 {
    rows.clamp(1, dev.sm_count.max(1) as i64 * 8) as u32
}

/// Launches `kernel`'s `dtype` build as a row loop over `rows` rows: `row_grid`
/// blocks of `BLOCK` threads.
fn run_rows<A>(
    dev: &CudaDevice,
    kernel: Names,
    dtype: DType,
    rows: i64,
    stream: usize,
    args: &mut A,
) -> Result<()> {
    let grid = (row_grid(dev, rows), 1, 1);
    run(dev, kernel.get(dtype)?, grid, (BLOCK, 1, 1), stream, args)
}

fn run<A>(
    dev: &CudaDevice,
    f: &'static str,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    stream: usize,
    args: &mut A,
) -> Result<()> {
    launch(
        dev,
        MODULE,
        f,
        grid,
        block,
        0,
        stream,
        &mut [args as *mut A as *mut c_void],
    )
}

/// `q = A + eps I` (kernel `eig_prepare`).
fn shifted(dev: &CudaDevice, plan: &PowPlan, q: Addr, stream: usize) -> Result<()> {
    let mut pa = EigPrepArgs {
        n: plan.n,
        batch: plan.batch,
        a: raw(plan.a),
        q: q.get(),
        eps: plan.eps,
    };
    run_rows(
        dev,
        EIG_PREPARE,
        plan.dtype,
        plan.batch * plan.n,
        stream,
        &mut pa,
    )
}

// ------------------------------------------------------------------ Newton backend

/// The CUDA backend of `ops::optim::newton` (and the preconditioner's GEMMs):
/// everything is queued on `stream`; GEMMs go through the stream's cuBLAS slot.
pub struct Ops<'a> {
    dev: &'a CudaDevice,
    stream: usize,
    slot: Arc<Mutex<Slot>>,
}

impl<'a> Ops<'a> {
    pub fn new(dev: &'a CudaDevice, stream: &Stream) -> Result<Ops<'a>> {
        dev.bind()?;
        let slot = dev.blas.slot(dev, stream.raw)?;
        Ok(Ops {
            dev,
            stream: stream.raw,
            slot,
        })
    }

    fn alloc(&self, bytes: usize) -> Result<Scratch<'a>> {
        let ws = Workspace::new(self.dev, bytes.max(16), self.stream)?;
        // a successful allocation (of at least 16 bytes) is never at 0
        let addr = ws.addr().ok_or_else(|| {
            crate::error::Error::new(
                crate::error::FK_ERROR_INTERNAL,
                "the workspace allocation returned 0",
            )
        })?;
        Ok(Scratch::new(addr, Box::new(move || drop(ws))))
    }

    /// Per-matrix reduction of `src + shift I` (mode 0: sum of squares, 1: max
    /// |.|) into `out` (doubles; mode 0 writes `(z, z^(1/p))` pairs).
    fn reduce(
        &self,
        plan: &PowPlan,
        src: Option<Addr>,
        shift: f64,
        mode: i32,
        p: u32,
        out: Addr,
    ) -> Result<()> {
        let chunks = (self.dev.sm_count.max(1) as i64 * 4 / plan.batch.max(1))
            .clamp(1, plan.n.max(1))
            .min(256);
        let partial = self.alloc((plan.batch * chunks) as usize * 8)?;
        let mut a = PartialArgs {
            n: plan.n,
            batch: plan.batch,
            chunks,
            src: raw(src),
            shift,
            partial: partial.addr.get(),
            mode,
        };
        let gy = plan.batch.min(65535) as u32;
        run(
            self.dev,
            MP_PARTIALS.get(plan.dtype)?,
            (chunks as u32, gy, 1),
            (BLOCK, 1, 1),
            self.stream,
            &mut a,
        )?;
        let mut f = FinishArgs {
            batch: plan.batch,
            chunks,
            partial: partial.addr.get(),
            out: out.get(),
            mode,
            p: p as i32,
        };
        let g = (plan.batch as u64).div_ceil(BLOCK as u64).min(65535) as u32;
        run(
            self.dev,
            "mp_finish",
            (g, 1, 1),
            (BLOCK, 1, 1),
            self.stream,
            &mut f,
        )
    }
}

impl crate::plan::optim::MatOps for Ops<'_> {
    fn scratch(&self, bytes: usize) -> Result<Scratch<'_>> {
        self.alloc(bytes)
    }

    fn gemm(&self, p: &GemmPlan) -> Result<()> {
        let g = crate::error::lock(&self.slot);
        cublas::gemm_ex(&g, p)
    }

    fn newton_start(&self, plan: &PowPlan, p: u32, x: Addr, m: Addr) -> Result<()> {
        let scale = self.alloc(plan.batch as usize * 16)?;
        self.reduce(plan, plan.a, plan.eps, 0, p, scale.addr)?;
        let mut a = StartArgs {
            n: plan.n,
            batch: plan.batch,
            a: raw(plan.a),
            x: x.get(),
            m: m.get(),
            scale: scale.addr.get(),
            eps: plan.eps,
        };
        run_rows(
            self.dev,
            MP_START,
            plan.dtype,
            plan.batch * plan.n,
            self.stream,
            &mut a,
        )
    }

    fn shifted(&self, plan: &PowPlan, s: Addr) -> Result<()> {
        shifted(self.dev, plan, s, self.stream)
    }

    fn newton_step_matrix(&self, plan: &PowPlan, p: u32, m: Addr, t: Addr) -> Result<()> {
        let mut a = AffineArgs {
            n: plan.n,
            batch: plan.batch,
            m: m.get(),
            t: t.get(),
            p: p as i32,
        };
        run_rows(
            self.dev,
            MP_AFFINE,
            plan.dtype,
            plan.batch * plan.n,
            self.stream,
            &mut a,
        )
    }

    fn residuals(&self, plan: &PowPlan, m: Addr) -> Result<Vec<f64>> {
        let out = self.alloc(plan.batch as usize * 8)?;
        self.reduce(plan, Some(m), -1.0, 1, 1, out.addr)?;
        let mut host = vec![0f64; plan.batch as usize];
        self.dev.memcpy_dtoh(
            host.as_mut_ptr() as *mut u8,
            out.addr.get(),
            host.len() * 8,
            self.stream,
            true,
        )?;
        Ok(host)
    }

    fn copy(&self, dst: Addr, src: Addr, bytes: usize) -> Result<()> {
        self.dev.bind()?;
        // SAFETY: both are device allocations of at least `bytes` bytes.
        unsafe {
            ds::cuMemcpyDtoDAsync_v2(dst.get(), src.get(), bytes, self.stream as ds::CUstream)
        }
        .result()
        .cuda("cuMemcpyDtoDAsync")
    }
}

// ------------------------------------------------------------------ eigendecomposition

/// `out = Q diag((lambda + shift)^power) Q^T` from cuSOLVER's eigendecomposition
/// of `A + eps I`; waits for the stream to read cuSOLVER's convergence flags and the
/// smallest eigenvalues.
pub fn eigh_power(dev: &CudaDevice, plan: &PowPlan, stream: &Stream) -> Result<Report> {
    let ops = Ops::new(dev, stream)?;
    let es = plan.dtype.size();
    let bytes = plan.elems() * es;
    let q = ops.alloc(bytes)?;
    let s = ops.alloc(bytes)?;
    let w = ops.alloc((plan.batch * plan.n) as usize * es)?;
    shifted(dev, plan, q.addr, stream.raw)?;
    let info = crate::gpu::cusolver::syev_batched(
        dev, stream.raw, plan.dtype, plan.n, plan.batch, q.addr, w.addr,
    )?;
    let mut sa = EigScaleArgs {
        n: plan.n,
        batch: plan.batch,
        q: q.addr.get(),
        w: w.addr.get(),
        s: s.addr.get(),
        power: plan.power,
        eps: plan.eps,
    };
    run_rows(
        dev,
        EIG_SCALE,
        plan.dtype,
        plan.batch * plan.n,
        stream.raw,
        &mut sa,
    )?;
    // out = Q^T S (rows of Q are the eigenvectors)
    let m = |a: Addr| plan.mat(a);
    crate::plan::optim::MatOps::gemm(
        &ops,
        &GemmPlan::new(
            plan.dtype,
            Trans::T,
            m(q.addr),
            Trans::N,
            m(s.addr),
            dense(plan.out, plan.n, plan.n, plan.n * plan.n),
            1.0,
            0.0,
            plan.batch,
            false,
        ),
    )?;
    // The smallest eigenvalue of each matrix (w is ascending per matrix).
    let mut wh = vec![0u8; (plan.batch * plan.n) as usize * es];
    dev.memcpy_dtoh(wh.as_mut_ptr(), w.addr.get(), wh.len(), stream.raw, true)?;
    let lmin = (0..plan.batch as usize)
        .map(|b| {
            let off = b * plan.n as usize * es;
            if es == 4 {
                f32::from_ne_bytes(wh[off..off + 4].try_into().unwrap()) as f64
            } else {
                f64::from_ne_bytes(wh[off..off + 8].try_into().unwrap())
            }
        })
        .fold(f64::INFINITY, f64::min);
    Ok(Report {
        method: Method::Eigh,
        iterations: 0,
        converged: info.iter().all(|&i| i == 0),
        residual: f64::NAN,
        min_eigenvalue: lmin,
    })
}

// ------------------------------------------------------------------ Shampoo statistics

/// Mirrors the upper triangle of each `[n, n]` matrix into the lower one.
fn mirror(
    dev: &CudaDevice,
    dtype: DType,
    c: Addr,
    n: i64,
    batch: i64,
    stream: usize,
) -> Result<()> {
    if n <= 1 {
        return Ok(());
    }
    let tiles = (n + 31) / 32;
    let mut a = MirrorArgs {
        n,
        batch,
        tiles,
        m: c.get(),
    };
    let gx = (tiles * (tiles + 1) / 2) as u32;
    run(
        dev,
        SYM_MIRROR.get(dtype)?,
        (gx, batch.min(65535) as u32, 1),
        (32, 8, 1),
        stream,
        &mut a,
    )
}

/// The statistic `op` makes, `C = beta C + alpha op(G) op(G)^T` (`StatsPlan::gemm`)
/// in `c`: one SYRK per matrix (cuBLAS has no batched SYRK; `batch` > 1 runs one
/// strided batched GEMM instead, which computes both triangles in one launch), then
/// the lower triangle mirrors the upper.
fn rank_k(
    dev: &CudaDevice,
    slot: &Slot,
    p: &StatsPlan,
    op: Trans,
    c: Addr,
    stream: usize,
) -> Result<()> {
    let (dtype, k) = (p.dtype, p.order(op));
    // SYRK has no TF32 mode: with TF32 the product is a GEMM on tensor cores (twice
    // SYRK's FLOPs at several times its rate); both operands are the same rounded
    // `G`, so the upper triangle is the statistic of the rounded gradient.
    let tf32 = p.allow_tf32 && dtype == DType::F32;
    if p.batch > 1 || tf32 {
        cublas::gemm_ex(slot, &p.gemm(op, c, tf32))?;
        return mirror(dev, dtype, c, k, p.batch, stream);
    }
    // Row-major C = G G^T (G [m, n]) is column-major C = Gc^T Gc with Gc = G^T
    // ([n, m], ld n): SYRK with trans = T, k = n. Row-major G^T G is column-major
    // Gc Gc^T: trans = N, k = m. FILL_MODE_LOWER (column-major) is the row-major
    // upper triangle.
    let trans = if op == Trans::N {
        bs::cublasOperation_t::CUBLAS_OP_T
    } else {
        bs::cublasOperation_t::CUBLAS_OP_N
    };
    let lower = bs::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER;
    let inner = if op == Trans::N { p.n } else { p.m };
    let (ni, ki, ld) = (k as i32, inner as i32, p.n.max(1) as i32);
    let (alpha, beta) = (p.alpha, p.beta);
    let h = slot.handle()?;
    // SAFETY: validated contiguous operands; the handle is bound to the stream;
    // host scalars outlive the call.
    let s = unsafe {
        if dtype == DType::F32 {
            let (al, be) = (alpha as f32, beta as f32);
            crate::gpu::cublas_api::blas::cublasSsyrk_v2(
                h.blas(),
                lower,
                trans,
                ni,
                ki,
                &al,
                ptr::<f32>(p.grad),
                ld,
                &be,
                c.ptr::<f32>(),
                ni.max(1),
            )
        } else {
            crate::gpu::cublas_api::blas::cublasDsyrk_v2(
                h.blas(),
                lower,
                trans,
                ni,
                ki,
                &alpha,
                ptr::<f64>(p.grad),
                ld,
                &beta,
                c.ptr::<f64>(),
                ni.max(1),
            )
        }
    };
    if s != bs::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(cublas::blas_err(
            if dtype == DType::F32 {
                "cublasSsyrk"
            } else {
                "cublasDsyrk"
            },
            s,
        ));
    }
    mirror(dev, dtype, c, k, 1, stream)
}

pub fn shampoo_stats(dev: &CudaDevice, p: &StatsPlan, stream: &Stream) -> Result<()> {
    dev.bind()?;
    let slot = dev.blas.slot(dev, stream.raw)?;
    let g = crate::error::lock(&slot);
    p.factors()
        .try_for_each(|(op, c)| rank_k(dev, &g, p, op, c, stream.raw))
}

// ------------------------------------------------------------------ per-sample gradients

/// `out[b] = g_b^T a_b`: one step is an outer product per sample (a write-bound
/// kernel); sequences are one batched GEMM with `k = T`.
pub fn per_sample_grads(
    dev: &CudaDevice,
    p: &SamplePlan,
    out: Option<Addr>,
    stream: &Stream,
) -> Result<()> {
    if p.steps != 1 {
        let ops = Ops::new(dev, stream)?;
        return crate::plan::optim::MatOps::gemm(&ops, &p.grads_gemm(out));
    }
    let w = 16 / p.dtype.size() as i64;
    let vec = p.din % w == 0 && raw(p.a) % 16 == 0 && raw(out) % 16 == 0;
    let mut a = OuterArgs {
        batch: p.batch,
        din: p.din,
        dout: p.dout,
        a: raw(p.a),
        g: raw(p.g),
        out: raw(out),
        vec: vec as i32,
    };
    run_rows(dev, PS_OUTER, p.dtype, p.batch * p.dout, stream.raw, &mut a)
}

/// The one-step kernel `ps_norms`: squared norms into `norms` (None: not wanted) and,
/// when `gs` is given, `g` scaled by the clipping factor for `max_norm` into `gs`.
fn fused_norms(
    dev: &CudaDevice,
    p: &SamplePlan,
    norms: Option<Addr>,
    gs: Option<Addr>,
    max_norm: f64,
    stream: usize,
) -> Result<()> {
    let mut a = NormArgs {
        batch: p.batch,
        din: p.din,
        dout: p.dout,
        a: raw(p.a),
        g: raw(p.g),
        norms: raw(norms),
        gs: raw(gs),
        max_norm,
    };
    // one warp per sample when there are enough samples to fill the GPU, else one
    // block per sample sized to the rows (all of a row's loads in flight at once),
    // both with 16-byte loads, where the rows allow them; else the scalar block kernel
    let es = p.dtype.size() as i64;
    let w = 16 / es;
    let aligned = [raw(p.a), raw(p.g), raw(gs)].iter().all(|&x| x % 16 == 0)
        && p.din % w == 0
        && p.dout % w == 0;
    let sms = dev.sm_count.max(1) as i64;
    let (name, g, block) = if aligned && p.batch >= 2 * sms {
        // (two warps per block spread the samples over every multiprocessor)
        let blocks = (p.batch + 1) / 2;
        (PS_NORMS_WARP.get(p.dtype)?, blocks.min(sms * 32) as u32, 64)
    } else if aligned && p.din.max(p.dout) / w <= VEC_MAX_BLOCK {
        // one vector per thread and row, the block sized to the longer row
        let vecs = p.din.max(p.dout) / w;
        let block = ((vecs + 31) / 32 * 32).max(32) as u32;
        (PS_NORMS_VEC.get(p.dtype)?, row_grid(dev, p.batch), block)
    } else {
        (PS_NORMS.get(p.dtype)?, row_grid(dev, p.batch), BLOCK)
    };
    // a programmatic dependent launch: the kernel waits (griddepcontrol.wait) before
    // it reads anything, but its launch overlaps the tail of the previous kernel
    let config = LaunchConfig {
        grid_dim: (g, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    let params = &mut [&mut a as *mut NormArgs as *mut c_void];
    launch_ex(dev, MODULE, name, config, stream, params, true)
}

/// Squared per-sample norms into `norms` (the plan's dtype): the fused one-step
/// kernel, or for sequences the Gram matrices `a_b a_b^T`, `g_b g_b^T` (two batched
/// GEMMs into scratch) and their per-sample inner product.
fn norms_into(ops: &Ops, p: &SamplePlan, norms: Option<Addr>) -> Result<()> {
    let (dev, stream) = (ops.dev, ops.stream);
    if p.steps == 1 {
        return fused_norms(dev, p, norms, None, 0.0, stream);
    }
    let t = p.steps;
    let es = p.dtype.size();
    let ga = ops.alloc((p.batch * t * t) as usize * es)?;
    let gg = ops.alloc((p.batch * t * t) as usize * es)?;
    for (x, w, dst) in [(p.a, p.din, ga.addr), (p.g, p.dout, gg.addr)] {
        let xm = dense(x, t, w, t * w);
        crate::plan::optim::MatOps::gemm(
            ops,
            &GemmPlan::new(
                p.dtype,
                Trans::N,
                xm,
                Trans::T,
                xm,
                dense(Some(dst), t, t, t * t),
                1.0,
                0.0,
                p.batch,
                false,
            ),
        )?;
    }
    let mut a = GramArgs {
        batch: p.batch,
        tt: t * t,
        ga: ga.addr.get(),
        gg: gg.addr.get(),
        norms: raw(norms),
    };
    run_rows(dev, PS_GRAM_DOT, p.dtype, p.batch, stream, &mut a)
}

pub fn sample_norms(
    dev: &CudaDevice,
    p: &SamplePlan,
    out: Option<Addr>,
    stream: &Stream,
) -> Result<()> {
    let ops = Ops::new(dev, stream)?;
    norms_into(&ops, p, out)
}

/// The clipped sum: g scaled per sample into scratch (fused with the norms for one
/// step), then one GEMM `out = gs^T a` over all `B*T` rows. The scaled g (and the
/// norms when the caller wants none) live in a stream-ordered allocation of the
/// call (the context's pool; a graph allocation under capture), not in the
/// stream's shared cuBLAS scratch: that one is only safe while the slot's lock is
/// held, and this call queues kernels and a GEMM (which takes the lock itself) in
/// between, so two threads queuing on one stream overwrote each other's scaled g
/// (tests/stress.rs found it under compute-sanitizer).
pub fn dp_clipped_sum(
    dev: &CudaDevice,
    p: &SamplePlan,
    max_norm: f64,
    out: Option<Addr>,
    norms: Option<Addr>,
    stream: &Stream,
) -> Result<()> {
    let ops = Ops::new(dev, stream)?;
    let es = p.dtype.size();
    let gs_bytes = ((p.batch * p.steps * p.dout) as usize * es).next_multiple_of(256);
    let sq_bytes = if p.steps > 1 && norms.is_none() {
        p.batch as usize * es
    } else {
        0
    };
    // Freed (stream-ordered) when dropped, after the last use below is queued.
    let scratch = ops.alloc(gs_bytes + sq_bytes)?;
    let gs = scratch.addr;
    if p.steps == 1 {
        fused_norms(dev, p, norms, Some(gs), max_norm, stream.raw)?;
    } else {
        // SAFETY: the scratch holds gs_bytes, then sq_bytes for the norms.
        let nptr = norms.unwrap_or(unsafe { gs.byte_add(gs_bytes as u64) });
        norms_into(&ops, p, Some(nptr))?;
        let mut a = ScaleRowsArgs {
            batch: p.batch,
            per_sample: p.steps * p.dout,
            g: raw(p.g),
            gs: gs.get(),
            norms: nptr.get(),
            max_norm,
        };
        run_rows(dev, PS_SCALE_ROWS, p.dtype, p.batch, stream.raw, &mut a)?;
    }
    crate::plan::optim::MatOps::gemm(&ops, &p.sum_gemm(gs, out))?;
    drop(scratch);
    Ok(())
}
