//! The Gaussian field family through the C ABI on the CPU backend: against the f64
//! reference of `gaussian_util` (written from docs/ops.md section 3), every gradient
//! against central finite differences in f64, odd and empty sizes, near-singular
//! factors where eps matters, every bad-input status with its message, and
//! bitwise determinism of the backwards.

mod common;
mod gaussian_util;

use std::ptr::null_mut;

use common::*;
use gaussian_util::*;

const DT: [fk_dtype; 2] = [FK_DTYPE_F32, FK_DTYPE_F64];
const SIZES: [(usize, usize); 5] = [(1, 1), (7, 5), (33, 17), (65, 129), (3, 260)];

fn tolerance(d: fk_dtype) -> f64 {
    if d == FK_DTYPE_F32 { 1e-5 } else { 1e-12 }
}

#[test]
fn forwards_match_reference() {
    let ctx = Ctx::cpu();
    each_problem(&mut Rng::new(11), &SIZES, |_, d, (b, n), p| {
        let x = Inputs::new(&ctx, d, p);
        let what = format!("{} B={b} N={n}", dname(d));
        let tol = tolerance(d);
        check_forward(&ctx, &x, p, false, tol, &format!("mahalanobis {what}"));
        check_forward(&ctx, &x, p, true, tol, &format!("field {what}"));
    });
}

#[test]
fn backwards_match_reference() {
    let ctx = Ctx::cpu();
    each_problem(&mut Rng::new(12), &SIZES, |rng, d, (b, n), p| {
        let x = Inputs::new(&ctx, d, p);
        let g = quantize_vec(d, &random_vec(rng, b * n));
        let dout = quantize_vec(d, &random_vec(rng, b));
        let what = format!("{} B={b} N={n}", dname(d));
        // the Mahalanobis backward's three gradients, then the field's four
        for (field, gin, kind, count) in [(false, &g, "maha", 3), (true, &dout, "field", 4)] {
            let (got, _) = run_bwd(&ctx, &x, field, gin, ALL, NULL_STREAM);
            let want = if field {
                ref_field_bwd(p, gin)
            } else {
                ref_maha_bwd(p, gin)
            };
            let pairs = grads_of(&got).into_iter().zip(grads_of(&want));
            for (i, (got, want)) in pairs.take(count).enumerate() {
                let label = format!("{kind} {} {what}", GRAD_NAMES[i]);
                check(got, want, tolerance(d), &label);
            }
        }
    });
}

/// Central differences of `loss` with respect to every input element (f64).
fn finite_differences(p: &Problem, h: f64, loss: &dyn Fn(&Problem) -> f64) -> Grads {
    let fd = |get: &dyn Fn(&mut Problem) -> &mut Vec<f64>| -> Vec<f64> {
        let len = get(&mut p.clone()).len();
        (0..len)
            .map(|i| {
                let (mut a, mut b) = (p.clone(), p.clone());
                get(&mut a)[i] += h;
                get(&mut b)[i] -= h;
                (loss(&a) - loss(&b)) / (2.0 * h)
            })
            .collect()
    };
    (
        fd(&|q| &mut q.points),
        fd(&|q| &mut q.means),
        fd(&|q| &mut q.chol),
        fd(&|q| &mut q.weights),
    )
}

