//! The geodesic flow ops through the C ABI on the CPU backend.
//!
//! - Forward results against the f64 reference of `geodesic_util` (written from
//!   docs/ops.md section 5, independently of the library), f32 and f64.
//! - Both backwards against central finite differences of the library's own f64
//!   forward (inputs chosen so that no clamp boundary lies within reach of the
//!   finite-difference step), and the Christoffel backward against its formulas.
//! - Clamp boundaries: inputs built so that `gamma_raw` is exactly `+-c` (inclusive
//!   mask, as torch.clamp), just outside, and `c = +inf`.
//! - The trajectory: layout `[T, 2, B, D]`, and the backward with and without it.
//! - Bad inputs: tables of calls, each asserting the status and that the message
//!   names the argument.
//!
//! Handles, buffers of reals, the RNG and the comparison come from `tests/common`;
//! problems, the reference and the calls from `tests/geodesic_util`.

#![allow(non_snake_case)]

mod common;
mod geodesic_util;

use std::ptr::null;

use common::*;
use geodesic_util::*;

/// This file's forward tolerances (tighter than `common::tol` for f64).
fn tol(dtype: fk_dtype) -> f64 {
    if dtype == FK_DTYPE_F32 { 2e-5 } else { 1e-12 }
}

const F32: fk_dtype = FK_DTYPE_F32;
const F64: fk_dtype = FK_DTYPE_F64;

// ------------------------------------------------------------------ the ops on the CPU (flags 0)

fn christoffel(ctx: &Ctx, dt: fk_dtype, p: &Prob) -> Vec<f64> {
    Inputs::new(ctx, dt, p).gamma(0, NULL_STREAM)
}

/// `[dv, dU, dW]` for the incoming gradient `p.g`.
fn christoffel_bwd(ctx: &Ctx, dt: fk_dtype, p: &Prob) -> [Vec<f64>; 3] {
    Inputs::new(ctx, dt, p).chr_grads(0, NULL_STREAM)
}

/// `(x_T, v_T, traj)`.
fn leapfrog(ctx: &Ctx, dt: fk_dtype, p: &Prob) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (x, v, traj) = Inputs::new(ctx, dt, p).leapfrog(0, NULL_STREAM);
    (x, v, traj.read_reals())
}

/// `[dx0, dv0, df, dU, dW]` for `p.gx`, `p.gv`; with the forward's trajectory when
/// `use_traj`.
fn leapfrog_bwd(ctx: &Ctx, dt: fk_dtype, p: &Prob, use_traj: bool) -> [Vec<f64>; 5] {
    let i = Inputs::new(ctx, dt, p);
    let traj = use_traj.then(|| i.leapfrog(0, NULL_STREAM).2);
    i.lf_grads(raw_or_null(&traj), 0, NULL_STREAM)
}

/// A test's problem: `Prob::random` of these sizes `(B, D, R, T)` and optional inputs
/// `(f, mu)` from the generator at `state`, clamped at `c`; and the generator, for
/// the test's further draws.
fn drawn(state: u64, (b, d, r, t): Sizes, (with_f, with_mu): (bool, bool), c: f64) -> (Prob, Rng) {
    let mut rng = Rng::from_state(state);
    let mut p = Prob::random(&mut rng, b, d, r, t, with_f, with_mu);
    p.c = c;
    (p, rng)
}

type Sizes = (usize, usize, usize, usize);

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Central finite differences of `loss` w.r.t. every element of the input that
/// gradient `grad` is taken with respect to.
fn fd(p: &Prob, grad: &str, loss: &dyn Fn(&Prob) -> f64) -> Vec<f64> {
    let n = p.clone().wrt(grad).len();
    (0..n)
        .map(|k| {
            let mut a = p.clone();
            let mut b = p.clone();
            let x = a.wrt(grad)[k];
            let e = 1e-6 * x.abs().max(1.0);
            a.wrt(grad)[k] = x + e;
            b.wrt(grad)[k] = x - e;
            (loss(&a) - loss(&b)) / (2.0 * e)
        })
        .collect()
}

// ------------------------------------------------------------------ forward vs reference

