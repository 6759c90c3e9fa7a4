//! CPU linear algebra: GEMM through `matrixmultiply` (blocked, SIMD microkernels),
//! parallel over tiles of C with rayon; f16/bf16 convert to f32 (f32 accumulation,
//! as cuBLAS's compute type 32F), complex conjugation by a conjugated copy.
//! The fused linear layer, its backward and the Kronecker product build on it.

use half::{bf16, f16};
use rayon::prelude::*;

use super::{Complex, element, host_slice, host_slice_mut};
use crate::addr::Addr;
use crate::addr::ptr;
use crate::dtype::DType;
use crate::error::Result;
use crate::plan::linalg::{
    Activation, GELU_TANH_A, GELU_TANH_C, GemmPlan, KronPlan, LinearBwdPlan, LinearPlan, Mat, Trans,
};

/// A matrix view for the kernels: the address of its first element (`None`: a
/// matrix without elements) and (row, column) strides in elements.
#[derive(Clone, Copy)]
struct View {
    at: Option<Addr>,
    rs: isize,
    cs: isize,
}

impl View {
    /// The view of the sub-matrix from row `i`, column `j` on (elements of `T`).
    ///
    /// # Safety
    ///
    /// Element `(i, j)` lies inside the matrix the view was made for.
    unsafe fn corner<T>(self, i: usize, j: usize) -> View {
        let off = (i as isize * self.rs + j as isize * self.cs) * size_of::<T>() as isize;
        View {
            // SAFETY: the caller's contract: the corner is inside the same memory.
            at: self.at.map(|a| unsafe { a.offset(off as i64) }),
            ..self
        }
    }
}

/// One tile's product `C = alpha A B + beta C`, `A` `m x k`, `B` `k x n`.
#[derive(Clone, Copy)]
struct Tile<T> {
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: View,
    b: View,
    beta: T,
    c: View,
}

/// Element types matrixmultiply multiplies.
trait Mm: Copy + Send + Sync + 'static {
    const ZERO: Self;
    /// The product of tile `t` (single-threaded).
    unsafe fn mm(t: Tile<Self>);
    fn conj(self) -> Self;
    fn scalar(re: f64, im: f64) -> Self;
}

macro_rules! real_mm {
    ($r:ty, $f:ident) => {
        impl Mm for $r {
            const ZERO: Self = 0.0;
            unsafe fn mm(t: Tile<Self>) {
                // SAFETY: the caller passes views inside live buffers, C tiles disjoint.
                unsafe {
                    matrixmultiply::$f(
                        t.m,
                        t.k,
                        t.n,
                        t.alpha,
                        ptr::<$r>(t.a.at),
                        t.a.rs,
                        t.a.cs,
                        ptr::<$r>(t.b.at),
                        t.b.rs,
                        t.b.cs,
                        t.beta,
                        ptr::<$r>(t.c.at),
                        t.c.rs,
                        t.c.cs,
                    )
                }
            }
            fn conj(self) -> Self {
                self
            }
            fn scalar(re: f64, _: f64) -> Self {
                re as $r
            }
        }
    };
}
real_mm!(f32, sgemm);
real_mm!(f64, dgemm);

macro_rules! complex_mm {
    ($r:ty, $f:ident) => {
        impl Mm for Complex<$r> {
            const ZERO: Self = Complex { re: 0.0, im: 0.0 };
            unsafe fn mm(t: Tile<Self>) {
                use matrixmultiply::CGemmOption::Standard;
                // SAFETY: Complex<R> is repr(C) {re, im}, the layout of [R; 2].
                unsafe {
                    matrixmultiply::$f(
                        Standard,
                        Standard,
                        t.m,
                        t.k,
                        t.n,
                        [t.alpha.re, t.alpha.im],
                        ptr::<[$r; 2]>(t.a.at),
                        t.a.rs,
                        t.a.cs,
                        ptr::<[$r; 2]>(t.b.at),
                        t.b.rs,
                        t.b.cs,
                        [t.beta.re, t.beta.im],
                        ptr::<[$r; 2]>(t.c.at),
                        t.c.rs,
                        t.c.cs,
                    )
                }
            }
            fn conj(self) -> Self {
                Complex {
                    re: self.re,
                    im: -self.im,
                }
            }
            fn scalar(re: f64, im: f64) -> Self {
                Complex {
                    re: re as $r,
                    im: im as $r,
                }
            }
        }
    };
}
complex_mm!(f32, cgemm);
complex_mm!(f64, zgemm);

