//! Multi-layer perceptron entry points (docs/ops.md section 6): a whole network of
//! fused linear layers in one call each way, and the size of what the forward
//! keeps for the backward.
//!
//! Shared rules, stated once here and referenced by each function's doc:
//! - Layer `i` of `n_layers` (`L`) computes `h_{i+1} = act_i(h_i W_i^T + b_i)`,
//!   `h_0 = x`, `y = h_L`; `act_i` is `hidden_act` for `i < L - 1` and `out_act`
//!   for the last layer, each one of `FK_ACT_NONE`, `FK_ACT_RELU`,
//!   `FK_ACT_GELU_TANH`, `FK_ACT_GELU_ERF` (as `fk_linear_forward`).
//! - Widths: `x` is `[..., k_0]` (all leading dimensions flattened into `rows`),
//!   `weights[i]` is `[n_i, k_i]` with `k_{i+1} = n_i`, `biases[i]` is `[n_i]`,
//!   `y` is `[..., n_{L-1}]` with `x`'s leading shape.
//! - `n_layers` is 1 to `FK_MLP_MAX_LAYERS`; every array argument holds
//!   `n_layers` entries.
//! - dtypes: f16, bf16, f32, one for every buffer (except `saved`, any dtype);
//!   products accumulate in f32, bias and activation are applied in f32 before the
//!   single rounding of each layer's output. `flags`: 0 or `FK_GEMM_ALLOW_TF32`
//!   (f32 products may use TF32 tensor cores on CUDA; strict f32 otherwise);
//!   unknown bits are `FK_ERROR_INVALID_ARGUMENT`.
//! - Every buffer must be contiguous; outputs must not overlap inputs or each
//!   other (`FK_ERROR_ALIASING`), nor be read-only DLPack imports.
//! - `saved` is opaque and backend-specific: its size comes from
//!   `fk_mlp_saved_size`, its contents only from `fk_mlp_forward`, and only
//!   `fk_mlp_backward` of the same network, rows, dtype, activations and context
//!   reads them. It must start at a multiple of 16 bytes (every buffer
//!   `fk_buffer_create` makes does).
//! - Messages name the argument and the layer, e.g. `fk_mlp_forward: weights[2]
//!   has shape [64, 30] but layer 2 takes 32 inputs (layer 1 gives 32)`.
//! - Statuses common to all: `FK_ERROR_NULL_POINTER` (a required handle or array
//!   NULL, or an entry of `weights`), `FK_ERROR_INVALID_ARGUMENT` (`n_layers`
//!   outside 1..=`FK_MLP_MAX_LAYERS`, an unknown activation or flag, `saved`
//!   misaligned, a dead handle), `FK_ERROR_UNSUPPORTED_DTYPE` (not f16, bf16 or
//!   f32), `FK_ERROR_DTYPE_MISMATCH`, `FK_ERROR_SHAPE_MISMATCH` (layers that do not
//!   chain, a bias of the wrong length, `y`/`dy`/gradients of the wrong shape),
//!   `FK_ERROR_DEVICE_MISMATCH`, `FK_ERROR_ALIASING`, `FK_ERROR_UNSUPPORTED` (a
//!   non-contiguous buffer, a size above 2^31 - 1 on CUDA),
//!   `FK_ERROR_BUFFER_TOO_SMALL` (`saved` smaller than `fk_mlp_saved_size`), and on
//!   CUDA `FK_ERROR_LIBRARY_NOT_FOUND`, `FK_ERROR_KERNEL_COMPILE`,
//!   `FK_ERROR_OUT_OF_MEMORY`, `FK_ERROR_CUDA`.

use super::linalg::{activation_arg, fk_activation};
use super::{buffer_ref, context_ref, fk_buffer, fk_context, fk_stream, guard, opt_buffer};
use super::{slice_in, stream_or_default, write_out};
use crate::buffer::Buffer;
use crate::dtype::{DType, fk_dtype};
use crate::error::{FK_ERROR_NULL_POINTER, Result, fk_status};
use crate::ops::mlp;
use crate::plan::linalg::Activation;

/// The most layers `fk_mlp_forward` / `fk_mlp_backward` take in one call.
pub const FK_MLP_MAX_LAYERS: i32 = 64;

// cbindgen copies literal values only; the crate's constant must agree.
const _: () = assert!(FK_MLP_MAX_LAYERS as usize == crate::plan::mlp::MAX_LAYERS);

/// `hidden_act` and `out_act`, checked in that order.
fn activations(
    hidden_act: fk_activation,
    out_act: fk_activation,
) -> Result<(Activation, Activation)> {
    Ok((
        activation_arg(hidden_act, "hidden_act")?,
        activation_arg(out_act, "out_act")?,
    ))
}

