//! The optimizer-math family (docs/ops.md section 4): validation, then dispatch.
//!
//! - `matrix_power`: `out = (A + eps I)^power` of symmetric PSD matrices, batched,
//!   by eigendecomposition or (inverse roots) the coupled Newton iteration.
//! - `shampoo_stats`: `L = beta L + alpha G G^T`, `R = beta R + alpha G^T G`.
//! - `shampoo_precondition`: `out = L_root G R_root`.
//! - `per_sample_grads`, `per_sample_grad_norms`, `dp_clipped_grad_sum`: the
//!   per-sample gradients `G_b = g_b^T a_b` of a linear layer, materialised, as
//!   squared norms without materialising, and as the DP-SGD clipped sum.
//!
//! Every op takes f32 or f64 (one dtype per call), contiguous buffers. The Newton
//! iteration is written once here (`newton`) over the `MatOps` a backend provides,
//! so the CPU (the oracle) and CUDA run the same algorithm.

use crate::addr::Addr;
use crate::buffer::Buffer;
use crate::context::Device;
use crate::dtype::DType;
use crate::error::{
    Error, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_NOT_CONVERGED, FK_ERROR_SHAPE_MISMATCH, Result,
};
use crate::ops::check;
use crate::ops::linalg::{gemm_flags, int32};
use crate::plan::linalg::{GemmPlan, Mat, Trans, dense};
use crate::plan::optim::{MatOps, Method, PowPlan, Report, SamplePlan, StatsPlan};
use crate::stream::Stream;

// ------------------------------------------------------------------ shared checks

fn real_dtype(b: &Buffer, what: &str) -> Result<()> {
    check::dtype_in(b, what, &[DType::F32, DType::F64], "the optimizer ops").map(|_| ())
}

fn output(b: &Buffer, what: &str) -> Result<()> {
    b.check_writable(what)?;
    check::contiguous(b, what)
}

/// `(batch, rows, cols)` of a `[rows, cols]` or `[batch, rows, cols]` buffer.
fn mat3(b: &Buffer, what: &str) -> Result<(i64, i64, i64)> {
    match b.shape.as_slice() {
        [r, c] => Ok((1, *r, *c)),
        [n, r, c] => Ok((*n, *r, *c)),
        s => crate::bail!(
            FK_ERROR_SHAPE_MISMATCH,
            "{what} has shape {s:?}; it must be [rows, cols] or [batch, rows, cols]"
        ),
    }
}

// ------------------------------------------------------------------ matrix power

