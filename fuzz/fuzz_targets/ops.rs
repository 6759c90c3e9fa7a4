//! The op entry points of the gaussian, geodesic, linalg and optim families with
//! coherent shapes most of the time (so calls get past validation and run), and
//! every argument now and then NULL, of another dtype or shape, strided, aliased,
//! read-only or a handle of the wrong kind; scalars include NaN, infinities and
//! extremes. Oracle: `check` on every status, and for successful fk_gemm and
//! fk_kron calls on f32/f64 an f64 reference product.
#![no_main]

use fusekit_fuzz::*;
use libfuzzer_sys::fuzz_target;
use std::ptr::null_mut;

/// A small dimension (mostly 0..=3).
fn small(b: &mut Bytes) -> i64 {
    if b.one_in(16) {
        b.dim().clamp(-2, 9)
    } else {
        (b.u8() % 4) as i64
    }
}

fn real_or_any(b: &mut Bytes) -> i32 {
    if b.one_in(4) {
        b.dtype()
    } else {
        [3, 4][b.below(2)]
    }
}

fn ints(b: &mut Bytes) -> u32 {
    if b.one_in(4) { b.u8() as u32 } else { 0 }
}

/// Values of a 2-D or 3-D real view as [batch][row][col] (batch 1 for 2-D).
fn matrices(v: &View) -> Option<Vec<Vec<Vec<f64>>>> {
    let numel = v.shape.iter().try_fold(1i64, |a, &d| a.checked_mul(d));
    if !(1..=4).contains(&v.dtype)
        || !(2..=3).contains(&v.shape.len())
        || numel.is_none_or(|n| n > 4096)
        || v.shape.iter().any(|&d| d > 4096)
    {
        return None;
    }
    let (bt, r, c) = if v.shape.len() == 3 {
        (v.shape[0], v.shape[1], v.shape[2])
    } else {
        (1, v.shape[0], v.shape[1])
    };
    let mut out = vec![vec![vec![0.0; c as usize]; r as usize]; bt as usize];
    for_each_index(&v.shape, |idx| {
        let (k, i, j) = if idx.len() == 3 {
            (idx[0], idx[1], idx[2])
        } else {
            (0, idx[0], idx[1])
        };
        // SAFETY: index inside the view.
        out[k as usize][i as usize][j as usize] =
            unsafe { read_real(v.data.offset(byte_offset(v, idx)), v.dtype) };
    });
    Some(out)
}

fn tol(dtype: i32) -> f64 {
    match dtype {
        1 | 2 => 2e-2,
        3 => 1e-4,
        _ => 1e-10,
    }
}

/// The smallest subnormal of a real dtype: results round to a multiple of it.
fn subnormal(dtype: i32) -> f64 {
    match dtype {
        1 => 6e-8,
        2 => 1e-40,
        3 => 1.5e-45,
        _ => 5e-324,
    }
}