/// `n_layers` checked, then the `n_layers` entries of the array `p` (`what`).
unsafe fn array<'a, T>(p: *const T, n_layers: usize, what: &str) -> Result<&'a [T]> {
    crate::ensure!(!p.is_null(), FK_ERROR_NULL_POINTER, "{what} is NULL");
    // SAFETY: the caller's array holds n_layers entries.
    unsafe { slice_in(p, n_layers, what) }
}

/// The required buffers of the array `p` (every entry non-NULL).
unsafe fn required<'a>(
    p: *const *const fk_buffer,
    n_layers: usize,
    what: &str,
) -> Result<Vec<&'a Buffer>> {
    let a = unsafe { array(p, n_layers, what)? };
    a.iter()
        .enumerate()
        // SAFETY: each entry is NULL or a handle from fusekit.
        .map(|(i, &b)| unsafe { buffer_ref(b, &format!("{what}[{i}]")) })
        .collect()
}

/// The optional buffers of the array `p` (NULL array: every entry NULL).
unsafe fn optional<'a>(
    p: *const *const fk_buffer,
    n_layers: usize,
    what: &str,
) -> Result<Vec<Option<&'a Buffer>>> {
    if p.is_null() {
        return Ok(vec![None; n_layers]);
    }
    let a = unsafe { array(p, n_layers, what)? };
    a.iter()
        .enumerate()
        // SAFETY: each entry is NULL or a handle from fusekit.
        .map(|(i, &b)| unsafe { opt_buffer(b, &format!("{what}[{i}]")) })
        .collect()
}

/// Bytes of the `saved` buffer `fk_mlp_forward` fills for `fk_mlp_backward`, for a
/// network of `n_layers` layers with `widths` = `[k_0, n_0, n_1, ..., n_{L-1}]`
/// (`n_layers + 1` entries: x's features, then each layer's outputs) over `rows`
/// rows (x's leading dimensions multiplied), in `dtype`, on `ctx`'s backend.
/// Allocate it (any dtype, contiguous) before the forward.
///
/// What it holds, per layer (the layout is opaque and may differ between backends
/// and versions): the activation's derivative information, as compact as the
/// activation allows (ReLU: one bit per element, rows padded to 128 bits;
/// the GELUs: the pre-activation in `dtype`, rows padded to 8 elements; none:
/// nothing), and each hidden layer's output `h_{i+1}` (`rows * n_i` elements),
/// which the weight gradients read. 0 for one layer with `FK_ACT_NONE`.
///
/// Statuses: `FK_ERROR_NULL_POINTER` (`ctx`, `widths` or `bytes` NULL),
/// `FK_ERROR_INVALID_ARGUMENT` (`n_layers` outside 1..=`FK_MLP_MAX_LAYERS`, an
/// unknown activation or dtype value, negative `rows` or widths),
/// `FK_ERROR_UNSUPPORTED_DTYPE` (not f16, bf16 or f32).
/// - CUDA graphs: host-only, callable anywhere.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn fk_mlp_saved_size(
    ctx: *const fk_context,
    n_layers: i32,
    widths: *const i64,
    rows: i64,
    dtype: fk_dtype,
    hidden_act: fk_activation,
    out_act: fk_activation,
    bytes: *mut usize,
) -> fk_status {
    guard("fk_mlp_saved_size", || unsafe {
        let c = context_ref(ctx, "ctx")?;
        let l = mlp::check_n_layers(n_layers)?;
        let widths = array(widths, l + 1, "widths")?;
        let d = DType::from_abi(dtype, "dtype")?;
        let (h, o) = activations(hidden_act, out_act)?;
        let need = mlp::saved_size(c, widths, rows, d, h, o)?;
        write_out(bytes, "bytes", need)
    })
}

