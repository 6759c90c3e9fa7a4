//! The elementwise family (docs/ops.md section 1) on the CPU backend, through the C ABI:
//! every op and dtype against an f64 reference written here from the formulas,
//! broadcasting, strided inputs and outputs, in-place, empty tensors, IEEE
//! specials, the rayon-parallel path, and every bad-input status with its message.

mod common;
mod elementwise_table;

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use common::*;
use elementwise_table::*;

/// Every op on every dtype (`Op::every_with_dtype`), each on random operands in every
/// layout triple (a, b, out) of `views` in turn, checked against the f64 reference.
fn check_every_op(ctx: &Ctx, r: &mut Rng, views: &[(View, View, View)], stream: *const fk_stream) {
    for (op, dtype) in Op::every_with_dtype() {
        for (va, vb, out) in views {
            let ab = (va.clone(), vb.clone());
            check_random_case(ctx, r, (op, dtype), ab, out, stream);
        }
    }
}

/// `check_every_op` on a CPU context with operands drawn from `Rng::new(seed)`.
fn check_every_op_on_cpu(seed: u64, views: &[(View, View, View)]) {
    check_every_op(&Ctx::cpu(), &mut Rng::new(seed), views, null());
}

/// (a, b, out) all contiguous of `shape`.
fn contiguous3(shape: &[i64]) -> [(View, View, View); 1] {
    let v = View::contiguous(shape);
    [(v.clone(), v.clone(), v)]
}

#[test]
fn every_op_every_dtype_matches_the_f64_reference() {
    let ctx = Ctx::cpu();
    let mut r = Rng::new(1);
    for &shape in &[&[][..], &[1][..], &[37][..], &[5, 7][..], &[2, 3, 4][..]] {
        check_every_op(&ctx, &mut r, &contiguous3(shape), null());
    }
}

#[test]
fn every_op_runs_on_a_cpu_stream() {
    let ctx = Ctx::cpu();
    let stream = Stream::new(&ctx);
    let mut r = Rng::new(2);
    check_every_op(&ctx, &mut r, &contiguous3(&[4, 6]), stream.raw());
}

#[test]
fn binary_broadcasting_follows_numpy() {
    let ctx = Ctx::cpu();
    let mut r = Rng::new(3);
    let cases: &[(&[i64], &[i64])] = &[
        (&[3, 1, 5], &[4, 1]), // -> [3, 4, 5]
        (&[4, 1], &[3, 1, 5]),
        (&[], &[2, 3]), // ndim-0 scalar operand
        (&[2, 3], &[]),
        (&[6], &[4, 6]), // [N] + [M, N]
        (&[4, 6], &[6]),
        (&[4, 1], &[1, 6]),
        (&[1], &[3, 2]),
        (&[2, 1, 3, 1], &[1, 4, 1, 5]),
    ];
    for &(sa, sb) in cases {
        let so = broadcast_shape(sa, sb).unwrap();
        for dtype in DTYPES {
            for op in Op::all(dtype).into_iter().filter(|o| o.is_binary()) {
                let views = (View::contiguous(sa), View::contiguous(sb));
                let out = View::contiguous(&so);
                check_random_case(&ctx, &mut r, (op, dtype), views, &out, null());
            }
        }
    }
    // The documented example explicitly.
    assert_eq!(broadcast_shape(&[3, 1, 5], &[4, 1]).unwrap(), vec![3, 4, 5]);
}

#[test]
fn unary_input_broadcasts_to_the_output_shape() {
    let ctx = Ctx::cpu();
    let mut r = Rng::new(4);
    let cases: &[(&[i64], &[i64])] = &[(&[], &[3, 2]), (&[5], &[4, 5]), (&[3, 1], &[3, 4])];
    for &(sa, so) in cases {
        for (op, dtype) in Op::every_with_dtype()
            .into_iter()
            .filter(|(o, _)| !o.is_binary())
        {
            // unary: only a is drawn, b's view is unused
            let views = (View::contiguous(sa), View::contiguous(sa));
            let out = View::contiguous(so);
            check_random_case(&ctx, &mut r, (op, dtype), views, &out, null());
        }
    }
}