fn gemm(b: &mut Bytes, m: &mut Maker) {
    let dtype = b.dtype();
    let (op_a, op_b) = (b.u8() as i32 % 4, b.u8() as i32 % 4);
    let (mm, n, k) = (small(b), small(b), small(b));
    let batch = if b.bool() { Some(small(b)) } else { None };
    let shp = |rows: i64, cols: i64, t: bool, batch: Option<i64>| {
        let (r, c) = if t { (cols, rows) } else { (rows, cols) };
        match batch {
            Some(x) => vec![x, r, c],
            None => vec![r, c],
        }
    };
    let ba = if b.one_in(3) { Some(1) } else { batch };
    let a = m.arg(b, dtype, &shp(mm, k, op_a != 0, ba));
    let bb = m.arg(b, dtype, &shp(k, n, op_b != 0, batch));
    let c = m.arg(b, dtype, &shp(mm, n, false, batch));
    let (alpha, beta) = (b.scalar(), b.scalar());
    let flags = ints(b);
    let stream = m.stream_arg(b);
    let live = |p: *mut fk_buffer| !p.is_null() && m.owned.buffers.contains(&p);
    let snap = (live(a) && live(bb) && live(c) && a != c && bb != c)
        .then(|| (view(a), view(bb), view(c)))
        .and_then(|(va, vb, vc)| Some((matrices(&va)?, matrices(&vb)?, matrices(&vc)?, vc)));
    let chunked = b.one_in(3);
    // SAFETY: live, NULL or wrong-kind handles.
    let st = unsafe {
        if chunked {
            fk_gemm_chunked(op_a, op_b, alpha, a, bb, beta, c, b.u64(), flags, stream)
        } else {
            fk_gemm(op_a, op_b, alpha, a, bb, beta, c, flags, stream)
        }
    };
    let name = if chunked {
        "fk_gemm_chunked"
    } else {
        "fk_gemm"
    };
    if !check(st, name) {
        return;
    }
    let Some((am, bm, cm, vc)) = snap else { return };
    let ok = |s: fk_scalar| s.re.is_finite() && s.re.abs() < 1e3 && s.im == 0.0;
    let fin = |x: &Vec<Vec<Vec<f64>>>| x.iter().flatten().flatten().all(|v| v.is_finite());
    if !(ok(alpha) && ok(beta) && fin(&am) && fin(&bm) && fin(&cm)) {
        return;
    }
    let got = matrices(&vc).unwrap();
    // alpha and beta in the compute precision, as the GEMM applies them (f32 for
    // f16 / bf16 / f32): a tiny f64 alpha is 0 there (a bf16 run found -0 where the
    // unrounded reference gave -3.9e-29)
    let compute = |v: f64| if vc.dtype == 4 { v } else { v as f32 as f64 };
    let (alpha, beta) = (
        fk_scalar {
            re: compute(alpha.re),
            im: 0.0,
        },
        fk_scalar {
            re: compute(beta.re),
            im: 0.0,
        },
    );
    for (bi, cmat) in cm.iter().enumerate() {
        let amat = &am[if am.len() == 1 { 0 } else { bi }];
        let bmat = &bm[if bm.len() == 1 { 0 } else { bi }];
        for (i, row) in cmat.iter().enumerate() {
            for (j, &c0) in row.iter().enumerate() {
                let kk = if op_a != 0 {
                    amat.len()
                } else {
                    amat.first().map_or(0, |r| r.len())
                };
                let (mut s, mut scale) = (0.0, 0.0);
                for p in 0..kk {
                    let x = if op_a != 0 { amat[p][i] } else { amat[i][p] };
                    let y = if op_b != 0 { bmat[j][p] } else { bmat[p][j] };
                    s += x * y;
                    scale += (x * y).abs();
                }
                let want = alpha.re * s + beta.re * c0;
                // The product's terms overflow the dtype: inf/NaN in its arithmetic
                // (e.g. 0 * inf with alpha = 0), finite in the f64 reference.
                let raw = scale;
                let scale = (alpha.re.abs() * scale + (beta.re * c0).abs()).max(1e-300);
                let g = got[bi][i][j];
                if !scale.is_finite()
                    || !want.is_finite()
                    || raw.max(want.abs()) > max_finite(vc.dtype)
                {
                    continue; // overflowing products: inf/NaN depend on the summation order
                }
                assert!(
                    (g - want).abs() <= tol(vc.dtype) * scale + subnormal(vc.dtype),
                    "{name} c[{bi}][{i}][{j}] = {g}, want {want} (dtype {})",
                    vc.dtype
                );
            }
        }
    }
}