/// Checks the library's f64 gradients of both ops on `p` against finite differences.
fn gradients_vs_fd(p: &Problem, h: f64, tol: f64, rng: &mut Rng) {
    let ctx = Ctx::cpu();
    let d = FK_DTYPE_F64;
    let x = Inputs::new(&ctx, d, p);
    let g = random_vec(rng, p.b * p.n);
    let dout = random_vec(rng, p.b);
    let ctx2 = Ctx::cpu();
    let maha_loss = |q: &Problem| -> f64 {
        let m = run_maha_fwd(&ctx2, &Inputs::new(&ctx2, d, q), NULL_STREAM);
        m.iter().zip(&g).map(|(a, b)| a * b).sum()
    };
    let field_loss = |q: &Problem| -> f64 {
        let f = run_field_fwd(&ctx2, &Inputs::new(&ctx2, d, q), NULL_STREAM);
        f.iter().zip(&dout).map(|(a, b)| a * b).sum()
    };
    let (got, _) = run_bwd(&ctx, &x, false, &g, ALL, NULL_STREAM);
    let fd = finite_differences(p, h, &maha_loss);
    check(&got.0, &fd.0, tol, "maha dpoints vs finite differences");
    check(&got.1, &fd.1, tol, "maha dmeans vs finite differences");
    check(&got.2, &fd.2, tol, "maha dchol vs finite differences");
    let (got, _) = run_bwd(&ctx, &x, true, &dout, ALL, NULL_STREAM);
    let fd = finite_differences(p, h, &field_loss);
    check(&got.0, &fd.0, tol, "field dpoints vs finite differences");
    check(&got.1, &fd.1, tol, "field dmeans vs finite differences");
    check(&got.2, &fd.2, tol, "field dchol vs finite differences");
    check(&got.3, &fd.3, tol, "field dweights vs finite differences");
    // the strictly upper part of chol does not enter the ops
    for n in 0..p.n {
        for k in [1, 2, 5] {
            assert_eq!(got.2[n * 9 + k], 0.0, "dchol upper part must be 0");
            assert!(fd.2[n * 9 + k].abs() < 1e-9, "upper part of chol is read");
        }
    }
}

#[test]
fn gradients_match_finite_differences() {
    let mut rng = Rng::new(13);
    for (b, n) in [(1, 1), (5, 3), (4, 7)] {
        let p = Problem::random(&mut rng, b, n, 1e-6);
        gradients_vs_fd(&p, 1e-5, 1e-7, &mut rng);
    }
}

/// Factors with a tiny (or zero) diagonal entry: `eps` decides the answer.
fn near_singular(rng: &mut Rng, b: usize, n: usize, eps: f64) -> Problem {
    let mut p = Problem::random(rng, b, n, eps);
    for i in 0..n {
        // L_11 tiny, L_22 exactly 0: only eps keeps the factor invertible
        p.chol[i * 9 + 4] = 1e-7 * (1 + i % 3) as f64;
        p.chol[i * 9 + 8] = 0.0;
        for k in [3, 6, 7] {
            p.chol[i * 9 + k] = rng.uniform(-1e-3, 1e-3);
        }
    }
    // points close to the means so that exp(-0.5 m) is not 0
    for k in 0..b {
        let i = k % n;
        for c in 0..3 {
            p.points[k * 3 + c] = p.means[i * 3 + c] + rng.uniform(-5e-4, 5e-4);
        }
    }
    p
}

#[test]
fn near_singular_covariances() {
    let mut rng = Rng::new(14);
    let ctx = Ctx::cpu();
    let eps = 1e-3;
    let p = near_singular(&mut rng, 6, 3, eps);
    let x = Inputs::new(&ctx, FK_DTYPE_F64, &p);
    check_forward(&ctx, &x, &p, false, 1e-12, "near-singular mahalanobis");
    let field = check_forward(&ctx, &x, &p, true, 1e-12, "near-singular field");
    assert!(
        field.iter().any(|v| v.abs() > 1e-3),
        "the test points must see the Gaussians"
    );
    // eps matters: a larger eps gives a clearly different field
    let mut q = p.clone();
    q.eps = 1e-2;
    let other = run_field_fwd(&ctx, &Inputs::new(&ctx, FK_DTYPE_F64, &q), NULL_STREAM);
    assert!(rel(&other, &field) > 1e-2, "eps has no effect");
    // without eps the factor is singular (L_22 = 0): IEEE inf/NaN, no crash
    let mut z = p.clone();
    z.eps = 0.0;
    let m = run_maha_fwd(&ctx, &Inputs::new(&ctx, FK_DTYPE_F64, &z), NULL_STREAM);
    assert!(m.iter().any(|v| !v.is_finite()));
    // gradients by finite differences, with a step far below eps
    gradients_vs_fd(&p, 1e-8, 1e-5, &mut rng);
    // and in f32 against the f64 reference of the rounded inputs
    let pf = p.quantized(FK_DTYPE_F32);
    let xf = Inputs::new(&ctx, FK_DTYPE_F32, &pf);
    check_forward(&ctx, &xf, &pf, true, 1e-5, "near-singular f32 field");
    let dout = random_vec(&mut rng, pf.b);
    let dout = quantize_vec(FK_DTYPE_F32, &dout);
    let (got, _) = run_bwd(&ctx, &xf, true, &dout, ALL, NULL_STREAM);
    let want = ref_field_bwd(&pf, &dout);
    check(&got.2, &want.2, 1e-5, "near-singular f32 dchol");
}

