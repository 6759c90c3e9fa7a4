//! The optimizer-math family (docs/ops.md section 4) on the CPU backend, through the C
//! ABI: matrix powers (eigendecomposition and Newton) against an independent f64
//! Jacobi reference, `A^p A^-p = I`, ill-conditioned, rank-deficient and indefinite
//! inputs, Newton's convergence report and its non-convergence status; Shampoo
//! statistics and preconditioning; per-sample gradients, their norms against the
//! materialised norms and the DP-SGD clipped sum; every bad-input status with its
//! message.

mod common;
mod optim_ref;

use std::ptr::{null, null_mut};

use common::*;
use optim_ref::*;

const REAL: [fk_dtype; 2] = [FK_DTYPE_F32, FK_DTYPE_F64];

fn tol_of(dt: fk_dtype) -> f64 {
    if dt == FK_DTYPE_F64 { 1e-10 } else { 2e-4 }
}

#[test]
fn eigh_power_matches_the_jacobi_reference() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(1);
    for dt in REAL {
        for &n in &[1usize, 2, 5, 17, 40] {
            for &batch in &[1usize, 3] {
                let mats: Vec<f64> = (0..batch).flat_map(|_| spd(&mut rng, n)).collect();
                for &power in &[-0.25, -0.5, 0.5, 1.0, 2.0, -1.0, 1.0 / 3.0] {
                    let eps = 1e-3;
                    let (s, out, rep) = run_power(&ctx, dt, &mats, batch, n, Pow::eigh(power, eps));
                    ok(s);
                    let mut want = Vec::new();
                    let mut lmin = f64::INFINITY;
                    for b in 0..batch {
                        let (w, l) = power_ref(&mats[b * n * n..(b + 1) * n * n], n, power, eps);
                        want.extend(w);
                        lmin = lmin.min(l);
                    }
                    close(
                        &out,
                        &want,
                        tol_of(dt),
                        &format!("eigh {} n={n} batch={batch} power={power}", dname(dt)),
                    );
                    assert_eq!(
                        (rep.method, rep.iterations, rep.converged),
                        (FK_MATPOW_EIGH, 0, 1)
                    );
                    assert!(rep.residual.is_nan());
                    assert!(
                        (rep.min_eigenvalue - lmin).abs() <= 1e-4 * lmin.abs().max(1.0),
                        "{} vs {lmin}",
                        rep.min_eigenvalue
                    );
                }
            }
        }
    }
}

#[test]
fn a_to_the_p_times_a_to_the_minus_p_is_identity() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(2);
    let n = 24;
    let a = spd(&mut rng, n);
    for &p in &[0.25, 0.5, 1.0, 1.7] {
        let (s1, pos, _) = run_power(&ctx, FK_DTYPE_F64, &a, 1, n, Pow::eigh(p, 0.0));
        let (s2, neg, _) = run_power(&ctx, FK_DTYPE_F64, &a, 1, n, Pow::eigh(-p, 0.0));
        ok(s1);
        ok(s2);
        let prod = matmul(&pos, &neg, n, n, n);
        let eye: Vec<f64> = (0..n * n)
            .map(|i| if i % (n + 1) == 0 { 1.0 } else { 0.0 })
            .collect();
        close(&prod, &eye, 1e-11, &format!("A^{p} A^-{p}"));
    }
}

