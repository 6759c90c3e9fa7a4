//! The optimizer-math family on CUDA against the CPU oracle, through the C ABI.
//! Without a CUDA device every test prints "SKIPPED: no CUDA device" (unless
//! `FK_REQUIRE_GPU=1`); under `FK_SANITIZE=1` the sizes shrink.
//!
//! Covered: the eigendecomposition path on every cuSOLVER route (syevjBatched for
//! n <= 32, XsyevBatched for batches, syevd for one matrix) and the Newton
//! iteration (f64, strict f32, TF32) against the CPU and the f64 reference on odd
//! sizes; AUTO; Shampoo statistics (SYRK and the batched path) and preconditioning;
//! per-sample gradients (the vector and scalar outer-product paths, sequences),
//! norms and the clipped sum; device mismatches; a CUDA graph capture-free check that
//! everything is queued on the given stream.

mod common;
mod optim_ref;

use std::ptr::{null, null_mut};

use common::*;
use optim_ref::*;

const REAL: [fk_dtype; 2] = [FK_DTYPE_F32, FK_DTYPE_F64];

fn cuda_vs_cpu_tol(dt: fk_dtype) -> f64 {
    if dt == FK_DTYPE_F64 { 1e-10 } else { 1e-4 }
}

#[test]
fn eigh_power_every_solver_route() {
    let Some((g, cpu, mut rng)) = gpu_oracle(21) else {
        return;
    };
    let big = if sanitizing() { 40 } else { 129 };
    for dt in REAL {
        // (n, batch): syevjBatched (n <= 32), syevd (batch 1), XsyevBatched (batch > 1)
        for &(n, batch) in &[
            (1usize, 1usize),
            (7, 5),
            (32, 3),
            (33, 1),
            (big, 1),
            (45, 4),
            (big, 3),
        ] {
            let mats: Vec<f64> = (0..batch).flat_map(|_| spd(&mut rng, n)).collect();
            for &power in &[-0.25, 0.5, -1.0] {
                let (s, got, rep) = run_power(&g, dt, &mats, batch, n, Pow::eigh(power, 1e-4));
                let what = format!("eigh {} n={n} batch={batch} power={power}", dname(dt));
                assert!(s == FK_OK, "{what}: {} {}", status_name(s), last_error());
                let (s2, want, rep_cpu) =
                    run_power(&cpu, dt, &mats, batch, n, Pow::eigh(power, 1e-4));
                ok(s2);
                close(&got, &want, cuda_vs_cpu_tol(dt), &what);
                assert_eq!((rep.method, rep.converged), (FK_MATPOW_EIGH, 1), "{what}");
                assert!(
                    (rep.min_eigenvalue - rep_cpu.min_eigenvalue).abs()
                        <= 1e-4 * rep_cpu.min_eigenvalue.abs().max(1e-3),
                    "{what}: {rep:?} vs {rep_cpu:?}"
                );
            }
        }
    }
}

#[test]
fn eigh_shifts_an_indefinite_spectrum_like_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(22);
    let n = 40;
    let spec: Vec<f64> = (0..n)
        .map(|i| if i == 0 { -0.25 } else { 0.5 + i as f64 })
        .collect();
    let m = spd_with(&mut rng, &spec);
    let (s, got, rep) = run_power(&g, FK_DTYPE_F64, &m, 1, n, Pow::eigh(-0.5, 1e-3));
    ok(s);
    let (want, lmin) = power_ref(&m, n, -0.5, 1e-3);
    close(&got, &want, 1e-9, "shifted spectrum");
    assert!((rep.min_eigenvalue - lmin).abs() < 1e-9);
}

#[test]
fn newton_f64_strict_f32_and_tf32() {
    let Some((g, cpu, mut rng)) = gpu_oracle(23) else {
        return;
    };
    let big = if sanitizing() { 48 } else { 200 };
    for &(n, batch) in &[(1usize, 2usize), (33, 3), (big, 2), (64, 1)] {
        let mats: Vec<f64> = (0..batch).flat_map(|_| spd(&mut rng, n)).collect();
        for &p in &[1u32, 2, 4, 3] {
            let power = -1.0 / p as f64;
            let want: Vec<f64> = (0..batch)
                .flat_map(|b| power_ref(&mats[b * n * n..(b + 1) * n * n], n, power, 1e-6).0)
                .collect();
            for (dt, flags, tol, err) in [
                (FK_DTYPE_F64, 0u32, 1e-12, 1e-9),
                (FK_DTYPE_F32, 0, 5e-5, 5e-4),
                (FK_DTYPE_F32, FK_GEMM_ALLOW_TF32, 3e-2, 1e-2),
            ] {
                let what = format!(
                    "newton {} n={n} batch={batch} p={p} flags={flags}",
                    dname(dt)
                );
                let pw = Pow::newton(power, 1e-6, 100, tol).flags(flags);
                let (s, got, rep) = run_power(&g, dt, &mats, batch, n, pw);
                assert!(
                    s == FK_OK,
                    "{what}: {} {} {rep:?}",
                    status_name(s),
                    last_error()
                );
                close(&got, &want, err, &what);
                assert_eq!((rep.method, rep.converged), (FK_MATPOW_NEWTON, 1), "{what}");
                assert!(rep.residual <= tol, "{what}: {rep:?}");
                if flags == 0 {
                    // the same algorithm on the CPU stops after about as many steps
                    let pw = Pow::newton(power, 1e-6, 100, tol);
                    let (_, cpu_out, cpu_rep) = run_power(&cpu, dt, &mats, batch, n, pw);
                    assert!(
                        (rep.iterations - cpu_rep.iterations).abs() <= 1,
                        "{what}: {rep:?} vs CPU {cpu_rep:?}"
                    );
                    close(&got, &cpu_out, err, &format!("{what} vs CPU"));
                }
            }
        }
    }
}

