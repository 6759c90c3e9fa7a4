//! Elementwise ops (fk_add ... fk_copy) on arbitrary dtypes, shapes, strides,
//! broadcasting, aliasing and scalars. Oracle: `check` on every status; when a
//! call succeeds on real dtypes, `out` must have the broadcast shape and hold an
//! f64 reference of the op (computed from the inputs as read before the call)
//! rounded to the dtype, and nothing outside `out` may change.
#![no_main]

use fusekit_fuzz::*;
use libfuzzer_sys::fuzz_target;

const BINARY: [&str; 5] = ["fk_add", "fk_sub", "fk_mul", "fk_div", "fk_axpby"];
const UNARY: [&str; 13] = [
    "fk_neg",
    "fk_abs",
    "fk_exp",
    "fk_log",
    "fk_sqrt",
    "fk_sin",
    "fk_cos",
    "fk_tanh",
    "fk_sigmoid",
    "fk_relu",
    "fk_scalar_add",
    "fk_scalar_mul",
    "fk_copy",
];

fn unary_ref(name: &str, x: f64, s: f64) -> f64 {
    match name {
        "fk_neg" => -x,
        "fk_abs" => x.abs(),
        "fk_exp" => x.exp(),
        "fk_log" => x.ln(),
        "fk_sqrt" => x.sqrt(),
        "fk_sin" => x.sin(),
        "fk_cos" => x.cos(),
        "fk_tanh" => x.tanh(),
        "fk_sigmoid" => 1.0 / (1.0 + (-x).exp()),
        "fk_relu" => {
            if x.is_nan() || x > 0.0 {
                x
            } else {
                0.0
            }
        }
        "fk_scalar_add" => x + s,
        "fk_scalar_mul" => x * s,
        "fk_copy" => x,
        _ => unreachable!(),
    }
}

