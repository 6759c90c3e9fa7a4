//! Shared by `abi_linalg` (CPU) and `gpu_linalg` (CUDA vs CPU): f64 references for
//! the linear-algebra family written from the formulas (independently of the
//! library), and cases that place operands (padded leading dimensions, batch
//! broadcasts), run an entry point through the C ABI and read the result back.

#![allow(dead_code)]

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use crate::common::*;
pub use fusekit::abi::linalg::*;

pub const OPS: [fk_op; 3] = [FK_OP_N, FK_OP_T, FK_OP_C];
pub const ACTS: [fk_activation; 4] = [FK_ACT_NONE, FK_ACT_RELU, FK_ACT_GELU_TANH, FK_ACT_GELU_ERF];
pub const LINEAR_DTYPES: [fk_dtype; 3] = [FK_DTYPE_F16, FK_DTYPE_BF16, FK_DTYPE_F32];

pub fn op_name(op: fk_op) -> &'static str {
    ["N", "T", "C"][op as usize]
}

pub fn act_name(a: fk_activation) -> &'static str {
    ["none", "relu", "gelu_tanh", "gelu_erf"][a as usize]
}

/// `conj(z)` for `op = C`, `z` otherwise.
/// fk_gemm on raw handles, or fk_gemm_chunked when `chunked` gives a device budget
/// in bytes.
///
/// # Safety
/// The handles are live buffers (or null, for the entry points to refuse).
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_call(
    (op_a, op_b): (fk_op, fk_op),
    alpha: Cx,
    a: *const fk_buffer,
    b: *const fk_buffer,
    beta: Cx,
    c: *mut fk_buffer,
    chunked: Option<u64>,
    flags: u32,
    stream: *const fk_stream,
) -> fk_status {
    let (alpha, beta) = (alpha.scalar(), beta.scalar());
    unsafe {
        match chunked {
            None => fk_gemm(op_a, op_b, alpha, a, b, beta, c, flags, stream),
            Some(budget) => {
                fk_gemm_chunked(op_a, op_b, alpha, a, b, beta, c, budget, flags, stream)
            }
        }
    }
}

/// `c = a b` (no transposes, alpha 1, beta 0, no flags) through `gemm_call`.
///
/// # Safety
/// As `gemm_call`.
pub unsafe fn product(
    a: *const fk_buffer,
    b: *const fk_buffer,
    c: *mut fk_buffer,
    chunked: Option<u64>,
    stream: *const fk_stream,
) -> fk_status {
    let nn = (FK_OP_N, FK_OP_N);
    unsafe { gemm_call(nn, re(1.0), a, b, re(0.0), c, chunked, 0, stream) }
}

fn opc(op: fk_op, z: Cx) -> Cx {
    if op == FK_OP_C { cx(z.re, -z.im) } else { z }
}

/// Element (i, j) of op(M) for a row-major M of `cols` columns starting at `base`.
fn op_at(op: fk_op, m: &[Cx], base: usize, cols: usize, (i, j): (usize, usize)) -> Cx {
    let z = if op == FK_OP_N {
        m[base + i * cols + j]
    } else {
        m[base + j * cols + i]
    };
    opc(op, z)
}

/// A row-major `[batch, rows, cols]` view whose rows are `pad` elements longer than
/// needed and whose matrices are `bpad` elements apart beyond that (pad = bpad = 0:
/// contiguous). `batch = None` makes a 2-D view.
pub fn padded(batch: Option<i64>, rows: i64, cols: i64, pad: i64, bpad: i64) -> View {
    let ld = cols + pad;
    let bs = rows * ld + bpad;
    let nb = batch.unwrap_or(1);
    let (shape, strides) = match batch {
        Some(b) => (vec![b, rows, cols], vec![bs, ld, 1]),
        None => (vec![rows, cols], vec![ld, 1]),
    };
    let len = if nb * rows * cols == 0 {
        0
    } else {
        (nb - 1) * bs + (rows - 1) * ld + cols
    };
    if pad == 0 && bpad == 0 {
        return View::contiguous(&shape);
    }
    View {
        shape,
        strides,
        offset: 0,
        storage_len: len,
    }
}