fn kron(b: &mut Bytes, m: &mut Maker) {
    let dtype = b.dtype();
    let (p, q, r, s) = (small(b), small(b), small(b), small(b));
    let batch = if b.bool() { Some(small(b)) } else { None };
    let sh = |x: i64, y: i64, bt: Option<i64>| match bt {
        Some(k) => vec![k, x, y],
        None => vec![x, y],
    };
    let ba = if b.one_in(3) { None } else { batch };
    let a = m.arg(b, dtype, &sh(p, q, ba));
    let bb = m.arg(b, dtype, &sh(r, s, batch));
    let out = m.arg(b, dtype, &sh(p * r, q * s, batch));
    let stream = m.stream_arg(b);
    let live = |x: *mut fk_buffer| !x.is_null() && m.owned.buffers.contains(&x);
    let snap = (live(a) && live(bb) && live(out) && a != out && bb != out)
        .then(|| (view(a), view(bb), view(out)))
        .and_then(|(va, vb, vo)| Some((matrices(&va)?, matrices(&vb)?, vo)));
    // SAFETY: live, NULL or wrong-kind handles.
    if !check(unsafe { fk_kron(a, bb, out, stream) }, "fk_kron") {
        return;
    }
    let Some((am, bm, vo)) = snap else { return };
    let Some(got) = matrices(&vo) else { return }; // out too large to compare
    for (bi, o) in got.iter().enumerate() {
        let amat = &am[if am.len() == 1 { 0 } else { bi }];
        let bmat = &bm[if bm.len() == 1 { 0 } else { bi }];
        let (rr, ss) = (bmat.len(), bmat.first().map_or(0, |x| x.len()));
        for (i, row) in o.iter().enumerate() {
            for (j, &g) in row.iter().enumerate() {
                let want = round_to(amat[i / rr][j / ss] * bmat[i % rr][j % ss], vo.dtype);
                assert!(
                    g == want
                        || (g.is_nan() && want.is_nan())
                        || (g - want).abs() <= tol(vo.dtype) * want.abs() + subnormal(vo.dtype),
                    "fk_kron out[{bi}][{i}][{j}] = {g}, want {want}"
                );
            }
        }
    }
}

fn gaussian(b: &mut Bytes, m: &mut Maker) {
    let dtype = real_or_any(b);
    let (bn, n) = (small(b), small(b));
    let three = if b.one_in(10) { small(b) } else { 3 };
    let points = m.arg(b, dtype, &[bn, three]);
    let means = m.arg(b, dtype, &[n, 3]);
    let chol = m.arg(b, dtype, &[n, 3, three]);
    let eps = if b.bool() { 1e-6 } else { b.f64() };
    let stream = m.stream_arg(b);
    // SAFETY (all calls below): live, NULL or wrong-kind handles.
    match b.u8() % 5 {
        0 => {
            let out = m.arg(b, dtype, &[bn, n]);
            check(
                unsafe { fk_mahalanobis_forward(points, means, chol, eps, out, stream) },
                "fk_mahalanobis_forward",
            );
        }
        1 => {
            let g = m.arg(b, dtype, &[bn, n]);
            let opt = |b: &mut Bytes, m: &mut Maker, s: &[i64]| {
                if b.bool() {
                    m.arg(b, dtype, s)
                } else {
                    null_mut()
                }
            };
            let (dp, dm, dc) = (
                opt(b, m, &[bn, 3]),
                opt(b, m, &[n, 3]),
                opt(b, m, &[n, 3, 3]),
            );
            let ws = if b.bool() {
                let w = small(b);
                m.arg(b, 3, &[w])
            } else {
                null_mut()
            };
            check(
                unsafe {
                    fk_mahalanobis_backward(points, means, chol, eps, g, dp, dm, dc, ws, stream)
                },
                "fk_mahalanobis_backward",
            );
        }
        2 => {
            let w = m.arg(b, dtype, &[n]);
            let out = m.arg(b, dtype, &[bn]);
            check(
                unsafe { fk_gaussian_field_forward(points, means, chol, w, eps, out, stream) },
                "fk_gaussian_field_forward",
            );
        }
        3 => {
            let w = m.arg(b, dtype, &[n]);
            let dout = m.arg(b, dtype, &[bn]);
            let opt = |b: &mut Bytes, m: &mut Maker, s: &[i64]| {
                if b.bool() {
                    m.arg(b, dtype, s)
                } else {
                    null_mut()
                }
            };
            let (dp, dm, dc, dw) = (
                opt(b, m, &[bn, 3]),
                opt(b, m, &[n, 3]),
                opt(b, m, &[n, 3, 3]),
                opt(b, m, &[n]),
            );
            let ws = if b.bool() {
                let w = small(b);
                m.arg(b, 3, &[w])
            } else {
                null_mut()
            };
            check(
                unsafe {
                    fk_gaussian_field_backward(
                        points, means, chol, w, eps, dout, dp, dm, dc, dw, ws, stream,
                    )
                },
                "fk_gaussian_field_backward",
            );
        }
        _ => {
            let mut bytes = 0usize;
            let ctx = if b.one_in(8) {
                std::ptr::null()
            } else {
                m.ctx as *const fk_context
            };
            let out = if b.one_in(8) {
                null_mut()
            } else {
                &mut bytes as *mut usize
            };
            check(
                unsafe {
                    fk_gaussian_backward_workspace_size(ctx, b.dtype(), b.dim(), b.dim(), out)
                },
                "fk_gaussian_backward_workspace_size",
            );
        }
    }
}

