//! The geodesic flow ops through the C ABI on the CPU backend.
//!
//! - Forward results against an f64 reference written here from docs/ops.md section 5
//!   (independently of the library), f32 and f64.
//! - Both backwards against central finite differences of the library's own f64
//!   forward (inputs chosen so that no clamp boundary lies within reach of the
//!   finite-difference step), and the Christoffel backward against its formulas.
//! - Clamp boundaries: inputs built so that `gamma_raw` is exactly `+-c` (inclusive
//!   mask, as torch.clamp), just outside, and `c = +inf`.
//! - The trajectory: layout `[T, 2, B, D]`, and the backward with and without it.
//! - Bad inputs: each asserts the status and that the message names the argument.
//!
//! Helpers are local to this file (RAII handles, f64 <-> f32/f64 bytes, an RNG).

#![allow(non_snake_case)]

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use fusekit::abi::core::*;
use fusekit::abi::geodesic::*;
use fusekit::abi::{fk_buffer, fk_context};
use fusekit::context::FK_DEVICE_CPU;
use fusekit::dtype::{FK_DTYPE_F16, FK_DTYPE_F32, FK_DTYPE_F64, fk_dtype};
use fusekit::error::*;

// ------------------------------------------------------------------ helpers

fn last_error() -> String {
    unsafe { CStr::from_ptr(fk_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn status_name(s: fk_status) -> String {
    unsafe { CStr::from_ptr(fk_status_string(s)) }
        .to_string_lossy()
        .into_owned()
}

#[track_caller]
fn ok(s: fk_status) {
    assert!(
        s == FK_OK,
        "expected FK_OK, got {}: {}",
        status_name(s),
        last_error()
    );
}

#[track_caller]
fn expect(s: fk_status, want: fk_status, needles: &[&str]) {
    let msg = last_error();
    assert!(
        s == want,
        "expected {}, got {}; message {msg:?}",
        status_name(want),
        status_name(s)
    );
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} lacks {n:?}");
    }
}

struct Ctx(*mut fk_context);
impl Ctx {
    fn cpu() -> Ctx {
        let mut p = null_mut();
        ok(unsafe { fk_context_create(FK_ABI_VERSION, FK_DEVICE_CPU, 0, &mut p) });
        Ctx(p)
    }
}
impl Drop for Ctx {
    fn drop(&mut self) {
        unsafe { fk_context_destroy(self.0) };
    }
}

struct Buf {
    h: *mut fk_buffer,
    dtype: fk_dtype,
    n: usize,
}
impl Buf {
    fn new(ctx: &Ctx, dtype: fk_dtype, shape: &[i64]) -> Buf {
        let mut h = null_mut();
        ok(unsafe {
            fk_buffer_create(
                ctx.0,
                dtype,
                shape.len() as i32,
                shape.as_ptr(),
                null(),
                &mut h,
            )
        });
        let n = shape.iter().product::<i64>() as usize;
        let b = Buf { h, dtype, n };
        if dtype == FK_DTYPE_F32 || dtype == FK_DTYPE_F64 {
            b.write(&vec![f64::NAN; n]); // poisoned: an unwritten output fails
        }
        b
    }
    fn from(ctx: &Ctx, dtype: fk_dtype, shape: &[i64], vals: &[f64]) -> Buf {
        let b = Buf::new(ctx, dtype, shape);
        assert_eq!(vals.len(), b.n);
        b.write(vals);
        b
    }
    fn write(&self, vals: &[f64]) {
        let bytes = encode(self.dtype, vals);
        ok(unsafe {
            fk_buffer_copy_from_host(self.h, bytes.as_ptr() as *const _, bytes.len(), null())
        });
    }
    fn read(&self) -> Vec<f64> {
        let size = if self.dtype == FK_DTYPE_F32 { 4 } else { 8 };
        let mut bytes = vec![0u8; self.n * size];
        ok(unsafe {
            fk_buffer_copy_to_host(self.h, bytes.as_mut_ptr() as *mut _, bytes.len(), null())
        });
        decode(self.dtype, &bytes)
    }
}
impl Drop for Buf {
    fn drop(&mut self) {
        unsafe { fk_buffer_destroy(self.h) };
    }
}

fn encode(dtype: fk_dtype, vals: &[f64]) -> Vec<u8> {
    if dtype == FK_DTYPE_F32 {
        vals.iter()
            .flat_map(|&x| (x as f32).to_le_bytes())
            .collect()
    } else {
        vals.iter().flat_map(|&x| x.to_le_bytes()).collect()
    }
}

fn decode(dtype: fk_dtype, bytes: &[u8]) -> Vec<f64> {
    if dtype == FK_DTYPE_F32 {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect()
    } else {
        bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

/// Rounds through the dtype (inputs of an f32 run as the library sees them).
fn q(dtype: fk_dtype, v: &[f64]) -> Vec<f64> {
    decode(dtype, &encode(dtype, v))
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    fn uni(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
    fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uni(lo, hi)).collect()
    }
}

fn rel_err(out: &[f64], want: &[f64]) -> f64 {
    assert_eq!(out.len(), want.len());
    assert!(
        out.iter().all(|x| x.is_finite()),
        "non-finite output: {out:?}"
    );
    let num: f64 = out.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

#[track_caller]
fn close(out: &[f64], want: &[f64], tol: f64, what: &str) {
    let e = rel_err(out, want);
    assert!(
        e <= tol,
        "{what}: relative error {e:.3e} > {tol:.1e}\n out  {out:?}\n want {want:?}"
    );
}

fn tol(dtype: fk_dtype) -> f64 {
    if dtype == FK_DTYPE_F32 { 2e-5 } else { 1e-12 }
}

// ------------------------------------------------------------------ reference (f64, from docs/ops.md section 5)

/// One problem: sizes, inputs, scalars.
#[derive(Clone)]
struct Prob {
    b: usize,
    d: usize,
    r: usize,
    x: Vec<f64>,
    v: Vec<f64>,
    f: Option<Vec<f64>>,
    u: Vec<f64>,
    w: Vec<f64>,
    mu: Option<Vec<f64>>,
    c: f64,
    dt: f64,
    t: usize,
}

impl Prob {
    fn random(
        rng: &mut Rng,
        b: usize,
        d: usize,
        r: usize,
        t: usize,
        with_f: bool,
        with_mu: bool,
    ) -> Prob {
        Prob {
            b,
            d,
            r,
            x: rng.vec(b * d, -1.0, 1.0),
            v: rng.vec(b * d, -1.0, 1.0),
            f: with_f.then(|| rng.vec(b * d, -0.5, 0.5)),
            u: rng.vec(d * r, -0.7, 0.7),
            w: rng.vec(d * r, -0.7, 0.7),
            mu: with_mu.then(|| rng.vec(d, 0.0, 0.5)),
            c: f64::INFINITY,
            dt: 0.1,
            t,
        }
    }
    fn rounded(&self, dtype: fk_dtype) -> Prob {
        let mut p = self.clone();
        p.x = q(dtype, &p.x);
        p.v = q(dtype, &p.v);
        p.f = p.f.map(|f| q(dtype, &f));
        p.u = q(dtype, &p.u);
        p.w = q(dtype, &p.w);
        p.mu = p.mu.map(|m| q(dtype, &m));
        p
    }
}

/// Statistics of the clamp over every evaluation: the smallest distance between
/// |gamma_raw| and c, and how many entries were clamped out of how many.
#[derive(Default, Debug)]
struct ClampStats {
    margin: f64,
    clamped: usize,
    total: usize,
}

/// `(gamma, gamma_raw, p)` of one row.
fn ref_gamma_row(
    v: &[f64],
    u: &[f64],
    w: &[f64],
    d: usize,
    r: usize,
    c: f64,
    st: &mut ClampStats,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut p = vec![0.0; r];
    for k in 0..r {
        for i in 0..d {
            p[k] += v[i] * u[i * r + k];
        }
    }
    let mut raw = vec![0.0; d];
    for i in 0..d {
        for k in 0..r {
            raw[i] += p[k] * p[k] * w[i * r + k];
        }
    }
    let gamma = raw
        .iter()
        .map(|&x| {
            st.total += 1;
            st.margin = st.margin.min((x.abs() - c).abs());
            if x.abs() > c {
                st.clamped += 1;
            }
            x.max(-c).min(c)
        })
        .collect();
    (gamma, raw, p)
}

fn ref_gamma_row_all(p: &Prob, v: &[f64]) -> Vec<f64> {
    let mut st = ClampStats::default();
    let q = Prob {
        c: f64::INFINITY,
        ..p.clone()
    };
    ref_gamma(&q, v, &mut st).iter().map(|x| x.abs()).collect()
}

fn ref_gamma(p: &Prob, v: &[f64], st: &mut ClampStats) -> Vec<f64> {
    let mut out = Vec::with_capacity(p.b * p.d);
    for i in 0..p.b {
        out.extend(ref_gamma_row(&v[i * p.d..(i + 1) * p.d], &p.u, &p.w, p.d, p.r, p.c, st).0);
    }
    out
}

/// The Christoffel backward from its formulas: `(dv, dU, dW)`.
fn ref_christoffel_backward(p: &Prob, g: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (d, r) = (p.d, p.r);
    let mut dv = vec![0.0; p.b * d];
    let mut du = vec![0.0; d * r];
    let mut dw = vec![0.0; d * r];
    for i in 0..p.b {
        let v = &p.v[i * d..(i + 1) * d];
        let (_, raw, pp) = ref_gamma_row(v, &p.u, &p.w, d, r, p.c, &mut ClampStats::default());
        let gp: Vec<f64> = (0..d)
            .map(|k| {
                if -p.c <= raw[k] && raw[k] <= p.c {
                    g[i * d + k]
                } else {
                    0.0
                }
            })
            .collect();
        let mut dp = vec![0.0; r];
        for k in 0..r {
            let mut q = 0.0;
            for j in 0..d {
                q += gp[j] * p.w[j * r + k];
            }
            dp[k] = 2.0 * pp[k] * q;
        }
        for j in 0..d {
            for k in 0..r {
                dv[i * d + j] += dp[k] * p.u[j * r + k];
                dw[j * r + k] += gp[j] * pp[k] * pp[k];
                du[j * r + k] += v[j] * dp[k];
            }
        }
    }
    (dv, du, dw)
}

/// The leapfrog forward: `(x_T, v_T, traj [T][2][B][D])`.
fn ref_leapfrog(p: &Prob, st: &mut ClampStats) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (b, d) = (p.b, p.d);
    let h = 0.5 * p.dt;
    let mut x = p.x.clone();
    let mut v = p.v.clone();
    let zero = vec![0.0; b * d];
    let f = p.f.as_ref().unwrap_or(&zero);
    let zmu = vec![0.0; d];
    let mu = p.mu.as_ref().unwrap_or(&zmu);
    let mut traj = Vec::new();
    for _ in 0..p.t {
        let g0 = ref_gamma(p, &v, st);
        let vh: Vec<f64> = (0..b * d)
            .map(|k| v[k] + h * (f[k] - g0[k] - mu[k % d] * v[k]))
            .collect();
        for k in 0..b * d {
            x[k] += p.dt * vh[k];
        }
        let g1 = ref_gamma(p, &vh, st);
        v = (0..b * d)
            .map(|k| vh[k] + h * (f[k] - g1[k] - mu[k % d] * vh[k]))
            .collect();
        traj.extend_from_slice(&x);
        traj.extend_from_slice(&v);
    }
    (x, v, traj)
}

/// Picks a clamp bound with some entries clamped, some not, and every |gamma_raw|
/// at least `margin` away from it over the whole run (finite differences stay on
/// one side of every kink).
fn pick_c(p: &mut Prob, margin: f64) {
    // Christoffel-only problems (t = 0) evaluate Gamma at v only.
    let run = |p: &Prob, st: &mut ClampStats| {
        if p.t == 0 {
            ref_gamma(p, &p.v, st);
        } else {
            ref_leapfrog(p, st);
        }
    };
    // candidates: midpoints between the |gamma_raw| values of the unclamped run
    p.c = f64::INFINITY;
    let mut all = Vec::new();
    let mut v = p.v.clone();
    for _ in 0..p.t.max(1) {
        let mut st = ClampStats::default();
        if p.t == 0 {
            all.extend(ref_gamma_row_all(p, &v));
            break;
        }
        for i in 0..p.b {
            let (_, raw, _) = ref_gamma_row(
                &v[i * p.d..(i + 1) * p.d],
                &p.u,
                &p.w,
                p.d,
                p.r,
                p.c,
                &mut st,
            );
            all.extend(raw.iter().map(|x| x.abs()));
        }
        v = ref_leapfrog(
            &Prob {
                t: 1,
                x: vec![0.0; p.b * p.d],
                v: v.clone(),
                ..p.clone()
            },
            &mut st,
        )
        .1;
    }
    all.sort_by(f64::total_cmp);
    let mut cands: Vec<f64> = all.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect();
    // prefer the middle of the distribution
    let mid = cands.len() / 2;
    cands.sort_by_key(|&c| {
        let i = all.partition_point(|&x| x < c);
        (i as i64 - mid as i64).abs()
    });
    cands.push(0.5 * all[0]);
    cands.push(2.0 * all[all.len() - 1] + 1.0);
    for mixed in [true, false] {
        for &c in &cands {
            p.c = c;
            let mut st = ClampStats {
                margin: f64::INFINITY,
                ..Default::default()
            };
            run(p, &mut st);
            if st.margin > margin && (!mixed || (st.clamped > 0 && st.clamped < st.total)) {
                return;
            }
        }
    }
    panic!("no clamp bound with a margin of {margin}");
}

// ------------------------------------------------------------------ library calls

struct Inputs {
    x: Buf,
    v: Buf,
    f: Option<Buf>,
    u: Buf,
    w: Buf,
    mu: Option<Buf>,
}

fn upload(ctx: &Ctx, dt: fk_dtype, p: &Prob) -> Inputs {
    let (b, d, r) = (p.b as i64, p.d as i64, p.r as i64);
    Inputs {
        x: Buf::from(ctx, dt, &[b, d], &p.x),
        v: Buf::from(ctx, dt, &[b, d], &p.v),
        f: p.f.as_ref().map(|f| Buf::from(ctx, dt, &[b, d], f)),
        u: Buf::from(ctx, dt, &[d, r], &p.u),
        w: Buf::from(ctx, dt, &[d, r], &p.w),
        mu: p.mu.as_ref().map(|m| Buf::from(ctx, dt, &[d], m)),
    }
}

fn h(b: &Option<Buf>) -> *mut fk_buffer {
    b.as_ref().map_or(null_mut(), |b| b.h)
}

fn christoffel(ctx: &Ctx, dt: fk_dtype, p: &Prob) -> Vec<f64> {
    let i = upload(ctx, dt, p);
    let out = Buf::new(ctx, dt, &[p.b as i64, p.d as i64]);
    ok(unsafe { fk_christoffel_forward(i.v.h, i.u.h, i.w.h, p.c, 0, out.h, null()) });
    out.read()
}

fn christoffel_bwd(ctx: &Ctx, dt: fk_dtype, p: &Prob, g: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let i = upload(ctx, dt, p);
    let (b, d, r) = (p.b as i64, p.d as i64, p.r as i64);
    let gb = Buf::from(ctx, dt, &[b, d], g);
    let dv = Buf::new(ctx, dt, &[b, d]);
    let du = Buf::new(ctx, dt, &[d, r]);
    let dw = Buf::new(ctx, dt, &[d, r]);
    ok(unsafe {
        fk_christoffel_backward(i.v.h, i.u.h, i.w.h, gb.h, p.c, 0, dv.h, du.h, dw.h, null())
    });
    (dv.read(), du.read(), dw.read())
}

fn leapfrog(ctx: &Ctx, dt: fk_dtype, p: &Prob) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let i = upload(ctx, dt, p);
    let (b, d) = (p.b as i64, p.d as i64);
    let xo = Buf::new(ctx, dt, &[b, d]);
    let vo = Buf::new(ctx, dt, &[b, d]);
    let tr = Buf::new(ctx, dt, &[p.t as i64, 2, b, d]);
    ok(unsafe {
        fk_leapfrog_forward(
            i.x.h,
            i.v.h,
            h(&i.f),
            i.u.h,
            i.w.h,
            h(&i.mu),
            p.dt,
            p.t as i64,
            p.c,
            0,
            xo.h,
            vo.h,
            tr.h,
            null(),
        )
    });
    (xo.read(), vo.read(), tr.read())
}

/// `(dx0, dv0, df, dU, dW)`; with the trajectory when `use_traj`.
fn leapfrog_bwd(
    ctx: &Ctx,
    dt: fk_dtype,
    p: &Prob,
    gx: &[f64],
    gv: &[f64],
    use_traj: bool,
) -> [Vec<f64>; 5] {
    let i = upload(ctx, dt, p);
    let (b, d, r) = (p.b as i64, p.d as i64, p.r as i64);
    let tr = use_traj.then(|| {
        let xo = Buf::new(ctx, dt, &[b, d]);
        let vo = Buf::new(ctx, dt, &[b, d]);
        let tr = Buf::new(ctx, dt, &[p.t as i64, 2, b, d]);
        ok(unsafe {
            fk_leapfrog_forward(
                i.x.h,
                i.v.h,
                h(&i.f),
                i.u.h,
                i.w.h,
                h(&i.mu),
                p.dt,
                p.t as i64,
                p.c,
                0,
                xo.h,
                vo.h,
                tr.h,
                null(),
            )
        });
        tr
    });
    let gxb = Buf::from(ctx, dt, &[b, d], gx);
    let gvb = Buf::from(ctx, dt, &[b, d], gv);
    let outs = [
        Buf::new(ctx, dt, &[b, d]),
        Buf::new(ctx, dt, &[b, d]),
        Buf::new(ctx, dt, &[b, d]),
        Buf::new(ctx, dt, &[d, r]),
        Buf::new(ctx, dt, &[d, r]),
    ];
    ok(unsafe {
        fk_leapfrog_backward(
            i.v.h,
            h(&i.f),
            i.u.h,
            i.w.h,
            h(&i.mu),
            p.dt,
            p.t as i64,
            p.c,
            0,
            h(&tr),
            gxb.h,
            gvb.h,
            outs[0].h,
            outs[1].h,
            outs[2].h,
            outs[3].h,
            outs[4].h,
            null(),
        )
    });
    outs.map(|o| o.read())
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Central finite differences of `loss` w.r.t. every element of the vector that
/// `field` selects.
fn fd(p: &Prob, field: fn(&mut Prob) -> &mut Vec<f64>, loss: &dyn Fn(&Prob) -> f64) -> Vec<f64> {
    let n = field(&mut p.clone()).len();
    (0..n)
        .map(|k| {
            let mut a = p.clone();
            let mut b = p.clone();
            let x = field(&mut a)[k];
            let e = 1e-6 * x.abs().max(1.0);
            field(&mut a)[k] = x + e;
            field(&mut b)[k] = x - e;
            (loss(&a) - loss(&b)) / (2.0 * e)
        })
        .collect()
}

// ------------------------------------------------------------------ forward vs reference

#[test]
fn christoffel_forward_matches_reference() {
    let ctx = Ctx::cpu();
    let mut rng = Rng(1);
    for &(b, d, r) in &[
        (1, 1, 1),
        (3, 5, 2),
        (17, 33, 7),
        (8, 64, 32),
        (5, 20, 130),
        (4, 7, 0),
    ] {
        for dt in [FK_DTYPE_F32, FK_DTYPE_F64] {
            for c in [f64::INFINITY, 0.3, 0.0] {
                let mut p = Prob::random(&mut rng, b, d, r, 1, false, false).rounded(dt);
                p.c = c;
                let want = ref_gamma(&p, &p.v, &mut ClampStats::default());
                let got = christoffel(&ctx, dt, &p);
                close(
                    &got,
                    &want,
                    tol(dt),
                    &format!("gamma b={b} d={d} r={r} c={c}"),
                );
            }
        }
    }
}

#[test]
fn christoffel_forward_in_place() {
    let ctx = Ctx::cpu();
    let mut rng = Rng(2);
    let mut p = Prob::random(&mut rng, 6, 9, 3, 1, false, false);
    p.c = 0.2;
    let i = upload(&ctx, FK_DTYPE_F64, &p);
    ok(unsafe { fk_christoffel_forward(i.v.h, i.u.h, i.w.h, p.c, 0, i.v.h, null()) });
    let want = ref_gamma(&p, &p.v, &mut ClampStats::default());
    close(&i.v.read(), &want, 1e-14, "in-place gamma");
}

#[test]
fn leapfrog_forward_matches_reference() {
    let ctx = Ctx::cpu();
    let mut rng = Rng(3);
    for &(b, d, r, t) in &[(1, 1, 1, 1), (3, 5, 2, 4), (9, 17, 5, 3), (4, 40, 33, 2)] {
        for dt in [FK_DTYPE_F32, FK_DTYPE_F64] {
            for (with_f, with_mu, c) in [
                (false, false, f64::INFINITY),
                (true, true, 0.25),
                (true, false, 0.1),
            ] {
                let mut p = Prob::random(&mut rng, b, d, r, t, with_f, with_mu).rounded(dt);
                p.c = c;
                p.dt = if with_mu { -0.07 } else { 0.13 };
                let (x, v, traj) = ref_leapfrog(&p, &mut ClampStats::default());
                let (gx, gv, gtraj) = leapfrog(&ctx, dt, &p);
                let what = format!("b={b} d={d} r={r} T={t} f={with_f} mu={with_mu} c={c}");
                close(&gx, &x, tol(dt), &format!("x_T {what}"));
                close(&gv, &v, tol(dt), &format!("v_T {what}"));
                close(&gtraj, &traj, tol(dt), &format!("traj {what}"));
                // the last trajectory entry is the final state
                let n = b * d;
                assert_eq!(&gtraj[(2 * t - 2) * n..(2 * t - 1) * n], &gx[..]);
                assert_eq!(&gtraj[(2 * t - 1) * n..], &gv[..]);
            }
        }
    }
}

#[test]
fn leapfrog_in_place_and_without_trajectory() {
    let ctx = Ctx::cpu();
    let mut rng = Rng(4);
    let mut p = Prob::random(&mut rng, 5, 6, 3, 3, true, true);
    p.c = 0.3;
    let (x, v, _) = ref_leapfrog(&p, &mut ClampStats::default());
    let i = upload(&ctx, FK_DTYPE_F64, &p);
    ok(unsafe {
        fk_leapfrog_forward(
            i.x.h,
            i.v.h,
            h(&i.f),
            i.u.h,
            i.w.h,
            h(&i.mu),
            p.dt,
            3,
            p.c,
            0,
            i.x.h,
            i.v.h,
            null_mut(),
            null(),
        )
    });
    close(&i.x.read(), &x, 1e-13, "x in place");
    close(&i.v.read(), &v, 1e-13, "v in place");
}

// ------------------------------------------------------------------ backwards

#[test]
fn christoffel_backward_matches_formulas_and_finite_differences() {
    let ctx = Ctx::cpu();
    let mut rng = Rng(5);
    for &(b, d, r) in &[(1, 1, 1), (3, 5, 2), (6, 9, 4), (5, 12, 35)] {
        let mut p = Prob::random(&mut rng, b, d, r, 0, false, false);
        pick_c(&mut p, 1e-4);
        let g = rng.vec(b * d, -1.0, 1.0);
        let (dv, du, dw) = christoffel_bwd(&ctx, FK_DTYPE_F64, &p, &g);
        let (rv, ru, rw) = ref_christoffel_backward(&p, &g);
        close(&dv, &rv, 1e-13, "dv formula");
        close(&du, &ru, 1e-13, "dU formula");
        close(&dw, &rw, 1e-13, "dW formula");
        let loss = |q: &Prob| dot(&christoffel(&ctx, FK_DTYPE_F64, q), &g);
        close(
            &dv,
            &fd(&p, |q| &mut q.v, &loss),
            1e-6,
            "dv vs finite differences",
        );
        close(
            &du,
            &fd(&p, |q| &mut q.u, &loss),
            1e-6,
            "dU vs finite differences",
        );
        close(
            &dw,
            &fd(&p, |q| &mut q.w, &loss),
            1e-6,
            "dW vs finite differences",
        );
        // f32 against the f64 formulas on the rounded inputs
        let p32 = p.rounded(FK_DTYPE_F32);
        let g32 = q(FK_DTYPE_F32, &g);
        let (dv, du, dw) = christoffel_bwd(&ctx, FK_DTYPE_F32, &p32, &g32);
        let (rv, ru, rw) = ref_christoffel_backward(&p32, &g32);
        close(&dv, &rv, 2e-5, "dv f32");
        close(&du, &ru, 2e-5, "dU f32");
        close(&dw, &rw, 2e-5, "dW f32");
    }
}

#[test]
fn leapfrog_backward_matches_finite_differences() {
    let ctx = Ctx::cpu();
    let mut rng = Rng(6);
    for &(b, d, r, t, with_f, with_mu) in &[
        (1, 1, 1, 1, false, false),
        (2, 4, 3, 3, true, true),
        (3, 5, 2, 2, true, false),
        (2, 6, 33, 4, false, true),
    ] {
        let mut p = Prob::random(&mut rng, b, d, r, t, with_f, with_mu);
        p.f.get_or_insert_with(|| vec![0.0; b * d]); // FD needs f; zeros = the NULL semantics
        pick_c(&mut p, 2e-4);
        let gx = rng.vec(b * d, -1.0, 1.0);
        let gv = rng.vec(b * d, -1.0, 1.0);
        let loss = |q: &Prob| {
            let (x, v, _) = leapfrog(&ctx, FK_DTYPE_F64, q);
            dot(&x, &gx) + dot(&v, &gv)
        };
        let what = format!("b={b} d={d} r={r} T={t}");
        let want = [
            fd(&p, |q| &mut q.x, &loss),
            fd(&p, |q| &mut q.v, &loss),
            fd(&p, |q| q.f.as_mut().unwrap(), &loss),
            fd(&p, |q| &mut q.u, &loss),
            fd(&p, |q| &mut q.w, &loss),
        ];
        let names = ["dx0", "dv0", "df", "dU", "dW"];
        for use_traj in [true, false] {
            let got = leapfrog_bwd(&ctx, FK_DTYPE_F64, &p, &gx, &gv, use_traj);
            for k in 0..5 {
                close(
                    &got[k],
                    &want[k],
                    2e-6,
                    &format!("{} {what} traj={use_traj}", names[k]),
                );
            }
        }
        // f32 against the f64 gradients of the rounded problem
        let p32 = p.rounded(FK_DTYPE_F32);
        let (gx32, gv32) = (q(FK_DTYPE_F32, &gx), q(FK_DTYPE_F32, &gv));
        let want64 = leapfrog_bwd(&ctx, FK_DTYPE_F64, &p32, &gx32, &gv32, false);
        let got32 = leapfrog_bwd(&ctx, FK_DTYPE_F32, &p32, &gx32, &gv32, true);
        for k in 0..5 {
            close(
                &got32[k],
                &want64[k],
                2e-5,
                &format!("{} f32 {what}", names[k]),
            );
        }
    }
}

#[test]
fn leapfrog_backward_optional_arguments() {
    let ctx = Ctx::cpu();
    let mut rng = Rng(7);
    let mut p = Prob::random(&mut rng, 3, 5, 2, 2, false, false);
    p.c = 0.2;
    let (b, d, r) = (3i64, 5i64, 2i64);
    let gv = rng.vec(15, -1.0, 1.0);
    let full = leapfrog_bwd(&ctx, FK_DTYPE_F64, &p, &vec![0.0; 15], &gv, false);
    let i = upload(&ctx, FK_DTYPE_F64, &p);
    let gvb = Buf::from(&ctx, FK_DTYPE_F64, &[b, d], &gv);
    // gx NULL (= zero), only dU and dx0 wanted
    let du = Buf::new(&ctx, FK_DTYPE_F64, &[d, r]);
    let dx = Buf::new(&ctx, FK_DTYPE_F64, &[b, d]);
    ok(unsafe {
        fk_leapfrog_backward(
            i.v.h,
            null(),
            i.u.h,
            i.w.h,
            null(),
            p.dt,
            2,
            p.c,
            0,
            null(),
            null(),
            gvb.h,
            dx.h,
            null_mut(),
            null_mut(),
            du.h,
            null_mut(),
            null(),
        )
    });
    assert_eq!(dx.read(), vec![0.0; 15]);
    close(&du.read(), &full[3], 1e-15, "dU alone");
    // every output NULL is a no-op
    ok(unsafe {
        fk_leapfrog_backward(
            i.v.h,
            null(),
            i.u.h,
            i.w.h,
            null(),
            p.dt,
            2,
            p.c,
            0,
            null(),
            null(),
            null(),
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            null(),
        )
    });
    // B = 0: dU and dW are zero
    let v0 = Buf::new(&ctx, FK_DTYPE_F64, &[0, d]);
    let dw = Buf::new(&ctx, FK_DTYPE_F64, &[d, r]);
    ok(unsafe {
        fk_leapfrog_backward(
            v0.h,
            null(),
            i.u.h,
            i.w.h,
            null(),
            p.dt,
            2,
            p.c,
            0,
            null(),
            null(),
            null(),
            null_mut(),
            null_mut(),
            null_mut(),
            du.h,
            dw.h,
            null(),
        )
    });
    assert_eq!(du.read(), vec![0.0; 10]);
    assert_eq!(dw.read(), vec![0.0; 10]);
    let g = Buf::new(&ctx, FK_DTYPE_F64, &[0, d]);
    du.write(&[f64::NAN; 10]);
    ok(unsafe {
        fk_christoffel_backward(
            v0.h,
            i.u.h,
            i.w.h,
            g.h,
            1.0,
            0,
            null_mut(),
            du.h,
            null_mut(),
            null(),
        )
    });
    assert_eq!(du.read(), vec![0.0; 10]);
}

#[test]
fn backwards_are_bit_reproducible() {
    let ctx = Ctx::cpu();
    let mut rng = Rng(8);
    let mut p = Prob::random(&mut rng, 300, 24, 6, 2, true, true);
    p.c = 0.3;
    let g = rng.vec(300 * 24, -1.0, 1.0);
    for dt in [FK_DTYPE_F32, FK_DTYPE_F64] {
        let a = christoffel_bwd(&ctx, dt, &p, &g);
        let b = christoffel_bwd(&ctx, dt, &p, &g);
        assert!(
            a.1.iter()
                .zip(&b.1)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        );
        assert!(
            a.2.iter()
                .zip(&b.2)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        );
        let a = leapfrog_bwd(&ctx, dt, &p, &g, &g, false);
        let b = leapfrog_bwd(&ctx, dt, &p, &g, &g, false);
        for k in 3..5 {
            assert!(
                a[k].iter()
                    .zip(&b[k])
                    .all(|(x, y)| x.to_bits() == y.to_bits())
            );
        }
    }
}

// ------------------------------------------------------------------ clamp boundaries

/// One row, R = 1, `U = e_0`, `v_0 = 1`: `p = 1`, `s = 1`, so `gamma_raw = W[:, 0]`
/// exactly, whatever the dtype.
fn boundary_problem(w: &[f64], c: f64) -> Prob {
    let d = w.len();
    let mut u = vec![0.0; d];
    u[0] = 1.0;
    let mut v = vec![0.5; d];
    v[0] = 1.0;
    Prob {
        b: 1,
        d,
        r: 1,
        x: vec![0.0; d],
        v,
        f: None,
        u,
        w: w.to_vec(),
        mu: None,
        c,
        dt: 0.1,
        t: 1,
    }
}

#[test]
fn clamp_boundaries_are_inclusive() {
    let ctx = Ctx::cpu();
    let w = [
        5.0,
        -5.0,
        4.5,
        5.5,
        -6.0,
        0.0,
        5.0f64.next_up(),
        (-5.0f64).next_down(),
    ];
    for dt in [FK_DTYPE_F32, FK_DTYPE_F64] {
        let w: Vec<f64> = if dt == FK_DTYPE_F32 {
            // the nearest f32 neighbours of +-5 just outside
            let mut w = w.to_vec();
            w[6] = 5.0f32.next_up() as f64;
            w[7] = (-5.0f32).next_down() as f64;
            w
        } else {
            w.to_vec()
        };
        let p = boundary_problem(&w, 5.0);
        let gamma = christoffel(&ctx, dt, &p);
        assert_eq!(
            gamma,
            vec![5.0, -5.0, 4.5, 5.0, -5.0, 0.0, 5.0, -5.0],
            "{}",
            dt
        );
        // mask: 1 at exactly +-c and inside, 0 outside
        let g = vec![1.0; w.len()];
        let (dv, du, dw) = christoffel_bwd(&ctx, dt, &p, &g);
        let mask = [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        assert_eq!(dw, mask.to_vec(), "dW = g' * s with s = 1");
        // dp = 2 p q with q = sum_d g'_d W_d = 5 - 5 + 4.5 + 0 = 4.5
        let dp = 2.0 * 4.5;
        assert_eq!(dv, (0..w.len()).map(|k| dp * p.u[k]).collect::<Vec<_>>());
        assert_eq!(du, (0..w.len()).map(|k| p.v[k] * dp).collect::<Vec<_>>());
        // c = +inf: nothing clamped
        let p = boundary_problem(&w, f64::INFINITY);
        assert_eq!(christoffel(&ctx, dt, &p), w);
        let (_, _, dw) = christoffel_bwd(&ctx, dt, &p, &g);
        assert_eq!(dw, vec![1.0; w.len()]);
        // c = 0: everything but exact zeros clamped
        let p = boundary_problem(&w, 0.0);
        assert_eq!(christoffel(&ctx, dt, &p), vec![0.0; w.len()]);
        let (_, _, dw) = christoffel_bwd(&ctx, dt, &p, &g);
        assert_eq!(dw, vec![0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    }
}

#[test]
fn nan_propagates_through_the_clamp() {
    let ctx = Ctx::cpu();
    let p = boundary_problem(&[f64::NAN, 1.0], 5.0);
    let i = upload(&ctx, FK_DTYPE_F64, &p);
    let out = Buf::new(&ctx, FK_DTYPE_F64, &[1, 2]);
    ok(unsafe { fk_christoffel_forward(i.v.h, i.u.h, i.w.h, 5.0, 0, out.h, null()) });
    let g = out.read();
    assert!(g[0].is_nan() && g[1] == 1.0, "{g:?}");
}

// ------------------------------------------------------------------ bad inputs

struct Bad {
    ctx: Ctx,
}

impl Bad {
    fn b(&self, dt: fk_dtype, shape: &[i64]) -> Buf {
        Buf::new(&self.ctx, dt, shape)
    }
}

#[test]
fn christoffel_rejects_bad_inputs() {
    let t = Bad { ctx: Ctx::cpu() };
    let f32_ = FK_DTYPE_F32;
    let v = t.b(f32_, &[4, 256]);
    let u = t.b(f32_, &[256, 16]);
    let w = t.b(f32_, &[256, 16]);
    let out = t.b(f32_, &[4, 256]);
    let fwd = |v: &Buf, u: &Buf, w: &Buf, c: f64, o: &Buf| unsafe {
        fk_christoffel_forward(v.h, u.h, w.h, c, 0, o.h, null())
    };
    ok(fwd(&v, &u, &w, 5.0, &out));
    let u_bad = t.b(f32_, &[512, 16]);
    expect(
        fwd(&v, &u_bad, &w, 5.0, &out),
        FK_ERROR_SHAPE_MISMATCH,
        &["fk_christoffel_forward: U has shape [512, 16] but v has 256 columns"],
    );
    let w_bad = t.b(f32_, &[256, 8]);
    expect(
        fwd(&v, &u, &w_bad, 5.0, &out),
        FK_ERROR_SHAPE_MISMATCH,
        &["W has shape [256, 8]", "U has shape [256, 16]"],
    );
    let out_bad = t.b(f32_, &[4, 255]);
    expect(
        fwd(&v, &u, &w, 5.0, &out_bad),
        FK_ERROR_SHAPE_MISMATCH,
        &["gamma has shape [4, 255]"],
    );
    let v3 = t.b(f32_, &[2, 2, 256]);
    expect(
        fwd(&v3, &u, &w, 5.0, &out),
        FK_ERROR_SHAPE_MISMATCH,
        &["v must be a [B, D] matrix"],
    );
    let v16 = t.b(FK_DTYPE_F16, &[4, 256]);
    expect(
        fwd(&v16, &u, &w, 5.0, &out),
        FK_ERROR_UNSUPPORTED_DTYPE,
        &["v has dtype f16", "f32 and f64"],
    );
    let u64_ = t.b(FK_DTYPE_F64, &[256, 16]);
    expect(
        fwd(&v, &u64_, &w, 5.0, &out),
        FK_ERROR_DTYPE_MISMATCH,
        &["U has dtype f64 but v has dtype f32"],
    );
    expect(
        fwd(&v, &u, &w, -1.0, &out),
        FK_ERROR_INVALID_ARGUMENT,
        &["c = -1"],
    );
    expect(
        fwd(&v, &u, &w, f64::NAN, &out),
        FK_ERROR_INVALID_ARGUMENT,
        &["c = NaN"],
    );
    expect(
        unsafe { fk_christoffel_forward(v.h, u.h, w.h, 5.0, 0xe, out.h, null()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["flags = 0xe", "FK_GEO_ALLOW_TF32X3 = 4"],
    );
    ok(unsafe { fk_christoffel_forward(v.h, u.h, w.h, 5.0, FK_GEO_ALLOW_TF32, out.h, null()) });
    for (k, name) in ["v", "U", "W", "gamma"].iter().enumerate() {
        let p = |i: usize, b: &Buf| if i == k { null_mut() } else { b.h };
        let s = unsafe {
            fk_christoffel_forward(p(0, &v), p(1, &u), p(2, &w), 5.0, 0, p(3, &out), null())
        };
        expect(
            s,
            FK_ERROR_NULL_POINTER,
            &["fk_christoffel_forward", &format!("{name} is NULL")],
        );
    }
    // aliasing: gamma overlapping U
    let big = t.b(f32_, &[4, 256]);
    let mut alias = null_mut();
    let mut data = null_mut();
    ok(unsafe { fk_buffer_data(big.h, &mut data) });
    let shape = [256i64, 16];
    ok(unsafe { fk_buffer_wrap(t.ctx.0, data, f32_, 2, shape.as_ptr(), null(), &mut alias) });
    let alias = Buf {
        h: alias,
        dtype: f32_,
        n: 4096,
    };
    expect(
        fwd(&v, &alias, &w, 5.0, &big),
        FK_ERROR_ALIASING,
        &["gamma overlaps the input U"],
    );
    // non-contiguous v
    let mut strided = null_mut();
    let st = [512i64, 1];
    let sh = [2i64, 256];
    ok(unsafe {
        fk_buffer_wrap(
            t.ctx.0,
            data,
            f32_,
            2,
            sh.as_ptr(),
            st.as_ptr(),
            &mut strided,
        )
    });
    let strided = Buf {
        h: strided,
        dtype: f32_,
        n: 512,
    };
    let o2 = t.b(f32_, &[2, 256]);
    expect(
        fwd(&strided, &u, &w, 5.0, &o2),
        FK_ERROR_UNSUPPORTED,
        &["v must be contiguous"],
    );
    // backward
    let g = t.b(f32_, &[4, 256]);
    let dv = t.b(f32_, &[4, 256]);
    let du = t.b(f32_, &[256, 16]);
    let bwd = |g: &Buf, dv: *mut fk_buffer, du: *mut fk_buffer, dw: *mut fk_buffer| unsafe {
        fk_christoffel_backward(v.h, u.h, w.h, g.h, 5.0, 0, dv, du, dw, null())
    };
    ok(bwd(&g, dv.h, du.h, null_mut()));
    let g_bad = t.b(f32_, &[3, 256]);
    expect(
        bwd(&g_bad, dv.h, du.h, null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["fk_christoffel_backward", "g has shape [3, 256]"],
    );
    let dw_bad = t.b(f32_, &[256, 15]);
    expect(
        bwd(&g, dv.h, du.h, dw_bad.h),
        FK_ERROR_SHAPE_MISMATCH,
        &["dW has shape [256, 15]"],
    );
    expect(
        bwd(&g, dv.h, dv.h, null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["dU has shape [4, 256]"],
    );
    expect(
        bwd(&g, g.h, null_mut(), null_mut()),
        FK_ERROR_ALIASING,
        &["dv overlaps the input g"],
    );
    let s = unsafe {
        fk_christoffel_backward(
            v.h,
            u.h,
            w.h,
            null(),
            5.0,
            0,
            dv.h,
            null_mut(),
            null_mut(),
            null(),
        )
    };
    expect(s, FK_ERROR_NULL_POINTER, &["g is NULL"]);
}

#[test]
fn leapfrog_rejects_bad_inputs() {
    let t = Bad { ctx: Ctx::cpu() };
    let d64 = FK_DTYPE_F64;
    let (b, d, r, steps) = (3i64, 8i64, 2i64, 4i64);
    let x = t.b(d64, &[b, d]);
    let v = t.b(d64, &[b, d]);
    let u = t.b(d64, &[d, r]);
    let w = t.b(d64, &[d, r]);
    for z in [&x, &v, &u, &w] {
        z.write(&vec![0.1; z.n]);
    }
    let xo = t.b(d64, &[b, d]);
    let vo = t.b(d64, &[b, d]);
    let tr = t.b(d64, &[steps, 2, b, d]);
    let call = |x: *const fk_buffer,
                v: *const fk_buffer,
                f: *const fk_buffer,
                u: *const fk_buffer,
                mu: *const fk_buffer,
                dt: f64,
                steps: i64,
                xo: *mut fk_buffer,
                tr: *mut fk_buffer| unsafe {
        fk_leapfrog_forward(x, v, f, u, w.h, mu, dt, steps, 5.0, 0, xo, vo.h, tr, null())
    };
    ok(call(x.h, v.h, null(), u.h, null(), 0.1, steps, xo.h, tr.h));
    expect(
        call(x.h, v.h, null(), u.h, null(), 0.1, 0, xo.h, tr.h),
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_leapfrog_forward", "steps (T) = 0"],
    );
    expect(
        call(x.h, v.h, null(), u.h, null(), 0.1, -3, xo.h, null_mut()),
        FK_ERROR_INVALID_ARGUMENT,
        &["steps (T) = -3"],
    );
    expect(
        call(x.h, v.h, null(), u.h, null(), f64::NAN, steps, xo.h, tr.h),
        FK_ERROR_INVALID_ARGUMENT,
        &["dt = NaN must be finite"],
    );
    expect(
        call(
            x.h,
            v.h,
            null(),
            u.h,
            null(),
            f64::INFINITY,
            steps,
            xo.h,
            tr.h,
        ),
        FK_ERROR_INVALID_ARGUMENT,
        &["dt = inf must be finite"],
    );
    let tr_bad = t.b(d64, &[steps, 2, b, d + 1]);
    expect(
        call(x.h, v.h, null(), u.h, null(), 0.1, steps, xo.h, tr_bad.h),
        FK_ERROR_SHAPE_MISMATCH,
        &["traj has shape [4, 2, 3, 9] but must be [T, 2, B, D] = [4, 2, 3, 8]"],
    );
    let tr_short = t.b(d64, &[steps - 1, 2, b, d]);
    expect(
        call(x.h, v.h, null(), u.h, null(), 0.1, steps, xo.h, tr_short.h),
        FK_ERROR_SHAPE_MISMATCH,
        &["traj has shape [3, 2, 3, 8]"],
    );
    let mu_bad = t.b(d64, &[d + 1]);
    expect(
        call(
            x.h,
            v.h,
            null(),
            u.h,
            mu_bad.h,
            0.1,
            steps,
            xo.h,
            null_mut(),
        ),
        FK_ERROR_SHAPE_MISMATCH,
        &["mu has shape [9] but must be [D] = [8]"],
    );
    let f_bad = t.b(d64, &[b + 1, d]);
    expect(
        call(x.h, v.h, f_bad.h, u.h, null(), 0.1, steps, xo.h, null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["f has shape [4, 8] but v0 has shape [3, 8]"],
    );
    let u_bad = t.b(d64, &[d + 2, r]);
    expect(
        call(
            x.h,
            v.h,
            null(),
            u_bad.h,
            null(),
            0.1,
            steps,
            xo.h,
            null_mut(),
        ),
        FK_ERROR_SHAPE_MISMATCH,
        &["U has shape [10, 2] but v0 has 8 columns"],
    );
    let x32 = t.b(FK_DTYPE_F32, &[b, d]);
    expect(
        call(
            x32.h,
            v.h,
            null(),
            u.h,
            null(),
            0.1,
            steps,
            xo.h,
            null_mut(),
        ),
        FK_ERROR_DTYPE_MISMATCH,
        &["x0 has dtype f32 but v0 has dtype f64"],
    );
    expect(
        call(
            null(),
            v.h,
            null(),
            u.h,
            null(),
            0.1,
            steps,
            xo.h,
            null_mut(),
        ),
        FK_ERROR_NULL_POINTER,
        &["x0 is NULL"],
    );
    expect(
        call(
            x.h,
            null(),
            null(),
            u.h,
            null(),
            0.1,
            steps,
            xo.h,
            null_mut(),
        ),
        FK_ERROR_NULL_POINTER,
        &["v0 is NULL"],
    );
    expect(
        call(
            x.h,
            v.h,
            null(),
            null(),
            null(),
            0.1,
            steps,
            xo.h,
            null_mut(),
        ),
        FK_ERROR_NULL_POINTER,
        &["U is NULL"],
    );
    expect(
        call(
            x.h,
            v.h,
            null(),
            u.h,
            null(),
            0.1,
            steps,
            null_mut(),
            null_mut(),
        ),
        FK_ERROR_NULL_POINTER,
        &["x_out is NULL"],
    );
    // x_out = v0: not the allowed in-place form
    expect(
        call(x.h, v.h, null(), u.h, null(), 0.1, steps, v.h, null_mut()),
        FK_ERROR_ALIASING,
        &["x_out overlaps the input v0"],
    );
    // x_out = x0: allowed
    ok(call(
        x.h,
        v.h,
        null(),
        u.h,
        null(),
        0.1,
        steps,
        x.h,
        null_mut(),
    ));
    // backward
    let gv = t.b(d64, &[b, d]);
    gv.write(&vec![1.0; 24]);
    let dv = t.b(d64, &[b, d]);
    let bwd = |dt: f64,
               steps: i64,
               tr: *const fk_buffer,
               dv: *mut fk_buffer,
               du: *mut fk_buffer| unsafe {
        fk_leapfrog_backward(
            v.h,
            null(),
            u.h,
            w.h,
            null(),
            dt,
            steps,
            5.0,
            0,
            tr,
            null(),
            gv.h,
            null_mut(),
            dv,
            null_mut(),
            du,
            null_mut(),
            null(),
        )
    };
    ok(bwd(0.1, steps, tr.h, dv.h, null_mut()));
    expect(
        bwd(0.1, 0, null(), dv.h, null_mut()),
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_leapfrog_backward", "steps (T) = 0"],
    );
    expect(
        bwd(f64::NEG_INFINITY, steps, null(), dv.h, null_mut()),
        FK_ERROR_INVALID_ARGUMENT,
        &["dt = -inf"],
    );
    expect(
        bwd(0.1, steps + 1, tr.h, dv.h, null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["traj has shape [4, 2, 3, 8] but must be [T, 2, B, D] = [5, 2, 3, 8]"],
    );
    let du_bad = t.b(d64, &[d, r + 1]);
    expect(
        bwd(0.1, steps, null(), dv.h, du_bad.h),
        FK_ERROR_SHAPE_MISMATCH,
        &["dU has shape [8, 3] but U has shape [8, 2]"],
    );
    expect(
        bwd(0.1, steps, null(), gv.h, null_mut()),
        FK_ERROR_ALIASING,
        &["dv0 overlaps the input gv"],
    );
    let s = unsafe {
        fk_leapfrog_backward(
            null(),
            null(),
            u.h,
            w.h,
            null(),
            0.1,
            steps,
            5.0,
            0,
            null(),
            null(),
            null(),
            null_mut(),
            dv.h,
            null_mut(),
            null_mut(),
            null_mut(),
            null(),
        )
    };
    expect(s, FK_ERROR_NULL_POINTER, &["v0 is NULL"]);
    let s = unsafe {
        fk_leapfrog_backward(
            v.h,
            null(),
            u.h,
            null(),
            null(),
            0.1,
            steps,
            5.0,
            0,
            null(),
            null(),
            null(),
            null_mut(),
            dv.h,
            null_mut(),
            null_mut(),
            null_mut(),
            null(),
        )
    };
    expect(s, FK_ERROR_NULL_POINTER, &["W is NULL"]);
}

#[test]
fn flags_are_accepted_and_change_nothing_on_the_cpu() {
    let ctx = Ctx::cpu();
    let mut rng = Rng(9);
    let mut p = Prob::random(&mut rng, 5, 12, 3, 2, true, true);
    p.c = 0.2;
    let i = upload(&ctx, FK_DTYPE_F32, &p);
    let (b, d) = (5i64, 12i64);
    let mut outs = Vec::new();
    for flags in [
        0,
        FK_GEO_ALLOW_TF32,
        FK_GEO_FORCE_GENERIC,
        FK_GEO_ALLOW_TF32 | FK_GEO_FORCE_GENERIC,
        FK_GEO_ALLOW_TF32X3,
        FK_GEO_ALLOW_TF32X3 | FK_GEO_ALLOW_TF32 | FK_GEO_FORCE_GENERIC,
    ] {
        let g = Buf::new(&ctx, FK_DTYPE_F32, &[b, d]);
        ok(unsafe { fk_christoffel_forward(i.v.h, i.u.h, i.w.h, p.c, flags, g.h, null()) });
        let xo = Buf::new(&ctx, FK_DTYPE_F32, &[b, d]);
        let vo = Buf::new(&ctx, FK_DTYPE_F32, &[b, d]);
        ok(unsafe {
            fk_leapfrog_forward(
                i.x.h,
                i.v.h,
                h(&i.f),
                i.u.h,
                i.w.h,
                h(&i.mu),
                p.dt,
                2,
                p.c,
                flags,
                xo.h,
                vo.h,
                null_mut(),
                null(),
            )
        });
        outs.push((g.read(), xo.read(), vo.read()));
    }
    assert!(outs.iter().all(|o| *o == outs[0]));
}
