//! Shared by `abi_geodesic` and `gpu_geodesic`: random problems, an f64 reference
//! written here from the formulas of docs/ops.md section 5 (independently of the
//! library), the four ops' arguments as plain structs (`ChrFwd`, `ChrBwd`, `LfFwd`,
//! `LfBwd`: a valid call built from a problem's buffers, any argument replaced by
//! struct update, `Call` for tables of bad inputs), and runs of the ops with every
//! output poisoned with NaN.

#![allow(dead_code, non_snake_case)]

use std::ptr::{null, null_mut};

use crate::common::*;
pub use fusekit::abi::geodesic::*;

/// The dtypes the geodesic ops support.
pub const REAL_DTYPES: [fk_dtype; 2] = [FK_DTYPE_F32, FK_DTYPE_F64];

/// The Christoffel backward's gradients, in argument order.
pub const CHR_GRADS: [&str; 3] = ["dv", "dU", "dW"];
/// The leapfrog backward's gradients, in argument order.
pub const LF_GRADS: [&str; 5] = ["dx0", "dv0", "df", "dU", "dW"];

// ------------------------------------------------------------------ problems

/// One problem: sizes, inputs, incoming gradients (`g` of the Christoffel backward,
/// `gx`, `gv` of the leapfrog backward; `None`: not given), scalars.
#[derive(Clone)]
#[rustfmt::skip]
pub struct Prob {
    // sizes
    pub b: usize, pub d: usize, pub r: usize, pub t: usize,
    // inputs
    pub x: Vec<f64>, pub v: Vec<f64>, pub f: Option<Vec<f64>>,
    pub u: Vec<f64>, pub w: Vec<f64>, pub mu: Option<Vec<f64>>,
    // incoming gradients
    pub g: Option<Vec<f64>>, pub gx: Option<Vec<f64>>, pub gv: Option<Vec<f64>>,
    // scalars
    pub c: f64, pub dt: f64,
}

impl Prob {
    /// Inputs of magnitude O(1) (x, v in [-1, 1], f in [-0.5, 0.5], U, W in
    /// [-0.7, 0.7], mu in [0, 0.5]), no incoming gradients, `c = +inf`, `dt = 0.1`.
    pub fn random(
        rng: &mut Rng,
        b: usize,
        d: usize,
        r: usize,
        t: usize,
        with_f: bool,
        with_mu: bool,
    ) -> Prob {
        Prob {
            b,
            d,
            r,
            t,
            x: rng.uniform_vec(b * d, -1.0, 1.0),
            v: rng.uniform_vec(b * d, -1.0, 1.0),
            f: with_f.then(|| rng.uniform_vec(b * d, -0.5, 0.5)),
            u: rng.uniform_vec(d * r, -0.7, 0.7),
            w: rng.uniform_vec(d * r, -0.7, 0.7),
            mu: with_mu.then(|| rng.uniform_vec(d, 0.0, 0.5)),
            g: None,
            gx: None,
            gv: None,
            c: f64::INFINITY,
            dt: 0.1,
        }
    }

    /// Values scaled so that |gamma_raw| is O(1) whatever D and R, and the clamp
    /// (at `c`) cuts a good fraction of the entries; `g` and `gv` always, `f`, `mu`
    /// and `gx` when `opt`.
    pub fn scaled(
        rng: &mut Rng,
        b: usize,
        d: usize,
        r: usize,
        t: usize,
        opt: bool,
        c: f64,
    ) -> Prob {
        let su = 1.0 / (d as f64).sqrt().max(1.0);
        let sw = 1.0 / (r as f64).max(1.0);
        Prob {
            b,
            d,
            r,
            t,
            x: rng.uniform_vec(b * d, -1.0, 1.0),
            v: rng.uniform_vec(b * d, -1.5, 1.5),
            f: opt.then(|| rng.uniform_vec(b * d, -0.5, 0.5)),
            u: rng.uniform_vec(d * r, -2.0 * su, 2.0 * su),
            w: rng.uniform_vec(d * r, -2.0 * sw, 2.0 * sw),
            mu: opt.then(|| rng.uniform_vec(d, 0.0, 0.5)),
            g: Some(rng.uniform_vec(b * d, -1.0, 1.0)),
            gx: opt.then(|| rng.uniform_vec(b * d, -1.0, 1.0)),
            gv: Some(rng.uniform_vec(b * d, -1.0, 1.0)),
            c,
            dt: 0.1,
        }
    }

