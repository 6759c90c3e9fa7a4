//! Plans of the multi-layer MLP op: the layer table, the saved-memory layout shared by
//! the forward and the backward, the plan: what validated code in `ops::mlp` makes and
//! the backends (`cpu`, `cuda`) execute. Below both; imports no backend.

use crate::addr::Addr;
use crate::dtype::DType;
use crate::error::{Error, FK_ERROR_INVALID_ARGUMENT, Result};
use crate::plan::linalg::Activation;

/// The most layers one call takes (`FK_MLP_MAX_LAYERS`: `abi::mlp` states the ABI
/// constant and asserts that the two agree).
pub(crate) const MAX_LAYERS: usize = 64;

/// Offsets in `saved` start at multiples of this many bytes (cuBLASLt's preferred
/// alignment), and `saved` itself must start at a multiple of `SAVED_ALIGN`.
const REGION_ALIGN: u64 = 256;

pub(crate) const SAVED_ALIGN: usize = 16;

/// The ReLU mask's row pitch in bits is a multiple of this (cuBLASLt's rule for
/// the `RELU_AUX` bit mask's leading dimension).
pub(crate) const MASK_LD_BITS: i64 = 128;

/// The saved pre-activation's row pitch in elements is a multiple of this
/// (cuBLASLt's rule for the `GELU_AUX` input's leading dimension).
pub(crate) const PREACT_LD: i64 = 8;

/// Where layer `i`'s backward information lies in `saved`: byte offsets from
/// `saved`'s start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavedLayer {
    /// The activation's derivative information, `None` for `FK_ACT_NONE`: for
    /// ReLU a bit mask, row `r`'s bit `j` (`z[r, j] > 0`) at bit `j % 8` of byte
    /// `r * aux_ld / 8 + j / 8` (`aux_ld` in bits); for the GELUs the
    /// pre-activation `z` in the dtype, row pitch `aux_ld` elements.
    pub aux: Option<u64>,
    /// Row pitch of `aux`: bits (ReLU) or elements (GELU).
    pub aux_ld: i64,
    /// The layer's output `h_{i+1}` (`[rows, n_i]`, dense, in the dtype), `None`
    /// on the last layer (its output is `y`).
    pub hidden: Option<u64>,
}

/// The `saved` buffer's layout for one MLP shape (the same on every backend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedLayout {
    pub layers: Vec<SavedLayer>,
    pub bytes: usize,
}

fn overflow(what: &str) -> Error {
    Error::new(
        FK_ERROR_INVALID_ARGUMENT,
        format!("the saved buffer's size overflows for {what}"),
    )
}

impl SavedLayout {
    /// `widths` = `[k_0, n_0, ..., n_{L-1}]`; `acts[i]` layer `i`'s activation.
    pub fn new(
        widths: &[i64],
        rows: i64,
        dtype: DType,
        acts: &[Activation],
    ) -> Result<SavedLayout> {
        let what = || format!("rows = {rows}, widths = {widths:?}");
        let mut at: u64 = 0;
        let mut take = |bytes: u128| -> Result<u64> {
            let start = at;
            let end = (start as u128 + bytes).next_multiple_of(REGION_ALIGN as u128);
            at = u64::try_from(end).map_err(|_| overflow(&what()))?;
            Ok(start)
        };
        let l = acts.len();
        let mut layers = Vec::with_capacity(l);
        for (i, &act) in acts.iter().enumerate() {
            let n = widths[i + 1];
            let (aux, aux_ld) = match act {
                Activation::None => (None, 0),
                Activation::Relu => {
                    let ld = (n as u64)
                        .next_multiple_of(MASK_LD_BITS as u64)
                        .max(MASK_LD_BITS as u64) as i64;
                    (Some(take(rows as u128 * ld as u128 / 8)?), ld)
                }
                Activation::GeluTanh | Activation::GeluErf => {
                    let ld = (n as u64)
                        .next_multiple_of(PREACT_LD as u64)
                        .max(PREACT_LD as u64) as i64;
                    let bytes = rows as u128 * ld as u128 * dtype.size() as u128;
                    (Some(take(bytes)?), ld)
                }
            };
            let hidden = if i + 1 < l {
                Some(take(rows as u128 * n as u128 * dtype.size() as u128)?)
            } else {
                None
            };
            layers.push(SavedLayer {
                aux,
                aux_ld,
                hidden,
            });
        }
        let bytes = usize::try_from(at).map_err(|_| overflow(&what()))?;
        Ok(SavedLayout { layers, bytes })
    }
}

/// The activation of each of `n_layers` layers.
pub fn layer_acts(n_layers: usize, hidden: Activation, out: Activation) -> Vec<Activation> {
    (0..n_layers)
        .map(|i| if i + 1 == n_layers { out } else { hidden })
        .collect()
}

/// The layer information of a validated call.
#[derive(Debug, Clone, Copy)]
pub struct Layer {
    pub k: i64,
    pub n: i64,
    pub act: Activation,
    pub w: Option<Addr>,
    /// Forward: the bias (optional). Backward: unused.
    pub bias: Option<Addr>,
    /// Derivative information in `saved` (`SavedLayer::aux`), `None` when the
    /// forward keeps nothing (inference, or `FK_ACT_NONE`).
    pub aux: Option<Addr>,
    pub aux_ld: i64,
    /// `h_{i+1}` in `saved` (`None` on the last layer, or in inference).
    pub hidden: Option<Addr>,
    /// Backward: `dW_i` and `db_i`, each optional.
    pub dw: Option<Addr>,
    pub db: Option<Addr>,
}

/// What the backends execute: the forward (`dy`, `dx` unused) or the backward
/// (`y` unused) of an MLP over `rows` rows.
#[derive(Debug, Clone)]
pub struct MlpPlan {
    pub dtype: DType,
    pub rows: i64,
    pub allow_tf32: bool,
    pub layers: Vec<Layer>,
    pub x: Option<Addr>,
    pub y: Option<Addr>,
    pub dy: Option<Addr>,
    pub dx: Option<Addr>,
    /// The backward's scratch from the caller (address, bytes; an XLA result, so
    /// that the call allocates nothing and XLA can capture it into its CUDA
    /// graphs), at least `cuda::linalg::mlp_backward_workspace_bytes`; `None`: the
    /// backend's own (the CPU backend needs none).
    pub workspace: Option<(Addr, usize)>,
}

impl MlpPlan {
    /// The lowest layer whose `dz` the backward's requested gradients need (0 when
    /// `dx` is wanted).
    pub fn lowest(&self) -> usize {
        if self.dx.is_some() {
            return 0;
        }
        self.layers
            .iter()
            .position(|l| l.dw.is_some() || l.db.is_some())
            .unwrap_or(self.layers.len() - 1)
    }

    /// The input `h_i` of layer `i` where the forward keeps it: `x` for layer 0,
    /// else the previous layer's saved output.
    pub fn input(&self, i: usize) -> Option<Addr> {
        if i == 0 {
            self.x
        } else {
            self.layers[i - 1].hidden
        }
    }
}
