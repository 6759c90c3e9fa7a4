//! CPU geodesic flow ops (docs/ops.md section 5): the fallback without a GPU and the
//! oracle the CUDA kernels are tested against.
//!
//! Every row is independent; rows are processed in parallel with rayon. All
//! arithmetic is in f64 (f32 inputs are widened once and the results rounded once),
//! so the oracle is at least as accurate as the kernels. The clamp bound of an f32
//! op is rounded to f32 first, as the kernels see it.
//!
//! `dU`/`dW` sum over the batch: rows are split into fixed chunks (their number
//! depends only on the sizes), each chunk accumulates its own partial sums, and
//! the partials are added in chunk order, so results do not depend on the number
//! of threads.
//!
//! Memory: `ops::geodesic` validated every address of the `Job` (dtype, shape,
//! contiguity, device; outputs disjoint from the inputs and from each other, except
//! the exact in-place forms `gamma == v`, `x_out == x0`, `v_out == v0`). The reads
//! and writes (`load_into`, `store`: `cpu::host_slice` over one row at a time) rely on
//! that, and on this module's access pattern: a row of an output is written only by
//! the thread that processes the row, after it read that row of every input (so an
//! in-place output row and its input row are never borrowed at once), and the
//! parameter gradients are written once, after the parallel part.
//!
//! An absent operand (`None`) is what the op says it means: an optional input (`f`,
//! `mu`, `gx`, `gv`) reads as zeros, an output not asked for is not written.

use rayon::prelude::*;

use crate::addr::Addr;
use crate::cpu::{Real, element, host_slice, host_slice_mut};
use crate::dtype::DType;
use crate::error::Result;
use crate::plan::geodesic::{Job, Kind};

/// Reads `n` elements at element offset `off` of the operand at `base` as f64 (zeros
/// where the operand is absent).
///
/// # Safety
/// `host_slice`'s contract for those elements (the module documentation says why it
/// holds here).
unsafe fn load<T: Real>(base: Option<Addr>, off: usize, n: usize) -> Vec<f64> {
    let mut v = vec![0.0; n];
    // SAFETY: the caller's contract.
    unsafe { load_into::<T>(base, off, &mut v) };
    v
}

/// `load` into `out` (`out.len()` elements).
///
/// # Safety
/// As `load`.
unsafe fn load_into<T: Real>(base: Option<Addr>, off: usize, out: &mut [f64]) {
    if base.is_none() {
        out.fill(0.0);
        return;
    }
    // SAFETY: the caller's contract.
    let src: &[T] = unsafe { host_slice(element::<T>(base, off), out.len()) };
    for (o, s) in out.iter_mut().zip(src) {
        *o = s.to_f64();
    }
}

/// Writes `vals` at element offset `off` of the output at `base` (nothing where the
/// output is absent).
///
/// # Safety
/// `host_slice_mut`'s contract for those elements: no other thread reads or writes
/// them meanwhile, and no slice of an input over them is alive (an in-place row is
/// read completely before it is written).
unsafe fn store<T: Real>(base: Option<Addr>, off: usize, vals: &[f64]) {
    if base.is_none() {
        return;
    }
    // SAFETY: the caller's contract.
    let dst: &mut [T] = unsafe { host_slice_mut(element::<T>(base, off), vals.len()) };
    for (d, v) in dst.iter_mut().zip(vals) {
        *d = T::from_f64(*v);
    }
}

/// The low-rank Christoffel map of one op: `U`, `W` widened, and the clamp bound.
struct Model {
    d: usize,
    r: usize,
    u: Vec<f64>,
    w: Vec<f64>,
    c: f64,
}

/// Per-thread scratch for one row.
struct Work {
    p: Vec<f64>,
    s: Vec<f64>,
    raw: Vec<f64>,
    q: Vec<f64>,
}