#[test]
fn ill_conditioned_rank_deficient_and_indefinite_inputs() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(3);
    let n = 12;
    // condition number 1e8
    let spec: Vec<f64> = (0..n)
        .map(|i| 10f64.powf(-8.0 * i as f64 / (n - 1) as f64))
        .collect();
    let ill = spd_with(&mut rng, &spec);
    // rank n/2, exactly PSD
    let spec: Vec<f64> = (0..n)
        .map(|i| if i < n / 2 { 1.0 + i as f64 } else { 0.0 })
        .collect();
    let deficient = spd_with(&mut rng, &spec);
    // indefinite: the smallest eigenvalue is -0.5, so the spectrum is shifted
    let spec: Vec<f64> = (0..n)
        .map(|i| if i == 0 { -0.5 } else { i as f64 })
        .collect();
    let indefinite = spd_with(&mut rng, &spec);
    for (name, m, eps) in [
        ("ill", &ill, 1e-10),
        ("rank-deficient", &deficient, 1e-4),
        ("indefinite", &indefinite, 1e-3),
    ] {
        let (s, out, rep) = run_power(&ctx, FK_DTYPE_F64, m, 1, n, Pow::eigh(-0.25, eps));
        ok(s);
        let (want, lmin) = power_ref(m, n, -0.25, eps);
        close(&out, &want, 1e-7, name);
        assert!(
            (rep.min_eigenvalue - lmin).abs() < 1e-8,
            "{name}: {} vs {lmin}",
            rep.min_eigenvalue
        );
        assert!(out.iter().all(|x| x.is_finite()), "{name}");
    }
    // the shift happened: lambda_min + eps < eps
    let pw = Pow::eigh(-0.25, 1e-3);
    let (_, _, rep) = run_power(&ctx, FK_DTYPE_F64, &indefinite, 1, n, pw);
    assert!(rep.min_eigenvalue < 0.0);
}

#[test]
fn newton_matches_the_reference_for_several_roots() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(4);
    for dt in REAL {
        let tol = if dt == FK_DTYPE_F64 { 1e-12 } else { 1e-5 };
        for &n in &[1usize, 3, 16, 33] {
            let batch = 2;
            let mats: Vec<f64> = (0..batch).flat_map(|_| spd(&mut rng, n)).collect();
            for &p in &[1u32, 2, 3, 4, 8] {
                let power = -1.0 / p as f64;
                // the TF32 flag takes the re-coupling path (strict on the CPU)
                let flags = if p == 4 { FK_GEMM_ALLOW_TF32 } else { 0 };
                let pw = Pow::newton(power, 1e-6, 100, tol).flags(flags);
                let (s, out, rep) = run_power(&ctx, dt, &mats, batch, n, pw);
                let what = format!("newton {} n={n} p={p}", dname(dt));
                assert!(
                    s == FK_OK,
                    "{what}: {} {} ({rep:?})",
                    status_name(s),
                    last_error()
                );
                let want: Vec<f64> = (0..batch)
                    .flat_map(|b| power_ref(&mats[b * n * n..(b + 1) * n * n], n, power, 1e-6).0)
                    .collect();
                close(
                    &out,
                    &want,
                    if dt == FK_DTYPE_F64 { 1e-9 } else { 1e-4 },
                    &what,
                );
                assert_eq!((rep.method, rep.converged), (FK_MATPOW_NEWTON, 1), "{what}");
                assert!(
                    rep.iterations >= 1 && rep.iterations <= 100,
                    "{what}: {rep:?}"
                );
                assert!(rep.residual <= tol, "{what}: {rep:?}");
                assert!(rep.min_eigenvalue.is_nan());
            }
        }
    }
}

#[test]
fn newton_reports_non_convergence_and_unchecked_runs() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(5);
    let n = 10;
    let a = spd(&mut rng, n);
    // two iterations cannot reach 1e-12
    let pw = Pow::newton(-0.5, 0.0, 2, 1e-12);
    let (s, out, rep) = run_power(&ctx, FK_DTYPE_F64, &a, 1, n, pw);
    expect_status(
        s,
        FK_ERROR_NOT_CONVERGED,
        &["fk_matrix_power", "did not converge", "residual"],
    );
    assert_eq!(
        (rep.method, rep.iterations, rep.converged),
        (FK_MATPOW_NEWTON, 2, 0)
    );
    assert!(rep.residual > 1e-12 && rep.residual.is_finite());
    assert!(
        out.iter().all(|x| x.is_finite()),
        "the last iterate is written"
    );
    // tol <= 0: exactly max_iter iterations, unchecked; in f32 with the TF32 flag too
    // (strict on the CPU)
    for (dt, flags, err, what) in [
        (FK_DTYPE_F64, 0, 1e-10, "unchecked Newton"),
        (
            FK_DTYPE_F32,
            FK_GEMM_ALLOW_TF32,
            1e-5,
            "unchecked Newton, TF32 flag (strict on the CPU)",
        ),
    ] {
        let pw = Pow::newton(-0.5, 0.0, 40, 0.0).flags(flags);
        let (s, out, rep) = run_power(&ctx, dt, &a, 1, n, pw);
        ok(s);
        assert_eq!((rep.iterations, rep.converged), (40, 1));
        assert!(rep.residual.is_nan());
        close(&out, &power_ref(&a, n, -0.5, 0.0).0, err, what);
    }
    // auto on the CPU is the eigendecomposition; on a non-root power too
    for power in [-0.25, 0.3] {
        let pw = Pow::auto(power, 1e-8, 100, 1e-10);
        let (s, out, rep) = run_power(&ctx, FK_DTYPE_F64, &a, 1, n, pw);
        ok(s);
        assert_eq!(rep.method, FK_MATPOW_EIGH);
        close(&out, &power_ref(&a, n, power, 1e-8).0, 1e-10, "auto");
    }
}

