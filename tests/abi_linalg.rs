//! The linear-algebra family (docs/ops.md section 2) on the CPU backend, through the C
//! ABI: GEMM for every dtype and op pair on odd sizes, batches (broadcast too),
//! padded leading dimensions, beta = 0 over a NaN output, k = 0; the fused linear
//! layer forward and backward against f64 references, the GELU derivative and the
//! library's gradients against finite differences; the Kronecker product; and every
//! bad-input status with its message.

mod common;
mod linalg_ref;

use std::ptr::{null, null_mut};

use common::*;
use linalg_ref::*;

#[track_caller]
fn check_gemm(ctx: &Ctx, case: &GemmCase, rng: &mut Rng) {
    let d = case.data(rng);
    let got = case.run(ctx, &d, null(), None);
    assert_close(&got, &case.reference(&d), tol(case.dtype), &case.describe());
}

#[test]
fn gemm_every_dtype_and_op_pair_on_odd_sizes() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(10);
    for dtype in DTYPES {
        for op_a in OPS {
            for op_b in OPS {
                for &(m, n, k) in &[(1, 1, 1), (3, 5, 7), (17, 13, 33), (2, 40, 9)] {
                    check_gemm(&ctx, &GemmCase::new(dtype, op_a, op_b, m, n, k), &mut rng);
                }
            }
        }
    }
}

#[test]
fn gemm_large_enough_for_the_parallel_tiles() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(11);
    for dtype in DTYPES {
        let mut c = GemmCase::new(dtype, FK_OP_T, FK_OP_N, 131, 197, 67);
        c.batch_c = Some(2);
        c.batch_a = Some(2);
        check_gemm(&ctx, &c, &mut rng);
    }
}

#[test]
fn gemm_batches_broadcasts_and_padded_leading_dimensions() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(12);
    for dtype in DTYPES {
        for (ba, bb) in [
            (Some(3), Some(3)),
            (None, Some(3)),
            (Some(3), None),
            (Some(1), Some(3)),
        ] {
            for pad in [0, 3] {
                let mut c = GemmCase::new(dtype, FK_OP_N, FK_OP_C, 5, 6, 4);
                c.batch_a = ba;
                c.batch_b = bb;
                c.batch_c = Some(3);
                c.pad = pad;
                check_gemm(&ctx, &c, &mut rng);
            }
        }
    }
}

#[test]
fn gemm_beta_zero_ignores_nan_in_c_and_k_zero_scales_c() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(13);
    for dtype in DTYPES {
        let mut c = GemmCase::new(dtype, FK_OP_N, FK_OP_N, 4, 5, 6);
        c.beta = re(0.0); // C is poisoned with NaN: must not leak through
        check_gemm(&ctx, &c, &mut rng);
        let c = GemmCase::new(dtype, FK_OP_T, FK_OP_N, 4, 5, 0); // C = beta C
        check_gemm(&ctx, &c, &mut rng);
        let mut c = GemmCase::new(dtype, FK_OP_N, FK_OP_N, 3, 2, 0);
        c.beta = re(0.0); // C = 0
        check_gemm(&ctx, &c, &mut rng);
    }
}

#[test]
fn gemm_tf32_flag_and_chunked_gemm_on_the_cpu() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(14);
    let mut c = GemmCase::new(FK_DTYPE_F32, FK_OP_N, FK_OP_T, 9, 8, 7);
    c.flags = FK_GEMM_ALLOW_TF32; // ignored on the CPU
    check_gemm(&ctx, &c, &mut rng);
    for dtype in DTYPES {
        let c = GemmCase::new(dtype, FK_OP_T, FK_OP_C, 33, 17, 20);
        let d = c.data(&mut rng);
        let got = c.run(&ctx, &d, null(), Some(1 << 10));
        assert_close(&got, &c.reference(&d), tol(dtype), "chunked on the CPU");
    }
}

