//! The cuBLAS route, for the shapes no fast kernel takes (R > 32, D > 1024, f64 with
//! large D*R): the products in cuBLAS, small elementwise kernels of the op's generic
//! module between them; `gamma_raw = (v U)^2 W^T` as `P = v U` (into a `[B, R]`
//! workspace), `S = P^2` (`geo_square`), `S W^T`. About three `[B, D]` passes per
//! evaluation against the fast kernels' two (as PyTorch eager), ~10x faster than the
//! generic kernels (BENCHMARKS.md). TF32 products with `FK_GEO_ALLOW_TF32` (f32
//! forwards only; the backwards and their recomputed forward states stay strict).
//!
//! The op sequences are written once against `Steps`; `GemmRoute` runs them on the
//! GPU, the unit tests (`route_tests`) on the host.

use std::any::Any;

use super::args::{AdjArgs, EwArgs, KickArgs, Sw, SwArgs};
use super::config::{NT, sw_m};
use super::launch_one;
use super::names;
use super::plan::{Layout, RoutePlan, lf_bwd_sweeps};
use crate::addr::{self, Addr};
use crate::cuda::launch::grid_for;
use crate::error::{FK_ERROR_INTERNAL, Result};
use crate::gpu::{CudaDevice, Workspace, cublas};
use crate::plan::geodesic::{Job, Kind};
use crate::plan::linalg::{GemmPlan, Mat, Trans, dense};
use crate::stream::Stream;

/// The route's form of an operand's address: a number, 0 for an absent operand (the
/// workspace pieces are offsets from the workspaces' addresses).
fn at(a: Option<Addr>) -> usize {
    addr::raw(a) as usize
}

/// The dense row-major `rows x cols` matrix at the route address `a` (0: none):
/// where a route address becomes a GEMM operand.
fn mat(a: usize, rows: usize, cols: usize) -> Mat {
    // SAFETY: route addresses are the job's validated operands and pieces of the
    // route's workspaces (`Layout`'s offsets inside them), each of the matrix's size.
    dense(
        unsafe { Addr::from_raw(a as u64) },
        rows as i64,
        cols as i64,
        0,
    )
}

/// `vec` of the route's elementwise kernels: 1 where they may move 16 bytes per thread
/// and step, i.e. every pointer (0: none) is 16-byte aligned and `n` and `period` (of
/// `mu`, where read) are multiples of the elements in 16 bytes.
pub(super) fn ew_vec(esize: usize, n: i64, period: Option<usize>, ptrs: &[usize]) -> i32 {
    let per = 16 / esize;
    let whole = |k: usize| k % per == 0;
    i32::from(whole(n as usize) && period.is_none_or(whole) && ptrs.iter().all(|&p| p % 16 == 0))
}

/// Where a Christoffel vjp's products go: `(address, beta)` for `dv`, `dU`, `dW`;
/// address 0 = not wanted, beta 0 overwrites, 1 adds.
#[derive(Clone, Copy)]
pub(super) struct VjpOut {
    dv: (usize, f64),
    du: (usize, f64),
    dw: (usize, f64),
}