#[test]
fn empty_sizes() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(15);
    for d in DT {
        // N = 0: the field is 0 everywhere, dpoints 0
        let p = Problem::random(&mut rng, 5, 0, 1e-6);
        let x = Inputs::new(&ctx, d, &p);
        assert_eq!(run_field_fwd(&ctx, &x, NULL_STREAM), vec![0.0; 5]);
        assert!(run_maha_fwd(&ctx, &x, NULL_STREAM).is_empty());
        let (g, _) = run_bwd(&ctx, &x, true, &[1.0; 5], ALL, NULL_STREAM);
        assert_eq!(g.0, vec![0.0; 15]);
        // B = 0: per-Gaussian gradients are 0
        let p = Problem::random(&mut rng, 0, 4, 1e-6);
        let x = Inputs::new(&ctx, d, &p);
        assert!(run_field_fwd(&ctx, &x, NULL_STREAM).is_empty());
        let (g, _) = run_bwd(&ctx, &x, true, &[], ALL, NULL_STREAM);
        assert_eq!(
            (g.1, g.2, g.3),
            (vec![0.0; 12], vec![0.0; 36], vec![0.0; 4])
        );
        let (g, _) = run_bwd(&ctx, &x, false, &[], ALL, NULL_STREAM);
        assert_eq!(g.2, vec![0.0; 36]);
    }
}

#[test]
fn subsets_of_gradients_and_determinism() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(16);
    let p = Problem::random(&mut rng, 777, 33, 1e-6).quantized(FK_DTYPE_F32);
    for d in DT {
        let x = Inputs::new(&ctx, d, &p);
        let dout = quantize_vec(d, &random_vec(&mut rng, p.b));
        let (all, bytes1) = run_bwd(&ctx, &x, true, &dout, ALL, NULL_STREAM);
        let (_, bytes2) = run_bwd(&ctx, &x, true, &dout, ALL, NULL_STREAM);
        assert!(
            bytes1 == bytes2,
            "field backward is not bitwise reproducible"
        );
        let g = quantize_vec(d, &random_vec(&mut rng, p.b * p.n));
        let (_, m1) = run_bwd(&ctx, &x, false, &g, ALL, NULL_STREAM);
        let (_, m2) = run_bwd(&ctx, &x, false, &g, ALL, NULL_STREAM);
        assert!(m1 == m2, "mahalanobis backward is not bitwise reproducible");
        for i in 0..4 {
            let mut want = [false; 4];
            want[i] = true;
            let (one, _) = run_bwd(&ctx, &x, true, &dout, want, NULL_STREAM);
            let (a, b) = match i {
                0 => (&one.0, &all.0),
                1 => (&one.1, &all.1),
                2 => (&one.2, &all.2),
                _ => (&one.3, &all.3),
            };
            assert_eq!(a, b, "gradient {i} alone differs from all together");
        }
        // no gradient wanted: a no-op that succeeds
        let (none, _) = run_bwd(&ctx, &x, true, &dout, [false; 4], NULL_STREAM);
        assert!(none.0.is_empty() && none.3.is_empty());
    }
}

