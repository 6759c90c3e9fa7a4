//! CPU Gaussian field ops: the fallback and the oracle of the CUDA kernels.
//!
//! Everything is computed in f64 whatever the storage type (f32 inputs are
//! widened, outputs rounded once), so the CPU result of an f32 call is the f32
//! rounding of a nearly exact value. Parallel with rayon over fixed chunks of
//! points whose boundaries depend only on `B`, and partial sums are combined in
//! chunk order: results are bitwise reproducible whatever the thread count.

use rayon::prelude::*;

pub use super::Real;
use super::{host_slice, host_slice_mut};
use crate::addr::Addr;
use crate::error::Result;
use crate::plan::gaussian::{Grads, Inputs};

// Safety of every `host_slice`/`host_slice_mut` below: `ops::gaussian` validated
// each address as a contiguous host buffer of the call's dtype `T` and of the
// length taken here (points [B,3], means [N,3], chol [N,3,3], weights [N], g
// [B,N], dout [B], outputs as their shapes), and the outputs overlap no input and
// no other output; each slice lives only within the op call.

/// One Gaussian's factors: mean, weight, `1 / (L_ii + eps)` and the strictly
/// lower part of L.
#[derive(Clone, Copy, Debug)]
pub struct Factors {
    pub mu: [f64; 3],
    pub w: f64,
    pub inv: [f64; 3],
    pub l10: f64,
    pub l20: f64,
    pub l21: f64,
}

impl Factors {
    /// Forward substitution `(L + eps I) y = p - mu`.
    #[inline(always)]
    pub fn solve(&self, p: [f64; 3]) -> [f64; 3] {
        let d = [p[0] - self.mu[0], p[1] - self.mu[1], p[2] - self.mu[2]];
        let y0 = d[0] * self.inv[0];
        let y1 = (d[1] - self.l10 * y0) * self.inv[1];
        let y2 = (d[2] - self.l20 * y0 - self.l21 * y1) * self.inv[2];
        [y0, y1, y2]
    }
    /// Backward substitution `(L + eps I)^T z = v`.
    #[inline(always)]
    pub fn backsolve(&self, v: [f64; 3]) -> [f64; 3] {
        let z2 = v[2] * self.inv[2];
        let z1 = (v[1] - self.l21 * z2) * self.inv[1];
        let z0 = (v[0] - self.l10 * z1 - self.l20 * z2) * self.inv[0];
        [z0, z1, z2]
    }
}

fn factors<T: Real>(inp: &Inputs) -> Vec<Factors> {
    let n = inp.n as usize;
    // SAFETY: see the top of the module (weights are None for the Mahalanobis ops).
    let (means, chol, weights): (&[T], &[T], &[T]) = unsafe {
        (
            host_slice(inp.means, n * 3),
            host_slice(inp.chol, n * 9),
            host_slice(inp.weights, if inp.weights.is_some() { n } else { 0 }),
        )
    };
    (0..n)
        .map(|i| {
            let m = &means[i * 3..i * 3 + 3];
            let l = &chol[i * 9..i * 9 + 9];
            let diag = |k: usize| 1.0 / (l[k].to_f64() + inp.eps);
            Factors {
                mu: [m[0].to_f64(), m[1].to_f64(), m[2].to_f64()],
                w: weights.get(i).map_or(0.0, |w| w.to_f64()),
                inv: [diag(0), diag(4), diag(8)],
                l10: l[3].to_f64(),
                l20: l[6].to_f64(),
                l21: l[7].to_f64(),
            }
        })
        .collect()
}

fn point<T: Real>(points: &[T], b: usize) -> [f64; 3] {
    [
        points[b * 3].to_f64(),
        points[b * 3 + 1].to_f64(),
        points[b * 3 + 2].to_f64(),
    ]
}

fn sq(y: [f64; 3]) -> f64 {
    y[0] * y[0] + y[1] * y[1] + y[2] * y[2]
}

