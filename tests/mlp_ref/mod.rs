//! Shared by `abi_mlp` (CPU) and `gpu_mlp` (CUDA vs CPU): MLP cases, their random
//! data, runs of `fk_mlp_forward` / `fk_mlp_backward` through the C ABI, and f64
//! references written from the formulas (docs/ops.md section 6), with the
//! activations of `linalg_ref`.

#![allow(dead_code)]

use std::ptr::{null, null_mut};

use crate::common::*;
use crate::linalg_ref::{act_grad_ref, act_name, act_ref};
pub use fusekit::abi::linalg::*;
pub use fusekit::abi::mlp::*;

/// One network: `lead` is x's leading shape (rows = its product), `widths` =
/// `[k_0, n_0, ..., n_{L-1}]`, `bias[i]` whether layer `i` has a bias.
#[derive(Clone, Debug)]
pub struct MlpCase {
    pub dtype: fk_dtype,
    pub lead: Vec<i64>,
    pub widths: Vec<i64>,
    pub hidden: fk_activation,
    pub out: fk_activation,
    pub bias: Vec<bool>,
    pub flags: u32,
}

/// The inputs of a case (values the dtype holds exactly).
#[derive(Clone)]
pub struct MlpData {
    pub x: Vec<f64>,
    pub w: Vec<Vec<f64>>,
    pub b: Vec<Option<Vec<f64>>>,
    pub dy: Vec<f64>,
}

/// Which gradients a backward asks for.
#[derive(Clone)]
pub struct Want {
    pub dx: bool,
    pub dw: Vec<bool>,
    pub db: Vec<bool>,
}

impl Want {
    pub fn all(l: usize) -> Want {
        Want {
            dx: true,
            dw: vec![true; l],
            db: vec![true; l],
        }
    }
}

/// The gradients a backward returned (`None`: not asked for).
#[derive(Clone, Debug)]
pub struct Grads {
    pub dx: Option<Vec<f64>>,
    pub dw: Vec<Option<Vec<f64>>>,
    pub db: Vec<Option<Vec<f64>>>,
}

impl MlpCase {
    pub fn new(
        dtype: fk_dtype,
        lead: &[i64],
        widths: &[i64],
        (hidden, out): (fk_activation, fk_activation),
        bias: bool,
    ) -> MlpCase {
        MlpCase {
            dtype,
            lead: lead.to_vec(),
            widths: widths.to_vec(),
            hidden,
            out,
            bias: vec![bias; widths.len() - 1],
            flags: 0,
        }
    }
    pub fn layers(&self) -> usize {
        self.widths.len() - 1
    }
    pub fn rows(&self) -> usize {
        self.lead.iter().product::<i64>() as usize
    }
    pub fn act(&self, i: usize) -> fk_activation {
        if i + 1 == self.layers() {
            self.out
        } else {
            self.hidden
        }
    }
    pub fn x_shape(&self) -> Vec<i64> {
        let mut s = self.lead.clone();
        s.push(self.widths[0]);
        s
    }
    pub fn y_shape(&self) -> Vec<i64> {
        let mut s = self.lead.clone();
        s.push(*self.widths.last().unwrap());
        s
    }
    pub fn describe(&self) -> String {
        format!(
            "{} lead {:?} widths {:?} {}/{} bias {:?} flags {}",
            dname(self.dtype),
            self.lead,
            self.widths,
            act_name(self.hidden),
            act_name(self.out),
            self.bias,
            self.flags
        )
    }

    /// Random inputs: x and dy in [-1, 1], weights scaled by 1/sqrt(k) (outputs of
    /// order 1 at every depth), biases in [-0.5, 0.5]; all rounded to the dtype.
    pub fn data(&self, rng: &mut Rng) -> MlpData {
        let rows = self.rows();
        let q = |v: Vec<f64>| quantize_reals(self.dtype, &v);
        let x = q(rng.uniform_vec(rows * self.widths[0] as usize, -1.0, 1.0));
        let mut w = Vec::new();
        let mut b = Vec::new();
        for i in 0..self.layers() {
            let (k, n) = (self.widths[i] as usize, self.widths[i + 1] as usize);
            let s = 1.5 / (k.max(1) as f64).sqrt();
            w.push(q(rng.uniform_vec(n * k, -s, s)));
            b.push(self.bias[i].then(|| q(rng.uniform_vec(n, -0.5, 0.5))));
        }
        let dy = q(rng.uniform_vec(rows * *self.widths.last().unwrap() as usize, -1.0, 1.0));
        MlpData { x, w, b, dy }
    }