    /// Every input and `g`, `gv` equal to `value` (no f, mu, gx), `c = 5`, `dt = 0.1`:
    /// the valid call that the bad-input tests break one argument of.
    pub fn filled(b: usize, d: usize, r: usize, t: usize, value: f64) -> Prob {
        let bd = vec![value; b * d];
        let dr = vec![value; d * r];
        Prob {
            b,
            d,
            r,
            t,
            x: bd.clone(),
            v: bd.clone(),
            f: None,
            u: dr.clone(),
            w: dr,
            mu: None,
            g: Some(bd.clone()),
            gx: None,
            gv: Some(bd),
            c: 5.0,
            dt: 0.1,
        }
    }

    /// Every value rounded to what `dtype` holds (the inputs the library sees).
    pub fn rounded(&self, dtype: fk_dtype) -> Prob {
        let q = |v: &Vec<f64>| quantize_reals(dtype, v);
        Prob {
            x: q(&self.x),
            v: q(&self.v),
            f: self.f.as_ref().map(q),
            u: q(&self.u),
            w: q(&self.w),
            mu: self.mu.as_ref().map(q),
            g: self.g.as_ref().map(q),
            gx: self.gx.as_ref().map(q),
            gv: self.gv.as_ref().map(q),
            ..self.clone()
        }
    }

    /// The input that gradient `grad` (a name of `CHR_GRADS` or `LF_GRADS`) is taken
    /// with respect to.
    pub fn wrt(&mut self, grad: &str) -> &mut Vec<f64> {
        match grad {
            "dx0" => &mut self.x,
            "dv" | "dv0" => &mut self.v,
            "df" => self.f.as_mut().expect("df needs f"),
            "dU" => &mut self.u,
            "dW" => &mut self.w,
            _ => panic!("no gradient named {grad}"),
        }
    }
}

// ------------------------------------------------------------------ reference (f64, from docs/ops.md section 5)

/// Statistics of the clamp over every evaluation: the smallest distance between
/// |gamma_raw| and c, and how many entries were clamped out of how many.
#[derive(Default, Debug)]
pub struct ClampStats {
    pub margin: f64,
    pub clamped: usize,
    pub total: usize,
}

/// `(gamma, gamma_raw, p)` of one row.
pub fn ref_gamma_row(
    v: &[f64],
    u: &[f64],
    w: &[f64],
    d: usize,
    r: usize,
    c: f64,
    st: &mut ClampStats,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut p = vec![0.0; r];
    for k in 0..r {
        for i in 0..d {
            p[k] += v[i] * u[i * r + k];
        }
    }
    let mut raw = vec![0.0; d];
    for i in 0..d {
        for k in 0..r {
            raw[i] += p[k] * p[k] * w[i * r + k];
        }
    }
    let gamma = raw
        .iter()
        .map(|&x| {
            st.total += 1;
            st.margin = st.margin.min((x.abs() - c).abs());
            if x.abs() > c {
                st.clamped += 1;
            }
            x.max(-c).min(c)
        })
        .collect();
    (gamma, raw, p)
}

/// `gamma_raw` of row `i` of `v`.
pub fn ref_gamma_raw(p: &Prob, v: &[f64], i: usize) -> Vec<f64> {
    let row = &v[i * p.d..(i + 1) * p.d];
    ref_gamma_row(row, &p.u, &p.w, p.d, p.r, p.c, &mut ClampStats::default()).1
}

fn ref_gamma_row_all(p: &Prob, v: &[f64]) -> Vec<f64> {
    let mut st = ClampStats::default();
    let q = Prob {
        c: f64::INFINITY,
        ..p.clone()
    };
    ref_gamma(&q, v, &mut st).iter().map(|x| x.abs()).collect()
}

pub fn ref_gamma(p: &Prob, v: &[f64], st: &mut ClampStats) -> Vec<f64> {
    let mut out = Vec::with_capacity(p.b * p.d);
    for i in 0..p.b {
        out.extend(ref_gamma_row(&v[i * p.d..(i + 1) * p.d], &p.u, &p.w, p.d, p.r, p.c, st).0);
    }
    out
}

