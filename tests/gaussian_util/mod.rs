//! Shared by `abi_gaussian` and `gpu_gaussian`: random problems, an f64 reference
//! written here from the formulas of docs/ops.md section 3 (independently of the
//! library: explicit triangular solves with divisions), and wrappers that call
//! the four ops through the C ABI with poisoned outputs.

#![allow(dead_code)]

use std::ptr::null;

use crate::common::*;
pub use fusekit::abi::gaussian::*;

/// One problem: `points [B,3]`, `means [N,3]`, `chol [N,3,3]` (with garbage in
/// the strictly upper part, which the ops must ignore), `weights [N]`, `eps`.
#[derive(Clone, Debug)]
pub struct Problem {
    pub b: usize,
    pub n: usize,
    pub points: Vec<f64>,
    pub means: Vec<f64>,
    pub chol: Vec<f64>,
    pub weights: Vec<f64>,
    pub eps: f64,
}

impl Problem {
    /// Points and means in [-1, 1]^3, L with diagonal in [0.25, 0.8] and
    /// off-diagonal in [-0.3, 0.3], upper part in [-5, 5], weights in [-1, 1.5].
    pub fn random(rng: &mut Rng, b: usize, n: usize, eps: f64) -> Problem {
        let mut u = |lo: f64, hi: f64, k: usize| -> Vec<f64> {
            (0..k).map(|_| rng.uniform(lo, hi)).collect()
        };
        let points = u(-1.0, 1.0, b * 3);
        let means = u(-1.0, 1.0, n * 3);
        let weights = u(-1.0, 1.5, n);
        let mut chol = u(-0.3, 0.3, n * 9);
        let diag = u(0.25, 0.8, n * 3);
        let upper = u(-5.0, 5.0, n * 3);
        for i in 0..n {
            for k in 0..3 {
                chol[i * 9 + k * 4] = diag[i * 3 + k];
            }
            chol[i * 9 + 1] = upper[i * 3];
            chol[i * 9 + 2] = upper[i * 3 + 1];
            chol[i * 9 + 5] = upper[i * 3 + 2];
        }
        Problem {
            b,
            n,
            points,
            means,
            chol,
            weights,
            eps,
        }
    }

    /// Rounds every value to what `dtype` holds, so that the f64 reference sees
    /// the inputs the library sees.
    pub fn quantized(&self, dtype: fk_dtype) -> Problem {
        let q = |v: &Vec<f64>| quantize_vec(dtype, v);
        Problem {
            points: q(&self.points),
            means: q(&self.means),
            chol: q(&self.chol),
            weights: q(&self.weights),
            ..self.clone()
        }
    }

    /// The lower-triangular `L_n + eps I` as a 3x3 matrix.
    fn lmat(&self, n: usize) -> [[f64; 3]; 3] {
        let c = &self.chol[n * 9..n * 9 + 9];
        let mut l = [[0.0; 3]; 3];
        for i in 0..3 {
            for j in 0..=i {
                l[i][j] = c[i * 3 + j] + if i == j { self.eps } else { 0.0 };
            }
        }
        l
    }

    fn d(&self, b: usize, n: usize) -> [f64; 3] {
        [0, 1, 2].map(|k| self.points[b * 3 + k] - self.means[n * 3 + k])
    }
}

/// Solves `L y = d` (lower triangular) by forward substitution.
fn lower_solve(l: &[[f64; 3]; 3], d: [f64; 3]) -> [f64; 3] {
    let mut y = [0.0; 3];
    for i in 0..3 {
        let mut s = d[i];
        for j in 0..i {
            s -= l[i][j] * y[j];
        }
        y[i] = s / l[i][i];
    }
    y
}

/// Solves `L^T z = v` by backward substitution.
fn upper_solve_t(l: &[[f64; 3]; 3], v: [f64; 3]) -> [f64; 3] {
    let mut z = [0.0; 3];
    for i in (0..3).rev() {
        let mut s = v[i];
        for j in i + 1..3 {
            s -= l[j][i] * z[j];
        }
        z[i] = s / l[i][i];
    }
    z
}

/// Reference squared Mahalanobis distances `[B,N]`.
pub fn ref_maha(p: &Problem) -> Vec<f64> {
    let mut m = vec![0.0; p.b * p.n];
    for n in 0..p.n {
        let l = p.lmat(n);
        for b in 0..p.b {
            let y = lower_solve(&l, p.d(b, n));
            m[b * p.n + n] = y.iter().map(|v| v * v).sum();
        }
    }
    m
}

