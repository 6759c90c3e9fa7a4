//! The multi-layer perceptron (docs/ops.md section 6) on the CPU backend, through
//! the C ABI: the forward against an f64 reference for every activation pair, with
//! and without biases, odd widths, batches of 1, 7 and 1000 and leading shapes of
//! rank 1 to 3; the backward against the f64 reference and against finite
//! differences; skipped and partial gradients; empty batches; the saved-size query;
//! and every bad input with its status and a message naming the argument and layer.

mod common;
mod linalg_ref;
mod mlp_ref;

use std::ptr::{null, null_mut};

use common::*;
use mlp_ref::*;

const DTYPES: [fk_dtype; 3] = [FK_DTYPE_F16, FK_DTYPE_BF16, FK_DTYPE_F32];

/// Norm-relative tolerance of the library against the f64 reference (half types
/// round every layer's output, so a few ulp of their 8 or 11 bits).
fn tol_mlp(d: fk_dtype) -> f64 {
    match d {
        FK_DTYPE_F32 => 2e-5,
        FK_DTYPE_F16 => 1e-2,
        _ => 3e-2,
    }
}

#[test]
fn forward_every_activation_pair_dtype_and_bias() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(60);
    for dtype in DTYPES {
        for acts in act_pairs() {
            for bias in [true, false] {
                for (lead, widths) in [
                    (vec![1], vec![3, 5, 2]),
                    (vec![7], vec![9, 13, 6, 4]),
                    (vec![2, 3], vec![17, 33]),
                ] {
                    let c = MlpCase::new(dtype, &lead, &widths, acts, bias);
                    let d = c.data(&mut rng);
                    let (y, _) = c.forward(&ctx, &d, false, null());
                    let (hs, _) = c.reference(&d);
                    assert_close_reals(&y, hs.last().unwrap(), tol_mlp(dtype), &c.describe());
                    // keeping saved changes nothing in y
                    let (y2, _) = c.forward(&ctx, &d, true, null());
                    assert_eq!(
                        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        y2.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{}: y with saved",
                        c.describe()
                    );
                }
            }
        }
    }
}

#[test]
fn forward_batches_of_1_7_1000_leading_ranks_and_partial_biases() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(61);
    for (lead, widths) in [
        (vec![1], vec![31, 9, 30]),
        (vec![7], vec![5, 130, 3]),
        (vec![1000], vec![12, 20, 7, 1]),
        (vec![2, 5, 3], vec![6, 11, 6]),
        (vec![10, 100], vec![4, 3]),
    ] {
        for acts in [
            (FK_ACT_RELU, FK_ACT_NONE),
            (FK_ACT_GELU_ERF, FK_ACT_GELU_TANH),
        ] {
            let mut c = MlpCase::new(FK_DTYPE_F32, &lead, &widths, acts, true);
            // every other layer without a bias
            for (i, b) in c.bias.iter_mut().enumerate() {
                *b = i % 2 == 0;
            }
            let d = c.data(&mut rng);
            let (y, _) = c.forward(&ctx, &d, true, null());
            let (hs, _) = c.reference(&d);
            assert_close_reals(&y, hs.last().unwrap(), 2e-5, &c.describe());
        }
    }
}

#[test]
fn backward_matches_the_f64_reference_for_every_activation_pair() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(62);
    for dtype in DTYPES {
        for acts in act_pairs() {
            for (lead, widths) in [
                (vec![1], vec![3, 5, 2]),
                (vec![3, 5], vec![9, 13, 6, 4]),
                (vec![40], vec![20, 7]),
            ] {
                let c = MlpCase::new(dtype, &lead, &widths, acts, true);
                let d = c.data(&mut rng);
                let (_, saved) = c.forward(&ctx, &d, true, null());
                let g = c.backward(&ctx, &d, saved.as_ref(), &Want::all(c.layers()), null());
                let r = c.reference_grads_on(&ctx, &d);
                check_grads(&g, &r, 2.0 * tol_mlp(dtype), &c.describe());
            }
        }
    }
}

#[test]
fn backward_on_large_batches_and_odd_widths() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(63);
    for (lead, widths, acts) in [
        (
            vec![1000],
            vec![13, 31, 9, 5],
            (FK_ACT_RELU, FK_ACT_GELU_ERF),
        ),
        (
            vec![7, 3, 2],
            vec![8, 129, 3],
            (FK_ACT_GELU_TANH, FK_ACT_RELU),
        ),
    ] {
        let c = MlpCase::new(FK_DTYPE_F32, &lead, &widths, acts, false);
        let d = c.data(&mut rng);
        let (_, saved) = c.forward(&ctx, &d, true, null());
        let g = c.backward(&ctx, &d, saved.as_ref(), &Want::all(c.layers()), null());
        check_grads(&g, &c.reference_grads_on(&ctx, &d), 5e-5, &c.describe());
    }
}