impl Model {
    fn new<T: Real>(job: &Job) -> Model {
        let n = job.d * job.r;
        let c = if job.dtype == DType::F32 {
            (job.c as f32) as f64
        } else {
            job.c
        };
        Model {
            d: job.d,
            r: job.r,
            // SAFETY: `U` and `W` are [D, R] inputs (module documentation).
            u: unsafe { load::<T>(job.u, 0, n) },
            w: unsafe { load::<T>(job.w, 0, n) },
            c,
        }
    }

    fn work(&self) -> Work {
        Work {
            p: vec![0.0; self.r],
            s: vec![0.0; self.r],
            raw: vec![0.0; self.d],
            q: vec![0.0; self.r],
        }
    }

    /// `p = v U`, `s = p^2`, `raw = s W^T` into `wk`.
    fn raw(&self, v: &[f64], wk: &mut Work) {
        let r = self.r;
        wk.p.fill(0.0);
        for (d, &vd) in v.iter().enumerate() {
            let urow = &self.u[d * r..(d + 1) * r];
            for (p, &u) in wk.p.iter_mut().zip(urow) {
                *p += vd * u;
            }
        }
        for (s, &p) in wk.s.iter_mut().zip(&wk.p) {
            *s = p * p;
        }
        for (d, raw) in wk.raw.iter_mut().enumerate() {
            let wrow = &self.w[d * r..(d + 1) * r];
            *raw = wk.s.iter().zip(wrow).map(|(s, w)| s * w).sum();
        }
    }

    /// `clamp(raw, -c, c)`; NaN passes through (as torch.clamp).
    fn clamp(&self, raw: f64) -> f64 {
        if raw < -self.c {
            -self.c
        } else if raw > self.c {
            self.c
        } else {
            raw
        }
    }

    /// The clamp's derivative: `1[-c <= raw <= c]` (inclusive; 0 for NaN).
    fn pass(&self, raw: f64) -> bool {
        raw >= -self.c && raw <= self.c
    }

    /// `out = Gamma(v)`.
    fn gamma(&self, v: &[f64], wk: &mut Work, out: &mut [f64]) {
        self.raw(v, wk);
        for (o, &raw) in out.iter_mut().zip(&wk.raw) {
            *o = self.clamp(raw);
        }
    }

    /// Vector-Jacobian product of `Gamma` at `v` with `g` (both [D]):
    /// `dv = dp U^T` (written), `dU += v^T dp`, `dW += g'^T s` (accumulated into
    /// `params`), each where wanted.
    fn vjp(
        &self,
        v: &[f64],
        g: &[f64],
        wk: &mut Work,
        dv: Option<&mut [f64]>,
        params: &mut ParamGrads,
    ) {
        let r = self.r;
        self.raw(v, wk);
        // g' = g * 1[-c <= raw <= c], kept in wk.raw
        for (raw, &gd) in wk.raw.iter_mut().zip(g) {
            *raw = if self.pass(*raw) { gd } else { 0.0 };
        }
        // q = g' W, dp = 2 p q (kept in wk.q)
        wk.q.fill(0.0);
        for (d, &gp) in wk.raw.iter().enumerate() {
            let wrow = &self.w[d * r..(d + 1) * r];
            for (q, &w) in wk.q.iter_mut().zip(wrow) {
                *q += gp * w;
            }
        }
        for (q, &p) in wk.q.iter_mut().zip(&wk.p) {
            *q *= 2.0 * p;
        }
        if let Some(dv) = dv {
            for (d, out) in dv.iter_mut().enumerate() {
                let urow = &self.u[d * r..(d + 1) * r];
                *out = wk.q.iter().zip(urow).map(|(dp, u)| dp * u).sum();
            }
        }
        if let Some(dw) = &mut params.dw {
            for (d, &gp) in wk.raw.iter().enumerate() {
                for (acc, &s) in dw[d * r..(d + 1) * r].iter_mut().zip(&wk.s) {
                    *acc += gp * s;
                }
            }
        }
        if let Some(du) = &mut params.du {
            for (d, &vd) in v.iter().enumerate() {
                for (acc, &dp) in du[d * r..(d + 1) * r].iter_mut().zip(&wk.q) {
                    *acc += vd * dp;
                }
            }
        }
    }
}

