//! The geodesic ops on CUDA against the CPU oracle, through the C ABI.
//!
//! Without a CUDA device every test prints "SKIPPED: no CUDA device" and passes,
//! unless `FK_REQUIRE_GPU=1`, which makes the skip a failure. `FK_SANITIZE=1`
//! (compute-sanitizer runs) shrinks the sizes.
//!
//! Covered, f32 and f64: random shapes with odd B, D, R, R > 32 and R > 128 and
//! D > 1024 (the cuBLAS route of every op), B = 0, several tiles per block (the route's geo_sw too); every
//! kernel also with `FK_GEO_FORCE_GENERIC`, so the fast (or route) and the generic
//! kernels are both checked on the same shapes; the leapfrog backward's route with
//! every optional input and output on and off; misaligned rows (the non-cp.async load path); the in-place
//! forms; trajectory on/off; optional arguments; outputs poisoned with NaN before
//! every run; bit-reproducible dU, dW; an owned stream; the TF32 forwards
//! (`FK_GEO_ALLOW_TF32`, tolerance 5e-3; f64 and the backwards unaffected).
//!
//! Tolerances (relative error ||out - ref|| / ||ref||): f64 1e-11, f32 2e-5
//! (forwards) and 1e-4 (backwards). The oracle computes in f64, so an f32 kernel
//! may see `gamma_raw` on the other side of `+-c` than the oracle does at an element
//! within rounding of the boundary: the Christoffel backward tests zero `g` at such
//! elements (the mask is then irrelevant there); in the leapfrog backward a flip is
//! damped by `dt/2` and stays inside the tolerance.

#![allow(non_snake_case)]

mod common;

use std::ptr::{null, null_mut};

use common::*;
use fusekit::abi::geodesic::*;

fn tol_fwd(d: fk_dtype) -> f64 {
    if d == FK_DTYPE_F32 { 2e-5 } else { 1e-11 }
}
fn tol_bwd(d: fk_dtype) -> f64 {
    if d == FK_DTYPE_F32 { 1e-4 } else { 1e-11 }
}

// ------------------------------------------------------------------ problems

#[derive(Clone)]
struct Prob {
    b: usize,
    d: usize,
    r: usize,
    t: usize,
    x: Vec<f64>,
    v: Vec<f64>,
    f: Option<Vec<f64>>,
    u: Vec<f64>,
    w: Vec<f64>,
    mu: Option<Vec<f64>>,
    g: Vec<f64>,
    gx: Option<Vec<f64>>,
    gv: Option<Vec<f64>>,
    c: f64,
    dt: f64,
}

impl Prob {
    /// Values scaled so that |gamma_raw| is O(1) whatever D and R, and the clamp
    /// (at `c`) cuts a good fraction of the entries.
    fn new(rng: &mut Rng, b: usize, d: usize, r: usize, t: usize, opt: bool, c: f64) -> Prob {
        let su = 1.0 / (d as f64).sqrt().max(1.0);
        let sw = 1.0 / (r as f64).max(1.0);
        Prob {
            b,
            d,
            r,
            t,
            x: rng.uniform_vec(b * d, -1.0, 1.0),
            v: rng.uniform_vec(b * d, -1.5, 1.5),
            f: opt.then(|| rng.uniform_vec(b * d, -0.5, 0.5)),
            u: rng.uniform_vec(d * r, -2.0 * su, 2.0 * su),
            w: rng.uniform_vec(d * r, -2.0 * sw, 2.0 * sw),
            mu: opt.then(|| rng.uniform_vec(d, 0.0, 0.5)),
            g: rng.uniform_vec(b * d, -1.0, 1.0),
            gx: opt.then(|| rng.uniform_vec(b * d, -1.0, 1.0)),
            gv: Some(rng.uniform_vec(b * d, -1.0, 1.0)),
            c,
            dt: 0.1,
        }
    }
}

/// Every input of a problem on one context.
struct On {
    x: Buf,
    v: Buf,
    f: Option<Buf>,
    u: Buf,
    w: Buf,
    mu: Option<Buf>,
    g: Buf,
    gx: Option<Buf>,
    gv: Option<Buf>,
}