/// `C = alpha A B + beta C` for `batch` matrices (`a_at(i)` etc. give the views of
/// matrix `i`), parallel over tiles of C. `A` is `m x k`, `B` `k x n`.
#[allow(clippy::too_many_arguments)]
fn par_gemm<T: Mm>(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    alpha: T,
    a_at: &(dyn Fn(usize) -> View + Sync),
    b_at: &(dyn Fn(usize) -> View + Sync),
    beta: T,
    c_at: &(dyn Fn(usize) -> View + Sync),
) {
    let threads = rayon::current_num_threads().max(1);
    let work = (batch * m * n).saturating_mul(k.max(1));
    // Tiles: enough for every thread twice over, none smaller than 32 rows x 128
    // columns (below that, packing overheads dominate).
    let (mut mb, mut nb) = (m.max(1), n.max(1));
    if threads > 1 && work >= 1 << 18 {
        let want = 2 * threads;
        let per_batch = want.div_ceil(batch).max(1);
        let row_tiles = per_batch.min(m.div_ceil(32)).max(1);
        mb = m.div_ceil(row_tiles);
        let col_tiles = per_batch.div_ceil(row_tiles).min(n.div_ceil(128)).max(1);
        nb = n.div_ceil(col_tiles);
    }
    let (rt, ct) = (m.div_ceil(mb).max(1), n.div_ceil(nb).max(1));
    let tiles = batch * rt * ct;
    let run = |t: usize| {
        let (bi, r) = (t / (rt * ct), t % (rt * ct));
        let (i0, j0) = ((r / ct) * mb, (r % ct) * nb);
        let (mi, nj) = (mb.min(m - i0.min(m)), nb.min(n - j0.min(n)));
        if mi == 0 || nj == 0 {
            return;
        }
        let (a, b, c) = (a_at(bi), b_at(bi), c_at(bi));
        // SAFETY: i0 < m and j0 < n: row i0 of op(A) (m x k), column j0 of op(B)
        // (k x n) and element (i0, j0) of C (m x n) lie inside their matrices (with
        // k = 0, A and B have no elements and keep their first address).
        let (a, b, c) = unsafe {
            (
                if k == 0 { a } else { a.corner::<T>(i0, 0) },
                if k == 0 { b } else { b.corner::<T>(0, j0) },
                c.corner::<T>(i0, j0),
            )
        };
        // SAFETY: the tile lies inside the operands; C tiles are disjoint.
        unsafe {
            T::mm(Tile {
                m: mi,
                k,
                n: nj,
                alpha,
                a,
                b,
                beta,
                c,
            })
        };
    };
    if tiles == 1 {
        run(0);
    } else {
        (0..tiles).into_par_iter().for_each(run);
    }
}

/// The view of `op(X)` for a stored row-major matrix at `at` with row stride `ld`.
fn op_view(at: Option<Addr>, ld: i64, op: Trans) -> View {
    if op.transposed() {
        View {
            at,
            rs: 1,
            cs: ld as isize,
        }
    } else {
        View {
            at,
            rs: ld as isize,
            cs: 1,
        }
    }
}

/// The address of this backend's host scratch `v`.
///
/// # Safety
///
/// The caller keeps `v` alive and unmoved (no push, no reallocation) while the
/// address is used, and uses it only inside `v`; `v` is a pointer from `as_ptr`
/// or, for memory that will be written, `as_mut_ptr`.
unsafe fn scratch<T>(v: *const T) -> Option<Addr> {
    // SAFETY: the caller's contract.
    unsafe { Addr::from_ptr(v) }
}