    /// The weight and bias buffers of `d` on `ctx`.
    pub fn params(&self, ctx: &Ctx, d: &MlpData) -> (Vec<Buf>, Vec<Option<Buf>>) {
        let ws = (0..self.layers())
            .map(|i| {
                let shape = [self.widths[i + 1], self.widths[i]];
                Buf::from_reals(ctx, self.dtype, &shape, &d.w[i])
            })
            .collect();
        let bs =
            d.b.iter()
                .map(|b| {
                    b.as_ref()
                        .map(|b| Buf::from_reals(ctx, self.dtype, &[b.len() as i64], b))
                })
                .collect();
        (ws, bs)
    }

    /// `fk_mlp_saved_size` on `ctx`.
    pub fn saved_size(&self, ctx: &Ctx) -> usize {
        let mut bytes = usize::MAX;
        ok(unsafe {
            fk_mlp_saved_size(
                ctx.0,
                self.layers() as i32,
                self.widths.as_ptr(),
                self.rows() as i64,
                self.dtype,
                self.hidden,
                self.out,
                &mut bytes,
            )
        });
        bytes
    }

    /// A saved buffer of `fk_mlp_saved_size` bytes (f32 elements, at least one).
    pub fn saved_buf(&self, ctx: &Ctx, stream: *const fk_stream) -> Buf {
        let n = self.saved_size(ctx).div_ceil(4).max(1) as i64;
        Buf::new_on(ctx, FK_DTYPE_F32, &[n], stream)
    }

    /// `fk_mlp_forward` with this case's layer count, activations and flags on the
    /// handles given (`w` and `b` one per layer; a NULL bias entry is no bias).
    pub fn forward_call(
        &self,
        x: *const fk_buffer,
        w: &[*const fk_buffer],
        b: &[*const fk_buffer],
        y: *mut fk_buffer,
        saved: *mut fk_buffer,
        stream: *const fk_stream,
    ) -> fk_status {
        let l = self.layers() as i32;
        let (h, o, f) = (self.hidden, self.out, self.flags);
        unsafe { fk_mlp_forward(x, l, w.as_ptr(), b.as_ptr(), h, o, f, y, saved, stream) }
    }