/// The reference backward against central differences of the reference forward
/// (f64), then the library's gradients against central differences of the
/// library's own f32 forward, for the smooth activations.
#[test]
fn gradients_match_finite_differences() {
    let mut rng = Rng::new(64);
    // loss = sum(dy * y)
    let loss = |c: &MlpCase, d: &MlpData| -> f64 {
        let (hs, _) = c.reference(d);
        hs.last()
            .unwrap()
            .iter()
            .zip(&d.dy)
            .map(|(a, b)| a * b)
            .sum()
    };
    for acts in act_pairs() {
        // f32 data; the reference runs in f64 without rounding f32 outputs
        let c = MlpCase::new(FK_DTYPE_F32, &[3], &[4, 5, 3, 2], acts, true);
        let mut d = c.data(&mut rng);
        let (hs, zs) = c.reference(&d);
        let r = c.reference_grads(&d, &hs, &zs);
        let h = 1e-6;
        for i in 0..c.layers() {
            for e in [0, d.w[i].len() / 2, d.w[i].len() - 1] {
                let v = d.w[i][e];
                d.w[i][e] = v + h;
                let up = loss(&c, &d);
                d.w[i][e] = v - h;
                let down = loss(&c, &d);
                d.w[i][e] = v;
                let fd = (up - down) / (2.0 * h);
                let got = r.dw[i].as_ref().unwrap()[e];
                assert!(
                    (fd - got).abs() <= 1e-6 * (1.0 + fd.abs()),
                    "{}: dweights[{i}][{e}] reference {got} vs finite difference {fd}",
                    c.describe()
                );
            }
            let b = d.b[i].as_ref().unwrap();
            let e = b.len() / 2;
            let v = b[e];
            d.b[i].as_mut().unwrap()[e] = v + h;
            let up = loss(&c, &d);
            d.b[i].as_mut().unwrap()[e] = v - h;
            let down = loss(&c, &d);
            d.b[i].as_mut().unwrap()[e] = v;
            let got = r.db[i].as_ref().unwrap()[e];
            let fd = (up - down) / (2.0 * h);
            assert!(
                (fd - got).abs() <= 1e-6 * (1.0 + fd.abs()),
                "{}: dbiases[{i}][{e}] reference {got} vs finite difference {fd}",
                c.describe()
            );
        }
        let e = d.x.len() / 2;
        let v = d.x[e];
        d.x[e] = v + h;
        let up = loss(&c, &d);
        d.x[e] = v - h;
        let down = loss(&c, &d);
        d.x[e] = v;
        let got = r.dx.as_ref().unwrap()[e];
        let fd = (up - down) / (2.0 * h);
        assert!(
            (fd - got).abs() <= 1e-6 * (1.0 + fd.abs()),
            "{}: dx[{e}] reference {got} vs finite difference {fd}",
            c.describe()
        );
    }
    // the library: f32, smooth activations, a larger step
    let ctx = Ctx::cpu();
    for acts in [
        (FK_ACT_GELU_TANH, FK_ACT_GELU_ERF),
        (FK_ACT_GELU_ERF, FK_ACT_NONE),
        (FK_ACT_NONE, FK_ACT_GELU_TANH),
    ] {
        let c = MlpCase::new(FK_DTYPE_F32, &[4], &[3, 6, 5, 2], acts, true);
        let mut d = c.data(&mut rng);
        let lib_loss = |d: &MlpData| -> f64 {
            let (y, _) = c.forward(&ctx, d, false, null());
            y.iter().zip(&d.dy).map(|(a, b)| a * b).sum()
        };
        let (_, saved) = c.forward(&ctx, &d, true, null());
        let g = c.backward(&ctx, &d, saved.as_ref(), &Want::all(c.layers()), null());
        let h = 1e-2;
        for i in 0..c.layers() {
            for e in [0, d.w[i].len() - 1] {
                let v = d.w[i][e];
                d.w[i][e] = v + h;
                let up = lib_loss(&d);
                d.w[i][e] = v - h;
                let down = lib_loss(&d);
                d.w[i][e] = v;
                let fd = (up - down) / (2.0 * h);
                let got = g.dw[i].as_ref().unwrap()[e];
                assert!(
                    (fd - got).abs() <= 2e-3 * (1.0 + fd.abs()),
                    "{}: dweights[{i}][{e}] {got} vs finite difference {fd}",
                    c.describe()
                );
            }
        }
    }
}