fn upload(ctx: &Ctx, dt: fk_dtype, p: &Prob) -> On {
    let (b, d, r) = (p.b as i64, p.d as i64, p.r as i64);
    let bd = |v: &Vec<f64>| Buf::from_reals(ctx, dt, &[b, d], v);
    On {
        x: bd(&p.x),
        v: bd(&p.v),
        f: p.f.as_ref().map(bd),
        u: Buf::from_reals(ctx, dt, &[d, r], &p.u),
        w: Buf::from_reals(ctx, dt, &[d, r], &p.w),
        mu: p.mu.as_ref().map(|m| Buf::from_reals(ctx, dt, &[d], m)),
        g: bd(&p.g),
        gx: p.gx.as_ref().map(bd),
        gv: p.gv.as_ref().map(bd),
    }
}

/// The outputs of all four ops on one context.
struct Outs {
    gamma: Vec<f64>,
    chr: [Vec<f64>; 3],
    x: Vec<f64>,
    v: Vec<f64>,
    traj: Vec<f64>,
    lf: [Vec<f64>; 5],
    lf_notraj: [Vec<f64>; 5],
}

fn run_all(ctx: &Ctx, dt: fk_dtype, p: &Prob, flags: u32, stream: *const fk_stream) -> Outs {
    let i = upload(ctx, dt, p);
    let (b, d, r, t) = (p.b as i64, p.d as i64, p.r as i64, p.t as i64);
    let sync = || {
        if !stream.is_null() {
            ok(unsafe { fk_stream_synchronize(stream) });
        }
    };
    let gamma = Buf::poisoned(ctx, dt, &[b, d]);
    ok(unsafe {
        fk_christoffel_forward(
            i.v.raw(),
            i.u.raw(),
            i.w.raw(),
            p.c,
            flags,
            gamma.raw(),
            stream,
        )
    });
    let chr = [
        Buf::poisoned(ctx, dt, &[b, d]),
        Buf::poisoned(ctx, dt, &[d, r]),
        Buf::poisoned(ctx, dt, &[d, r]),
    ];
    ok(unsafe {
        fk_christoffel_backward(
            i.v.raw(),
            i.u.raw(),
            i.w.raw(),
            i.g.raw(),
            p.c,
            flags,
            chr[0].raw(),
            chr[1].raw(),
            chr[2].raw(),
            stream,
        )
    });
    let xo = Buf::poisoned(ctx, dt, &[b, d]);
    let vo = Buf::poisoned(ctx, dt, &[b, d]);
    let tr = Buf::poisoned(ctx, dt, &[t, 2, b, d]);
    ok(unsafe {
        fk_leapfrog_forward(
            i.x.raw(),
            i.v.raw(),
            raw_or_null(&i.f),
            i.u.raw(),
            i.w.raw(),
            raw_or_null(&i.mu),
            p.dt,
            t,
            p.c,
            flags,
            xo.raw(),
            vo.raw(),
            tr.raw(),
            stream,
        )
    });
    let bwd = |traj: *const fk_buffer| {
        let o = [
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
                t,
                p.c,
                flags,
                traj,
                raw_or_null(&i.gx),
                raw_or_null(&i.gv),
                o[0].raw(),
                o[1].raw(),
                o[2].raw(),
                o[3].raw(),
                o[4].raw(),
                stream,
            )
        });
        sync();
        o.map(|o| o.read_reals())
    };
    let lf = bwd(tr.raw());
    let lf_notraj = bwd(null());
    sync();
    Outs {
        gamma: gamma.read_reals(),
        chr: chr.map(|o| o.read_reals()),
        x: xo.read_reals(),
        v: vo.read_reals(),
        traj: tr.read_reals(),
        lf,
        lf_notraj,
    }
}

/// Zeroes `g` where the f64 |gamma_raw| is within `rel` of c (see the module doc).
fn guard_boundary(p: &mut Prob, rel: f64) {
    if !p.c.is_finite() {
        return;
    }
    let (d, r) = (p.d, p.r);
    for i in 0..p.b {
        let mut pp = vec![0.0; r];
        for k in 0..d {
            for q in 0..r {
                pp[q] += p.v[i * d + k] * p.u[k * r + q];
            }
        }
        for k in 0..d {
            let raw: f64 = (0..r).map(|q| pp[q] * pp[q] * p.w[k * r + q]).sum();
            if (raw.abs() - p.c).abs() <= rel * p.c.max(1e-30) + 1e-30 {
                p.g[i * d + k] = 0.0;
            }
        }
    }
}