/// Transposed, every-other, reversed (negative strides), zero-stride and misaligned
/// inputs, for every op and dtype; `b` gets a different layout than `a`.
#[test]
fn strided_inputs_of_every_layout() {
    let shape = [4i64, 7];
    let ls = layouts(&shape, true);
    let views: Vec<_> = (0..ls.len())
        .map(|i| {
            let vb = ls[(i + 2) % ls.len()].1.clone();
            (ls[i].1.clone(), vb, View::contiguous(&shape))
        })
        .collect();
    check_every_op_on_cpu(5, &views);
}

/// Outputs may have any non-self-overlapping strides; nothing outside the view is
/// written (the poison around it survives).
#[test]
fn strided_outputs() {
    let shape = [3i64, 5, 2];
    let views: Vec<_> = layouts(&shape, false)
        .into_iter()
        .map(|(_, vo)| (View::transposed(&shape), View::contiguous(&shape), vo))
        .collect();
    check_every_op_on_cpu(6, &views);
}

#[test]
fn in_place_binary_and_unary() {
    let ctx = Ctx::cpu();
    let mut r = Rng::new(7);
    let shape = [3i64, 11];
    let n = 33;
    for dtype in DTYPES {
        let c = is_complex(dtype);
        let x = random_values(&mut r, dtype, n, Domain::Signed);
        let y = random_values(&mut r, dtype, n, Domain::Signed);
        // out is exactly a
        let a = Buf::from_vals(&ctx, dtype, &shape, &x);
        let b = Buf::from_vals(&ctx, dtype, &shape, &y);
        ok(unsafe { fk_add(a.raw(), b.raw(), a.raw(), null()) });
        let want: Vec<Cx> = x.iter().zip(&y).map(|(p, q)| p.add(*q)).collect();
        assert_close(&a.read(), &want, tol(dtype), "add in place (out = a)");
        assert_close(&b.read(), &y, 0.0, "b unchanged");
        // out is exactly b
        let a = Buf::from_vals(&ctx, dtype, &shape, &x);
        let b = Buf::from_vals(&ctx, dtype, &shape, &y);
        ok(unsafe { fk_div(a.raw(), b.raw(), b.raw(), null()) });
        let want: Vec<Cx> = x.iter().zip(&y).map(|(p, q)| p.div(*q)).collect();
        assert_close(&b.read(), &want, tol(dtype), "div in place (out = b)");
        // a, b and out all the same buffer
        let a = Buf::from_vals(&ctx, dtype, &shape, &x);
        ok(unsafe { fk_mul(a.raw(), a.raw(), a.raw(), null()) });
        let want: Vec<Cx> = x.iter().map(|p| p.mul(*p)).collect();
        assert_close(&a.read(), &want, tol(dtype), "mul in place (a = b = out)");
        // unary in place
        for op in Op::supported(dtype) {
            if op.is_binary() || op == Op::Abs && c {
                continue;
            }
            let xs = random_values(&mut r, dtype, n, op.domain_a());
            let a = Buf::from_vals(&ctx, dtype, &shape, &xs);
            ok(unsafe { op.call(a.raw(), null(), a.raw(), null()) });
            let want: Vec<Cx> = xs.iter().map(|&v| op.eval(c, v, v)).collect();
            assert_close(
                &a.read(),
                &want,
                tol(dtype),
                &format!("{} in place on {}", op.name(), dname(dtype)),
            );
        }
    }
}