/// The Christoffel backward from its formulas, `[dv, dU, dW]`, for the incoming
/// gradient `p.g`.
pub fn ref_christoffel_backward(p: &Prob) -> [Vec<f64>; 3] {
    let g = p.g.as_ref().expect("the Christoffel backward needs g");
    let (d, r) = (p.d, p.r);
    let mut dv = vec![0.0; p.b * d];
    let mut du = vec![0.0; d * r];
    let mut dw = vec![0.0; d * r];
    for i in 0..p.b {
        let v = &p.v[i * d..(i + 1) * d];
        let (_, raw, pp) = ref_gamma_row(v, &p.u, &p.w, d, r, p.c, &mut ClampStats::default());
        let gp: Vec<f64> = (0..d)
            .map(|k| {
                if -p.c <= raw[k] && raw[k] <= p.c {
                    g[i * d + k]
                } else {
                    0.0
                }
            })
            .collect();
        let mut dp = vec![0.0; r];
        for k in 0..r {
            let mut q = 0.0;
            for j in 0..d {
                q += gp[j] * p.w[j * r + k];
            }
            dp[k] = 2.0 * pp[k] * q;
        }
        for j in 0..d {
            for k in 0..r {
                dv[i * d + j] += dp[k] * p.u[j * r + k];
                dw[j * r + k] += gp[j] * pp[k] * pp[k];
                du[j * r + k] += v[j] * dp[k];
            }
        }
    }
    [dv, du, dw]
}

/// The leapfrog forward: `(x_T, v_T, traj [T][2][B][D])`.
pub fn ref_leapfrog(p: &Prob, st: &mut ClampStats) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (b, d) = (p.b, p.d);
    let h = 0.5 * p.dt;
    let mut x = p.x.clone();
    let mut v = p.v.clone();
    let zero = vec![0.0; b * d];
    let f = p.f.as_ref().unwrap_or(&zero);
    let zmu = vec![0.0; d];
    let mu = p.mu.as_ref().unwrap_or(&zmu);
    let mut traj = Vec::new();
    for _ in 0..p.t {
        let g0 = ref_gamma(p, &v, st);
        let vh: Vec<f64> = (0..b * d)
            .map(|k| v[k] + h * (f[k] - g0[k] - mu[k % d] * v[k]))
            .collect();
        for k in 0..b * d {
            x[k] += p.dt * vh[k];
        }
        let g1 = ref_gamma(p, &vh, st);
        v = (0..b * d)
            .map(|k| vh[k] + h * (f[k] - g1[k] - mu[k % d] * vh[k]))
            .collect();
        traj.extend_from_slice(&x);
        traj.extend_from_slice(&v);
    }
    (x, v, traj)
}

/// Picks a clamp bound with some entries clamped, some not, and every |gamma_raw|
/// at least `margin` away from it over the whole run (finite differences stay on
/// one side of every kink).
pub fn pick_c(p: &mut Prob, margin: f64) {
    // Christoffel-only problems (t = 0) evaluate Gamma at v only.
    let run = |p: &Prob, st: &mut ClampStats| {
        if p.t == 0 {
            ref_gamma(p, &p.v, st);
        } else {
            ref_leapfrog(p, st);
        }
    };
    // candidates: midpoints between the |gamma_raw| values of the unclamped run
    p.c = f64::INFINITY;
    let mut all = Vec::new();
    let mut v = p.v.clone();
    for _ in 0..p.t.max(1) {
        let mut st = ClampStats::default();
        if p.t == 0 {
            all.extend(ref_gamma_row_all(p, &v));
            break;
        }
        for i in 0..p.b {
            all.extend(ref_gamma_raw(p, &v, i).iter().map(|x| x.abs()));
        }
        v = ref_leapfrog(
            &Prob {
                t: 1,
                x: vec![0.0; p.b * p.d],
                v: v.clone(),
                ..p.clone()
            },
            &mut st,
        )
        .1;
    }
    all.sort_by(f64::total_cmp);
    let mut cands: Vec<f64> = all.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect();
    // prefer the middle of the distribution
    let mid = cands.len() / 2;
    cands.sort_by_key(|&c| {
        let i = all.partition_point(|&x| x < c);
        (i as i64 - mid as i64).abs()
    });
    cands.push(0.5 * all[0]);
    cands.push(2.0 * all[all.len() - 1] + 1.0);
    for mixed in [true, false] {
        for &c in &cands {
            p.c = c;
            let mut st = ClampStats {
                margin: f64::INFINITY,
                ..Default::default()
            };
            run(p, &mut st);
            if st.margin > margin && (!mixed || (st.clamped > 0 && st.clamped < st.total)) {
                return;
            }
        }
    }
    panic!("no clamp bound with a margin of {margin}");
}

