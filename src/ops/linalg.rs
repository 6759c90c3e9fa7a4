//! The linear-algebra family (docs/ops.md section 2): validation, then dispatch.
//!
//! - GEMM `C = alpha op(A) op(B) + beta C`, strided batches, every dtype.
//! - Fused linear `y = act(x W^T + b)` forward and backward (f16, bf16, f32).
//! - Chunked GEMM under a device-memory budget, operands in pinned host memory.
//! - Batched Kronecker product.
//!
//! Matrices are row-major. A matrix operand is a buffer `[rows, cols]` or
//! `[batch, rows, cols]` whose column stride is 1 and whose row stride (the leading
//! dimension `ld`) is at least `cols`; the batch stride is free (0 broadcasts one
//! matrix over the batch). Anything else is refused with a message saying how to make
//! it acceptable (`fk_copy` into a contiguous buffer).

use crate::addr::Addr;
use crate::buffer::Buffer;
use crate::context::Device;
use crate::dtype::DType;
use crate::error::{
    FK_ERROR_INVALID_ARGUMENT, FK_ERROR_SHAPE_MISMATCH, FK_ERROR_UNSUPPORTED,
    FK_ERROR_UNSUPPORTED_DTYPE, Result,
};
use crate::ops::check::{self, Named};
use crate::plan::elementwise::Scalar;
use crate::plan::linalg::{
    Activation, GEMM_ALLOW_TF32, GemmPlan, KronPlan, LinearBwdPlan, LinearPlan, Mat, Trans,
};
use crate::stream::Stream;

const GEMM_KNOWN_FLAGS: u32 = GEMM_ALLOW_TF32;

/// The batch of a matrix operand `[r, c]` or `[batch, r, c]` (1 for 2-D) and its
/// batch stride (0 unless there are several matrices).
fn batch_of(buf: &Buffer) -> (i64, i64) {
    let nd = buf.shape.len();
    let batch = if nd == 3 { buf.shape[0] } else { 1 };
    let bs = if nd == 3 && batch > 1 {
        buf.strides[0]
    } else {
        0
    };
    (batch, bs)
}

/// Reads a matrix operand `[r, c]` or `[batch, r, c]`; `what` names the argument.
fn matrix(buf: &Buffer, what: &str) -> Result<(i64, Mat)> {
    let nd = check::rank_2_or_3(
        buf,
        what,
        "a matrix operand is [rows, cols] or [batch, rows, cols]",
    )?;
    let (rows, cols) = (buf.shape[nd - 2], buf.shape[nd - 1]);
    let (rs, cs) = (buf.strides[nd - 2], buf.strides[nd - 1]);
    let (batch, bs) = batch_of(buf);
    let empty = rows == 0 || cols == 0 || batch == 0;
    crate::ensure!(
        empty || cols == 1 || cs == 1,
        FK_ERROR_UNSUPPORTED,
        "{what} has strides {:?} for shape {:?}: matrices must be row-major with unit column stride (strides [.., ld, 1]); copy it into a contiguous buffer with fk_copy first",
        buf.strides,
        buf.shape
    );
    let ld = if rows <= 1 { cols.max(1) } else { rs };
    crate::ensure!(
        empty || ld >= cols.max(1),
        FK_ERROR_UNSUPPORTED,
        "{what} has row stride {rs} < {cols} columns (strides {:?}, shape {:?}): rows must not overlap; copy it with fk_copy first",
        buf.strides,
        buf.shape
    );
    crate::ensure!(
        empty || bs >= 0,
        FK_ERROR_UNSUPPORTED,
        "{what} has a negative batch stride {bs}",
    );
    Ok((
        batch,
        Mat {
            addr: Addr::of(buf),
            rows,
            cols,
            ld,
            batch_stride: bs,
        },
    ))
}

pub(crate) fn int32(v: i64, what: &str) -> Result<()> {
    crate::ensure!(
        v <= i32::MAX as i64,
        FK_ERROR_UNSUPPORTED,
        "{what} = {v} exceeds 2^31 - 1, the largest size cuBLAS takes"
    );
    Ok(())
}

/// The fused linear layer's sizes fit cuBLAS's `int`.
fn linear_int32(m: i64, n: i64, k: i64) -> Result<()> {
    for (v, what) in [(m, "m (rows of x)"), (n, "n"), (k, "k")] {
        int32(v, what)?;
    }
    Ok(())
}