#[test]
fn skipped_and_partial_gradients() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(65);
    let c = MlpCase::new(
        FK_DTYPE_F32,
        &[5],
        &[6, 7, 8, 9, 4],
        (FK_ACT_RELU, FK_ACT_GELU_TANH),
        true,
    );
    let d = c.data(&mut rng);
    let (_, saved) = c.forward(&ctx, &d, true, null());
    let full = c.backward(&ctx, &d, saved.as_ref(), &Want::all(4), null());
    let wants = [
        // dx skipped, everything else
        Want {
            dx: false,
            dw: vec![true; 4],
            db: vec![true; 4],
        },
        // only the top layer's weight gradient
        Want {
            dx: false,
            dw: vec![false, false, false, true],
            db: vec![false; 4],
        },
        // one middle bias, one low weight
        Want {
            dx: false,
            dw: vec![false, true, false, false],
            db: vec![false, false, true, false],
        },
        // only dx
        Want {
            dx: true,
            dw: vec![false; 4],
            db: vec![false; 4],
        },
    ];
    for (j, w) in wants.iter().enumerate() {
        let g = c.backward(&ctx, &d, saved.as_ref(), w, null());
        assert_eq!(g.dx.is_some(), w.dx);
        // same bits as the full backward for every gradient asked for
        let bits = |v: &Option<Vec<f64>>| {
            v.as_ref()
                .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
        };
        if w.dx {
            assert_eq!(bits(&g.dx), bits(&full.dx), "want {j}: dx");
        }
        for i in 0..4 {
            if w.dw[i] {
                assert_eq!(bits(&g.dw[i]), bits(&full.dw[i]), "want {j}: dweights[{i}]");
            }
            if w.db[i] {
                assert_eq!(bits(&g.db[i]), bits(&full.db[i]), "want {j}: dbiases[{i}]");
            }
        }
    }
    // NULL arrays and dx: nothing wanted is a no-op
    let x = Buf::from_reals(&ctx, c.dtype, &c.x_shape(), &d.x);
    let dy = Buf::from_reals(&ctx, c.dtype, &c.y_shape(), &d.dy);
    let (ws, _) = c.params(&ctx, &d);
    let wp: Vec<*const fk_buffer> = ws.iter().map(|w| w.raw() as *const _).collect();
    ok(unsafe {
        fk_mlp_backward(
            dy.raw(),
            x.raw(),
            4,
            wp.as_ptr(),
            c.hidden,
            c.out,
            0,
            saved.as_ref().unwrap().raw(),
            null_mut(),
            null(),
            null(),
            null(),
        )
    });
}

#[test]
fn one_plain_layer_needs_no_saved_and_tf32_is_ignored_on_the_cpu() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(66);
    let mut c = MlpCase::new(
        FK_DTYPE_F32,
        &[4, 2],
        &[5, 3],
        (FK_ACT_RELU, FK_ACT_NONE),
        true,
    );
    assert_eq!(c.saved_size(&ctx), 0);
    let d = c.data(&mut rng);
    let g = c.backward(&ctx, &d, None, &Want::all(1), null());
    check_grads(
        &g,
        &c.reference_grads_on(&ctx, &d),
        2e-5,
        "one layer, saved NULL",
    );
    c.flags = FK_GEMM_ALLOW_TF32;
    let (y, _) = c.forward(&ctx, &d, false, null());
    let (hs, _) = c.reference(&d);
    assert_close_reals(&y, &hs[1], 2e-5, "TF32 flag on the CPU");
}

#[test]
fn empty_batches_write_zero_gradients() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(67);
    for lead in [vec![0], vec![3, 0]] {
        let c = MlpCase::new(
            FK_DTYPE_BF16,
            &lead,
            &[3, 4, 2],
            (FK_ACT_GELU_ERF, FK_ACT_RELU),
            true,
        );
        assert_eq!(c.saved_size(&ctx), 0);
        let d = c.data(&mut rng);
        let (y, saved) = c.forward(&ctx, &d, true, null());
        assert!(y.is_empty());
        let g = c.backward(&ctx, &d, saved.as_ref(), &Want::all(2), null());
        for i in 0..2 {
            assert!(g.dw[i].as_ref().unwrap().iter().all(|&v| v == 0.0));
            assert!(g.db[i].as_ref().unwrap().iter().all(|&v| v == 0.0));
        }
        assert!(g.dx.unwrap().is_empty());
    }
}

