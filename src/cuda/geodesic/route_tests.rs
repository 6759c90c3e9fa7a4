//! The route's op sequences (`route::Steps`) on the host: products through the CPU
//! GEMM, the elementwise kernels' formulas in f64, against the CPU backend. Tests the
//! sequences, the workspace layout (`plan::Layout`) and the accumulation (beta)
//! without a GPU; the GPU tests check the kernels themselves.

use std::any::Any;

use super::args::{AdjArgs, EwArgs, KickArgs, Sw, SwArgs};
use super::plan::Layout;
use super::route::{Steps, run_route};
use crate::addr::Addr;
use crate::dtype::DType;
use crate::error::Result;
use crate::plan::geodesic::{Job, Kind};
use crate::plan::linalg::{GemmPlan, Mat, Trans};
use crate::testing::Lcg;

/// A host buffer of `n` elements of `dtype` (8-byte aligned storage).
struct HostBuf {
    words: Vec<u64>,
    dtype: DType,
    n: usize,
}

impl HostBuf {
    fn new(dtype: DType, vals: &[f64]) -> HostBuf {
        let b = HostBuf {
            words: vec![0; (vals.len() * dtype.size()).div_ceil(8).max(1)],
            dtype,
            n: vals.len(),
        };
        for (i, &v) in vals.iter().enumerate() {
            // SAFETY: inside the buffer.
            unsafe { put(dtype, b.addr(), i, v) };
        }
        b
    }
    fn nan(dtype: DType, n: usize) -> HostBuf {
        HostBuf::new(dtype, &vec![f64::NAN; n])
    }
    /// NaN-filled buffers of these lengths.
    fn nans(dtype: DType, lens: &[usize]) -> Vec<HostBuf> {
        lens.iter().map(|&n| HostBuf::nan(dtype, n)).collect()
    }
    /// `nans` for the lengths whose bit `1 << k` is in `set`, `None` for the others.
    fn nans_in(dtype: DType, lens: &[usize], set: u32) -> Vec<Option<HostBuf>> {
        lens.iter()
            .enumerate()
            .map(|(k, &n)| (set & (1 << k) != 0).then(|| HostBuf::nan(dtype, n)))
            .collect()
    }
    fn addr(&self) -> usize {
        self.words.as_ptr() as usize
    }
    fn at(&self) -> Option<Addr> {
        // SAFETY: the buffer's own words, which the test keeps alive while the
        // emulated route runs.
        unsafe { Addr::from_ptr(self.words.as_ptr()) }
    }
    fn read(&self) -> Vec<f64> {
        // SAFETY: inside the buffer.
        (0..self.n)
            .map(|i| unsafe { get(self.dtype, self.addr(), i) })
            .collect()
    }
}

/// # Safety
/// Element `i` of `dtype` at `addr` is valid memory.
unsafe fn get(dtype: DType, addr: usize, i: usize) -> f64 {
    unsafe {
        if dtype == DType::F32 {
            *(addr as *const f32).add(i) as f64
        } else {
            *(addr as *const f64).add(i)
        }
    }
}

/// # Safety
/// As `get`, and nothing else refers to the element.
unsafe fn put(dtype: DType, addr: usize, i: usize, v: f64) {
    unsafe {
        if dtype == DType::F32 {
            *(addr as *mut f32).add(i) = v as f32;
        } else {
            *(addr as *mut f64).add(i) = v;
        }
    }
}

/// The route's steps on the host: products through the CPU GEMM, the kernels'
/// formulas in f64 stored in the job's dtype (the GPU tests check the kernels
/// themselves), every access checked against the buffers the op may touch. Tests
/// the op sequences, the workspace layout and the accumulation (beta) without a GPU.
struct HostRoute {
    job: Job,
    layout: Layout,
    p: Vec<u64>,
    ws: Vec<u64>,
    /// `[start, end)` of the job's buffers and the workspaces
    spans: Vec<(usize, usize)>,
    /// `Steps::fused`: the forwards through `sw` (`geo_sw`)
    fused: bool,
}