fn compare(dt: fk_dtype, got: &Outs, want: &Outs, what: &str) {
    let (tf, tb) = (tol_fwd(dt), tol_bwd(dt));
    assert_close_reals(&got.gamma, &want.gamma, tf, &format!("gamma {what}"));
    for (k, n) in ["dv", "dU", "dW"].iter().enumerate() {
        assert_close_reals(
            &got.chr[k],
            &want.chr[k],
            tb,
            &format!("christoffel {n} {what}"),
        );
    }
    close_lf(got, want, tf, what);
    for (k, n) in ["dx0", "dv0", "df", "dU", "dW"].iter().enumerate() {
        assert_close_reals(
            &got.lf[k],
            &want.lf[k],
            tb,
            &format!("leapfrog {n} (traj) {what}"),
        );
        assert_close_reals(
            &got.lf_notraj[k],
            &want.lf[k],
            tb,
            &format!("leapfrog {n} (no traj) {what}"),
        );
    }
}

fn shapes() -> Vec<(usize, usize, usize, usize)> {
    // (B, D, R, T)
    if sanitizing() {
        vec![
            (1, 1, 1, 1),
            (7, 33, 5, 2),
            (40, 70, 17, 2),
            (3, 130, 33, 1),
            (33, 20, 3, 3),
            (9, 256, 20, 2),    // the vector row layout (Cfg::VL) with 16-byte rows
            (2200, 300, 24, 2), // the leapfrog forward's register kernel (lf_fwd_rs), several tiles per block
            (4300, 8, 33, 1),   // the route's geo_sw with two tiles in some blocks
        ]
    } else {
        vec![
            (1, 1, 1, 1),
            (7, 33, 5, 2),
            (33, 100, 17, 3),
            (257, 512, 32, 2),
            (129, 300, 31, 1),
            (64, 1000, 8, 2),
            (17, 1030, 3, 2),
            (9, 64, 33, 2),
            (5, 40, 129, 2),
            (3001, 128, 16, 2),
            (6, 2100, 2, 1),
            (4500, 40, 33, 2),  // the route's geo_sw with two tiles in some blocks
            (4500, 300, 24, 3), // the leapfrog forward's register kernel (lf_fwd_rs), several tiles per block
        ]
    }
}

#[test]
fn cuda_matches_cpu_fast_and_generic() {
    let Some(gpu) = gpu() else { return };
    let cpu = Ctx::cpu();
    let mut rng = Rng::from_state(11);
    for (b, d, r, t) in shapes() {
        for dt in [FK_DTYPE_F32, FK_DTYPE_F64] {
            for (opt, c) in [(true, 0.6), (false, f64::INFINITY)] {
                let mut p = Prob::new(&mut rng, b, d, r, t, opt, c);
                if dt == FK_DTYPE_F32 {
                    guard_boundary(&mut p, 1e-4);
                }
                let want = run_all(&cpu, dt, &p, 0, null());
                for flags in [0, FK_GEO_FORCE_GENERIC] {
                    let got = run_all(&gpu, dt, &p, flags, null());
                    let what = format!(
                        "B={b} D={d} R={r} T={t} {} f/mu={opt} c={c} flags={flags}",
                        if dt == FK_DTYPE_F32 { "f32" } else { "f64" }
                    );
                    compare(dt, &got, &want, &what);
                }
            }
        }
    }
}

#[test]
fn cuda_zero_rows_zero_gradients() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::from_state(12);
    let p = Prob::new(&mut rng, 0, 24, 5, 2, true, 0.5);
    for dt in [FK_DTYPE_F32, FK_DTYPE_F64] {
        for flags in [0, FK_GEO_FORCE_GENERIC] {
            let o = run_all(&gpu, dt, &p, flags, null());
            assert!(o.gamma.is_empty() && o.x.is_empty());
            assert_eq!(o.chr[1], vec![0.0; 120]);
            assert_eq!(o.chr[2], vec![0.0; 120]);
            assert_eq!(o.lf[3], vec![0.0; 120]);
            assert_eq!(o.lf_notraj[4], vec![0.0; 120]);
        }
    }
}