/// Validates GEMM `flags` (0 or `FK_GEMM_ALLOW_TF32`); returns whether TF32 is allowed.
pub(crate) fn gemm_flags(flags: u32) -> Result<bool> {
    crate::ensure!(
        flags & !GEMM_KNOWN_FLAGS == 0,
        FK_ERROR_INVALID_ARGUMENT,
        "flags = {flags:#x} has unknown bits (known: FK_GEMM_ALLOW_TF32 = {GEMM_ALLOW_TF32})"
    );
    Ok(flags & GEMM_ALLOW_TF32 != 0)
}

/// Validates a GEMM and returns the plan (`None` when there is nothing to compute).
#[allow(clippy::too_many_arguments)]
pub fn gemm_plan(
    op_a: Trans,
    op_b: Trans,
    alpha: Scalar,
    a: &Buffer,
    b: &Buffer,
    beta: Scalar,
    c: &Buffer,
    flags: u32,
    stream: &Stream,
) -> Result<GemmPlan> {
    let device = c.device();
    check::devices(device, &[(Some(a), "a"), (Some(b), "b")], stream)?;
    let tf32 = gemm_flags(flags)?;
    check::binary_dtypes(a, b, c, "c")?;
    let dtype = a.dtype;
    check::real_scalar(alpha, dtype, "alpha")?;
    check::real_scalar(beta, dtype, "beta")?;
    let (ba, ma) = matrix(a, "a")?;
    let (bb, mb) = matrix(b, "b")?;
    let (bc, mut mc) = matrix(c, "c")?;
    let (m, k) = if op_a.transposed() {
        (ma.cols, ma.rows)
    } else {
        (ma.rows, ma.cols)
    };
    let (kb, n) = if op_b.transposed() {
        (mb.cols, mb.rows)
    } else {
        (mb.rows, mb.cols)
    };
    crate::ensure!(
        kb == k,
        FK_ERROR_SHAPE_MISMATCH,
        "op(a) is [{m}, {k}] (a {:?}, op_a = {}) but op(b) is [{kb}, {n}] (b {:?}, op_b = {}): the inner dimensions differ",
        a.shape,
        op_a.name(),
        b.shape,
        op_b.name()
    );
    crate::ensure!(
        mc.rows == m && mc.cols == n,
        FK_ERROR_SHAPE_MISMATCH,
        "c has shape {:?} but op(a) op(b) is [{m}, {n}] (a {:?} with {}, b {:?} with {})",
        c.shape,
        a.shape,
        op_a.name(),
        b.shape,
        op_b.name()
    );
    for (bx, name) in [(ba, "a"), (bb, "b")] {
        crate::ensure!(
            bx == 1 || bx == bc,
            FK_ERROR_SHAPE_MISMATCH,
            "{name} has batch {bx} but c has batch {bc} (an input's batch must be 1 or c's)"
        );
    }
    if c.shape.len() == 3 && bc > 1 {
        mc.batch_stride = c.strides[0];
    }
    c.check_writable("c")?;
    check::disjoint(c, "c", &[(a, "a"), (b, "b")])?;
    let mut a_m = ma;
    let mut b_m = mb;
    if ba == 1 {
        a_m.batch_stride = 0;
    }
    if bb == 1 {
        b_m.batch_stride = 0;
    }
    Ok(GemmPlan {
        dtype,
        op_a,
        op_b,
        m,
        n,
        k,
        batch: bc,
        a: a_m,
        b: b_m,
        c: mc,
        alpha,
        beta,
        allow_tf32: tf32 && matches!(dtype, DType::F32 | DType::C64),
    })
}

/// `C = alpha op(A) op(B) + beta C`.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    op_a: Trans,
    op_b: Trans,
    alpha: Scalar,
    a: &Buffer,
    b: &Buffer,
    beta: Scalar,
    c: &Buffer,
    flags: u32,
    stream: &Stream,
) -> Result<()> {
    let p = gemm_plan(op_a, op_b, alpha, a, b, beta, c, flags, stream)?;
    if p.m == 0 || p.n == 0 || p.batch == 0 {
        return Ok(());
    }
    match c.device() {
        Device::Cpu => crate::cpu::linalg::gemm(&p),
        Device::Cuda(_) => {
            for (v, what) in [(p.m, "m"), (p.n, "n"), (p.k, "k"), (p.batch, "batch")] {
                int32(v, what)?;
            }
            for (mat, what) in [(&p.a, "a"), (&p.b, "b"), (&p.c, "c")] {
                int32(mat.ld, &format!("the row stride of {what}"))?;
            }
            crate::cuda::linalg::gemm(c.ctx.cuda_dev(), &p, stream)
        }
    }
}