impl HostRoute {
    /// Runs `kind` through the route on `job`, whose buffers are `bufs`.
    fn run(kind: Kind, job: Job, bufs: &[&HostBuf], fused: bool) {
        let r = HostRoute::with(kind, job, bufs, fused);
        run_route(&r, kind, &r.layout).unwrap();
    }

    fn with(kind: Kind, job: Job, bufs: &[&HostBuf], fused: bool) -> HostRoute {
        let layout = Layout::new(kind, &job, fused).unwrap();
        let p = vec![0u64; (job.b * job.r * job.dtype.size()).div_ceil(8).max(1)];
        // workspaces start poisoned (NaN bit patterns) like device memory may not
        let ws = vec![u64::MAX; layout.bytes.div_ceil(8).max(1)];
        let mut spans: Vec<(usize, usize)> = bufs
            .iter()
            .map(|b| (b.addr(), b.addr() + b.n * b.dtype.size()))
            .collect();
        spans.push((
            p.as_ptr() as usize,
            p.as_ptr() as usize + job.b * job.r * job.dtype.size(),
        ));
        spans.push((ws.as_ptr() as usize, ws.as_ptr() as usize + layout.bytes));
        HostRoute {
            job,
            layout,
            p,
            ws,
            spans,
            fused,
        }
    }

    /// Panics unless `[addr, addr + bytes)` lies inside one known buffer.
    fn check(&self, addr: usize, bytes: usize) {
        assert!(
            self.spans
                .iter()
                .any(|&(a, e)| addr >= a && addr + bytes <= e),
            "access of {bytes} bytes at {addr:#x} outside every buffer"
        );
    }

    fn mat(&self, m: &Mat) {
        let e = self.job.dtype.size();
        if m.rows > 0 && m.cols > 0 {
            self.check(
                crate::addr::raw(m.addr) as usize,
                ((m.rows - 1) * m.ld + m.cols) as usize * e,
            );
        }
    }

    fn at(&self, addr: u64, i: usize) -> f64 {
        let e = self.job.dtype.size();
        self.check(addr as usize + i * e, e);
        // SAFETY: checked above.
        unsafe { get(self.job.dtype, addr as usize, i) }
    }

    fn set(&self, addr: u64, i: usize, v: f64) {
        let e = self.job.dtype.size();
        self.check(addr as usize + i * e, e);
        // SAFETY: checked above; the test owns every buffer.
        unsafe { put(self.job.dtype, addr as usize, i, v) }
    }

    /// The clamp bound as the kernels see it (rounded to the dtype).
    fn bound(&self, c: f64) -> f64 {
        if self.job.dtype == DType::F32 {
            c as f32 as f64
        } else {
            c
        }
    }
}