/// The coupled Newton iteration for `(A + eps I)^(-1/p)` (Guo and Higham 2006):
/// `T = ((p+1) I - M) / p`, `X <- X T`, `M <- T^p M`, from `X = z^(1/p) I`,
/// `M = z (A + eps I)`, so that `M = X^p (A + eps I)` throughout and `X` tends to
/// the inverse root as `M` tends to `I`. Stops when every matrix has
/// `max |M - I| <= tol` (checked each iteration, which waits for the stream), when
/// the residual stops shrinking (the precision floor), or after `max_iter`
/// iterations; `tol <= 0` runs exactly `max_iter` iterations without checking.
///
/// With TF32 (f32 and `FK_GEMM_ALLOW_TF32`) every GEMM runs on tensor cores.
/// TF32 rounding (~5e-4 per product) breaks the invariant, so `M` stops telling how
/// accurate `X` is; the iteration runs until the residual of `M` stops shrinking
/// (the TF32 floor) and then the residual is measured
/// strictly on `X^p (A + eps I)` (p + 1 strict GEMMs) and that is what is reported
/// and compared with `tol`. Expect ~1e-3 relative error in `X` and residuals of
/// ~1e-2 (`p` times the error); further strict steps would not remove it (the
/// coupled iteration does not correct errors of `X` that do not commute with `A`).
pub fn newton(ops: &dyn MatOps, plan: &PowPlan) -> Result<Report> {
    let p = plan.inverse_root().ok_or_else(|| {
        Error::new(
            crate::error::FK_ERROR_INTERNAL,
            "the Newton iteration was dispatched for a power that is not an inverse root",
        )
    })?;
    let e = plan.elems() * plan.dtype.size();
    let (d, nb) = (plan.dtype, plan.batch);
    // X ping-pongs between `out` and x2, M between m1 and m2; t is the step matrix,
    // pw the two buffers of T's (or X's) powers; s = A + eps I for re-coupling.
    let fast = plan.allow_tf32 && d == DType::F32;
    let x2 = ops.scratch(e)?;
    let m1 = ops.scratch(e)?;
    let m2 = ops.scratch(e)?;
    let t = ops.scratch(e)?;
    let pw = if p > 1 {
        Some((ops.scratch(e)?, ops.scratch(e)?))
    } else {
        None
    };
    let s = if fast { Some(ops.scratch(e)?) } else { None };
    // dispatched for a non-empty plan only, so the output has memory
    let out = plan.out.ok_or_else(|| {
        Error::new(
            crate::error::FK_ERROR_INTERNAL,
            "the Newton iteration was dispatched for an empty output",
        )
    })?;
    let (mut x_cur, mut x_next) = (out, x2.addr);
    let (mut m_cur, mut m_next) = (m1.addr, m2.addr);
    ops.newton_start(plan, p, x_cur, m_cur)?;
    if let Some(s) = &s {
        ops.shifted(plan, s.addr)?;
    }
    let mm = |a: Addr, b: Addr, c: Addr, tf32: bool| {
        ops.gemm(&GemmPlan::new(
            d,
            Trans::N,
            plan.mat(a),
            Trans::N,
            plan.mat(b),
            plan.mat(c),
            1.0,
            0.0,
            nb,
            tf32,
        ))
    };
    // `x^p` into one of the pw buffers (or `x` itself for p = 1).
    let power = |x: Addr, tf32: bool| -> Result<Addr> {
        match &pw {
            None => Ok(x),
            Some((a, b)) => power_of(&|u, v, w| mm(u, v, w, tf32), x, p, a.addr, b.addr),
        }
    };
    let check = plan.tol > 0.0;
    let worst_of = |m: Addr| -> Result<f64> {
        let r = ops.residuals(plan, m)?;
        Ok(r.iter().fold(0.0f64, |acc, &v| {
            if v.is_nan() || acc.is_nan() {
                f64::NAN
            } else {
                acc.max(v)
            }
        }))
    };
    let mut report = Report {
        method: Method::Newton,
        iterations: 0,
        converged: !check,
        residual: f64::NAN,
        min_eigenvalue: f64::NAN,
    };
    let mut last = f64::INFINITY;
    let mut stalled = 0;
    let mut it = 0;
    while it < plan.max_iter {
        ops.newton_step_matrix(plan, p, m_cur, t.addr)?;
        mm(x_cur, t.addr, x_next, fast)?;
        std::mem::swap(&mut x_cur, &mut x_next);
        let tp = power(t.addr, fast)?;
        mm(tp, m_cur, m_next, fast)?;
        std::mem::swap(&mut m_cur, &mut m_next);
        it += 1;
        report.iterations = it;
        if !check {
            continue;
        }
        let mut worst = worst_of(m_cur)?;
        // Quadratic convergence ends at the precision floor: once the residual is
        // small and fails to halve twice in a row, further steps only add rounding.
        let stall = worst < 1e-2 && worst > 0.5 * last && {
            stalled += 1;
            stalled >= 2
        };
        if worst >= 1e-2 || worst <= 0.5 * last {
            stalled = 0;
        }
        // TF32 iterates to its floor (tol is judged on the strict residual after).
        let stop =
            (!fast && worst <= plan.tol) || !worst.is_finite() || stall || it == plan.max_iter;
        // (s, A + eps I, is there exactly when fast)
        if let (Some(s), true) = (&s, stop && worst.is_finite()) {
            // the strict residual of X: max |X^p (A + eps I) - I|
            let xp = power(x_cur, false)?;
            mm(xp, s.addr, m_cur, false)?;
            worst = worst_of(m_cur)?;
            report.residual = worst;
            report.converged = worst <= plan.tol;
            break;
        }
        report.residual = worst;
        if worst <= plan.tol && !fast {
            report.converged = true;
            break;
        }
        if stop {
            break;
        }
        last = worst;
    }
    if x_cur != out {
        ops.copy(out, x_cur, e)?;
    }
    Ok(report)
}