/// A conjugated contiguous copy of every distinct matrix of `x` (row-major, `ld =
/// cols`), for `op = C` on complex types.
fn conj_copy<T: Mm>(x: &Mat, batch: i64) -> (Vec<T>, Mat) {
    let nb = if x.batch_stride == 0 { 1 } else { batch };
    let (r, c) = (x.rows as usize, x.cols as usize);
    let mut v = vec![T::ZERO; nb as usize * r * c];
    super::for_chunks_mut(&mut v, (r * c).max(1), |bi, dst| {
        // SAFETY: bi < nb, a matrix of the validated operand.
        let base = ptr::<T>(unsafe { x.at(bi as i64, size_of::<T>()) });
        for i in 0..r {
            for j in 0..c {
                // SAFETY: (i, j) lies inside matrix bi of the validated operand.
                let e = unsafe { *base.add(i * x.ld as usize + j) };
                dst[i * c + j] = e.conj();
            }
        }
    });
    let m = Mat {
        // SAFETY: `v` goes back with the matrix; the caller keeps it while the
        // matrix is read (moving a Vec keeps its heap memory in place).
        addr: unsafe { scratch(v.as_ptr()) },
        rows: x.rows,
        cols: x.cols,
        ld: x.cols.max(1),
        batch_stride: if nb == 1 { 0 } else { x.rows * x.cols },
    };
    (v, m)
}

fn gemm_t<T: Mm>(p: &GemmPlan) {
    let conj = |op: Trans| op == Trans::C && p.dtype.is_complex();
    let (_ka, a) = if conj(p.op_a) {
        let (v, m) = conj_copy::<T>(&p.a, p.batch);
        (Some(v), m)
    } else {
        (None, p.a)
    };
    let (_kb, b) = if conj(p.op_b) {
        let (v, m) = conj_copy::<T>(&p.b, p.batch);
        (Some(v), m)
    } else {
        (None, p.b)
    };
    let es = size_of::<T>();
    // SAFETY (three): par_gemm asks for matrices i < batch, of the plan's operands
    // (or of the conjugated copies, which live until the end of this function).
    let a_at = |i: usize| op_view(unsafe { a.at(i as i64, es) }, a.ld, p.op_a);
    let b_at = |i: usize| op_view(unsafe { b.at(i as i64, es) }, b.ld, p.op_b);
    let c_at = |i: usize| op_view(unsafe { p.c.at(i as i64, es) }, p.c.ld, Trans::N);
    par_gemm::<T>(
        p.batch as usize,
        p.m as usize,
        p.n as usize,
        p.k as usize,
        T::scalar(p.alpha.re, p.alpha.im),
        &a_at,
        &b_at,
        T::scalar(p.beta.re, p.beta.im),
        &c_at,
    );
}

/// Storage types computed in f32 (the half types; f32 itself for the fused linear
/// layer): element <-> f32.
trait Half: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}
impl Half for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl Half for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}
impl Half for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

/// Contiguous f32 copies of `rows x cols` row-major matrices (row stride `ld`).
fn widen<H: Half>(x: &Mat, count: i64) -> Vec<f32> {
    let (r, c) = (x.rows as usize, x.cols as usize);
    let mut v = vec![0f32; count as usize * r * c];
    super::for_chunks_mut(&mut v, c.max(1), |row, dst| {
        let (bi, i) = (row / r.max(1), row % r.max(1));
        // SAFETY: bi < count, a matrix of the validated operand.
        let base = ptr::<H>(unsafe { x.at(bi as i64, 2) });
        for (j, d) in dst.iter_mut().enumerate() {
            // SAFETY: (i, j) lies inside matrix bi of the validated operand.
            *d = unsafe { *base.add(i * x.ld as usize + j) }.to_f32();
        }
    });
    v
}