/// The chunked GEMM: as `gemm` (2-D operands or batches), computed in tiles so that
/// the device memory fusekit allocates for staging stays within `budget` bytes.
/// Operands in pinned host memory are streamed to the device tile by tile.
#[allow(clippy::too_many_arguments)]
pub fn gemm_chunked(
    op_a: Trans,
    op_b: Trans,
    alpha: Scalar,
    a: &Buffer,
    b: &Buffer,
    beta: Scalar,
    c: &Buffer,
    budget: u64,
    flags: u32,
    stream: &Stream,
) -> Result<()> {
    let p = gemm_plan(op_a, op_b, alpha, a, b, beta, c, flags, stream)?;
    if p.m == 0 || p.n == 0 || p.batch == 0 {
        return Ok(());
    }
    match c.device() {
        // On the CPU every operand is already in host memory: the budget is moot.
        Device::Cpu => crate::cpu::linalg::gemm(&p),
        Device::Cuda(_) => crate::cuda::linalg::gemm_chunked(c.ctx.cuda_dev(), &p, budget, stream),
    }
}

// ------------------------------------------------------------------ fused linear

fn linear_dtype(d: DType, what: &str) -> Result<()> {
    crate::ensure!(
        matches!(d, DType::F16 | DType::BF16 | DType::F32),
        FK_ERROR_UNSUPPORTED_DTYPE,
        "{what} has dtype {d}; the fused linear layer takes f16, bf16 or f32 (f32 accumulation); use fk_gemm for other dtypes"
    );
    Ok(())
}

/// `(m, k)` of `x [..., k]` (the leading dimensions flattened).
pub(crate) fn rows_of(x: &Buffer, what: &str) -> Result<(i64, i64)> {
    crate::ensure!(
        !x.shape.is_empty(),
        FK_ERROR_SHAPE_MISMATCH,
        "{what} is 0-dimensional; it must be [..., features]"
    );
    let k = *x.shape.last().unwrap();
    let m: i64 = x.shape[..x.shape.len() - 1].iter().product();
    Ok((m, k))
}

/// `y`'s expected shape: `x`'s with the last dimension `n`.
pub(crate) fn with_last(shape: &[i64], n: i64) -> Vec<i64> {
    let mut s = shape.to_vec();
    *s.last_mut().unwrap() = n;
    s
}

fn weight(w: &Buffer, k: i64, xname: &str, xshape: &[i64]) -> Result<i64> {
    crate::ensure!(
        w.shape.len() == 2,
        FK_ERROR_SHAPE_MISMATCH,
        "w has shape {:?}; it must be [out_features, in_features]",
        w.shape
    );
    crate::ensure!(
        w.shape[1] == k,
        FK_ERROR_SHAPE_MISMATCH,
        "w has shape {:?} but {xname} {xshape:?} has {k} features: w must be [n, {k}]",
        w.shape
    );
    Ok(w.shape[0])
}

fn bias_vec(b: &Buffer, n: i64, what: &str) -> Result<()> {
    crate::ensure!(
        b.shape.as_slice() == [n],
        FK_ERROR_SHAPE_MISMATCH,
        "{what} has shape {:?} but w has {n} output features: it must be [{n}]",
        b.shape
    );
    Ok(())
}

/// Bytes of the aux buffer `fk_linear_forward` fills for the backward: the
/// pre-activation `[m, n]` in `dtype` for GELU, nothing (0) for ReLU and none.
pub fn aux_size(act: Activation, dtype: DType, m: i64, n: i64) -> Result<usize> {
    crate::ensure!(
        m >= 0 && n >= 0,
        FK_ERROR_INVALID_ARGUMENT,
        "m = {m} and n = {n} must be >= 0"
    );
    linear_dtype(dtype, "dtype")?;
    if !act.has_aux() {
        return Ok(0);
    }
    (m as u128 * n as u128 * dtype.size() as u128)
        .try_into()
        .map_err(|_| {
            crate::error::Error::new(
                FK_ERROR_INVALID_ARGUMENT,
                format!("m = {m} x n = {n} overflows"),
            )
        })
}