    /// `fk_mlp_backward` with this case's layer count, activations and flags on the
    /// handles given (`dw` and `db` one per layer; a NULL entry: not wanted).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_call(
        &self,
        dy: *const fk_buffer,
        x: *const fk_buffer,
        w: &[*const fk_buffer],
        saved: *const fk_buffer,
        dx: *mut fk_buffer,
        dw: &[*mut fk_buffer],
        db: &[*mut fk_buffer],
        stream: *const fk_stream,
    ) -> fk_status {
        let l = self.layers() as i32;
        let (h, o, f) = (self.hidden, self.out, self.flags);
        let (dw, db) = (dw.as_ptr(), db.as_ptr());
        unsafe { fk_mlp_backward(dy, x, l, w.as_ptr(), h, o, f, saved, dx, dw, db, stream) }
    }

    /// The forward on `ctx` (`y` poisoned first); with `keep`, also the saved buffer.
    pub fn forward(
        &self,
        ctx: &Ctx,
        d: &MlpData,
        keep: bool,
        stream: *const fk_stream,
    ) -> (Vec<f64>, Option<Buf>) {
        let x = Buf::from_reals(ctx, self.dtype, &self.x_shape(), &d.x);
        let (ws, bs) = self.params(ctx, d);
        let y = Buf::poisoned(ctx, self.dtype, &self.y_shape());
        let saved = keep.then(|| self.saved_buf(ctx, stream));
        let wp: Vec<*const fk_buffer> = ws.iter().map(|w| w.raw() as *const _).collect();
        let bp: Vec<*const fk_buffer> = bs.iter().map(|b| raw_or_null(b) as *const _).collect();
        let saved_p = saved.as_ref().map_or(null_mut(), |s| s.raw());
        ok_for(
            self.forward_call(x.raw(), &wp, &bp, y.raw(), saved_p, stream),
            self.describe(),
        );
        sync_stream(stream);
        (y.read_reals(), saved)
    }

    /// The backward on `ctx` with the gradients of `want` (poisoned first).
    pub fn backward(
        &self,
        ctx: &Ctx,
        d: &MlpData,
        saved: Option<&Buf>,
        want: &Want,
        stream: *const fk_stream,
    ) -> Grads {
        let l = self.layers();
        let x = Buf::from_reals(ctx, self.dtype, &self.x_shape(), &d.x);
        let dy = Buf::from_reals(ctx, self.dtype, &self.y_shape(), &d.dy);
        let (ws, _) = self.params(ctx, d);
        let dx = want
            .dx
            .then(|| Buf::poisoned(ctx, self.dtype, &self.x_shape()));
        let dw: Vec<Option<Buf>> = (0..l)
            .map(|i| {
                want.dw[i]
                    .then(|| Buf::poisoned(ctx, self.dtype, &[self.widths[i + 1], self.widths[i]]))
            })
            .collect();
        let db: Vec<Option<Buf>> = (0..l)
            .map(|i| want.db[i].then(|| Buf::poisoned(ctx, self.dtype, &[self.widths[i + 1]])))
            .collect();
        let wp: Vec<*const fk_buffer> = ws.iter().map(|w| w.raw() as *const _).collect();
        let dwp: Vec<*mut fk_buffer> = dw.iter().map(raw_or_null).collect();
        let dbp: Vec<*mut fk_buffer> = db.iter().map(raw_or_null).collect();
        let (saved_p, dx_p) = (
            saved.map_or(null(), |s| s.raw() as *const _),
            raw_or_null(&dx),
        );
        ok_for(
            self.backward_call(dy.raw(), x.raw(), &wp, saved_p, dx_p, &dwp, &dbp, stream),
            self.describe(),
        );
        sync_stream(stream);
        Grads {
            dx: dx.map(|b| b.read_reals()),
            dw: dw.iter().map(|b| b.as_ref().map(Buf::read_reals)).collect(),
            db: db.iter().map(|b| b.as_ref().map(Buf::read_reals)).collect(),
        }
    }

    /// The reference forward in f64: every layer's pre-activation `z_i` and output
    /// `h_{i+1}` (rounded to a half dtype, as the library stores it); `hs[0] = x`.
    pub fn reference(&self, d: &MlpData) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let rows = self.rows();
        let mut hs = vec![d.x.clone()];
        let mut zs = Vec::new();
        for i in 0..self.layers() {
            let (k, n) = (self.widths[i] as usize, self.widths[i + 1] as usize);
            let h = &hs[i];
            let mut z = vec![0.0; rows * n];
            for r in 0..rows {
                for j in 0..n {
                    let mut s = d.b[i].as_ref().map_or(0.0, |b| b[j]);
                    for t in 0..k {
                        s += h[r * k + t] * d.w[i][j * k + t];
                    }
                    z[r * n + j] = s;
                }
            }
            let a: Vec<f64> = z.iter().map(|&v| act_ref(self.act(i), v)).collect();
            // half types round every layer's output (f32's rounding, 1e-7, is
            // left out: the finite differences run on this reference)
            hs.push(if self.dtype == FK_DTYPE_F32 {
                a
            } else {
                quantize_reals(self.dtype, &a)
            });
            zs.push(z);
        }
        (hs, zs)
    }

    /// The reference backward in f64 from the layers' inputs `hs` and
    /// pre-activations `zs` (the reference's, or for ReLU's kink the library's).
    pub fn reference_grads(&self, d: &MlpData, hs: &[Vec<f64>], zs: &[Vec<f64>]) -> Grads {
        let rows = self.rows();
        let l = self.layers();
        let mut g = d.dy.clone();
        let mut dw = vec![None; l];
        let mut db = vec![None; l];
        let mut dx = None;
        for i in (0..l).rev() {
            let (k, n) = (self.widths[i] as usize, self.widths[i + 1] as usize);
            let dz: Vec<f64> = g
                .iter()
                .zip(&zs[i])
                .map(|(&g, &z)| g * act_grad_ref(self.act(i), z))
                .collect();
            let mut w_grad = vec![0.0; n * k];
            let mut b_grad = vec![0.0; n];
            for r in 0..rows {
                for j in 0..n {
                    b_grad[j] += dz[r * n + j];
                    for t in 0..k {
                        w_grad[j * k + t] += dz[r * n + j] * hs[i][r * k + t];
                    }
                }
            }
            let mut dh = vec![0.0; rows * k];
            for r in 0..rows {
                for t in 0..k {
                    dh[r * k + t] = (0..n).map(|j| dz[r * n + j] * d.w[i][j * k + t]).sum();
                }
            }
            dw[i] = Some(w_grad);
            db[i] = Some(b_grad);
            if i == 0 {
                dx = Some(dh.clone());
            }
            g = dh;
        }
        Grads { dx, dw, db }
    }

    /// The library's own hidden activations on `ctx` (the forward of the first `i`
    /// layers, for `i` = 1 .. L-1), with `hs[0] = x`: the inputs the library's
    /// weight gradients read, and where its ReLU masks came from.
    pub fn library_hidden(&self, ctx: &Ctx, d: &MlpData) -> Vec<Vec<f64>> {
        let mut hs = vec![d.x.clone()];
        for i in 1..self.layers() {
            let sub = MlpCase {
                widths: self.widths[..=i].to_vec(),
                out: self.hidden,
                bias: self.bias[..i].to_vec(),
                ..self.clone()
            };
            let sd = MlpData {
                w: d.w[..i].to_vec(),
                b: d.b[..i].to_vec(),
                dy: vec![0.0; self.rows() * self.widths[i] as usize],
                ..d.clone()
            };
            hs.push(sub.forward(ctx, &sd, false, null()).0);
        }
        hs
    }

    /// The reference gradients with the library's hidden activations as the layers'
    /// inputs, and for ReLU layers their masks (`z` replaced by +-1 from the
    /// library's outputs, so a pre-activation that rounding put on the other side
    /// of 0 does not count as an error).
    pub fn reference_grads_on(&self, ctx: &Ctx, d: &MlpData) -> Grads {
        let (_, mut zs) = self.reference(d);
        let mut hs = self.library_hidden(ctx, d);
        let (y, _) = self.forward(ctx, d, false, null());
        hs.push(y);
        for i in 0..self.layers() {
            if self.act(i) == FK_ACT_RELU {
                zs[i] = hs[i + 1]
                    .iter()
                    .map(|&v| if v > 0.0 { 1.0 } else { -1.0 })
                    .collect();
            }
        }
        self.reference_grads(d, &hs, &zs)
    }
}