#[test]
fn auto_picks_newton_above_32_and_reports_it() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(24);
    for &(n, want_method) in &[(16usize, FK_MATPOW_EIGH), (48, FK_MATPOW_NEWTON)] {
        let m = spd(&mut rng, n);
        let pw = Pow::auto(-0.25, 1e-6, 100, 1e-12);
        let (s, got, rep) = run_power(&g, FK_DTYPE_F64, &m, 1, n, pw);
        ok(s);
        assert_eq!(rep.method, want_method, "n={n}");
        close(
            &got,
            &power_ref(&m, n, -0.25, 1e-6).0,
            1e-9,
            &format!("auto n={n}"),
        );
    }
    // a non-root power is always the eigendecomposition
    let m = spd(&mut rng, 48);
    let pw = Pow::auto(0.37, 1e-6, 100, 1e-12);
    let (s, _, rep) = run_power(&g, FK_DTYPE_F64, &m, 1, 48, pw);
    ok(s);
    assert_eq!(rep.method, FK_MATPOW_EIGH);
    // Newton that cannot converge in 2 steps: NEWTON reports it, AUTO falls back
    let pw = Pow::newton(-0.5, 0.0, 2, 1e-12);
    let (s, _, rep) = run_power(&g, FK_DTYPE_F64, &m, 1, 48, pw);
    expect_status(
        s,
        FK_ERROR_NOT_CONVERGED,
        &["fk_matrix_power", "did not converge"],
    );
    assert_eq!((rep.iterations, rep.converged), (2, 0));
    let pw = Pow::auto(-0.5, 0.0, 2, 1e-12);
    let (s, got, rep) = run_power(&g, FK_DTYPE_F64, &m, 1, 48, pw);
    ok(s);
    assert_eq!(rep.method, FK_MATPOW_EIGH);
    close(&got, &power_ref(&m, 48, -0.5, 0.0).0, 1e-9, "auto fallback");
}

#[test]
fn shampoo_stats_and_precondition_match_the_cpu() {
    let Some((g, cpu, mut rng)) = gpu_oracle(25) else {
        return;
    };
    for dt in REAL {
        for &(batch, m, n) in &[
            (1usize, 37usize, 19usize),
            (4, 16, 33),
            (1, 1, 5),
            (3, 7, 1),
        ] {
            let sp = Shampoo::random(&mut rng, batch, m, n);
            let (gr, l0, r0) = (&sp.g, &sp.l0, &sp.r0);
            let sh = |a: usize, b: usize| sp.shape(a, b);
            let mut results = Vec::new();
            for ctx in [&g, &cpu] {
                let gb = Buf::from_vals(ctx, dt, &sh(m, n), &reals(&gr));
                let lb = Buf::from_vals(ctx, dt, &sh(m, m), &reals(&l0));
                let rb = Buf::from_vals(ctx, dt, &sh(n, n), &reals(&r0));
                ok(unsafe { fk_shampoo_stats(gb.raw(), 0.05, 0.95, lb.raw(), rb.raw(), null()) });
                let out = Buf::from_vals(ctx, dt, &sh(m, n), &vec![re(f64::NAN); gr.len()]);
                ok(unsafe {
                    fk_shampoo_precondition(lb.raw(), gb.raw(), rb.raw(), out.raw(), 0, null())
                });
                results.push((re_of(&lb.read()), re_of(&rb.read()), re_of(&out.read())));
            }
            let what = format!("{} {batch}x{m}x{n}", dname(dt));
            close(
                &results[0].0,
                &results[1].0,
                cuda_vs_cpu_tol(dt),
                &format!("L {what}"),
            );
            close(
                &results[0].1,
                &results[1].1,
                cuda_vs_cpu_tol(dt),
                &format!("R {what}"),
            );
            close(
                &results[0].2,
                &results[1].2,
                cuda_vs_cpu_tol(dt),
                &format!("preconditioned {what}"),
            );
            for (mat, k) in [(&results[0].0, m), (&results[0].1, n)] {
                let why = format!("{what}: CUDA result exactly symmetric");
                assert_symmetric(mat, batch, k, &why);
            }
        }
    }
}