#[test]
fn in_place_axpby() {
    let ctx = Ctx::cpu();
    let mut r = Rng::new(8);
    for dtype in DTYPES {
        let (alpha, beta) = if is_complex(dtype) {
            (cx(0.5, 2.0), cx(-1.25, 0.5))
        } else {
            (re(0.5), re(-1.25))
        };
        let x = random_values(&mut r, dtype, 40, Domain::Signed);
        let y = random_values(&mut r, dtype, 40, Domain::Signed);
        let a = Buf::from_vals(&ctx, dtype, &[40], &x);
        let b = Buf::from_vals(&ctx, dtype, &[40], &y);
        // x <- alpha x + beta y
        ok(unsafe { Op::Axpby(alpha, beta).call(a.raw(), b.raw(), a.raw(), null()) });
        let want: Vec<Cx> = x
            .iter()
            .zip(&y)
            .map(|(p, q)| alpha.mul(*p).add(beta.mul(*q)))
            .collect();
        assert_close(&a.read(), &want, tol(dtype), "axpby with out = a");
        // y <- alpha x + beta y (out = b)
        let a = Buf::from_vals(&ctx, dtype, &[40], &x);
        ok(unsafe { Op::Axpby(alpha, beta).call(a.raw(), b.raw(), b.raw(), null()) });
        assert_close(&b.read(), &want, tol(dtype), "axpby with out = b");
    }
}

/// In place through a strided view, and through a second handle wrapping exactly
/// the same view (same pointer, shape and strides: not partial aliasing).
#[test]
fn in_place_through_strided_views_and_second_handles() {
    let ctx = Ctx::cpu();
    let mut r = Rng::new(9);
    let dtype = FK_DTYPE_F64;
    let view = View::reversed(&[4, 5]);
    let a = Operand::random(&mut r, dtype, view.clone(), Domain::Signed);
    let placed = Placed::input(&ctx, dtype, &a);
    let data = placed.wrap.as_ref().unwrap().data();
    let twin = unsafe { Buf::wrap(&ctx, data, dtype, &view.shape, Some(&view.strides)) };
    ok(unsafe { fk_neg(placed.handle(), twin.raw(), null()) });
    ok(unsafe { fk_scalar_mul(twin.raw(), re(2.0).scalar(), placed.handle(), null()) });
    let storage = placed.storage.read();
    let got = view.gather(&storage);
    let want: Vec<Cx> = a.values().iter().map(|v| v.neg().mul(re(2.0))).collect();
    assert_close(
        &got,
        &want,
        1e-15,
        "neg then scalar_mul in place on a reversed view",
    );
}

#[test]
fn empty_tensors() {
    let ctx = Ctx::cpu();
    let shapes: &[(&[i64], &[i64], &[i64])] = &[
        (&[0], &[0], &[0]),
        (&[3, 0], &[0], &[3, 0]),
        (&[0], &[1], &[0]),
        (&[], &[2, 0, 3], &[2, 0, 3]),
    ];
    for (op, dtype) in Op::every_with_dtype() {
        for &(sa, sb, so) in shapes {
            let a = Buf::new(&ctx, dtype, sa);
            let b = Buf::new(&ctx, dtype, sb);
            let out = Buf::new(&ctx, op.out_dtype(dtype), so);
            ok(unsafe { op.call(a.raw(), b.raw(), out.raw(), null()) });
            // An empty output may also be a wrap of NULL.
            let out2 = unsafe { Buf::wrap(&ctx, null_mut(), op.out_dtype(dtype), so, None) };
            ok(unsafe { op.call(a.raw(), b.raw(), out2.raw(), null()) });
        }
        // Emptiness does not excuse a shape mismatch.
        let a = Buf::new(&ctx, dtype, &[0]);
        let b = Buf::new(&ctx, dtype, &[2]);
        let out = Buf::new(&ctx, op.out_dtype(dtype), &[0]);
        let s = unsafe { op.call(a.raw(), b.raw(), out.raw(), null()) };
        if op.is_binary() {
            expect_status(s, FK_ERROR_SHAPE_MISMATCH, &[op.name(), "a", "b"]);
        } else {
            ok(s);
        }
    }
}

