//! CPU optimizer math: the reference the CUDA path is tested against and the
//! fallback without a GPU. Everything is computed in f64 (f32 inputs widened) except
//! the GEMMs, which run in the input dtype through `cpu::linalg::gemm` (the same
//! products the CUDA path hands cuBLAS). The eigendecomposition is nalgebra's
//! symmetric QR algorithm; batches run in parallel with rayon.

use nalgebra::{DMatrix, SymmetricEigen};
use rayon::prelude::*;

use super::{Real, element, host_slice, host_slice_mut};
use crate::addr::Addr;
use crate::error::Result;
use crate::plan::linalg::{GemmPlan, Trans};
use crate::plan::optim::{Method, PowPlan, Report, SamplePlan, Scratch, StatsPlan, clip_scale};

// Safety of every `load`, `store` and `each_matrix` below: the addresses are those
// of buffers `ops::optim` validated (contiguous host memory of the plan's dtype `T`
// and shape: [batch, n, n] matrices, [batch, steps, din] and [batch, steps, dout]
// samples, [batch] norms, outputs disjoint from the inputs) or host scratch of
// `Ops::scratch` of the plan's size, at offsets inside them, each read or written
// only within the op call; a matrix or output is written by one thread at a time.

/// Reads `n` elements of `T` at the host address `addr` as f64.
///
/// # Safety
///
/// As `cpu::host_slice`: `addr` holds `n` initialised elements of `T` (a validated
/// buffer or scratch of the plan) that nothing writes during the call.
unsafe fn load<T: Real>(addr: Option<Addr>, n: usize) -> Vec<f64> {
    // SAFETY: the caller's contract.
    let s: &[T] = unsafe { host_slice(addr, n) };
    s.iter().map(|v| v.to_f64()).collect()
}

/// Writes `src` rounded to `T` at the host address `addr`.
///
/// # Safety
///
/// As `cpu::host_slice_mut`: `addr` holds `src.len()` elements of `T` that nothing
/// else reads or writes during the call.
unsafe fn store<T: Real>(addr: Option<Addr>, src: &[f64]) {
    // SAFETY: the caller's contract.
    let d: &mut [T] = unsafe { host_slice_mut(addr, src.len()) };
    for (o, &v) in d.iter_mut().zip(src) {
        *o = T::from_f64(v);
    }
}

/// Runs `f` on each matrix `b < batch` of `n x n` elements at `addr`, in parallel,
/// as a mutable slice of T.
///
/// # Safety
///
/// As `store`, for the `batch * n * n` elements of T at `addr`.
unsafe fn each_matrix<T: Real>(addr: Addr, batch: i64, n: i64, f: impl Fn(usize, &mut [T]) + Sync) {
    let nn = (n * n) as usize;
    // SAFETY: the caller's contract; the matrices are disjoint chunks of it.
    let all: &mut [T] = unsafe { host_slice_mut(Some(addr), batch as usize * nn) };
    all.par_chunks_mut(nn.max(1))
        .enumerate()
        .for_each(|(b, m)| f(b, m));
}

// ------------------------------------------------------------------ matrix power

/// The CPU backend of the Newton iteration.
pub struct Ops;

