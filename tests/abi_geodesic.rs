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
//! Handles, buffers of reals, the RNG and the comparison come from `tests/common`.

#![allow(non_snake_case)]

mod common;

use std::ptr::{null, null_mut};

use common::*;
use fusekit::abi::geodesic::*;

/// This file's forward tolerances (tighter than `common::tol` for f64).
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
            x: rng.uniform_vec(b * d, -1.0, 1.0),
            v: rng.uniform_vec(b * d, -1.0, 1.0),
            f: with_f.then(|| rng.uniform_vec(b * d, -0.5, 0.5)),
            u: rng.uniform_vec(d * r, -0.7, 0.7),
            w: rng.uniform_vec(d * r, -0.7, 0.7),
            mu: with_mu.then(|| rng.uniform_vec(d, 0.0, 0.5)),
            c: f64::INFINITY,
            dt: 0.1,
            t,
        }
    }
    fn rounded(&self, dtype: fk_dtype) -> Prob {
        let mut p = self.clone();
        p.x = quantize_reals(dtype, &p.x);
        p.v = quantize_reals(dtype, &p.v);
        p.f = p.f.map(|f| quantize_reals(dtype, &f));
        p.u = quantize_reals(dtype, &p.u);
        p.w = quantize_reals(dtype, &p.w);
        p.mu = p.mu.map(|m| quantize_reals(dtype, &m));
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
        x: Buf::from_reals(ctx, dt, &[b, d], &p.x),
        v: Buf::from_reals(ctx, dt, &[b, d], &p.v),
        f: p.f.as_ref().map(|f| Buf::from_reals(ctx, dt, &[b, d], f)),
        u: Buf::from_reals(ctx, dt, &[d, r], &p.u),
        w: Buf::from_reals(ctx, dt, &[d, r], &p.w),
        mu: p.mu.as_ref().map(|m| Buf::from_reals(ctx, dt, &[d], m)),
    }
}

fn christoffel(ctx: &Ctx, dt: fk_dtype, p: &Prob) -> Vec<f64> {
    let i = upload(ctx, dt, p);
    let out = Buf::poisoned(ctx, dt, &[p.b as i64, p.d as i64]);
    ok(unsafe {
        fk_christoffel_forward(i.v.raw(), i.u.raw(), i.w.raw(), p.c, 0, out.raw(), null())
    });
    out.read_reals()
}

fn christoffel_bwd(ctx: &Ctx, dt: fk_dtype, p: &Prob, g: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let i = upload(ctx, dt, p);
    let (b, d, r) = (p.b as i64, p.d as i64, p.r as i64);
    let gb = Buf::from_reals(ctx, dt, &[b, d], g);
    let dv = Buf::poisoned(ctx, dt, &[b, d]);
    let du = Buf::poisoned(ctx, dt, &[d, r]);
    let dw = Buf::poisoned(ctx, dt, &[d, r]);
    ok(unsafe {
        fk_christoffel_backward(
            i.v.raw(),
            i.u.raw(),
            i.w.raw(),
            gb.raw(),
            p.c,
            0,
            dv.raw(),
            du.raw(),
            dw.raw(),
            null(),
        )
    });
    (dv.read_reals(), du.read_reals(), dw.read_reals())
}