fn gemm_half<H: Half>(p: &GemmPlan) {
    let count = |x: &Mat| if x.batch_stride == 0 { 1 } else { p.batch };
    let (ca, cb) = (count(&p.a), count(&p.b));
    let a32 = widen::<H>(&p.a, ca);
    let b32 = widen::<H>(&p.b, cb);
    let (m, n) = (p.m as usize, p.n as usize);
    let beta = p.beta.re as f32;
    let mut c32 = if beta != 0.0 {
        widen::<H>(&p.c, p.batch)
    } else {
        vec![0f32; p.batch as usize * m * n]
    };
    // SAFETY: the f32 copies live unmoved until the end of this function.
    let (ap, bp, cp) = unsafe {
        (
            scratch(a32.as_ptr()),
            scratch(b32.as_ptr()),
            scratch(c32.as_mut_ptr().cast_const()),
        )
    };
    // The view of matrix i of the copy of operand `x` at `base` (`count` matrices;
    // one broadcasts over the batch).
    let copy_at = |base: Option<Addr>, count: i64, x: &Mat, op: Trans| {
        let (size, cols) = ((x.rows * x.cols) as usize, x.cols.max(1));
        move |i: usize| {
            let i = if count == 1 { 0 } else { i };
            // SAFETY: matrix i < count of the copy.
            op_view(unsafe { element::<f32>(base, i * size) }, cols, op)
        }
    };
    let a_at = copy_at(ap, ca, &p.a, p.op_a);
    let b_at = copy_at(bp, cb, &p.b, p.op_b);
    // SAFETY: matrix i < batch of the copy.
    let c_at = |i: usize| {
        op_view(
            unsafe { element::<f32>(cp, i * m * n) },
            n.max(1) as i64,
            Trans::N,
        )
    };
    par_gemm::<f32>(
        p.batch as usize,
        m,
        n,
        p.k as usize,
        p.alpha.re as f32,
        &a_at,
        &b_at,
        beta,
        &c_at,
    );
    // round back into C (with its own strides)
    super::for_chunks_mut(&mut c32, n.max(1), |row, src| {
        let (bi, i) = (row / m.max(1), row % m.max(1));
        // SAFETY: bi < batch, a matrix of the validated output.
        let base = ptr::<H>(unsafe { p.c.at(bi as i64, 2) });
        for (j, s) in src.iter().enumerate() {
            // SAFETY: (i, j) lies inside matrix bi of the validated output.
            unsafe { *base.add(i * p.c.ld as usize + j) = H::from_f32(*s) };
        }
    });
}

/// `C = alpha op(A) op(B) + beta C` (beta = 0: C is not read, NaN in it is ignored).
pub fn gemm(p: &GemmPlan) -> Result<()> {
    match p.dtype {
        DType::F16 => gemm_half::<f16>(p),
        DType::BF16 => gemm_half::<bf16>(p),
        DType::F32 => gemm_t::<f32>(p),
        DType::F64 => gemm_t::<f64>(p),
        DType::C64 => gemm_t::<Complex<f32>>(p),
        DType::C128 => gemm_t::<Complex<f64>>(p),
    }
    Ok(())
}

// ------------------------------------------------------------------ fused linear

/// GELU, tanh approximation (cuBLASLt's epilogue formula), in f32 as the kernels.
pub fn gelu_tanh(z: f32) -> f32 {
    let u = GELU_TANH_C * (z + GELU_TANH_A * z * z * z);
    0.5 * z * (1.0 + u.tanh())
}

/// d gelu_tanh / dz.
pub fn gelu_tanh_grad(z: f32) -> f32 {
    let u = GELU_TANH_C * (z + GELU_TANH_A * z * z * z);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * GELU_TANH_C * (1.0 + 3.0 * GELU_TANH_A * z * z)
}

