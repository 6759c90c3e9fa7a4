//! The elementwise op table, shared by `abi_elementwise` (CPU) and `gpu_elementwise`
//! (CUDA): every op with its scalars, its C call and its f64 reference (textbook
//! formulas, written independently of the library), and `Case`, one op run on
//! placed operands checked against that reference.

#![allow(dead_code)]

use std::ptr::null_mut;

use crate::common::*;

/// Every elementwise op, with its scalars.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Axpby(Cx, Cx),
    ScalarAdd(Cx),
    ScalarMul(Cx),
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    Copy,
}

impl Op {
    /// Every op, with scalars suited to `dtype` (imaginary parts only for complex;
    /// values exact in every dtype so the scalar itself is not rounded).
    pub fn all(dtype: fk_dtype) -> Vec<Op> {
        let (s, t) = if is_complex(dtype) {
            (cx(1.5, -0.75), cx(-0.5, 0.25))
        } else {
            (re(1.5), re(-0.75))
        };
        vec![
            Op::Add,
            Op::Sub,
            Op::Mul,
            Op::Div,
            Op::Axpby(s, t),
            Op::ScalarAdd(t),
            Op::ScalarMul(s),
            Op::Neg,
            Op::Abs,
            Op::Exp,
            Op::Log,
            Op::Sqrt,
            Op::Sin,
            Op::Cos,
            Op::Tanh,
            Op::Sigmoid,
            Op::Relu,
            Op::Copy,
        ]
    }
    /// The ops of `all` that accept `dtype` (`supports`), in the same order.
    pub fn supported(dtype: fk_dtype) -> Vec<Op> {
        Op::all(dtype)
            .into_iter()
            .filter(|op| op.supports(dtype))
            .collect()
    }
    /// Every op on every dtype it supports: `DTYPES` in order, each with its
    /// `supported` ops.
    pub fn every_with_dtype() -> Vec<(Op, fk_dtype)> {
        DTYPES
            .into_iter()
            .flat_map(|dtype| Op::supported(dtype).into_iter().map(move |op| (op, dtype)))
            .collect()
    }
    pub fn name(self) -> &'static str {
        match self {
            Op::Add => "fk_add",
            Op::Sub => "fk_sub",
            Op::Mul => "fk_mul",
            Op::Div => "fk_div",
            Op::Axpby(..) => "fk_axpby",
            Op::ScalarAdd(_) => "fk_scalar_add",
            Op::ScalarMul(_) => "fk_scalar_mul",
            Op::Neg => "fk_neg",
            Op::Abs => "fk_abs",
            Op::Exp => "fk_exp",
            Op::Log => "fk_log",
            Op::Sqrt => "fk_sqrt",
            Op::Sin => "fk_sin",
            Op::Cos => "fk_cos",
            Op::Tanh => "fk_tanh",
            Op::Sigmoid => "fk_sigmoid",
            Op::Relu => "fk_relu",
            Op::Copy => "fk_copy",
        }
    }
    pub fn is_binary(self) -> bool {
        matches!(self, Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Axpby(..))
    }
    /// Whether the op accepts `dtype` (relu is real only).
    pub fn supports(self, dtype: fk_dtype) -> bool {
        !(self == Op::Relu && is_complex(dtype))
    }
    pub fn out_dtype(self, dtype: fk_dtype) -> fk_dtype {
        if self == Op::Abs {
            real_of(dtype)
        } else {
            dtype
        }
    }
    pub fn domain_a(self) -> Domain {
        match self {
            Op::Log | Op::Sqrt => Domain::Positive,
            _ => Domain::Signed,
        }
    }
    /// f64 reference: textbook formulas (`complex` selects complex arithmetic).
    pub fn eval(self, complex: bool, x: Cx, y: Cx) -> Cx {
        let real = |f: fn(f64) -> f64| re(f(x.re));
        match self {
            Op::Add => x.add(y),
            Op::Sub => x.sub(y),
            Op::Mul => x.mul(y),
            Op::Div => x.div(y),
            Op::Axpby(a, b) => a.mul(x).add(b.mul(y)),
            Op::ScalarAdd(s) => x.add(s),
            Op::ScalarMul(s) => x.mul(s),
            Op::Neg => x.neg(),
            Op::Abs => re(x.abs()),
            Op::Copy => x,
            Op::Relu => {
                assert!(!complex);
                re(if x.re > 0.0 || x.re.is_nan() {
                    x.re
                } else {
                    0.0
                })
            }
            _ if complex => match self {
                Op::Exp => x.exp(),
                Op::Log => x.ln(),
                Op::Sqrt => x.sqrt(),
                Op::Sin => x.sin(),
                Op::Cos => x.cos(),
                Op::Tanh => x.tanh(),
                Op::Sigmoid => x.sigmoid(),
                _ => unreachable!(),
            },
            Op::Exp => real(f64::exp),
            Op::Log => real(f64::ln),
            Op::Sqrt => real(f64::sqrt),
            Op::Sin => real(f64::sin),
            Op::Cos => real(f64::cos),
            Op::Tanh => real(f64::tanh),
            Op::Sigmoid => re(1.0 / (1.0 + (-x.re).exp())),
        }
    }
    /// Calls the op through the C ABI (`b` ignored by unary ops).
    ///
    /// # Safety
    /// The pointers must be NULL or live handles of their kinds.
    pub unsafe fn call(
        self,
        a: *const fk_buffer,
        b: *const fk_buffer,
        out: *mut fk_buffer,
        stream: *const fk_stream,
    ) -> fk_status {
        unsafe {
            match self {
                Op::Add => fk_add(a, b, out, stream),
                Op::Sub => fk_sub(a, b, out, stream),
                Op::Mul => fk_mul(a, b, out, stream),
                Op::Div => fk_div(a, b, out, stream),
                Op::Axpby(x, y) => fk_axpby(x.scalar(), a, y.scalar(), b, out, stream),
                Op::ScalarAdd(s) => fk_scalar_add(a, s.scalar(), out, stream),
                Op::ScalarMul(s) => fk_scalar_mul(a, s.scalar(), out, stream),
                Op::Neg => fk_neg(a, out, stream),
                Op::Abs => fk_abs(a, out, stream),
                Op::Exp => fk_exp(a, out, stream),
                Op::Log => fk_log(a, out, stream),
                Op::Sqrt => fk_sqrt(a, out, stream),
                Op::Sin => fk_sin(a, out, stream),
                Op::Cos => fk_cos(a, out, stream),
                Op::Tanh => fk_tanh(a, out, stream),
                Op::Sigmoid => fk_sigmoid(a, out, stream),
                Op::Relu => fk_relu(a, out, stream),
                Op::Copy => fk_copy(a, out, stream),
            }
        }
    }
}