impl crate::plan::optim::MatOps for Ops {
    fn scratch(&self, bytes: usize) -> Result<Scratch<'_>> {
        let mut v: Vec<u64> = Vec::new();
        v.try_reserve_exact(bytes.div_ceil(8)).map_err(|_| {
            crate::error::Error::new(
                crate::error::FK_ERROR_OUT_OF_MEMORY,
                format!("could not allocate {bytes} bytes of host scratch memory"),
            )
        })?;
        v.resize(bytes.div_ceil(8), 0);
        let mut v = v.into_boxed_slice();
        // SAFETY: the box's own memory (bytes, rounded up), which the Scratch owns
        // (its drop frees it) and which does not move; a box's pointer is never
        // null (dangling, not 0, when empty).
        let addr = unsafe { Addr::from_ptr(v.as_mut_ptr()) }.expect("non-null box");
        Ok(Scratch::new(addr, Box::new(move || drop(v))))
    }

    fn gemm(&self, p: &GemmPlan) -> Result<()> {
        super::linalg::gemm(p)
    }

    fn newton_start(&self, plan: &PowPlan, p: u32, x: Addr, m: Addr) -> Result<()> {
        crate::with_real!(plan.dtype, T => newton_start_t::<T>(plan, p, x, m));
        Ok(())
    }

    fn shifted(&self, plan: &PowPlan, s: Addr) -> Result<()> {
        let n = plan.n as usize;
        crate::with_real!(plan.dtype, T => {
            // SAFETY: see the top of the module.
            let mut a = unsafe { load::<T>(plan.a, plan.elems()) };
            for (i, v) in a.iter_mut().enumerate() {
                if (i % (n * n)) % (n + 1) == 0 {
                    *v += plan.eps;
                }
            }
            // SAFETY: see the top of the module.
            unsafe { store::<T>(Some(s), &a) };
        });
        Ok(())
    }

    fn newton_step_matrix(&self, plan: &PowPlan, p: u32, m: Addr, t: Addr) -> Result<()> {
        crate::with_real!(plan.dtype, T => {
            let n = plan.n as usize;
            // SAFETY: see the top of the module.
            let mv = unsafe { load::<T>(Some(m), plan.elems()) };
            let inv = 1.0 / p as f64;
            let tv: Vec<f64> = mv
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let diag = (i % (n * n)) % (n + 1) == 0;
                    (if diag { (p + 1) as f64 } else { 0.0 } - v) * inv
                })
                .collect();
            // SAFETY: see the top of the module.
            unsafe { store::<T>(Some(t), &tv) };
        });
        Ok(())
    }

    fn residuals(&self, plan: &PowPlan, m: Addr) -> Result<Vec<f64>> {
        let n = plan.n as usize;
        let nn = n * n;
        let mut r = vec![0.0; plan.batch as usize];
        crate::with_real!(plan.dtype, T => {
            // SAFETY: see the top of the module.
            let mv = unsafe { load::<T>(Some(m), plan.elems()) };
            for (b, rb) in r.iter_mut().enumerate() {
                let mut worst = 0.0f64;
                for (i, &v) in mv[b * nn..(b + 1) * nn].iter().enumerate() {
                    let d = (v - if i % (n + 1) == 0 { 1.0 } else { 0.0 }).abs();
                    // NaN poisons the residual
                    worst = if d.is_nan() || worst.is_nan() { f64::NAN } else { worst.max(d) };
                }
                *rb = worst;
            }
        });
        Ok(r)
    }

    fn copy(&self, dst: Addr, src: Addr, bytes: usize) -> Result<()> {
        // SAFETY: both hold `bytes` bytes (validated buffers or scratch), disjoint.
        let (src, dst) = unsafe {
            (
                host_slice::<u8>(Some(src), bytes),
                host_slice_mut::<u8>(Some(dst), bytes),
            )
        };
        dst.copy_from_slice(src);
        Ok(())
    }
}

fn newton_start_t<T: Real>(plan: &PowPlan, p: u32, x: Addr, m: Addr) {
    let n = plan.n as usize;
    let nn = n * n;
    // SAFETY: see the top of the module.
    let a = unsafe { load::<T>(plan.a, plan.elems()) };
    let mut xs = vec![0.0; plan.elems()];
    let mut ms = vec![0.0; plan.elems()];
    for b in 0..plan.batch as usize {
        let ab = &a[b * nn..(b + 1) * nn];
        let shifted = |i: usize| ab[i] + if i % (n + 1) == 0 { plan.eps } else { 0.0 };
        let norm2: f64 = (0..nn).map(|i| shifted(i) * shifted(i)).sum();
        let z = newton_scale(norm2, p);
        let x0 = z.powf(1.0 / p as f64);
        for i in 0..nn {
            xs[b * nn + i] = if i % (n + 1) == 0 { x0 } else { 0.0 };
            ms[b * nn + i] = z * shifted(i);
        }
    }
    // SAFETY: see the top of the module.
    unsafe { store::<T>(Some(x), &xs) };
    // SAFETY: see the top of the module.
    unsafe { store::<T>(Some(m), &ms) };
}