/// An output placed with poison (0xFF) everywhere but the view's elements, which
/// hold `vals` (row-major over the view).
pub fn placed_with(ctx: &Ctx, dtype: fk_dtype, view: &View, vals: &[Cx]) -> Placed {
    let sz = dsize(dtype);
    let mut bytes = vec![0xFFu8; view.storage_len as usize * sz];
    for (o, v) in view.offsets().into_iter().zip(vals) {
        bytes[o * sz..(o + 1) * sz].copy_from_slice(&encode(dtype, &[*v]));
    }
    Placed::new(ctx, dtype, view, &bytes)
}

pub fn rand_vals(rng: &mut Rng, dtype: fk_dtype, n: usize) -> Vec<Cx> {
    random_values(rng, dtype, n, Domain::Signed)
}

/// One GEMM case.
#[derive(Clone, Debug)]
pub struct GemmCase {
    pub dtype: fk_dtype,
    pub op_a: fk_op,
    pub op_b: fk_op,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    /// `None`: 2-D operand; `Some(b)`: `[b, ., .]`.
    pub batch_a: Option<i64>,
    pub batch_b: Option<i64>,
    pub batch_c: Option<i64>,
    /// Row padding of every operand (0 = contiguous).
    pub pad: i64,
    pub alpha: Cx,
    pub beta: Cx,
    pub flags: u32,
}

pub struct GemmData {
    pub a: Operand,
    pub b: Operand,
    pub c0: Vec<Cx>,
    pub c_view: View,
}

impl GemmCase {
    pub fn new(dtype: fk_dtype, op_a: fk_op, op_b: fk_op, m: i64, n: i64, k: i64) -> GemmCase {
        let complex = is_complex(dtype);
        GemmCase {
            dtype,
            op_a,
            op_b,
            m,
            n,
            k,
            batch_a: None,
            batch_b: None,
            batch_c: None,
            pad: 0,
            alpha: if complex { cx(0.75, -0.5) } else { re(0.75) },
            beta: if complex { cx(-0.5, 0.25) } else { re(-0.5) },
            flags: 0,
        }
    }
    pub fn a_dims(&self) -> (i64, i64) {
        if self.op_a == FK_OP_N {
            (self.m, self.k)
        } else {
            (self.k, self.m)
        }
    }
    pub fn b_dims(&self) -> (i64, i64) {
        if self.op_b == FK_OP_N {
            (self.k, self.n)
        } else {
            (self.n, self.k)
        }
    }
    pub fn batch(&self) -> i64 {
        self.batch_c.unwrap_or(1)
    }
    pub fn describe(&self) -> String {
        format!(
            "gemm {} op_a={} op_b={} m={} n={} k={} batches a/b/c {:?}/{:?}/{:?} pad {} flags {}",
            dname(self.dtype),
            op_name(self.op_a),
            op_name(self.op_b),
            self.m,
            self.n,
            self.k,
            self.batch_a,
            self.batch_b,
            self.batch_c,
            self.pad,
            self.flags
        )
    }
    /// Random operands (inputs with padding; C's initial values).
    pub fn data(&self, rng: &mut Rng) -> GemmData {
        let (ar, ac) = self.a_dims();
        let (br, bc) = self.b_dims();
        let va = padded(self.batch_a, ar, ac, self.pad, self.pad * 3);
        let vb = padded(self.batch_b, br, bc, self.pad, 1);
        let vc = padded(self.batch_c, self.m, self.n, self.pad, 2 * self.pad);
        let a = Operand::random(rng, self.dtype, va, Domain::Signed);
        let b = Operand::random(rng, self.dtype, vb, Domain::Signed);
        let c0 = rand_vals(rng, self.dtype, vc.numel() as usize);
        GemmData {
            a,
            b,
            c0,
            c_view: vc,
        }
    }
    /// Runs `fk_gemm` (or `fk_gemm_chunked` with `budget`) on `ctx`; with `beta = 0`
    /// C starts as NaN (it must not be read).
    /// The case's GEMM (its ops, alpha, beta and flags) on raw handles: `gemm_call`.
    ///
    /// # Safety
    /// As `gemm_call`.
    pub unsafe fn call(
        &self,
        (a, b, c): (*const fk_buffer, *const fk_buffer, *mut fk_buffer),
        chunked: Option<u64>,
        stream: *const fk_stream,
    ) -> fk_status {
        let (ops, flags) = ((self.op_a, self.op_b), self.flags);
        unsafe { gemm_call(ops, self.alpha, a, b, self.beta, c, chunked, flags, stream) }
    }
    pub fn run(
        &self,
        ctx: &Ctx,
        d: &GemmData,
        stream: *const fk_stream,
        chunked: Option<u64>,
    ) -> Vec<Cx> {
        let a = Placed::input(ctx, self.dtype, &d.a);
        let b = Placed::input(ctx, self.dtype, &d.b);
        let c = if self.beta == re(0.0) {
            Placed::poisoned(ctx, self.dtype, &d.c_view)
        } else {
            placed_with(ctx, self.dtype, &d.c_view, &d.c0)
        };
        let s = unsafe { self.call((a.handle(), b.handle(), c.handle()), chunked, stream) };
        ok_for(s, self.describe());
        sync_stream(stream);
        c.read_checked()
    }
    /// f64 reference over C's elements (row-major).
    pub fn reference(&self, d: &GemmData) -> Vec<Cx> {
        let (av, bv) = (d.a.values(), d.b.values());
        let (ar, ac) = self.a_dims();
        let (br, bc) = self.b_dims();
        let (m, n, k) = (self.m as usize, self.n as usize, self.k as usize);
        let mut out = Vec::with_capacity(self.batch() as usize * m * n);
        for bi in 0..self.batch() as usize {
            let abase = if self.batch_a.unwrap_or(1) == 1 {
                0
            } else {
                bi * (ar * ac) as usize
            };
            let bbase = if self.batch_b.unwrap_or(1) == 1 {
                0
            } else {
                bi * (br * bc) as usize
            };
            let a_at = |i: usize, l: usize| op_at(self.op_a, &av, abase, ac as usize, (i, l));
            let b_at = |l: usize, j: usize| op_at(self.op_b, &bv, bbase, bc as usize, (l, j));
            for i in 0..m {
                for j in 0..n {
                    let mut s = Cx::default();
                    for l in 0..k {
                        s = s.add(a_at(i, l).mul(b_at(l, j)));
                    }
                    let c0 = d.c0[bi * m * n + i * n + j];
                    let mut v = self.alpha.mul(s);
                    if self.beta != re(0.0) {
                        v = v.add(self.beta.mul(c0));
                    }
                    out.push(v);
                }
            }
        }
        out
    }
}