#[test]
fn division_by_zero_follows_ieee() {
    let ctx = Ctx::cpu();
    for dtype in [FK_DTYPE_F16, FK_DTYPE_BF16, FK_DTYPE_F32, FK_DTYPE_F64] {
        let a = Buf::from_vals(&ctx, dtype, &[4], &[re(1.0), re(-1.0), re(0.0), re(2.0)]);
        let b = Buf::from_vals(&ctx, dtype, &[4], &[re(0.0), re(0.0), re(0.0), re(-0.0)]);
        let out = Buf::new(&ctx, dtype, &[4]);
        ok(unsafe { fk_div(a.raw(), b.raw(), out.raw(), null()) });
        let v = out.read();
        assert_eq!(v[0].re, f64::INFINITY, "{}: 1/0", dname(dtype));
        assert_eq!(v[1].re, f64::NEG_INFINITY, "{}: -1/0", dname(dtype));
        assert!(v[2].re.is_nan(), "{}: 0/0 = {:?}", dname(dtype), v[2]);
        assert_eq!(v[3].re, f64::NEG_INFINITY, "{}: 2/-0", dname(dtype));
    }
    for dtype in [FK_DTYPE_C64, FK_DTYPE_C128] {
        let a = Buf::from_vals(&ctx, dtype, &[2], &[cx(1.0, 2.0), cx(0.0, 0.0)]);
        let b = Buf::from_vals(&ctx, dtype, &[2], &[cx(0.0, 0.0), cx(0.0, 0.0)]);
        let out = Buf::new(&ctx, dtype, &[2]);
        ok(unsafe { fk_div(a.raw(), b.raw(), out.raw(), null()) });
        let v = out.read();
        assert!(!v[0].is_finite(), "{}: (1+2i)/0 = {:?}", dname(dtype), v[0]);
        assert!(v[1].has_nan(), "{}: 0/0 = {:?}", dname(dtype), v[1]);
    }
}

#[test]
fn complex_abs_gives_the_real_dtype() {
    let ctx = Ctx::cpu();
    let mut r = Rng::new(10);
    for dtype in [FK_DTYPE_C64, FK_DTYPE_C128] {
        let x = random_values(&mut r, dtype, 9, Domain::Signed);
        let a = Buf::from_vals(&ctx, dtype, &[9], &x);
        let out = Buf::new(&ctx, real_of(dtype), &[9]);
        ok(unsafe { fk_abs(a.raw(), out.raw(), null()) });
        let want: Vec<Cx> = x.iter().map(|v| re(v.abs())).collect();
        assert_close(&out.read(), &want, tol(dtype), "complex abs");
        // 3+4i has magnitude 5 exactly.
        let a = Buf::from_vals(&ctx, dtype, &[], &[cx(3.0, -4.0)]);
        let out = Buf::new(&ctx, real_of(dtype), &[]);
        ok(unsafe { fk_abs(a.raw(), out.raw(), null()) });
        assert_eq!(out.read(), vec![re(5.0)]);
        // The complex dtype itself is the wrong output dtype.
        let bad = Buf::new(&ctx, dtype, &[]);
        let s = unsafe { fk_abs(a.raw(), bad.raw(), null()) };
        expect_status(
            s,
            FK_ERROR_DTYPE_MISMATCH,
            &["fk_abs", "out", dname(dtype), dname(real_of(dtype))],
        );
    }
    // Real abs keeps the dtype; another real dtype is a mismatch.
    let a = Buf::from_vals(&ctx, FK_DTYPE_F32, &[2], &[re(-1.5), re(2.0)]);
    let out = Buf::new(&ctx, FK_DTYPE_F64, &[2]);
    let s = unsafe { fk_abs(a.raw(), out.raw(), null()) };
    expect_status(s, FK_ERROR_DTYPE_MISMATCH, &["fk_abs", "out", "f64"]);
}

#[test]
fn relu_refuses_complex_input() {
    let ctx = Ctx::cpu();
    for dtype in [FK_DTYPE_C64, FK_DTYPE_C128] {
        let a = Buf::from_vals(&ctx, dtype, &[1], &[cx(1.0, 1.0)]);
        let out = Buf::new(&ctx, dtype, &[1]);
        let s = unsafe { fk_relu(a.raw(), out.raw(), null()) };
        expect_status(
            s,
            FK_ERROR_UNSUPPORTED_DTYPE,
            &["fk_relu", "a", dname(dtype), "complex"],
        );
    }
}

