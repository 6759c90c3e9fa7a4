//! f64 references and case builders of the optimizer-math tests (`abi_optim`,
//! `gpu_optim`), written from docs/ops.md section 4 independently of the library: a
//! cyclic Jacobi eigensolver, plain triple-loop products, per-sample gradients
//! materialised.

#![allow(dead_code, unused_imports)]

use std::ptr::{null, null_mut};

use super::common::*;
pub use fusekit::abi::linalg::FK_GEMM_ALLOW_TF32;
pub use fusekit::abi::optim::*;

/// Row-major `[r, c]` product `a [r, k] b [k, c]`.
pub fn matmul(a: &[f64], b: &[f64], r: usize, k: usize, c: usize) -> Vec<f64> {
    let mut o = vec![0.0; r * c];
    for i in 0..r {
        for l in 0..k {
            let x = a[i * k + l];
            for j in 0..c {
                o[i * c + j] += x * b[l * c + j];
            }
        }
    }
    o
}

pub fn transpose(a: &[f64], r: usize, c: usize) -> Vec<f64> {
    let mut o = vec![0.0; r * c];
    for i in 0..r {
        for j in 0..c {
            o[j * r + i] = a[i * c + j];
        }
    }
    o
}

/// Cyclic Jacobi eigendecomposition of a symmetric `n x n` matrix: eigenvalues and
/// the eigenvectors as the columns of `v` (row-major).
pub fn jacobi_eigh(a: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut a = a.to_vec();
    let mut v = vec![0.0; n * n];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * n + j] * a[i * n + j])
            .sum();
        let scale: f64 = a.iter().map(|x| x * x).sum::<f64>().max(1e-300);
        if off <= 1e-30 * scale {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                let (app, aqq) = (a[p * n + p], a[q * n + q]);
                let theta = (aqq - app) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    ((0..n).map(|i| a[i * n + i]).collect(), v)
}

/// `(A + eps I)^power` per docs/ops.md section 4.1 (shift when the smallest eigenvalue is below eps),
/// and the smallest eigenvalue of `A + eps I`.
pub fn power_ref(a: &[f64], n: usize, power: f64, eps: f64) -> (Vec<f64>, f64) {
    let mut s = a.to_vec();
    for i in 0..n {
        s[i * n + i] += eps;
    }
    let (w, v) = jacobi_eigh(&s, n);
    let lmin = w.iter().copied().fold(f64::INFINITY, f64::min);
    let shift = if lmin < eps { eps - lmin } else { 0.0 };
    let mut vs = v.clone();
    for i in 0..n {
        for j in 0..n {
            vs[i * n + j] *= (w[j] + shift).powf(power);
        }
    }
    (matmul(&vs, &transpose(&v, n, n), n, n, n), lmin)
}

/// A random symmetric PSD matrix `Q diag(spectrum) Q^T` with the given eigenvalues.
pub fn spd_with(rng: &mut Rng, spectrum: &[f64]) -> Vec<f64> {
    let n = spectrum.len();
    // A random orthogonal Q from the eigenvectors of a random symmetric matrix.
    let mut g = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let x = rng.uniform(-1.0, 1.0);
            g[i * n + j] = x;
            g[j * n + i] = x;
        }
    }
    let (_, q) = jacobi_eigh(&g, n);
    let mut qs = q.clone();
    for i in 0..n {
        for j in 0..n {
            qs[i * n + j] *= spectrum[j];
        }
    }
    let mut m = matmul(&qs, &transpose(&q, n, n), n, n, n);
    // exact symmetry
    for i in 0..n {
        for j in 0..i {
            let x = 0.5 * (m[i * n + j] + m[j * n + i]);
            m[i * n + j] = x;
            m[j * n + i] = x;
        }
    }
    m
}

/// A Wishart-like SPD matrix `G G^T / k + 0.1 I` (condition number ~10-100).
pub fn spd(rng: &mut Rng, n: usize) -> Vec<f64> {
    let k = n + 3;
    let g: Vec<f64> = (0..n * k).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let mut m = matmul(&g, &transpose(&g, n, k), n, k, n);
    for (i, x) in m.iter_mut().enumerate() {
        *x /= k as f64;
        if i % (n + 1) == 0 {
            *x += 0.1;
        }
    }
    for i in 0..n {
        for j in 0..i {
            m[i * n + j] = m[j * n + i];
        }
    }
    m
}

pub fn reals(v: &[f64]) -> Vec<Cx> {
    v.iter().map(|&x| re(x)).collect()
}

pub fn re_of(v: &[Cx]) -> Vec<f64> {
    v.iter().map(|c| c.re).collect()
}

pub fn rel(out: &[f64], want: &[f64]) -> f64 {
    let num: f64 = out.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    if out.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    (num / den.max(1e-300)).sqrt()
}

#[track_caller]
pub fn close(out: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(out.len(), want.len(), "{what}: length");
    let e = rel(out, want);
    assert!(e <= tol, "{what}: relative error {e:e} > {tol:e}");
}

/// Asserts that each of the `batch` `k x k` matrices of `mat` is exactly symmetric
/// (bit for bit); `what` names the check.
pub fn assert_symmetric(mat: &[f64], batch: usize, k: usize, what: &str) {
    for b in 0..batch {
        for i in 0..k {
            for j in 0..i {
                let (ij, ji) = (mat[b * k * k + i * k + j], mat[b * k * k + j * k + i]);
                assert_eq!(ij, ji, "{what}");
            }
        }
    }
}