/// Forward of a multi-layer perceptron, `y = h_L` with
/// `h_{i+1} = act_i(h_i W_i^T + b_i)` (see the module rules), every layer one
/// fused product: on CUDA one cuBLASLt call per layer with its epilogue
/// (`BIAS`, `RELU_AUX_BIAS`, `GELU_AUX_BIAS`, ...; the exact GELU as
/// `fk_linear_forward` does it: `BIAS`, then fusekit's activation kernel; a GEMM
/// plus that kernel where cuBLASLt declines).
///
/// - `x`: `[..., k_0]`; `weights`: `n_layers` buffers, `weights[i]` `[n_i, k_i]`;
///   `biases`: optional array (NULL = no layer has a bias) whose entries are
///   optional (NULL = that layer has none), `biases[i]` `[n_i]`.
/// - `hidden_act`, `out_act`: the activations below and on the last layer.
/// - `flags`: 0 or `FK_GEMM_ALLOW_TF32`.
/// - `y`: `[..., n_{L-1}]`, overwritten.
/// - `saved`: optional (NULL for inference): at least `fk_mlp_saved_size` bytes,
///   receives what `fk_mlp_backward` needs. Without it the hidden activations live
///   in scratch memory of the call (on CUDA the stream's cached scratch, or under
///   capture a stream-ordered allocation of the call).
/// - Statuses: see the module rules.
/// - CUDA graphs: capturable from the first call on any stream (docs/abi.md, "CUDA graphs").
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn fk_mlp_forward(
    x: *const fk_buffer,
    n_layers: i32,
    weights: *const *const fk_buffer,
    biases: *const *const fk_buffer,
    hidden_act: fk_activation,
    out_act: fk_activation,
    flags: u32,
    y: *mut fk_buffer,
    saved: *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_mlp_forward", || unsafe {
        let (h, o) = activations(hidden_act, out_act)?;
        let (x, y) = buffers!(x, y);
        let l = mlp::check_n_layers(n_layers)?;
        let w = required(weights, l, "weights")?;
        let b = optional(biases, l, "biases")?;
        let saved = buffers!([saved]);
        let s = stream_or_default(stream, &y.ctx)?;
        mlp::forward(x, &w, &b, h, o, flags, y, saved, &s)
    })
}

/// Backward of `fk_mlp_forward`, given `dy = dL/dy`: every requested gradient in
/// one call, overwritten (not accumulated). With `dz_i = dh_{i+1} * act_i'(z_i)`
/// (`dh_L = dy`): `dweights[i] = dz_i^T h_i`, `dbiases[i] = sum over rows of
/// dz_i`, `dh_i = dz_i W_i`, `dx = dh_0`.
///
/// - `dy`: `y`'s shape; `x`, `n_layers`, `weights`, `hidden_act`, `out_act`: those
///   of the forward (biases are not needed).
/// - `saved`: what `fk_mlp_forward` wrote for this network, rows, dtype and
///   activations; may be NULL only when `fk_mlp_saved_size` is 0.
/// - `dx` (`x`'s shape), `dweights` (array of `n_layers`; `weights[i]`'s shapes),
///   `dbiases` (array of `n_layers`; `[n_i]`): each optional (NULL = not wanted;
///   NULL arrays: none of them), overwritten; nothing wanted is a no-op. Only the
///   layers down to the lowest requested gradient are computed. An empty batch
///   writes zero weight and bias gradients.
/// - `flags`: 0 or `FK_GEMM_ALLOW_TF32`.
/// - On CUDA each layer's data-gradient product applies the activation
///   derivative of the layer below and its bias gradient in the same cuBLASLt
///   call (`DRELU_BGRAD`, `DGELU_BGRAD`; fusekit's kernel for the exact GELU or
///   where cuBLASLt declines), and the weight-gradient products run on a second
///   stream of the context, forked from `stream` and joined back into it by
///   events before the call returns.
/// - Statuses: see the module rules; `FK_ERROR_NULL_POINTER` also when `saved` is
///   NULL but needed.
/// - CUDA graphs: capturable from the first call on any stream; under capture the
///   second stream joins the capture (the events become graph edges) and the
///   scratch memory is a stream-ordered allocation of the call (docs/abi.md, "CUDA
///   graphs").
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn fk_mlp_backward(
    dy: *const fk_buffer,
    x: *const fk_buffer,
    n_layers: i32,
    weights: *const *const fk_buffer,
    hidden_act: fk_activation,
    out_act: fk_activation,
    flags: u32,
    saved: *const fk_buffer,
    dx: *mut fk_buffer,
    dweights: *const *mut fk_buffer,
    dbiases: *const *mut fk_buffer,
    stream: *const fk_stream,
) -> fk_status {
    guard("fk_mlp_backward", || unsafe {
        let (h, o) = activations(hidden_act, out_act)?;
        let (dy, x) = buffers!(dy, x);
        let l = mlp::check_n_layers(n_layers)?;
        let w = required(weights, l, "weights")?;
        let (saved, dx) = buffers!([saved], [dx]);
        let dw = optional(dweights as *const *const fk_buffer, l, "dweights")?;
        let db = optional(dbiases as *const *const fk_buffer, l, "dbiases")?;
        let s = stream_or_default(stream, &dy.ctx)?;
        mlp::backward(dy, x, &w, h, o, flags, saved, dx, &dw, &db, None, &s)
    })
}