// ------------------------------------------------------------------ fused linear

pub const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// GELU (tanh approximation), f64.
pub fn gelu_tanh(z: f64) -> f64 {
    0.5 * z * (1.0 + (SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)).tanh())
}

/// Its derivative, f64, from the formula (checked against finite differences).
pub fn gelu_tanh_grad(z: f64) -> f64 {
    let u = SQRT_2_OVER_PI * (z + 0.044715 * z * z * z);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * z * z)
}

/// `erf(x)` in f64, written here independently of the library (which uses the
/// `libm` crate): the series `2/sqrt(pi) exp(-x^2) sum_j 2^j x^(2j+1) / (1 3 5 ...
/// (2j+1))`, whose terms are all positive (no cancellation: relative error ~1e-15),
/// and +-1 from |x| = 6 (1 - erf(6) = 2e-17).
pub fn erf_ref(x: f64) -> f64 {
    let a = x.abs();
    if a >= 6.0 {
        return 1f64.copysign(x);
    }
    let (mut term, mut sum, mut j) = (a, a, 0.0);
    while term > 1e-17 * sum {
        j += 1.0;
        term *= 2.0 * a * a / (2.0 * j + 1.0);
        sum += term;
    }
    (1.128_379_167_095_512_6 * (-a * a).exp() * sum).copysign(x)
}

/// GELU, exact: `0.5 z (1 + erf(z / sqrt 2))`, f64.
pub fn gelu_erf(z: f64) -> f64 {
    0.5 * z * (1.0 + erf_ref(z * std::f64::consts::FRAC_1_SQRT_2))
}

