//! CPU multi-layer perceptron (docs/ops.md section 6): layer by layer on the fused
//! linear layer's pieces (`cpu::linalg`: f32 loads and stores, the f32 GEMM, the
//! activations and their derivatives, the column sums), each layer's output
//! rounded once to the dtype, as on CUDA. `saved` has the layout of
//! `ops::mlp::SavedLayout`.

use half::{bf16, f16};

use super::linalg::{
    act_fwd, col_sums, gelu_erf_grad, gelu_tanh_grad, load_f32, mm_f32, store_f32,
};
use super::{host_slice, host_slice_mut};
use crate::addr::Addr;
use crate::dtype::DType;
use crate::error::Result;
use crate::plan::linalg::Activation;
use crate::plan::mlp::{Layer, MlpPlan};

/// `v` rounded to what `dtype` holds.
fn round(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// Writes the derivative information of layer `l` (pre-activation `z`,
/// `[m, n]`) into its region of `saved`: the ReLU bit mask or the padded `z`.
fn write_aux(dtype: DType, l: &Layer, z: &[f32], m: usize) {
    let (n, ld) = (l.n as usize, l.aux_ld as usize);
    match l.act {
        Activation::None => {}
        Activation::Relu => {
            let pitch = ld / 8;
            // SAFETY: `ops::mlp` validated `saved`: this region of m * pitch bytes
            // lies inside it, host memory, overlapping no input or other output;
            // the only reference to it while written.
            let mask = unsafe { host_slice_mut::<u8>(l.aux, m * pitch) };
            mask.fill(0);
            for (r, row) in z.chunks(n.max(1)).enumerate().take(m) {
                for (j, &v) in row.iter().enumerate() {
                    if v > 0.0 {
                        mask[r * pitch + j / 8] |= 1 << (j % 8);
                    }
                }
            }
        }
        Activation::GeluTanh | Activation::GeluErf => {
            let mut padded = vec![0f32; m * ld];
            for (r, row) in z.chunks(n.max(1)).enumerate().take(m) {
                padded[r * ld..r * ld + n].copy_from_slice(row);
            }
            store_f32(dtype, l.aux, &padded);
        }
    }
}

/// `g *= act'(z)` for layer `l`'s saved derivative information (`g` `[m, n]`).
fn apply_grad(dtype: DType, l: &Layer, g: &mut [f32], m: usize) {
    let (n, ld) = (l.n as usize, l.aux_ld as usize);
    let rows = g.chunks_mut(n.max(1)).enumerate().take(m);
    match l.act {
        Activation::None => {}
        Activation::Relu => {
            let pitch = ld / 8;
            // SAFETY: `ops::mlp` validated `saved`: m * pitch bytes of host memory
            // that no output overlaps, read during this call only.
            let mask = unsafe { host_slice::<u8>(l.aux, m * pitch) };
            for (r, row) in rows {
                for (j, v) in row.iter_mut().enumerate() {
                    if mask[r * pitch + j / 8] & (1 << (j % 8)) == 0 {
                        *v = 0.0;
                    }
                }
            }
        }
        Activation::GeluTanh | Activation::GeluErf => {
            let grad = if l.act == Activation::GeluTanh {
                gelu_tanh_grad
            } else {
                gelu_erf_grad
            };
            let z = load_f32(dtype, l.aux, m * ld);
            for (r, row) in rows {
                for (v, &z) in row.iter_mut().zip(&z[r * ld..]) {
                    *v *= grad(z);
                }
            }
        }
    }
}

/// `y = act(... act(x W_0^T + b_0) ...)`, keeping what the backward needs in
/// `saved` when the plan has it.
pub fn forward(p: &MlpPlan) -> Result<()> {
    let m = p.rows as usize;
    let last = p.layers.len() - 1;
    let mut h = load_f32(p.dtype, p.x, m * p.layers[0].k as usize);
    for (i, l) in p.layers.iter().enumerate() {
        let (k, n) = (l.k as usize, l.n as usize);
        let w = load_f32(p.dtype, l.w, n * k);
        // z = h W^T: W [n, k] viewed as W^T [k, n] has strides (1, k)
        let mut z = mm_f32(m, n, k, &h, k as isize, 1, &w, 1, k.max(1) as isize);
        if l.bias.is_some() {
            let b = load_f32(p.dtype, l.bias, n);
            super::for_chunks_mut(&mut z, n, |_, row| {
                row.iter_mut().zip(&b).for_each(|(v, bj)| *v += bj)
            });
        }
        if l.aux.is_some() {
            write_aux(p.dtype, l, &z, m);
        }
        super::for_chunks_mut(&mut z, 4096, |_, c| {
            c.iter_mut()
                .for_each(|v| *v = round(p.dtype, act_fwd(l.act, *v)))
        });
        if i == last {
            store_f32(p.dtype, p.y, &z);
        } else if l.hidden.is_some() {
            store_f32(p.dtype, l.hidden, &z);
        }
        h = z;
    }
    Ok(())
}

/// Every requested gradient, from the top layer down to the lowest one wanted.
pub fn backward(p: &MlpPlan) -> Result<()> {
    let m = p.rows as usize;
    let top = p.layers.len() - 1;
    let lowest = p.lowest();
    let mut g = load_f32(p.dtype, p.dy, m * p.layers[top].n as usize);
    for i in (lowest..=top).rev() {
        let l = &p.layers[i];
        let (k, n) = (l.k as usize, l.n as usize);
        apply_grad(p.dtype, l, &mut g, m);
        if l.db.is_some() {
            store_f32(p.dtype, l.db, &col_sums(&g, m, n));
        }
        // dz as the products read it: rounded to the dtype
        let dz: Vec<f32> = g.iter().map(|&v| round(p.dtype, v)).collect();
        if l.dw.is_some() {
            let h = load_f32(p.dtype, p.input(i), m * k);
            // dW [n, k] = dz^T [n, m] h [m, k]
            let dw = mm_f32(n, k, m, &dz, 1, n.max(1) as isize, &h, k as isize, 1);
            store_f32(p.dtype, l.dw, &dw);
        }
        if i > lowest || p.dx.is_some() {
            let w = load_f32(p.dtype, l.w, n * k);
            // dh [m, k] = dz [m, n] W [n, k]
            g = mm_f32(m, k, n, &dz, n as isize, 1, &w, k as isize, 1);
            if i == 0 {
                store_f32(p.dtype, p.dx, &g);
            }
        }
    }
    Ok(())
}

/// Zeroes `bytes` bytes of a validated host output (an empty batch's gradients).
pub fn zero(addr: Option<Addr>, bytes: usize) {
    // SAFETY: `ops::mlp` validated the output: `bytes` bytes of host memory,
    // overlapping no input or other output; the only reference while written.
    unsafe { host_slice_mut::<u8>(addr, bytes) }.fill(0);
}