#[test]
fn christoffel_forward_matches_reference() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::from_state(1);
    let shapes = [
        (1, 1, 1),
        (3, 5, 2),
        (17, 33, 7),
        (8, 64, 32),
        (5, 20, 130),
        (4, 7, 0),
    ];
    sweep(&shapes, &[f64::INFINITY, 0.3, 0.0], |(b, d, r), dt, c| {
        let mut p = Prob::random(&mut rng, b, d, r, 1, false, false).rounded(dt);
        p.c = c;
        let want = ref_gamma(&p, &p.v, &mut ClampStats::default());
        let got = christoffel(&ctx, dt, &p);
        let what = format!("gamma b={b} d={d} r={r} c={c}");
        assert_close_reals(&got, &want, tol(dt), &what);
    });
}

#[test]
fn christoffel_forward_in_place() {
    let ctx = Ctx::cpu();
    let (p, _) = drawn(2, (6, 9, 3, 1), (false, false), 0.2);
    let i = Inputs::new(&ctx, F64, &p);
    ok(i.chr_fwd(i.v.raw()).call());
    let want = ref_gamma(&p, &p.v, &mut ClampStats::default());
    assert_close_reals(&i.v.read_reals(), &want, 1e-14, "in-place gamma");
}

#[test]
fn leapfrog_forward_matches_reference() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::from_state(3);
    let shapes = [(1, 1, 1, 1), (3, 5, 2, 4), (9, 17, 5, 3), (4, 40, 33, 2)];
    let cases = [
        (false, false, f64::INFINITY),
        (true, true, 0.25),
        (true, false, 0.1),
    ];
    sweep(&shapes, &cases, |(b, d, r, t), dt, (with_f, with_mu, c)| {
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
    });
}

#[test]
fn leapfrog_in_place_and_without_trajectory() {
    let ctx = Ctx::cpu();
    let (p, _) = drawn(4, (5, 6, 3, 3), (true, true), 0.3);
    let (x, v, _) = ref_leapfrog(&p, &mut ClampStats::default());
    let i = Inputs::new(&ctx, F64, &p);
    ok(i.lf_fwd([i.x.raw(), i.v.raw(), NO_OUT]).call());
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
        p.g = Some(g.clone());
        let got = christoffel_bwd(&ctx, F64, &p);
        let want = ref_christoffel_backward(&p);
        check_grads(&got, &want, &CHR_GRADS, 1e-13, |n| format!("{n} formula"));
        let loss = |q: &Prob| dot(&christoffel(&ctx, F64, q), &g);
        let want = CHR_GRADS.map(|n| fd(&p, n, &loss));
        check_grads(&got, &want, &CHR_GRADS, 1e-6, |n| {
            format!("{n} vs finite differences")
        });
        // f32 against the f64 formulas on the rounded inputs
        let p32 = p.rounded(F32);
        let got = christoffel_bwd(&ctx, F32, &p32);
        let want = ref_christoffel_backward(&p32);
        check_grads(&got, &want, &CHR_GRADS, 2e-5, |n| format!("{n} f32"));
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
        (p.gx, p.gv) = (Some(gx.clone()), Some(gv.clone()));
        let loss = |q: &Prob| {
            let (x, v, _) = leapfrog(&ctx, F64, q);
            dot(&x, &gx) + dot(&v, &gv)
        };
        let what = format!("b={b} d={d} r={r} T={t}");
        let want = LF_GRADS.map(|n| fd(&p, n, &loss));
        for use_traj in [true, false] {
            let got = leapfrog_bwd(&ctx, F64, &p, use_traj);
            check_grads(&got, &want, &LF_GRADS, 2e-6, |n| {
                format!("{n} {what} traj={use_traj}")
            });
        }
        // f32 against the f64 gradients of the rounded problem
        let p32 = p.rounded(F32);
        let want64 = leapfrog_bwd(&ctx, F64, &p32, false);
        let got32 = leapfrog_bwd(&ctx, F32, &p32, true);
        check_grads(&got32, &want64, &LF_GRADS, 2e-5, |n| {
            format!("{n} f32 {what}")
        });
    }
}