/// Reference field `[B]`.
pub fn ref_field(p: &Problem) -> Vec<f64> {
    let m = ref_maha(p);
    (0..p.b)
        .map(|b| {
            (0..p.n)
                .map(|n| p.weights[n] * (-0.5 * m[b * p.n + n]).exp())
                .sum()
        })
        .collect()
}

/// Gradients `(dpoints, dmeans, dchol, dweights)`.
pub type Grads = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

/// The gradients' names, in `Grads` order.
pub const GRAD_NAMES: [&str; 4] = ["dpoints", "dmeans", "dchol", "dweights"];

/// The four gradients of `g` in `Grads` order.
pub fn grads_of(g: &Grads) -> [&[f64]; 4] {
    [&g.0, &g.1, &g.2, &g.3]
}

/// The sweeps' loop: for f32 and f64 and every (B, N) of `sizes`, a random problem
/// (eps 1e-6, drawn from `rng`) rounded to the dtype, handed to `body` with the
/// generator, the dtype and (B, N).
pub fn each_problem(
    rng: &mut Rng,
    sizes: &[(usize, usize)],
    mut body: impl FnMut(&mut Rng, fk_dtype, (usize, usize), &Problem),
) {
    for d in [FK_DTYPE_F32, FK_DTYPE_F64] {
        for &(b, n) in sizes {
            let p = Problem::random(rng, b, n, 1e-6).quantized(d);
            body(rng, d, (b, n), &p);
        }
    }
}

/// Reference Mahalanobis backward given `gfun(b, n) = dL/dm[b,n]`; also sums
/// `wfun(b, n)` per Gaussian into the fourth result.
fn ref_bwd(
    p: &Problem,
    gfun: impl Fn(usize, usize) -> f64,
    wfun: impl Fn(usize, usize) -> f64,
) -> Grads {
    let (mut dp, mut dm, mut dl, mut dw) = (
        vec![0.0; p.b * 3],
        vec![0.0; p.n * 3],
        vec![0.0; p.n * 9],
        vec![0.0; p.n],
    );
    for n in 0..p.n {
        let l = p.lmat(n);
        for b in 0..p.b {
            let y = lower_solve(&l, p.d(b, n));
            let g = gfun(b, n);
            let z = upper_solve_t(&l, y.map(|v| 2.0 * g * v));
            for i in 0..3 {
                dp[b * 3 + i] += z[i];
                dm[n * 3 + i] -= z[i];
                for j in 0..=i {
                    dl[n * 9 + i * 3 + j] -= z[i] * y[j];
                }
            }
            dw[n] += wfun(b, n);
        }
    }
    (dp, dm, dl, dw)
}

pub fn ref_maha_bwd(p: &Problem, g: &[f64]) -> Grads {
    ref_bwd(p, |b, n| g[b * p.n + n], |_, _| 0.0)
}

pub fn ref_field_bwd(p: &Problem, dout: &[f64]) -> Grads {
    let m = ref_maha(p);
    let e = |b: usize, n: usize| (-0.5 * m[b * p.n + n]).exp();
    ref_bwd(
        p,
        |b, n| -0.5 * dout[b] * p.weights[n] * e(b, n),
        |b, n| dout[b] * e(b, n),
    )
}

// ------------------------------------------------------------------ buffers

/// A buffer of `dtype` holding `vals`.
pub fn fbuf(ctx: &Ctx, dtype: fk_dtype, shape: &[i64], vals: &[f64]) -> Buf {
    Buf::from_reals(ctx, dtype, shape, vals)
}

/// A buffer of `dtype` filled with NaN (a poisoned output).
pub fn poisoned(ctx: &Ctx, dtype: fk_dtype, shape: &[i64]) -> Buf {
    Buf::poisoned(ctx, dtype, shape)
}

pub fn read(b: &Buf) -> Vec<f64> {
    b.read_reals()
}

/// The inputs of a problem on a context.
pub struct Inputs {
    pub points: Buf,
    pub means: Buf,
    pub chol: Buf,
    pub weights: Buf,
    pub dtype: fk_dtype,
    pub b: i64,
    pub n: i64,
    pub eps: f64,
}

