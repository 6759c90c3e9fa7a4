//! CPU implementations: the fallback without a GPU and the oracle the CUDA path is
//! tested against. One module per op family; this module holds the element types'
//! compute arithmetic shared by them.
//!
//! A plan's addresses (`addr::Addr`) were vouched for where they were made (see
//! `addr`), so the entry points take plans in safe signatures. Memory is
//! reached only through `host_slice` / `host_slice_mut` or typed pointers
//! (`Addr::ptr`, `addr::ptr`), offsets only through `element` (or `Mat::at` /
//! `Mat::elem`), each `unsafe` with a `// SAFETY:` line; never by integer sums.

pub mod elementwise;
pub mod gaussian;
pub mod geodesic;
pub mod linalg;
pub mod mlp;
pub mod optim;

use std::convert::identity;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::addr::Addr;

/// Below this many elements a loop runs on the calling thread: handing it to the
/// rayon pool wakes the pool's threads and waits for them, which costs more than
/// the loop (tens of microseconds when they sleep; the torch ops on small CPU
/// tensors paid it several times a call).
pub(crate) const PAR_MIN: usize = 1 << 15;

/// `f(i, chunk)` for the `chunk`-sized pieces of `v`: in parallel when `v` holds
/// at least `PAR_MIN` elements, else in order on this thread.
pub(crate) fn for_chunks_mut<T: Send>(
    v: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if v.len() < PAR_MIN {
        v.chunks_mut(chunk.max(1))
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        v.par_chunks_mut(chunk.max(1))
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}

/// The `len` elements of `T` at the host address `addr`, read-only: the one way
/// the CPU backend turns a plan's address into memory.
///
/// # Safety
///
/// When `len > 0` the caller guarantees, for the whole of the caller-chosen
/// lifetime `'a` (keep it within the op call that validated the plan):
/// - `addr` is `Some` and is a host address aligned for `T`;
/// - the `len * size_of::<T>()` bytes from it lie in one live allocation and hold
///   initialised values of `T` (what `ops` validates for an operand: dtype, shape,
///   contiguity, device);
/// - nothing writes to those bytes (no `host_slice_mut` over them, no other
///   thread, no kernel).
///
/// When `len == 0` nothing is read and `addr` may be anything (an empty operand
/// may have no memory).
///
/// Panics if `len > 0` and `addr` is `None` (a plan that says an absent operand
/// holds elements: a bug in the caller, caught before any memory is touched).
pub unsafe fn host_slice<'a, T>(addr: Option<Addr>, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    let a = addr.unwrap_or_else(|| panic!("host_slice: absent address for {len} elements"));
    // SAFETY: the caller's contract above (non-null: an `Addr` is never 0).
    unsafe { std::slice::from_raw_parts(a.ptr::<T>().cast_const(), len) }
}

/// The `len` elements of `T` at the host address `addr`, writable (an op output).
///
/// # Safety
///
/// As `host_slice`, and moreover no other reference (shared or mutable) to any of
/// those bytes exists while the returned slice lives: `ops` validated that an
/// output overlaps no input and no other output, and the caller takes at most one
/// slice of each output at a time (disjoint pieces, e.g. one per thread, are fine).
pub unsafe fn host_slice_mut<'a, T>(addr: Option<Addr>, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    let a = addr.unwrap_or_else(|| panic!("host_slice_mut: absent address for {len} elements"));
    // SAFETY: the caller's contract above (non-null: an `Addr` is never 0).
    unsafe { std::slice::from_raw_parts_mut(a.ptr::<T>(), len) }
}

/// The address of element `i` of the `T`s at `a` (`None` stays `None`): the one
/// way the CPU backend offsets an address.
///
/// # Safety
///
/// Element `i` lies inside (or one past the end of) the memory `a` was vouched
/// for (`addr`): an element of the same operand or scratch.
pub(crate) unsafe fn element<T>(a: Option<Addr>, i: usize) -> Option<Addr> {
    // SAFETY: the caller's contract is `byte_add`'s.
    a.map(|a| unsafe { a.byte_add((i * size_of::<T>()) as u64) })
}