/// `y = act(x W^T + b)`, and the pre-activation into `aux` (GELU, optional).
pub fn linear_forward(
    x: &Buffer,
    w: &Buffer,
    bias: Option<&Buffer>,
    act: Activation,
    y: &Buffer,
    aux: Option<&Buffer>,
    stream: &Stream,
) -> Result<()> {
    let device = y.device();
    check::devices(
        device,
        &[(Some(x), "x"), (Some(w), "w"), (bias, "b"), (aux, "aux")],
        stream,
    )?;
    linear_dtype(x.dtype, "x")?;
    let mut typed = vec![(x, "x"), (w, "w"), (y, "y")];
    if let Some(b) = bias {
        typed.push((b, "b"));
    }
    if let Some(a) = aux {
        typed.push((a, "aux"));
    }
    check::same_dtypes(&typed)?;
    let (m, k) = rows_of(x, "x")?;
    let n = weight(w, k, "x", &x.shape)?;
    if let Some(b) = bias {
        bias_vec(b, n, "b")?;
    }
    let want = with_last(&x.shape, n);
    crate::ensure!(
        y.shape == want,
        FK_ERROR_SHAPE_MISMATCH,
        "y has shape {:?} but x {:?} times w^T {:?} gives {want:?}",
        y.shape,
        x.shape,
        w.shape
    );
    match (act.has_aux(), aux) {
        (false, Some(_)) => crate::bail!(
            FK_ERROR_INVALID_ARGUMENT,
            "aux must be NULL for act = {} (fk_linear_aux_size is 0: the backward of relu reads the output y, that of none needs nothing)",
            act.name()
        ),
        (true, Some(a)) => crate::ensure!(
            a.shape == want,
            FK_ERROR_SHAPE_MISMATCH,
            "aux has shape {:?} but must have y's shape {want:?} (the pre-activation)",
            a.shape
        ),
        _ => {}
    }
    for (b, name) in [(x, "x"), (w, "w"), (y, "y")] {
        check::contiguous(b, name)?;
    }
    if let Some(b) = bias {
        check::contiguous(b, "b")?;
    }
    if let Some(a) = aux {
        check::contiguous(a, "aux")?;
        a.check_writable("aux")?;
    }
    y.check_writable("y")?;
    let mut inputs: Vec<Named> = vec![(x, "x"), (w, "w")];
    inputs.extend(bias.map(|b| (b, "b")));
    check::disjoint(y, "y", &inputs)?;
    if let Some(a) = aux {
        inputs.push((y, "y"));
        check::disjoint(a, "aux", &inputs)?;
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let p = LinearPlan {
        dtype: x.dtype,
        act,
        m,
        n,
        k,
        x: Addr::of(x),
        w: Addr::of(w),
        bias: Addr::of_opt(bias),
        y: Addr::of(y),
        aux: Addr::of_opt(aux),
    };
    match device {
        Device::Cpu => crate::cpu::linalg::linear_forward(&p),
        Device::Cuda(_) => {
            linear_int32(m, n, k)?;
            crate::cuda::linalg::linear_forward(y.ctx.cuda_dev(), &p, stream)
        }
    }
}

/// The backward of `linear_forward`.
#[allow(clippy::too_many_arguments)]
pub fn linear_backward(
    dy: &Buffer,
    x: &Buffer,
    w: &Buffer,
    act: Activation,
    saved: Option<&Buffer>,
    dx: Option<&Buffer>,
    dw: Option<&Buffer>,
    db: Option<&Buffer>,
    stream: &Stream,
) -> Result<()> {
    let device = dy.device();
    let saved = if act == Activation::None { None } else { saved };
    let outs = [(dx, "dx"), (dw, "dw"), (db, "db")];
    check::devices(
        device,
        &[
            (Some(x), "x"),
            (Some(w), "w"),
            (dx, "dx"),
            (dw, "dw"),
            (db, "db"),
            (saved, "saved"),
        ],
        stream,
    )?;
    linear_dtype(dy.dtype, "dy")?;
    let mut typed = vec![(dy, "dy"), (x, "x"), (w, "w")];
    for (o, name) in outs.iter().chain([(saved, "saved")].iter()) {
        if let Some(o) = o {
            typed.push((o, name));
        }
    }
    check::same_dtypes(&typed)?;
    let (m, k) = rows_of(x, "x")?;
    let n = weight(w, k, "x", &x.shape)?;
    let yshape = with_last(&x.shape, n);
    crate::ensure!(
        dy.shape == yshape,
        FK_ERROR_SHAPE_MISMATCH,
        "dy has shape {:?} but the layer's output (x {:?}, w {:?}) is {yshape:?}",
        dy.shape,
        x.shape,
        w.shape
    );
    let saved_buf = match act {
        Activation::None => None,
        _ => {
            let what = if act == Activation::Relu {
                "the forward's output y"
            } else {
                "the pre-activation the forward wrote to aux"
            };
            let Some(s) = saved else {
                crate::bail!(
                    crate::error::FK_ERROR_NULL_POINTER,
                    "saved is NULL but act = {} needs {what}",
                    act.name()
                );
            };
            crate::ensure!(
                s.shape == yshape,
                FK_ERROR_SHAPE_MISMATCH,
                "saved has shape {:?} but must be {what}, shaped {yshape:?}",
                s.shape
            );
            check::contiguous(s, "saved")?;
            Some(s)
        }
    };
    // each parameter's gradient has the parameter's shape
    for (grad, gname, param, pname) in [(dx, "dx", x, "x"), (dw, "dw", w, "w")] {
        if let Some(g) = grad {
            crate::ensure!(
                g.shape == param.shape,
                FK_ERROR_SHAPE_MISMATCH,
                "{gname} has shape {:?} but {pname} has {:?}",
                g.shape,
                param.shape
            );
        }
    }
    if let Some(o) = db {
        bias_vec(o, n, "db")?;
    }
    for (b, name) in [(dy, "dy"), (x, "x"), (w, "w")] {
        check::contiguous(b, name)?;
    }
    let mut inputs: Vec<Named> = vec![(dy, "dy"), (x, "x"), (w, "w")];
    inputs.extend(saved_buf.map(|s| (s, "saved")));
    for (i, &(o, oname)) in outs.iter().enumerate() {
        let Some(o) = o else { continue };
        check::contiguous(o, oname)?;
        o.check_writable(oname)?;
        let later = outs[i + 1..]
            .iter()
            .filter_map(|&(o2, n2)| o2.map(|o2| (o2, n2)));
        let others: Vec<Named> = inputs.iter().copied().chain(later).collect();
        check::disjoint(o, oname, &others)?;
    }
    if dx.is_none() && dw.is_none() && db.is_none() {
        return Ok(());
    }
    let p = LinearBwdPlan {
        dtype: dy.dtype,
        act,
        m,
        n,
        k,
        dy: Addr::of(dy),
        x: Addr::of(x),
        w: Addr::of(w),
        saved: Addr::of_opt(saved_buf),
        dx: Addr::of_opt(dx),
        dw: Addr::of_opt(dw),
        db: Addr::of_opt(db),
    };
    match device {
        Device::Cpu => crate::cpu::linalg::linear_backward(&p),
        Device::Cuda(_) => {
            linear_int32(m, n, k)?;
            crate::cuda::linalg::linear_backward(dy.ctx.cuda_dev(), &p, stream)
        }
    }
}

// ------------------------------------------------------------------ Kronecker

fn kron_operand(buf: &Buffer, what: &str) -> Result<(i64, i64, i64, [i64; 3])> {
    let nd = check::rank_2_or_3(buf, what, "it must be [rows, cols] or [batch, rows, cols]")?;
    let (batch, bs) = batch_of(buf);
    Ok((
        batch,
        buf.shape[nd - 2],
        buf.shape[nd - 1],
        [bs, buf.strides[nd - 2], buf.strides[nd - 1]],
    ))
}

/// Batched Kronecker product `out = kron(a, b)`.
pub fn kron(a: &Buffer, b: &Buffer, out: &Buffer, stream: &Stream) -> Result<()> {
    let device = out.device();
    check::devices(device, &[(Some(a), "a"), (Some(b), "b")], stream)?;
    check::binary_dtypes(a, b, out, "out")?;
    let (ba, m, n, sa) = kron_operand(a, "a")?;
    let (bb, p, q, sb) = kron_operand(b, "b")?;
    let batch = if ba == 1 { bb } else { ba };
    crate::ensure!(
        ba == bb || ba == 1 || bb == 1,
        FK_ERROR_SHAPE_MISMATCH,
        "a has batch {ba} but b has batch {bb} (batches must match, or one be 1)"
    );
    let (mp, nq) = (
        m.checked_mul(p).unwrap_or(i64::MAX),
        n.checked_mul(q).unwrap_or(i64::MAX),
    );
    let want: Vec<i64> = if a.shape.len() == 3 || b.shape.len() == 3 {
        vec![batch, mp, nq]
    } else {
        vec![mp, nq]
    };
    crate::ensure!(
        out.shape == want,
        FK_ERROR_SHAPE_MISMATCH,
        "out has shape {:?} but kron(a {:?}, b {:?}) is {want:?}",
        out.shape,
        a.shape,
        b.shape
    );
    check::contiguous(out, "out")?;
    out.check_writable("out")?;
    check::disjoint(out, "out", &[(a, "a"), (b, "b")])?;
    if out.numel() == 0 {
        return Ok(());
    }
    let plan = KronPlan {
        dtype: a.dtype,
        batch,
        m,
        n,
        p,
        q,
        a: Addr::of(a),
        sa,
        b: Addr::of(b),
        sb,
        out: Addr::of(out),
    };
    match device {
        Device::Cpu => crate::cpu::linalg::kron(&plan),
        Device::Cuda(_) => crate::cuda::linalg::kron(out.ctx.cuda_dev(), &plan, stream),
    }
}