fn geodesic(b: &mut Bytes, m: &mut Maker) {
    let dtype = real_or_any(b);
    let (bn, d, r) = (small(b), small(b), small(b));
    let c = b.f64();
    let flags = ints(b);
    let stream = m.stream_arg(b);
    let opt = |b: &mut Bytes, m: &mut Maker, s: &[i64]| {
        if b.bool() {
            m.arg(b, dtype, s)
        } else {
            null_mut()
        }
    };
    // SAFETY (all calls below): live, NULL or wrong-kind handles.
    match b.u8() % 4 {
        0 => {
            let (v, u, w, gamma) = (
                m.arg(b, dtype, &[bn, d]),
                m.arg(b, dtype, &[d, r]),
                m.arg(b, dtype, &[d, r]),
                m.arg(b, dtype, &[bn, d]),
            );
            check(
                unsafe { fk_christoffel_forward(v, u, w, c, flags, gamma, stream) },
                "fk_christoffel_forward",
            );
        }
        1 => {
            let (v, u, w, g) = (
                m.arg(b, dtype, &[bn, d]),
                m.arg(b, dtype, &[d, r]),
                m.arg(b, dtype, &[d, r]),
                m.arg(b, dtype, &[bn, d]),
            );
            let (dv, du, dw) = (opt(b, m, &[bn, d]), opt(b, m, &[d, r]), opt(b, m, &[d, r]));
            check(
                unsafe { fk_christoffel_backward(v, u, w, g, c, flags, dv, du, dw, stream) },
                "fk_christoffel_backward",
            );
        }
        2 => {
            let steps = if b.one_in(8) { b.dim() } else { small(b) };
            let (x0, v0, u, w) = (
                m.arg(b, dtype, &[bn, d]),
                m.arg(b, dtype, &[bn, d]),
                m.arg(b, dtype, &[d, r]),
                m.arg(b, dtype, &[d, r]),
            );
            let (f, mu) = (opt(b, m, &[bn, d]), opt(b, m, &[d]));
            let (xo, vo) = (m.arg(b, dtype, &[bn, d]), m.arg(b, dtype, &[bn, d]));
            // More steps than a run can take only with a trajectory whose shape
            // cannot match them (so the call must fail before any work).
            let traj = if steps > 16 {
                m.arg(b, dtype, &[9, 2, bn, d])
            } else {
                opt(b, m, &[steps.clamp(0, 9), 2, bn, d])
            };
            let dt = b.f64();
            check(
                unsafe {
                    fk_leapfrog_forward(
                        x0, v0, f, u, w, mu, dt, steps, c, flags, xo, vo, traj, stream,
                    )
                },
                "fk_leapfrog_forward",
            );
        }
        _ => {
            let steps = if b.one_in(8) { b.dim() } else { small(b) };
            let (v0, u, w) = (
                m.arg(b, dtype, &[bn, d]),
                m.arg(b, dtype, &[d, r]),
                m.arg(b, dtype, &[d, r]),
            );
            let (f, mu) = (opt(b, m, &[bn, d]), opt(b, m, &[d]));
            let traj = if steps > 16 {
                m.arg(b, dtype, &[9, 2, bn, d])
            } else {
                opt(b, m, &[steps.clamp(0, 9), 2, bn, d])
            };
            let (gx, gv) = (opt(b, m, &[bn, d]), opt(b, m, &[bn, d]));
            let (dx0, dv0, df, du, dw) = (
                opt(b, m, &[bn, d]),
                opt(b, m, &[bn, d]),
                opt(b, m, &[bn, d]),
                opt(b, m, &[d, r]),
                opt(b, m, &[d, r]),
            );
            let dt = b.f64();
            check(
                unsafe {
                    fk_leapfrog_backward(
                        v0, f, u, w, mu, dt, steps, c, flags, traj, gx, gv, dx0, dv0, df, du, dw,
                        stream,
                    )
                },
                "fk_leapfrog_backward",
            );
        }
    }
}