/// A random Shampoo problem: `batch` gradients `m x n` in [-1, 1], then SPD
/// statistics L (`m x m`) and R (`n x n`) per matrix, drawn in that order.
pub struct Shampoo {
    pub batch: usize,
    pub g: Vec<f64>,
    pub l0: Vec<f64>,
    pub r0: Vec<f64>,
}

impl Shampoo {
    pub fn random(rng: &mut Rng, batch: usize, m: usize, n: usize) -> Shampoo {
        let g = (0..batch * m * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let l0 = (0..batch).flat_map(|_| spd(rng, m)).collect();
        let r0 = (0..batch).flat_map(|_| spd(rng, n)).collect();
        Shampoo { batch, g, l0, r0 }
    }
    /// The shape of the batch of `rows x cols` matrices (no leading dimension for
    /// a batch of 1).
    pub fn shape(&self, rows: usize, cols: usize) -> Vec<i64> {
        let lead: &[i64] = if self.batch == 1 {
            &[]
        } else {
            &[self.batch as i64]
        };
        [lead, &[rows as i64, cols as i64]].concat()
    }
}

/// Report of a call, poisoned first so an unfilled field shows.
pub fn report() -> fk_matpow_report {
    fk_matpow_report {
        method: -7,
        iterations: -7,
        converged: -7,
        reserved: -7,
        residual: -7.0,
        min_eigenvalue: -7.0,
    }
}

/// `fk_matrix_power`'s scalar arguments.
#[derive(Clone, Copy, Debug)]
pub struct Pow {
    pub power: f64,
    pub eps: f64,
    pub method: i32,
    pub max_iter: i32,
    pub tol: f64,
    pub flags: u32,
}

impl Pow {
    /// The eigendecomposition route (one "iteration", no tolerance, no flags).
    pub fn eigh(power: f64, eps: f64) -> Pow {
        Pow {
            power,
            eps,
            method: FK_MATPOW_EIGH,
            max_iter: 1,
            tol: 0.0,
            flags: 0,
        }
    }
    /// Newton iterations (at most `max_iter`, residual `tol`; 0: unchecked), no flags.
    pub fn newton(power: f64, eps: f64, max_iter: i32, tol: f64) -> Pow {
        Pow {
            method: FK_MATPOW_NEWTON,
            max_iter,
            tol,
            ..Pow::eigh(power, eps)
        }
    }
    /// The library's choice (AUTO) under Newton's settings.
    pub fn auto(power: f64, eps: f64, max_iter: i32, tol: f64) -> Pow {
        let method = FK_MATPOW_AUTO;
        Pow {
            method,
            ..Pow::newton(power, eps, max_iter, tol)
        }
    }
    pub fn flags(self, flags: u32) -> Pow {
        Pow { flags, ..self }
    }
    /// fk_matrix_power of `a` into `out` with these scalars; `rep` may be null.
    ///
    /// # Safety
    /// `a` and `out` are live buffers (or null, for the entry point to refuse).
    pub unsafe fn call(
        self,
        a: *const fk_buffer,
        out: *mut fk_buffer,
        rep: *mut fk_matpow_report,
        stream: *const fk_stream,
    ) -> fk_status {
        let (p, e, m, it, tol, fl) = (
            self.power,
            self.eps,
            self.method,
            self.max_iter,
            self.tol,
            self.flags,
        );
        unsafe { fk_matrix_power(a, p, e, m, it, tol, fl, out, rep, stream) }
    }
}

/// Runs `fk_matrix_power` with `pw` on `batch` matrices of `mats` (concatenated).
pub fn run_power(
    ctx: &Ctx,
    dt: fk_dtype,
    mats: &[f64],
    batch: usize,
    n: usize,
    pw: Pow,
) -> (fk_status, Vec<f64>, fk_matpow_report) {
    let shape: Vec<i64> = if batch == 1 {
        vec![n as i64, n as i64]
    } else {
        vec![batch as i64, n as i64, n as i64]
    };
    let a = Buf::from_vals(ctx, dt, &shape, &reals(mats));
    let out = Buf::from_vals(ctx, dt, &shape, &vec![re(f64::NAN); mats.len()]);
    let mut rep = report();
    let s = unsafe { pw.call(a.raw(), out.raw(), &mut rep, null()) };
    (s, re_of(&out.read()), rep)
}

/// f64 per-sample gradients `G_b = g_b^T a_b` `[B, out, in]` of `a [B, T, in]`,
/// `g [B, T, out]`.
pub fn per_sample_ref(
    a: &[f64],
    g: &[f64],
    b: usize,
    t: usize,
    din: usize,
    dout: usize,
) -> Vec<f64> {
    let mut o = vec![0.0; b * dout * din];
    for s in 0..b {
        for k in 0..t {
            for i in 0..dout {
                let gv = g[(s * t + k) * dout + i];
                for j in 0..din {
                    o[(s * dout + i) * din + j] += gv * a[(s * t + k) * din + j];
                }
            }
        }
    }
    o
}

pub fn sq_norms_ref(grads: &[f64], b: usize, per: usize) -> Vec<f64> {
    (0..b)
        .map(|s| grads[s * per..(s + 1) * per].iter().map(|x| x * x).sum())
        .collect()
}

pub fn clipped_sum_ref(grads: &[f64], b: usize, per: usize, c: f64) -> Vec<f64> {
    let norms = sq_norms_ref(grads, b, per);
    let mut o = vec![0.0; per];
    for s in 0..b {
        let n = norms[s].sqrt();
        let f = if n > c { c / n } else { 1.0 };
        for (x, &y) in o.iter_mut().zip(&grads[s * per..(s + 1) * per]) {
            *x += f * y;
        }
    }
    o
}

pub fn null_buf() -> *mut fk_buffer {
    null_mut()
}