impl Steps for HostRoute {
    fn job(&self) -> &Job {
        &self.job
    }
    fn p(&self) -> usize {
        self.p.as_ptr() as usize
    }
    fn ws(&self) -> usize {
        self.ws.as_ptr() as usize
    }
    fn gemm(&self, op_a: Trans, a: Mat, op_b: Trans, b: Mat, c: Mat, beta: f64) -> Result<()> {
        for m in [&a, &b, &c] {
            self.mat(m);
        }
        crate::cpu::linalg::gemm(&GemmPlan::new(
            self.job.dtype,
            op_a,
            a,
            op_b,
            b,
            c,
            1.0,
            beta,
            1,
            false,
        ))
    }
    fn launch<A: Any>(&self, name: &'static str, n: i64, args: &mut A) -> Result<()> {
        let args: &mut dyn Any = args;
        let n = n as usize;
        let pass = |raw: f64, c: f64| raw >= -c && raw <= c;
        let clamp = |raw: f64, c: f64| {
            if raw < -c {
                -c
            } else if raw > c {
                c
            } else {
                raw
            }
        };
        let opt = |ptr: u64, i: usize| if ptr == 0 { 0.0 } else { self.at(ptr, i) };
        if let Some(a) = args.downcast_mut::<KickArgs>() {
            assert_eq!(name, "geo_kick");
            let d = a.d as usize;
            for i in 0..n {
                let vi = self.at(a.vin, i);
                let vn = vi
                    + a.h
                        * (opt(a.f, i)
                            - clamp(self.at(a.raw, i), self.bound(a.c))
                            - opt(a.mu, i % d) * vi);
                self.set(a.v, i, vn);
                if a.x != 0 {
                    let xn = self.at(a.x, i) + a.dt * vn;
                    self.set(a.x, i, xn);
                    if a.tx != 0 {
                        self.set(a.tx, i, xn);
                    }
                }
                if a.tv != 0 {
                    self.set(a.tv, i, vn);
                }
            }
        } else if let Some(a) = args.downcast_mut::<AdjArgs>() {
            assert_eq!(name, "geo_adj");
            let (d, c) = (a.d as usize, self.bound(a.c));
            for i in 0..n {
                let l = opt(a.lv_in, i);
                if a.df != 0 {
                    let old = if a.df_init != 0 {
                        0.0
                    } else {
                        self.at(a.df, i)
                    };
                    self.set(a.df, i, old + a.h * l);
                }
                let g = if pass(self.at(a.g, i), c) {
                    -a.h * l
                } else {
                    0.0
                };
                self.set(a.g, i, g);
                self.set(
                    a.lv,
                    i,
                    l * (1.0 - a.h * opt(a.mu, i % d)) + a.dt * opt(a.gx, i),
                );
            }
        } else {
            let a = args.downcast_mut::<EwArgs>().expect("an EwArgs kernel");
            let c = self.bound(a.c);
            for i in 0..n {
                let y = match name {
                    "geo_square" => self.at(a.x, i) * self.at(a.x, i),
                    "geo_dp" => 2.0 * self.at(a.x, i) * self.at(a.y, i),
                    "geo_mask" => {
                        if pass(self.at(a.y, i), c) {
                            self.at(a.x, i)
                        } else {
                            0.0
                        }
                    }
                    "geo_clamp" => clamp(self.at(a.y, i), c),
                    "geo_copy" => {
                        if a.x != 0 {
                            self.at(a.x, i)
                        } else {
                            c
                        }
                    }
                    _ => panic!("no host version of {name}"),
                };
                self.set(a.y, i, y);
            }
        }
        Ok(())
    }
    fn fused(&self) -> bool {
        self.fused
    }
    /// `geo_sw` on the host: raw from `P^2` and W in f64, then the host version of
    /// the kernel it fuses (`geo_kick`, `geo_clamp`, `geo_mask`, above).
    fn sw(&self, a: &mut SwArgs) -> Result<()> {
        assert!(self.fused, "sw without fused");
        let (d, r) = (a.k.d as usize, a.r as usize);
        let n = a.k.n as usize;
        // raw: the clamp and the mask work in place on their output; the kick reads
        // v (maybe in place) and needs raw beside it
        let kick_raw = (a.mode == Sw::Kick as i32).then(|| HostBuf::nan(self.job.dtype, n));
        let raw = kick_raw.as_ref().map_or(a.k.v as usize, HostBuf::addr);
        for i in 0..n {
            let (row, f) = (i / d, i % d);
            let mut acc = 0.0;
            for k in 0..r {
                let p = self.at(a.p, row * r + k);
                acc += p * p * self.at(a.w, f * r + k);
            }
            if kick_raw.is_some() {
                // SAFETY: i < n, raw's length.
                unsafe { put(self.job.dtype, raw, i, acc) };
            } else {
                self.set(a.k.v, i, acc);
            }
        }
        let ni = n as i64;
        match a.mode {
            m if m == Sw::Clamp as i32 => self.ew("geo_clamp", raw, 0, ni, a.k.c),
            m if m == Sw::Mask as i32 => self.ew("geo_mask", raw, a.k.vin as usize, ni, a.k.c),
            _ => {
                let mut k = a.k;
                k.raw = raw as u64;
                let mut spans = self.spans.clone();
                spans.push((raw, raw + n * self.job.dtype.size()));
                let with_raw = HostRoute {
                    job: self.job,
                    layout: self.layout,
                    p: Vec::new(),
                    ws: Vec::new(),
                    spans,
                    fused: true,
                };
                with_raw.launch("geo_kick", ni, &mut k)
            }
        }
    }
    fn copy(&self, dst: usize, src: usize, bytes: usize) -> Result<()> {
        self.check(dst, bytes);
        self.check(src, bytes);
        // SAFETY: both ranges checked; distinct buffers.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }
}

/// `n` values uniform in `[lo, hi)`.
fn random_vec(rng: &mut Lcg, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|_| lo + (hi - lo) * rng.unit_f64()).collect()
}