#[test]
fn workspace_size_query() {
    let ctx = Ctx::cpu();
    let mut bytes = 7usize;
    ok(unsafe {
        fk_gaussian_backward_workspace_size(ctx.raw(), FK_DTYPE_F32, 1000, 100, &mut bytes)
    });
    assert_eq!(bytes, 0, "the CPU backend needs no workspace");
    let s =
        unsafe { fk_gaussian_backward_workspace_size(null_mut(), FK_DTYPE_F32, 1, 1, &mut bytes) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_gaussian_backward_workspace_size", "ctx"],
    );
    let s =
        unsafe { fk_gaussian_backward_workspace_size(ctx.raw(), FK_DTYPE_F32, 1, 1, null_mut()) };
    expect_status(s, FK_ERROR_NULL_POINTER, &["bytes"]);
    let s = unsafe { fk_gaussian_backward_workspace_size(ctx.raw(), 99, 1, 1, &mut bytes) };
    expect_status(s, FK_ERROR_INVALID_ARGUMENT, &["dtype"]);
    let s =
        unsafe { fk_gaussian_backward_workspace_size(ctx.raw(), FK_DTYPE_F16, 1, 1, &mut bytes) };
    expect_status(s, FK_ERROR_UNSUPPORTED_DTYPE, &["f16"]);
    let s =
        unsafe { fk_gaussian_backward_workspace_size(ctx.raw(), FK_DTYPE_F64, -1, 1, &mut bytes) };
    expect_status(s, FK_ERROR_INVALID_ARGUMENT, &["B = -1"]);
    assert_eq!(FK_GAUSSIAN_DEFAULT_EPS, 1e-6);
}

/// A valid problem's buffers on the CPU, plus outputs, to break one at a time.
struct Call {
    ctx: Ctx,
    x: Inputs,
    g: Buf,
    dout: Buf,
    out_m: Buf,
    out_f: Buf,
    dp: Buf,
    dm: Buf,
    dc: Buf,
    dw: Buf,
}

const B: i64 = 4;
const N: i64 = 3;

impl Call {
    fn new(d: fk_dtype) -> Call {
        let ctx = Ctx::cpu();
        let mut rng = Rng::new(17);
        let p = Problem::random(&mut rng, B as usize, N as usize, 1e-6);
        let x = Inputs::new(&ctx, d, &p);
        let g = fbuf(&ctx, d, &[B, N], &[0.5; (B * N) as usize]);
        let dout = fbuf(&ctx, d, &[B], &[1.0; B as usize]);
        Call {
            out_m: Buf::new(&ctx, d, &[B, N]),
            out_f: Buf::new(&ctx, d, &[B]),
            dp: Buf::new(&ctx, d, &[B, 3]),
            dm: Buf::new(&ctx, d, &[N, 3]),
            dc: Buf::new(&ctx, d, &[N, 3, 3]),
            dw: Buf::new(&ctx, d, &[N]),
            ctx,
            x,
            g,
            dout,
        }
    }
}

const NAMES: [&str; 4] = [
    "fk_mahalanobis_forward",
    "fk_gaussian_field_forward",
    "fk_mahalanobis_backward",
    "fk_gaussian_field_backward",
];

/// Calls op `op` (an index into `NAMES`) with the buffer called `name` replaced
/// by `bad` (`name` "" replaces nothing).
fn call_one(c: &Call, op: usize, eps: f64, name: &str, bad: *mut fk_buffer) -> fk_status {
    let pick = |nm: &str, b: &Buf| if nm == name { bad } else { b.raw() };
    let (p, m, l, w) = (
        pick("points", &c.x.points),
        pick("means", &c.x.means),
        pick("chol", &c.x.chol),
        pick("weights", &c.x.weights),
    );
    let (dp, dm, dc, dw) = (
        pick("dpoints", &c.dp),
        pick("dmeans", &c.dm),
        pick("dchol", &c.dc),
        pick("dweights", &c.dw),
    );
    unsafe {
        match op {
            0 => fk_mahalanobis_forward(p, m, l, eps, pick("out_m", &c.out_m), NULL_STREAM),
            1 => fk_gaussian_field_forward(p, m, l, w, eps, pick("out_f", &c.out_f), NULL_STREAM),
            2 => fk_mahalanobis_backward(
                p,
                m,
                l,
                eps,
                pick("g", &c.g),
                dp,
                dm,
                dc,
                null_mut(),
                NULL_STREAM,
            ),
            _ => fk_gaussian_field_backward(
                p,
                m,
                l,
                w,
                eps,
                pick("dout", &c.dout),
                dp,
                dm,
                dc,
                dw,
                null_mut(),
                NULL_STREAM,
            ),
        }
    }
}