#[test]
fn saved_size_query() {
    let ctx = Ctx::cpu();
    let size = |widths: &[i64], rows: i64, dtype, h, o| {
        let mut b = usize::MAX;
        let s = unsafe {
            fk_mlp_saved_size(
                ctx.0,
                widths.len() as i32 - 1,
                widths.as_ptr(),
                rows,
                dtype,
                h,
                o,
                &mut b,
            )
        };
        (s, b)
    };
    // one plain layer: nothing
    assert_eq!(
        size(&[5, 3], 10, FK_DTYPE_F32, FK_ACT_RELU, FK_ACT_NONE),
        (FK_OK, 0)
    );
    // ReLU output: a bit per element, rows padded to 128 bits: 10 rows x 16 bytes
    assert_eq!(
        size(&[5, 3], 10, FK_DTYPE_F32, FK_ACT_NONE, FK_ACT_RELU),
        (FK_OK, 256)
    );
    // GELU output: 10 rows x 8 (3 padded) x 2 bytes = 160 -> 256
    assert_eq!(
        size(&[5, 3], 10, FK_DTYPE_F16, FK_ACT_NONE, FK_ACT_GELU_ERF),
        (FK_OK, 256)
    );
    // two layers, relu hidden (1000 x 300: 1000 x 384 bits = 48000 bytes -> 48128),
    // hidden output 1000 x 300 x 4 = 1200000, none on top
    assert_eq!(
        size(&[7, 300, 2], 1000, FK_DTYPE_F32, FK_ACT_RELU, FK_ACT_NONE),
        (FK_OK, 48128 + 1200128)
    );
    // compact: the relu mask is 1/32 of a GELU's f32 pre-activation
    let (_, relu) = size(&[64, 4096, 1], 4096, FK_DTYPE_F32, FK_ACT_RELU, FK_ACT_NONE);
    let (_, gelu) = size(
        &[64, 4096, 1],
        4096,
        FK_DTYPE_F32,
        FK_ACT_GELU_TANH,
        FK_ACT_NONE,
    );
    let hidden = 4096 * 4096 * 4;
    assert_eq!(relu - hidden, 4096 * 4096 / 8);
    assert_eq!(gelu - hidden, 4096 * 4096 * 4);
    let mut b = 0usize;
    let w = [5i64, 3];
    let call = |ctx: *const fk_context, n: i32, w: *const i64, rows, d, h, o, out: *mut usize| unsafe {
        fk_mlp_saved_size(ctx, n, w, rows, d, h, o, out)
    };
    let (f32_, relu_, none_) = (FK_DTYPE_F32, FK_ACT_RELU, FK_ACT_NONE);
    expect_status(
        call(ctx.0, 0, w.as_ptr(), 1, f32_, relu_, none_, &mut b),
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_mlp_saved_size", "n_layers = 0", "FK_MLP_MAX_LAYERS"],
    );
    expect_status(
        call(ctx.0, 65, w.as_ptr(), 1, f32_, relu_, none_, &mut b),
        FK_ERROR_INVALID_ARGUMENT,
        &["n_layers = 65 is outside 1..=64"],
    );
    expect_status(
        call(ctx.0, 1, null(), 1, f32_, relu_, none_, &mut b),
        FK_ERROR_NULL_POINTER,
        &["widths is NULL"],
    );
    expect_status(
        call(ctx.0, 1, w.as_ptr(), -1, f32_, relu_, none_, &mut b),
        FK_ERROR_INVALID_ARGUMENT,
        &["rows = -1"],
    );
    let neg = [5i64, -3];
    expect_status(
        call(ctx.0, 1, neg.as_ptr(), 1, f32_, relu_, none_, &mut b),
        FK_ERROR_INVALID_ARGUMENT,
        &["widths[1] = -3"],
    );
    expect_status(
        call(ctx.0, 1, w.as_ptr(), 1, FK_DTYPE_F64, relu_, none_, &mut b),
        FK_ERROR_UNSUPPORTED_DTYPE,
        &["dtype has dtype f64"],
    );
    expect_status(
        call(ctx.0, 1, w.as_ptr(), 1, f32_, 7, none_, &mut b),
        FK_ERROR_INVALID_ARGUMENT,
        &["hidden_act = 7 is not a valid fk_activation"],
    );
    expect_status(
        call(ctx.0, 1, w.as_ptr(), 1, f32_, relu_, -2, &mut b),
        FK_ERROR_INVALID_ARGUMENT,
        &["out_act = -2 is not a valid fk_activation"],
    );
    expect_status(
        call(null(), 1, w.as_ptr(), 1, f32_, relu_, none_, &mut b),
        FK_ERROR_NULL_POINTER,
        &["ctx is NULL"],
    );
    expect_status(
        call(ctx.0, 1, w.as_ptr(), 1, f32_, relu_, none_, null_mut()),
        FK_ERROR_NULL_POINTER,
        &["bytes is NULL"],
    );
    assert_eq!(FK_MLP_MAX_LAYERS, 64);
}

