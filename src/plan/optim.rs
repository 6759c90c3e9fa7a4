//! Plans of the optimizer family: Newton's method and report, the matrix-power, Shampoo
//! statistics and per-sample plans, scratch memory, what Newton asks of a backend: what
//! validated code in `ops::optim` makes and the backends (`cpu`, `cuda`) execute. Below
//! both; imports no backend.

use crate::addr::Addr;
use crate::dtype::DType;
use crate::error::{FK_ERROR_INVALID_ARGUMENT, Result};
use crate::plan::linalg::{GemmPlan, Mat, Trans, dense};

/// How `matrix_power` computes. Discriminants are the ABI values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Auto = 0,
    Eigh = 1,
    Newton = 2,
}

impl Method {
    pub fn from_abi(v: i32) -> Result<Method> {
        Ok(match v {
            0 => Method::Auto,
            1 => Method::Eigh,
            2 => Method::Newton,
            _ => crate::bail!(
                FK_ERROR_INVALID_ARGUMENT,
                "method = {v} is not a valid fk_matpow_method (FK_MATPOW_AUTO=0, FK_MATPOW_EIGH=1, FK_MATPOW_NEWTON=2)"
            ),
        })
    }
}

/// What `matrix_power` reports (see `fk_matpow_report`).
#[derive(Debug, Clone, Copy)]
pub struct Report {
    pub method: Method,
    pub iterations: i32,
    pub converged: bool,
    /// Newton: the largest `max |M - I|` over the batch at the end; NaN for eigh.
    pub residual: f64,
    /// Eigh: the smallest eigenvalue of `A + eps I` over the batch (before the
    /// shift); NaN for Newton.
    pub min_eigenvalue: f64,
}

/// A validated matrix power: `batch` contiguous `n x n` matrices.
#[derive(Debug, Clone, Copy)]
pub struct PowPlan {
    pub dtype: DType,
    pub batch: i64,
    pub n: i64,
    pub a: Option<Addr>,
    pub out: Option<Addr>,
    pub power: f64,
    pub eps: f64,
    pub max_iter: i32,
    pub tol: f64,
    pub allow_tf32: bool,
}

impl PowPlan {
    /// `p` when `power = -1/p` for an integer `1 <= p <= 64` (what Newton computes).
    pub fn inverse_root(&self) -> Option<u32> {
        if self.power >= 0.0 {
            return None;
        }
        let p = (-1.0 / self.power).round();
        ((1.0..=64.0).contains(&p) && (self.power * p + 1.0).abs() <= 1e-12).then_some(p as u32)
    }
    pub fn elems(&self) -> usize {
        (self.batch * self.n * self.n) as usize
    }
    /// The matrices `[batch, n, n]` at `addr`.
    pub fn mat(&self, addr: Addr) -> Mat {
        dense(Some(addr), self.n, self.n, self.n * self.n)
    }
}

/// Scratch memory of a backend (device or host), freed on drop (on CUDA,
/// stream-ordered behind the work queued before).
pub struct Scratch<'a> {
    pub addr: Addr,
    release: Option<Box<dyn FnOnce() + 'a>>,
}