fn call_all(c: &Call, eps: f64) -> [fk_status; 4] {
    [0, 1, 2, 3].map(|op| call_one(c, op, eps, "", null_mut()))
}

/// Replaces `name` by `bad` in every op that takes it; checks status and message:
/// the parts `needles(arg)` make of the C parameter's name `arg` (`out` for
/// `out_m` and `out_f`), and the op's name.
fn expect_each(
    c: &Call,
    name: &str,
    bad: *mut fk_buffer,
    status: fk_status,
    needles: impl Fn(&str) -> Vec<String>,
) {
    let arg = match name {
        "out_m" | "out_f" => "out",
        n => n,
    };
    let needles = needles(arg);
    let uses = |op: usize| match name {
        "weights" => op == 1 || op == 3,
        "out_f" => op == 1,
        "dout" | "dweights" => op == 3,
        "out_m" => op == 0,
        "g" => op == 2,
        "dpoints" | "dmeans" | "dchol" => op >= 2,
        _ => true,
    };
    for op in (0..4).filter(|&op| uses(op)) {
        let s = call_one(c, op, 1e-6, name, bad);
        let mut all: Vec<&str> = needles.iter().map(String::as_str).collect();
        all.push(NAMES[op]);
        expect_status(s, status, &all);
    }
}

#[test]
fn valid_call_succeeds() {
    for d in DT {
        let c = Call::new(d);
        assert_eq!(call_all(&c, 1e-6), [FK_OK; 4]);
        assert_eq!(call_all(&c, 0.0), [FK_OK; 4], "eps = 0 is allowed");
    }
}

#[test]
fn null_required_arguments() {
    let c = Call::new(FK_DTYPE_F32);
    for name in [
        "points", "means", "chol", "weights", "g", "dout", "out_m", "out_f",
    ] {
        let needles = |arg: &str| vec![format!("{arg} is NULL")];
        expect_each(&c, name, null_mut(), FK_ERROR_NULL_POINTER, needles);
    }
}

#[test]
fn wrong_shapes() {
    let c = Call::new(FK_DTYPE_F32);
    let d = FK_DTYPE_F32;
    let cases: Vec<(&str, Vec<i64>, &str)> = vec![
        ("points", vec![B, 2], "[B, 3]"),
        ("points", vec![B * 3], "[B, 3]"),
        ("points", vec![B, 3, 1], "[B, 3]"),
        ("means", vec![N, 2], "[N, 3]"),
        ("chol", vec![N, 3, 2], "[N, 3, 3]"),
        ("chol", vec![N + 1, 3, 3], "[N, 3, 3]"),
        ("chol", vec![N, 9], "[N, 3, 3]"),
        ("weights", vec![N + 1], "[N]"),
        ("weights", vec![N, 1], "[N]"),
        ("g", vec![B, N + 1], "[B, N]"),
        ("g", vec![N, B], "[B, N]"),
        ("dout", vec![B + 1], "[B]"),
        ("out_m", vec![B, N, 1], "[B, N]"),
        ("out_f", vec![B, 1], "[B]"),
        ("dpoints", vec![B, 2], "[B, 3]"),
        ("dmeans", vec![N + 1, 3], "[N, 3]"),
        ("dchol", vec![N, 6], "[N, 3, 3]"),
        ("dweights", vec![B + N], "[N]"),
    ];
    for (name, shape, form) in cases {
        let bad = Buf::new(&c.ctx, d, &shape);
        let needles = |arg: &str| vec![format!("{arg} has shape {shape:?}"), form.into()];
        expect_each(&c, name, bad.raw(), FK_ERROR_SHAPE_MISMATCH, needles);
    }
}