/// `T^p` into one of `a`/`b` (returned), by binary powering; `p >= 2`; `t` is
/// only read.
fn power_of(
    mm: &dyn Fn(Addr, Addr, Addr) -> Result<()>,
    t: Addr,
    p: u32,
    a: Addr,
    b: Addr,
) -> Result<Addr> {
    // Left to right over the bits of p below the top one: square, then multiply by
    // T on a 1 bit; each product goes to the buffer the accumulator is not in.
    let other = |acc: Addr| if acc == a { b } else { a };
    let mut acc = t;
    for i in (0..31 - p.leading_zeros()).rev() {
        let dst = other(acc);
        mm(acc, acc, dst)?;
        acc = dst;
        if (p >> i) & 1 == 1 {
            let dst = other(acc);
            mm(acc, t, dst)?;
            acc = dst;
        }
    }
    Ok(acc)
}

/// The method `Auto` runs on `device`: Newton for inverse roots of matrices larger
/// than 32 on CUDA (tensor-core GEMMs beat cuSOLVER there; at n <= 32 the batched
/// Jacobi solver wins), the eigendecomposition otherwise (on the CPU it is exact and
/// no slower).
pub fn auto_method(plan: &PowPlan, device: Device) -> Method {
    match device {
        Device::Cuda(_) if plan.inverse_root().is_some() && plan.n > 32 => Method::Newton,
        _ => Method::Eigh,
    }
}