/// `z = (1 + p) / (2 |A + eps I|_F)`: puts the spectrum of `M = z (A + eps I)`
/// inside `(0, (1 + p) / 2]`, where the coupled iteration converges. A zero
/// matrix gets `z = 1`.
pub fn newton_scale(norm2: f64, p: u32) -> f64 {
    let f = norm2.sqrt();
    if f > 0.0 {
        (1.0 + p as f64) / (2.0 * f)
    } else {
        1.0
    }
}

/// `out = V diag((lambda + shift)^power) V^T` per matrix from nalgebra's symmetric
/// eigendecomposition of `A + eps I` (its upper triangle); `shift = eps - lambda_min`
/// when `lambda_min < eps`, else 0 (docs/ops.md section 4.1).
pub fn eigh_power(plan: &PowPlan) -> Result<Report> {
    let results: Vec<(bool, f64)> = crate::with_real!(plan.dtype, T => eigh_power_t::<T>(plan));
    Ok(Report {
        method: Method::Eigh,
        iterations: 0,
        converged: results.iter().all(|r| r.0),
        residual: f64::NAN,
        min_eigenvalue: results.iter().map(|r| r.1).fold(f64::INFINITY, f64::min),
    })
}

fn eigh_power_t<T: Real>(plan: &PowPlan) -> Vec<(bool, f64)> {
    let n = plan.n as usize;
    let nn = n * n;
    (0..plan.batch as usize)
        .into_par_iter()
        .map(|b| {
            // SAFETY: see the top of the module.
            let a = unsafe { load::<T>(element::<T>(plan.a, b * nn), nn) };
            let sym = DMatrix::<f64>::from_fn(n, n, |i, j| {
                let (r, c) = (i.min(j), i.max(j));
                a[r * n + c] + if i == j { plan.eps } else { 0.0 }
            });
            let out = match SymmetricEigen::try_new(sym, f64::EPSILON, 0) {
                None => (vec![f64::NAN; nn], false, f64::NAN),
                Some(e) => {
                    let lmin = e.eigenvalues.iter().copied().fold(f64::INFINITY, f64::min);
                    let shift = eigen_shift(lmin, plan.eps);
                    let mut w = e.eigenvectors.clone();
                    for (j, mut col) in w.column_iter_mut().enumerate() {
                        col *= (e.eigenvalues[j] + shift).powf(plan.power);
                    }
                    let prod = &w * e.eigenvectors.transpose();
                    // row-major out[i][j] = prod(i, j)
                    let mut v = vec![0.0; nn];
                    for i in 0..n {
                        for j in 0..n {
                            v[i * n + j] = prod[(i, j)];
                        }
                    }
                    (v, true, lmin)
                }
            };
            // SAFETY: see the top of the module.
            unsafe { store::<T>(element::<T>(plan.out, b * nn), &out.0) };
            (out.1, out.2)
        })
        .collect()
}

/// The spectrum shift of docs/ops.md section 4.1: `eps - lambda_min` when the smallest eigenvalue of
/// `A + eps I` is below `eps`, else 0.
pub fn eigen_shift(lambda_min: f64, eps: f64) -> f64 {
    if lambda_min < eps {
        eps - lambda_min
    } else {
        0.0
    }
}

// ------------------------------------------------------------------ Shampoo

/// The statistic `op` makes (`StatsPlan::gemm`) in `c`, then per matrix the lower
/// triangle mirrors the upper (the triangle cuBLAS's SYRK writes), so the result is
/// exactly symmetric.
fn rank_k(p: &StatsPlan, op: Trans, c: Addr) -> Result<()> {
    super::linalg::gemm(&p.gemm(op, c, false))?;
    let k = p.order(op);
    // SAFETY: see the top of the module.
    crate::with_real!(p.dtype, T => unsafe { each_matrix::<T>(c, p.batch, k, |_, m| mirror_upper(m, k as usize)) });
    Ok(())
}