/// One op run: operands, output layout.
pub struct Case<'a> {
    pub op: Op,
    pub dtype: fk_dtype,
    pub a: &'a Operand,
    pub b: Option<&'a Operand>,
    pub out: &'a View,
}

impl Case<'_> {
    /// Runs the case on `ctx` (queued on `stream`, NULL = default; synchronised
    /// afterwards) with a poisoned output, and returns the output's elements.
    pub fn run(&self, ctx: &Ctx, stream: *const fk_stream) -> Vec<Cx> {
        let a = Placed::input(ctx, self.dtype, self.a);
        let b = self.b.map(|b| Placed::input(ctx, self.dtype, b));
        let out = Placed::poisoned(ctx, self.op.out_dtype(self.dtype), self.out);
        let bh = b.as_ref().map_or(null_mut(), |b| b.handle());
        let s = unsafe { self.op.call(a.handle(), bh, out.handle(), stream) };
        assert!(
            s == FK_OK,
            "{} on {}: {} {}",
            self.op.name(),
            dname(self.dtype),
            status_name(s),
            last_error()
        );
        if !stream.is_null() {
            ok(unsafe { fk_stream_synchronize(stream) });
        }
        out.read_checked()
    }
    /// The f64 reference for the output's elements.
    pub fn reference(&self) -> Vec<Cx> {
        let shape = &self.out.shape;
        let av = broadcast_to(&self.a.values(), &self.a.view.shape, shape);
        let bv = match self.b {
            Some(b) => broadcast_to(&b.values(), &b.view.shape, shape),
            None => vec![Cx::default(); av.len()],
        };
        let c = is_complex(self.dtype);
        av.iter()
            .zip(&bv)
            .map(|(&x, &y)| self.op.eval(c, x, y))
            .collect()
    }
    pub fn describe(&self) -> String {
        format!(
            "{} {} a {:?}/{:?} b {:?} out {:?}/{:?}",
            self.op.name(),
            dname(self.dtype),
            self.a.view.shape,
            self.a.view.strides,
            self.b.map(|b| (&b.view.shape, &b.view.strides)),
            self.out.shape,
            self.out.strides
        )
    }
}

/// Runs `case` on `ctx` and checks it against the f64 reference.
#[track_caller]
pub fn check_against_reference(ctx: &Ctx, case: &Case, stream: *const fk_stream) {
    let got = case.run(ctx, stream);
    assert_close(&got, &case.reference(), tol(case.dtype), &case.describe());
}

/// Random operands for `op` with inputs shaped `a_view`/`b_view`.
pub fn operands(
    rng: &mut Rng,
    op: Op,
    dtype: fk_dtype,
    a_view: View,
    b_view: View,
) -> (Operand, Option<Operand>) {
    let a = Operand::random(rng, dtype, a_view, op.domain_a());
    let b = op
        .is_binary()
        .then(|| Operand::random(rng, dtype, b_view, Domain::Signed));
    (a, b)
}

/// `op` on random operands shaped `a_view`/`b_view` (`operands`: a drawn first, then b
/// for a binary op), written to `out`: the case is handed to `check`.
pub fn with_random_case<T>(
    rng: &mut Rng,
    (op, dtype): (Op, fk_dtype),
    (a_view, b_view): (View, View),
    out: &View,
    check: impl FnOnce(&Case) -> T,
) -> T {
    let (a, b) = operands(rng, op, dtype, a_view, b_view);
    check(&Case {
        op,
        dtype,
        a: &a,
        b: b.as_ref(),
        out,
    })
}

/// `op` on random operands (`with_random_case`) run on `ctx` and checked against the
/// f64 reference (`check_against_reference`).
#[track_caller]
pub fn check_random_case(
    ctx: &Ctx,
    rng: &mut Rng,
    op_dtype: (Op, fk_dtype),
    views: (View, View),
    out: &View,
    stream: *const fk_stream,
) {
    with_random_case(rng, op_dtype, views, out, |case| {
        check_against_reference(ctx, case, stream)
    });
}