#[test]
fn leapfrog_backward_optional_arguments() {
    let ctx = Ctx::cpu();
    let (mut p, mut rng) = drawn(7, (3, 5, 2, 2), (false, false), 0.2);
    let (d, r) = (5i64, 2i64);
    p.gv = Some(rng.uniform_vec(15, -1.0, 1.0));
    let with_zero_gx = Prob {
        gx: Some(vec![0.0; 15]),
        ..p.clone()
    };
    let full = leapfrog_bwd(&ctx, F64, &with_zero_gx, false);
    let i = Inputs::new(&ctx, F64, &p);
    // gx NULL (= zero), only dU and dx0 wanted
    let du = i.poisoned(&[d, r]);
    let dx = i.poisoned(&[3, d]);
    ok(
        i.lf_bwd(null(), [dx.raw(), NO_OUT, NO_OUT, du.raw(), NO_OUT])
            .call(),
    );
    assert_eq!(dx.read_reals(), vec![0.0; 15]);
    assert_close_reals(&du.read_reals(), &full[3], 1e-15, "dU alone");
    // every output NULL is a no-op
    let none = LfBwd {
        gv: null(),
        ..i.lf_bwd(null(), [NO_OUT; 5])
    };
    ok(none.call());
    // B = 0: dU and dW are zero
    let v0 = i.poisoned(&[0, d]);
    let dw = i.poisoned(&[d, r]);
    let empty = LfBwd {
        v: v0.raw(),
        du: du.raw(),
        dw: dw.raw(),
        ..none
    };
    ok(empty.call());
    assert_eq!(du.read_reals(), vec![0.0; 10]);
    assert_eq!(dw.read_reals(), vec![0.0; 10]);
    let g = i.poisoned(&[0, d]);
    du.write_reals(&[f64::NAN; 10]);
    let chr = ChrBwd {
        v: v0.raw(),
        g: g.raw(),
        c: 1.0,
        ..i.chr_bwd([NO_OUT, du.raw(), NO_OUT])
    };
    ok(chr.call());
    assert_eq!(du.read_reals(), vec![0.0; 10]);
}

#[test]
fn backwards_are_bit_reproducible() {
    let ctx = Ctx::cpu();
    let (mut p, mut rng) = drawn(8, (300, 24, 6, 2), (true, true), 0.3);
    let g = rng.uniform_vec(300 * 24, -1.0, 1.0);
    (p.g, p.gx, p.gv) = (Some(g.clone()), Some(g.clone()), Some(g));
    for dt in REAL_DTYPES {
        let a = christoffel_bwd(&ctx, dt, &p);
        let b = christoffel_bwd(&ctx, dt, &p);
        assert!((1..3).all(|k| same_bits(&a[k], &b[k])), "christoffel dU/dW");
        let a = leapfrog_bwd(&ctx, dt, &p, false);
        let b = leapfrog_bwd(&ctx, dt, &p, false);
        assert!((3..5).all(|k| same_bits(&a[k], &b[k])), "leapfrog dU/dW");
    }
}

// ------------------------------------------------------------------ clamp boundaries