/// `fk_shampoo_stats_ex` with `FK_GEMM_ALLOW_TF32` on f32: the GEMM on tensor cores.
/// Close to the f64 statistic (TF32 rounds each gradient element once, ~1e-3
/// relative), exactly symmetric, and, at 300x129 (where cuBLAS picks tensor-core
/// kernels; for small products it may keep SIMT kernels, identical to strict),
/// different from the strict result, so the flag reaches cuBLAS.
#[test]
fn shampoo_stats_tf32_is_close_and_symmetric() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(26);
    for &(batch, m, n) in &[(1usize, 37usize, 19usize), (1, 300, 129), (3, 64, 33)] {
        let sp = Shampoo::random(&mut rng, batch, m, n);
        let (gr, l0, r0) = (&sp.g, &sp.l0, &sp.r0);
        let sh = |a: usize, b: usize| sp.shape(a, b);
        let (alpha, beta) = (0.25, 0.75);
        let run = |flags: u32| {
            let gb = Buf::from_vals(&g, FK_DTYPE_F32, &sh(m, n), &reals(&gr));
            let lb = Buf::from_vals(&g, FK_DTYPE_F32, &sh(m, m), &reals(&l0));
            let rb = Buf::from_vals(&g, FK_DTYPE_F32, &sh(n, n), &reals(&r0));
            ok(unsafe {
                fk_shampoo_stats_ex(gb.raw(), alpha, beta, lb.raw(), rb.raw(), flags, null())
            });
            (re_of(&lb.read()), re_of(&rb.read()))
        };
        let (lt, rt) = run(FK_GEMM_ALLOW_TF32);
        let (ls, rs) = run(0);
        let what = format!("TF32 stats {batch}x{m}x{n}");
        for (got, strict, k, trans) in [(&lt, &ls, m, false), (&rt, &rs, n, true)] {
            // f64 reference and the size of the product term, per matrix
            let (mut err, mut size, mut diff) = (0.0f64, 0.0f64, 0.0f64);
            for b in 0..batch {
                let x = &gr[b * m * n..(b + 1) * m * n];
                for i in 0..k {
                    for j in 0..k {
                        let dot: f64 = if trans {
                            (0..m).map(|t| x[t * n + i] * x[t * n + j]).sum()
                        } else {
                            (0..n).map(|t| x[i * n + t] * x[j * n + t]).sum()
                        };
                        let c0 = if trans { &r0 } else { &l0 }[b * k * k + i * k + j];
                        let want = beta * c0 + alpha * dot;
                        let idx = b * k * k + i * k + j;
                        err = err.max((got[idx] - want).abs());
                        size = size.max((alpha * dot).abs());
                        diff = diff.max((got[idx] - strict[idx]).abs());
                        assert_eq!(
                            got[idx],
                            got[b * k * k + j * k + i],
                            "{what}: exactly symmetric"
                        );
                    }
                }
            }
            assert!(
                err <= 4e-3 * size,
                "{what}: max error {err:e} vs product size {size:e}"
            );
            assert!(
                m < 300 || diff > 1e-7 * size,
                "{what}: TF32 equals the strict result ({diff:e}): the flag did not reach cuBLAS"
            );
        }
    }
}