#[test]
fn cuda_owned_stream_and_reproducible_gradients() {
    let Some(gpu) = gpu() else { return };
    let mut s = null_mut();
    ok(unsafe { fk_stream_create(gpu.0, &mut s) });
    let mut rng = Rng::from_state(13);
    let (b, d, r) = if sanitizing() {
        (40, 64, 8)
    } else {
        (2000, 512, 32)
    };
    let mut p = Prob::new(&mut rng, b, d, r, 2, true, 0.6);
    guard_boundary(&mut p, 1e-4);
    for dt in [FK_DTYPE_F32, FK_DTYPE_F64] {
        let a = run_all(&gpu, dt, &p, 0, s);
        let b2 = run_all(&gpu, dt, &p, 0, s);
        let same = |x: &[f64], y: &[f64]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(
            same(&a.chr[1], &b2.chr[1]) && same(&a.chr[2], &b2.chr[2]),
            "christoffel dU/dW differ between runs"
        );
        assert!(
            same(&a.lf[3], &b2.lf[3]) && same(&a.lf[4], &b2.lf[4]),
            "leapfrog dU/dW differ between runs"
        );
        assert!(same(&a.gamma, &b2.gamma) && same(&a.v, &b2.v));
    }
    ok(unsafe { fk_stream_destroy(s) });
}

#[test]
fn cuda_misaligned_rows_and_in_place() {
    let Some(gpu) = gpu() else { return };
    let cpu = Ctx::cpu();
    let mut rng = Rng::from_state(14);
    // R = 12: the fast kernels; R = 40: the cuBLAS route; D = 300, R = 24: the leapfrog
    // forward's register kernel's fallback (lf_fwd_rs needs 16-byte rows)
    for (b, d, r) in [(37usize, 64usize, 12usize), (37, 64, 40), (37, 300, 24)] {
        let p = Prob::new(&mut rng, b, d, r, 1, false, 0.6);
        for dt in [FK_DTYPE_F32, FK_DTYPE_F64] {
            let want = run_all(&cpu, dt, &p, 0, null());
            // v one element into a larger buffer: rows no longer 16-byte aligned
            let big = Buf::poisoned(&gpu, dt, &[(b * d + 1) as i64]);
            let mut vals = vec![0.0; b * d + 1];
            vals[1..].copy_from_slice(&p.v);
            big.write_reals(&vals);
            let mut base = null_mut();
            ok(unsafe { fk_buffer_data(big.raw(), &mut base) });
            let shape = [b as i64, d as i64];
            let mut vh = null_mut();
            ok(unsafe {
                fk_buffer_wrap(
                    gpu.0,
                    (base as *mut u8).add(dsize(dt)) as *mut _,
                    dt,
                    2,
                    shape.as_ptr(),
                    null(),
                    &mut vh,
                )
            });
            let v = Buf(vh);
            let i = upload(&gpu, dt, &p);
            let out = Buf::poisoned(&gpu, dt, &[b as i64, d as i64]);
            ok(unsafe {
                fk_christoffel_forward(v.raw(), i.u.raw(), i.w.raw(), p.c, 0, out.raw(), null())
            });
            assert_close_reals(
                &out.read_reals(),
                &want.gamma,
                tol_fwd(dt),
                "gamma, misaligned v",
            );
            // in place: gamma over v
            ok(unsafe {
                fk_christoffel_forward(i.v.raw(), i.u.raw(), i.w.raw(), p.c, 0, i.v.raw(), null())
            });
            assert_close_reals(
                &i.v.read_reals(),
                &want.gamma,
                tol_fwd(dt),
                "gamma in place",
            );
            // leapfrog in place: x_out = x0, v_out = v0
            let i = upload(&gpu, dt, &p);
            ok(unsafe {
                fk_leapfrog_forward(
                    i.x.raw(),
                    i.v.raw(),
                    null(),
                    i.u.raw(),
                    i.w.raw(),
                    null(),
                    p.dt,
                    1,
                    p.c,
                    0,
                    i.x.raw(),
                    i.v.raw(),
                    null_mut(),
                    null(),
                )
            });
            assert_close_reals(&i.x.read_reals(), &want.x, tol_fwd(dt), "x in place");
            assert_close_reals(&i.v.read_reals(), &want.v, tol_fwd(dt), "v in place");
        }
    }
}