/// Points per parallel task of the forward ops.
const ROWS: usize = 64;

fn maha_fwd_t<T: Real>(inp: &Inputs, out: Option<Addr>) {
    let (b, n) = (inp.b as usize, inp.n as usize);
    let f = factors::<T>(inp);
    // SAFETY: see the top of the module.
    let (points, out): (&[T], &mut [T]) =
        unsafe { (host_slice(inp.points, b * 3), host_slice_mut(out, b * n)) };
    out.par_chunks_mut(n * ROWS)
        .enumerate()
        .for_each(|(c, rows)| {
            for (r, row) in rows.chunks_mut(n).enumerate() {
                let p = point(points, c * ROWS + r);
                for (o, g) in row.iter_mut().zip(&f) {
                    *o = T::from_f64(sq(g.solve(p)));
                }
            }
        });
}

pub fn mahalanobis_forward(inp: &Inputs, out: Option<Addr>) -> Result<()> {
    crate::with_real!(inp.dtype, T => maha_fwd_t::<T>(inp, out));
    Ok(())
}

fn field_fwd_t<T: Real>(inp: &Inputs, out: Option<Addr>) {
    let b = inp.b as usize;
    let f = factors::<T>(inp);
    // SAFETY: see the top of the module.
    let (points, out): (&[T], &mut [T]) =
        unsafe { (host_slice(inp.points, b * 3), host_slice_mut(out, b)) };
    out.par_chunks_mut(ROWS).enumerate().for_each(|(c, o)| {
        for (r, o) in o.iter_mut().enumerate() {
            let p = point(points, c * ROWS + r);
            let s: f64 = f.iter().map(|g| g.w * (-0.5 * sq(g.solve(p))).exp()).sum();
            *o = T::from_f64(s);
        }
    });
}

pub fn field_forward(inp: &Inputs, out: Option<Addr>) -> Result<()> {
    crate::with_real!(inp.dtype, T => field_fwd_t::<T>(inp, out));
    Ok(())
}

/// Per-Gaussian partial sums: `sum z` (3), `sum z_i y_j` for i >= j (6, in the
/// order 00, 10, 11, 20, 21, 22), `sum dout e` (1).
const K: usize = 10;

/// Number of point chunks of the backward: a function of `B` only.
fn chunks(b: usize) -> usize {
    b.div_ceil(256).clamp(1, 32)
}