fn linear(b: &mut Bytes, m: &mut Maker) {
    let dtype = if b.one_in(4) {
        b.dtype()
    } else {
        [1, 2, 3][b.below(3)]
    };
    let (rows, n, k) = (small(b), small(b), small(b));
    let lead: Vec<i64> = if b.bool() {
        vec![rows]
    } else {
        vec![1.max(rows), small(b)]
    };
    let with = |l: &[i64], last: i64| l.iter().copied().chain([last]).collect::<Vec<_>>();
    let act = if b.one_in(8) {
        b.u8() as i32 - 128
    } else {
        b.below(3) as i32
    };
    let stream = m.stream_arg(b);
    let opt = |b: &mut Bytes, m: &mut Maker, s: &[i64]| {
        if b.bool() {
            m.arg(b, dtype, s)
        } else {
            null_mut()
        }
    };
    // SAFETY (all calls below): live, NULL or wrong-kind handles, valid out-parameter.
    match b.u8() % 3 {
        0 => {
            let (x, w, bias) = (
                m.arg(b, dtype, &with(&lead, k)),
                m.arg(b, dtype, &[n, k]),
                opt(b, m, &[n]),
            );
            let (y, aux) = (m.arg(b, dtype, &with(&lead, n)), opt(b, m, &with(&lead, n)));
            check(
                unsafe { fk_linear_forward(x, w, bias, act, y, aux, stream) },
                "fk_linear_forward",
            );
        }
        1 => {
            let (dy, x, w, saved) = (
                m.arg(b, dtype, &with(&lead, n)),
                m.arg(b, dtype, &with(&lead, k)),
                m.arg(b, dtype, &[n, k]),
                opt(b, m, &with(&lead, n)),
            );
            let (dx, dw, db) = (
                opt(b, m, &with(&lead, k)),
                opt(b, m, &[n, k]),
                opt(b, m, &[n]),
            );
            check(
                unsafe { fk_linear_backward(dy, x, w, act, saved, dx, dw, db, stream) },
                "fk_linear_backward",
            );
        }
        _ => {
            let mut bytes = 0usize;
            let out = if b.one_in(8) {
                null_mut()
            } else {
                &mut bytes as *mut usize
            };
            check(
                unsafe { fk_linear_aux_size(act, b.dtype(), b.dim(), b.dim(), out) },
                "fk_linear_aux_size",
            );
        }
    }
}

fn matpow(b: &mut Bytes, m: &mut Maker) {
    let dtype = real_or_any(b);
    let n = small(b);
    let shape = if b.bool() {
        vec![n, n]
    } else {
        vec![small(b), n, n]
    };
    let a = m.arg(b, dtype, &shape);
    let out = if b.one_in(6) {
        a
    } else {
        m.arg(b, dtype, &shape)
    };
    let (power, eps, tol) = (b.f64(), if b.bool() { 0.0 } else { b.f64() }, b.f64());
    let method = if b.one_in(8) {
        b.u8() as i32 - 128
    } else {
        b.below(3) as i32
    };
    let max_iter = if b.one_in(4) {
        b.u16() as i16 as i32
    } else {
        1 + b.below(20) as i32
    };
    let flags = ints(b);
    let stream = m.stream_arg(b);
    let mut report = std::mem::MaybeUninit::<[u8; 48]>::zeroed();
    let rep = if b.bool() {
        report.as_mut_ptr() as *mut _
    } else {
        null_mut()
    };
    // SAFETY: live, NULL or wrong-kind handles; report has room for fk_matpow_report.
    check(
        unsafe {
            fk_matrix_power(
                a, power, eps, method, max_iter, tol, flags, out, rep, stream,
            )
        },
        "fk_matrix_power",
    );
}