/// `out = (A + eps I)^power` (see `fk_matrix_power`); `on_report` sees the report
/// before a non-convergence is returned as an error.
#[allow(clippy::too_many_arguments)]
pub fn matrix_power(
    a: &Buffer,
    power: f64,
    eps: f64,
    method: Method,
    max_iter: i32,
    tol: f64,
    flags: u32,
    out: &Buffer,
    stream: &Stream,
    on_report: &dyn Fn(&Report),
) -> Result<Report> {
    let device = out.device();
    check::devices(device, &[(Some(a), "a")], stream)?;
    let allow_tf32 = gemm_flags(flags)?;
    real_dtype(a, "a")?;
    check::same_dtypes(&[(a, "a"), (out, "out")])?;
    let (batch, n, n2) = mat3(a, "a")?;
    crate::ensure!(
        n == n2,
        FK_ERROR_SHAPE_MISMATCH,
        "a has shape {:?}; the matrices must be square",
        a.shape
    );
    crate::ensure!(
        out.shape == a.shape,
        FK_ERROR_SHAPE_MISMATCH,
        "out has shape {:?} but a has {:?}: they must match",
        out.shape,
        a.shape
    );
    check::contiguous(a, "a")?;
    output(out, "out")?;
    check::disjoint(out, "out", &[(a, "a")])?;
    crate::ensure!(
        power.is_finite(),
        FK_ERROR_INVALID_ARGUMENT,
        "power = {power} must be finite"
    );
    check::finite_nonneg(eps, "eps")?;
    crate::ensure!(
        !tol.is_nan(),
        FK_ERROR_INVALID_ARGUMENT,
        "tol is NaN; give a tolerance (> 0), or <= 0 to run max_iter iterations unchecked"
    );
    let plan = PowPlan {
        dtype: a.dtype,
        batch,
        n,
        a: Addr::of(a),
        out: Addr::of(out),
        power,
        eps,
        max_iter,
        tol,
        allow_tf32,
    };
    let root = plan.inverse_root();
    if method != Method::Eigh {
        crate::ensure!(
            max_iter >= 1,
            FK_ERROR_INVALID_ARGUMENT,
            "max_iter = {max_iter} must be >= 1 for the Newton iteration"
        );
    }
    if method == Method::Newton {
        crate::ensure!(
            root.is_some(),
            FK_ERROR_INVALID_ARGUMENT,
            "power = {power}: the Newton method computes inverse roots only (power = -1/p for an integer 1 <= p <= 64); use FK_MATPOW_EIGH or FK_MATPOW_AUTO"
        );
    }
    if plan.elems() == 0 {
        let r = Report {
            method: if method == Method::Auto {
                Method::Eigh
            } else {
                method
            },
            iterations: 0,
            converged: true,
            residual: f64::NAN,
            min_eigenvalue: f64::NAN,
        };
        on_report(&r);
        return Ok(r);
    }
    if let Device::Cuda(_) = device {
        int32(plan.n, "n")?;
        int32(plan.batch, "batch")?;
        // Under stream capture only the asynchronous Newton iteration (tol <= 0:
        // exactly max_iter iterations, nothing read back) can be recorded; refuse
        // the rest before anything is queued, so the capture stays valid.
        let resolved = match method {
            Method::Auto => auto_method(&plan, device),
            m => m,
        };
        let why = match resolved {
            Method::Newton if plan.tol > 0.0 => Some(
                "with tol > 0 the Newton iteration reads its residual on the host every iteration; pass tol <= 0 to run exactly max_iter iterations asynchronously (capturable)",
            ),
            Method::Newton => None,
            _ => Some(
                "the eigendecomposition (FK_MATPOW_EIGH, or FK_MATPOW_AUTO choosing it for this power and size) waits for the stream to read cuSOLVER's convergence flags and eigenvalues on the host; use FK_MATPOW_NEWTON with tol <= 0 for inverse roots",
            ),
        };
        if let Some(why) = why {
            out.ctx
                .cuda_dev()
                .refuse_capture(stream.raw, "fk_matrix_power", why)?;
        }
    }
    let run = |m: Method| -> Result<Report> {
        match (m, device) {
            (Method::Newton, Device::Cpu) => newton(&crate::cpu::optim::Ops, &plan),
            (Method::Newton, Device::Cuda(_)) => newton(
                &crate::cuda::optim::Ops::new(out.ctx.cuda_dev(), stream)?,
                &plan,
            ),
            (_, Device::Cpu) => crate::cpu::optim::eigh_power(&plan),
            (_, Device::Cuda(_)) => {
                crate::cuda::optim::eigh_power(out.ctx.cuda_dev(), &plan, stream)
            }
        }
    };
    let report = match method {
        Method::Auto => {
            let chosen = auto_method(&plan, device);
            let r = run(chosen)?;
            // Auto never returns an unconverged Newton result: it falls back to the
            // eigendecomposition.
            if chosen == Method::Newton && !r.converged {
                run(Method::Eigh)?
            } else {
                r
            }
        }
        m => run(m)?,
    };
    on_report(&report);
    crate::ensure!(
        report.converged,
        FK_ERROR_NOT_CONVERGED,
        "{} did not converge (iterations {}, residual max|M - I| = {:e}, tol {:e}); out holds the last iterate",
        if report.method == Method::Newton {
            "the Newton iteration"
        } else {
            "the eigendecomposition"
        },
        report.iterations,
        report.residual,
        plan.tol
    );
    Ok(report)
}

// ------------------------------------------------------------------ Shampoo