/// GELU, exact: `z Phi(z) = 0.5 z (1 + erf(z / sqrt(2)))`, evaluated in f64 and
/// rounded once.
pub fn gelu_erf(z: f32) -> f32 {
    let z = z as f64;
    (0.5 * z * (1.0 + libm::erf(z * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// d gelu_erf / dz = `Phi(z) + z phi(z)`, in f64 and rounded once.
pub fn gelu_erf_grad(z: f32) -> f32 {
    let z = z as f64;
    let cdf = 0.5 * (1.0 + libm::erf(z * std::f64::consts::FRAC_1_SQRT_2));
    // 1 / sqrt(2 pi)
    let pdf = 0.398_942_280_401_432_7 * (-0.5 * z * z).exp();
    (cdf + z * pdf) as f32
}

pub(super) fn act_fwd(act: Activation, z: f32) -> f32 {
    match act {
        Activation::None => z,
        // NaN propagates (as torch.relu and the kernels)
        Activation::Relu => {
            if z > 0.0 || z.is_nan() {
                z
            } else {
                0.0
            }
        }
        Activation::GeluTanh => gelu_tanh(z),
        Activation::GeluErf => gelu_erf(z),
    }
}

/// The `n` elements of `dtype` (f16, bf16, f32) of a validated plan operand at
/// `addr`, as f32.
pub(super) fn load_f32(dtype: DType, addr: Option<Addr>, n: usize) -> Vec<f32> {
    fn widen<T: Half>(src: &[T]) -> Vec<f32> {
        let mut v = vec![0f32; src.len()];
        let chunk = 1 << 16;
        super::for_chunks_mut(&mut v, chunk, |ci, dst| {
            for (d, s) in dst.iter_mut().zip(&src[ci * chunk..]) {
                *d = s.to_f32();
            }
        });
        v
    }
    // SAFETY: `ops::linalg` validated the operand: n contiguous elements of dtype,
    // host memory, no output overlapping it; read during this call only.
    unsafe {
        match dtype {
            DType::F16 => widen(host_slice::<f16>(addr, n)),
            DType::BF16 => widen(host_slice::<bf16>(addr, n)),
            _ => widen(host_slice::<f32>(addr, n)),
        }
    }
}

/// Writes `src` rounded to `dtype` (f16, bf16, f32) into the validated plan output
/// at `addr`.
pub(super) fn store_f32(dtype: DType, addr: Option<Addr>, src: &[f32]) {
    fn narrow<T: Half>(dst: &mut [T], src: &[f32]) {
        let chunk = 1 << 16;
        super::for_chunks_mut(dst, chunk, |ci, dst| {
            for (d, &v) in dst.iter_mut().zip(&src[ci * chunk..]) {
                *d = T::from_f32(v);
            }
        });
    }
    let n = src.len();
    // SAFETY: `ops::linalg` validated the output: n contiguous elements of dtype,
    // host memory, overlapping no input and no other output; this is the only
    // reference to it while it is written.
    unsafe {
        match dtype {
            DType::F16 => narrow(host_slice_mut::<f16>(addr, n), src),
            DType::BF16 => narrow(host_slice_mut::<bf16>(addr, n), src),
            _ => narrow(host_slice_mut::<f32>(addr, n), src),
        }
    }
}

/// `C[m x n] = A B` in f32 on contiguous row-major slices, `A` viewed through
/// `(ars, acs)` and `B` through `(brs, bcs)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn mm_f32(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    ars: isize,
    acs: isize,
    b: &[f32],
    brs: isize,
    bcs: isize,
) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    // SAFETY: the slices and `c` live unmoved until par_gemm returns; the views
    // address their elements only.
    let (ap, bp, cp) = unsafe {
        (
            scratch(a.as_ptr()),
            scratch(b.as_ptr()),
            scratch(c.as_mut_ptr().cast_const()),
        )
    };
    par_gemm::<f32>(
        1,
        m,
        n,
        k,
        1.0,
        &|_| View {
            at: ap,
            rs: ars,
            cs: acs,
        },
        &|_| View {
            at: bp,
            rs: brs,
            cs: bcs,
        },
        0.0,
        &|_| View {
            at: cp,
            rs: n.max(1) as isize,
            cs: 1,
        },
    );
    c
}

/// `y = act(x W^T + b)`; the pre-activation into `aux` when given.
pub fn linear_forward(p: &LinearPlan) -> Result<()> {
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let x = load_f32(p.dtype, p.x, m * k);
    let w = load_f32(p.dtype, p.w, n * k);
    // z = x W^T: W [n, k] viewed as W^T [k, n] has strides (1, k)
    let mut z = mm_f32(m, n, k, &x, k as isize, 1, &w, 1, k.max(1) as isize);
    if p.bias.is_some() {
        let b = load_f32(p.dtype, p.bias, n);
        super::for_chunks_mut(&mut z, n, |_, row| {
            for (v, bj) in row.iter_mut().zip(&b) {
                *v += bj;
            }
        });
    }
    if p.aux.is_some() {
        store_f32(p.dtype, p.aux, &z);
    }
    super::for_chunks_mut(&mut z, 4096, |_, c| {
        c.iter_mut().for_each(|v| *v = act_fwd(p.act, *v))
    });
    store_f32(p.dtype, p.y, &z);
    Ok(())
}

/// The column sums of the row-major `[m, n]` matrix `dz` (a bias gradient),
/// accumulated in f64, parallel over column blocks.
pub(super) fn col_sums(dz: &[f32], m: usize, n: usize) -> Vec<f32> {
    let mut db = vec![0f32; n];
    let par = m * n >= super::PAR_MIN;
    let col_block = |(cb, out): (usize, &mut [f32])| {
        let j0 = cb * 64;
        let mut acc = vec![0f64; out.len()];
        for i in 0..m {
            let row = &dz[i * n + j0..i * n + j0 + out.len()];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += v as f64;
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = a as f32;
        }
    };
    if par {
        db.par_chunks_mut(64).enumerate().for_each(col_block);
    } else {
        db.chunks_mut(64).enumerate().for_each(col_block);
    }
    db
}

/// `dz = dy * act'(saved)`, `dx = dz W`, `dW = dz^T x`, `db = sum_rows dz`.
pub fn linear_backward(p: &LinearBwdPlan) -> Result<()> {
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let mut dz = load_f32(p.dtype, p.dy, m * n);
    match p.act {
        Activation::None => {}
        Activation::Relu => {
            let y = load_f32(p.dtype, p.saved, m * n);
            super::for_chunks_mut(&mut dz, 4096, |ci, c| {
                for (d, &y) in c.iter_mut().zip(&y[ci * 4096..]) {
                    if !(y > 0.0) {
                        *d = 0.0;
                    }
                }
            });
        }
        Activation::GeluTanh | Activation::GeluErf => {
            let grad = if p.act == Activation::GeluTanh {
                gelu_tanh_grad
            } else {
                gelu_erf_grad
            };
            let z = load_f32(p.dtype, p.saved, m * n);
            super::for_chunks_mut(&mut dz, 4096, |ci, c| {
                for (d, &z) in c.iter_mut().zip(&z[ci * 4096..]) {
                    *d *= grad(z);
                }
            });
        }
    }
    if p.db.is_some() {
        store_f32(p.dtype, p.db, &col_sums(&dz, m, n));
    }
    if p.dx.is_some() {
        let w = load_f32(p.dtype, p.w, n * k);
        // dx [m, k] = dz [m, n] W [n, k]
        let dx = mm_f32(m, k, n, &dz, n as isize, 1, &w, k as isize, 1);
        store_f32(p.dtype, p.dx, &dx);
    }
    if p.dw.is_some() {
        let x = load_f32(p.dtype, p.x, m * k);
        // dW [n, k] = dz^T [n, m] x [m, k]
        let dw = mm_f32(n, k, m, &dz, 1, n.max(1) as isize, &x, k as isize, 1);
        store_f32(p.dtype, p.dw, &dw);
    }
    Ok(())
}

// ------------------------------------------------------------------ Kronecker

fn kron_t<T: super::Elem>(p: &KronPlan) {
    let (m, n, pp, q) = (p.m, p.n, p.p, p.q);
    let rows = (p.batch * m * pp) as usize;
    let cols = (n * q) as usize;
    // SAFETY: `ops::linalg` validated out: rows x cols contiguous elements of T in
    // host memory, overlapping neither input; the only reference while written.
    let out = unsafe { host_slice_mut::<T>(p.out, rows * cols) };
    out.par_chunks_mut(cols).enumerate().for_each(|(row, dst)| {
        let row = row as i64;
        let (bi, r) = (row / (m * pp), row % (m * pp));
        let (i, s) = (r / pp, r % pp);
        // SAFETY: out has elements, so a and b do: (bi, i, j) and (bi, s, t) index
        // elements of the validated operands (element strides sa, sb).
        let at = |x: Option<Addr>, e: i64| unsafe { *ptr::<T>(x).offset(e as isize) }.to_c();
        for j in 0..n {
            let av = at(p.a, bi * p.sa[0] + i * p.sa[1] + j * p.sa[2]);
            for t in 0..q {
                let bv = at(p.b, bi * p.sb[0] + s * p.sb[1] + t * p.sb[2]);
                dst[(j * q + t) as usize] = T::from_c(super::Math::mul(av, bv));
            }
        }
    });
}

/// `out = kron(a, b)`, batched.
pub fn kron(p: &KronPlan) -> Result<()> {
    crate::with_elem!(p.dtype, T => kron_t::<T>(p));
    Ok(())
}