/// Broadcast shape of two shapes (NumPy rules), None when they do not broadcast.
fn broadcast(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

/// Values of `v` broadcast to `target`, row-major (real dtypes).
fn values(v: &View, target: &[i64]) -> Vec<f64> {
    let mut out = vec![];
    let off = target.len() - v.shape.len();
    for_each_index(target, |idx| {
        let src: Vec<i64> = v
            .shape
            .iter()
            .enumerate()
            .map(|(i, &d)| if d == 1 { 0 } else { idx[off + i] })
            .collect();
        // SAFETY: the index is inside v's shape; v lies in the arena or its own storage.
        out.push(unsafe { read_real(v.data.offset(byte_offset(v, &src)), v.dtype) });
    });
    out
}

/// Whether two views share at least one byte (by address ranges).
fn touches(a: &View, b: &View) -> bool {
    let range = |v: &View| {
        let es = elem_size(v.dtype) as i128;
        extent(&v.shape, &v.strides).map(|(lo, hi)| {
            (
                v.data as i128 + lo.saturating_mul(es),
                (v.data as i128 + hi.saturating_mul(es)).saturating_add(es),
            )
        })
    };
    match (range(a), range(b)) {
        (Some((a0, a1)), Some((b0, b1))) => a0 < b1 && b0 < a1,
        _ => false,
    }
}

fn same_view(a: &View, b: &View) -> bool {
    a.data == b.data && a.shape == b.shape && a.strides == b.strides && a.dtype == b.dtype
}

fn close(got: f64, want: f64, scale: f64, dtype: i32) -> bool {
    let want = round_to(want, dtype);
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        // Rounding in the dtype's arithmetic may cross the overflow threshold.
        let big = 0.99 * max_finite(dtype);
        return got == want
            || (got.abs() >= big && want.abs() >= big && got.signum() == want.signum());
    }
    let tol = match dtype {
        1 | 2 => 1e-2,
        3 => 1e-5,
        _ => 1e-12,
    };
    (got - want).abs() <= tol * scale.max(want.abs()) + 1e-30
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let mut m = Maker::new(&mut b);
    while !b.is_empty() {
        let dtype = b.dtype();
        let nd = b.below(4);
        let shape: Vec<i64> = (0..nd)
            .map(|_| {
                if b.one_in(8) {
                    b.dim()
                } else {
                    (b.u8() % 4) as i64
                }
            })
            .collect();
        // Input shapes: out's shape, or a broadcastable one (leading dims dropped, some set to 1).
        let in_shape = |b: &mut Bytes| -> Vec<i64> {
            let drop = b.below(shape.len() + 1);
            shape[drop..]
                .iter()
                .map(|&d| if b.one_in(3) { 1 } else { d })
                .collect()
        };
        let binary = b.bool();
        let (sa, sb) = (in_shape(&mut b), in_shape(&mut b));
        let a = m.arg(&mut b, dtype, &sa);
        let bb = if binary {
            m.arg(&mut b, dtype, &sb)
        } else {
            std::ptr::null_mut()
        };
        let out = if b.one_in(5) && !a.is_null() {
            a
        } else {
            m.arg(&mut b, dtype, &shape)
        };
        let out = if out.is_null() && b.one_in(2) { a } else { out };
        let (alpha, beta) = (b.scalar(), b.scalar());
        let stream = m.stream_arg(&mut b);
        let which = b.u8() as usize;

        // Snapshot what the reference needs, before the call (out may alias an input).
        let live = |p: *mut fk_buffer| !p.is_null() && m.owned.buffers.contains(&p);
        let small = |p: *mut fk_buffer| {
            let mut n = 0i64;
            // SAFETY: live buffer.
            unsafe { fk_buffer_numel(p, &mut n) };
            n <= 4096
        };
        let checkable = live(a) && live(out) && (!binary || live(bb)) && small(out);
        let snap = checkable.then(|| {
            let (va, vo) = (view(a), view(out));
            let vb = binary.then(|| view(bb));
            let real = |v: &View| (1..=4).contains(&v.dtype);
            let ok = real(&va) && real(&vo) && vb.as_ref().is_none_or(real);
            let ins: Vec<(View, Vec<f64>)> = if ok {
                [Some(va), vb]
                    .into_iter()
                    .flatten()
                    .map(|v| {
                        let vals = broadcast(&v.shape, &vo.shape)
                            .map(|t| {
                                if t == vo.shape {
                                    values(&v, &t)
                                } else {
                                    vec![]
                                }
                            })
                            .unwrap_or_default();
                        (v, vals)
                    })
                    .collect()
            } else {
                vec![]
            };
            let before = m.arena.snapshot();
            (vo, ins, before, ok)
        });

        if std::env::var_os("FK_FUZZ_TRACE").is_some() {
            let live = |p: *mut fk_buffer| !p.is_null() && m.owned.buffers.contains(&p);
            let desc = |p: *mut fk_buffer| {
                if live(p) {
                    let v = view(p);
                    format!("{} {:?} {:?}", v.dtype, v.shape, v.strides)
                } else {
                    format!("{p:?}")
                }
            };
            eprintln!(
                "binary={binary} which={which} a={} b={} out={}",
                desc(a),
                desc(bb),
                desc(out)
            );
        }
        // SAFETY: every handle is live or NULL or deliberately of the wrong kind.
        let (name, st) = unsafe {
            if binary {
                let name = BINARY[which % 5];
                let st = match which % 5 {
                    0 => fk_add(a, bb, out, stream),
                    1 => fk_sub(a, bb, out, stream),
                    2 => fk_mul(a, bb, out, stream),
                    3 => fk_div(a, bb, out, stream),
                    _ => fk_axpby(alpha, a, beta, bb, out, stream),
                };
                (name, st)
            } else {
                let name = UNARY[which % 13];
                let st = match which % 13 {
                    0 => fk_neg(a, out, stream),
                    1 => fk_abs(a, out, stream),
                    2 => fk_exp(a, out, stream),
                    3 => fk_log(a, out, stream),
                    4 => fk_sqrt(a, out, stream),
                    5 => fk_sin(a, out, stream),
                    6 => fk_cos(a, out, stream),
                    7 => fk_tanh(a, out, stream),
                    8 => fk_sigmoid(a, out, stream),
                    9 => fk_relu(a, out, stream),
                    10 => fk_scalar_add(a, alpha, out, stream),
                    11 => fk_scalar_mul(a, alpha, out, stream),
                    _ => fk_copy(a, out, stream),
                };
                (name, st)
            }
        };
        if !check(st, name) {
            continue;
        }
        let Some((vo, ins, before, real)) = snap else {
            continue;
        };
        // A success means: shapes broadcast to out's, out does not partly overlap an
        // input, and scalars of a real op are real.
        for (v, _) in &ins {
            assert!(
                broadcast(&v.shape, &vo.shape).as_deref() == Some(&vo.shape[..]),
                "{name} accepted input shape {:?} for out {:?}",
                v.shape,
                vo.shape
            );
            assert!(
                same_view(v, &vo) || !touches(v, &vo),
                "{name} accepted an out partly overlapping an input"
            );
        }
        if !real
            || ins
                .iter()
                .any(|(_, vals)| vals.is_empty() && vo.shape.iter().all(|&d| d > 0))
        {
            continue;
        }
        let uses_alpha = binary && which % 5 == 4 || !binary && matches!(which % 13, 10 | 11);
        if uses_alpha {
            assert!(
                alpha.im == 0.0 && (!binary || beta.im == 0.0),
                "{name} accepted a complex scalar for a real dtype"
            );
        }
        let fits = |s: f64| s.is_finite() && s.abs() <= max_finite(vo.dtype);
        if uses_alpha && !(fits(alpha.re) && (!binary || fits(beta.re))) {
            continue; // scalars outside the dtype's range: only the crash oracle
        }
        // Scalars enter the arithmetic in the compute precision: f32 for f16, bf16
        // and f32 (docs/ops.md, "Precision"), f64 for f64.
        let compute = |v: f64| if vo.dtype == 4 { v } else { v as f32 as f64 };
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
        let got = values(&vo, &vo.shape);
        for (i, &g) in got.iter().enumerate() {
            let x = ins[0].1[i];
            let (want, scale) = if binary {
                let y = ins[1].1[i];
                match which % 5 {
                    0 => (x + y, x.abs() + y.abs()),
                    1 => (x - y, x.abs() + y.abs()),
                    2 => (x * y, (x * y).abs()),
                    3 => (x / y, (x / y).abs()),
                    _ => (
                        alpha.re * x + beta.re * y,
                        (alpha.re * x).abs() + (beta.re * y).abs(),
                    ),
                }
            } else {
                let w = unary_ref(name, x, alpha.re);
                let scale = if name == "fk_scalar_add" {
                    x.abs() + alpha.re.abs()
                } else {
                    w.abs()
                };
                (w, scale)
            };
            if binary && scale > max_finite(vo.dtype) {
                continue; // an intermediate overflows the dtype: inf/NaN by evaluation order
            }
            // Inputs are rounded to the dtype already; half types compute in f32.
            assert!(
                close(g, want, scale, vo.dtype),
                "{name} dtype {} element {i}: got {g:e}, want {want:e} (inputs {:?})",
                vo.dtype,
                ins.iter().map(|(_, v)| v[i]).collect::<Vec<_>>()
            );
        }
        m.arena.assert_only_changed(&before, &vo);
    }
});