/// A three-layer network's buffers for the bad-input tests: x [4, 6], weights
/// [8, 6], [8, 8], [3, 8], biases [8], [8], [3], y [4, 3].
struct Net {
    ctx: Ctx,
    x: Buf,
    w: Vec<Buf>,
    b: Vec<Buf>,
    y: Buf,
    dy: Buf,
    saved: Buf,
}

impl Net {
    fn new() -> Net {
        let ctx = Ctx::cpu();
        let c = MlpCase::new(
            FK_DTYPE_F32,
            &[4],
            &[6, 8, 8, 3],
            (FK_ACT_RELU, FK_ACT_GELU_TANH),
            true,
        );
        let mut rng = Rng::new(68);
        let d = c.data(&mut rng);
        let x = Buf::from_reals(&ctx, FK_DTYPE_F32, &[4, 6], &d.x);
        let (w, b) = c.params(&ctx, &d);
        let b = b.into_iter().map(Option::unwrap).collect();
        let y = Buf::new(&ctx, FK_DTYPE_F32, &[4, 3]);
        let dy = Buf::from_reals(&ctx, FK_DTYPE_F32, &[4, 3], &d.dy);
        let saved = c.saved_buf(&ctx, null());
        Net {
            ctx,
            x,
            w,
            b,
            y,
            dy,
            saved,
        }
    }
    fn wp(&self) -> Vec<*const fk_buffer> {
        self.w.iter().map(|w| w.raw() as *const _).collect()
    }
    fn bp(&self) -> Vec<*const fk_buffer> {
        self.b.iter().map(|b| b.raw() as *const _).collect()
    }
    /// The forward with `w` and `b` as the weight and bias arrays.
    fn fwd(
        &self,
        w: &[*const fk_buffer],
        b: &[*const fk_buffer],
        saved: *mut fk_buffer,
    ) -> fk_status {
        unsafe {
            fk_mlp_forward(
                self.x.raw(),
                3,
                w.as_ptr(),
                b.as_ptr(),
                FK_ACT_RELU,
                FK_ACT_GELU_TANH,
                0,
                self.y.raw(),
                saved,
                null(),
            )
        }
    }
    fn bwd(
        &self,
        w: &[*const fk_buffer],
        saved: *const fk_buffer,
        dx: *mut fk_buffer,
        dw: &[*mut fk_buffer],
        db: &[*mut fk_buffer],
    ) -> fk_status {
        unsafe {
            fk_mlp_backward(
                self.dy.raw(),
                self.x.raw(),
                3,
                w.as_ptr(),
                FK_ACT_RELU,
                FK_ACT_GELU_TANH,
                0,
                saved,
                dx,
                dw.as_ptr(),
                db.as_ptr(),
                null(),
            )
        }
    }
}