/// Validates and runs `shampoo_stats`.
pub fn shampoo_stats(
    grad: &Buffer,
    alpha: f64,
    beta: f64,
    l: Option<&Buffer>,
    r: Option<&Buffer>,
    flags: u32,
    stream: &Stream,
) -> Result<()> {
    let device = grad.device();
    check::devices(device, &[(l, "l"), (r, "r")], stream)?;
    crate::ensure!(
        l.is_some() || r.is_some(),
        crate::error::FK_ERROR_NULL_POINTER,
        "l and r are both NULL; pass at least one statistic to update"
    );
    let allow_tf32 = gemm_flags(flags)?;
    real_dtype(grad, "grad")?;
    let (batch, m, n) = mat3(grad, "grad")?;
    check::contiguous(grad, "grad")?;
    for (v, what) in [(alpha, "alpha"), (beta, "beta")] {
        crate::ensure!(
            v.is_finite(),
            FK_ERROR_INVALID_ARGUMENT,
            "{what} = {v} must be finite"
        );
    }
    let lead = if grad.shape.len() == 3 {
        vec![batch]
    } else {
        vec![]
    };
    for (o, name, k) in [(l, "l", m), (r, "r", n)] {
        let Some(o) = o else { continue };
        check::same_dtypes(&[(grad, "grad"), (o, name)])?;
        let mut want = lead.clone();
        want.extend([k, k]);
        crate::ensure!(
            o.shape == want,
            FK_ERROR_SHAPE_MISMATCH,
            "{name} has shape {:?} but grad {:?} needs {want:?}",
            o.shape,
            grad.shape
        );
        output(o, name)?;
        check::disjoint(o, name, &[(grad, "grad")])?;
    }
    if let (Some(lb), Some(rb)) = (l, r) {
        check::disjoint(lb, "l", &[(rb, "r")])?;
    }
    let p = StatsPlan {
        dtype: grad.dtype,
        batch,
        m,
        n,
        grad: Addr::of(grad),
        l: Addr::of_opt(l),
        r: Addr::of_opt(r),
        alpha,
        beta,
        allow_tf32,
    };
    if batch == 0 {
        return Ok(());
    }
    // m or n = 0 is a product over nothing: the statistics only decay (C = beta C).
    match device {
        Device::Cpu => crate::cpu::optim::shampoo_stats(&p),
        Device::Cuda(_) => {
            for (v, what) in [(m, "m"), (n, "n"), (batch, "batch")] {
                int32(v, what)?;
            }
            crate::cuda::optim::shampoo_stats(grad.ctx.cuda_dev(), &p, stream)
        }
    }
}