fn optim(b: &mut Bytes, m: &mut Maker) {
    let dtype = real_or_any(b);
    let (mm, n, bt) = (small(b), small(b), small(b));
    let batch = b.bool();
    let sh = |x: i64, y: i64| if batch { vec![bt, x, y] } else { vec![x, y] };
    let flags = ints(b);
    let stream = m.stream_arg(b);
    let opt = |b: &mut Bytes, m: &mut Maker, s: &[i64]| {
        if b.bool() {
            m.arg(b, dtype, s)
        } else {
            null_mut()
        }
    };
    // SAFETY (all calls below): live, NULL or wrong-kind handles.
    match b.u8() % 5 {
        0 => {
            let g = m.arg(b, dtype, &sh(mm, n));
            let (l, r) = (opt(b, m, &sh(mm, mm)), opt(b, m, &sh(n, n)));
            let (alpha, beta) = (b.f64(), b.f64());
            check(
                unsafe { fk_shampoo_stats_ex(g, alpha, beta, l, r, flags, stream) },
                "fk_shampoo_stats_ex",
            );
        }
        1 => {
            let g = m.arg(b, dtype, &sh(mm, n));
            let (l, r) = (opt(b, m, &sh(mm, mm)), opt(b, m, &sh(n, n)));
            let out = if b.one_in(5) {
                g
            } else {
                m.arg(b, dtype, &sh(mm, n))
            };
            check(
                unsafe { fk_shampoo_precondition(l, g, r, out, flags, stream) },
                "fk_shampoo_precondition",
            );
        }
        k => {
            // Per-sample: a [B, in] or [B, T, in], g [B, out] or [B, T, out].
            let (bsz, t, fin, fout) = (small(b), small(b), small(b), small(b));
            let seq = b.bool();
            let s3 = |x: i64| if seq { vec![bsz, t, x] } else { vec![bsz, x] };
            let (a, g) = (m.arg(b, dtype, &s3(fin)), m.arg(b, dtype, &s3(fout)));
            match k {
                2 => {
                    let out = m.arg(b, dtype, &[bsz, fout, fin]);
                    check(
                        unsafe { fk_per_sample_grads(a, g, out, flags, stream) },
                        "fk_per_sample_grads",
                    );
                }
                3 => {
                    let sq = m.arg(b, dtype, &[bsz]);
                    check(
                        unsafe { fk_per_sample_grad_norms(a, g, sq, stream) },
                        "fk_per_sample_grad_norms",
                    );
                }
                _ => {
                    let out = m.arg(b, dtype, &[fout, fin]);
                    let sq = opt(b, m, &[bsz]);
                    let max_norm = b.f64();
                    check(
                        unsafe { fk_dp_clipped_grad_sum(a, g, max_norm, out, sq, flags, stream) },
                        "fk_dp_clipped_grad_sum",
                    );
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let mut m = Maker::new(&mut b);
    let mut calls = 0;
    while !b.is_empty() && calls < 16 {
        calls += 1;
        match b.u8() % 7 {
            0 => gemm(&mut b, &mut m),
            1 => kron(&mut b, &mut m),
            2 => gaussian(&mut b, &mut m),
            3 => geodesic(&mut b, &mut m),
            4 => linear(&mut b, &mut m),
            5 => matpow(&mut b, &mut m),
            _ => optim(&mut b, &mut m),
        }
    }
});
