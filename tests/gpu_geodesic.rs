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
mod geodesic_util;

use std::ptr::{null, null_mut};

use common::*;
use geodesic_util::*;

fn tol_fwd(d: fk_dtype) -> f64 {
    if d == FK_DTYPE_F32 { 2e-5 } else { 1e-11 }
}
fn tol_bwd(d: fk_dtype) -> f64 {
    if d == FK_DTYPE_F32 { 1e-4 } else { 1e-11 }
}

/// The CUDA context (`gpu()`: `None` skips), the CPU oracle and the test's
/// generator at `state`.
fn oracle(state: u64) -> Option<(Ctx, Ctx, Rng)> {
    let g = gpu()?;
    Some((g, Ctx::cpu(), Rng::from_state(state)))
}

// ------------------------------------------------------------------ runs

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

/// The four ops on `p` (`g`, `gx`, `gv` from it) with `flags` on `stream`: the
/// leapfrog backward from the forward's trajectory and without it.
fn run_all(ctx: &Ctx, dt: fk_dtype, p: &Prob, flags: u32, stream: *const fk_stream) -> Outs {
    let i = Inputs::new(ctx, dt, p);
    let gamma = i.gamma(flags, stream);
    let chr = i.chr_grads(flags, stream);
    let (x, v, traj) = i.leapfrog(flags, stream);
    let lf = i.lf_grads(traj.raw(), flags, stream);
    let lf_notraj = i.lf_grads(null(), flags, stream);
    Outs {
        gamma,
        chr,
        x,
        v,
        traj: traj.read_reals(),
        lf,
        lf_notraj,
    }
}

/// Zeroes `g` where the f64 |gamma_raw| is within `rel` of c (see the module doc).
fn guard_boundary(p: &mut Prob, rel: f64) {
    if !p.c.is_finite() {
        return;
    }
    for i in 0..p.b {
        let raw = ref_gamma_raw(p, &p.v, i);
        let g = p.g.as_mut().expect("a problem with g");
        for (k, raw) in raw.iter().enumerate() {
            if (raw.abs() - p.c).abs() <= rel * p.c.max(1e-30) + 1e-30 {
                g[i * p.d + k] = 0.0;
            }
        }
    }
}