#[test]
fn empty_batch_and_report_optional() {
    let ctx = Ctx::cpu();
    let a = Buf::new(&ctx, FK_DTYPE_F32, &[0, 4, 4]);
    let o = Buf::new(&ctx, FK_DTYPE_F32, &[0, 4, 4]);
    let pw = Pow::auto(-0.5, 0.0, 10, 1e-6);
    ok(unsafe { pw.call(a.raw(), o.raw(), null_mut(), null()) });
    let a = Buf::from_vals(&ctx, FK_DTYPE_F64, &[2, 2], &reals(&[2.0, 0.0, 0.0, 8.0]));
    let o = Buf::new(&ctx, FK_DTYPE_F64, &[2, 2]);
    let pw = Pow::newton(-1.0 / 3.0, 0.0, 100, 1e-13);
    ok(unsafe { pw.call(a.raw(), o.raw(), null_mut(), null()) });
    close(
        &re_of(&o.read()),
        &[2f64.powf(-1.0 / 3.0), 0.0, 0.0, 0.5],
        1e-12,
        "diag cube root",
    );
}

// ------------------------------------------------------------------ Shampoo

fn stats_ref(
    g: &[f64],
    m: usize,
    n: usize,
    l0: &[f64],
    r0: &[f64],
    alpha: f64,
    beta: f64,
) -> (Vec<f64>, Vec<f64>) {
    let gt = transpose(g, m, n);
    let ggt = matmul(g, &gt, m, n, m);
    let gtg = matmul(&gt, g, n, m, n);
    let l = (0..m * m).map(|i| beta * l0[i] + alpha * ggt[i]).collect();
    let r = (0..n * n).map(|i| beta * r0[i] + alpha * gtg[i]).collect();
    (l, r)
}