#[test]
fn relu_propagates_nan_and_handles_specials() {
    let ctx = Ctx::cpu();
    let x = [
        f64::NAN,
        -f64::NAN,
        -1.0,
        2.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
    ];
    for dtype in [FK_DTYPE_F16, FK_DTYPE_BF16, FK_DTYPE_F32, FK_DTYPE_F64] {
        let vals: Vec<Cx> = x.iter().map(|&v| re(v)).collect();
        let a = Buf::from_vals(&ctx, dtype, &[8], &vals);
        let out = Buf::new(&ctx, dtype, &[8]);
        ok(unsafe { fk_relu(a.raw(), out.raw(), null()) });
        let v: Vec<f64> = out.read().iter().map(|c| c.re).collect();
        assert!(v[0].is_nan() && v[1].is_nan(), "{}: {v:?}", dname(dtype));
        assert_eq!(
            &v[2..],
            &[0.0, 2.0, f64::INFINITY, 0.0, 0.0, 0.0],
            "{}",
            dname(dtype)
        );
        // NaN also flows through arithmetic.
        let out2 = Buf::new(&ctx, dtype, &[8]);
        ok(unsafe { fk_add(a.raw(), a.raw(), out2.raw(), null()) });
        assert!(out2.read()[0].re.is_nan());
    }
}

/// More than 2^15 elements: the CPU backend splits the work over rayon chunks. The
/// strided case makes chunks start in the middle of a row.
#[test]
fn large_arrays_take_the_parallel_path() {
    let ctx = Ctx::cpu();
    let mut r = Rng::new(11);
    // contiguous
    let n = 100_003i64;
    for (op, dtype) in [
        (Op::Add, FK_DTYPE_F32),
        (Op::Exp, FK_DTYPE_F64),
        (Op::Mul, FK_DTYPE_C64),
        (Op::Sigmoid, FK_DTYPE_F16),
    ] {
        let v = View::contiguous(&[n]);
        let views = (v.clone(), v.clone());
        check_random_case(&ctx, &mut r, (op, dtype), views, &v, null());
    }
    // strided: transposed and reversed inputs, broadcasting, a reversed output
    let shape = [301i64, 257];
    for (op, dtype) in [
        (Op::Sub, FK_DTYPE_F64),
        (Op::Axpby(cx(2.0, 1.0), cx(0.5, -1.0)), FK_DTYPE_C128),
        (Op::Sin, FK_DTYPE_BF16),
    ] {
        let views = (View::transposed(&shape), View::reversed(&shape));
        let out = View::reversed(&shape);
        check_random_case(&ctx, &mut r, (op, dtype), views, &out, null());
    }
    let views = (View::contiguous(&[301, 1]), View::every_other(&[257]));
    let out = View::contiguous(&shape);
    check_random_case(&ctx, &mut r, (Op::Div, FK_DTYPE_F32), views, &out, null());
}

// ------------------------------------------------------------------ bad inputs

fn dummy_bufs(ctx: &Ctx, dtype: fk_dtype, op: Op) -> (Buf, Buf, Buf) {
    let a = Buf::from_vals(ctx, dtype, &[2], &[re(1.0), re(2.0)]);
    let b = Buf::from_vals(ctx, dtype, &[2], &[re(3.0), re(4.0)]);
    let out = Buf::new(ctx, op.out_dtype(dtype), &[2]);
    (a, b, out)
}

#[test]
fn null_handles_are_refused_with_the_argument_named() {
    let ctx = Ctx::cpu();
    for op in Op::all(FK_DTYPE_F32) {
        let (a, b, out) = dummy_bufs(&ctx, FK_DTYPE_F32, op);
        let s = unsafe { op.call(null(), b.raw(), out.raw(), null()) };
        expect_status(s, FK_ERROR_NULL_POINTER, &[op.name(), "a is NULL"]);
        if op.is_binary() {
            let s = unsafe { op.call(a.raw(), null(), out.raw(), null()) };
            expect_status(s, FK_ERROR_NULL_POINTER, &[op.name(), "b is NULL"]);
        }
        let s = unsafe { op.call(a.raw(), b.raw(), null_mut(), null()) };
        expect_status(s, FK_ERROR_NULL_POINTER, &[op.name(), "out is NULL"]);
    }
}