/// `out = L_root G R_root` (a NULL root is the identity), batched.
pub fn shampoo_precondition(
    l_root: Option<&Buffer>,
    grad: &Buffer,
    r_root: Option<&Buffer>,
    out: &Buffer,
    flags: u32,
    stream: &Stream,
) -> Result<()> {
    let device = out.device();
    check::devices(
        device,
        &[(Some(grad), "grad"), (l_root, "l_root"), (r_root, "r_root")],
        stream,
    )?;
    let tf32 = gemm_flags(flags)?;
    real_dtype(grad, "grad")?;
    check::same_dtypes(&[(grad, "grad"), (out, "out")])?;
    let (batch, m, n) = mat3(grad, "grad")?;
    check::contiguous(grad, "grad")?;
    crate::ensure!(
        out.shape == grad.shape,
        FK_ERROR_SHAPE_MISMATCH,
        "out has shape {:?} but grad has {:?}: they must match",
        out.shape,
        grad.shape
    );
    output(out, "out")?;
    check::disjoint(out, "out", &[(grad, "grad")])?;
    let mut roots = [None, None];
    for (i, (o, name, k)) in [(l_root, "l_root", m), (r_root, "r_root", n)]
        .into_iter()
        .enumerate()
    {
        let Some(o) = o else { continue };
        check::same_dtypes(&[(grad, "grad"), (o, name)])?;
        let (bo, r1, r2) = mat3(o, name)?;
        crate::ensure!(
            r1 == k && r2 == k && (bo == 1 || bo == batch),
            FK_ERROR_SHAPE_MISMATCH,
            "{name} has shape {:?} but grad {:?} needs [{k}, {k}] or [{batch}, {k}, {k}]",
            o.shape,
            grad.shape
        );
        check::contiguous(o, name)?;
        check::disjoint(out, "out", &[(o, name)])?;
        roots[i] = Some(dense(Addr::of(o), k, k, if bo == 1 { 0 } else { k * k }));
    }
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    if let Device::Cuda(_) = device {
        for (v, what) in [(m, "m"), (n, "n"), (batch, "batch")] {
            int32(v, what)?;
        }
    }
    let d = grad.dtype;
    let g = dense(Addr::of(grad), m, n, m * n);
    let o = dense(Addr::of(out), m, n, m * n);
    let ops: Box<dyn MatOps> = match device {
        Device::Cpu => Box::new(crate::cpu::optim::Ops),
        Device::Cuda(_) => Box::new(crate::cuda::optim::Ops::new(out.ctx.cuda_dev(), stream)?),
    };
    let plan = |a: Mat, b: Mat, c: Mat| {
        GemmPlan::new(d, Trans::N, a, Trans::N, b, c, 1.0, 0.0, batch, tf32)
    };
    match roots {
        [None, None] => match (Addr::of(out), Addr::of(grad)) {
            (Some(o), Some(g)) => ops.copy(o, g, out.nbytes()),
            _ => Ok(()),
        },
        [Some(l), None] => ops.gemm(&plan(l, g, o)),
        [None, Some(r)] => ops.gemm(&plan(g, r, o)),
        [Some(l), Some(r)] => {
            // tmp = G R, then out = L tmp: the same FLOPs either way round.
            let tmp = ops.scratch(out.nbytes())?;
            let t = dense(Some(tmp.addr), m, n, m * n);
            ops.gemm(&plan(g, r, t))?;
            ops.gemm(&plan(l, t, o))
        }
    }
}

// ------------------------------------------------------------------ per-sample gradients

fn sample_plan(
    a: &Buffer,
    g: &Buffer,
    flags: u32,
    stream: &Stream,
    device: Device,
) -> Result<SamplePlan> {
    check::devices(device, &[(Some(a), "a"), (Some(g), "g")], stream)?;
    let allow_tf32 = gemm_flags(flags)?;
    real_dtype(a, "a")?;
    check::same_dtypes(&[(a, "a"), (g, "g")])?;
    let nd = check::rank_2_or_3(a, "a", "it must be [B, in] or [B, T, in]")?;
    crate::ensure!(
        g.shape.len() == nd && g.shape[..nd - 1] == a.shape[..nd - 1],
        FK_ERROR_SHAPE_MISMATCH,
        "g has shape {:?} but a has {:?}: g must be [{}out]",
        g.shape,
        a.shape,
        a.shape[..nd - 1]
            .iter()
            .map(|v| format!("{v}, "))
            .collect::<String>()
    );
    check::contiguous(a, "a")?;
    check::contiguous(g, "g")?;
    let p = SamplePlan {
        dtype: a.dtype,
        batch: a.shape[0],
        steps: if nd == 3 { a.shape[1] } else { 1 },
        din: a.shape[nd - 1],
        dout: g.shape[nd - 1],
        a: Addr::of(a),
        g: Addr::of(g),
        allow_tf32,
    };
    if let Device::Cuda(_) = device {
        for (v, what) in [
            (p.batch, "B"),
            (p.steps, "T"),
            (p.din, "in"),
            (p.dout, "out"),
            (p.batch * p.steps, "B*T"),
        ] {
            int32(v, what)?;
        }
    }
    Ok(p)
}