#[test]
fn shampoo_stats_accumulate_and_decay() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(6);
    for dt in REAL {
        for &(batch, m, n) in &[(1usize, 5usize, 3usize), (3, 8, 13), (1, 1, 1), (2, 17, 4)] {
            let sp = Shampoo::random(&mut rng, batch, m, n);
            let (g, l0, r0) = (&sp.g, &sp.l0, &sp.r0);
            let sh = |a: usize, b: usize| sp.shape(a, b);
            // fk_shampoo_stats, then fk_shampoo_stats_ex without and with TF32 (which
            // the CPU ignores): the same strict results
            for (&(alpha, beta), flags) in [(1.0, 1.0), (0.1, 0.9), (2.0, 0.0)]
                .iter()
                .flat_map(|ab| [(ab, None), (ab, Some(0)), (ab, Some(FK_GEMM_ALLOW_TF32))])
            {
                let gb = Buf::from_vals(&ctx, dt, &sh(m, n), &reals(&g));
                let lb = Buf::from_vals(&ctx, dt, &sh(m, m), &reals(&l0));
                let rb = Buf::from_vals(&ctx, dt, &sh(n, n), &reals(&r0));
                if beta == 0.0 {
                    lb.write(&vec![re(f64::NAN); l0.len()]);
                    rb.write(&vec![re(f64::NAN); r0.len()]);
                }
                ok(unsafe {
                    match flags {
                        None => fk_shampoo_stats(gb.raw(), alpha, beta, lb.raw(), rb.raw(), null()),
                        Some(f) => fk_shampoo_stats_ex(
                            gb.raw(),
                            alpha,
                            beta,
                            lb.raw(),
                            rb.raw(),
                            f,
                            null(),
                        ),
                    }
                });
                let (lo, ro) = (re_of(&lb.read()), re_of(&rb.read()));
                let mut wl = Vec::new();
                let mut wr = Vec::new();
                for b in 0..batch {
                    let (l, r) = stats_ref(
                        &g[b * m * n..(b + 1) * m * n],
                        m,
                        n,
                        &l0[b * m * m..(b + 1) * m * m],
                        &r0[b * n * n..(b + 1) * n * n],
                        alpha,
                        beta,
                    );
                    wl.extend(l);
                    wr.extend(r);
                }
                let what = format!(
                    "stats {} {batch}x{m}x{n} alpha={alpha} beta={beta} flags={flags:?}",
                    dname(dt)
                );
                close(&lo, &wl, tol_of(dt), &format!("{what} L"));
                close(&ro, &wr, tol_of(dt), &format!("{what} R"));
                for (mat, k) in [(&lo, m), (&ro, n)] {
                    assert_symmetric(mat, batch, k, &format!("{what}: exactly symmetric"));
                }
            }
            // one side only
            let gb = Buf::from_vals(&ctx, dt, &sh(m, n), &reals(&g));
            let rb = Buf::from_vals(&ctx, dt, &sh(n, n), &reals(&r0));
            ok(unsafe { fk_shampoo_stats(gb.raw(), 1.0, 1.0, null_buf(), rb.raw(), null()) });
            let wr: Vec<f64> = (0..batch)
                .flat_map(|b| {
                    stats_ref(
                        &g[b * m * n..(b + 1) * m * n],
                        m,
                        n,
                        &vec![0.0; m * m],
                        &r0[b * n * n..(b + 1) * n * n],
                        1.0,
                        1.0,
                    )
                    .1
                })
                .collect();
            close(&re_of(&rb.read()), &wr, tol_of(dt), "R only");
        }
    }
}

#[test]
fn shampoo_precondition_with_either_root() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(7);
    for dt in REAL {
        let (batch, m, n) = (3usize, 6usize, 9usize);
        let g: Vec<f64> = (0..batch * m * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let l = spd(&mut rng, m);
        let r: Vec<f64> = (0..batch).flat_map(|_| spd(&mut rng, n)).collect();
        let gb = Buf::from_vals(&ctx, dt, &[batch as i64, m as i64, n as i64], &reals(&g));
        let lb = Buf::from_vals(&ctx, dt, &[m as i64, m as i64], &reals(&l)); // batch 1: shared
        let rb = Buf::from_vals(&ctx, dt, &[batch as i64, n as i64, n as i64], &reals(&r));
        for (lp, rp) in [(true, true), (true, false), (false, true), (false, false)] {
            let out = Buf::from_vals(
                &ctx,
                dt,
                &[batch as i64, m as i64, n as i64],
                &vec![re(f64::NAN); g.len()],
            );
            ok(unsafe {
                fk_shampoo_precondition(
                    if lp { lb.raw() } else { null_buf() },
                    gb.raw(),
                    if rp { rb.raw() } else { null_buf() },
                    out.raw(),
                    0,
                    null(),
                )
            });
            let mut want = Vec::new();
            for b in 0..batch {
                let mut x = g[b * m * n..(b + 1) * m * n].to_vec();
                if lp {
                    x = matmul(&l, &x, m, m, n);
                }
                if rp {
                    x = matmul(&x, &r[b * n * n..(b + 1) * n * n], m, n, n);
                }
                want.extend(x);
            }
            close(
                &re_of(&out.read()),
                &want,
                tol_of(dt),
                &format!("precondition {} l={lp} r={rp}", dname(dt)),
            );
        }
    }
}

// ------------------------------------------------------------------ per-sample gradients

struct Sample {
    b: usize,
    t: Option<usize>,
    din: usize,
    dout: usize,
}