/// Rows per parallel chunk: a function of the sizes only (determinism), at most
/// 256 chunks, and few enough that per-chunk `[D, R]` partials stay under ~256 MB.
fn chunking(b: usize, partial_len: usize) -> (usize, usize) {
    let by_mem = if partial_len == 0 {
        256
    } else {
        ((256usize << 20) / (partial_len * 8)).clamp(1, 256)
    };
    let chunks = b.div_ceil(16).clamp(1, 256).min(by_mem);
    let rows = b.div_ceil(chunks).max(1);
    (rows, b.div_ceil(rows))
}

/// Runs `row(i, &mut state)` for every row in parallel chunks, each chunk with its
/// own `state` (from `init`), and returns the chunk states in chunk order.
fn for_rows<S: Send, I, F>(b: usize, partial_len: usize, init: I, row: F) -> Vec<S>
where
    I: Fn() -> S + Sync,
    F: Fn(usize, &mut S) + Sync,
{
    let (rows, chunks) = chunking(b, partial_len);
    (0..chunks)
        .into_par_iter()
        .map(|c| {
            let mut st = init();
            for i in c * rows..((c + 1) * rows).min(b) {
                row(i, &mut st);
            }
            st
        })
        .collect()
}

/// A chunk's `[D, R]` partial sums of `dU` and `dW` (`None`: not wanted).
struct ParamGrads {
    du: Option<Vec<f64>>,
    dw: Option<Vec<f64>>,
}

impl ParamGrads {
    fn new(job: &Job) -> ParamGrads {
        let zeros = |out: Option<Addr>| out.map(|_| vec![0.0; job.d * job.r]);
        ParamGrads {
            du: zeros(job.du),
            dw: zeros(job.dw),
        }
    }
}

/// Adds the chunks' partials in chunk order and writes `dU` and `dW` (zeros without
/// rows), where wanted.
fn write_params<T: Real>(job: &Job, parts: impl Iterator<Item = ParamGrads>) {
    let mut sum = ParamGrads::new(job);
    for p in parts {
        for (sum, part) in [(&mut sum.du, p.du), (&mut sum.dw, p.dw)] {
            if let (Some(sum), Some(part)) = (sum, part) {
                for (s, x) in sum.iter_mut().zip(&part) {
                    *s += x;
                }
            }
        }
    }
    // SAFETY: [D, R] outputs, written once after the parallel part (module
    // documentation).
    unsafe {
        store::<T>(job.du, 0, sum.du.as_deref().unwrap_or_default());
        store::<T>(job.dw, 0, sum.dw.as_deref().unwrap_or_default());
    }
}

fn christoffel_forward_t<T: Real>(job: &Job) {
    let m = Model::new::<T>(job);
    let (d, j) = (job.d, *job);
    for_rows(
        job.b,
        0,
        || (m.work(), vec![0.0; d], vec![0.0; d]),
        |i, (wk, v, out)| {
            // SAFETY: row i of the validated operands, each input row read before
            // the output rows are written, by this thread only (module documentation).
            unsafe {
                load_into::<T>(j.v0, i * d, v);
                m.gamma(v, wk, out);
                store::<T>(j.gamma, i * d, out);
            }
        },
    );
}

fn christoffel_backward_t<T: Real>(job: &Job) {
    let m = Model::new::<T>(job);
    let (d, j) = (job.d, *job);
    let parts = for_rows(
        job.b,
        d * job.r,
        || ChunkGrads {
            wk: m.work(),
            a: vec![0.0; d],
            g: vec![0.0; d],
            dv: vec![0.0; d],
            params: ParamGrads::new(&j),
        },
        |i, st| {
            // SAFETY: row i of the validated operands, each input row read before
            // the output rows are written, by this thread only (module documentation).
            unsafe {
                load_into::<T>(j.v0, i * d, &mut st.a);
                load_into::<T>(j.g, i * d, &mut st.g);
                m.vjp(
                    &st.a,
                    &st.g,
                    &mut st.wk,
                    (j.dv.is_some()).then_some(&mut st.dv[..]),
                    &mut st.params,
                );
                store::<T>(j.dv, i * d, &st.dv);
            }
        },
    );
    write_params::<T>(job, parts.into_iter().map(|p| p.params));
}