#[test]
fn gemm_empty_outputs_are_no_ops() {
    let ctx = Ctx::cpu();
    for (sa, sb, sc) in [
        (&[0i64, 3][..], &[3i64, 4][..], &[0i64, 4][..]),
        (&[2, 3], &[3, 0], &[2, 0]),
        (&[0, 2, 3], &[0, 3, 4], &[0, 2, 4]),
    ] {
        let a = Buf::new(&ctx, FK_DTYPE_F32, sa);
        let b = Buf::new(&ctx, FK_DTYPE_F32, sb);
        let c = Buf::new(&ctx, FK_DTYPE_F32, sc);
        ok(unsafe { product(a.raw(), b.raw(), c.raw(), None, null()) });
    }
}

#[test]
fn gemm_bad_inputs_name_the_argument() {
    let ctx = Ctx::cpu();
    let f = FK_DTYPE_F32;
    let a = Buf::new(&ctx, f, &[3, 4]);
    let b = Buf::new(&ctx, f, &[4, 5]);
    let c = Buf::new(&ctx, f, &[3, 5]);
    let one = re(1.0).scalar();
    let zero = re(0.0).scalar();
    let call =
        |op_a,
         op_b,
         alpha: fk_scalar,
         a: *const fk_buffer,
         b: *const fk_buffer,
         c: *mut fk_buffer,
         flags| unsafe { fk_gemm(op_a, op_b, alpha, a, b, zero, c, flags, null()) };
    ok(call(FK_OP_N, FK_OP_N, one, a.raw(), b.raw(), c.raw(), 0));
    expect_status(
        call(3, FK_OP_N, one, a.raw(), b.raw(), c.raw(), 0),
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_gemm", "op_a = 3"],
    );
    expect_status(
        call(FK_OP_N, -1, one, a.raw(), b.raw(), c.raw(), 0),
        FK_ERROR_INVALID_ARGUMENT,
        &["op_b = -1"],
    );
    expect_status(
        call(FK_OP_N, FK_OP_N, one, a.raw(), b.raw(), c.raw(), 4),
        FK_ERROR_INVALID_ARGUMENT,
        &["flags"],
    );
    expect_status(
        call(
            FK_OP_N,
            FK_OP_N,
            cx(1.0, 1.0).scalar(),
            a.raw(),
            b.raw(),
            c.raw(),
            0,
        ),
        FK_ERROR_INVALID_ARGUMENT,
        &["alpha", "imaginary"],
    );
    expect_status(
        call(FK_OP_N, FK_OP_N, one, null(), b.raw(), c.raw(), 0),
        FK_ERROR_NULL_POINTER,
        &["fk_gemm", "a is NULL"],
    );
    expect_status(
        call(FK_OP_N, FK_OP_N, one, a.raw(), b.raw(), null_mut(), 0),
        FK_ERROR_NULL_POINTER,
        &["c is NULL"],
    );
    // inner dimensions
    expect_status(
        call(FK_OP_T, FK_OP_N, one, a.raw(), b.raw(), c.raw(), 0),
        FK_ERROR_SHAPE_MISMATCH,
        &["op(a)", "inner dimensions", "FK_OP_T"],
    );
    // wrong c
    let c2 = Buf::new(&ctx, f, &[5, 3]);
    expect_status(
        call(FK_OP_N, FK_OP_N, one, a.raw(), b.raw(), c2.raw(), 0),
        FK_ERROR_SHAPE_MISMATCH,
        &["c has shape [5, 3]", "[3, 5]"],
    );
    // dtype
    let bd = Buf::new(&ctx, FK_DTYPE_F64, &[4, 5]);
    expect_status(
        call(FK_OP_N, FK_OP_N, one, a.raw(), bd.raw(), c.raw(), 0),
        FK_ERROR_DTYPE_MISMATCH,
        &["b is f64"],
    );
    // rank
    let v = Buf::new(&ctx, f, &[4]);
    expect_status(
        call(FK_OP_N, FK_OP_N, one, a.raw(), v.raw(), c.raw(), 0),
        FK_ERROR_SHAPE_MISMATCH,
        &["b has shape [4]", "[rows, cols]"],
    );
    // batches
    let a3 = Buf::new(&ctx, f, &[2, 3, 4]);
    let c3 = Buf::new(&ctx, f, &[3, 3, 5]);
    expect_status(
        call(FK_OP_N, FK_OP_N, one, a3.raw(), b.raw(), c3.raw(), 0),
        FK_ERROR_SHAPE_MISMATCH,
        &["a has batch 2", "c has batch 3"],
    );
    // a transposed view (column stride != 1)
    let store = Buf::new(&ctx, f, &[12]);
    let at = unsafe { Buf::wrap(&ctx, store.data(), f, &[3, 4], Some(&[1, 3])) };
    expect_status(
        call(FK_OP_N, FK_OP_N, one, at.raw(), b.raw(), c.raw(), 0),
        FK_ERROR_UNSUPPORTED,
        &["a has strides [1, 3]", "row-major", "fk_copy"],
    );
    // aliasing: c overlaps a
    let big = Buf::new(&ctx, f, &[24]);
    let a_in = unsafe { Buf::wrap(&ctx, big.data(), f, &[3, 4], None) };
    let c_in = unsafe {
        Buf::wrap(
            &ctx,
            (big.data() as *mut f32).add(4) as *mut _,
            f,
            &[3, 5],
            None,
        )
    };
    expect_status(
        call(FK_OP_N, FK_OP_N, one, a_in.raw(), b.raw(), c_in.raw(), 0),
        FK_ERROR_ALIASING,
        &["c overlaps a"],
    );
    // chunked shares the checks
    expect_status(
        unsafe {
            fk_gemm_chunked(
                FK_OP_N,
                9,
                one,
                a.raw(),
                b.raw(),
                zero,
                c.raw(),
                1 << 20,
                0,
                null(),
            )
        },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_gemm_chunked", "op_b = 9"],
    );
}