impl<'a> Scratch<'a> {
    pub fn new(addr: Addr, release: Box<dyn FnOnce() + 'a>) -> Scratch<'a> {
        Scratch {
            addr,
            release: Some(release),
        }
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.release.take() {
            f();
        }
    }
}

/// What the Newton iteration needs of a backend. Matrices are `[batch, n, n]`
/// contiguous in the plan's dtype, at addresses of the backend's memory (device or
/// host: scratch or the plan's operands); `gemm` uses the plan's TF32 setting.
pub trait MatOps {
    /// Uninitialised memory of `bytes` bytes (aligned for any dtype).
    fn scratch(&self, bytes: usize) -> Result<Scratch<'_>>;
    fn gemm(&self, p: &GemmPlan) -> Result<()>;
    /// `X = z^(1/p) I`, `M = z (A + eps I)` with `z = (1 + p) / (2 |A + eps I|_F)`
    /// per matrix.
    fn newton_start(&self, plan: &PowPlan, p: u32, x: Addr, m: Addr) -> Result<()>;
    /// `s = A + eps I` (the plan's `a` and `eps`).
    fn shifted(&self, plan: &PowPlan, s: Addr) -> Result<()>;
    /// `T = ((p + 1) I - M) / p`.
    fn newton_step_matrix(&self, plan: &PowPlan, p: u32, m: Addr, t: Addr) -> Result<()>;
    /// `max |M - I|` of each matrix (waits for the work queued before).
    fn residuals(&self, plan: &PowPlan, m: Addr) -> Result<Vec<f64>>;
    /// `dst = src`, `bytes` bytes (queued like the other work).
    fn copy(&self, dst: Addr, src: Addr, bytes: usize) -> Result<()>;
}

/// `L = beta L + alpha G G^T` and/or `R = beta R + alpha G^T G`, batched.
#[derive(Debug, Clone, Copy)]
pub struct StatsPlan {
    pub dtype: DType,
    pub batch: i64,
    pub m: i64,
    pub n: i64,
    pub grad: Option<Addr>,
    /// `None`: not updated (not given, or empty).
    pub l: Option<Addr>,
    pub r: Option<Addr>,
    pub alpha: f64,
    pub beta: f64,
    /// TF32 products (f32 on CUDA; the CPU computes strictly).
    pub allow_tf32: bool,
}

impl StatsPlan {
    /// The statistics to update, `L` then `R`, each with the op on `G` that makes
    /// it: `(N, L)` for `L = beta L + alpha G G^T`, `(T, R)` for `R = beta R +
    /// alpha G^T G`.
    pub fn factors(&self) -> impl Iterator<Item = (Trans, Addr)> {
        [(Trans::N, self.l), (Trans::T, self.r)]
            .into_iter()
            .filter_map(|(op, c)| Some((op, c?)))
    }

    /// The order of the statistic `op` makes: `m` (`L`, op `N`) or `n` (`R`, `T`).
    pub fn order(&self, op: Trans) -> i64 {
        if op == Trans::N { self.m } else { self.n }
    }

    /// The statistic `op` makes, `c = beta c + alpha op(G) op(G)^T`, as one
    /// (batched) GEMM writing both triangles; `tf32` for TF32 products.
    pub fn gemm(&self, op: Trans, c: Addr, tf32: bool) -> GemmPlan {
        let g = dense(self.grad, self.m, self.n, self.m * self.n);
        let other = if op == Trans::N { Trans::T } else { Trans::N };
        let k = self.order(op);
        let cm = dense(Some(c), k, k, k * k);
        GemmPlan::new(
            self.dtype, op, g, other, g, cm, self.alpha, self.beta, self.batch, tf32,
        )
    }
}

/// Activations `a [B, (T,) in]` and output gradients `g [B, (T,) out]` of a linear
/// layer, validated: `steps` is T (1 for 2-D inputs).
#[derive(Debug, Clone, Copy)]
pub struct SamplePlan {
    pub dtype: DType,
    pub batch: i64,
    pub steps: i64,
    pub din: i64,
    pub dout: i64,
    pub a: Option<Addr>,
    pub g: Option<Addr>,
    pub allow_tf32: bool,
}

/// The DP-SGD clipping factor of a sample with squared gradient norm `sq`.
pub fn clip_scale(sq: f64, max_norm: f64) -> f64 {
    let norm = sq.sqrt();
    if norm > max_norm {
        max_norm / norm
    } else {
        1.0
    }
}

impl SamplePlan {
    /// `out[b] = g_b^T a_b` for every sample: one batched GEMM with `k = T`.
    pub fn grads_gemm(&self, out: Option<Addr>) -> GemmPlan {
        let (t, i, o) = (self.steps, self.din, self.dout);
        GemmPlan::new(
            self.dtype,
            Trans::T,
            dense(self.g, t, o, t * o),
            Trans::N,
            dense(self.a, t, i, t * i),
            dense(out, o, i, o * i),
            1.0,
            0.0,
            self.batch,
            self.allow_tf32,
        )
    }
    /// `out = gs^T a` over all `B*T` rows: the sum over samples of `gs_b^T a_b`
    /// (`gs` has g's shape).
    pub fn sum_gemm(&self, gs: Addr, out: Option<Addr>) -> GemmPlan {
        let rows = self.batch * self.steps;
        GemmPlan::new(
            self.dtype,
            Trans::T,
            dense(Some(gs), rows, self.dout, 0),
            Trans::N,
            dense(self.a, rows, self.din, 0),
            dense(out, self.dout, self.din, 0),
            1.0,
            0.0,
            1,
            self.allow_tf32,
        )
    }
}