/// `m[r][c] = m[c][r]` for `r > c`.
fn mirror_upper<T: Copy>(m: &mut [T], n: usize) {
    for r in 1..n {
        for c in 0..r {
            m[r * n + c] = m[c * n + r];
        }
    }
}

/// `L = beta L + alpha G G^T`, `R = beta R + alpha G^T G`.
pub fn shampoo_stats(p: &StatsPlan) -> Result<()> {
    p.factors().try_for_each(|(op, c)| rank_k(p, op, c))
}

// ------------------------------------------------------------------ per-sample gradients

/// `out[b] = g_b^T a_b`.
pub fn per_sample_grads(p: &SamplePlan, out: Option<Addr>) -> Result<()> {
    super::linalg::gemm(&p.grads_gemm(out))
}

/// Squared Frobenius norms of the per-sample gradients, in f64: `|g_b|^2 |a_b|^2`
/// for one step, the Gram form `sum_{t,s} (a_t . a_s)(g_t . g_s)` for sequences.
pub fn sq_norms(p: &SamplePlan) -> Vec<f64> {
    crate::with_real!(p.dtype, T => sq_norms_t::<T>(p))
}

fn sq_norms_t<T: Real>(p: &SamplePlan) -> Vec<f64> {
    let (t, i, o) = (p.steps as usize, p.din as usize, p.dout as usize);
    (0..p.batch as usize)
        .into_par_iter()
        .map(|b| {
            // SAFETY: see the top of the module.
            let a = unsafe { load::<T>(element::<T>(p.a, b * t * i), t * i) };
            // SAFETY: see the top of the module.
            let g = unsafe { load::<T>(element::<T>(p.g, b * t * o), t * o) };
            let dot = |x: &[f64], r: usize, s: usize, w: usize| -> f64 {
                x[r * w..(r + 1) * w]
                    .iter()
                    .zip(&x[s * w..(s + 1) * w])
                    .map(|(u, v)| u * v)
                    .sum()
            };
            if t == 1 {
                return dot(&a, 0, 0, i) * dot(&g, 0, 0, o);
            }
            let mut acc = 0.0;
            for r in 0..t {
                for s in 0..t {
                    acc += dot(&a, r, s, i) * dot(&g, r, s, o);
                }
            }
            acc
        })
        .collect()
}

pub fn sample_norms(p: &SamplePlan, out: Option<Addr>) -> Result<()> {
    let n = sq_norms(p);
    // SAFETY: see the top of the module.
    crate::with_real!(p.dtype, T => unsafe { store::<T>(out, &n) });
    Ok(())
}

/// `out = sum_b s_b g_b^T a_b` with `s_b = min(1, max_norm / |G_b|)`: g scaled per
/// sample, then one GEMM over all `B*T` rows.
pub fn dp_clipped_sum(
    p: &SamplePlan,
    max_norm: f64,
    out: Option<Addr>,
    norms: Option<Addr>,
) -> Result<()> {
    let sq = sq_norms(p);
    let rows = (p.steps * p.dout) as usize;
    crate::with_real!(p.dtype, T => {
        // SAFETY: see the top of the module.
        let g = unsafe { load::<T>(p.g, p.batch as usize * rows) };
        let mut gs: Vec<T> = Vec::with_capacity(g.len());
        for (b, chunk) in g.chunks(rows.max(1)).enumerate().take(p.batch as usize) {
            let s = clip_scale(sq[b], max_norm);
            gs.extend(chunk.iter().map(|&v| T::from_f64(v * s)));
        }
        // SAFETY: gs's elements, alive and unmoved until the GEMM that reads them
        // returns; a vec's pointer is never null (dangling, not 0, when empty).
        let gs_addr = unsafe { Addr::from_ptr(gs.as_ptr()) }.expect("non-null vec");
        super::linalg::gemm(&p.sum_gemm(gs_addr, out))?;
        if let Some(nptr) = norms {
            // SAFETY: see the top of the module.
            unsafe { store::<T>(Some(nptr), &sq) };
        }
    });
    Ok(())
}