// ------------------------------------------------------------------ fused linear

fn tol_linear(d: fk_dtype) -> f64 {
    match d {
        FK_DTYPE_F32 => 1e-5,
        _ => 1e-2,
    }
}

#[test]
fn linear_forward_every_act_dtype_and_bias() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(20);
    for dtype in LINEAR_DTYPES {
        for act in ACTS {
            for bias in [true, false] {
                for (lead, k, n) in [
                    (vec![1], 1, 1),
                    (vec![3, 5], 7, 9),
                    (vec![33], 70, 17),
                    (vec![2, 1, 3], 16, 130),
                ] {
                    let c = LinearCase {
                        dtype,
                        act,
                        lead,
                        k,
                        n,
                        bias,
                    };
                    let d = c.data(&mut rng);
                    let out = c.forward(&ctx, &d, null());
                    assert_close(&out.y, &c.y_ref(&d), tol_linear(dtype), &c.describe());
                    if has_aux(act) {
                        let z: Vec<Cx> = c.z_ref(&d).into_iter().map(re).collect();
                        assert_close(
                            out.aux.as_ref().unwrap(),
                            &z,
                            tol_linear(dtype),
                            "aux = pre-activation",
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn linear_backward_matches_the_f64_reference() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(21);
    for dtype in LINEAR_DTYPES {
        for act in ACTS {
            for (lead, k, n) in [(vec![1], 1, 1), (vec![3, 5], 7, 9), (vec![40], 33, 17)] {
                let c = LinearCase {
                    dtype,
                    act,
                    lead,
                    k,
                    n,
                    bias: true,
                };
                let d = c.data(&mut rng);
                let fwd = c.forward(&ctx, &d, null());
                let saved = match act {
                    FK_ACT_RELU => Some(fwd.y.clone()),
                    FK_ACT_GELU_TANH | FK_ACT_GELU_ERF => fwd.aux.clone(),
                    _ => None,
                };
                let g = c.backward(&ctx, &d, saved.as_deref(), null());
                // the reference's z: what the library saved (rounded to dtype) for
                // the GELUs; exact for relu's mask away from ties
                let z: Vec<f64> = match act {
                    FK_ACT_GELU_TANH | FK_ACT_GELU_ERF => {
                        saved.unwrap().iter().map(|v| v.re).collect()
                    }
                    FK_ACT_RELU => {
                        // relu'(z) = [y > 0]: rebuild from the library's y
                        fwd.y
                            .iter()
                            .map(|v| if v.re > 0.0 { 1.0 } else { -1.0 })
                            .collect()
                    }
                    _ => c.z_ref(&d),
                };
                let r = c.grads_ref(&d, &z);
                let what = c.describe();
                assert_close(&g.dx, &r.dx, tol_linear(dtype), &format!("{what}: dx"));
                assert_close(&g.dw, &r.dw, tol_linear(dtype), &format!("{what}: dw"));
                assert_close(&g.db, &r.db, tol_linear(dtype), &format!("{what}: db"));
            }
        }
    }
}

/// The reference derivative formulas against central differences in f64.
#[test]
fn activation_derivatives_match_finite_differences_in_f64() {
    let h = 1e-6;
    let mut z: f64 = -6.0;
    while z <= 6.0 {
        for act in ACTS {
            if act == FK_ACT_RELU && z.abs() < 1e-3 {
                continue; // the kink
            }
            let fd = (act_ref(act, z + h) - act_ref(act, z - h)) / (2.0 * h);
            let an = act_grad_ref(act, z);
            assert!(
                (fd - an).abs() < 1e-8,
                "{} at {z}: formula {an}, differences {fd}",
                act_name(act)
            );
        }
        z += 0.0371;
    }
    // the independent f64 erf against tabulated values (Abramowitz & Stegun 7.1)
    for (x, want) in [
        (0.1, 0.112_462_916_018_284_9),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.5, 0.999_999_256_901_627_7),
    ] {
        assert!((erf_ref(x) - want).abs() < 1e-14, "erf_ref({x})");
        assert!((erf_ref(-x) + want).abs() < 1e-14, "erf_ref(-{x})");
    }
    // and the library's GELUs (the CPU's f32 formulas) against the f64 ones
    use fusekit::testing as cl;
    let mut z = -8.0f32;
    while z <= 8.0 {
        let zd = z as f64;
        for (name, lib, want) in [
            ("gelu_tanh", cl::gelu_tanh(z), gelu_tanh(zd)),
            ("gelu_tanh'", cl::gelu_tanh_grad(z), gelu_tanh_grad(zd)),
            ("gelu_erf", cl::gelu_erf(z), gelu_erf(zd)),
            ("gelu_erf'", cl::gelu_erf_grad(z), gelu_erf_grad(zd)),
        ] {
            assert!((lib as f64 - want).abs() < 1e-6, "{name}({z})");
        }
        z += 0.0173;
    }
    // the two GELUs differ (by up to 4.7e-4 near z = 2.7), far above the tests'
    // f32 tolerances, so neither could pass for the other
    let gap = (gelu_tanh(2.7) - gelu_erf(2.7)).abs();
    assert!(gap > 4e-4, "gelu_tanh(2.7) - gelu_erf(2.7) = {gap}");
}

/// The library's own backward (f32) against central differences of the library's
/// own forward (f32): the directional derivative of `L = sum(y * dy)` along random
/// directions of x, w and b.
#[test]
fn linear_gradients_match_finite_differences_of_the_forward() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(22);
    for act in [FK_ACT_NONE, FK_ACT_GELU_TANH, FK_ACT_GELU_ERF] {
        let c = LinearCase {
            dtype: FK_DTYPE_F32,
            act,
            lead: vec![4, 3],
            k: 6,
            n: 5,
            bias: true,
        };
        let d = c.data(&mut rng);
        let fwd = c.forward(&ctx, &d, null());
        let g = c.backward(&ctx, &d, fwd.aux.as_deref(), null());
        let loss = |d: &LinearData| -> f64 {
            let y = c.forward(&ctx, d, null()).y;
            y.iter().zip(&d.dy).map(|(a, b)| a.re * b.re).sum()
        };
        let h = 1e-2;
        for which in 0..3 {
            let dir: Vec<f64> = (0..[d.x.len(), d.w.len(), d.b.len()][which])
                .map(|_| rng.uniform(-1.0, 1.0))
                .collect();
            let shifted = |s: f64| {
                let mut e = LinearData {
                    x: d.x.clone(),
                    w: d.w.clone(),
                    b: d.b.clone(),
                    dy: d.dy.clone(),
                };
                let v = [&mut e.x, &mut e.w, &mut e.b][which].iter_mut();
                for (v, dv) in v.zip(&dir) {
                    v.re += s * dv;
                }
                e
            };
            let fd = (loss(&shifted(h)) - loss(&shifted(-h))) / (2.0 * h);
            let grad = [&g.dx, &g.dw, &g.db][which];
            let an: f64 = grad.iter().zip(&dir).map(|(g, v)| g.re * v).sum();
            let err = (fd - an).abs() / an.abs().max(1.0);
            assert!(
                err < 2e-3,
                "{} d{}: backward {an}, finite differences {fd}",
                act_name(act),
                ["x", "w", "b"][which]
            );
        }
    }
}

#[test]
fn linear_backward_optional_outputs_and_empty_batches() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(23);
    let c = LinearCase {
        dtype: FK_DTYPE_F32,
        act: FK_ACT_RELU,
        lead: vec![6],
        k: 4,
        n: 3,
        bias: false,
    };
    let d = c.data(&mut rng);
    let fwd = c.forward(&ctx, &d, null());
    let full = c.backward(&ctx, &d, Some(&fwd.y), null());
    let dt = FK_DTYPE_F32;
    let dy = Buf::from_vals(&ctx, dt, &[6, 3], &d.dy);
    let x = Buf::from_vals(&ctx, dt, &[6, 4], &d.x);
    let w = Buf::from_vals(&ctx, dt, &[3, 4], &d.w);
    let y = Buf::from_vals(&ctx, dt, &[6, 3], &fwd.y);
    let db = Buf::new(&ctx, dt, &[3]);
    ok(unsafe {
        fk_linear_backward(
            dy.raw(),
            x.raw(),
            w.raw(),
            FK_ACT_RELU,
            y.raw(),
            null_mut(),
            null_mut(),
            db.raw(),
            null(),
        )
    });
    assert_close(&db.read(), &full.db, 1e-6, "db alone");
    // all outputs NULL: a no-op
    ok(unsafe {
        fk_linear_backward(
            dy.raw(),
            x.raw(),
            w.raw(),
            FK_ACT_RELU,
            y.raw(),
            null_mut(),
            null_mut(),
            null_mut(),
            null(),
        )
    });
    // empty batch
    let x0 = Buf::new(&ctx, dt, &[0, 4]);
    let y0 = Buf::new(&ctx, dt, &[0, 3]);
    ok(unsafe {
        fk_linear_forward(
            x0.raw(),
            w.raw(),
            null(),
            FK_ACT_GELU_ERF,
            y0.raw(),
            null_mut(),
            null(),
        )
    });
    // k = 0: y = act(b)
    let xk = Buf::new(&ctx, dt, &[2, 0]);
    let wk = Buf::new(&ctx, dt, &[3, 0]);
    let b = Buf::from_vals(&ctx, dt, &[3], &[re(-1.0), re(0.5), re(2.0)]);
    let yk = Buf::new(&ctx, dt, &[2, 3]);
    ok(unsafe {
        fk_linear_forward(
            xk.raw(),
            wk.raw(),
            b.raw(),
            FK_ACT_RELU,
            yk.raw(),
            null_mut(),
            null(),
        )
    });
    assert_eq!(
        yk.read(),
        vec![re(0.0), re(0.5), re(2.0), re(0.0), re(0.5), re(2.0)]
    );
}

#[test]
fn linear_aux_size_query() {
    let mut bytes = 7usize;
    for act in [FK_ACT_GELU_TANH, FK_ACT_GELU_ERF] {
        ok(unsafe { fk_linear_aux_size(act, FK_DTYPE_BF16, 3, 5, &mut bytes) });
        assert_eq!(bytes, 30);
        ok(unsafe { fk_linear_aux_size(act, FK_DTYPE_F32, 3, 5, &mut bytes) });
        assert_eq!(bytes, 60);
    }
    for act in [FK_ACT_NONE, FK_ACT_RELU] {
        ok(unsafe { fk_linear_aux_size(act, FK_DTYPE_F16, 3, 5, &mut bytes) });
        assert_eq!(bytes, 0);
    }
    expect_status(
        unsafe { fk_linear_aux_size(FK_ACT_GELU_ERF, FK_DTYPE_F64, 3, 5, &mut bytes) },
        FK_ERROR_UNSUPPORTED_DTYPE,
        &["fk_linear_aux_size", "f64"],
    );
    expect_status(
        unsafe { fk_linear_aux_size(5, FK_DTYPE_F32, 3, 5, &mut bytes) },
        FK_ERROR_INVALID_ARGUMENT,
        &["act = 5"],
    );
    expect_status(
        unsafe { fk_linear_aux_size(FK_ACT_GELU_ERF, 99, 3, 5, &mut bytes) },
        FK_ERROR_INVALID_ARGUMENT,
        &["dtype = 99"],
    );
    expect_status(
        unsafe { fk_linear_aux_size(FK_ACT_GELU_ERF, FK_DTYPE_F32, -1, 5, &mut bytes) },
        FK_ERROR_INVALID_ARGUMENT,
        &["m = -1"],
    );
    expect_status(
        unsafe { fk_linear_aux_size(FK_ACT_GELU_ERF, FK_DTYPE_F32, 3, 5, null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["bytes is NULL"],
    );
}

#[test]
fn linear_bad_inputs_name_the_argument() {
    let ctx = Ctx::cpu();
    let f = FK_DTYPE_F32;
    let x = Buf::new(&ctx, f, &[4, 3]);
    let w = Buf::new(&ctx, f, &[5, 3]);
    let b = Buf::new(&ctx, f, &[5]);
    let y = Buf::new(&ctx, f, &[4, 5]);
    let aux = Buf::new(&ctx, f, &[4, 5]);
    let fwd =
        |x: *const fk_buffer,
         w: *const fk_buffer,
         b: *const fk_buffer,
         act,
         y: *mut fk_buffer,
         aux: *mut fk_buffer| unsafe { fk_linear_forward(x, w, b, act, y, aux, null()) };
    ok(fwd(
        x.raw(),
        w.raw(),
        b.raw(),
        FK_ACT_GELU_ERF,
        y.raw(),
        aux.raw(),
    ));
    expect_status(
        fwd(x.raw(), w.raw(), b.raw(), 4, y.raw(), null_mut()),
        FK_ERROR_INVALID_ARGUMENT,
        &[
            "fk_linear_forward",
            "act = 4 is not a valid fk_activation",
            "FK_ACT_GELU_TANH=2",
            "FK_ACT_GELU_ERF=3",
        ],
    );
    expect_status(
        fwd(x.raw(), w.raw(), b.raw(), -1, y.raw(), null_mut()),
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_linear_forward", "act = -1"],
    );
    expect_status(
        fwd(null(), w.raw(), b.raw(), FK_ACT_NONE, y.raw(), null_mut()),
        FK_ERROR_NULL_POINTER,
        &["x is NULL"],
    );
    expect_status(
        fwd(x.raw(), w.raw(), b.raw(), FK_ACT_RELU, y.raw(), aux.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["aux must be NULL", "FK_ACT_RELU"],
    );
    let w2 = Buf::new(&ctx, f, &[5, 4]);
    expect_status(
        fwd(x.raw(), w2.raw(), b.raw(), FK_ACT_NONE, y.raw(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["w has shape [5, 4]", "3 features"],
    );
    let b2 = Buf::new(&ctx, f, &[4]);
    expect_status(
        fwd(x.raw(), w.raw(), b2.raw(), FK_ACT_NONE, y.raw(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["b has shape [4]", "[5]"],
    );
    let y2 = Buf::new(&ctx, f, &[4, 4]);
    expect_status(
        fwd(x.raw(), w.raw(), b.raw(), FK_ACT_NONE, y2.raw(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["y has shape [4, 4]", "[4, 5]"],
    );
    let aux2 = Buf::new(&ctx, f, &[5, 4]);
    expect_status(
        fwd(
            x.raw(),
            w.raw(),
            b.raw(),
            FK_ACT_GELU_ERF,
            y.raw(),
            aux2.raw(),
        ),
        FK_ERROR_SHAPE_MISMATCH,
        &["aux has shape [5, 4]"],
    );
    let xd = Buf::new(&ctx, FK_DTYPE_F64, &[4, 3]);
    let wd = Buf::new(&ctx, FK_DTYPE_F64, &[5, 3]);
    let yd = Buf::new(&ctx, FK_DTYPE_F64, &[4, 5]);
    expect_status(
        fwd(
            xd.raw(),
            wd.raw(),
            null(),
            FK_ACT_NONE,
            yd.raw(),
            null_mut(),
        ),
        FK_ERROR_UNSUPPORTED_DTYPE,
        &["x has dtype f64", "fk_gemm"],
    );
    let wh = Buf::new(&ctx, FK_DTYPE_BF16, &[5, 3]);
    expect_status(
        fwd(x.raw(), wh.raw(), b.raw(), FK_ACT_NONE, y.raw(), null_mut()),
        FK_ERROR_DTYPE_MISMATCH,
        &["w has dtype bf16"],
    );
    let store = Buf::new(&ctx, f, &[12]);
    let xt = unsafe { Buf::wrap(&ctx, store.data(), f, &[4, 3], Some(&[1, 4])) };
    expect_status(
        fwd(xt.raw(), w.raw(), b.raw(), FK_ACT_NONE, y.raw(), null_mut()),
        FK_ERROR_UNSUPPORTED,
        &["x with shape [4, 3]", "not contiguous"],
    );
    // y overlapping x
    let big = Buf::new(&ctx, f, &[40]);
    let xin = unsafe { Buf::wrap(&ctx, big.data(), f, &[4, 3], None) };
    let yin = unsafe { Buf::wrap(&ctx, big.data(), f, &[4, 5], None) };
    expect_status(
        fwd(
            xin.raw(),
            w.raw(),
            b.raw(),
            FK_ACT_NONE,
            yin.raw(),
            null_mut(),
        ),
        FK_ERROR_ALIASING,
        &["y overlaps x"],
    );

    // backward
    let dy = Buf::new(&ctx, f, &[4, 5]);
    let dx = Buf::new(&ctx, f, &[4, 3]);
    let dw = Buf::new(&ctx, f, &[5, 3]);
    let bwd = |act,
               saved: *const fk_buffer,
               dx: *mut fk_buffer,
               dw: *mut fk_buffer,
               db: *mut fk_buffer| unsafe {
        fk_linear_backward(dy.raw(), x.raw(), w.raw(), act, saved, dx, dw, db, null())
    };
    ok(bwd(
        FK_ACT_GELU_TANH,
        aux.raw(),
        dx.raw(),
        dw.raw(),
        b.raw(),
    ));
    ok(bwd(FK_ACT_GELU_ERF, aux.raw(), dx.raw(), dw.raw(), b.raw()));
    ok(bwd(FK_ACT_NONE, null(), dx.raw(), dw.raw(), b.raw()));
    expect_status(
        bwd(FK_ACT_GELU_ERF, null(), dx.raw(), dw.raw(), b.raw()),
        FK_ERROR_NULL_POINTER,
        &[
            "fk_linear_backward",
            "saved is NULL",
            "FK_ACT_GELU_ERF",
            "pre-activation",
        ],
    );
    expect_status(
        bwd(FK_ACT_RELU, null(), dx.raw(), dw.raw(), b.raw()),
        FK_ERROR_NULL_POINTER,
        &["saved is NULL", "output y"],
    );
    expect_status(
        bwd(FK_ACT_RELU, aux2.raw(), dx.raw(), dw.raw(), b.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["saved has shape [5, 4]"],
    );
    expect_status(
        bwd(FK_ACT_NONE, null(), dw.raw(), null_mut(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["dx has shape [5, 3]"],
    );
    expect_status(
        bwd(FK_ACT_NONE, null(), null_mut(), dx.raw(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["dw has shape [4, 3]"],
    );
    expect_status(
        bwd(FK_ACT_NONE, null(), null_mut(), null_mut(), b2.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["db has shape [4]"],
    );
    expect_status(
        bwd(9, null(), dx.raw(), null_mut(), null_mut()),
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_linear_backward", "act = 9 is not a valid fk_activation"],
    );
    // dx aliasing dw
    let both = Buf::new(&ctx, f, &[15]);
    let dx_a = unsafe { Buf::wrap(&ctx, both.data(), f, &[4, 3], None) };
    let dw_a = unsafe { Buf::wrap(&ctx, both.data(), f, &[5, 3], None) };
    expect_status(
        bwd(FK_ACT_NONE, null(), dx_a.raw(), dw_a.raw(), null_mut()),
        FK_ERROR_ALIASING,
        &["dx overlaps dw"],
    );
    // dy wrong shape
    let dyb = Buf::new(&ctx, f, &[4, 4]);
    expect_status(
        unsafe {
            fk_linear_backward(
                dyb.raw(),
                x.raw(),
                w.raw(),
                FK_ACT_NONE,
                null(),
                dx.raw(),
                null_mut(),
                null_mut(),
                null(),
            )
        },
        FK_ERROR_SHAPE_MISMATCH,
        &["dy has shape [4, 4]"],
    );
}

// ------------------------------------------------------------------ Kronecker

#[test]
fn kron_every_dtype_batched_broadcast_and_strided() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(30);
    let cases: &[(&[i64], &[i64])] = &[
        (&[2, 3], &[4, 5]),
        (&[1, 1], &[3, 2]),
        (&[3, 2, 3], &[3, 4, 1]),
        (&[2, 3], &[3, 2, 2]),    // a broadcast over b's batch
        (&[3, 1, 2], &[1, 2, 3]), // b with batch 1
        (&[7, 5], &[1, 9]),
    ];
    let layouts = [
        ("contiguous", "contiguous"),
        ("transposed", "reversed"),
        ("every-other", "misaligned"),
    ];
    each_kron(&mut rng, cases, &layouts, |dtype, k, what| {
        let got = k.run(&ctx, dtype, null());
        assert_close(&got, &k.reference(), tol(dtype), what);
    });
}

#[test]
fn kron_bad_inputs_name_the_argument() {
    let ctx = Ctx::cpu();
    let f = FK_DTYPE_F32;
    let a = Buf::new(&ctx, f, &[2, 3]);
    let b = Buf::new(&ctx, f, &[4, 5]);
    let out = Buf::new(&ctx, f, &[8, 15]);
    ok(unsafe { fk_kron(a.raw(), b.raw(), out.raw(), null()) });
    let bad = Buf::new(&ctx, f, &[15, 8]);
    expect_status(
        unsafe { fk_kron(a.raw(), b.raw(), bad.raw(), null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &["fk_kron", "out has shape [15, 8]", "[8, 15]"],
    );
    let a3 = Buf::new(&ctx, f, &[2, 2, 3]);
    let b3 = Buf::new(&ctx, f, &[3, 4, 5]);
    let o3 = Buf::new(&ctx, f, &[3, 8, 15]);
    expect_status(
        unsafe { fk_kron(a3.raw(), b3.raw(), o3.raw(), null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &["a has batch 2", "b has batch 3"],
    );
    let v = Buf::new(&ctx, f, &[6]);
    expect_status(
        unsafe { fk_kron(v.raw(), b.raw(), out.raw(), null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &["a has shape [6]"],
    );
    let bd = Buf::new(&ctx, FK_DTYPE_C64, &[4, 5]);
    expect_status(
        unsafe { fk_kron(a.raw(), bd.raw(), out.raw(), null()) },
        FK_ERROR_DTYPE_MISMATCH,
        &["b is complex64"],
    );
    let store = Buf::new(&ctx, f, &[120]);
    let ot = unsafe { Buf::wrap(&ctx, store.data(), f, &[8, 15], Some(&[1, 8])) };
    expect_status(
        unsafe { fk_kron(a.raw(), b.raw(), ot.raw(), null()) },
        FK_ERROR_UNSUPPORTED,
        &["out with shape [8, 15]", "not contiguous"],
    );
    expect_status(
        unsafe { fk_kron(a.raw(), null(), out.raw(), null()) },
        FK_ERROR_NULL_POINTER,
        &["b is NULL"],
    );
}