/// A handle of another kind (the magic check) is an invalid argument, not a crash.
#[test]
fn handles_of_the_wrong_kind_are_refused() {
    let ctx = Ctx::cpu();
    let stream = Stream::new(&ctx);
    for op in [Op::Add, Op::Exp] {
        let (a, b, out) = dummy_bufs(&ctx, FK_DTYPE_F64, op);
        let s = unsafe { op.call(stream.raw() as *const fk_buffer, b.raw(), out.raw(), null()) };
        expect_status(s, FK_ERROR_INVALID_ARGUMENT, &[op.name(), "a", "fk_buffer"]);
        let s = unsafe { op.call(a.raw(), b.raw(), ctx.raw() as *mut fk_buffer, null()) };
        expect_status(
            s,
            FK_ERROR_INVALID_ARGUMENT,
            &[op.name(), "out", "fk_buffer"],
        );
        let s = unsafe { op.call(a.raw(), b.raw(), out.raw(), a.raw() as *const fk_stream) };
        expect_status(
            s,
            FK_ERROR_INVALID_ARGUMENT,
            &[op.name(), "stream", "fk_stream"],
        );
    }
}

#[test]
fn dtype_mismatches_name_the_arguments() {
    let ctx = Ctx::cpu();
    for op in Op::all(FK_DTYPE_F32) {
        let a = Buf::new(&ctx, FK_DTYPE_F32, &[2]);
        let b = Buf::new(&ctx, FK_DTYPE_F64, &[2]);
        let out = Buf::new(&ctx, FK_DTYPE_F32, &[2]);
        if op.is_binary() {
            let s = unsafe { op.call(a.raw(), b.raw(), out.raw(), null()) };
            expect_status(
                s,
                FK_ERROR_DTYPE_MISMATCH,
                &[op.name(), "a is f32", "b is f64", "out is f32"],
            );
            let s = unsafe { op.call(a.raw(), a.raw(), b.raw(), null()) };
            expect_status(s, FK_ERROR_DTYPE_MISMATCH, &[op.name(), "out is f64"]);
        } else {
            let s = unsafe { op.call(a.raw(), null(), b.raw(), null()) };
            expect_status(
                s,
                FK_ERROR_DTYPE_MISMATCH,
                &[op.name(), "out has dtype f64", "f32"],
            );
        }
    }
    // Half types are distinct dtypes.
    let a = Buf::new(&ctx, FK_DTYPE_F16, &[2]);
    let b = Buf::new(&ctx, FK_DTYPE_BF16, &[2]);
    let s = unsafe { fk_add(a.raw(), b.raw(), a.raw(), null()) };
    expect_status(
        s,
        FK_ERROR_DTYPE_MISMATCH,
        &["fk_add", "a is f16", "b is bf16"],
    );
}

#[test]
fn shape_mismatches_name_the_arguments() {
    let ctx = Ctx::cpu();
    let d = FK_DTYPE_F32;
    for op in Op::all(d) {
        if op.is_binary() {
            // a and b do not broadcast together
            let a = Buf::new(&ctx, d, &[3]);
            let b = Buf::new(&ctx, d, &[4]);
            let out = Buf::new(&ctx, d, &[4]);
            let s = unsafe { op.call(a.raw(), b.raw(), out.raw(), null()) };
            expect_status(
                s,
                FK_ERROR_SHAPE_MISMATCH,
                &[op.name(), "a", "b", "[3]", "[4]"],
            );
            // they do, but out has another shape
            let a = Buf::new(&ctx, d, &[3, 1]);
            let b = Buf::new(&ctx, d, &[4]);
            let out = Buf::new(&ctx, d, &[3, 5]);
            let s = unsafe { op.call(a.raw(), b.raw(), out.raw(), null()) };
            expect_status(
                s,
                FK_ERROR_SHAPE_MISMATCH,
                &[op.name(), "out has shape [3, 5]", "[3, 4]"],
            );
            // out may not be smaller than the broadcast shape either
            let out = Buf::new(&ctx, d, &[4]);
            let s = unsafe { op.call(a.raw(), b.raw(), out.raw(), null()) };
            expect_status(
                s,
                FK_ERROR_SHAPE_MISMATCH,
                &[op.name(), "out has shape [4]"],
            );
        } else {
            let od = op.out_dtype(d);
            // a does not broadcast to out
            let a = Buf::new(&ctx, d, &[3]);
            let out = Buf::new(&ctx, od, &[4]);
            let s = unsafe { op.call(a.raw(), null(), out.raw(), null()) };
            expect_status(
                s,
                FK_ERROR_SHAPE_MISMATCH,
                &[op.name(), "a", "out", "[3]", "[4]"],
            );
            // a is larger than out (unary ops never reduce)
            let a = Buf::new(&ctx, d, &[2, 3]);
            let out = Buf::new(&ctx, od, &[3]);
            let s = unsafe { op.call(a.raw(), null(), out.raw(), null()) };
            expect_status(
                s,
                FK_ERROR_SHAPE_MISMATCH,
                &[op.name(), "out has shape [3]", "a has shape [2, 3]"],
            );
        }
    }
}