#[test]
fn cuda_backward_optional_outputs() {
    let Some(gpu) = gpu() else { return };
    let cpu = Ctx::cpu();
    let mut rng = Rng::from_state(15);
    let mut p = Prob::new(&mut rng, 50, 96, 8, 3, true, 0.6);
    guard_boundary(&mut p, 1e-4);
    let dt = FK_DTYPE_F64;
    let want = run_all(&cpu, dt, &p, 0, null());
    let (b, d, r) = (50i64, 96i64, 8i64);
    for flags in [0, FK_GEO_FORCE_GENERIC] {
        let i = upload(&gpu, dt, &p);
        // each output alone
        for k in 0..3 {
            let shape = if k == 0 { [b, d] } else { [d, r] };
            let o = Buf::poisoned(&gpu, dt, &shape);
            let ptr = |j: usize| if j == k { o.raw() } else { null_mut() };
            ok(unsafe {
                fk_christoffel_backward(
                    i.v.raw(),
                    i.u.raw(),
                    i.w.raw(),
                    i.g.raw(),
                    p.c,
                    flags,
                    ptr(0),
                    ptr(1),
                    ptr(2),
                    null(),
                )
            });
            assert_close_reals(
                &o.read_reals(),
                &want.chr[k],
                1e-11,
                &format!("christoffel output {k} alone"),
            );
        }
        for k in 0..5 {
            let shape = if k < 3 { [b, d] } else { [d, r] };
            let o = Buf::poisoned(&gpu, dt, &shape);
            let ptr = |j: usize| if j == k { o.raw() } else { null_mut() };
            ok(unsafe {
                fk_leapfrog_backward(
                    i.v.raw(),
                    raw_or_null(&i.f),
                    i.u.raw(),
                    i.w.raw(),
                    raw_or_null(&i.mu),
                    p.dt,
                    3,
                    p.c,
                    flags,
                    null(),
                    raw_or_null(&i.gx),
                    raw_or_null(&i.gv),
                    ptr(0),
                    ptr(1),
                    ptr(2),
                    ptr(3),
                    ptr(4),
                    null(),
                )
            });
            assert_close_reals(
                &o.read_reals(),
                &want.lf[k],
                1e-11,
                &format!("leapfrog output {k} alone"),
            );
        }
    }
}

/// The shapes of the tensor-core tests: odd sizes, every DJ and RP of the TF32
/// kernels, T = 1 and T > 1, blocks with several tiles (B > 16 x SMs), and R > 32 (no
/// fast kernel). Under the sanitizers: a small set, still with several tiles per block.
fn tc_shapes() -> Vec<(usize, usize, usize, usize)> {
    if sanitizing() {
        // (2200, 64, 32, 2): more tiles than SMs, so that blocks run several tiles (the
        // TF32 leapfrog's v stage and x, f stash across tiles)
        vec![(7, 33, 5, 2), (40, 64, 32, 1), (2200, 64, 32, 2)]
    } else {
        vec![
            (7, 33, 5, 2),
            (257, 512, 32, 2),
            (129, 300, 31, 8),
            (50, 100, 16, 1),
            (4501, 200, 24, 3),
            // R > 32: the GEMM route (TF32 products in the Christoffel forward's)
            (60, 200, 40, 1),
        ]
    }
}

/// x_T, v_T and the trajectory of `got` against `want` within `tol`.
fn close_lf(got: &Outs, want: &Outs, tol: f64, what: &str) {
    assert_close_reals(&got.x, &want.x, tol, &format!("x_T {what}"));
    assert_close_reals(&got.v, &want.v, tol, &format!("v_T {what}"));
    assert_close_reals(&got.traj, &want.traj, tol, &format!("traj {what}"));
}

