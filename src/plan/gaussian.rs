//! Plans of the Gaussian family: the inputs and gradients of the Mahalanobis and field
//! ops: what validated code in `ops::gaussian` makes and the backends (`cpu`, `cuda`)
//! execute. Below both; imports no backend.

use crate::addr::Addr;
use crate::dtype::DType;

/// Validated inputs, as addresses the backends read (`None`: an empty buffer, or
/// no weights for the Mahalanobis ops).
#[derive(Debug, Clone, Copy)]
pub struct Inputs {
    pub dtype: DType,
    /// Number of points.
    pub b: i64,
    /// Number of Gaussians.
    pub n: i64,
    pub points: Option<Addr>,
    pub means: Option<Addr>,
    pub chol: Option<Addr>,
    pub weights: Option<Addr>,
    pub eps: f64,
}

/// Backward outputs; `None` = not wanted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Grads {
    pub dpoints: Option<Addr>,
    pub dmeans: Option<Addr>,
    pub dchol: Option<Addr>,
    pub dweights: Option<Addr>,
}

impl Grads {
    pub fn any(&self) -> bool {
        self.dpoints.is_some() || self.per_gaussian()
    }
    /// Whether any per-Gaussian sum (over points) is wanted.
    pub fn per_gaussian(&self) -> bool {
        self.dmeans.is_some() || self.dchol.is_some() || self.dweights.is_some()
    }
}
