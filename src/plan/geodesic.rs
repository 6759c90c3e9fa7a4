//! Plans of the geodesic family: the flags, the job of one Christoffel or leapfrog call
//! and its kind: what validated code in `ops::geodesic` makes and the backends (`cpu`,
//! `cuda`) execute. Below both; imports no backend.

use crate::addr::Addr;
use crate::dtype::DType;

/// Flag bit: the CUDA forwards may use TF32 tensor cores for f32 products (about
/// 5e-4 relative error instead of 1e-7). A permission, not a demand: the CPU, f64,
/// the generic kernels and the backwards compute in strict IEEE arithmetic.
pub(crate) const GEO_ALLOW_TF32: u32 = 1;

/// Flag bit for testing and debugging: the CUDA backend uses its generic kernels
/// even where a fast configuration exists (same results to rounding, slower).
pub(crate) const GEO_FORCE_GENERIC: u32 = 2;

/// Flag bit: the CUDA leapfrog forward may use 3xTF32 tensor-core products for f32
/// (each operand split into TF32 high and low parts): f32-level accuracy, faster than
/// the FFMA kernel. A permission like `GEO_ALLOW_TF32`, which wins where both are set.
pub(crate) const GEO_ALLOW_TF32X3: u32 = 4;

/// Every flag bit this version knows.
pub(crate) const GEO_KNOWN_FLAGS: u32 = GEO_ALLOW_TF32 | GEO_FORCE_GENERIC | GEO_ALLOW_TF32X3;

/// What the backends execute: sizes, scalars and the data addresses (`None`: absent,
/// or an empty buffer). Every buffer is contiguous row-major, so an address and the
/// sizes say it all. Built by the entry points below, field by field.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub dtype: DType,
    /// Rows (batch).
    pub b: usize,
    /// Features.
    pub d: usize,
    /// Rank of `U`, `W`.
    pub r: usize,
    /// Clamp bound (`+inf` disables clamping).
    pub c: f64,
    pub dt: f64,
    /// `T`, the number of leapfrog steps (0 for the Christoffel ops).
    pub steps: usize,
    pub flags: u32,
    // inputs
    pub x0: Option<Addr>,
    pub v0: Option<Addr>,
    pub f: Option<Addr>,
    pub u: Option<Addr>,
    pub w: Option<Addr>,
    pub mu: Option<Addr>,
    /// `g = dL/dgamma` (Christoffel backward).
    pub g: Option<Addr>,
    /// `dL/dx_T`, `dL/dv_T` (leapfrog backward).
    pub gx: Option<Addr>,
    pub gv: Option<Addr>,
    // outputs (forward)
    pub gamma: Option<Addr>,
    pub x_out: Option<Addr>,
    pub v_out: Option<Addr>,
    /// `[T, 2, B, D]`: an output of the forward, an input of the backward.
    pub traj: Option<Addr>,
    // outputs (backward)
    pub dx: Option<Addr>,
    pub dv: Option<Addr>,
    pub df: Option<Addr>,
    pub du: Option<Addr>,
    pub dw: Option<Addr>,
}

impl Job {
    /// A job of these sizes with every operand absent (T = 0, no flags, no clamp): the
    /// base over which the entry points name their operands and scalars, field by field.
    pub(crate) fn absent(dtype: DType, b: usize, d: usize, r: usize) -> Job {
        Job {
            dtype,
            b,
            d,
            r,
            c: f64::INFINITY,
            dt: 0.0,
            steps: 0,
            flags: 0,
            x0: None,
            v0: None,
            f: None,
            u: None,
            w: None,
            mu: None,
            g: None,
            gx: None,
            gv: None,
            gamma: None,
            x_out: None,
            v_out: None,
            traj: None,
            dx: None,
            dv: None,
            df: None,
            du: None,
            dw: None,
        }
    }
}

/// The four entry points (the CUDA launcher picks kernels by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ChristoffelForward,
    ChristoffelBackward,
    LeapfrogForward,
    LeapfrogBackward,
}