#[test]
fn cuda_tf32_forwards() {
    let Some(gpu) = gpu() else { return };
    let cpu = Ctx::cpu();
    let mut rng = Rng::from_state(16);
    for (b, d, r, t) in tc_shapes() {
        let p = Prob::new(&mut rng, b, d, r, t, true, 0.6);
        let want = run_all(&cpu, FK_DTYPE_F32, &p, 0, null());
        let got = run_all(&gpu, FK_DTYPE_F32, &p, FK_GEO_ALLOW_TF32, null());
        let what = format!("TF32 B={b} D={d} R={r} T={t}");
        assert_close_reals(&got.gamma, &want.gamma, 5e-3, &format!("gamma {what}"));
        close_lf(&got, &want, 5e-3, &what);
        // the backwards ignore the flag (bit-identical to strict runs); f64 too
        let strict = run_all(&gpu, FK_DTYPE_F32, &p, 0, null());
        assert!(
            got.chr.iter().zip(&strict.chr).all(|(a, b)| a == b),
            "christoffel backward changed with FK_GEO_ALLOW_TF32"
        );
        assert!(
            got.lf_notraj
                .iter()
                .zip(&strict.lf_notraj)
                .all(|(a, b)| a == b),
            "leapfrog backward (recompute) changed with FK_GEO_ALLOW_TF32"
        );
        let g64 = run_all(&gpu, FK_DTYPE_F64, &p, FK_GEO_ALLOW_TF32, null());
        let s64 = run_all(&gpu, FK_DTYPE_F64, &p, 0, null());
        assert!(
            g64.gamma == s64.gamma && g64.v == s64.v,
            "f64 changed with FK_GEO_ALLOW_TF32"
        );
    }
}

/// `FK_GEO_ALLOW_TF32X3`: the leapfrog forward's 3xTF32 kernel against the CPU at the
/// strict f32 tolerance (TF32's error is ~100x over it) and different from the FFMA
/// kernel's bits where a fast kernel applies and T >= 2 (so the 3xTF32 kernel ran); the
/// Christoffel ops, the leapfrog backward's recomputed forward, f64 and the route
/// (R > 32) bit-identical to flags 0; with `FK_GEO_ALLOW_TF32` too, TF32's bits.
#[test]
fn cuda_tf32x3_leapfrog() {
    let Some(gpu) = gpu() else { return };
    let cpu = Ctx::cpu();
    let mut rng = Rng::from_state(18);
    for (b, d, r, t) in tc_shapes() {
        let p = Prob::new(&mut rng, b, d, r, t, true, 0.6);
        let what = format!("3xTF32 B={b} D={d} R={r} T={t}");
        let want = run_all(&cpu, FK_DTYPE_F32, &p, 0, null());
        let got = run_all(&gpu, FK_DTYPE_F32, &p, FK_GEO_ALLOW_TF32X3, null());
        close_lf(&got, &want, tol_fwd(FK_DTYPE_F32), &what);
        let strict = run_all(&gpu, FK_DTYPE_F32, &p, 0, null());
        // (at T = 1 the permission is not used: the strict kernel is faster there)
        assert_eq!(
            r <= 32 && t >= 2,
            got.traj != strict.traj,
            "{what}: the 3xTF32 kernel ran where it applies, only there"
        );
        assert!(
            got.gamma == strict.gamma && got.chr == strict.chr,
            "{what}: the Christoffel ops changed"
        );
        assert!(
            got.lf_notraj == strict.lf_notraj,
            "{what}: the backward's recomputed forward changed"
        );
        let tf = run_all(&gpu, FK_DTYPE_F32, &p, FK_GEO_ALLOW_TF32, null());
        let both = run_all(
            &gpu,
            FK_DTYPE_F32,
            &p,
            FK_GEO_ALLOW_TF32 | FK_GEO_ALLOW_TF32X3,
            null(),
        );
        assert!(
            both.traj == tf.traj && both.v == tf.v,
            "{what}: with FK_GEO_ALLOW_TF32 too, not TF32's result"
        );
        let g64 = run_all(&gpu, FK_DTYPE_F64, &p, FK_GEO_ALLOW_TF32X3, null());
        let s64 = run_all(&gpu, FK_DTYPE_F64, &p, 0, null());
        assert!(
            g64.traj == s64.traj && g64.v == s64.v,
            "{what}: f64 changed"
        );
    }
}