/// The route's steps. The primitives (`gemm`, `launch`, `copy`) queue cuBLAS products,
/// kernels of the op's generic module and copies on the op's stream (`GemmRoute`);
/// the unit tests run the same sequences on the host. The provided methods are the
/// pieces the ops share.
pub(super) trait Steps {
    fn job(&self) -> &Job;
    /// The `[B, R]` workspace (`P` of `gamma_raw` in the forwards).
    fn p(&self) -> usize;
    /// The op's workspace (`Layout`).
    fn ws(&self) -> usize;
    /// `c = op_a(a) op_b(b) + beta c` (row-major, dense; beta 0: `c` is not read).
    fn gemm(&self, op_a: Trans, a: Mat, op_b: Trans, b: Mat, c: Mat, beta: f64) -> Result<()>;
    /// Kernel `name` of the op's generic module over `n` elements; `args` its argument
    /// struct (`EwArgs`, `KickArgs`, `AdjArgs`).
    fn launch<A: Any>(&self, name: &'static str, n: i64, args: &mut A) -> Result<()>;
    /// `bytes` bytes from `src` to `dst`.
    fn copy(&self, dst: usize, src: usize, bytes: usize) -> Result<()>;
    /// Whether `sw` may run (`geo_sw` fits the device's shared memory and the products
    /// are strict); the forwards then never write raw to memory.
    fn fused(&self) -> bool;
    /// `geo_sw` over the whole batch, with `P = v U` in `p()`.
    fn sw(&self, a: &mut SwArgs) -> Result<()>;

    /// A `GEO_EW` step: `y[i]` from `y[i]`, `x[i]` and `c`, `i < n`.
    fn ew(&self, name: &'static str, y: usize, x: usize, n: i64, c: f64) -> Result<()> {
        let j = self.job();
        let mut a = EwArgs {
            y: y as u64,
            x: x as u64,
            n,
            c,
            vec: ew_vec(j.dtype.size(), n, None, &[y, x]),
            pad_: 0,
        };
        self.launch(name, n, &mut a)
    }

    /// The `[B, D]` matrix at `a` (`v`, `x`, `gamma`, raw, `g'` and their kin).
    fn bd(&self, a: usize) -> Mat {
        let j = self.job();
        mat(a, j.b, j.d)
    }

    /// The `[D, R]` matrix at `a` (`U`, `W`, `dU`, `dW`).
    fn dr(&self, a: usize) -> Mat {
        let j = self.job();
        mat(a, j.d, j.r)
    }

    /// The `[B, R]` matrix at `a` (`P`, `S`, `Q`).
    fn br(&self, a: usize) -> Mat {
        let j = self.job();
        mat(a, j.b, j.r)
    }

    /// `P = v U` into `p` (`[B, R]`).
    fn vu(&self, v: usize, p: usize) -> Result<()> {
        let u = self.dr(at(self.job().u));
        self.gemm(Trans::N, self.bd(v), Trans::N, u, self.br(p), 0.0)
    }

    /// `out = (v U)^2 W^T` with `P = v U` into `p` and `S = P^2` into `s` (`s` may be
    /// `p`; `out` may be `v`: `v` is read before `out` is written).
    fn gamma_raw(&self, v: usize, out: usize, p: usize, s: usize) -> Result<()> {
        let j = self.job();
        self.vu(v, p)?;
        self.ew("geo_square", s, p, (j.b * j.r) as i64, 0.0)?;
        let w = self.dr(at(j.w));
        self.gemm(Trans::N, self.br(s), Trans::T, w, self.bd(out), 0.0)
    }

    /// One kick, `v = vin + h (f - clamp(raw) - mu vin)` (`vin` may be `v`), then
    /// where `x` is nonzero the drift `x += dt v`; `tx`, `tv` (0 = none) get copies of
    /// the new `x`, `v`.
    fn kick(&self, vin: usize, v: usize, raw: usize, x: usize, tx: usize, tv: usize) -> Result<()> {
        let n = (self.job().b * self.job().d) as i64;
        let mut a = self.kick_args(vin, v, raw, x, tx, tv);
        self.launch("geo_kick", n, &mut a)
    }

    /// `kick`'s arguments (`raw` 0 for `geo_sw`, which computes it).
    fn kick_args(
        &self,
        vin: usize,
        v: usize,
        raw: usize,
        x: usize,
        tx: usize,
        tv: usize,
    ) -> KickArgs {
        let j = self.job();
        let n = (j.b * j.d) as i64;
        KickArgs {
            n,
            d: j.d as i64,
            vin: vin as u64,
            x: x as u64,
            v: v as u64,
            raw: raw as u64,
            f: addr::raw(j.f),
            mu: addr::raw(j.mu),
            tx: tx as u64,
            tv: tv as u64,
            h: 0.5 * j.dt,
            dt: j.dt,
            c: j.c,
            vec: self.bd_vec(&[vin, x, v, raw, at(j.f), tx, tv]),
            pad_: 0,
        }
    }

    /// `vec` of `geo_kick` and `geo_adj`, `[B, D]` kernels that read `mu` (where given)
    /// by feature besides the addresses `ptrs`.
    fn bd_vec(&self, ptrs: &[usize]) -> i32 {
        let j = self.job();
        let (n, period) = ((j.b * j.d) as i64, j.mu.is_some().then_some(j.d));
        ew_vec(j.dtype.size(), n, period, &[ptrs, &[at(j.mu)]].concat())
    }

    /// `geo_sw` with `P = v U` in `p()`: raw = (P^2) W^T per element, never stored,
    /// fused with what `mode` says (`k`: the kick's arguments, or for the clamp and the
    /// mask the output `k.v`, the bound `k.c` and the mask's g `k.vin`).
    fn sw_after(&self, k: KickArgs, mode: Sw) -> Result<()> {
        let j = self.job();
        let mut a = SwArgs {
            k,
            p: self.p() as u64,
            w: addr::raw(j.w),
            r: j.r as i64,
            mode: mode as i32,
            pad_: 0,
        };
        self.sw(&mut a)
    }

    /// `P = v U` into `p()`, then `sw_after`.
    fn gamma_fused(&self, v: usize, k: KickArgs, mode: Sw) -> Result<()> {
        self.vu(v, self.p())?;
        self.sw_after(k, mode)
    }

    /// One kick-drift-kick step from the velocity `v_from` (read by the first
    /// Christoffel evaluation and kick only; may be `v`) to the state `(x, v)` (`x`
    /// 0: no drift), with `raw` a `[B, D]` workspace; the step's new `x`, `v` also go to
    /// `tx`, `tv` where nonzero (the trajectory rows).
    fn lf_step(
        &self,
        x: usize,
        v_from: usize,
        v: usize,
        raw: usize,
        tx: usize,
        tv: usize,
    ) -> Result<()> {
        if self.fused() {
            self.gamma_fused(v_from, self.kick_args(v_from, v, 0, x, tx, 0), Sw::Kick)?;
            return self.gamma_fused(v, self.kick_args(v, v, 0, 0, 0, tv), Sw::Kick);
        }
        let p = self.p();
        self.gamma_raw(v_from, raw, p, p)?;
        self.kick(v_from, v, raw, x, tx, 0)?;
        self.gamma_raw(v, raw, p, p)?;
        self.kick(v, v, raw, 0, 0, tv)
    }

    /// The products of the Christoffel vjp at `v` once `g' = g 1[|raw| <= c]` is in
    /// `gp` and `P = v U`, `S = P^2` in `p`, `s`: `dW (+)= g'^T S`, `Q = g' W` (into
    /// `s`, consumed by then), `dP = 2 P Q` (`geo_dp`), `dv (+)= dP U^T`,
    /// `dU (+)= v^T dP`; only what `out` asks for.
    fn vjp_products(&self, v: usize, p: usize, s: usize, gp: usize, out: VjpOut) -> Result<()> {
        let j = self.job();
        let (u, w) = (self.dr(at(j.u)), self.dr(at(j.w)));
        if out.dw.0 != 0 {
            let (dw, beta) = (self.dr(out.dw.0), out.dw.1);
            self.gemm(Trans::T, self.bd(gp), Trans::N, self.br(s), dw, beta)?;
        }
        if out.dv.0 == 0 && out.du.0 == 0 {
            return Ok(());
        }
        let q = s;
        self.gemm(Trans::N, self.bd(gp), Trans::N, w, self.br(q), 0.0)?;
        self.ew("geo_dp", q, p, (j.b * j.r) as i64, 0.0)?;
        if out.dv.0 != 0 {
            let (dv, beta) = (self.bd(out.dv.0), out.dv.1);
            self.gemm(Trans::N, self.br(q), Trans::T, u, dv, beta)?;
        }
        if out.du.0 != 0 {
            let (du, beta) = (self.dr(out.du.0), out.du.1);
            self.gemm(Trans::T, self.bd(v), Trans::N, self.br(q), du, beta)?;
        }
        Ok(())
    }

    /// The leapfrog backward's adjoint update at one kick (`geo_adj`): with
    /// `l = lv_in` (0: zeros), `df (+)= h l` (`=` where `first`), `g = 1[|raw| <= c]
    /// (-h l)` over `g` = `gamma_raw` at the kick's input, `lv = l (1 - h mu) + dt gx`
    /// (`gx` 0: none); the kick's vjp then adds its `dv` to `lv`.
    fn adj(&self, lv_in: usize, lv: usize, g: usize, gx: usize, first: bool) -> Result<()> {
        let j = self.job();
        let n = (j.b * j.d) as i64;
        let mut a = AdjArgs {
            n,
            d: j.d as i64,
            lv_in: lv_in as u64,
            lv: lv as u64,
            g: g as u64,
            df: addr::raw(j.df),
            gx: gx as u64,
            mu: addr::raw(j.mu),
            h: 0.5 * j.dt,
            dt: j.dt,
            c: j.c,
            df_init: i32::from(first),
            vec: self.bd_vec(&[lv_in, lv, g, at(j.df), gx]),
        };
        self.launch("geo_adj", n, &mut a)
    }
}

/// The route on the GPU: cuBLAS products and the op's generic module's kernels on the
/// op's stream.
pub(super) struct GemmRoute<'a> {
    dev: &'a CudaDevice,
    stream: &'a Stream,
    job: &'a Job,
    plan: RoutePlan,
    slot: std::sync::Arc<std::sync::Mutex<cublas::Slot>>,
    p: Workspace<'a>,
    /// The op's own workspace (`plan.layout.bytes`).
    ws: Option<Workspace<'a>>,
}