fn leapfrog(ctx: &Ctx, dt: fk_dtype, p: &Prob) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let i = upload(ctx, dt, p);
    let (b, d) = (p.b as i64, p.d as i64);
    let xo = Buf::poisoned(ctx, dt, &[b, d]);
    let vo = Buf::poisoned(ctx, dt, &[b, d]);
    let tr = Buf::poisoned(ctx, dt, &[p.t as i64, 2, b, d]);
    ok(unsafe {
        fk_leapfrog_forward(
            i.x.raw(),
            i.v.raw(),
            raw_or_null(&i.f),
            i.u.raw(),
            i.w.raw(),
            raw_or_null(&i.mu),
            p.dt,
            p.t as i64,
            p.c,
            0,
            xo.raw(),
            vo.raw(),
            tr.raw(),
            null(),
        )
    });
    (xo.read_reals(), vo.read_reals(), tr.read_reals())
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
        let xo = Buf::poisoned(ctx, dt, &[b, d]);
        let vo = Buf::poisoned(ctx, dt, &[b, d]);
        let tr = Buf::poisoned(ctx, dt, &[p.t as i64, 2, b, d]);
        ok(unsafe {
            fk_leapfrog_forward(
                i.x.raw(),
                i.v.raw(),
                raw_or_null(&i.f),
                i.u.raw(),
                i.w.raw(),
                raw_or_null(&i.mu),
                p.dt,
                p.t as i64,
                p.c,
                0,
                xo.raw(),
                vo.raw(),
                tr.raw(),
                null(),
            )
        });
        tr
    });
    let gxb = Buf::from_reals(ctx, dt, &[b, d], gx);
    let gvb = Buf::from_reals(ctx, dt, &[b, d], gv);
    let outs = [
        Buf::poisoned(ctx, dt, &[b, d]),
        Buf::poisoned(ctx, dt, &[b, d]),
        Buf::poisoned(ctx, dt, &[b, d]),
        Buf::poisoned(ctx, dt, &[d, r]),
        Buf::poisoned(ctx, dt, &[d, r]),
    ];
    ok(unsafe {
        fk_leapfrog_backward(
            i.v.raw(),
            raw_or_null(&i.f),
            i.u.raw(),
            i.w.raw(),
            raw_or_null(&i.mu),
            p.dt,
            p.t as i64,
            p.c,
            0,
            raw_or_null(&tr),
            gxb.raw(),
            gvb.raw(),
            outs[0].raw(),
            outs[1].raw(),
            outs[2].raw(),
            outs[3].raw(),
            outs[4].raw(),
            null(),
        )
    });
    outs.map(|o| o.read_reals())
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
    let mut rng = Rng::from_state(1);
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
                assert_close_reals(
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
    let mut rng = Rng::from_state(2);
    let mut p = Prob::random(&mut rng, 6, 9, 3, 1, false, false);
    p.c = 0.2;
    let i = upload(&ctx, FK_DTYPE_F64, &p);
    ok(unsafe {
        fk_christoffel_forward(i.v.raw(), i.u.raw(), i.w.raw(), p.c, 0, i.v.raw(), null())
    });
    let want = ref_gamma(&p, &p.v, &mut ClampStats::default());
    assert_close_reals(&i.v.read_reals(), &want, 1e-14, "in-place gamma");
}

#[test]
fn leapfrog_forward_matches_reference() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::from_state(3);
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
                assert_close_reals(&gx, &x, tol(dt), &format!("x_T {what}"));
                assert_close_reals(&gv, &v, tol(dt), &format!("v_T {what}"));
                assert_close_reals(&gtraj, &traj, tol(dt), &format!("traj {what}"));
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
    let mut rng = Rng::from_state(4);
    let mut p = Prob::random(&mut rng, 5, 6, 3, 3, true, true);
    p.c = 0.3;
    let (x, v, _) = ref_leapfrog(&p, &mut ClampStats::default());
    let i = upload(&ctx, FK_DTYPE_F64, &p);
    ok(unsafe {
        fk_leapfrog_forward(
            i.x.raw(),
            i.v.raw(),
            raw_or_null(&i.f),
            i.u.raw(),
            i.w.raw(),
            raw_or_null(&i.mu),
            p.dt,
            3,
            p.c,
            0,
            i.x.raw(),
            i.v.raw(),
            null_mut(),
            null(),
        )
    });
    assert_close_reals(&i.x.read_reals(), &x, 1e-13, "x in place");
    assert_close_reals(&i.v.read_reals(), &v, 1e-13, "v in place");
}

// ------------------------------------------------------------------ backwards