impl Inputs {
    pub fn new(ctx: &Ctx, dtype: fk_dtype, p: &Problem) -> Inputs {
        let (b, n) = (p.b as i64, p.n as i64);
        Inputs {
            points: fbuf(ctx, dtype, &[b, 3], &p.points),
            means: fbuf(ctx, dtype, &[n, 3], &p.means),
            chol: fbuf(ctx, dtype, &[n, 3, 3], &p.chol),
            weights: fbuf(ctx, dtype, &[n], &p.weights),
            dtype,
            b,
            n,
            eps: p.eps,
        }
    }
    /// The handles of (points, means, chol, weights).
    pub fn raw(&self) -> [*mut fk_buffer; 4] {
        [&self.points, &self.means, &self.chol, &self.weights].map(Buf::raw)
    }
    /// fk_mahalanobis_forward on these inputs with `eps`, into `out`.
    ///
    /// # Safety
    /// `out` is a live buffer (or null, for the entry point to refuse).
    pub unsafe fn maha_forward(
        &self,
        eps: f64,
        out: *mut fk_buffer,
        stream: *const fk_stream,
    ) -> fk_status {
        let [p, m, l, _] = self.raw();
        unsafe { fk_mahalanobis_forward(p, m, l, eps, out, stream) }
    }
    /// fk_mahalanobis_backward on these inputs with `eps` and `dout`, into the
    /// gradients `[dpoints, dmeans, dchol]` (null: not wanted), with the workspace `ws`.
    ///
    /// # Safety
    /// Every non-null handle is a live buffer.
    pub unsafe fn maha_backward(
        &self,
        eps: f64,
        dout: *const fk_buffer,
        [dp, dm, dc]: [*mut fk_buffer; 3],
        ws: *mut fk_buffer,
        stream: *const fk_stream,
    ) -> fk_status {
        let [p, m, l, _] = self.raw();
        unsafe { fk_mahalanobis_backward(p, m, l, eps, dout, dp, dm, dc, ws, stream) }
    }
    /// fk_gaussian_field_forward on these inputs with `eps`, into `out`.
    ///
    /// # Safety
    /// `out` is a live buffer (or null, for the entry point to refuse).
    pub unsafe fn field_forward(
        &self,
        eps: f64,
        out: *mut fk_buffer,
        stream: *const fk_stream,
    ) -> fk_status {
        unsafe { self.field_forward_on(self.points.raw(), eps, out, stream) }
    }
    /// fk_gaussian_field_forward as `field_forward`, with the handle `points` in
    /// place of these inputs' points.
    ///
    /// # Safety
    /// As `field_forward`; `points` is passed on unchecked (a foreign or
    /// non-contiguous handle, for the entry point to refuse).
    pub unsafe fn field_forward_on(
        &self,
        points: *mut fk_buffer,
        eps: f64,
        out: *mut fk_buffer,
        stream: *const fk_stream,
    ) -> fk_status {
        let [_, m, l, w] = self.raw();
        unsafe { fk_gaussian_field_forward(points, m, l, w, eps, out, stream) }
    }
    /// fk_gaussian_field_backward on these inputs with `eps` and `dout`, into the
    /// gradients `[dpoints, dmeans, dchol, dweights]` (null: not wanted), with the
    /// workspace `ws`.
    ///
    /// # Safety
    /// Every non-null handle is a live buffer.
    pub unsafe fn field_backward(
        &self,
        eps: f64,
        dout: *const fk_buffer,
        [dp, dm, dc, dw]: [*mut fk_buffer; 4],
        ws: *mut fk_buffer,
        stream: *const fk_stream,
    ) -> fk_status {
        let [p, m, l, w] = self.raw();
        unsafe { fk_gaussian_field_backward(p, m, l, w, eps, dout, dp, dm, dc, dw, ws, stream) }
    }
}

/// A workspace for the backward ops on `ctx` (None when 0 bytes are needed).
pub fn workspace(ctx: &Ctx, dtype: fk_dtype, b: i64, n: i64) -> Option<Buf> {
    let mut bytes = usize::MAX;
    ok(unsafe { fk_gaussian_backward_workspace_size(ctx.raw(), dtype, b, n, &mut bytes) });
    if bytes == 0 {
        return None;
    }
    Some(Buf::new(ctx, FK_DTYPE_F32, &[bytes.div_ceil(4) as i64]))
}