/// A chunk's scratch and `[D, R]` partial sums.
struct ChunkGrads {
    wk: Work,
    a: Vec<f64>,
    g: Vec<f64>,
    dv: Vec<f64>,
    params: ParamGrads,
}

/// The step constants and per-row inputs of a leapfrog.
struct Flow<'a> {
    m: &'a Model,
    h: f64,
    dt: f64,
    /// `mu` widened, or zeros
    mu: Vec<f64>,
}

impl<'a> Flow<'a> {
    fn new<T: Real>(m: &'a Model, job: &Job) -> Flow<'a> {
        Flow {
            m,
            h: 0.5 * job.dt,
            dt: job.dt,
            // SAFETY: `mu` is a [D] input (module documentation).
            mu: unsafe { load::<T>(job.mu, 0, job.d) },
        }
    }

    /// One kick: `v += h (f - Gamma(v) - mu v)` in place (`gam` is scratch).
    fn kick(&self, v: &mut [f64], f: &[f64], wk: &mut Work, gam: &mut [f64]) {
        self.m.gamma(v, wk, gam);
        for (((v, &f), &g), &mu) in v.iter_mut().zip(f).zip(gam.iter()).zip(&self.mu) {
            *v += self.h * (f - g - mu * *v);
        }
    }

    /// One kick-drift-kick step on `(x, v)`.
    fn step(&self, x: &mut [f64], v: &mut [f64], f: &[f64], wk: &mut Work, gam: &mut [f64]) {
        self.kick(v, f, wk, gam);
        for (x, &vh) in x.iter_mut().zip(v.iter()) {
            *x += self.dt * vh;
        }
        self.kick(v, f, wk, gam);
    }
}

fn leapfrog_forward_t<T: Real>(job: &Job) {
    let m = Model::new::<T>(job);
    let fl = Flow::new::<T>(&m, job);
    let (b, d, j) = (job.b, job.d, *job);
    for_rows(
        b,
        0,
        || {
            (
                m.work(),
                vec![0.0; d],
                vec![0.0; d],
                vec![0.0; d],
                vec![0.0; d],
            )
        },
        |i, (wk, x, v, f, gam)| {
            // SAFETY: row i of the validated operands, each input row read before
            // the output rows are written, by this thread only (module documentation).
            unsafe {
                load_into::<T>(j.x0, i * d, x);
                load_into::<T>(j.v0, i * d, v);
                load_into::<T>(j.f, i * d, f);
                for t in 0..j.steps {
                    fl.step(x, v, f, wk, gam);
                    store::<T>(j.traj, ((2 * t) * b + i) * d, x);
                    store::<T>(j.traj, ((2 * t + 1) * b + i) * d, v);
                }
                store::<T>(j.x_out, i * d, x);
                store::<T>(j.v_out, i * d, v);
            }
        },
    );
}

/// Per-chunk state of the leapfrog backward.
struct LfChunk {
    wk: Work,
    /// `v_t` for t = 0..T, row-major [T][D].
    vs: Vec<f64>,
    vh: Vec<f64>,
    f: Vec<f64>,
    gam: Vec<f64>,
    lx: Vec<f64>,
    lv: Vec<f64>,
    lvh: Vec<f64>,
    g: Vec<f64>,
    dvg: Vec<f64>,
    df: Vec<f64>,
    params: ParamGrads,
}

#[allow(clippy::needless_range_loop)] // the adjoint updates read clearest with one index
fn leapfrog_backward_t<T: Real>(job: &Job) {
    let m = Model::new::<T>(job);
    let fl = Flow::new::<T>(&m, job);
    let (h, mu) = (fl.h, &fl.mu);
    let (b, d, steps, j) = (job.b, job.d, job.steps, *job);
    let parts = for_rows(
        b,
        d * job.r,
        || LfChunk {
            wk: m.work(),
            vs: vec![0.0; steps * d],
            vh: vec![0.0; d],
            f: vec![0.0; d],
            gam: vec![0.0; d],
            lx: vec![0.0; d],
            lv: vec![0.0; d],
            lvh: vec![0.0; d],
            g: vec![0.0; d],
            dvg: vec![0.0; d],
            df: vec![0.0; d],
            params: ParamGrads::new(&j),
        },
        |i, st| {
            // SAFETY: row i of the validated operands, each input row read before
            // the output rows are written, by this thread only (module documentation).
            unsafe {
                // the states v_t at the start of each step: from the trajectory, or recomputed
                load_into::<T>(j.v0, i * d, &mut st.vs[..d]);
                load_into::<T>(j.f, i * d, &mut st.f);
                if j.traj.is_some() {
                    for t in 1..steps {
                        load_into::<T>(
                            j.traj,
                            ((2 * (t - 1) + 1) * b + i) * d,
                            &mut st.vs[t * d..(t + 1) * d],
                        );
                    }
                } else if steps > 1 {
                    let mut x = vec![0.0; d];
                    let mut v = st.vs[..d].to_vec();
                    for t in 1..steps {
                        fl.step(&mut x, &mut v, &st.f, &mut st.wk, &mut st.gam);
                        st.vs[t * d..(t + 1) * d].copy_from_slice(&v);
                    }
                }
                load_into::<T>(j.gx, i * d, &mut st.lx);
                load_into::<T>(j.gv, i * d, &mut st.lv);
                st.df.fill(0.0);
                for t in (0..steps).rev() {
                    let v = &st.vs[t * d..(t + 1) * d];
                    // recompute vh = v + h (f - Gamma(v) - mu v)
                    st.vh.copy_from_slice(v);
                    fl.kick(&mut st.vh, &st.f, &mut st.wk, &mut st.gam);
                    // second kick: v' = vh + h (f - Gamma(vh) - mu vh), adjoint a = lv
                    for k in 0..d {
                        st.df[k] += h * st.lv[k];
                        st.g[k] = -h * st.lv[k];
                    }
                    m.vjp(&st.vh, &st.g, &mut st.wk, Some(&mut st.dvg), &mut st.params);
                    for k in 0..d {
                        st.lvh[k] = st.lv[k] * (1.0 - h * mu[k]) + j.dt * st.lx[k] + st.dvg[k];
                        st.df[k] += h * st.lvh[k];
                        st.g[k] = -h * st.lvh[k];
                    }
                    // first kick: vh = v + h (f - Gamma(v) - mu v)
                    m.vjp(v, &st.g, &mut st.wk, Some(&mut st.dvg), &mut st.params);
                    for k in 0..d {
                        st.lv[k] = st.lvh[k] * (1.0 - h * mu[k]) + st.dvg[k];
                    }
                }
                store::<T>(j.dx, i * d, &st.lx);
                store::<T>(j.dv, i * d, &st.lv);
                store::<T>(j.df, i * d, &st.df);
            }
        },
    );
    write_params::<T>(job, parts.into_iter().map(|p| p.params));
}

/// `kind` in the storage type `T`.
fn run_t<T: Real>(kind: Kind, job: &Job) {
    match kind {
        Kind::ChristoffelForward => christoffel_forward_t::<T>(job),
        Kind::ChristoffelBackward => christoffel_backward_t::<T>(job),
        Kind::LeapfrogForward => leapfrog_forward_t::<T>(job),
        Kind::LeapfrogBackward => leapfrog_backward_t::<T>(job),
    }
}

/// Runs the op `kind` on `job` (validated by `ops::geodesic`).
pub fn run(kind: Kind, job: &Job) -> Result<()> {
    match job.dtype {
        DType::F32 => run_t::<f32>(kind, job),
        DType::F64 => run_t::<f64>(kind, job),
        _ => unreachable!("ops::geodesic admits f32 and f64 only"),
    }
    Ok(())
}