#[test]
fn christoffel_backward_matches_formulas_and_finite_differences() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::from_state(5);
    for &(b, d, r) in &[(1, 1, 1), (3, 5, 2), (6, 9, 4), (5, 12, 35)] {
        let mut p = Prob::random(&mut rng, b, d, r, 0, false, false);
        pick_c(&mut p, 1e-4);
        let g = rng.uniform_vec(b * d, -1.0, 1.0);
        let (dv, du, dw) = christoffel_bwd(&ctx, FK_DTYPE_F64, &p, &g);
        let (rv, ru, rw) = ref_christoffel_backward(&p, &g);
        assert_close_reals(&dv, &rv, 1e-13, "dv formula");
        assert_close_reals(&du, &ru, 1e-13, "dU formula");
        assert_close_reals(&dw, &rw, 1e-13, "dW formula");
        let loss = |q: &Prob| dot(&christoffel(&ctx, FK_DTYPE_F64, q), &g);
        assert_close_reals(
            &dv,
            &fd(&p, |q| &mut q.v, &loss),
            1e-6,
            "dv vs finite differences",
        );
        assert_close_reals(
            &du,
            &fd(&p, |q| &mut q.u, &loss),
            1e-6,
            "dU vs finite differences",
        );
        assert_close_reals(
            &dw,
            &fd(&p, |q| &mut q.w, &loss),
            1e-6,
            "dW vs finite differences",
        );
        // f32 against the f64 formulas on the rounded inputs
        let p32 = p.rounded(FK_DTYPE_F32);
        let g32 = quantize_reals(FK_DTYPE_F32, &g);
        let (dv, du, dw) = christoffel_bwd(&ctx, FK_DTYPE_F32, &p32, &g32);
        let (rv, ru, rw) = ref_christoffel_backward(&p32, &g32);
        assert_close_reals(&dv, &rv, 2e-5, "dv f32");
        assert_close_reals(&du, &ru, 2e-5, "dU f32");
        assert_close_reals(&dw, &rw, 2e-5, "dW f32");
    }
}