#[test]
fn dtype_errors() {
    let c = Call::new(FK_DTYPE_F32);
    for name in [
        "means", "chol", "weights", "g", "dout", "out_m", "out_f", "dpoints", "dmeans", "dchol",
        "dweights",
    ] {
        let shape: Vec<i64> = match name {
            "means" | "dmeans" => vec![N, 3],
            "chol" | "dchol" => vec![N, 3, 3],
            "weights" | "dweights" => vec![N],
            "g" | "out_m" => vec![B, N],
            "dpoints" => vec![B, 3],
            _ => vec![B],
        };
        let bad = Buf::new(&c.ctx, FK_DTYPE_F64, &shape);
        let needles = |arg: &str| vec![format!("{arg} has dtype f64 but points has dtype f32")];
        expect_each(&c, name, bad.raw(), FK_ERROR_DTYPE_MISMATCH, needles);
    }
    // f16 (every buffer) is not supported
    let h = Call::new(FK_DTYPE_F16);
    for (op, s) in call_all(&h, 1e-6).into_iter().enumerate() {
        assert_eq!(s, FK_ERROR_UNSUPPORTED_DTYPE, "{}", NAMES[op]);
    }
    let s = call_one(&h, 3, 1e-6, "", null_mut());
    expect_status(
        s,
        FK_ERROR_UNSUPPORTED_DTYPE,
        &["points has dtype f16", "f32 or f64"],
    );
}

#[test]
fn bad_eps() {
    let c = Call::new(FK_DTYPE_F64);
    for eps in [-1e-6, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        for op in 0..4 {
            let s = call_one(&c, op, eps, "", null_mut());
            expect_status(
                s,
                FK_ERROR_INVALID_ARGUMENT,
                &[NAMES[op], "eps", "finite and >= 0"],
            );
        }
        let s = unsafe { c.x.field_forward(eps, c.out_f.raw(), NULL_STREAM) };
        expect_status(
            s,
            FK_ERROR_INVALID_ARGUMENT,
            &["fk_gaussian_field_forward", "eps", "finite and >= 0"],
        );
    }
}

#[test]
fn aliasing_and_layout() {
    let d = FK_DTYPE_F32;
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(18);
    // B == N so that out [B] and weights [N] have the same shape
    let p = Problem::random(&mut rng, 3, 3, 1e-6);
    let x = Inputs::new(&ctx, d, &p);
    let s = unsafe { x.field_forward(1e-6, x.weights.raw(), NULL_STREAM) };
    expect_status(
        s,
        FK_ERROR_ALIASING,
        &["fk_gaussian_field_forward", "out overlaps weights"],
    );
    // two gradient outputs in the same memory ([B,3] and [N,3] with B == N)
    let dout = fbuf(&ctx, d, &[3], &[1.0; 3]);
    let dp = Buf::new(&ctx, d, &[3, 3]);
    let grads = [dp.raw(), dp.raw(), null_mut(), null_mut()];
    let s = unsafe { x.field_backward(1e-6, dout.raw(), grads, null_mut(), NULL_STREAM) };
    expect_status(s, FK_ERROR_ALIASING, &["dmeans overlaps dpoints"]);
    // a gradient written over an input
    let grads = [x.points.raw(), null_mut(), null_mut(), null_mut()];
    let s = unsafe { x.field_backward(1e-6, dout.raw(), grads, null_mut(), NULL_STREAM) };
    expect_status(s, FK_ERROR_ALIASING, &["dpoints overlaps points"]);
    // a transposed (non-contiguous) view of points
    let mut host = vec![0f32; 9];
    let tp = unsafe { Buf::wrap(&ctx, host.as_mut_ptr() as *mut _, d, &[3, 3], Some(&[1, 3])) };
    let out = Buf::new(&ctx, d, &[3]);
    let s = unsafe { x.field_forward_on(tp.raw(), 1e-6, out.raw(), NULL_STREAM) };
    expect_status(s, FK_ERROR_UNSUPPORTED, &["points", "not contiguous"]);
    // a destroyed or foreign handle
    let s =
        unsafe { x.field_forward_on(ctx.raw() as *mut fk_buffer, 1e-6, out.raw(), NULL_STREAM) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["points is not a live fk_buffer"],
    );
}