/// The inputs of one problem: x, v, f, U, W, mu, g, gx, gv.
struct HostProb {
    dtype: DType,
    b: usize,
    d: usize,
    r: usize,
    t: usize,
    x: HostBuf,
    v: HostBuf,
    f: HostBuf,
    u: HostBuf,
    w: HostBuf,
    mu: HostBuf,
    g: HostBuf,
    gx: HostBuf,
    gv: HostBuf,
}

impl HostProb {
    fn new(dtype: DType, b: usize, d: usize, r: usize, t: usize, seed: u64) -> HostProb {
        let mut rng = Lcg(seed);
        let (su, sw) = (1.0 / (d as f64).sqrt(), 1.0 / r as f64);
        let mut m =
            |n: usize, lo: f64, hi: f64| HostBuf::new(dtype, &random_vec(&mut rng, n, lo, hi));
        HostProb {
            dtype,
            b,
            d,
            r,
            t,
            x: m(b * d, -1.0, 1.0),
            v: m(b * d, -1.5, 1.5),
            f: m(b * d, -0.5, 0.5),
            u: m(d * r, -2.0 * su, 2.0 * su),
            w: m(d * r, -2.0 * sw, 2.0 * sw),
            mu: m(d, 0.0, 0.5),
            g: m(b * d, -1.0, 1.0),
            gx: m(b * d, -1.0, 1.0),
            gv: m(b * d, -1.0, 1.0),
        }
    }

    /// A job over the inputs; `opt` bits 1, 2, 4, 8: f, mu, gx, gv given.
    fn job(&self, opt: u32, c: f64) -> Job {
        let mut j = Job::absent(self.dtype, self.b, self.d, self.r);
        j.c = c;
        j.dt = 0.1;
        j.steps = self.t;
        j.x0 = self.x.at();
        j.v0 = self.v.at();
        j.u = self.u.at();
        j.w = self.w.at();
        j.g = self.g.at();
        let on = |bit: u32, b: &HostBuf| if opt & bit != 0 { b.at() } else { None };
        j.f = on(1, &self.f);
        j.mu = on(2, &self.mu);
        j.gx = on(4, &self.gx);
        j.gv = on(8, &self.gv);
        j
    }

    fn inputs(&self) -> Vec<&HostBuf> {
        vec![
            &self.x, &self.v, &self.f, &self.u, &self.w, &self.mu, &self.g, &self.gx, &self.gv,
        ]
    }

    /// `HostRoute::run` over the inputs and `more` (the outputs).
    fn route<'a>(
        &'a self,
        kind: Kind,
        job: Job,
        more: impl IntoIterator<Item = &'a HostBuf>,
        fused: bool,
    ) {
        let mut bufs = self.inputs();
        bufs.extend(more);
        HostRoute::run(kind, job, &bufs, fused);
    }
}