impl Sample {
    fn steps(&self) -> usize {
        self.t.unwrap_or(1)
    }
    fn shape(&self, last: usize) -> Vec<i64> {
        match self.t {
            None => vec![self.b as i64, last as i64],
            Some(t) => vec![self.b as i64, t as i64, last as i64],
        }
    }
}

#[test]
fn per_sample_grads_norms_and_clipped_sum() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(8);
    for dt in REAL {
        for s in [
            Sample {
                b: 5,
                t: None,
                din: 7,
                dout: 3,
            },
            Sample {
                b: 4,
                t: Some(6),
                din: 5,
                dout: 9,
            },
            Sample {
                b: 1,
                t: Some(1),
                din: 1,
                dout: 1,
            },
            Sample {
                b: 9,
                t: None,
                din: 16,
                dout: 8,
            },
        ] {
            let t = s.steps();
            let mut a: Vec<f64> = (0..s.b * t * s.din)
                .map(|_| rng.uniform(-1.0, 1.0))
                .collect();
            let g: Vec<f64> = (0..s.b * t * s.dout)
                .map(|_| rng.uniform(-1.0, 1.0))
                .collect();
            if s.b > 2 {
                // a zero sample: norm 0, factor 1
                for x in &mut a[0..t * s.din] {
                    *x = 0.0;
                }
            }
            let what = format!(
                "{} B={} T={:?} in={} out={}",
                dname(dt),
                s.b,
                s.t,
                s.din,
                s.dout
            );
            let ab = Buf::from_vals(&ctx, dt, &s.shape(s.din), &reals(&a));
            let gb = Buf::from_vals(&ctx, dt, &s.shape(s.dout), &reals(&g));
            let grads = per_sample_ref(&a, &g, s.b, t, s.din, s.dout);
            let per = s.din * s.dout;
            // materialised
            let ob = Buf::from_vals(
                &ctx,
                dt,
                &[s.b as i64, s.dout as i64, s.din as i64],
                &vec![re(f64::NAN); grads.len()],
            );
            ok(unsafe { fk_per_sample_grads(ab.raw(), gb.raw(), ob.raw(), 0, null()) });
            close(
                &re_of(&ob.read()),
                &grads,
                tol_of(dt),
                &format!("grads {what}"),
            );
            // norms without materialising = norms of the materialised gradients
            let nb = Buf::from_vals(&ctx, dt, &[s.b as i64], &vec![re(f64::NAN); s.b]);
            ok(unsafe { fk_per_sample_grad_norms(ab.raw(), gb.raw(), nb.raw(), null()) });
            let norms = sq_norms_ref(&grads, s.b, per);
            close(
                &re_of(&nb.read()),
                &norms,
                tol_of(dt),
                &format!("norms {what}"),
            );
            // clipped sum, at a bound that clips some samples and not others
            let mut sorted: Vec<f64> = norms.iter().map(|x| x.sqrt()).collect();
            sorted.sort_by(f64::total_cmp);
            for c in [sorted[sorted.len() / 2], 0.0, 1e9] {
                let out = Buf::from_vals(
                    &ctx,
                    dt,
                    &[s.dout as i64, s.din as i64],
                    &vec![re(f64::NAN); per],
                );
                let nb2 = Buf::from_vals(&ctx, dt, &[s.b as i64], &vec![re(f64::NAN); s.b]);
                ok(unsafe {
                    fk_dp_clipped_grad_sum(ab.raw(), gb.raw(), c, out.raw(), nb2.raw(), 0, null())
                });
                let want = clipped_sum_ref(&grads, s.b, per, c);
                if c == 0.0 {
                    assert!(
                        re_of(&out.read()).iter().all(|&x| x == 0.0),
                        "C = 0 gives 0 ({what})"
                    );
                } else {
                    close(
                        &re_of(&out.read()),
                        &want,
                        tol_of(dt),
                        &format!("clipped C={c} {what}"),
                    );
                }
                close(
                    &re_of(&nb2.read()),
                    &norms,
                    tol_of(dt),
                    &format!("clipped norms {what}"),
                );
            }
            // sq_norms optional
            let out = Buf::new(&ctx, dt, &[s.dout as i64, s.din as i64]);
            ok(unsafe {
                fk_dp_clipped_grad_sum(ab.raw(), gb.raw(), 1.0, out.raw(), null_buf(), 0, null())
            });
            close(
                &re_of(&out.read()),
                &clipped_sum_ref(&grads, s.b, per, 1.0),
                tol_of(dt),
                &format!("clipped no norms {what}"),
            );
        }
    }
}