/// Host memory for wrapping: `n` f32 values.
fn host_f32(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 + 1.0).collect()
}

#[test]
fn partial_aliasing_of_out_and_an_input_is_refused() {
    let ctx = Ctx::cpu();
    let mut mem = host_f32(16);
    let p = mem.as_mut_ptr();
    let d = FK_DTYPE_F32;
    // a = mem[0..8], shifted = mem[1..9]
    let a = unsafe { Buf::wrap(&ctx, p as *mut c_void, d, &[8], None) };
    let shifted = unsafe { Buf::wrap(&ctx, p.add(1) as *mut c_void, d, &[8], None) };
    let other = Buf::new(&ctx, d, &[8]);
    // reversed view over the same 8 elements: same memory, not the same view
    let rev = unsafe { Buf::wrap(&ctx, p.add(7) as *mut c_void, d, &[8], Some(&[-1])) };
    // a 4x4 block and its transpose
    let sq = unsafe { Buf::wrap(&ctx, p as *mut c_void, d, &[4, 4], None) };
    let sq_t = unsafe { Buf::wrap(&ctx, p as *mut c_void, d, &[4, 4], Some(&[1, 4])) };
    let other_sq = Buf::new(&ctx, d, &[4, 4]);
    for op in Op::all(d) {
        let name = op.name();
        if op.is_binary() {
            let s = unsafe { op.call(a.raw(), other.raw(), shifted.raw(), null()) };
            expect_status(s, FK_ERROR_ALIASING, &[name, "out overlaps a"]);
            let s = unsafe { op.call(other.raw(), a.raw(), shifted.raw(), null()) };
            expect_status(s, FK_ERROR_ALIASING, &[name, "out overlaps b"]);
            let s = unsafe { op.call(a.raw(), other.raw(), rev.raw(), null()) };
            expect_status(s, FK_ERROR_ALIASING, &[name, "out overlaps a"]);
            let s = unsafe { op.call(other_sq.raw(), sq.raw(), sq_t.raw(), null()) };
            expect_status(s, FK_ERROR_ALIASING, &[name, "out overlaps b"]);
        } else {
            let s = unsafe { op.call(a.raw(), null(), shifted.raw(), null()) };
            expect_status(s, FK_ERROR_ALIASING, &[name, "out overlaps a"]);
            let s = unsafe { op.call(shifted.raw(), null(), a.raw(), null()) };
            expect_status(s, FK_ERROR_ALIASING, &[name, "out overlaps a"]);
            let s = unsafe { op.call(sq.raw(), null(), sq_t.raw(), null()) };
            expect_status(s, FK_ERROR_ALIASING, &[name, "out overlaps a"]);
        }
    }
    // Nothing was written by the refused calls.
    assert_eq!(mem, host_f32(16));
    drop((a, shifted, rev, sq, sq_t));
}