/// `close` for each output given (`got[k]`) against `want[k]`.
#[track_caller]
fn close_given(
    got: &[Option<HostBuf>],
    want: &[Vec<f64>],
    tol: f64,
    what: impl Fn(usize) -> String,
) {
    for (k, o) in got.iter().enumerate() {
        if let Some(o) = o {
            close(&o.read(), &want[k], tol, &what(k));
        }
    }
}

#[track_caller]
fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    let e = if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    };
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.1e}"); // NaN fails too
}

fn tol(dtype: DType) -> f64 {
    if dtype == DType::F32 { 1e-4 } else { 1e-12 }
}

/// The leapfrog backward's op sequence (from the trajectory and recomputing,
/// every optional input and output on and off) against the CPU backend.
#[test]
fn route_leapfrog_backward_matches_the_cpu_backend() {
    // output sets, bits 1, 2, 4, 8, 16: dx0, dv0, df, dU, dW
    let outs = [31u32, 1, 2, 4, 8, 16, 5, 24, 6, 26];
    for dtype in [DType::F64, DType::F32] {
        for (b, d, r, t) in [(5, 7, 3, 3), (3, 9, 40, 1), (1, 1, 1, 2), (4, 6, 2, 4)] {
            let pr = HostProb::new(dtype, b, d, r, t, (b * 1000 + d * 10 + r) as u64);
            let (bd, dr) = (b * d, d * r);
            for opt in 0..16u32 {
                let base = pr.job(opt, 0.6);
                // the trajectory of the CPU forward
                let traj = HostBuf::nan(dtype, t * 2 * bd);
                let (xo, vo) = (HostBuf::nan(dtype, bd), HostBuf::nan(dtype, bd));
                let mut fj = base;
                fj.x_out = xo.at();
                fj.v_out = vo.at();
                fj.traj = traj.at();
                crate::cpu::geodesic::run(Kind::LeapfrogForward, &fj).unwrap();
                // the CPU backend's gradients, all of them
                let want = HostBuf::nans(dtype, &[bd, bd, bd, dr, dr]);
                let mut cj = base;
                [cj.dx, cj.dv, cj.df, cj.du, cj.dw] = [0, 1, 2, 3, 4].map(|k| want[k].at());
                crate::cpu::geodesic::run(Kind::LeapfrogBackward, &cj).unwrap();
                let want: Vec<Vec<f64>> = want.iter().map(HostBuf::read).collect();
                // without the trajectory the recomputing forward also runs fused
                for (with_traj, fused) in [(true, false), (false, false), (false, true)] {
                    for &set in &outs {
                        let got = HostBuf::nans_in(dtype, &[bd, bd, bd, dr, dr], set);
                        let mut j = base;
                        j.traj = if with_traj { traj.at() } else { None };
                        [j.dx, j.dv, j.df, j.du, j.dw] =
                            [0, 1, 2, 3, 4].map(|k| got[k].as_ref().and_then(HostBuf::at));
                        let outs = std::iter::once(&traj).chain(got.iter().flatten());
                        pr.route(Kind::LeapfrogBackward, j, outs, fused);
                        close_given(&got, &want, tol(dtype), |k| {
                            format!(
                                "{dtype:?} B={b} D={d} R={r} T={t} inputs {opt:04b} traj={with_traj} fused={fused} outputs {set:05b}: output {k}"
                            )
                        });
                    }
                }
            }
        }
    }
}