/// One layer's regions of the saved buffer (docs/ops.md 6.2), byte offsets: the
/// derivative information (`aux`: offset and row pitch, bits for a ReLU mask,
/// elements for a GELU pre-activation) and the hidden output.
pub struct SavedRegion {
    pub aux: Option<(usize, usize)>,
    pub mask: bool,
    pub hidden: Option<usize>,
}

impl MlpCase {
    /// The saved buffer's layout as docs/ops.md 6.2 states it: per layer, regions
    /// starting at multiples of 256 bytes.
    pub fn saved_layout(&self) -> Vec<SavedRegion> {
        let (rows, es) = (self.rows(), dsize(self.dtype));
        let mut at = 0usize;
        let mut take = |bytes: usize| {
            let o = at;
            at = (at + bytes).next_multiple_of(256);
            o
        };
        (0..self.layers())
            .map(|i| {
                let n = self.widths[i + 1] as usize;
                let act = self.act(i);
                let (aux, mask) = match act {
                    FK_ACT_RELU => {
                        let ld = n.next_multiple_of(128).max(128);
                        (Some((take(rows * ld / 8), ld)), true)
                    }
                    FK_ACT_GELU_TANH | FK_ACT_GELU_ERF => {
                        let ld = n.next_multiple_of(8).max(8);
                        (Some((take(rows * ld * es), ld)), false)
                    }
                    _ => (None, false),
                };
                let hidden = (i + 1 < self.layers()).then(|| take(rows * n * es));
                SavedRegion { aux, mask, hidden }
            })
            .collect()
    }