/// Its derivative `Phi(z) + z phi(z)`, f64 (checked against finite differences).
pub fn gelu_erf_grad(z: f64) -> f64 {
    0.5 * (1.0 + erf_ref(z * std::f64::consts::FRAC_1_SQRT_2))
        + z * (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

pub fn act_ref(act: fk_activation, z: f64) -> f64 {
    match act {
        FK_ACT_RELU => z.max(0.0),
        FK_ACT_GELU_TANH => gelu_tanh(z),
        FK_ACT_GELU_ERF => gelu_erf(z),
        _ => z,
    }
}

pub fn act_grad_ref(act: fk_activation, z: f64) -> f64 {
    match act {
        FK_ACT_RELU => {
            if z > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        FK_ACT_GELU_TANH => gelu_tanh_grad(z),
        FK_ACT_GELU_ERF => gelu_erf_grad(z),
        _ => 1.0,
    }
}

/// Whether the forward of `act` keeps the pre-activation in `aux` (the GELUs).
pub fn has_aux(act: fk_activation) -> bool {
    act == FK_ACT_GELU_TANH || act == FK_ACT_GELU_ERF
}

/// One fused-linear case: `x [lead..., k]`, `w [n, k]`, `b [n]`.
#[derive(Clone, Debug)]
pub struct LinearCase {
    pub dtype: fk_dtype,
    pub act: fk_activation,
    pub lead: Vec<i64>,
    pub k: i64,
    pub n: i64,
    pub bias: bool,
}

pub struct LinearData {
    pub x: Vec<Cx>,
    pub w: Vec<Cx>,
    pub b: Vec<Cx>,
    pub dy: Vec<Cx>,
}

pub struct LinearOut {
    pub y: Vec<Cx>,
    pub aux: Option<Vec<Cx>>,
}

pub struct LinearGrads {
    pub dx: Vec<Cx>,
    pub dw: Vec<Cx>,
    pub db: Vec<Cx>,
}

impl LinearCase {
    pub fn m(&self) -> i64 {
        self.lead.iter().product()
    }
    pub fn x_shape(&self) -> Vec<i64> {
        let mut s = self.lead.clone();
        s.push(self.k);
        s
    }
    pub fn y_shape(&self) -> Vec<i64> {
        let mut s = self.lead.clone();
        s.push(self.n);
        s
    }
    pub fn describe(&self) -> String {
        format!(
            "linear {} act={} x {:?} w [{}, {}] bias {}",
            dname(self.dtype),
            act_name(self.act),
            self.x_shape(),
            self.n,
            self.k,
            self.bias
        )
    }
    /// Inputs scaled so that `z` is O(1) (x, w in +-[0.25, 2) / sqrt(k)).
    pub fn data(&self, rng: &mut Rng) -> LinearData {
        let s = 1.0 / (self.k.max(1) as f64).sqrt();
        let mut r = |n: i64, scale: f64| -> Vec<Cx> {
            (0..n)
                .map(|_| quantize(self.dtype, re(rng.signed(0.25, 2.0) * scale)))
                .collect()
        };
        LinearData {
            x: r(self.m() * self.k, s.sqrt()),
            w: r(self.n * self.k, s.sqrt()),
            b: r(self.n, 0.5),
            dy: r(self.m() * self.n, 1.0),
        }
    }
    /// Pre-activation `z` in f64.
    pub fn z_ref(&self, d: &LinearData) -> Vec<f64> {
        let (m, n, k) = (self.m() as usize, self.n as usize, self.k as usize);
        let mut z = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = if self.bias { d.b[j].re } else { 0.0 };
                for l in 0..k {
                    s += d.x[i * k + l].re * d.w[j * k + l].re;
                }
                z[i * n + j] = s;
            }
        }
        z
    }
    pub fn y_ref(&self, d: &LinearData) -> Vec<Cx> {
        self.z_ref(d)
            .into_iter()
            .map(|z| re(act_ref(self.act, z)))
            .collect()
    }
    /// Runs the forward on `ctx` (with aux for the GELUs), outputs poisoned first.
    pub fn forward(&self, ctx: &Ctx, d: &LinearData, stream: *const fk_stream) -> LinearOut {
        self.forward_aux(ctx, d, stream, has_aux(self.act))
    }
    /// The forward, with aux (the pre-activation) kept or not (`keep_aux`: GELUs only).
    pub fn forward_aux(
        &self,
        ctx: &Ctx,
        d: &LinearData,
        stream: *const fk_stream,
        keep_aux: bool,
    ) -> LinearOut {
        let dt = self.dtype;
        let x = Buf::from_vals(ctx, dt, &self.x_shape(), &d.x);
        let w = Buf::from_vals(ctx, dt, &[self.n, self.k], &d.w);
        let b = self.bias.then(|| Buf::from_vals(ctx, dt, &[self.n], &d.b));
        let ys = self.y_shape();
        let y = Placed::poisoned(ctx, dt, &View::contiguous(&ys));
        let aux = keep_aux.then(|| Placed::poisoned(ctx, dt, &View::contiguous(&ys)));
        let s = unsafe {
            fk_linear_forward(
                x.raw(),
                w.raw(),
                b.as_ref().map_or(null(), |b| b.raw()),
                self.act,
                y.handle(),
                aux.as_ref().map_or(null_mut(), |a| a.handle()),
                stream,
            )
        };
        ok_for(s, self.describe());
        sync_stream(stream);
        LinearOut {
            y: y.read_checked(),
            aux: aux.map(|a| a.read_checked()),
        }
    }
    /// Runs the backward on `ctx`, `saved` (y for relu, z for the GELUs) as given.
    pub fn backward(
        &self,
        ctx: &Ctx,
        d: &LinearData,
        saved: Option<&[Cx]>,
        stream: *const fk_stream,
    ) -> LinearGrads {
        let dt = self.dtype;
        let dy = Buf::from_vals(ctx, dt, &self.y_shape(), &d.dy);
        let x = Buf::from_vals(ctx, dt, &self.x_shape(), &d.x);
        let w = Buf::from_vals(ctx, dt, &[self.n, self.k], &d.w);
        let sv = saved.map(|v| Buf::from_vals(ctx, dt, &self.y_shape(), v));
        let dx = Placed::poisoned(ctx, dt, &View::contiguous(&self.x_shape()));
        let dw = Placed::poisoned(ctx, dt, &View::contiguous(&[self.n, self.k]));
        let db = Placed::poisoned(ctx, dt, &View::contiguous(&[self.n]));
        let s = unsafe {
            fk_linear_backward(
                dy.raw(),
                x.raw(),
                w.raw(),
                self.act,
                sv.as_ref().map_or(null(), |b| b.raw()),
                dx.handle(),
                dw.handle(),
                db.handle(),
                stream,
            )
        };
        ok_for(s, format!("{} backward", self.describe()));
        sync_stream(stream);
        LinearGrads {
            dx: dx.read_checked(),
            dw: dw.read_checked(),
            db: db.read_checked(),
        }
    }
    /// f64 reference gradients from `dz = dy * act'(z)` with `z` from `z_of`.
    pub fn grads_ref(&self, d: &LinearData, z: &[f64]) -> LinearGrads {
        let (m, n, k) = (self.m() as usize, self.n as usize, self.k as usize);
        let dz: Vec<f64> = (0..m * n)
            .map(|i| d.dy[i].re * act_grad_ref(self.act, z[i]))
            .collect();
        let mut dx = vec![re(0.0); m * k];
        let mut dw = vec![re(0.0); n * k];
        let mut db = vec![re(0.0); n];
        for i in 0..m {
            for l in 0..k {
                dx[i * k + l] = re((0..n).map(|j| dz[i * n + j] * d.w[j * k + l].re).sum());
            }
        }
        for j in 0..n {
            for l in 0..k {
                dw[j * k + l] = re((0..m).map(|i| dz[i * n + j] * d.x[i * k + l].re).sum());
            }
            db[j] = re((0..m).map(|i| dz[i * n + j]).sum());
        }
        LinearGrads { dx, dw, db }
    }
}

// ------------------------------------------------------------------ Kronecker

/// f64 reference of the batched Kronecker product (values row-major per operand;
/// batch 1 broadcasts).
pub fn kron_ref(
    a: &[Cx],
    (ba, m, n): (i64, i64, i64),
    b: &[Cx],
    (bb, p, q): (i64, i64, i64),
) -> Vec<Cx> {
    let batch = ba.max(bb);
    let mut out = Vec::with_capacity((batch * m * p * n * q) as usize);
    for bi in 0..batch {
        let ai = if ba == 1 { 0 } else { bi };
        let bj = if bb == 1 { 0 } else { bi };
        for r in 0..m * p {
            for c in 0..n * q {
                let (i, s) = (r / p, r % p);
                let (j, t) = (c / q, c % q);
                let x = a[(ai * m * n + i * n + j) as usize];
                let y = b[(bj * p * q + s * q + t) as usize];
                out.push(x.mul(y));
            }
        }
    }
    out
}

/// A Kronecker product case: random operands of shapes `sa` and `sb` (`[m, n]` or
/// `[batch, m, n]`) in the named layouts (`layout`), their (batch, rows, cols), and
/// the output's shape (batched when either operand is).
pub struct KronCase {
    pub a: Operand,
    pub b: Operand,
    pub da: (i64, i64, i64),
    pub db: (i64, i64, i64),
    pub shape: Vec<i64>,
}

impl KronCase {
    pub fn random(
        rng: &mut Rng,
        dtype: fk_dtype,
        (sa, la): (&[i64], &str),
        (sb, lb): (&[i64], &str),
    ) -> KronCase {
        let a = Operand::random(rng, dtype, layout(sa, la), Domain::Signed);
        let b = Operand::random(rng, dtype, layout(sb, lb), Domain::Signed);
        let dims = |s: &[i64]| {
            if s.len() == 3 {
                (s[0], s[1], s[2])
            } else {
                (1, s[0], s[1])
            }
        };
        let (da, db) = (dims(sa), dims(sb));
        let mut shape = vec![da.1 * db.1, da.2 * db.2];
        if sa.len() == 3 || sb.len() == 3 {
            shape.insert(0, da.0.max(db.0));
        }
        KronCase {
            a,
            b,
            da,
            db,
            shape,
        }
    }
    /// `fk_kron` on `ctx` (`run_kron`).
    pub fn run(&self, ctx: &Ctx, dtype: fk_dtype, stream: *const fk_stream) -> Vec<Cx> {
        run_kron(ctx, dtype, &self.a, &self.b, &self.shape, stream)
    }
    /// The f64 reference (`kron_ref`).
    pub fn reference(&self) -> Vec<Cx> {
        kron_ref(&self.a.values(), self.da, &self.b.values(), self.db)
    }
}

/// The Kronecker sweeps' loop: for every dtype, pair of shapes of `cases` and pair
/// of layout names of `layouts`, a random `KronCase` (drawn in that order) is handed
/// to `check` with its dtype and its label.
pub fn each_kron(
    rng: &mut Rng,
    cases: &[(&[i64], &[i64])],
    layouts: &[(&str, &str)],
    mut check: impl FnMut(fk_dtype, &KronCase, &str),
) {
    for dtype in DTYPES {
        for &(sa, sb) in cases {
            for &(la, lb) in layouts {
                let k = KronCase::random(rng, dtype, (sa, la), (sb, lb));
                check(
                    dtype,
                    &k,
                    &format!("kron {} {sa:?} {la} x {sb:?} {lb}", dname(dtype)),
                );
            }
        }
    }
}

/// Runs `fk_kron` on placed operands; returns `out`'s values.
pub fn run_kron(
    ctx: &Ctx,
    dtype: fk_dtype,
    a: &Operand,
    b: &Operand,
    out_shape: &[i64],
    stream: *const fk_stream,
) -> Vec<Cx> {
    let pa = Placed::input(ctx, dtype, a);
    let pb = Placed::input(ctx, dtype, b);
    let o = Placed::poisoned(ctx, dtype, &View::contiguous(out_shape));
    let s = unsafe { fk_kron(pa.handle(), pb.handle(), o.handle(), stream) };
    ok_for(s, format!("fk_kron {}", dname(dtype)));
    sync_stream(stream);
    o.read_checked()
}

/// Wraps host memory as a buffer of `ctx` (a view of caller memory).
///
/// # Safety
/// `p` must hold the view's elements and outlive the buffer.
pub unsafe fn wrap_host(ctx: &Ctx, p: *mut c_void, dtype: fk_dtype, shape: &[i64]) -> Buf {
    unsafe { Buf::wrap(ctx, p, dtype, shape, None) }
}