/// A complex number with the same arithmetic as `kernels/common.cuh`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[repr(C)]
pub struct Complex<R> {
    pub re: R,
    pub im: R,
}

/// Arithmetic of a compute type (f32, f64, Complex<f32>, Complex<f64>).
pub trait Math: Copy + Send + Sync + 'static {
    /// The real type of `abs`.
    type Real: Copy;
    fn from_scalar(re: f64, im: f64) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self::Real;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tanh(self) -> Self;
    fn sigmoid(self) -> Self;
    /// `None` where relu is undefined (complex).
    fn relu(self) -> Option<Self>;
}

/// A real type's arithmetic is its own: the operator (`add`, `sub`, `mul`, `div`)
/// or the inherent method (`abs`, `exp`, ...) of the same name.
macro_rules! real_math {
    ($t:ty) => {
        impl Math for $t {
            type Real = $t;
            fn from_scalar(re: f64, _im: f64) -> Self {
                re as $t
            }
            real_math!(@operators Add add, Sub sub, Mul mul, Div div);
            fn neg(self) -> Self {
                -self
            }
            real_math!(@inherent $t: abs, exp, ln, sqrt, sin, cos, tanh);
            fn sigmoid(self) -> Self {
                1.0 / (1.0 + <$t>::exp(-self))
            }
            fn relu(self) -> Option<Self> {
                // NaN propagates, as in the kernel and torch.relu.
                Some(if self > 0.0 {
                    self
                } else if self.is_nan() {
                    self
                } else {
                    0.0
                })
            }
        }
    };
    (@operators $($op:ident $f:ident),+) => {
        $(fn $f(self, o: Self) -> Self {
            std::ops::$op::$f(self, o)
        })+
    };
    (@inherent $t:ty: $($f:ident),+) => {
        $(fn $f(self) -> Self {
            <$t>::$f(self)
        })+
    };
}
real_math!(f32);
real_math!(f64);

macro_rules! complex_math {
    ($r:ty) => {
        impl Math for Complex<$r> {
            type Real = $r;
            fn from_scalar(re: f64, im: f64) -> Self {
                Complex {
                    re: re as $r,
                    im: im as $r,
                }
            }
            fn add(self, o: Self) -> Self {
                Complex {
                    re: self.re + o.re,
                    im: self.im + o.im,
                }
            }
            fn sub(self, o: Self) -> Self {
                Complex {
                    re: self.re - o.re,
                    im: self.im - o.im,
                }
            }
            fn mul(self, o: Self) -> Self {
                Complex {
                    re: self.re * o.re - self.im * o.im,
                    im: self.re * o.im + self.im * o.re,
                }
            }
            /// Scaled by |c| + |d| (as cuComplex's cuCdiv and the kernel).
            fn div(self, o: Self) -> Self {
                let s = o.re.abs() + o.im.abs();
                let oos = 1.0 / s;
                let (ars, ais) = (self.re * oos, self.im * oos);
                let (brs, bis) = (o.re * oos, o.im * oos);
                let ood = 1.0 / (brs * brs + bis * bis);
                Complex {
                    re: (ars * brs + ais * bis) * ood,
                    im: (ais * brs - ars * bis) * ood,
                }
            }
            fn neg(self) -> Self {
                Complex {
                    re: -self.re,
                    im: -self.im,
                }
            }
            fn abs(self) -> $r {
                self.re.hypot(self.im)
            }
            fn exp(self) -> Self {
                let e = self.re.exp();
                Complex {
                    re: e * self.im.cos(),
                    im: e * self.im.sin(),
                }
            }
            fn ln(self) -> Self {
                Complex {
                    re: self.abs().ln(),
                    im: self.im.atan2(self.re),
                }
            }
            fn sqrt(self) -> Self {
                let r = self.abs();
                if r == 0.0 {
                    return Complex {
                        re: 0.0,
                        im: self.im,
                    };
                }
                let t = ((r + self.re.abs()) * 0.5).sqrt();
                if self.re >= 0.0 {
                    Complex {
                        re: t,
                        im: self.im / (2.0 * t),
                    }
                } else {
                    Complex {
                        re: self.im.abs() / (2.0 * t),
                        im: t.copysign(self.im),
                    }
                }
            }
            fn sin(self) -> Self {
                Complex {
                    re: self.re.sin() * self.im.cosh(),
                    im: self.re.cos() * self.im.sinh(),
                }
            }
            fn cos(self) -> Self {
                Complex {
                    re: self.re.cos() * self.im.cosh(),
                    im: -self.re.sin() * self.im.sinh(),
                }
            }
            /// Kahan's formula (as the kernel): no cancellation near the poles.
            fn tanh(self) -> Self {
                if self.re.abs() > 22.0 {
                    let e = (-2.0 * self.re.abs()).exp();
                    return Complex {
                        re: (1.0 as $r).copysign(self.re),
                        im: 4.0 * self.im.sin() * self.im.cos() * e,
                    };
                }
                let t = self.im.tan();
                let b = 1.0 + t * t;
                let s = self.re.sinh();
                let r = (1.0 + s * s).sqrt();
                let d = 1.0 + b * s * s;
                Complex {
                    re: b * r * s / d,
                    im: t / d,
                }
            }
            fn sigmoid(self) -> Self {
                let one = Complex { re: 1.0, im: 0.0 };
                one.div(one.add(self.neg().exp()))
            }
            fn relu(self) -> Option<Self> {
                None
            }
        }
    };
}
complex_math!(f32);
complex_math!(f64);