impl<'a> GemmRoute<'a> {
    /// Takes everything the route needs (cuBLAS's slot, the `[B, R]` products and the
    /// layout's bytes for the op) before any work is queued, so that a failure here
    /// (out of memory) can still leave the op to the generic kernels.
    pub(super) fn new(
        dev: &'a CudaDevice,
        job: &'a Job,
        stream: &'a Stream,
        plan: RoutePlan,
    ) -> Result<Self> {
        let extra = plan.layout.bytes;
        Ok(GemmRoute {
            dev,
            stream,
            job,
            plan,
            slot: dev.blas.slot(dev, stream.raw)?,
            p: Workspace::new(dev, job.b * job.r * job.dtype.size(), stream.raw)?,
            ws: if extra > 0 {
                Some(Workspace::new(dev, extra, stream.raw)?)
            } else {
                None
            },
        })
    }

    /// Runs `kind` through the route.
    pub(super) fn run(&self, kind: Kind) -> Result<()> {
        run_route(self, kind, &self.plan.layout)
    }
}

impl Steps for GemmRoute<'_> {
    fn job(&self) -> &Job {
        self.job
    }

    fn p(&self) -> usize {
        addr::raw(self.p.addr()) as usize
    }

    fn ws(&self) -> usize {
        self.ws.as_ref().map_or(0, |w| addr::raw(w.addr()) as usize)
    }

    fn gemm(&self, op_a: Trans, a: Mat, op_b: Trans, b: Mat, c: Mat, beta: f64) -> Result<()> {
        let g = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        cublas::gemm_ex(
            &g,
            &GemmPlan::new(
                self.job.dtype,
                op_a,
                a,
                op_b,
                b,
                c,
                1.0,
                beta,
                1,
                self.plan.tf32,
            ),
        )
    }

    fn launch<A: Any>(&self, name: &'static str, n: i64, args: &mut A) -> Result<()> {
        let grid = grid_for(self.dev, n);
        launch_one(
            self.dev,
            self.plan.module,
            names::generic_kernel(name, self.job.dtype)?,
            grid,
            NT,
            0,
            self.stream,
            args,
        )
    }

    fn copy(&self, dst: usize, src: usize, bytes: usize) -> Result<()> {
        self.dev
            .memcpy_async(dst as u64, src as u64, bytes, self.stream.raw)
    }

    fn fused(&self) -> bool {
        self.plan.sw_smem > 0
    }

    fn sw(&self, a: &mut SwArgs) -> Result<()> {
        crate::ensure!(
            self.plan.sw_smem > 0,
            FK_ERROR_INTERNAL,
            "geo_sw without its shared memory"
        );
        // persistent: a block per SM at most (W fills its shared memory)
        let grid = self
            .job
            .b
            .div_ceil(sw_m(self.job.dtype))
            .clamp(1, self.dev.sm_count.max(1) as usize);
        let smem = self.plan.sw_smem;
        launch_one(
            self.dev,
            self.plan.module,
            names::generic_kernel("geo_sw", self.job.dtype)?,
            grid as u32,
            NT,
            smem,
            self.stream,
            a,
        )
    }
}