/// The leapfrog backward where no fast kernel fits (R > 32): the cuBLAS route under
/// flags 0 and the generic kernel under `FK_GEO_FORCE_GENERIC`, against the CPU, with
/// and without the trajectory, every optional input (f, mu, gx, gv) and output (dx0,
/// dv0, df, dU, dW) on and off, odd B and D; the route's gradients bit-reproducible.
#[test]
fn cuda_leapfrog_backward_route_options() {
    let Some(gpu) = gpu() else { return };
    let cpu = Ctx::cpu();
    let mut rng = Rng::from_state(17);
    let (shapes, flag_sets, outputs): (&[(usize, usize, usize, usize)], &[u32], &[u32]) =
        if sanitizing() {
            // memcheck: the route only, every pointer combination once
            (&[(7, 33, 40, 2)], &[0], &[31, 1, 6, 24])
        } else {
            (
                &[(37, 65, 40, 3), (5, 33, 129, 2)],
                &[0, FK_GEO_FORCE_GENERIC],
                &[31, 1, 2, 4, 8, 16, 5, 24],
            )
        };
    // bits of the input sets: f, mu, gx, gv; of the output sets: dx0, dv0, df, dU, dW
    let inputs = [15u32, 0, 9, 6];
    for &(b, d, r, t) in shapes {
        let full = Prob::new(&mut rng, b, d, r, t, true, 0.6);
        for dt in [FK_DTYPE_F32, FK_DTYPE_F64] {
            for inp in inputs {
                let p = Prob {
                    f: full.f.clone().filter(|_| inp & 1 != 0),
                    mu: full.mu.clone().filter(|_| inp & 2 != 0),
                    gx: full.gx.clone().filter(|_| inp & 4 != 0),
                    gv: full.gv.clone().filter(|_| inp & 8 != 0),
                    ..full.clone()
                };
                let want = run_all(&cpu, dt, &p, 0, null());
                let i = upload(&gpu, dt, &p);
                let (bb, dd, rr) = (b as i64, d as i64, r as i64);
                let traj = Buf::from_reals(&gpu, dt, &[t as i64, 2, bb, dd], &want.traj);
                for &flags in flag_sets {
                    for with_traj in [true, false] {
                        let run = |set: u32| {
                            let o: Vec<Option<Buf>> = (0..5)
                                .map(|k| {
                                    let shape = if k < 3 { [bb, dd] } else { [dd, rr] };
                                    (set & (1 << k) != 0).then(|| Buf::poisoned(&gpu, dt, &shape))
                                })
                                .collect();
                            ok(unsafe {
                                fk_leapfrog_backward(
                                    i.v.raw(),
                                    raw_or_null(&i.f),
                                    i.u.raw(),
                                    i.w.raw(),
                                    raw_or_null(&i.mu),
                                    p.dt,
                                    t as i64,
                                    p.c,
                                    flags,
                                    if with_traj { traj.raw() } else { null_mut() },
                                    raw_or_null(&i.gx),
                                    raw_or_null(&i.gv),
                                    raw_or_null(&o[0]),
                                    raw_or_null(&o[1]),
                                    raw_or_null(&o[2]),
                                    raw_or_null(&o[3]),
                                    raw_or_null(&o[4]),
                                    null(),
                                )
                            });
                            o.iter()
                                .map(|o| o.as_ref().map(Buf::read_reals))
                                .collect::<Vec<_>>()
                        };
                        for &set in outputs {
                            for (k, got) in run(set).iter().enumerate() {
                                if let Some(got) = got {
                                    assert_close_reals(
                                        got,
                                        &want.lf[k],
                                        tol_bwd(dt),
                                        &format!(
                                            "leapfrog backward output {k} of {set:05b}: B={b} D={d} R={r} T={t} {} inputs {inp:04b} traj={with_traj} flags={flags}",
                                            if dt == FK_DTYPE_F32 { "f32" } else { "f64" }
                                        ),
                                    );
                                }
                            }
                        }
                        if flags == 0 {
                            let (a, a2) = (run(31), run(31));
                            let bits = |x: &Option<Vec<f64>>| {
                                x.as_ref()
                                    .unwrap()
                                    .iter()
                                    .map(|v| v.to_bits())
                                    .collect::<Vec<_>>()
                            };
                            assert!(
                                (1..5).all(|k| bits(&a[k]) == bits(&a2[k])),
                                "route gradients differ between runs (B={b} D={d} R={r} traj={with_traj})"
                            );
                        }
                    }
                }
            }
        }
    }
}