#[test]
fn per_sample_paths_match_the_cpu() {
    let Some((g, cpu, mut rng)) = gpu_oracle(26) else {
        return;
    };
    // (B, T, in, out): one step with in % 4 == 0 (vector stores) and odd in (scalar),
    // sequences, many samples
    let cases: &[(usize, Option<usize>, usize, usize)] = &[
        (7, None, 64, 9),
        (5, None, 33, 17),
        (3, Some(11), 20, 13),
        (1, Some(1), 1, 1),
        (2, Some(4), 128, 64),
        // >= 2 samples per SM: the warp-per-sample kernel (f32 needs dims % 4, f64
        // % 2; out = 1028 spills past the values kept in registers), and (270, 6, 10)
        // which f32 takes by block, f64 by warp
        (300, None, 8, 1028),
        (270, None, 6, 10),
        // fewer samples, aligned rows: one block per sample, one 16-byte vector per
        // thread and row, the block sized to the longer row (32, 64, 1024 threads for
        // f32); rows of more than 1024 vectors take the scalar kernel (in = 4100, and
        // f64 in = 4096, out = 4104)
        (7, None, 64, 12),
        (130, None, 256, 96),
        (3, None, 4096, 8),
        (3, None, 4100, 8),
        (2, None, 4, 2048),
        (2, None, 4, 4104),
    ];
    for dt in REAL {
        for &(b, t, din, dout) in cases {
            let steps = t.unwrap_or(1);
            let sh = |last: usize| match t {
                None => vec![b as i64, last as i64],
                Some(t) => vec![b as i64, t as i64, last as i64],
            };
            let a: Vec<f64> = (0..b * steps * din)
                .map(|_| rng.uniform(-1.0, 1.0))
                .collect();
            let gv: Vec<f64> = (0..b * steps * dout)
                .map(|_| rng.uniform(-1.0, 1.0))
                .collect();
            let grads = per_sample_ref(&a, &gv, b, steps, din, dout);
            let norms = sq_norms_ref(&grads, b, din * dout);
            let c = norms.iter().map(|x| x.sqrt()).sum::<f64>() / b as f64;
            let what = format!("{} B={b} T={t:?} in={din} out={dout}", dname(dt));
            let mut res = Vec::new();
            for ctx in [&g, &cpu] {
                let ab = Buf::from_vals(ctx, dt, &sh(din), &reals(&a));
                let gb = Buf::from_vals(ctx, dt, &sh(dout), &reals(&gv));
                let ob = Buf::from_vals(
                    ctx,
                    dt,
                    &[b as i64, dout as i64, din as i64],
                    &vec![re(f64::NAN); grads.len()],
                );
                ok(unsafe { fk_per_sample_grads(ab.raw(), gb.raw(), ob.raw(), 0, null()) });
                let nb = Buf::from_vals(ctx, dt, &[b as i64], &vec![re(f64::NAN); b]);
                ok(unsafe { fk_per_sample_grad_norms(ab.raw(), gb.raw(), nb.raw(), null()) });
                let sb = Buf::from_vals(
                    ctx,
                    dt,
                    &[dout as i64, din as i64],
                    &vec![re(f64::NAN); din * dout],
                );
                let nb2 = Buf::from_vals(ctx, dt, &[b as i64], &vec![re(f64::NAN); b]);
                ok(unsafe {
                    fk_dp_clipped_grad_sum(ab.raw(), gb.raw(), c, sb.raw(), nb2.raw(), 0, null())
                });
                res.push([
                    re_of(&ob.read()),
                    re_of(&nb.read()),
                    re_of(&sb.read()),
                    re_of(&nb2.read()),
                ]);
            }
            let tol = cuda_vs_cpu_tol(dt);
            close(&res[0][0], &grads, tol, &format!("grads {what}"));
            close(&res[0][1], &norms, tol, &format!("norms {what}"));
            close(
                &res[0][2],
                &clipped_sum_ref(&grads, b, din * dout, c),
                tol,
                &format!("clipped {what}"),
            );
            close(&res[0][3], &norms, tol, &format!("clipped norms {what}"));
            for k in 0..4 {
                close(
                    &res[0][k],
                    &res[1][k],
                    tol,
                    &format!("CUDA vs CPU output {k} {what}"),
                );
            }
        }
    }
}

#[test]
fn cpu_buffers_into_cuda_ops_are_device_mismatches() {
    let Some(g) = gpu() else { return };
    let cpu = Ctx::cpu();
    let a = Buf::new(&cpu, FK_DTYPE_F32, &[4, 4]);
    let o = Buf::new(&g, FK_DTYPE_F32, &[4, 4]);
    let pw = Pow::auto(-0.5, 0.0, 10, 1e-6);
    let s = unsafe { pw.call(a.raw(), o.raw(), null_mut(), null()) };
    expect_status(s, FK_ERROR_DEVICE_MISMATCH, &["fk_matrix_power", "a"]);
    let gr = Buf::new(&g, FK_DTYPE_F32, &[4, 3]);
    let l = Buf::new(&cpu, FK_DTYPE_F32, &[4, 4]);
    expect_status(
        unsafe { fk_shampoo_stats(gr.raw(), 1.0, 1.0, l.raw(), null_buf(), null()) },
        FK_ERROR_DEVICE_MISMATCH,
        &["l"],
    );
    let ac = Buf::new(&cpu, FK_DTYPE_F32, &[4, 3]);
    let gg = Buf::new(&g, FK_DTYPE_F32, &[4, 2]);
    let out = Buf::new(&g, FK_DTYPE_F32, &[2, 3]);
    expect_status(
        unsafe {
            fk_dp_clipped_grad_sum(ac.raw(), gg.raw(), 1.0, out.raw(), null_buf(), 0, null())
        },
        FK_ERROR_DEVICE_MISMATCH,
        &["a"],
    );
}