// ------------------------------------------------------------------ the entry points' arguments

/// An input handle (NULL-able), an output handle, a stream.
type In = *const fk_buffer;
type Out = *mut fk_buffer;
type On = *const fk_stream;

/// A call of one entry point (a row of a bad-input table).
pub trait Entry {
    fn status(&self) -> fk_status;
}

/// `$name`: a struct of `$f`'s parameters (named as in the C header, lower case)
/// and `call`, which passes them. Every handle a test puts into one is NULL, a live
/// buffer or stream, or a live handle of another kind (which the entry points refuse
/// by its magic word), as the entry points require.
macro_rules! entry_point {
    ($(#[$doc:meta])* $name:ident = $f:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name {
            $(pub $arg: $ty),*
        }
        impl $name {
            pub fn call(self) -> fk_status {
                unsafe { $f($(self.$arg),*) }
            }
        }
        impl Entry for $name {
            fn status(&self) -> fk_status {
                self.call()
            }
        }
    };
}

entry_point! {
    /// The arguments of `fk_christoffel_forward`.
    ChrFwd = fk_christoffel_forward(v: In, u: In, w: In, c: f64, flags: u32, gamma: Out, stream: On)
}
entry_point! {
    /// The arguments of `fk_christoffel_backward`.
    ChrBwd = fk_christoffel_backward(v: In, u: In, w: In, g: In, c: f64, flags: u32,
        dv: Out, du: Out, dw: Out, stream: On)
}
entry_point! {
    /// The arguments of `fk_leapfrog_forward`.
    LfFwd = fk_leapfrog_forward(x: In, v: In, f: In, u: In, w: In, mu: In, dt: f64, steps: i64,
        c: f64, flags: u32, x_out: Out, v_out: Out, traj: Out, stream: On)
}
entry_point! {
    /// The arguments of `fk_leapfrog_backward`.
    LfBwd = fk_leapfrog_backward(v: In, f: In, u: In, w: In, mu: In, dt: f64, steps: i64, c: f64,
        flags: u32, traj: In, gx: In, gv: In, dx0: Out, dv0: Out, df: Out, du: Out, dw: Out,
        stream: On)
}

/// Makes every call of `cases` in order and asserts its status and that the last
/// error message holds every one of its message parts (`FK_OK` rows: the call succeeds).
#[track_caller]
pub fn expect_statuses(cases: &[(&dyn Entry, fk_status, &[&str])]) {
    for (call, status, parts) in cases {
        expect_status(call.status(), *status, parts);
    }
}

// ------------------------------------------------------------------ a problem on a context

/// A problem's inputs (and incoming gradients) as buffers of one context.
#[rustfmt::skip]
pub struct Inputs<'a> {
    pub ctx: &'a Ctx, pub dtype: fk_dtype, pub p: &'a Prob,
    pub x: Buf, pub v: Buf, pub f: Option<Buf>, pub u: Buf, pub w: Buf, pub mu: Option<Buf>,
    pub g: Option<Buf>, pub gx: Option<Buf>, pub gv: Option<Buf>,
}