fn compare(dt: fk_dtype, got: &Outs, want: &Outs, what: &str) {
    let (tf, tb) = (tol_fwd(dt), tol_bwd(dt));
    assert_close_reals(&got.gamma, &want.gamma, tf, &format!("gamma {what}"));
    check_grads(&got.chr, &want.chr, &CHR_GRADS, tb, |n| {
        format!("christoffel {n} {what}")
    });
    close_lf(got, want, tf, what);
    for (k, n) in LF_GRADS.iter().enumerate() {
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

/// x_T, v_T and the trajectory of `got` against `want` within `tol`.
fn close_lf(got: &Outs, want: &Outs, tol: f64, what: &str) {
    assert_close_reals(&got.x, &want.x, tol, &format!("x_T {what}"));
    assert_close_reals(&got.v, &want.v, tol, &format!("v_T {what}"));
    assert_close_reals(&got.traj, &want.traj, tol, &format!("traj {what}"));
}

#[rustfmt::skip]
fn shapes() -> Vec<(usize, usize, usize, usize)> {
    // (B, D, R, T)
    if sanitizing() {
        vec![
            (1, 1, 1, 1), (7, 33, 5, 2), (40, 70, 17, 2), (3, 130, 33, 1), (33, 20, 3, 3),
            (9, 256, 20, 2),    // the vector row layout (Cfg::VL) with 16-byte rows
            (2200, 300, 24, 2), // the leapfrog forward's register kernel (lf_fwd_rs), several tiles per block
            (4300, 8, 33, 1),   // the route's geo_sw with two tiles in some blocks
        ]
    } else {
        vec![
            (1, 1, 1, 1), (7, 33, 5, 2), (33, 100, 17, 3), (257, 512, 32, 2), (129, 300, 31, 1),
            (64, 1000, 8, 2), (17, 1030, 3, 2), (9, 64, 33, 2), (5, 40, 129, 2), (3001, 128, 16, 2),
            (6, 2100, 2, 1),
            (4500, 40, 33, 2),  // the route's geo_sw with two tiles in some blocks
            (4500, 300, 24, 3), // the leapfrog forward's register kernel (lf_fwd_rs), several tiles per block
        ]
    }
}

#[test]
fn cuda_matches_cpu_fast_and_generic() {
    let Some((gpu, cpu, mut rng)) = oracle(11) else {
        return;
    };
    let cases = [(true, 0.6), (false, f64::INFINITY)];
    sweep(&shapes(), &cases, |(b, d, r, t), dt, (opt, c)| {
        let mut p = Prob::scaled(&mut rng, b, d, r, t, opt, c);
        if dt == FK_DTYPE_F32 {
            guard_boundary(&mut p, 1e-4);
        }
        let want = run_all(&cpu, dt, &p, 0, null());
        for flags in [0, FK_GEO_FORCE_GENERIC] {
            let got = run_all(&gpu, dt, &p, flags, null());
            let what = format!(
                "B={b} D={d} R={r} T={t} {} f/mu={opt} c={c} flags={flags}",
                dname(dt)
            );
            compare(dt, &got, &want, &what);
        }
    });
}

#[test]
fn cuda_zero_rows_zero_gradients() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::from_state(12);
    let p = Prob::scaled(&mut rng, 0, 24, 5, 2, true, 0.5);
    for dt in REAL_DTYPES {
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
    let s = Stream::new(&gpu);
    let mut rng = Rng::from_state(13);
    let (b, d, r) = if sanitizing() {
        (40, 64, 8)
    } else {
        (2000, 512, 32)
    };
    let mut p = Prob::scaled(&mut rng, b, d, r, 2, true, 0.6);
    guard_boundary(&mut p, 1e-4);
    for dt in REAL_DTYPES {
        let a = run_all(&gpu, dt, &p, 0, s.raw());
        let b2 = run_all(&gpu, dt, &p, 0, s.raw());
        assert!(
            same_bits(&a.chr[1], &b2.chr[1]) && same_bits(&a.chr[2], &b2.chr[2]),
            "christoffel dU/dW differ between runs"
        );
        assert!(
            same_bits(&a.lf[3], &b2.lf[3]) && same_bits(&a.lf[4], &b2.lf[4]),
            "leapfrog dU/dW differ between runs"
        );
        assert!(same_bits(&a.gamma, &b2.gamma) && same_bits(&a.v, &b2.v));
    }
}

#[test]
fn cuda_misaligned_rows_and_in_place() {
    let Some((gpu, cpu, mut rng)) = oracle(14) else {
        return;
    };
    // R = 12: the fast kernels; R = 40: the cuBLAS route; D = 300, R = 24: the leapfrog
    // forward's register kernel's fallback (lf_fwd_rs needs 16-byte rows)
    for (b, d, r) in [(37usize, 64usize, 12usize), (37, 64, 40), (37, 300, 24)] {
        let p = Prob::scaled(&mut rng, b, d, r, 1, false, 0.6);
        for dt in REAL_DTYPES {
            let want = run_all(&cpu, dt, &p, 0, null());
            // v one element into a larger buffer: rows no longer 16-byte aligned
            let storage: Vec<Cx> = std::iter::once(0.0)
                .chain(p.v.iter().copied())
                .map(re)
                .collect();
            let view = View::misaligned(&[b as i64, d as i64]);
            let v = Placed::new(&gpu, dt, &view, &encode(dt, &storage));
            let i = Inputs::new(&gpu, dt, &p);
            let out = i.poisoned(&[b as i64, d as i64]);
            ok(ChrFwd {
                v: v.handle(),
                ..i.chr_fwd(out.raw())
            }
            .call());
            assert_close_reals(
                &out.read_reals(),
                &want.gamma,
                tol_fwd(dt),
                "gamma, misaligned v",
            );
            // in place: gamma over v
            ok(i.chr_fwd(i.v.raw()).call());
            assert_close_reals(
                &i.v.read_reals(),
                &want.gamma,
                tol_fwd(dt),
                "gamma in place",
            );
            // leapfrog in place: x_out = x0, v_out = v0
            let i = Inputs::new(&gpu, dt, &p);
            ok(i.lf_fwd([i.x.raw(), i.v.raw(), null_mut()]).call());
            assert_close_reals(&i.x.read_reals(), &want.x, tol_fwd(dt), "x in place");
            assert_close_reals(&i.v.read_reals(), &want.v, tol_fwd(dt), "v in place");
        }
    }
}

#[test]
fn cuda_backward_optional_outputs() {
    let Some((gpu, cpu, mut rng)) = oracle(15) else {
        return;
    };
    let mut p = Prob::scaled(&mut rng, 50, 96, 8, 3, true, 0.6);
    guard_boundary(&mut p, 1e-4);
    let dt = FK_DTYPE_F64;
    let want = run_all(&cpu, dt, &p, 0, null());
    for flags in [0, FK_GEO_FORCE_GENERIC] {
        let i = Inputs::new(&gpu, dt, &p);
        // each output alone
        for k in 0..3 {
            let got = i.chr_grads_of(1 << k, flags, null());
            assert_close_reals(
                got[k].as_ref().unwrap(),
                &want.chr[k],
                1e-11,
                &format!("christoffel output {k} alone"),
            );
        }
        for k in 0..5 {
            let got = i.lf_grads_of(null(), 1 << k, flags, null());
            assert_close_reals(
                got[k].as_ref().unwrap(),
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
#[rustfmt::skip]
fn tc_shapes() -> Vec<(usize, usize, usize, usize)> {
    if sanitizing() {
        // (2200, 64, 32, 2): more tiles than SMs, so that blocks run several tiles (the
        // TF32 leapfrog's v stage and x, f stash across tiles)
        vec![(7, 33, 5, 2), (40, 64, 32, 1), (2200, 64, 32, 2)]
    } else {
        vec![
            (7, 33, 5, 2), (257, 512, 32, 2), (129, 300, 31, 8), (50, 100, 16, 1), (4501, 200, 24, 3),
            // R > 32: the GEMM route (TF32 products in the Christoffel forward's)
            (60, 200, 40, 1),
        ]
    }
}

/// The runs of a tensor-core test on one problem: the CPU's f32 (the oracle), the
/// GPU's f32 with the test's flags (`got`) and with 0 (`strict`), its f64 with the
/// flags and with 0.
struct TcRuns {
    want: Outs,
    got: Outs,
    strict: Outs,
    g64: Outs,
    s64: Outs,
}

/// The tensor-core tests' loop: for every shape of `tc_shapes()` a problem (f, mu,
/// c = 0.6) drawn from the generator at `state`, run as `TcRuns` with `flags`, handed
/// to `body` with its label, the shape, the problem and the CUDA context.
fn each_tc_run(
    state: u64,
    label: &str,
    flags: u32,
    mut body: impl FnMut(&str, (usize, usize, usize, usize), &Prob, &TcRuns, &Ctx),
) {
    let Some((gpu, cpu, mut rng)) = oracle(state) else {
        return;
    };
    for (b, d, r, t) in tc_shapes() {
        let p = Prob::scaled(&mut rng, b, d, r, t, true, 0.6);
        let run = |ctx: &Ctx, dt: fk_dtype, flags: u32| run_all(ctx, dt, &p, flags, null());
        let o = TcRuns {
            want: run(&cpu, FK_DTYPE_F32, 0),
            got: run(&gpu, FK_DTYPE_F32, flags),
            strict: run(&gpu, FK_DTYPE_F32, 0),
            g64: run(&gpu, FK_DTYPE_F64, flags),
            s64: run(&gpu, FK_DTYPE_F64, 0),
        };
        let what = format!("{label} B={b} D={d} R={r} T={t}");
        body(&what, (b, d, r, t), &p, &o, &gpu);
    }
}

/// Asserts each check of `checks` (the flags left a result bit for bit as flags 0
/// gives it), naming the result.
#[track_caller]
fn assert_unchanged<const N: usize>(what: &str, checks: [(&str, bool); N]) {
    for (name, same) in checks {
        assert!(same, "{what}: {name} changed");
    }
}

#[test]
fn cuda_tf32_forwards() {
    each_tc_run(16, "TF32", FK_GEO_ALLOW_TF32, |what, _, _, o, _| {
        assert_close_reals(&o.got.gamma, &o.want.gamma, 5e-3, &format!("gamma {what}"));
        close_lf(&o.got, &o.want, 5e-3, what);
        // the backwards ignore the flag (bit-identical to strict runs); f64 too
        assert_unchanged(
            what,
            [
                ("the Christoffel backward", o.got.chr == o.strict.chr),
                (
                    "the leapfrog backward (recompute)",
                    o.got.lf_notraj == o.strict.lf_notraj,
                ),
                ("f64", o.g64.gamma == o.s64.gamma && o.g64.v == o.s64.v),
            ],
        );
    });
}

/// `FK_GEO_ALLOW_TF32X3`: the leapfrog forward's 3xTF32 kernel against the CPU at the
/// strict f32 tolerance (TF32's error is ~100x over it) and different from the FFMA
/// kernel's bits where a fast kernel applies and T >= 2 (so the 3xTF32 kernel ran); the
/// Christoffel ops, the leapfrog backward's recomputed forward, f64 and the route
/// (R > 32) bit-identical to flags 0; with `FK_GEO_ALLOW_TF32` too, TF32's bits.
#[test]
fn cuda_tf32x3_leapfrog() {
    each_tc_run(
        18,
        "3xTF32",
        FK_GEO_ALLOW_TF32X3,
        |what, (_, _, r, t), p, o, gpu| {
            close_lf(&o.got, &o.want, tol_fwd(FK_DTYPE_F32), what);
            // (at T = 1 the permission is not used: the strict kernel is faster there)
            assert_eq!(
                r <= 32 && t >= 2,
                o.got.traj != o.strict.traj,
                "{what}: the 3xTF32 kernel ran where it applies, only there"
            );
            assert_unchanged(
                what,
                [
                    (
                        "the Christoffel ops",
                        o.got.gamma == o.strict.gamma && o.got.chr == o.strict.chr,
                    ),
                    (
                        "the backward's recomputed forward",
                        o.got.lf_notraj == o.strict.lf_notraj,
                    ),
                    ("f64", o.g64.traj == o.s64.traj && o.g64.v == o.s64.v),
                ],
            );
            let tf = run_all(gpu, FK_DTYPE_F32, p, FK_GEO_ALLOW_TF32, null());
            let both_flags = FK_GEO_ALLOW_TF32 | FK_GEO_ALLOW_TF32X3;
            let both = run_all(gpu, FK_DTYPE_F32, p, both_flags, null());
            assert!(
                both.traj == tf.traj && both.v == tf.v,
                "{what}: with FK_GEO_ALLOW_TF32 too, not TF32's result"
            );
        },
    );
}

/// The leapfrog backward where no fast kernel fits (R > 32): the cuBLAS route under
/// flags 0 and the generic kernel under `FK_GEO_FORCE_GENERIC`, against the CPU, with
/// and without the trajectory, every optional input (f, mu, gx, gv) and output (dx0,
/// dv0, df, dU, dW) on and off, odd B and D; the route's gradients bit-reproducible.
#[test]
fn cuda_leapfrog_backward_route_options() {
    let Some((gpu, cpu, mut rng)) = oracle(17) else {
        return;
    };
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
        let full = Prob::scaled(&mut rng, b, d, r, t, true, 0.6);
        for dt in REAL_DTYPES {
            for inp in inputs {
                let p = Prob {
                    f: full.f.clone().filter(|_| inp & 1 != 0),
                    mu: full.mu.clone().filter(|_| inp & 2 != 0),
                    gx: full.gx.clone().filter(|_| inp & 4 != 0),
                    gv: full.gv.clone().filter(|_| inp & 8 != 0),
                    ..full.clone()
                };
                let want = run_all(&cpu, dt, &p, 0, null());
                let i = Inputs::new(&gpu, dt, &p);
                let traj =
                    Buf::from_reals(&gpu, dt, &[t as i64, 2, b as i64, d as i64], &want.traj);
                for &flags in flag_sets {
                    for with_traj in [true, false] {
                        let tr = if with_traj { traj.raw() } else { null_mut() };
                        let run = |set: u32| i.lf_grads_of(tr, set, flags, null());
                        for &set in outputs {
                            for (k, got) in run(set).iter().enumerate() {
                                if let Some(got) = got {
                                    assert_close_reals(
                                        got,
                                        &want.lf[k],
                                        tol_bwd(dt),
                                        &format!(
                                            "leapfrog backward output {k} of {set:05b}: B={b} D={d} R={r} T={t} {} inputs {inp:04b} traj={with_traj} flags={flags}",
                                            dname(dt)
                                        ),
                                    );
                                }
                            }
                        }
                        if flags == 0 {
                            let (a, a2) = (run(31), run(31));
                            let same = |k: usize| {
                                same_bits(a[k].as_ref().unwrap(), a2[k].as_ref().unwrap())
                            };
                            assert!(
                                (1..5).all(same),
                                "route gradients differ between runs (B={b} D={d} R={r} traj={with_traj})"
                            );
                        }
                    }
                }
            }
        }
    }
}