    /// A forward's saved buffer `got` (with its output `y_got`) against the CPU's
    /// `want`: the hidden outputs and GELU pre-activations within `tol`; each ReLU
    /// mask bit of `got` is the sign of its own layer's output (`h > 0`, `y > 0` on
    /// the last layer), padding bits 0, and at most 1% of the bits differ from
    /// `want`'s (flips where two backends' `z` straddle 0).
    #[track_caller]
    pub fn check_saved(&self, got: &[u8], want: &[u8], y_got: &[f64], tol: f64, what: &str) {
        let (rows, es) = (self.rows(), dsize(self.dtype));
        let layout = self.saved_layout();
        let vals = |b: &[u8], off: usize, n: usize| -> Vec<f64> {
            decode(self.dtype, &b[off..off + n * es])
                .iter()
                .map(|c| c.re)
                .collect()
        };
        for (i, r) in layout.iter().enumerate() {
            let n = self.widths[i + 1] as usize;
            let out = match r.hidden {
                Some(h) => {
                    let g = vals(got, h, rows * n);
                    assert_close_reals(
                        &g,
                        &vals(want, h, rows * n),
                        tol,
                        &format!("{what}: saved h_{}", i + 1),
                    );
                    g
                }
                None => y_got.to_vec(),
            };
            let Some((off, ld)) = r.aux else { continue };
            if r.mask {
                let mut flips = 0;
                for row in 0..rows {
                    for j in 0..ld {
                        let bit = |b: &[u8]| b[off + row * ld / 8 + j / 8] >> (j % 8) & 1;
                        let g = bit(got);
                        let own = (j < n && out[row * n + j] > 0.0) as u8;
                        assert_eq!(
                            g, own,
                            "{what}: layer {i}'s mask bit ({row}, {j}) is not its output's sign"
                        );
                        flips += (g != bit(want)) as usize;
                    }
                }
                assert!(
                    flips * 100 <= (rows * n).max(100),
                    "{what}: layer {i}'s ReLU mask differs from the CPU's in {flips} of {} bits",
                    rows * n
                );
            } else {
                let z = |b: &[u8]| -> Vec<f64> {
                    let all = vals(b, off, rows * ld);
                    (0..rows)
                        .flat_map(|row| all[row * ld..row * ld + n].to_vec())
                        .collect()
                };
                assert_close_reals(
                    &z(got),
                    &z(want),
                    tol,
                    &format!("{what}: layer {i}'s saved pre-activation"),
                );
            }
        }
    }
}

/// Every (hidden, out) activation pair.
pub fn act_pairs() -> Vec<(fk_activation, fk_activation)> {
    let acts = [FK_ACT_NONE, FK_ACT_RELU, FK_ACT_GELU_TANH, FK_ACT_GELU_ERF];
    acts.iter()
        .flat_map(|&h| acts.iter().map(move |&o| (h, o)))
        .collect()
}

/// The gradients of `got` that were asked for, against `want`'s.
#[track_caller]
pub fn check_grads(got: &Grads, want: &Grads, tol: f64, what: &str) {
    if let (Some(g), Some(w)) = (&got.dx, &want.dx) {
        assert_close_reals(g, w, tol, &format!("{what}: dx"));
    }
    for i in 0..got.dw.len() {
        if let (Some(g), Some(w)) = (&got.dw[i], &want.dw[i]) {
            assert_close_reals(g, w, tol, &format!("{what}: dweights[{i}]"));
        }
        if let (Some(g), Some(w)) = (&got.db[i], &want.db[i]) {
            assert_close_reals(g, w, tol, &format!("{what}: dbiases[{i}]"));
        }
    }
}