/// f32 / f64 storage of the real-only families (computed in f64).
pub trait Real: Copy + Send + Sync + 'static {
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}
impl Real for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
impl Real for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

/// A storage element type and its compute type (half types compute in f32, as the
/// kernels do, and round to nearest even on store).
pub trait Elem: Copy + Send + Sync + 'static {
    type C: Math;
    fn to_c(self) -> Self::C;
    fn from_c(c: Self::C) -> Self;
}

/// `elem! { T => C, to_c, from_c; ... }`: `T` computes in `C` through the two
/// conversions.
macro_rules! elem {
    ($($t:ty => $c:ty, $to:expr, $from:expr;)+) => {$(
        impl Elem for $t {
            type C = $c;
            fn to_c(self) -> $c {
                ($to)(self)
            }
            fn from_c(c: $c) -> Self {
                ($from)(c)
            }
        }
    )+};
}
elem! {
    f32 => f32, identity, identity;
    f64 => f64, identity, identity;
    Complex<f32> => Complex<f32>, identity, identity;
    Complex<f64> => Complex<f64>, identity, identity;
    f16 => f32, f16::to_f32, f16::from_f32;
    bf16 => f32, bf16::to_f32, bf16::from_f32;
}

/// `with_storage!($dtype, $t => $body; F32: f32, ...; d => other)`: `$body` with
/// `$t` the storage type of `$dtype`, for each listed dtype; the arms of
/// `with_real!` and `with_elem!`.
#[doc(hidden)]
#[macro_export]
macro_rules! with_storage {
    ($dtype:expr, $t:ident => $body:expr; $($d:ident: $ty:ty),+ $(; $p:pat => $other:expr)?) => {
        match $dtype {
            $($crate::dtype::DType::$d => {
                type $t = $ty;
                $body
            })+
            $($p => $other,)?
        }
    };
}

/// Runs `$body` with `$t` the storage type of a real dtype (f32 or f64; the
/// real-only families validate the dtype first).
#[macro_export]
macro_rules! with_real {
    ($dtype:expr, $t:ident => $body:expr) => {
        $crate::with_storage!($dtype, $t => $body; F32: f32, F64: f64;
            d => unreachable!("dtype {d} reached an f32/f64-only kernel"))
    };
}

/// Calls `$body` with `$t` bound to the storage type of `$dtype`.
#[macro_export]
macro_rules! with_elem {
    ($dtype:expr, $t:ident => $body:expr) => {
        $crate::with_storage!($dtype, $t => $body;
            F16: half::f16, BF16: half::bf16, F32: f32, F64: f64,
            C64: $crate::cpu::Complex<f32>, C128: $crate::cpu::Complex<f64>)
    };
}
