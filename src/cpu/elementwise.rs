//! CPU elementwise kernels: strided iteration over a `Plan`, parallel over chunks
//! of the output with rayon. Outputs may alias inputs exactly (validated in `ops`),
//! so memory is accessed through raw addresses element by element.

use rayon::prelude::*;

use super::{Complex, Elem, Math};
use crate::addr::Addr;
use crate::dtype::DType;
use crate::error::Result;
use crate::plan::elementwise::{BinaryOp, Plan, UnaryOp};

const CHUNK: i64 = 1 << 15;

/// Calls `f(off_out, off_a, off_b)` (element offsets) for every element of `p`.
pub(crate) fn for_each_offset<F: Fn(i64, i64, i64) + Sync>(p: &Plan, f: F) {
    let run_chunk = |start: i64, end: i64| {
        if p.contiguous {
            for i in start..end {
                f(i, i, i);
            }
            return;
        }
        let nd = p.shape.len();
        let mut coord = [0i64; crate::layout::FK_MAX_DIMS];
        let (mut oo, mut oa, mut ob) = (0i64, 0i64, 0i64);
        let mut rem = start;
        for d in (0..nd).rev() {
            coord[d] = rem % p.shape[d];
            rem /= p.shape[d];
            oo += coord[d] * p.so[d];
            oa += coord[d] * p.sa[d];
            ob += coord[d] * p.sb[d];
        }
        for _ in start..end {
            f(oo, oa, ob);
            // advance the multi-index
            let mut d = nd;
            while d > 0 {
                d -= 1;
                coord[d] += 1;
                oo += p.so[d];
                oa += p.sa[d];
                ob += p.sb[d];
                if coord[d] < p.shape[d] {
                    break;
                }
                oo -= p.so[d] * p.shape[d];
                oa -= p.sa[d] * p.shape[d];
                ob -= p.sb[d] * p.shape[d];
                coord[d] = 0;
            }
        }
    };
    if p.n <= CHUNK {
        run_chunk(0, p.n);
    } else {
        let chunks = (p.n + CHUNK - 1) / CHUNK;
        (0..chunks)
            .into_par_iter()
            .for_each(|c| run_chunk(c * CHUNK, ((c + 1) * CHUNK).min(p.n)));
    }
}

/// The element at element offset `off` from `base`.
///
/// # Safety
///
/// Element `off` from `base` (`base + off * size_of::<T>()` bytes) is a host
/// address inside the buffer `base` was vouched for, which `ops` validated as
/// holding a `T` there, valid for reads during the call. (Outputs
/// may alias inputs exactly, so elements are read and written through raw
/// pointers, never through slices, which would assert exclusivity.)
#[inline(always)]
unsafe fn load<T: Copy>(base: Addr, off: i64) -> T {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::read_unaligned(base.ptr::<T>().offset(off as isize)) }
}

/// Writes `v` at element offset `off` from `base`.
///
/// # Safety
///
/// As `load`, for writes; the output does not self-overlap and aliases inputs
/// only exactly, so each element is read before it is written.
#[inline(always)]
unsafe fn store<T: Copy>(base: Addr, off: i64, v: T) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_unaligned(base.ptr::<T>().offset(off as isize), v) }
}

/// The plan's output and first input (present: the output is not empty).
fn out_a(p: &Plan) -> (Addr, Addr) {
    match (p.out, p.a) {
        (Some(out), Some(a)) => (out, a),
        _ => unreachable!("an elementwise plan of {} elements without memory", p.n),
    }
}

fn apply2<T: Elem, F: Fn(T::C, T::C) -> T::C + Sync>(p: &Plan, f: F) {
    let (out, a) = out_a(p);
    let b =
        p.b.unwrap_or_else(|| unreachable!("a binary plan without b"));
    for_each_offset(p, |oo, oa, ob| {
        // SAFETY: `ops` validated every offset of the plan against its buffer.
        unsafe {
            let r = f(load::<T>(a, oa).to_c(), load::<T>(b, ob).to_c());
            store::<T>(out, oo, T::from_c(r));
        }
    });
}

fn apply1<T: Elem, U: Copy, F: Fn(T::C) -> U + Sync>(p: &Plan, f: F) {
    let (out, a) = out_a(p);
    // SAFETY: `ops` validated every offset of the plan against its buffer.
    for_each_offset(p, |oo, oa, _| unsafe {
        store::<U>(out, oo, f(load::<T>(a, oa).to_c()))
    });
}

fn binary_t<T: Elem>(op: BinaryOp, p: &Plan) {
    let alpha = T::C::from_scalar(p.alpha.re, p.alpha.im);
    let beta = T::C::from_scalar(p.beta.re, p.beta.im);
    match op {
        BinaryOp::Add => apply2::<T, _>(p, |x, y| x.add(y)),
        BinaryOp::Sub => apply2::<T, _>(p, |x, y| x.sub(y)),
        BinaryOp::Mul => apply2::<T, _>(p, |x, y| x.mul(y)),
        BinaryOp::Div => apply2::<T, _>(p, |x, y| x.div(y)),
        BinaryOp::Axpby => apply2::<T, _>(p, |x, y| alpha.mul(x).add(beta.mul(y))),
    }
}

pub fn binary(op: BinaryOp, p: &Plan) -> Result<()> {
    crate::with_elem!(p.in_dtype, T => binary_t::<T>(op, p));
    Ok(())
}

fn unary_t<T: Elem>(op: UnaryOp, p: &Plan) {
    let s = T::C::from_scalar(p.alpha.re, p.alpha.im);
    let q = |f: fn(T::C) -> T::C| apply1::<T, T, _>(p, move |x| T::from_c(f(x)));
    match op {
        UnaryOp::Neg => q(|x| x.neg()),
        UnaryOp::Exp => q(|x| x.exp()),
        UnaryOp::Log => q(|x| x.ln()),
        UnaryOp::Sqrt => q(|x| x.sqrt()),
        UnaryOp::Sin => q(|x| x.sin()),
        UnaryOp::Cos => q(|x| x.cos()),
        UnaryOp::Tanh => q(|x| x.tanh()),
        UnaryOp::Sigmoid => q(|x| x.sigmoid()),
        UnaryOp::Relu => q(|x| x.relu().unwrap_or(x)),
        UnaryOp::Copy => q(|x| x),
        UnaryOp::ScalarAdd => apply1::<T, T, _>(p, move |x| T::from_c(x.add(s))),
        UnaryOp::ScalarMul => apply1::<T, T, _>(p, move |x| T::from_c(x.mul(s))),
        UnaryOp::Abs => unreachable!("abs is dispatched by unary()"),
    }
}

fn abs_real<T: Elem<C = R>, R: Math<Real = R>>(p: &Plan) {
    apply1::<T, T, _>(p, |x| T::from_c(x.abs()));
}

pub fn unary(op: UnaryOp, p: &Plan) -> Result<()> {
    if op == UnaryOp::Abs {
        match p.in_dtype {
            DType::F16 => abs_real::<half::f16, f32>(p),
            DType::BF16 => abs_real::<half::bf16, f32>(p),
            DType::F32 => abs_real::<f32, f32>(p),
            DType::F64 => abs_real::<f64, f64>(p),
            DType::C64 => apply1::<Complex<f32>, f32, _>(p, |x| x.abs()),
            DType::C128 => apply1::<Complex<f64>, f64, _>(p, |x| x.abs()),
        }
        return Ok(());
    }
    crate::with_elem!(p.in_dtype, T => unary_t::<T>(op, p));
    Ok(())
}