#[test]
fn self_overlapping_out_is_refused() {
    let ctx = Ctx::cpu();
    let mut mem = host_f32(16);
    let p = mem.as_mut_ptr() as *mut c_void;
    let d = FK_DTYPE_F32;
    let zero = unsafe { Buf::wrap(&ctx, p, d, &[4], Some(&[0])) };
    let interleaved = unsafe { Buf::wrap(&ctx, p, d, &[3, 4], Some(&[2, 1])) };
    let a1 = Buf::new(&ctx, d, &[4]);
    let a2 = Buf::new(&ctx, d, &[3, 4]);
    for op in Op::all(d) {
        let s = unsafe { op.call(a1.raw(), a1.raw(), zero.raw(), null()) };
        expect_status(
            s,
            FK_ERROR_INVALID_ARGUMENT,
            &[op.name(), "out has strides [0]", "self-overlap"],
        );
        let s = unsafe { op.call(a2.raw(), a2.raw(), interleaved.raw(), null()) };
        expect_status(
            s,
            FK_ERROR_INVALID_ARGUMENT,
            &[op.name(), "out has strides [2, 1]"],
        );
    }
    // A zero-stride view is a fine input.
    let out = Buf::new(&ctx, d, &[4]);
    ok(unsafe { fk_add(zero.raw(), a1.raw(), out.raw(), null()) });
    drop((zero, interleaved));
    assert_eq!(mem, host_f32(16));
}

#[test]
fn complex_scalars_on_real_dtypes_are_refused() {
    let ctx = Ctx::cpu();
    let bad = cx(1.0, 0.5);
    let good = re(1.0);
    for d in [FK_DTYPE_F16, FK_DTYPE_BF16, FK_DTYPE_F32, FK_DTYPE_F64] {
        let a = Buf::new(&ctx, d, &[3]);
        let out = Buf::new(&ctx, d, &[3]);
        for op in [Op::ScalarAdd(bad), Op::ScalarMul(bad)] {
            let s = unsafe { op.call(a.raw(), null(), out.raw(), null()) };
            expect_status(
                s,
                FK_ERROR_INVALID_ARGUMENT,
                &[op.name(), "s has imaginary part 0.5", dname(d)],
            );
        }
        let s = unsafe { Op::Axpby(bad, good).call(a.raw(), a.raw(), out.raw(), null()) };
        expect_status(
            s,
            FK_ERROR_INVALID_ARGUMENT,
            &["fk_axpby", "alpha has imaginary part"],
        );
        let s = unsafe { Op::Axpby(good, bad).call(a.raw(), a.raw(), out.raw(), null()) };
        expect_status(
            s,
            FK_ERROR_INVALID_ARGUMENT,
            &["fk_axpby", "beta has imaginary part"],
        );
    }
    // On complex dtypes the same scalars are fine.
    let a = Buf::from_vals(&ctx, FK_DTYPE_C128, &[1], &[cx(2.0, 1.0)]);
    let out = Buf::new(&ctx, FK_DTYPE_C128, &[1]);
    ok(unsafe { fk_scalar_mul(a.raw(), bad.scalar(), out.raw(), null()) });
    assert_eq!(out.read(), vec![cx(2.0, 1.0).mul(bad)]);
}

/// A refused call leaves its output untouched and a later success keeps the message.
#[test]
fn failures_write_nothing_and_successes_keep_the_message() {
    let ctx = Ctx::cpu();
    let a = Buf::from_vals(&ctx, FK_DTYPE_F32, &[3], &[re(1.0), re(2.0), re(3.0)]);
    let b = Buf::new(&ctx, FK_DTYPE_F32, &[4]);
    let out = Buf::from_vals(&ctx, FK_DTYPE_F32, &[3], &[re(9.0); 3]);
    let s = unsafe { fk_add(a.raw(), b.raw(), out.raw(), null()) };
    expect_status(s, FK_ERROR_SHAPE_MISMATCH, &["fk_add"]);
    let msg = last_error();
    assert_eq!(out.read(), vec![re(9.0); 3]);
    ok(unsafe { fk_neg(a.raw(), out.raw(), null()) });
    assert_eq!(last_error(), msg);
    assert_eq!(out.read(), vec![re(-1.0), re(-2.0), re(-3.0)]);
}