impl<'a> Inputs<'a> {
    pub fn new(ctx: &'a Ctx, dtype: fk_dtype, p: &'a Prob) -> Inputs<'a> {
        let (b, d, r) = (p.b as i64, p.d as i64, p.r as i64);
        let bd = |v: &Vec<f64>| Buf::from_reals(ctx, dtype, &[b, d], v);
        Inputs {
            ctx,
            dtype,
            p,
            x: bd(&p.x),
            v: bd(&p.v),
            f: p.f.as_ref().map(bd),
            u: Buf::from_reals(ctx, dtype, &[d, r], &p.u),
            w: Buf::from_reals(ctx, dtype, &[d, r], &p.w),
            mu: p.mu.as_ref().map(|m| Buf::from_reals(ctx, dtype, &[d], m)),
            g: p.g.as_ref().map(bd),
            gx: p.gx.as_ref().map(bd),
            gv: p.gv.as_ref().map(bd),
        }
    }

    /// A buffer of this context and dtype filled with NaN (a poisoned output).
    pub fn poisoned(&self, shape: &[i64]) -> Buf {
        Buf::poisoned(self.ctx, self.dtype, shape)
    }

    /// `[B, D]`, `[D, R]`.
    pub fn bd(&self) -> [i64; 2] {
        [self.p.b as i64, self.p.d as i64]
    }
    pub fn dr(&self) -> [i64; 2] {
        [self.p.d as i64, self.p.r as i64]
    }

    /// The shape of gradient `k` of the Christoffel backward (`CHR_GRADS[k]`).
    pub fn chr_grad_shape(&self, k: usize) -> [i64; 2] {
        if k == 0 { self.bd() } else { self.dr() }
    }

    /// The shape of gradient `k` of the leapfrog backward (`LF_GRADS[k]`).
    pub fn lf_grad_shape(&self, k: usize) -> [i64; 2] {
        if k < 3 { self.bd() } else { self.dr() }
    }

    /// The handles of `(v, f, U, W, mu)` (NULL: not given).
    fn operands(&self) -> [In; 5] {
        let [f, mu] = [&self.f, &self.mu].map(raw_or_null);
        [self.v.raw(), f, self.u.raw(), self.w.raw(), mu]
    }

    /// fk_christoffel_forward on these inputs (c, flags 0, default stream) into `gamma`.
    pub fn chr_fwd(&self, gamma: Out) -> ChrFwd {
        let [v, _, u, w, _] = self.operands();
        #[rustfmt::skip]
        return ChrFwd { v, u, w, c: self.p.c, flags: 0, gamma, stream: null() };
    }

    /// fk_christoffel_backward on these inputs and `g` into `[dv, dU, dW]`.
    pub fn chr_bwd(&self, [dv, du, dw]: [Out; 3]) -> ChrBwd {
        let ChrFwd {
            v, u, w, c, flags, ..
        } = self.chr_fwd(NO_OUT);
        let g = raw_or_null(&self.g);
        #[rustfmt::skip]
        return ChrBwd { v, u, w, g, c, flags, dv, du, dw, stream: null() };
    }

    /// fk_leapfrog_forward on these inputs (dt, T steps, c, flags 0) into
    /// `[x_out, v_out, traj]`.
    pub fn lf_fwd(&self, [x_out, v_out, traj]: [Out; 3]) -> LfFwd {
        let [v, f, u, w, mu] = self.operands();
        let (x, dt, steps, c) = (self.x.raw(), self.p.dt, self.p.t as i64, self.p.c);
        #[rustfmt::skip]
        return LfFwd { x, v, f, u, w, mu, dt, steps, c, flags: 0, x_out, v_out, traj, stream: null() };
    }

    /// fk_leapfrog_backward on these inputs, `traj` and `gx`, `gv` into the
    /// gradients `LF_GRADS`.
    pub fn lf_bwd(&self, traj: In, [dx0, dv0, df, du, dw]: [Out; 5]) -> LfBwd {
        let LfFwd {
            v,
            f,
            u,
            w,
            mu,
            dt,
            steps,
            c,
            flags,
            ..
        } = self.lf_fwd([NO_OUT; 3]);
        let [gx, gv] = [&self.gx, &self.gv].map(raw_or_null);
        #[rustfmt::skip]
        return LfBwd {
            v, f, u, w, mu, dt, steps, c, flags, traj, gx, gv, dx0, dv0, df, du, dw, stream: null(),
        };
    }

    /// gamma (`flags`, on `stream`), read back after the stream.
    pub fn gamma(&self, flags: u32, stream: On) -> Vec<f64> {
        let out = self.poisoned(&self.bd());
        ok(ChrFwd {
            flags,
            stream,
            ..self.chr_fwd(out.raw())
        }
        .call());
        sync_stream(stream);
        out.read_reals()
    }

    /// `n` poisoned outputs of the shapes `shape(k)` for the bits k of `set` (NULL
    /// for the others) handed to `call`, which must succeed; read back after `stream`
    /// (`None`: not asked for).
    fn outputs_of(
        &self,
        n: usize,
        set: u32,
        shape: impl Fn(usize) -> [i64; 2],
        stream: On,
        call: impl FnOnce(&[Out]) -> fk_status,
    ) -> Vec<Option<Vec<f64>>> {
        let o: Vec<Option<Buf>> = (0..n)
            .map(|k| (set & (1 << k) != 0).then(|| self.poisoned(&shape(k))))
            .collect();
        ok(call(&o.iter().map(raw_or_null).collect::<Vec<_>>()));
        sync_stream(stream);
        o.iter().map(|o| o.as_ref().map(Buf::read_reals)).collect()
    }

    /// The Christoffel backward's gradients whose bit is set in `set` (bit k:
    /// `CHR_GRADS[k]`; the others not asked for, `None`).
    pub fn chr_grads_of(&self, set: u32, flags: u32, stream: On) -> Vec<Option<Vec<f64>>> {
        let shape = |k| self.chr_grad_shape(k);
        self.outputs_of(3, set, shape, stream, |o| {
            let outs = [o[0], o[1], o[2]];
            ChrBwd {
                flags,
                stream,
                ..self.chr_bwd(outs)
            }
            .call()
        })
    }

    /// All three Christoffel gradients.
    pub fn chr_grads(&self, flags: u32, stream: On) -> [Vec<f64>; 3] {
        let mut it = self
            .chr_grads_of(7, flags, stream)
            .into_iter()
            .map(Option::unwrap);
        [(); 3].map(|_| it.next().unwrap())
    }

    /// `(x_T, v_T, traj)` of the leapfrog forward, the trajectory as a buffer.
    pub fn leapfrog(&self, flags: u32, stream: On) -> (Vec<f64>, Vec<f64>, Buf) {
        let [b, d] = self.bd();
        let xo = self.poisoned(&[b, d]);
        let vo = self.poisoned(&[b, d]);
        let tr = self.poisoned(&[self.p.t as i64, 2, b, d]);
        let call = LfFwd {
            flags,
            stream,
            ..self.lf_fwd([xo.raw(), vo.raw(), tr.raw()])
        };
        ok(call.call());
        sync_stream(stream);
        (xo.read_reals(), vo.read_reals(), tr)
    }

    /// The leapfrog backward's gradients whose bit is set in `set` (bit k:
    /// `LF_GRADS[k]`), from the trajectory `traj` (NULL: recomputed).
    pub fn lf_grads_of(&self, traj: In, set: u32, flags: u32, stream: On) -> Vec<Option<Vec<f64>>> {
        let shape = |k| self.lf_grad_shape(k);
        self.outputs_of(5, set, shape, stream, |o| {
            let outs = [o[0], o[1], o[2], o[3], o[4]];
            LfBwd {
                flags,
                stream,
                ..self.lf_bwd(traj, outs)
            }
            .call()
        })
    }

    /// All five leapfrog gradients.
    pub fn lf_grads(&self, traj: In, flags: u32, stream: On) -> [Vec<f64>; 5] {
        let mut it = self
            .lf_grads_of(traj, 31, flags, stream)
            .into_iter()
            .map(Option::unwrap);
        [(); 5].map(|_| it.next().unwrap())
    }
}

// ------------------------------------------------------------------ checks

/// `assert_close_reals` for each gradient of `got` against `want`, labelled
/// `label(name)` with its name of `names`.
#[track_caller]
pub fn check_grads(
    got: &[Vec<f64>],
    want: &[Vec<f64>],
    names: &[&str],
    tol: f64,
    label: impl Fn(&str) -> String,
) {
    assert_eq!(got.len(), names.len());
    assert_eq!(want.len(), names.len());
    for ((g, w), n) in got.iter().zip(want).zip(names) {
        assert_close_reals(g, w, tol, &label(n));
    }
}

/// Whether `a` and `b` hold the same values bit for bit.
pub fn same_bits(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The sweeps' loop: every shape of `shapes`, then f32 and f64, then every case of
/// `cases`, handed to `body` (which draws its problem from the test's generator).
pub fn sweep<S: Copy, C: Copy>(shapes: &[S], cases: &[C], mut body: impl FnMut(S, fk_dtype, C)) {
    for &s in shapes {
        for dtype in REAL_DTYPES {
            for &c in cases {
                body(s, dtype, c);
            }
        }
    }
}

pub const NULL_STREAM: On = null();
pub const NO_OUT: Out = null_mut();