/// The other ops' sequences (shared steps) against the CPU backend, in place too.
#[test]
fn route_forwards_and_christoffel_backward_match_the_cpu_backend() {
    for dtype in [DType::F64, DType::F32] {
        for (b, d, r, t) in [(5, 7, 3, 3), (3, 9, 40, 1), (1, 1, 1, 2)] {
            let pr = HostProb::new(dtype, b, d, r, t, (b * 7 + d * 3 + r) as u64);
            let (bd, dr) = (b * d, d * r);
            let what = format!("{dtype:?} B={b} D={d} R={r} T={t}");
            for (c, fused) in [
                (0.6, false),
                (f64::INFINITY, false),
                (0.6, true),
                (f64::INFINITY, true),
            ] {
                let what = format!("{what} fused={fused}");
                // Christoffel forward, out of place and in place
                let job = pr.job(0, c);
                let want = HostBuf::nan(dtype, bd);
                let mut cj = job;
                cj.gamma = want.at();
                crate::cpu::geodesic::run(Kind::ChristoffelForward, &cj).unwrap();
                for in_place in [false, true] {
                    let (got, place) = if in_place {
                        (HostBuf::new(dtype, &pr.v.read()), "gamma in place")
                    } else {
                        (HostBuf::nan(dtype, bd), "gamma")
                    };
                    cj.gamma = got.at();
                    if in_place {
                        cj.v0 = got.at();
                    }
                    pr.route(Kind::ChristoffelForward, cj, [&got], fused);
                    let what = format!("{place} {what}");
                    close(&got.read(), &want.read(), tol(dtype), &what);
                }
                // Christoffel backward, all outputs and each alone
                let want = HostBuf::nans(dtype, &[bd, dr, dr]);
                let mut cj = job;
                [cj.dv, cj.du, cj.dw] = [0, 1, 2].map(|k| want[k].at());
                crate::cpu::geodesic::run(Kind::ChristoffelBackward, &cj).unwrap();
                let want: Vec<Vec<f64>> = want.iter().map(HostBuf::read).collect();
                for set in [7u32, 1, 2, 4] {
                    let got = HostBuf::nans_in(dtype, &[bd, dr, dr], set);
                    let mut j = job;
                    [j.dv, j.du, j.dw] = [0, 1, 2].map(|k| got[k].as_ref().and_then(HostBuf::at));
                    pr.route(Kind::ChristoffelBackward, j, got.iter().flatten(), fused);
                    close_given(&got, &want, tol(dtype), |k| {
                        format!("christoffel backward {k} of {set:03b} {what}")
                    });
                }
                // leapfrog forward: f, mu on and off, trajectory on and off, in place
                for opt in [0u32, 3] {
                    let job = pr.job(opt, c);
                    let want = HostBuf::nans(dtype, &[bd, bd, t * 2 * bd]);
                    let mut cj = job;
                    [cj.x_out, cj.v_out, cj.traj] = [0, 1, 2].map(|k| want[k].at());
                    crate::cpu::geodesic::run(Kind::LeapfrogForward, &cj).unwrap();
                    for (in_place, with_traj) in [(false, true), (false, false), (true, true)] {
                        let got: Vec<HostBuf> = if in_place {
                            vec![
                                HostBuf::new(dtype, &pr.x.read()),
                                HostBuf::new(dtype, &pr.v.read()),
                                HostBuf::nan(dtype, t * 2 * bd),
                            ]
                        } else {
                            HostBuf::nans(dtype, &[bd, bd, t * 2 * bd])
                        };
                        let mut j = job;
                        [j.x_out, j.v_out, j.traj] = [0, 1, 2].map(|k| got[k].at());
                        if in_place {
                            (j.x0, j.v0) = (j.x_out, j.v_out);
                        }
                        if !with_traj {
                            j.traj = None;
                        }
                        pr.route(Kind::LeapfrogForward, j, &got, fused);
                        let n = if with_traj { 3 } else { 2 };
                        for k in 0..n {
                            close(
                                &got[k].read(),
                                &want[k].read(),
                                tol(dtype),
                                &format!(
                                    "leapfrog forward {k} f/mu {opt} in place {in_place} {what}"
                                ),
                            );
                        }
                    }
                }
            }
        }
    }
}