/// The shared backward: for each pair, `coef(b, n, m)` gives `(2 g_bn, dweights
/// contribution)`; then `z = (L+eps I)^-T (2 g y)`, `dpoints_b += z`,
/// `dmeans_n -= z`, `dL_n[i][j] -= z_i y_j`.
fn backward_t<T: Real, F>(inp: &Inputs, grads: &Grads, coef: F)
where
    F: Fn(usize, usize, &Factors, f64) -> (f64, f64) + Sync,
{
    let (b, n) = (inp.b as usize, inp.n as usize);
    let f = factors::<T>(inp);
    // SAFETY: see the top of the module.
    let points: &[T] = unsafe { host_slice(inp.points, b * 3) };
    let want_g = grads.per_gaussian();
    let nch = chunks(b);
    let per = b.div_ceil(nch).max(1);
    let mut dp = vec![0.0f64; b * 3];
    // Each chunk: its points' dpoints (disjoint slice) and its per-Gaussian partials.
    let partials: Vec<Vec<f64>> = dp
        .par_chunks_mut(per * 3)
        .enumerate()
        .map(|(c, dpc)| {
            let mut part = if want_g {
                vec![0.0f64; n * K]
            } else {
                Vec::new()
            };
            for (r, dpb) in dpc.chunks_mut(3).enumerate() {
                let bi = c * per + r;
                let p = point(points, bi);
                for (ni, g) in f.iter().enumerate() {
                    let y = g.solve(p);
                    let (c2, dw) = coef(bi, ni, g, sq(y));
                    let z = g.backsolve([c2 * y[0], c2 * y[1], c2 * y[2]]);
                    dpb[0] += z[0];
                    dpb[1] += z[1];
                    dpb[2] += z[2];
                    if want_g {
                        let a = &mut part[ni * K..ni * K + K];
                        a[0] += z[0];
                        a[1] += z[1];
                        a[2] += z[2];
                        a[3] += z[0] * y[0];
                        a[4] += z[1] * y[0];
                        a[5] += z[1] * y[1];
                        a[6] += z[2] * y[0];
                        a[7] += z[2] * y[1];
                        a[8] += z[2] * y[2];
                        a[9] += dw;
                    }
                }
            }
            part
        })
        .collect();
    if grads.dpoints.is_some() {
        // SAFETY: see the top of the module.
        let out: &mut [T] = unsafe { host_slice_mut(grads.dpoints, b * 3) };
        for (o, v) in out.iter_mut().zip(&dp) {
            *o = T::from_f64(*v);
        }
    }
    if !want_g {
        return;
    }
    let mut total = vec![0.0f64; n * K];
    for part in &partials {
        for (t, v) in total.iter_mut().zip(part) {
            *t += v;
        }
    }
    if grads.dmeans.is_some() {
        // SAFETY: see the top of the module.
        let out: &mut [T] = unsafe { host_slice_mut(grads.dmeans, n * 3) };
        for i in 0..n {
            for c in 0..3 {
                out[i * 3 + c] = T::from_f64(-total[i * K + c]);
            }
        }
    }
    if grads.dchol.is_some() {
        // SAFETY: see the top of the module.
        let out: &mut [T] = unsafe { host_slice_mut(grads.dchol, n * 9) };
        for i in 0..n {
            let t = &total[i * K..i * K + K];
            let l = [
                -t[3], 0.0, 0.0, //
                -t[4], -t[5], 0.0, //
                -t[6], -t[7], -t[8],
            ];
            for (o, v) in out[i * 9..i * 9 + 9].iter_mut().zip(l) {
                *o = T::from_f64(v);
            }
        }
    }
    if grads.dweights.is_some() {
        // SAFETY: see the top of the module.
        let out: &mut [T] = unsafe { host_slice_mut(grads.dweights, n) };
        for i in 0..n {
            out[i] = T::from_f64(total[i * K + 9]);
        }
    }
}

fn maha_bwd_t<T: Real>(inp: &Inputs, g: Option<Addr>, grads: &Grads) {
    let n = inp.n as usize;
    // SAFETY: see the top of the module.
    let gv: &[T] = unsafe { host_slice(g, inp.b as usize * n) };
    backward_t::<T, _>(inp, grads, |b, i, _, _| (2.0 * gv[b * n + i].to_f64(), 0.0));
}

pub fn mahalanobis_backward(inp: &Inputs, g: Option<Addr>, grads: &Grads) -> Result<()> {
    crate::with_real!(inp.dtype, T => maha_bwd_t::<T>(inp, g, grads));
    Ok(())
}

fn field_bwd_t<T: Real>(inp: &Inputs, dout: Option<Addr>, grads: &Grads) {
    // SAFETY: see the top of the module.
    let dv: &[T] = unsafe { host_slice(dout, inp.b as usize) };
    backward_t::<T, _>(inp, grads, |b, _, g, m| {
        // g_bn = dL/dm = dout_b w_n exp(-0.5 m) (-0.5); the solve needs 2 g.
        let de = dv[b].to_f64() * (-0.5 * m).exp();
        (-g.w * de, de)
    });
}

pub fn field_backward(inp: &Inputs, dout: Option<Addr>, grads: &Grads) -> Result<()> {
    crate::with_real!(inp.dtype, T => field_bwd_t::<T>(inp, dout, grads));
    Ok(())
}