/// One row, R = 1, `U = e_0`, `v_0 = 1`: `p = 1`, `s = 1`, so `gamma_raw = W[:, 0]`
/// exactly, whatever the dtype; `g = 1`.
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
        t: 1,
        x: vec![0.0; d],
        v,
        f: None,
        u,
        w: w.to_vec(),
        mu: None,
        g: Some(vec![1.0; d]),
        gx: None,
        gv: None,
        c,
        dt: 0.1,
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
    for dt in REAL_DTYPES {
        let w: Vec<f64> = if dt == F32 {
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
        let [dv, du, dw] = christoffel_bwd(&ctx, dt, &p);
        let mask = [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        assert_eq!(dw, mask.to_vec(), "dW = g' * s with s = 1");
        // dp = 2 p q with q = sum_d g'_d W_d = 5 - 5 + 4.5 + 0 = 4.5
        let dp = 2.0 * 4.5;
        assert_eq!(dv, (0..w.len()).map(|k| dp * p.u[k]).collect::<Vec<_>>());
        assert_eq!(du, (0..w.len()).map(|k| p.v[k] * dp).collect::<Vec<_>>());
        // c = +inf: nothing clamped
        let p = boundary_problem(&w, f64::INFINITY);
        assert_eq!(christoffel(&ctx, dt, &p), w);
        let [_, _, dw] = christoffel_bwd(&ctx, dt, &p);
        assert_eq!(dw, vec![1.0; w.len()]);
        // c = 0: everything but exact zeros clamped
        let p = boundary_problem(&w, 0.0);
        assert_eq!(christoffel(&ctx, dt, &p), vec![0.0; w.len()]);
        let [_, _, dw] = christoffel_bwd(&ctx, dt, &p);
        assert_eq!(dw, vec![0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    }
}

#[test]
fn nan_propagates_through_the_clamp() {
    let ctx = Ctx::cpu();
    let p = boundary_problem(&[f64::NAN, 1.0], 5.0);
    let g = christoffel(&ctx, F64, &p);
    assert!(g[0].is_nan() && g[1] == 1.0, "{g:?}");
}

// ------------------------------------------------------------------ bad inputs

#[test]
fn christoffel_rejects_bad_inputs() {
    let ctx = Ctx::cpu();
    let buf = |dt: fk_dtype, shape: &[i64]| Buf::poisoned(&ctx, dt, shape);
    // v [4, 256], U and W [256, 16], g: NaN
    let p = Prob::filled(4, 256, 16, 1, f64::NAN);
    let i = Inputs::new(&ctx, F32, &p);
    let out = buf(F32, &[4, 256]);
    let fwd = i.chr_fwd(out.raw());
    let (u_bad, w_bad, out_bad) = (
        buf(F32, &[512, 16]),
        buf(F32, &[256, 8]),
        buf(F32, &[4, 255]),
    );
    let (v3, v16, u64_) = (
        buf(F32, &[2, 2, 256]),
        buf(FK_DTYPE_F16, &[4, 256]),
        buf(F64, &[256, 16]),
    );
    // gamma overlapping U; a non-contiguous v (both over big's memory)
    let big = buf(F32, &[4, 256]);
    let alias = unsafe { Buf::wrap(&ctx, big.data(), F32, &[256, 16], None) };
    let strided = unsafe { Buf::wrap(&ctx, big.data(), F32, &[2, 256], Some(&[512, 1])) };
    let o2 = buf(F32, &[2, 256]);
    // the backward
    let g = i.g.as_ref().unwrap();
    let (dv, du) = (buf(F32, &[4, 256]), buf(F32, &[256, 16]));
    let bwd = i.chr_bwd([dv.raw(), du.raw(), NO_OUT]);
    let (g_bad, dw_bad) = (buf(F32, &[3, 256]), buf(F32, &[256, 15]));
    use FK_ERROR_INVALID_ARGUMENT as INVALID;
    use FK_ERROR_NULL_POINTER as NULL;
    use FK_ERROR_SHAPE_MISMATCH as SHAPE;
    let alias_u = ChrFwd {
        u: alias.raw(),
        gamma: big.raw(),
        ..fwd
    };
    let strided_v = ChrFwd {
        v: strided.raw(),
        gamma: o2.raw(),
        ..fwd
    };
    #[rustfmt::skip]
    let cases: &[(&dyn Entry, fk_status, &[&str])] = &[
        (&fwd, FK_OK, &[]),
        (&ChrFwd { u: u_bad.raw(), ..fwd }, SHAPE,
            &["fk_christoffel_forward: U has shape [512, 16] but v has 256 columns"]),
        (&ChrFwd { w: w_bad.raw(), ..fwd }, SHAPE, &["W has shape [256, 8]", "U has shape [256, 16]"]),
        (&ChrFwd { gamma: out_bad.raw(), ..fwd }, SHAPE, &["gamma has shape [4, 255]"]),
        (&ChrFwd { v: v3.raw(), ..fwd }, SHAPE, &["v must be a [B, D] matrix"]),
        (&ChrFwd { v: v16.raw(), ..fwd }, FK_ERROR_UNSUPPORTED_DTYPE, &["v has dtype f16", "f32 and f64"]),
        (&ChrFwd { u: u64_.raw(), ..fwd }, FK_ERROR_DTYPE_MISMATCH, &["U has dtype f64 but v has dtype f32"]),
        (&ChrFwd { c: -1.0, ..fwd }, INVALID, &["c = -1"]),
        (&ChrFwd { c: f64::NAN, ..fwd }, INVALID, &["c = NaN"]),
        (&ChrFwd { flags: 0xe, ..fwd }, INVALID, &["flags = 0xe", "FK_GEO_ALLOW_TF32X3 = 4"]),
        (&ChrFwd { flags: FK_GEO_ALLOW_TF32, ..fwd }, FK_OK, &[]),
        (&ChrFwd { v: null(), ..fwd }, NULL, &["fk_christoffel_forward", "v is NULL"]),
        (&ChrFwd { u: null(), ..fwd }, NULL, &["fk_christoffel_forward", "U is NULL"]),
        (&ChrFwd { w: null(), ..fwd }, NULL, &["fk_christoffel_forward", "W is NULL"]),
        (&ChrFwd { gamma: NO_OUT, ..fwd }, NULL, &["fk_christoffel_forward", "gamma is NULL"]),
        (&alias_u, FK_ERROR_ALIASING, &["gamma overlaps the input U"]),
        (&strided_v, FK_ERROR_UNSUPPORTED, &["v must be contiguous"]),
        (&bwd, FK_OK, &[]),
        (&ChrBwd { g: g_bad.raw(), ..bwd }, SHAPE, &["fk_christoffel_backward", "g has shape [3, 256]"]),
        (&ChrBwd { dw: dw_bad.raw(), ..bwd }, SHAPE, &["dW has shape [256, 15]"]),
        (&ChrBwd { du: dv.raw(), ..bwd }, SHAPE, &["dU has shape [4, 256]"]),
        (&ChrBwd { dv: g.raw(), du: NO_OUT, ..bwd }, FK_ERROR_ALIASING, &["dv overlaps the input g"]),
        (&ChrBwd { g: null(), du: NO_OUT, ..bwd }, NULL, &["g is NULL"]),
    ];
    expect_statuses(cases);
}

#[test]
fn leapfrog_rejects_bad_inputs() {
    let ctx = Ctx::cpu();
    let buf = |dt: fk_dtype, shape: &[i64]| Buf::poisoned(&ctx, dt, shape);
    let (b, d, r, steps) = (3i64, 8i64, 2i64, 4i64);
    // x0, v0, U, W: 0.1, gv: 1
    let p = Prob {
        gv: Some(vec![1.0; 24]),
        ..Prob::filled(3, 8, 2, 4, 0.1)
    };
    let i = Inputs::new(&ctx, F64, &p);
    let (x, v, gv) = (&i.x, &i.v, i.gv.as_ref().unwrap());
    let (xo, vo) = (buf(F64, &[b, d]), buf(F64, &[b, d]));
    let tr = buf(F64, &[steps, 2, b, d]);
    let with_traj = i.lf_fwd([xo.raw(), vo.raw(), tr.raw()]);
    let fwd = LfFwd {
        traj: NO_OUT,
        ..with_traj
    };
    let tr_bad = buf(F64, &[steps, 2, b, d + 1]);
    let tr_short = buf(F64, &[steps - 1, 2, b, d]);
    let mu_bad = buf(F64, &[d + 1]);
    let f_bad = buf(F64, &[b + 1, d]);
    let u_bad = buf(F64, &[d + 2, r]);
    let x32 = buf(F32, &[b, d]);
    // the backward
    let dv = buf(F64, &[b, d]);
    let bwd = i.lf_bwd(null(), [NO_OUT, dv.raw(), NO_OUT, NO_OUT, NO_OUT]);
    let du_bad = buf(F64, &[d, r + 1]);
    use FK_ERROR_INVALID_ARGUMENT as INVALID;
    use FK_ERROR_NULL_POINTER as NULL;
    use FK_ERROR_SHAPE_MISMATCH as SHAPE;
    #[rustfmt::skip]
    let cases: &[(&dyn Entry, fk_status, &[&str])] = &[
        (&with_traj, FK_OK, &[]),
        (&LfFwd { steps: 0, ..with_traj }, INVALID, &["fk_leapfrog_forward", "steps (T) = 0"]),
        (&LfFwd { steps: -3, ..fwd }, INVALID, &["steps (T) = -3"]),
        (&LfFwd { dt: f64::NAN, ..with_traj }, INVALID, &["dt = NaN must be finite"]),
        (&LfFwd { dt: f64::INFINITY, ..with_traj }, INVALID, &["dt = inf must be finite"]),
        (&LfFwd { traj: tr_bad.raw(), ..fwd }, SHAPE,
            &["traj has shape [4, 2, 3, 9] but must be [T, 2, B, D] = [4, 2, 3, 8]"]),
        (&LfFwd { traj: tr_short.raw(), ..fwd }, SHAPE, &["traj has shape [3, 2, 3, 8]"]),
        (&LfFwd { mu: mu_bad.raw(), ..fwd }, SHAPE, &["mu has shape [9] but must be [D] = [8]"]),
        (&LfFwd { f: f_bad.raw(), ..fwd }, SHAPE, &["f has shape [4, 8] but v0 has shape [3, 8]"]),
        (&LfFwd { u: u_bad.raw(), ..fwd }, SHAPE, &["U has shape [10, 2] but v0 has 8 columns"]),
        (&LfFwd { x: x32.raw(), ..fwd }, FK_ERROR_DTYPE_MISMATCH, &["x0 has dtype f32 but v0 has dtype f64"]),
        (&LfFwd { x: null(), ..fwd }, NULL, &["x0 is NULL"]),
        (&LfFwd { v: null(), ..fwd }, NULL, &["v0 is NULL"]),
        (&LfFwd { u: null(), ..fwd }, NULL, &["U is NULL"]),
        (&LfFwd { x_out: NO_OUT, ..fwd }, NULL, &["x_out is NULL"]),
        // x_out = v0: not the allowed in-place form; x_out = x0: allowed
        (&LfFwd { x_out: v.raw(), ..fwd }, FK_ERROR_ALIASING, &["x_out overlaps the input v0"]),
        (&LfFwd { x_out: x.raw(), ..fwd }, FK_OK, &[]),
        (&LfBwd { traj: tr.raw(), ..bwd }, FK_OK, &[]),
        (&LfBwd { steps: 0, ..bwd }, INVALID, &["fk_leapfrog_backward", "steps (T) = 0"]),
        (&LfBwd { dt: f64::NEG_INFINITY, ..bwd }, INVALID, &["dt = -inf"]),
        (&LfBwd { steps: steps + 1, traj: tr.raw(), ..bwd }, SHAPE,
            &["traj has shape [4, 2, 3, 8] but must be [T, 2, B, D] = [5, 2, 3, 8]"]),
        (&LfBwd { du: du_bad.raw(), ..bwd }, SHAPE, &["dU has shape [8, 3] but U has shape [8, 2]"]),
        (&LfBwd { dv0: gv.raw(), ..bwd }, FK_ERROR_ALIASING, &["dv0 overlaps the input gv"]),
        (&LfBwd { v: null(), gv: null(), ..bwd }, NULL, &["v0 is NULL"]),
        (&LfBwd { w: null(), gv: null(), ..bwd }, NULL, &["W is NULL"]),
    ];
    expect_statuses(cases);
}

#[test]
fn flags_are_accepted_and_change_nothing_on_the_cpu() {
    let ctx = Ctx::cpu();
    let (p, _) = drawn(9, (5, 12, 3, 2), (true, true), 0.2);
    let i = Inputs::new(&ctx, F32, &p);
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
        let gamma = i.gamma(flags, NULL_STREAM);
        let xo = i.poisoned(&[b, d]);
        let vo = i.poisoned(&[b, d]);
        ok(LfFwd {
            flags,
            ..i.lf_fwd([xo.raw(), vo.raw(), NO_OUT])
        }
        .call());
        outs.push((gamma, xo.read_reals(), vo.read_reals()));
    }
    assert!(outs.iter().all(|o| *o == outs[0]));
}