#[test]
fn forward_bad_inputs_name_the_argument_and_the_layer() {
    let n = Net::new();
    let ctx = &n.ctx;
    ok(n.fwd(&n.wp(), &n.bp(), n.saved.raw()));
    // a weight that does not chain
    let bad = Buf::new(ctx, FK_DTYPE_F32, &[3, 7]);
    let mut w = n.wp();
    w[2] = bad.raw();
    expect_status(
        n.fwd(&w, &n.bp(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &[
            "fk_mlp_forward: weights[2] has shape [3, 7] but layer 2 takes 8 inputs (layer 1 gives 8)",
        ],
    );
    let bad0 = Buf::new(ctx, FK_DTYPE_F32, &[8, 5]);
    let mut w = n.wp();
    w[0] = bad0.raw();
    expect_status(
        n.fwd(&w, &n.bp(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["weights[0] has shape [8, 5] but layer 0 takes 6 inputs (x [4, 6] has 6 features)"],
    );
    // a weight that is not a matrix
    let flat = Buf::new(ctx, FK_DTYPE_F32, &[64]);
    let mut w = n.wp();
    w[1] = flat.raw();
    expect_status(
        n.fwd(&w, &n.bp(), null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &["weights[1] has shape [64]", "layer 1"],
    );
    // mixed dtypes
    let half = Buf::new(ctx, FK_DTYPE_F16, &[8, 8]);
    let mut w = n.wp();
    w[1] = half.raw();
    expect_status(
        n.fwd(&w, &n.bp(), null_mut()),
        FK_ERROR_DTYPE_MISMATCH,
        &["weights[1] has dtype f16 but x has dtype f32"],
    );
    let halfb = Buf::new(ctx, FK_DTYPE_F16, &[8]);
    let mut b = n.bp();
    b[0] = halfb.raw();
    expect_status(
        n.fwd(&n.wp(), &b, null_mut()),
        FK_ERROR_DTYPE_MISMATCH,
        &["biases[0] has dtype f16 but x has dtype f32"],
    );
    // a bias of the wrong length
    let short = Buf::new(ctx, FK_DTYPE_F32, &[7]);
    let mut b = n.bp();
    b[1] = short.raw();
    expect_status(
        n.fwd(&n.wp(), &b, null_mut()),
        FK_ERROR_SHAPE_MISMATCH,
        &[
            "biases[1] has shape [7] but layer 1 has 8 outputs (weights[1] is [8, 8]): it must be [8]",
        ],
    );
    // NULL entries: a bias may be missing, a weight may not
    let mut b = n.bp();
    b[2] = null();
    ok(n.fwd(&n.wp(), &b, null_mut()));
    let mut w = n.wp();
    w[1] = null();
    expect_status(
        n.fwd(&w, &n.bp(), null_mut()),
        FK_ERROR_NULL_POINTER,
        &["fk_mlp_forward: weights[1] is NULL"],
    );
    // NULL arrays: biases may be, weights may not
    let s = unsafe {
        fk_mlp_forward(
            n.x.raw(),
            3,
            n.wp().as_ptr(),
            null(),
            FK_ACT_RELU,
            FK_ACT_NONE,
            0,
            n.y.raw(),
            null_mut(),
            null(),
        )
    };
    ok(s);
    let call = |nl: i32, w: *const *const fk_buffer, h, o, flags, y: *mut fk_buffer| unsafe {
        fk_mlp_forward(n.x.raw(), nl, w, null(), h, o, flags, y, null_mut(), null())
    };
    let wp = n.wp();
    expect_status(
        call(3, null(), FK_ACT_RELU, FK_ACT_NONE, 0, n.y.raw()),
        FK_ERROR_NULL_POINTER,
        &["weights is NULL"],
    );
    // n_layers 0 or above the maximum
    expect_status(
        call(0, wp.as_ptr(), FK_ACT_RELU, FK_ACT_NONE, 0, n.y.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["n_layers = 0 is outside 1..=64 (FK_MLP_MAX_LAYERS)"],
    );
    expect_status(
        call(65, wp.as_ptr(), FK_ACT_RELU, FK_ACT_NONE, 0, n.y.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["n_layers = 65"],
    );
    // unknown activations and flags
    expect_status(
        call(3, wp.as_ptr(), 4, FK_ACT_NONE, 0, n.y.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["hidden_act = 4 is not a valid fk_activation"],
    );
    expect_status(
        call(3, wp.as_ptr(), FK_ACT_RELU, 9, 0, n.y.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["out_act = 9"],
    );
    expect_status(
        call(3, wp.as_ptr(), FK_ACT_RELU, FK_ACT_NONE, 6, n.y.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["flags = 0x6 has unknown bits"],
    );
    // y of the wrong shape or dtype; NULL y
    let y5 = Buf::new(ctx, FK_DTYPE_F32, &[4, 5]);
    expect_status(
        call(3, wp.as_ptr(), FK_ACT_RELU, FK_ACT_NONE, 0, y5.raw()),
        FK_ERROR_SHAPE_MISMATCH,
        &["y has shape [4, 5] but must be [4, 3]", "layer 2 gives 3"],
    );
    let yh = Buf::new(ctx, FK_DTYPE_BF16, &[4, 3]);
    expect_status(
        call(3, wp.as_ptr(), FK_ACT_RELU, FK_ACT_NONE, 0, yh.raw()),
        FK_ERROR_DTYPE_MISMATCH,
        &["y has dtype bf16 but x has dtype f32"],
    );
    expect_status(
        call(3, wp.as_ptr(), FK_ACT_RELU, FK_ACT_NONE, 0, null_mut()),
        FK_ERROR_NULL_POINTER,
        &["y is NULL"],
    );
    // unsupported dtype
    let x64 = Buf::new(ctx, FK_DTYPE_F64, &[4, 6]);
    let s = unsafe {
        fk_mlp_forward(
            x64.raw(),
            3,
            wp.as_ptr(),
            null(),
            FK_ACT_RELU,
            FK_ACT_NONE,
            0,
            n.y.raw(),
            null_mut(),
            null(),
        )
    };
    expect_status(s, FK_ERROR_UNSUPPORTED_DTYPE, &["x has dtype f64"]);
    // saved too small, overlapping, misaligned
    let small = Buf::new(ctx, FK_DTYPE_F32, &[4]);
    expect_status(
        n.fwd(&n.wp(), &n.bp(), small.raw()),
        FK_ERROR_BUFFER_TOO_SMALL,
        &[
            "saved holds 16 bytes but this call needs",
            "fk_mlp_saved_size",
        ],
    );
    expect_status(
        n.fwd(&n.wp(), &n.bp(), n.w[1].raw()),
        FK_ERROR_BUFFER_TOO_SMALL,
        &["saved holds 256 bytes"],
    );
    let big = Buf::new(ctx, FK_DTYPE_F32, &[4096]);
    let off = unsafe { big.wrap_range(ctx, 1, 4000) };
    expect_status(
        n.fwd(&n.wp(), &n.bp(), off.raw()),
        FK_ERROR_INVALID_ARGUMENT,
        &["saved starts at", "not a multiple of 16 bytes"],
    );
    let y_alias = unsafe { big.wrap_range(ctx, 0, 12) };
    let y_view = unsafe { Buf::wrap(ctx, y_alias.data(), FK_DTYPE_F32, &[4, 3], None) };
    let s = unsafe {
        fk_mlp_forward(
            n.x.raw(),
            3,
            wp.as_ptr(),
            n.bp().as_ptr(),
            FK_ACT_RELU,
            FK_ACT_GELU_TANH,
            0,
            y_view.raw(),
            big.raw(),
            null(),
        )
    };
    expect_status(s, FK_ERROR_ALIASING, &["saved overlaps y"]);
    // y overlapping an input
    let s = unsafe {
        let xv = Buf::wrap(ctx, n.x.data(), FK_DTYPE_F32, &[4, 3], None);
        let s = fk_mlp_forward(
            n.x.raw(),
            3,
            wp.as_ptr(),
            null(),
            FK_ACT_RELU,
            FK_ACT_NONE,
            0,
            xv.raw(),
            null_mut(),
            null(),
        );
        drop(xv);
        s
    };
    expect_status(s, FK_ERROR_ALIASING, &["y overlaps x"]);
    // a non-contiguous weight
    let strided = unsafe { Buf::wrap(ctx, big.data(), FK_DTYPE_F32, &[8, 8], Some(&[16, 1])) };
    let mut w = n.wp();
    w[1] = strided.raw();
    expect_status(
        n.fwd(&w, &n.bp(), null_mut()),
        FK_ERROR_UNSUPPORTED,
        &["weights[1] with shape [8, 8] and strides [16, 1] is not contiguous"],
    );
}

#[test]
fn backward_bad_inputs_name_the_argument_and_the_layer() {
    let n = Net::new();
    let ctx = &n.ctx;
    ok(n.fwd(&n.wp(), &n.bp(), n.saved.raw()));
    let dw: Vec<Buf> =
        n.w.iter()
            .map(|w| Buf::new(ctx, FK_DTYPE_F32, &w.shape()))
            .collect();
    let db: Vec<Buf> =
        n.b.iter()
            .map(|b| Buf::new(ctx, FK_DTYPE_F32, &b.shape()))
            .collect();
    let dx = Buf::new(ctx, FK_DTYPE_F32, &[4, 6]);
    let dwp = || dw.iter().map(|b| b.raw()).collect::<Vec<_>>();
    let dbp = || db.iter().map(|b| b.raw()).collect::<Vec<_>>();
    ok(n.bwd(&n.wp(), n.saved.raw(), dx.raw(), &dwp(), &dbp()));
    // a gradient of the wrong shape, naming its layer
    let wrong = Buf::new(ctx, FK_DTYPE_F32, &[8, 7]);
    let mut g = dwp();
    g[1] = wrong.raw();
    expect_status(
        n.bwd(&n.wp(), n.saved.raw(), dx.raw(), &g, &dbp()),
        FK_ERROR_SHAPE_MISMATCH,
        &["fk_mlp_backward: dweights[1] has shape [8, 7] but weights[1] has [8, 8]"],
    );
    let wrongb = Buf::new(ctx, FK_DTYPE_F32, &[4]);
    let mut g = dbp();
    g[2] = wrongb.raw();
    expect_status(
        n.bwd(&n.wp(), n.saved.raw(), dx.raw(), &dwp(), &g),
        FK_ERROR_SHAPE_MISMATCH,
        &["dbiases[2] has shape [4] but layer 2 has 3 outputs"],
    );
    let halfg = Buf::new(ctx, FK_DTYPE_F16, &[8, 6]);
    let mut g = dwp();
    g[0] = halfg.raw();
    expect_status(
        n.bwd(&n.wp(), n.saved.raw(), dx.raw(), &g, &dbp()),
        FK_ERROR_DTYPE_MISMATCH,
        &["dweights[0] has dtype f16 but x has dtype f32"],
    );
    // weights that do not chain, in the backward too
    let bad = Buf::new(ctx, FK_DTYPE_F32, &[3, 9]);
    let mut w = n.wp();
    w[2] = bad.raw();
    expect_status(
        n.bwd(&w, n.saved.raw(), null_mut(), &dwp(), &dbp()),
        FK_ERROR_SHAPE_MISMATCH,
        &["weights[2] has shape [3, 9] but layer 2 takes 8 inputs (layer 1 gives 8)"],
    );
    // dx of the wrong shape
    let dx5 = Buf::new(ctx, FK_DTYPE_F32, &[4, 5]);
    expect_status(
        n.bwd(&n.wp(), n.saved.raw(), dx5.raw(), &dwp(), &dbp()),
        FK_ERROR_SHAPE_MISMATCH,
        &["dx has shape [4, 5] but x has [4, 6]"],
    );
    // saved missing or too small
    expect_status(
        n.bwd(&n.wp(), null(), dx.raw(), &dwp(), &dbp()),
        FK_ERROR_NULL_POINTER,
        &[
            "saved is NULL but the backward of this network (3 layers",
            "needs the",
        ],
    );
    let small = Buf::new(ctx, FK_DTYPE_F32, &[8]);
    expect_status(
        n.bwd(&n.wp(), small.raw(), dx.raw(), &dwp(), &dbp()),
        FK_ERROR_BUFFER_TOO_SMALL,
        &["saved holds 32 bytes"],
    );
    // outputs overlapping inputs or each other
    let mut g = dwp();
    g[1] = dw[2].raw();
    let s = n.bwd(&n.wp(), n.saved.raw(), dx.raw(), &g, &dbp());
    assert_ne!(s, FK_OK);
    let mut g = dwp();
    g[0] = n.w[0].raw();
    expect_status(
        n.bwd(&n.wp(), n.saved.raw(), dx.raw(), &g, &dbp()),
        FK_ERROR_ALIASING,
        &["dweights[0] overlaps weights[0]"],
    );
    let same = unsafe { Buf::wrap(ctx, dw[1].data(), FK_DTYPE_F32, &[8], None) };
    let mut g = dbp();
    g[0] = same.raw();
    expect_status(
        n.bwd(&n.wp(), n.saved.raw(), dx.raw(), &dwp(), &g),
        FK_ERROR_ALIASING,
        &["dbiases[0] overlaps dweights[1]"],
    );
    let mut g = dwp();
    g[2] = n.saved.raw();
    let s = n.bwd(&n.wp(), n.saved.raw(), dx.raw(), &g, &dbp());
    assert_ne!(s, FK_OK, "a gradient in saved");
    // dy of the wrong shape
    let dy4 = Buf::new(ctx, FK_DTYPE_F32, &[4, 4]);
    let s = unsafe {
        fk_mlp_backward(
            dy4.raw(),
            n.x.raw(),
            3,
            n.wp().as_ptr(),
            FK_ACT_RELU,
            FK_ACT_GELU_TANH,
            0,
            n.saved.raw(),
            dx.raw(),
            null(),
            null(),
            null(),
        )
    };
    expect_status(
        s,
        FK_ERROR_SHAPE_MISMATCH,
        &["dy has shape [4, 4] but must be [4, 3]"],
    );
    // a NULL dweights entry is not wanted; unknown flags and activations
    let mut g = dwp();
    g[0] = null_mut();
    ok(n.bwd(&n.wp(), n.saved.raw(), dx.raw(), &g, &dbp()));
    let s = unsafe {
        fk_mlp_backward(
            n.dy.raw(),
            n.x.raw(),
            3,
            n.wp().as_ptr(),
            FK_ACT_RELU,
            FK_ACT_GELU_TANH,
            8,
            n.saved.raw(),
            dx.raw(),
            null(),
            null(),
            null(),
        )
    };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_mlp_backward", "flags = 0x8"],
    );
    let s = unsafe {
        fk_mlp_backward(
            n.dy.raw(),
            n.x.raw(),
            0,
            n.wp().as_ptr(),
            FK_ACT_RELU,
            FK_ACT_GELU_TANH,
            0,
            n.saved.raw(),
            dx.raw(),
            null(),
            null(),
            null(),
        )
    };
    expect_status(s, FK_ERROR_INVALID_ARGUMENT, &["n_layers = 0"]);
}