pub fn run_maha_fwd(ctx: &Ctx, x: &Inputs, stream: *const fk_stream) -> Vec<f64> {
    let out = poisoned(ctx, x.dtype, &[x.b, x.n]);
    ok(unsafe { x.maha_forward(x.eps, out.raw(), stream) });
    sync_stream(stream);
    read(&out)
}

pub fn run_field_fwd(ctx: &Ctx, x: &Inputs, stream: *const fk_stream) -> Vec<f64> {
    let out = poisoned(ctx, x.dtype, &[x.b]);
    ok(unsafe { x.field_forward(x.eps, out.raw(), stream) });
    sync_stream(stream);
    read(&out)
}

/// The forward of `x` on `ctx` (the field when `field`, else the Mahalanobis
/// distances) checked against the f64 reference of `p` (`check`); returns the output.
#[track_caller]
pub fn check_forward(
    ctx: &Ctx,
    x: &Inputs,
    p: &Problem,
    field: bool,
    tol: f64,
    what: &str,
) -> Vec<f64> {
    let (got, want) = if field {
        (run_field_fwd(ctx, x, NULL_STREAM), ref_field(p))
    } else {
        (run_maha_fwd(ctx, x, NULL_STREAM), ref_maha(p))
    };
    check(&got, &want, tol, what);
    got
}

/// Which gradients to ask for: (dpoints, dmeans, dchol, dweights).
pub const ALL: [bool; 4] = [true; 4];

/// Runs a backward; unwanted gradients come back empty. Returns the raw bytes too
/// (for bitwise comparisons).
pub fn run_bwd(
    ctx: &Ctx,
    x: &Inputs,
    field: bool,
    grad_in: &[f64],
    want: [bool; 4],
    stream: *const fk_stream,
) -> (Grads, Vec<u8>) {
    let d = x.dtype;
    let gin = if field {
        fbuf(ctx, d, &[x.b], grad_in)
    } else {
        fbuf(ctx, d, &[x.b, x.n], grad_in)
    };
    let shapes: [Vec<i64>; 4] = [vec![x.b, 3], vec![x.n, 3], vec![x.n, 3, 3], vec![x.n]];
    let outs: Vec<Option<Buf>> = shapes
        .iter()
        .zip(want)
        .enumerate()
        .map(|(i, (s, w))| (w && (field || i < 3)).then(|| poisoned(ctx, d, s)))
        .collect();
    let ws = workspace(ctx, d, x.b, x.n);
    let s = unsafe {
        if field {
            let grads = [0, 1, 2, 3].map(|i| raw_or_null(&outs[i]));
            x.field_backward(x.eps, gin.raw(), grads, raw_or_null(&ws), stream)
        } else {
            let grads = [0, 1, 2].map(|i| raw_or_null(&outs[i]));
            x.maha_backward(x.eps, gin.raw(), grads, raw_or_null(&ws), stream)
        }
    };
    ok(s);
    sync_stream(stream);
    let mut bytes = Vec::new();
    let mut vals: Vec<Vec<f64>> = Vec::new();
    for o in &outs {
        match o {
            Some(b) => {
                bytes.extend(b.read_bytes());
                vals.push(read(b));
            }
            None => vals.push(Vec::new()),
        }
    }
    let mut it = vals.into_iter();
    (
        (
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap(),
        ),
        bytes,
    )
}

/// `||out - ref|| / ||ref||` (absolute when ref is 0); NaN and infinity never pass.
pub fn rel(out: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "lengths differ");
    if out.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = out
        .iter()
        .zip(reference)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        .sqrt();
    let den: f64 = reference.iter().map(|b| b * b).sum::<f64>().sqrt();
    if den == 0.0 { num } else { num / den }
}

#[track_caller]
pub fn check(out: &[f64], reference: &[f64], tol: f64, what: &str) {
    let e = rel(out, reference);
    assert!(
        e <= tol,
        "{what}: relative error {e:.3e} > {tol:.1e} (first values {:?} vs {:?})",
        &out[..out.len().min(4)],
        &reference[..reference.len().min(4)]
    );
}

/// Values in [-1, 1].
pub fn random_vec(rng: &mut Rng, k: usize) -> Vec<f64> {
    (0..k).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

pub fn quantize_vec(dtype: fk_dtype, v: &[f64]) -> Vec<f64> {
    v.iter()
        .map(|&x| {
            if dtype == FK_DTYPE_F32 {
                x as f32 as f64
            } else {
                x
            }
        })
        .collect()
}

pub const NULL_STREAM: *const fk_stream = null();