/// Runs `kind` through the route `r` with workspace layout `l`.
pub(super) fn run_route(r: &impl Steps, kind: Kind, l: &Layout) -> Result<()> {
    match kind {
        Kind::ChristoffelForward => chr_fwd_gemm(r),
        Kind::LeapfrogForward => lf_fwd_gemm(r, l),
        Kind::ChristoffelBackward => chr_bwd_gemm(r, l),
        Kind::LeapfrogBackward => lf_bwd_gemm(r, l),
    }
}

/// The Christoffel forward through the GEMM route: `gamma_raw`, then the clamp in
/// place (skipped for `c = +inf`).
fn chr_fwd_gemm(r: &impl Steps) -> Result<()> {
    let job = r.job();
    if r.fused() {
        let k = r.kick_args(0, at(job.gamma), 0, 0, 0, 0);
        return r.gamma_fused(at(job.v0), k, Sw::Clamp);
    }
    r.gamma_raw(at(job.v0), at(job.gamma), r.p(), r.p())?;
    if job.c.is_finite() {
        r.ew("geo_clamp", at(job.gamma), 0, (job.b * job.d) as i64, job.c)?;
    }
    Ok(())
}

/// The leapfrog forward through the GEMM route: the state lives in `x_out` (copied
/// from `x0` unless in place) and `v_out` (the first kick reads `v0`); each step
/// (`lf_step`) is `gamma_raw(v)` into the `[B, D]` workspace, the first kick with the
/// drift, `gamma_raw(vh)`, the second kick; the kicks also write the trajectory rows.
fn lf_fwd_gemm(r: &impl Steps, l: &Layout) -> Result<()> {
    let job = r.job();
    let bytes = job.b * job.d * job.dtype.size();
    if job.x_out != job.x0 {
        r.copy(at(job.x_out), at(job.x0), bytes)?;
    }
    let traj = |t: usize, k: usize| {
        if job.traj.is_none() {
            0
        } else {
            at(job.traj) + (2 * t + k) * bytes
        }
    };
    for t in 0..job.steps {
        let v_from = if t == 0 { at(job.v0) } else { at(job.v_out) };
        r.lf_step(
            at(job.x_out),
            v_from,
            at(job.v_out),
            r.ws() + l.raw,
            traj(t, 0),
            traj(t, 1),
        )?;
    }
    Ok(())
}