#[test]
fn leapfrog_backward_matches_finite_differences() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::from_state(6);
    for &(b, d, r, t, with_f, with_mu) in &[
        (1, 1, 1, 1, false, false),
        (2, 4, 3, 3, true, true),
        (3, 5, 2, 2, true, false),
        (2, 6, 33, 4, false, true),
    ] {
        let mut p = Prob::random(&mut rng, b, d, r, t, with_f, with_mu);
        p.f.get_or_insert_with(|| vec![0.0; b * d]); // FD needs f; zeros = the NULL semantics
        pick_c(&mut p, 2e-4);
        let gx = rng.uniform_vec(b * d, -1.0, 1.0);
        let gv = rng.uniform_vec(b * d, -1.0, 1.0);
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
                assert_close_reals(
                    &got[k],
                    &want[k],
                    2e-6,
                    &format!("{} {what} traj={use_traj}", names[k]),
                );
            }
        }
        // f32 against the f64 gradients of the rounded problem
        let p32 = p.rounded(FK_DTYPE_F32);
        let (gx32, gv32) = (
            quantize_reals(FK_DTYPE_F32, &gx),
            quantize_reals(FK_DTYPE_F32, &gv),
        );
        let want64 = leapfrog_bwd(&ctx, FK_DTYPE_F64, &p32, &gx32, &gv32, false);
        let got32 = leapfrog_bwd(&ctx, FK_DTYPE_F32, &p32, &gx32, &gv32, true);
        for k in 0..5 {
            assert_close_reals(
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
    let mut rng = Rng::from_state(7);
    let mut p = Prob::random(&mut rng, 3, 5, 2, 2, false, false);
    p.c = 0.2;
    let (b, d, r) = (3i64, 5i64, 2i64);
    let gv = rng.uniform_vec(15, -1.0, 1.0);
    let full = leapfrog_bwd(&ctx, FK_DTYPE_F64, &p, &vec![0.0; 15], &gv, false);
    let i = upload(&ctx, FK_DTYPE_F64, &p);
    let gvb = Buf::from_reals(&ctx, FK_DTYPE_F64, &[b, d], &gv);
    // gx NULL (= zero), only dU and dx0 wanted
    let du = Buf::poisoned(&ctx, FK_DTYPE_F64, &[d, r]);
    let dx = Buf::poisoned(&ctx, FK_DTYPE_F64, &[b, d]);
    ok(unsafe {
        fk_leapfrog_backward(
            i.v.raw(),
            null(),
            i.u.raw(),
            i.w.raw(),
            null(),
            p.dt,
            2,
            p.c,
            0,
            null(),
            null(),
            gvb.raw(),
            dx.raw(),
            null_mut(),
            null_mut(),
            du.raw(),
            null_mut(),
            null(),
        )
    });
    assert_eq!(dx.read_reals(), vec![0.0; 15]);
    assert_close_reals(&du.read_reals(), &full[3], 1e-15, "dU alone");
    // every output NULL is a no-op
    ok(unsafe {
        fk_leapfrog_backward(
            i.v.raw(),
            null(),
            i.u.raw(),
            i.w.raw(),
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
    let v0 = Buf::poisoned(&ctx, FK_DTYPE_F64, &[0, d]);
    let dw = Buf::poisoned(&ctx, FK_DTYPE_F64, &[d, r]);
    ok(unsafe {
        fk_leapfrog_backward(
            v0.raw(),
            null(),
            i.u.raw(),
            i.w.raw(),
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
            du.raw(),
            dw.raw(),
            null(),
        )
    });
    assert_eq!(du.read_reals(), vec![0.0; 10]);
    assert_eq!(dw.read_reals(), vec![0.0; 10]);
    let g = Buf::poisoned(&ctx, FK_DTYPE_F64, &[0, d]);
    du.write_reals(&[f64::NAN; 10]);
    ok(unsafe {
        fk_christoffel_backward(
            v0.raw(),
            i.u.raw(),
            i.w.raw(),
            g.raw(),
            1.0,
            0,
            null_mut(),
            du.raw(),
            null_mut(),
            null(),
        )
    });
    assert_eq!(du.read_reals(), vec![0.0; 10]);
}

#[test]
fn backwards_are_bit_reproducible() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::from_state(8);
    let mut p = Prob::random(&mut rng, 300, 24, 6, 2, true, true);
    p.c = 0.3;
    let g = rng.uniform_vec(300 * 24, -1.0, 1.0);
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
    let out = Buf::poisoned(&ctx, FK_DTYPE_F64, &[1, 2]);
    ok(unsafe {
        fk_christoffel_forward(i.v.raw(), i.u.raw(), i.w.raw(), 5.0, 0, out.raw(), null())
    });
    let g = out.read_reals();
    assert!(g[0].is_nan() && g[1] == 1.0, "{g:?}");
}

// ------------------------------------------------------------------ bad inputs

struct Bad {
    ctx: Ctx,
}

impl Bad {
    fn b(&self, dt: fk_dtype, shape: &[i64]) -> Buf {
        Buf::poisoned(&self.ctx, dt, shape)
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
        fk_christoffel_forward(v.raw(), u.raw(), w.raw(), c, 0, o.raw(), null())
    };
    ok(fwd(&v, &u, &w, 5.0, &out));
    let u_bad = t.b(f32_, &[512, 16]);
    expect_status(
        fwd(&v, &u_bad, &w, 5.0, &out),
        FK_ERROR_SHAPE_MISMATCH,
        &["fk_christoffel_forward: U has shape [512, 16] but v has 256 columns"],
    );
    let w_bad = t.b(f32_, &[256, 8]);
    expect_status(
        fwd(&v, &u, &w_bad, 5.0, &out),
        FK_ERROR_SHAPE_MISMATCH,
        &["W has shape [256, 8]", "U has shape [256, 16]"],
    );
    let out_bad = t.b(f32_, &[4, 255]);
    expect_status(
        fwd(&v, &u, &w, 5.0, &out_bad),
        FK_ERROR_SHAPE_MISMATCH,
        &["gamma has shape [4, 255]"],
    );
    let v3 = t.b(f32_, &[2, 2, 256]);
    expect_status(
        fwd(&v3, &u, &w, 5.0, &out),
        FK_ERROR_SHAPE_MISMATCH,
        &["v must be a [B, D] matrix"],
    );
    let v16 = t.b(FK_DTYPE_F16, &[4, 256]);
    expect_status(
        fwd(&v16, &u, &w, 5.0, &out),
        FK_ERROR_UNSUPPORTED_DTYPE,
        &["v has dtype f16", "f32 and f64"],
    );
    let u64_ = t.b(FK_DTYPE_F64, &[256, 16]);
    expect_status(
        fwd(&v, &u64_, &w, 5.0, &out),
        FK_ERROR_DTYPE_MISMATCH,
        &["U has dtype f64 but v has dtype f32"],
    );
    expect_status(
        fwd(&v, &u, &w, -1.0, &out),
        FK_ERROR_INVALID_ARGUMENT,
        &["c = -1"],
    );
    expect_status(
        fwd(&v, &u, &w, f64::NAN, &out),
        FK_ERROR_INVALID_ARGUMENT,
        &["c = NaN"],
    );
    expect_status(
        unsafe { fk_christoffel_forward(v.raw(), u.raw(), w.raw(), 5.0, 0xe, out.raw(), null()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["flags = 0xe", "FK_GEO_ALLOW_TF32X3 = 4"],
    );
    ok(unsafe {
        fk_christoffel_forward(
            v.raw(),
            u.raw(),
            w.raw(),
            5.0,
            FK_GEO_ALLOW_TF32,
            out.raw(),
            null(),
        )
    });
    for (k, name) in ["v", "U", "W", "gamma"].iter().enumerate() {
        let p = |i: usize, b: &Buf| if i == k { null_mut() } else { b.raw() };
        let s = unsafe {
            fk_christoffel_forward(p(0, &v), p(1, &u), p(2, &w), 5.0, 0, p(3, &out), null())
        };
        expect_status(
            s,
            FK_ERROR_NULL_POINTER,
            &["fk_christoffel_forward", &format!("{name} is NULL")],
        );
    }
    // aliasing: gamma overlapping U
    let big = t.b(f32_, &[4, 256]);
    let mut alias = null_mut();
    let mut data = null_mut();
    ok(unsafe { fk_buffer_data(big.raw(), &mut data) });
    let shape = [256i64, 16];
    ok(unsafe { fk_buffer_wrap(t.ctx.0, data, f32_, 2, shape.as_ptr(), null(), &mut alias) });
    let alias = Buf(alias);
    expect_status(
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
    let strided = Buf(strided);
    let o2 = t.b(f32_, &[2, 256]);
    expect_status(
        fwd(&strided, &u, &w, 5.0, &o2),
        FK_ERROR_UNSUPPORTED,
        &["v must be contiguous"],
    );
    // backward
    let g = t.b(f32_, &[4, 256]);
    let dv = t.b(f32_, &[4, 256]);
    let du = t.b(f32_, &[256, 16]);
    let bwd = |g: &Buf, dv: *mut fk_buffer, du: *mut fk_buffer, dw: *mut fk_buffer| unsafe {
        fk_christoffel_backward(
            v.raw(),
            u.raw(),
            w.raw(),
            g.raw(),
            5.0,
            0,
            dv,
            du,
            dw,
            null(),
        )
    };
    ok(bwd(&g, dv.raw(), du.raw(), null_mut()));
    let g_bad = t.b(f32_, &[3, 256]);
    expect_status(
        bwd(&g_bad, dv.raw(), du.raw(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["fk_christoffel_backward", "g has shape [3, 256]"],
    );
    let dw_bad = t.b(f32_, &[256, 15]);
    expect_status(
        bwd(&g, dv.raw(), du.raw(), dw_bad.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["dW has shape [256, 15]"],
    );
    expect_status(
        bwd(&g, dv.raw(), dv.raw(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["dU has shape [4, 256]"],
    );
    expect_status(
        bwd(&g, g.raw(), null_mut(), null_mut()),
        FK_ERROR_ALIASING,
        &["dv overlaps the input g"],
    );
    let s = unsafe {
        fk_christoffel_backward(
            v.raw(),
            u.raw(),
            w.raw(),
            null(),
            5.0,
            0,
            dv.raw(),
            null_mut(),
            null_mut(),
            null(),
        )
    };
    expect_status(s, FK_ERROR_NULL_POINTER, &["g is NULL"]);
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
        z.write_reals(&vec![0.1; z.numel() as usize]);
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
        fk_leapfrog_forward(
            x,
            v,
            f,
            u,
            w.raw(),
            mu,
            dt,
            steps,
            5.0,
            0,
            xo,
            vo.raw(),
            tr,
            null(),
        )
    };
    ok(call(
        x.raw(),
        v.raw(),
        null(),
        u.raw(),
        null(),
        0.1,
        steps,
        xo.raw(),
        tr.raw(),
    ));
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            u.raw(),
            null(),
            0.1,
            0,
            xo.raw(),
            tr.raw(),
        ),
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_leapfrog_forward", "steps (T) = 0"],
    );
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            u.raw(),
            null(),
            0.1,
            -3,
            xo.raw(),
            null_mut(),
        ),
        FK_ERROR_INVALID_ARGUMENT,
        &["steps (T) = -3"],
    );
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            u.raw(),
            null(),
            f64::NAN,
            steps,
            xo.raw(),
            tr.raw(),
        ),
        FK_ERROR_INVALID_ARGUMENT,
        &["dt = NaN must be finite"],
    );
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            u.raw(),
            null(),
            f64::INFINITY,
            steps,
            xo.raw(),
            tr.raw(),
        ),
        FK_ERROR_INVALID_ARGUMENT,
        &["dt = inf must be finite"],
    );
    let tr_bad = t.b(d64, &[steps, 2, b, d + 1]);
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            u.raw(),
            null(),
            0.1,
            steps,
            xo.raw(),
            tr_bad.raw(),
        ),
        FK_ERROR_SHAPE_MISMATCH,
        &["traj has shape [4, 2, 3, 9] but must be [T, 2, B, D] = [4, 2, 3, 8]"],
    );
    let tr_short = t.b(d64, &[steps - 1, 2, b, d]);
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            u.raw(),
            null(),
            0.1,
            steps,
            xo.raw(),
            tr_short.raw(),
        ),
        FK_ERROR_SHAPE_MISMATCH,
        &["traj has shape [3, 2, 3, 8]"],
    );
    let mu_bad = t.b(d64, &[d + 1]);
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            u.raw(),
            mu_bad.raw(),
            0.1,
            steps,
            xo.raw(),
            null_mut(),
        ),
        FK_ERROR_SHAPE_MISMATCH,
        &["mu has shape [9] but must be [D] = [8]"],
    );
    let f_bad = t.b(d64, &[b + 1, d]);
    expect_status(
        call(
            x.raw(),
            v.raw(),
            f_bad.raw(),
            u.raw(),
            null(),
            0.1,
            steps,
            xo.raw(),
            null_mut(),
        ),
        FK_ERROR_SHAPE_MISMATCH,
        &["f has shape [4, 8] but v0 has shape [3, 8]"],
    );
    let u_bad = t.b(d64, &[d + 2, r]);
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            u_bad.raw(),
            null(),
            0.1,
            steps,
            xo.raw(),
            null_mut(),
        ),
        FK_ERROR_SHAPE_MISMATCH,
        &["U has shape [10, 2] but v0 has 8 columns"],
    );
    let x32 = t.b(FK_DTYPE_F32, &[b, d]);
    expect_status(
        call(
            x32.raw(),
            v.raw(),
            null(),
            u.raw(),
            null(),
            0.1,
            steps,
            xo.raw(),
            null_mut(),
        ),
        FK_ERROR_DTYPE_MISMATCH,
        &["x0 has dtype f32 but v0 has dtype f64"],
    );
    expect_status(
        call(
            null(),
            v.raw(),
            null(),
            u.raw(),
            null(),
            0.1,
            steps,
            xo.raw(),
            null_mut(),
        ),
        FK_ERROR_NULL_POINTER,
        &["x0 is NULL"],
    );
    expect_status(
        call(
            x.raw(),
            null(),
            null(),
            u.raw(),
            null(),
            0.1,
            steps,
            xo.raw(),
            null_mut(),
        ),
        FK_ERROR_NULL_POINTER,
        &["v0 is NULL"],
    );
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            null(),
            null(),
            0.1,
            steps,
            xo.raw(),
            null_mut(),
        ),
        FK_ERROR_NULL_POINTER,
        &["U is NULL"],
    );
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            u.raw(),
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
    expect_status(
        call(
            x.raw(),
            v.raw(),
            null(),
            u.raw(),
            null(),
            0.1,
            steps,
            v.raw(),
            null_mut(),
        ),
        FK_ERROR_ALIASING,
        &["x_out overlaps the input v0"],
    );
    // x_out = x0: allowed
    ok(call(
        x.raw(),
        v.raw(),
        null(),
        u.raw(),
        null(),
        0.1,
        steps,
        x.raw(),
        null_mut(),
    ));
    // backward
    let gv = t.b(d64, &[b, d]);
    gv.write_reals(&vec![1.0; 24]);
    let dv = t.b(d64, &[b, d]);
    let bwd = |dt: f64,
               steps: i64,
               tr: *const fk_buffer,
               dv: *mut fk_buffer,
               du: *mut fk_buffer| unsafe {
        fk_leapfrog_backward(
            v.raw(),
            null(),
            u.raw(),
            w.raw(),
            null(),
            dt,
            steps,
            5.0,
            0,
            tr,
            null(),
            gv.raw(),
            null_mut(),
            dv,
            null_mut(),
            du,
            null_mut(),
            null(),
        )
    };
    ok(bwd(0.1, steps, tr.raw(), dv.raw(), null_mut()));
    expect_status(
        bwd(0.1, 0, null(), dv.raw(), null_mut()),
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_leapfrog_backward", "steps (T) = 0"],
    );
    expect_status(
        bwd(f64::NEG_INFINITY, steps, null(), dv.raw(), null_mut()),
        FK_ERROR_INVALID_ARGUMENT,
        &["dt = -inf"],
    );
    expect_status(
        bwd(0.1, steps + 1, tr.raw(), dv.raw(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["traj has shape [4, 2, 3, 8] but must be [T, 2, B, D] = [5, 2, 3, 8]"],
    );
    let du_bad = t.b(d64, &[d, r + 1]);
    expect_status(
        bwd(0.1, steps, null(), dv.raw(), du_bad.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["dU has shape [8, 3] but U has shape [8, 2]"],
    );
    expect_status(
        bwd(0.1, steps, null(), gv.raw(), null_mut()),
        FK_ERROR_ALIASING,
        &["dv0 overlaps the input gv"],
    );
    let s = unsafe {
        fk_leapfrog_backward(
            null(),
            null(),
            u.raw(),
            w.raw(),
            null(),
            0.1,
            steps,
            5.0,
            0,
            null(),
            null(),
            null(),
            null_mut(),
            dv.raw(),
            null_mut(),
            null_mut(),
            null_mut(),
            null(),
        )
    };
    expect_status(s, FK_ERROR_NULL_POINTER, &["v0 is NULL"]);
    let s = unsafe {
        fk_leapfrog_backward(
            v.raw(),
            null(),
            u.raw(),
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
            dv.raw(),
            null_mut(),
            null_mut(),
            null_mut(),
            null(),
        )
    };
    expect_status(s, FK_ERROR_NULL_POINTER, &["W is NULL"]);
}

#[test]
fn flags_are_accepted_and_change_nothing_on_the_cpu() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::from_state(9);
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
        let g = Buf::poisoned(&ctx, FK_DTYPE_F32, &[b, d]);
        ok(unsafe {
            fk_christoffel_forward(i.v.raw(), i.u.raw(), i.w.raw(), p.c, flags, g.raw(), null())
        });
        let xo = Buf::poisoned(&ctx, FK_DTYPE_F32, &[b, d]);
        let vo = Buf::poisoned(&ctx, FK_DTYPE_F32, &[b, d]);
        ok(unsafe {
            fk_leapfrog_forward(
                i.x.raw(),
                i.v.raw(),
                raw_or_null(&i.f),
                i.u.raw(),
                i.w.raw(),
                raw_or_null(&i.mu),
                p.dt,
                2,
                p.c,
                flags,
                xo.raw(),
                vo.raw(),
                null_mut(),
                null(),
            )
        });
        outs.push((g.read_reals(), xo.read_reals(), vo.read_reals()));
    }
    assert!(outs.iter().all(|o| *o == outs[0]));
}