/// `out[b] = g_b^T a_b` `[B, out, in]`.
pub fn per_sample_grads(
    a: &Buffer,
    g: &Buffer,
    out: &Buffer,
    flags: u32,
    stream: &Stream,
) -> Result<()> {
    let device = out.device();
    let p = sample_plan(a, g, flags, stream, device)?;
    check::same_dtypes(&[(a, "a"), (out, "out")])?;
    let want = [p.batch, p.dout, p.din];
    crate::ensure!(
        out.shape == want,
        FK_ERROR_SHAPE_MISMATCH,
        "out has shape {:?} but a {:?} and g {:?} give per-sample gradients {want:?}",
        out.shape,
        a.shape,
        g.shape
    );
    output(out, "out")?;
    check::disjoint(out, "out", &[(a, "a"), (g, "g")])?;
    if out.numel() == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => crate::cpu::optim::per_sample_grads(&p, Addr::of(out)),
        Device::Cuda(_) => {
            crate::cuda::optim::per_sample_grads(out.ctx.cuda_dev(), &p, Addr::of(out), stream)
        }
    }
}

fn norms_out(n: &Buffer, p: &SamplePlan, a: &Buffer, what: &str) -> Result<()> {
    check::same_dtypes(&[(a, "a"), (n, what)])?;
    crate::ensure!(
        n.shape.as_slice() == [p.batch],
        FK_ERROR_SHAPE_MISMATCH,
        "{what} has shape {:?} but a has batch {}: it must be [{}]",
        n.shape,
        p.batch,
        p.batch
    );
    output(n, what)
}

/// `sq_norms[b] = |g_b^T a_b|_F^2` without materialising the gradients.
pub fn per_sample_grad_norms(
    a: &Buffer,
    g: &Buffer,
    sq_norms: &Buffer,
    stream: &Stream,
) -> Result<()> {
    let device = sq_norms.device();
    let p = sample_plan(a, g, 0, stream, device)?;
    norms_out(sq_norms, &p, a, "sq_norms")?;
    check::disjoint(sq_norms, "sq_norms", &[(a, "a"), (g, "g")])?;
    if p.batch == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => crate::cpu::optim::sample_norms(&p, Addr::of(sq_norms)),
        Device::Cuda(_) => crate::cuda::optim::sample_norms(
            sq_norms.ctx.cuda_dev(),
            &p,
            Addr::of(sq_norms),
            stream,
        ),
    }
}

/// `out = sum_b min(1, max_norm / |G_b|) G_b` `[out, in]`, optionally the squared
/// norms.
pub fn dp_clipped_grad_sum(
    a: &Buffer,
    g: &Buffer,
    max_norm: f64,
    out: &Buffer,
    sq_norms: Option<&Buffer>,
    flags: u32,
    stream: &Stream,
) -> Result<()> {
    let device = out.device();
    let p = sample_plan(a, g, flags, stream, device)?;
    check::finite_nonneg(max_norm, "max_norm")?;
    check::same_dtypes(&[(a, "a"), (out, "out")])?;
    crate::ensure!(
        out.shape.as_slice() == [p.dout, p.din],
        FK_ERROR_SHAPE_MISMATCH,
        "out has shape {:?} but the layer's gradient is [{}, {}] (g {:?}, a {:?})",
        out.shape,
        p.dout,
        p.din,
        g.shape,
        a.shape
    );
    output(out, "out")?;
    check::disjoint(out, "out", &[(a, "a"), (g, "g")])?;
    if let Some(nb) = sq_norms {
        check::devices(device, &[(Some(nb), "sq_norms")], stream)?;
        norms_out(nb, &p, a, "sq_norms")?;
        check::disjoint(nb, "sq_norms", &[(a, "a"), (g, "g"), (out, "out")])?;
    }
    if out.numel() == 0 {
        return Ok(());
    }
    // the norms' address (None: not wanted, or none to write: an empty batch)
    let norms = Addr::of_opt(sq_norms);
    match device {
        Device::Cpu => crate::cpu::optim::dp_clipped_sum(&p, max_norm, Addr::of(out), norms),
        Device::Cuda(_) => crate::cuda::optim::dp_clipped_sum(
            out.ctx.cuda_dev(),
            &p,
            max_norm,
            Addr::of(out),
            norms,
            stream,
        ),
    }
}