/// The Christoffel backward through the GEMM route (strict products; the flag is
/// ignored as in the fast kernels): `P = v U`, `S = P^2`, `raw = S W^T` into a
/// `[B, D]` workspace, `g' = g 1[|raw| <= c]` there (`geo_mask`), then the vjp's
/// products (`vjp_products`). cuBLAS's products are deterministic, so dU and dW are
/// reproducible run to run.
fn chr_bwd_gemm(r: &impl Steps, l: &Layout) -> Result<()> {
    let job = r.job();
    let (s, raw) = (r.ws() + l.s, r.ws() + l.raw);
    if r.fused() {
        // g' straight into the raw workspace; S for the vjp's products from P
        r.vu(at(job.v0), r.p())?;
        r.ew("geo_square", s, r.p(), (job.b * job.r) as i64, 0.0)?;
        r.sw_after(r.kick_args(at(job.g), raw, 0, 0, 0, 0), Sw::Mask)?;
    } else {
        r.gamma_raw(at(job.v0), raw, r.p(), s)?;
        r.ew("geo_mask", raw, at(job.g), (job.b * job.d) as i64, job.c)?;
    }
    r.vjp_products(
        at(job.v0),
        r.p(),
        s,
        raw,
        VjpOut {
            dv: (at(job.dv), 0.0),
            du: (at(job.du), 0.0),
            dw: (at(job.dw), 0.0),
        },
    )
}