// ------------------------------------------------------------------ bad inputs

#[test]
fn matrix_power_bad_inputs() {
    let ctx = Ctx::cpu();
    let a = Buf::from_vals(
        &ctx,
        FK_DTYPE_F32,
        &[3, 3],
        &reals(&[2.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 2.0]),
    );
    let o = Buf::new(&ctx, FK_DTYPE_F32, &[3, 3]);
    let call = |a: *mut fk_buffer,
                p: f64,
                e: f64,
                m: i32,
                it: i32,
                tol: f64,
                fl: u32,
                o: *mut fk_buffer| unsafe {
        fk_matrix_power(a, p, e, m, it, tol, fl, o, std::ptr::null_mut(), null())
    };
    expect_status(
        call(null_buf(), -0.5, 0.0, 0, 10, 1e-6, 0, o.raw()),
        FK_ERROR_NULL_POINTER,
        &["fk_matrix_power", "a"],
    );
    expect_status(
        call(a.raw(), -0.5, 0.0, 0, 10, 1e-6, 0, null_buf()),
        FK_ERROR_NULL_POINTER,
        &["out"],
    );
    expect_status(
        call(a.raw(), -0.5, 0.0, 7, 10, 1e-6, 0, o.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["method = 7"],
    );
    expect_status(
        call(a.raw(), -0.5, 0.0, 0, 10, 1e-6, 4, o.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["flags"],
    );
    expect_status(
        call(a.raw(), f64::NAN, 0.0, 0, 10, 1e-6, 0, o.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["power"],
    );
    expect_status(
        call(a.raw(), -0.5, -1.0, 0, 10, 1e-6, 0, o.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["eps"],
    );
    expect_status(
        call(a.raw(), -0.5, f64::INFINITY, 0, 10, 1e-6, 0, o.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["eps"],
    );
    expect_status(
        call(a.raw(), -0.5, 0.0, 2, 0, 1e-6, 0, o.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["max_iter"],
    );
    expect_status(
        call(a.raw(), -0.5, 0.0, 2, 10, f64::NAN, 0, o.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["tol"],
    );
    expect_status(
        call(a.raw(), 0.3, 0.0, 2, 10, 1e-6, 0, o.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["inverse roots"],
    );
    expect_status(
        call(a.raw(), -0.5, 0.0, 0, 10, 1e-6, 0, a.raw()),
        FK_ERROR_ALIASING,
        &["out overlaps a"],
    );
    let rect = Buf::new(&ctx, FK_DTYPE_F32, &[3, 4]);
    expect_status(
        call(rect.raw(), -0.5, 0.0, 0, 10, 1e-6, 0, rect.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["square"],
    );
    let o4 = Buf::new(&ctx, FK_DTYPE_F32, &[4, 4]);
    expect_status(
        call(a.raw(), -0.5, 0.0, 0, 10, 1e-6, 0, o4.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["out has shape [4, 4]"],
    );
    let od = Buf::new(&ctx, FK_DTYPE_F64, &[3, 3]);
    expect_status(
        call(a.raw(), -0.5, 0.0, 0, 10, 1e-6, 0, od.raw()),
        FK_ERROR_DTYPE_MISMATCH,
        &["out has dtype f64"],
    );
    let h = Buf::new(&ctx, FK_DTYPE_F16, &[3, 3]);
    let h2 = Buf::new(&ctx, FK_DTYPE_F16, &[3, 3]);
    expect_status(
        call(h.raw(), -0.5, 0.0, 0, 10, 1e-6, 0, h2.raw()),
        FK_ERROR_UNSUPPORTED_DTYPE,
        &["a has dtype f16"],
    );
    let v1 = Buf::new(&ctx, FK_DTYPE_F32, &[3]);
    expect_status(
        call(v1.raw(), -0.5, 0.0, 0, 10, 1e-6, 0, o.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["a has shape [3]"],
    );
    // a transposed (non-contiguous) view
    let store = Buf::new(&ctx, FK_DTYPE_F32, &[9]);
    let t = unsafe { Buf::wrap(&ctx, store.data(), FK_DTYPE_F32, &[3, 3], Some(&[1, 3])) };
    expect_status(
        call(t.raw(), -0.5, 0.0, 0, 10, 1e-6, 0, o.raw()),
        FK_ERROR_UNSUPPORTED,
        &["not contiguous"],
    );
}

#[test]
fn shampoo_and_per_sample_bad_inputs() {
    let ctx = Ctx::cpu();
    let g = Buf::new(&ctx, FK_DTYPE_F32, &[4, 3]);
    let l = Buf::new(&ctx, FK_DTYPE_F32, &[4, 4]);
    let r = Buf::new(&ctx, FK_DTYPE_F32, &[3, 3]);
    let st = |g: *mut fk_buffer, a: f64, b: f64, l: *mut fk_buffer, r: *mut fk_buffer| unsafe {
        fk_shampoo_stats(g, a, b, l, r, null())
    };
    expect_status(
        st(null_buf(), 1.0, 1.0, l.raw(), r.raw()),
        FK_ERROR_NULL_POINTER,
        &["fk_shampoo_stats", "grad"],
    );
    expect_status(
        st(g.raw(), 1.0, 1.0, null_buf(), null_buf()),
        FK_ERROR_NULL_POINTER,
        &["both NULL"],
    );
    expect_status(
        st(g.raw(), f64::NAN, 1.0, l.raw(), r.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["alpha"],
    );
    expect_status(
        st(g.raw(), 1.0, f64::INFINITY, l.raw(), r.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["beta"],
    );
    expect_status(
        unsafe { fk_shampoo_stats_ex(g.raw(), 1.0, 1.0, l.raw(), r.raw(), 6, null()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_shampoo_stats_ex", "flags = 0x6", "unknown bits"],
    );
    expect_status(
        unsafe { fk_shampoo_stats_ex(null_buf(), 1.0, 1.0, l.raw(), r.raw(), 0, null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_shampoo_stats_ex", "grad"],
    );
    expect_status(
        st(g.raw(), 1.0, 1.0, r.raw(), null_buf()),
        FK_ERROR_SHAPE_MISMATCH,
        &["l has shape [3, 3]", "[4, 4]"],
    );
    expect_status(
        st(g.raw(), 1.0, 1.0, l.raw(), l.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["r has shape [4, 4]"],
    );
    let ld = Buf::new(&ctx, FK_DTYPE_F64, &[4, 4]);
    expect_status(
        st(g.raw(), 1.0, 1.0, ld.raw(), null_buf()),
        FK_ERROR_DTYPE_MISMATCH,
        &["l has dtype f64"],
    );
    let sq = Buf::new(&ctx, FK_DTYPE_F32, &[3, 3]);
    expect_status(
        st(sq.raw(), 1.0, 1.0, sq.raw(), null_buf()),
        FK_ERROR_ALIASING,
        &["l overlaps grad"],
    );

    let pre = |l: *mut fk_buffer,
               g: *mut fk_buffer,
               r: *mut fk_buffer,
               o: *mut fk_buffer,
               f: u32| unsafe { fk_shampoo_precondition(l, g, r, o, f, null()) };
    let o = Buf::new(&ctx, FK_DTYPE_F32, &[4, 3]);
    expect_status(
        pre(l.raw(), null_buf(), r.raw(), o.raw(), 0),
        FK_ERROR_NULL_POINTER,
        &["fk_shampoo_precondition", "grad"],
    );
    expect_status(
        pre(r.raw(), g.raw(), r.raw(), o.raw(), 0),
        FK_ERROR_SHAPE_MISMATCH,
        &["l_root has shape [3, 3]"],
    );
    expect_status(
        pre(l.raw(), g.raw(), r.raw(), g.raw(), 0),
        FK_ERROR_ALIASING,
        &["out overlaps grad"],
    );
    expect_status(
        pre(l.raw(), g.raw(), r.raw(), o.raw(), 8),
        FK_ERROR_INVALID_ARGUMENT,
        &["flags"],
    );
    expect_status(
        pre(l.raw(), g.raw(), r.raw(), l.raw(), 0),
        FK_ERROR_SHAPE_MISMATCH,
        &["out has shape [4, 4]"],
    );

    let a = Buf::new(&ctx, FK_DTYPE_F32, &[5, 7]);
    let gg = Buf::new(&ctx, FK_DTYPE_F32, &[5, 2]);
    let out = Buf::new(&ctx, FK_DTYPE_F32, &[5, 2, 7]);
    let norms = Buf::new(&ctx, FK_DTYPE_F32, &[5]);
    let sum = Buf::new(&ctx, FK_DTYPE_F32, &[2, 7]);
    expect_status(
        unsafe { fk_per_sample_grads(a.raw(), null_buf(), out.raw(), 0, null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_per_sample_grads", "g"],
    );
    let g_bad = Buf::new(&ctx, FK_DTYPE_F32, &[4, 2]);
    expect_status(
        unsafe { fk_per_sample_grads(a.raw(), g_bad.raw(), out.raw(), 0, null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &["g has shape [4, 2]"],
    );
    expect_status(
        unsafe { fk_per_sample_grads(a.raw(), gg.raw(), sum.raw(), 0, null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &["out has shape [2, 7]", "[5, 2, 7]"],
    );
    let a16 = Buf::new(&ctx, FK_DTYPE_F16, &[5, 7]);
    let g16 = Buf::new(&ctx, FK_DTYPE_F16, &[5, 2]);
    expect_status(
        unsafe { fk_per_sample_grads(a16.raw(), g16.raw(), out.raw(), 0, null()) },
        FK_ERROR_UNSUPPORTED_DTYPE,
        &["a has dtype f16"],
    );
    let g64 = Buf::new(&ctx, FK_DTYPE_F64, &[5, 2]);
    expect_status(
        unsafe { fk_per_sample_grads(a.raw(), g64.raw(), out.raw(), 0, null()) },
        FK_ERROR_DTYPE_MISMATCH,
        &["g has dtype f64"],
    );
    let a4 = Buf::new(&ctx, FK_DTYPE_F32, &[5, 1, 1, 7]);
    expect_status(
        unsafe { fk_per_sample_grads(a4.raw(), gg.raw(), out.raw(), 0, null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &["a has shape [5, 1, 1, 7]"],
    );
    let n_bad = Buf::new(&ctx, FK_DTYPE_F32, &[4]);
    expect_status(
        unsafe { fk_per_sample_grad_norms(a.raw(), gg.raw(), n_bad.raw(), null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &["sq_norms has shape [4]"],
    );
    expect_status(
        unsafe { fk_per_sample_grad_norms(a.raw(), gg.raw(), null_buf(), null()) },
        FK_ERROR_NULL_POINTER,
        &["sq_norms"],
    );
    let cs = |c: f64, o: *mut fk_buffer, n: *mut fk_buffer| unsafe {
        fk_dp_clipped_grad_sum(a.raw(), gg.raw(), c, o, n, 0, null())
    };
    expect_status(
        cs(-1.0, sum.raw(), norms.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["max_norm"],
    );
    expect_status(
        cs(f64::NAN, sum.raw(), norms.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["max_norm"],
    );
    expect_status(
        cs(1.0, out.raw(), norms.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["out has shape [5, 2, 7]"],
    );
    expect_status(
        cs(1.0, a.raw(), norms.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["out has shape [5, 7]"],
    );
    let sum_a = unsafe { Buf::wrap(&ctx, a.data(), FK_DTYPE_F32, &[2, 7], None) };
    expect_status(
        cs(1.0, sum_a.raw(), norms.raw()),
        FK_ERROR_ALIASING,
        &["out overlaps a"],
    );
    let n_in_g = unsafe { Buf::wrap(&ctx, gg.data(), FK_DTYPE_F32, &[5], None) };
    expect_status(
        cs(1.0, sum.raw(), n_in_g.raw()),
        FK_ERROR_ALIASING,
        &["sq_norms overlaps g"],
    );
}