/// The leapfrog backward through the GEMM route (strict products), the adjoint sweep
/// of `lf_fwd_gemm` (docs/geodesic.md, "Its backward"). `dx0 = gx` (`geo_copy`; 0
/// without `gx`); unless that is all, `v_1 .. v_{T-1}` come from the trajectory or
/// are recomputed into the slab (`lf_step` without `x`), and per step t = T-1 .. 0:
/// `gamma_raw(v_t)` (keeping `P0`, `S0`), the first kick recomputes `vh`,
/// `gamma_raw(vh)`; `geo_adj` (`df += h lv`, `g' = mask (-h lv)`,
/// `lv = lv (1 - h mu) + dt gx`) and the vjp at `vh` (adds its `dv` to `lv`, now
/// `lvh`); `geo_adj` again (`df += h lvh`, `g' = mask (-h lvh)`, `lv = lvh (1 - h mu)`)
/// and the vjp at `v_t`. `lv` lives in `dv0` when it is wanted. `dU`, `dW`: the first
/// product overwrites them, the other `4T - 1` add (cuBLAS beta = 1; deterministic).
fn lf_bwd_gemm(r: &impl Steps, l: &Layout) -> Result<()> {
    let job = r.job();
    let n = (job.b * job.d) as i64;
    if job.dx.is_some() {
        r.ew("geo_copy", at(job.dx), at(job.gx), n, 0.0)?;
    }
    if !lf_bwd_sweeps(job) {
        return Ok(());
    }
    let ws = r.ws();
    let (p0, s0, p1, s1) = (ws + l.p0, ws + l.s, r.p(), ws + l.s1);
    let (raw0, raw1, vh) = (ws + l.raw, ws + l.raw1, ws + l.vh);
    let lv = if job.dv.is_some() {
        at(job.dv)
    } else {
        ws + l.lv
    };
    let row = job.b * job.d * job.dtype.size();
    // v_t: v0, the trajectory's traj[t-1][1], or the slab's row t-1
    let v_at = |t: usize| {
        if t == 0 {
            at(job.v0)
        } else if job.traj.is_some() {
            at(job.traj) + (2 * t - 1) * row
        } else {
            ws + l.slab + (t - 1) * l.bd
        }
    };
    if job.traj.is_none() {
        for t in 1..job.steps {
            r.lf_step(0, v_at(t - 1), v_at(t), raw0, 0, 0)?;
        }
    }
    for t in (0..job.steps).rev() {
        let first = t + 1 == job.steps;
        let params = if first { 0.0 } else { 1.0 };
        let v = v_at(t);
        r.gamma_raw(v, raw0, p0, s0)?;
        r.kick(v, vh, raw0, 0, 0, 0)?;
        r.gamma_raw(vh, raw1, p1, s1)?;
        // the second kick: cotangent -h lv at vh
        r.adj(
            if first { at(job.gv) } else { lv },
            lv,
            raw1,
            at(job.gx),
            first,
        )?;
        r.vjp_products(
            vh,
            p1,
            s1,
            raw1,
            VjpOut {
                dv: (lv, 1.0),
                du: (at(job.du), params),
                dw: (at(job.dw), params),
            },
        )?;
        // the first kick: cotangent -h lvh at v_t (dv0 = lv after step 0, if wanted)
        r.adj(lv, lv, raw0, 0, false)?;
        r.vjp_products(
            v,
            p0,
            s0,
            raw0,
            VjpOut {
                dv: (if t > 0 || job.dv.is_some() { lv } else { 0 }, 1.0),
                du: (at(job.du), 1.0),
                dw: (at(job.dw), 1.0),
            },
        )?;
    }
    Ok(())
}
