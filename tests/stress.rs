//! Concurrency stress through the C ABI (docs/abi.md, "Thread safety", "Ownership",
//! "Streams and ordering"), on the CPU and on CUDA:
//!
//! - `mixed_ops_8_threads_one_context`: 8 threads share one context; each has its
//!   own stream and two streams are shared by all of them. Every iteration runs one
//!   op of a family (elementwise, Gaussian, geodesic, linear algebra, optimiser
//!   kernels; among them ops with per-stream or stream-ordered scratch on CUDA,
//!   which threads sharing a stream share) or a runtime sequence (allocation, asynchronous host copies, a
//!   buffer copy to a shared stream ordered by an event) on random data, and checks
//!   the result against an f64 reference computed by the test. Each output is
//!   first overwritten with NaN (or the in/out operand's initial value) by a copy
//!   on the same stream, so an op that did not run, or ran out of order, fails.
//! - `stream_destroyed_with_work_queued`: a stream's handle is destroyed (by its
//!   thread or by another one) right after a chain of dependent ops was queued on
//!   it; the work completes, buffers allocated on the stream stay valid, and an
//!   event recorded there orders a read on another stream.
//! - `context_destroyed_from_another_thread`: one thread destroys the context
//!   handle while another keeps running every op family on its buffers and
//!   streams; the last handle released afterwards releases the device runtime.
//! - `events_waited_on_across_threads`: a producer and a consumer thread on their
//!   own streams pass a ring of buffers back and forth, ordered only by events
//!   recorded by one thread and waited on (`fk_stream_wait_event`, or
//!   `fk_event_synchronize` and `fk_event_query`) by the other.
//!
//! Devices: `FK_TEST_DEVICE=cpu` or `cuda`; unset, the CPU and, when present (or
//! required by `FK_REQUIRE_GPU=1`), CUDA device 0. `FK_SANITIZE=1` (under
//! compute-sanitizer) shrinks the iteration counts. Every test body runs under a
//! timeout, so a deadlock fails the test instead of hanging the run.

mod common;

use std::mem::ManuallyDrop;
use std::ptr::null_mut;
use std::sync::mpsc;

use common::runtime::*;
use common::*;
use fusekit::abi::gaussian::*;
use fusekit::abi::geodesic::*;
use fusekit::abi::linalg::*;
use fusekit::abi::optim::*;

// ------------------------------------------------------------------ set-up

/// A handle handed to another thread.
struct H<T>(*mut T);
impl<T> Clone for H<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for H<T> {}
impl<T> H<T> {
    /// The handle (a closure calling this captures the whole `H`, which is `Send`).
    fn p(self) -> *mut T {
        self.0
    }
}
// SAFETY: every fusekit handle may be used from any thread (docs/abi.md, "Thread
// safety"); the tests order destruction after use themselves.
unsafe impl<T> Send for H<T> {}
unsafe impl<T> Sync for H<T> {}

/// The devices to stress (see the module comment).
fn devices() -> Vec<fk_device_kind> {
    match std::env::var("FK_TEST_DEVICE").as_deref() {
        Ok("cpu") => vec![FK_DEVICE_CPU],
        Ok("cuda") => {
            assert!(
                device_count() > 0,
                "FK_TEST_DEVICE=cuda but fk_device_count is 0"
            );
            vec![FK_DEVICE_CUDA]
        }
        Ok(v) if !v.is_empty() => panic!("FK_TEST_DEVICE={v}: expected cpu or cuda"),
        _ => {
            let mut v = vec![FK_DEVICE_CPU];
            if gpu().is_some() {
                v.push(FK_DEVICE_CUDA);
            }
            v
        }
    }
}

fn dev_name(kind: fk_device_kind) -> &'static str {
    if kind == FK_DEVICE_CUDA {
        "cuda"
    } else {
        "cpu"
    }
}

/// `n` scaled down under compute-sanitizer.
fn iters(n: usize) -> usize {
    if sanitizing() { (n / 50).max(8) } else { n }
}

/// Seconds a test body may take before it counts as a deadlock.
fn limit_s() -> u64 {
    if sanitizing() { 800 } else { 120 }
}

/// Runs `body` with a new context of every device, under a timeout. The context is
/// warmed up first, outside the timeout (a cold kernel cache compiles every module).
fn each_device(what: &'static str, body: fn(Ctx)) {
    for kind in devices() {
        let name = format!("{what} on {}", dev_name(kind));
        println!("{name}");
        let c = Ctx::try_new(kind, 0)
            .unwrap_or_else(|s| panic!("{name}: context: {} {}", status_name(s), last_error()));
        check(unsafe { fk_context_warmup(c.raw()) }, "fk_context_warmup");
        let h = H(ManuallyDrop::new(c).0); // ownership moves to the body's thread
        with_timeout(limit_s(), &name, move || body(Ctx(h.p())));
    }
}

#[track_caller]
fn check(s: fk_status, what: &str) {
    assert_eq!(s, FK_OK, "{what}: {} ({})", status_name(s), last_error());
}

/// A context handle borrowed from another owner (never destroyed through this).
fn borrow_ctx(p: H<fk_context>) -> ManuallyDrop<Ctx> {
    ManuallyDrop::new(Ctx(p.0))
}

fn nbytes(dtype: fk_dtype, n: usize) -> usize {
    n * dsize(dtype)
}

/// A new buffer on `stream` holding `vals` (copied on `stream`, waited for).
fn upload(
    ctx: &Ctx,
    dtype: fk_dtype,
    shape: &[i64],
    vals: &[f64],
    stream: *const fk_stream,
) -> Buf {
    let b = Buf::new_on(ctx, dtype, shape, stream);
    write(&b, dtype, vals, stream);
    b
}

fn write(b: &Buf, dtype: fk_dtype, vals: &[f64], stream: *const fk_stream) {
    let bytes = encode(dtype, &vals.iter().map(|&v| re(v)).collect::<Vec<_>>());
    check(
        unsafe { fk_buffer_copy_from_host(b.0, bytes.as_ptr().cast(), bytes.len(), stream) },
        "fk_buffer_copy_from_host",
    );
}

/// The contents of `b` (`n` elements), read on `stream` after its earlier work.
fn read(b: &Buf, dtype: fk_dtype, n: usize, stream: *const fk_stream) -> Vec<Cx> {
    let mut bytes = vec![0u8; nbytes(dtype, n)];
    check(
        unsafe { fk_buffer_copy_to_host(b.0, bytes.as_mut_ptr().cast(), bytes.len(), stream) },
        "fk_buffer_copy_to_host",
    );
    decode(dtype, &bytes)
}

/// `n` values of magnitude in [lo, hi) with random signs, rounded to `dtype`.
fn draw(rng: &mut Rng, dtype: fk_dtype, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|_| quantize(dtype, re(rng.signed(lo, hi))).re)
        .collect()
}

/// `draw` of one vector for each length in `lens`, in order.
fn draws<const N: usize>(
    rng: &mut Rng,
    dtype: fk_dtype,
    lens: [usize; N],
    lo: f64,
    hi: f64,
) -> [Vec<f64>; N] {
    lens.map(|n| draw(rng, dtype, n, lo, hi))
}

fn dims(rng: &mut Rng, lo: u64, hi: u64) -> usize {
    (lo + rng.below(hi - lo + 1)) as usize
}

// ------------------------------------------------------------------ jobs

/// One op of a family with its inputs in place, its output buffer, the value the
/// output starts from before each run (NaN, or the in/out operand's initial value)
/// and the f64 reference of the result.
struct Job {
    kind: Kind,
    dtype: fk_dtype,
    ins: Vec<Buf>,
    out: Buf,
    init: Buf,
    n_out: usize,
    want: Vec<Cx>,
    scalars: [f64; 2],
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// `out = tanh(alpha a + beta b)`: `fk_axpby`, then `fk_tanh` in place.
    Elementwise,
    /// `fk_mahalanobis_forward`.
    Gaussian,
    /// `fk_christoffel_forward` (clamped at c).
    Geodesic,
    /// `fk_gemm` `C = alpha A B^T + beta C`.
    Gemm,
    /// `fk_linear_forward` with bias and relu.
    Linear,
    /// `fk_per_sample_grad_norms`.
    GradNorms,
    /// `fk_shampoo_stats` `L = beta L + alpha G G^T`.
    Shampoo,
    /// `fk_linear_backward` (relu), `dw` only: `dz` in the stream's scratch on CUDA.
    LinearBackward,
    /// `fk_dp_clipped_grad_sum`: scaled gradients in stream-ordered scratch on CUDA.
    DpClip,
}

const KINDS: [Kind; 9] = [
    Kind::Elementwise,
    Kind::Gaussian,
    Kind::Geodesic,
    Kind::Gemm,
    Kind::Linear,
    Kind::GradNorms,
    Kind::Shampoo,
    Kind::LinearBackward,
    Kind::DpClip,
];

impl Job {
    /// Random operands on `ctx` (allocated and written on `stream`) and the reference.
    fn new(ctx: &Ctx, kind: Kind, rng: &mut Rng, stream: *const fk_stream) -> Job {
        let up = |dtype, shape: &[i64], v: &[f64]| upload(ctx, dtype, shape, v, stream);
        let (dtype, ins, out_shape, init, want, scalars): (
            fk_dtype,
            Vec<Buf>,
            Vec<i64>,
            Option<Vec<f64>>,
            Vec<f64>,
            [f64; 2],
        ) = match kind {
            Kind::Elementwise => {
                let dtype = if rng.below(2) == 0 {
                    FK_DTYPE_F32
                } else {
                    FK_DTYPE_F64
                };
                let n = dims(rng, 1, 300);
                let (a, b) = (draw(rng, dtype, n, 0.1, 1.0), draw(rng, dtype, n, 0.1, 1.0));
                let (al, be) = (rng.signed(0.5, 1.5), rng.signed(0.5, 1.5));
                let want = (0..n).map(|i| (al * a[i] + be * b[i]).tanh()).collect();
                let sh = [n as i64];
                (
                    dtype,
                    vec![up(dtype, &sh, &a), up(dtype, &sh, &b)],
                    sh.to_vec(),
                    None,
                    want,
                    [al, be],
                )
            }
            Kind::Gaussian => {
                let d = FK_DTYPE_F64;
                let (b, n) = (dims(rng, 1, 24), dims(rng, 1, 16));
                let p = draw(rng, d, b * 3, 0.0, 2.0);
                let mu = draw(rng, d, n * 3, 0.0, 2.0);
                let mut l = draw(rng, d, n * 9, 0.0, 0.5);
                for g in 0..n {
                    for i in 0..3 {
                        l[g * 9 + i * 3 + i] = rng.uniform(0.5, 1.5);
                    }
                }
                let eps = 1e-3;
                let mut want = vec![0.0; b * n];
                for bi in 0..b {
                    for g in 0..n {
                        let li = |i: usize, j: usize| l[g * 9 + i * 3 + j];
                        let r: Vec<f64> = (0..3).map(|i| p[bi * 3 + i] - mu[g * 3 + i]).collect();
                        let y0 = r[0] / (li(0, 0) + eps);
                        let y1 = (r[1] - li(1, 0) * y0) / (li(1, 1) + eps);
                        let y2 = (r[2] - li(2, 0) * y0 - li(2, 1) * y1) / (li(2, 2) + eps);
                        want[bi * n + g] = y0 * y0 + y1 * y1 + y2 * y2;
                    }
                }
                let ins = vec![
                    up(d, &[b as i64, 3], &p),
                    up(d, &[n as i64, 3], &mu),
                    up(d, &[n as i64, 3, 3], &l),
                ];
                (d, ins, vec![b as i64, n as i64], None, want, [eps, 0.0])
            }
            Kind::Geodesic => {
                let d = FK_DTYPE_F64;
                let (b, dd, r) = (dims(rng, 1, 12), dims(rng, 1, 16), dims(rng, 1, 16));
                let [v, u, w] = draws(rng, d, [b * dd, dd * r, dd * r], 0.0, 1.0);
                let c = 5.0;
                let mut want = vec![0.0; b * dd];
                for bi in 0..b {
                    let s: Vec<f64> = (0..r)
                        .map(|k| {
                            let p: f64 = (0..dd).map(|i| v[bi * dd + i] * u[i * r + k]).sum();
                            p * p
                        })
                        .collect();
                    for i in 0..dd {
                        let raw: f64 = (0..r).map(|k| s[k] * w[i * r + k]).sum();
                        want[bi * dd + i] = raw.clamp(-c, c);
                    }
                }
                let ins = vec![
                    up(d, &[b as i64, dd as i64], &v),
                    up(d, &[dd as i64, r as i64], &u),
                    up(d, &[dd as i64, r as i64], &w),
                ];
                (d, ins, vec![b as i64, dd as i64], None, want, [c, 0.0])
            }
            Kind::Gemm => {
                let d = FK_DTYPE_F32;
                let (m, n, k) = (dims(rng, 1, 24), dims(rng, 1, 24), dims(rng, 1, 32));
                let [a, bm, c0] = draws(rng, d, [m * k, n * k, m * n], 0.1, 1.0);
                let (al, be) = (
                    quantize(d, re(rng.signed(0.5, 1.5))).re,
                    quantize(d, re(rng.signed(0.5, 1.5))).re,
                );
                let mut want = vec![0.0; m * n];
                for i in 0..m {
                    for j in 0..n {
                        let dot: f64 = (0..k).map(|l| a[i * k + l] * bm[j * k + l]).sum();
                        want[i * n + j] = al * dot + be * c0[i * n + j];
                    }
                }
                let ins = vec![
                    up(d, &[m as i64, k as i64], &a),
                    up(d, &[n as i64, k as i64], &bm),
                ];
                (d, ins, vec![m as i64, n as i64], Some(c0), want, [al, be])
            }
            Kind::Linear => {
                let d = FK_DTYPE_F32;
                let (m, n, k) = (dims(rng, 1, 24), dims(rng, 1, 24), dims(rng, 1, 32));
                let [x, w, bias] = draws(rng, d, [m * k, n * k, n], 0.1, 1.0);
                let mut want = vec![0.0; m * n];
                for i in 0..m {
                    for j in 0..n {
                        let z: f64 =
                            (0..k).map(|l| x[i * k + l] * w[j * k + l]).sum::<f64>() + bias[j];
                        want[i * n + j] = z.max(0.0);
                    }
                }
                let ins = vec![
                    up(d, &[m as i64, k as i64], &x),
                    up(d, &[n as i64, k as i64], &w),
                    up(d, &[n as i64], &bias),
                ];
                (d, ins, vec![m as i64, n as i64], None, want, [0.0; 2])
            }
            Kind::GradNorms => {
                let d = FK_DTYPE_F64;
                let (b, fi, fo) = (dims(rng, 1, 16), dims(rng, 1, 24), dims(rng, 1, 24));
                let [a, g] = draws(rng, d, [b * fi, b * fo], 0.1, 1.0);
                let want = (0..b)
                    .map(|i| {
                        let na: f64 = a[i * fi..(i + 1) * fi].iter().map(|x| x * x).sum();
                        let ng: f64 = g[i * fo..(i + 1) * fo].iter().map(|x| x * x).sum();
                        na * ng
                    })
                    .collect();
                let ins = vec![
                    up(d, &[b as i64, fi as i64], &a),
                    up(d, &[b as i64, fo as i64], &g),
                ];
                (d, ins, vec![b as i64], None, want, [0.0; 2])
            }
            Kind::Shampoo => {
                let d = FK_DTYPE_F64;
                let (m, n) = (dims(rng, 1, 16), dims(rng, 1, 24));
                let g = draw(rng, d, m * n, 0.1, 1.0);
                let mut l0 = vec![0.0; m * m];
                for i in 0..m {
                    for j in i..m {
                        let v = rng.signed(0.1, 1.0);
                        l0[i * m + j] = v;
                        l0[j * m + i] = v;
                    }
                }
                let (al, be) = (rng.uniform(0.1, 1.0), rng.uniform(0.1, 1.0));
                let mut want = vec![0.0; m * m];
                for i in 0..m {
                    for j in 0..m {
                        let dot: f64 = (0..n).map(|l| g[i * n + l] * g[j * n + l]).sum();
                        want[i * m + j] = be * l0[i * m + j] + al * dot;
                    }
                }
                let ins = vec![up(d, &[m as i64, n as i64], &g)];
                (d, ins, vec![m as i64, m as i64], Some(l0), want, [al, be])
            }
            Kind::LinearBackward => {
                let d = FK_DTYPE_F32;
                let (m, n, k) = (dims(rng, 1, 24), dims(rng, 1, 24), dims(rng, 1, 32));
                let [dy, x, w] = draws(rng, d, [m * n, m * k, n * k], 0.1, 1.0);
                // the forward's relu output: only y > 0 matters; at least one is
                let mut y: Vec<f64> = (0..m * n)
                    .map(|_| {
                        if rng.below(2) == 0 {
                            0.0
                        } else {
                            rng.uniform(0.1, 1.0)
                        }
                    })
                    .collect();
                y[0] = 0.5;
                let mut want = vec![0.0; n * k];
                for j in 0..n {
                    for l in 0..k {
                        want[j * k + l] = (0..m)
                            .filter(|&i| y[i * n + j] > 0.0)
                            .map(|i| dy[i * n + j] * x[i * k + l])
                            .sum();
                    }
                }
                let y = y.iter().map(|&v| quantize(d, re(v)).re).collect::<Vec<_>>();
                let ins = vec![
                    up(d, &[m as i64, n as i64], &dy),
                    up(d, &[m as i64, k as i64], &x),
                    up(d, &[n as i64, k as i64], &w),
                    up(d, &[m as i64, n as i64], &y),
                ];
                (d, ins, vec![n as i64, k as i64], None, want, [0.0; 2])
            }
            Kind::DpClip => {
                let d = FK_DTYPE_F64;
                let (b, fi, fo) = (dims(rng, 1, 16), dims(rng, 1, 24), dims(rng, 1, 24));
                let [a, g] = draws(rng, d, [b * fi, b * fo], 0.1, 1.0);
                let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
                // |G_b| = |g_b| |a_b|; the bound clips the larger half or so
                let norms: Vec<f64> = (0..b)
                    .map(|i| norm(&a[i * fi..(i + 1) * fi]) * norm(&g[i * fo..(i + 1) * fo]))
                    .collect();
                let c = 0.5 * norms.iter().cloned().fold(0.0, f64::max);
                let mut want = vec![0.0; fo * fi];
                for (bi, nb) in norms.iter().enumerate() {
                    let f = (c / nb).min(1.0);
                    for o in 0..fo {
                        for i in 0..fi {
                            want[o * fi + i] += f * g[bi * fo + o] * a[bi * fi + i];
                        }
                    }
                }
                let ins = vec![
                    up(d, &[b as i64, fi as i64], &a),
                    up(d, &[b as i64, fo as i64], &g),
                ];
                (d, ins, vec![fo as i64, fi as i64], None, want, [c, 0.0])
            }
        };
        let n_out = out_shape.iter().product::<i64>() as usize;
        let init = init.unwrap_or_else(|| vec![f64::NAN; n_out]);
        let want: Vec<Cx> = want.into_iter().map(re).collect();
        assert!(
            want.iter().all(|v| v.is_finite()) && want.iter().any(|v| v.re != 0.0),
            "test bug: {kind:?}'s reference is not finite or all zero"
        );
        Job {
            kind,
            dtype,
            ins,
            out: Buf::new_on(ctx, dtype, &out_shape, stream),
            init: upload(ctx, dtype, &out_shape, &init, stream),
            n_out,
            want,
            scalars,
        }
    }

    /// Resets the output, queues the op on `s`, reads the result back on `s` and
    /// checks it.
    fn run_and_check(&self, s: *const fk_stream, what: &str) {
        check(
            unsafe { fk_buffer_copy(self.out.0, self.init.0, s) },
            "fk_buffer_copy (reset the output)",
        );
        let i = |k: usize| self.ins[k].0 as *const fk_buffer;
        let o = self.out.0;
        let [s0, s1] = self.scalars;
        let st = unsafe {
            match self.kind {
                Kind::Elementwise => {
                    let st = fk_axpby(re(s0).scalar(), i(0), re(s1).scalar(), i(1), o, s);
                    if st == FK_OK { fk_tanh(o, o, s) } else { st }
                }
                Kind::Gaussian => fk_mahalanobis_forward(i(0), i(1), i(2), s0, o, s),
                Kind::Geodesic => fk_christoffel_forward(i(0), i(1), i(2), s0, 0, o, s),
                Kind::Gemm => fk_gemm(
                    FK_OP_N,
                    FK_OP_T,
                    re(s0).scalar(),
                    i(0),
                    i(1),
                    re(s1).scalar(),
                    o,
                    0,
                    s,
                ),
                Kind::Linear => fk_linear_forward(i(0), i(1), i(2), FK_ACT_RELU, o, null_mut(), s),
                Kind::GradNorms => fk_per_sample_grad_norms(i(0), i(1), o, s),
                Kind::Shampoo => fk_shampoo_stats(i(0), s0, s1, o, null_mut(), s),
                Kind::LinearBackward => fk_linear_backward(
                    i(0),
                    i(1),
                    i(2),
                    FK_ACT_RELU,
                    i(3),
                    null_mut(),
                    o,
                    null_mut(),
                    s,
                ),
                Kind::DpClip => fk_dp_clipped_grad_sum(i(0), i(1), s0, o, null_mut(), 0, s),
            }
        };
        check(st, &format!("{what}: {:?}", self.kind));
        let got = read(&self.out, self.dtype, self.n_out, s);
        assert_close(
            &got,
            &self.want,
            tol(self.dtype),
            &format!("{what}: {:?}", self.kind),
        );
    }
}

/// The runtime sequence: a buffer allocated on `own`, an asynchronous host copy
/// into it, an event recorded on `own` and waited on by `other`, a buffer-to-buffer
/// copy and the read back on `other`; memory statistics read meanwhile.
fn runtime_round(
    ctx: &Ctx,
    rng: &mut Rng,
    own: *const fk_stream,
    other: *const fk_stream,
    ev: &Event,
) {
    let d = FK_DTYPE_F64;
    let n = dims(rng, 1, 2000);
    let vals = draw(rng, d, n, 0.1, 1.0);
    let host = encode(d, &vals.iter().map(|&v| re(v)).collect::<Vec<_>>());
    let a = Buf::new_on(ctx, d, &[n as i64], own);
    let b = Buf::new_on(ctx, d, &[n as i64], other);
    check(
        unsafe { fk_buffer_copy_from_host_async(a.0, host.as_ptr().cast(), host.len(), own) },
        "fk_buffer_copy_from_host_async",
    );
    ev.record(own);
    check(
        unsafe { fk_stream_wait_event(other, ev.0) },
        "fk_stream_wait_event",
    );
    check(unsafe { fk_buffer_copy(b.0, a.0, other) }, "fk_buffer_copy");
    let st = stats(ctx);
    assert!(
        st.live_allocations >= 2,
        "memory stats: {} live",
        st.live_allocations
    );
    let got = read(&b, d, n, other);
    let want: Vec<Cx> = vals.iter().map(|&v| re(v)).collect();
    assert_eq!(got, want, "runtime round: copy through an event");
    // `a` was last read on `other`, which the read above waited for; `host` lives
    // until `own` is synchronised here (the asynchronous copy's source).
    check(
        unsafe { fk_stream_synchronize(own) },
        "fk_stream_synchronize",
    );
    drop((a, b));
}

// ------------------------------------------------------------------ tests

const THREADS: usize = 8;
const SHARED_STREAMS: usize = 2;

#[test]
fn mixed_ops_8_threads_one_context() {
    each_device("mixed ops, 8 threads, one context", |ctx| {
        let shared: Vec<Stream> = (0..SHARED_STREAMS).map(|_| Stream::new(&ctx)).collect();
        let shared_h: Vec<H<fk_stream>> = shared.iter().map(|s| H(s.0)).collect();
        let ctx_h = H(ctx.0);
        let n_iter = iters(3000);
        let counts: Vec<[usize; KINDS.len() + 1]> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..THREADS)
                .map(|t| {
                    let shared_h = &shared_h;
                    sc.spawn(move || {
                        let ctx = borrow_ctx(ctx_h);
                        let own = Stream::new(&ctx);
                        let mut rng = Rng::new(1000 + t as u64);
                        let jobs: Vec<Job> = KINDS
                            .iter()
                            .map(|&k| Job::new(&ctx, k, &mut rng, own.0))
                            .collect();
                        let ev = Event::new(&ctx);
                        let mut done = [0usize; KINDS.len() + 1];
                        for it in 0..n_iter {
                            // a quarter of the work on a stream every thread uses
                            let sh = shared_h[(t + it) % SHARED_STREAMS].0;
                            let s = if rng.below(4) == 0 { sh } else { own.0 };
                            let pick = rng.below(KINDS.len() as u64 + 1) as usize;
                            let what = format!("thread {t}, iteration {it}");
                            if pick == KINDS.len() {
                                runtime_round(&ctx, &mut rng, own.0, sh, &ev);
                            } else {
                                jobs[pick].run_and_check(s, &what);
                            }
                            done[pick] += 1;
                        }
                        own.sync();
                        done
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        let total: usize = counts.iter().flatten().sum();
        assert_eq!(total, THREADS * n_iter);
        for (k, name) in KINDS
            .iter()
            .map(|k| format!("{k:?}"))
            .chain(["Runtime".into()])
            .enumerate()
        {
            let n: usize = counts.iter().map(|c| c[k]).sum();
            println!("  {name}: {n} runs");
            assert!(n > 0, "{name} never ran");
        }
        drop(shared);
        let st = stats(&ctx);
        assert_eq!(
            st.live_allocations, 0,
            "every buffer of the threads is gone"
        );
    });
}

#[test]
fn stream_destroyed_with_work_queued() {
    each_device("stream destroyed with work queued", |ctx| {
        let ctx_h = H(ctx.0);
        let rounds = iters(150);
        // a thread that destroys the streams it is handed
        let (to_destroyer, inbox) = mpsc::channel::<H<fk_stream>>();
        let destroyer = std::thread::spawn(move || {
            for s in inbox {
                check(
                    unsafe { fk_stream_destroy(s.0) },
                    "fk_stream_destroy (other thread)",
                );
            }
        });
        std::thread::scope(|sc| {
            for t in 0..4 {
                let to_destroyer = to_destroyer.clone();
                sc.spawn(move || {
                    let ctx = borrow_ctx(ctx_h);
                    let reader = Stream::new(&ctx);
                    let mut rng = Rng::new(2000 + t);
                    let d = FK_DTYPE_F64;
                    for r in 0..rounds {
                        let mut s = null_mut();
                        check(
                            unsafe { fk_stream_create(ctx.0, &mut s) },
                            "fk_stream_create",
                        );
                        let n = dims(&mut rng, 1, 4000);
                        let x0 = draw(&mut rng, d, n, 0.1, 1.0);
                        let y0 = draw(&mut rng, d, n, 0.1, 1.0);
                        // allocated on the stream whose handle goes first
                        let x = upload(&ctx, d, &[n as i64], &x0, s);
                        let y = upload(&ctx, d, &[n as i64], &y0, s);
                        // y <- 0.5 y + x, 64 times (16 under the sanitizer): each step needs
                        // the previous one
                        let steps = if sanitizing() { 16 } else { 64 };
                        for _ in 0..steps {
                            check(
                                unsafe {
                                    fk_axpby(re(0.5).scalar(), y.0, re(1.0).scalar(), x.0, y.0, s)
                                },
                                "fk_axpby",
                            );
                        }
                        let ev = Event::new(&ctx);
                        ev.record(s);
                        if r % 2 == 0 {
                            check(unsafe { fk_stream_destroy(s) }, "fk_stream_destroy");
                        } else {
                            to_destroyer.send(H(s)).expect("destroyer thread");
                        }
                        check(
                            unsafe { fk_stream_wait_event(reader.0, ev.0) },
                            "fk_stream_wait_event",
                        );
                        let got = read(&y, d, n, reader.0);
                        let want: Vec<Cx> = (0..n)
                            .map(|i| {
                                let mut v = y0[i];
                                for _ in 0..steps {
                                    v = 0.5 * v + x0[i];
                                }
                                re(v)
                            })
                            .collect();
                        assert_close(&got, &want, tol(d), &format!("thread {t} round {r}"));
                        // the buffers' memory returns on the destroyed handle's stream
                        drop((x, y, ev));
                    }
                });
            }
        });
        drop(to_destroyer);
        destroyer
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        assert_eq!(stats(&ctx).live_allocations, 0, "every buffer is gone");
    });
}

#[test]
fn context_destroyed_from_another_thread() {
    each_device("context destroyed from another thread", |ctx| {
        // destroyed by the other thread, never here
        let ctx = ManuallyDrop::new(ctx);
        let ctx_h = H(ctx.0);
        let n_iter = iters(1500);
        // channels, not barriers: a thread that fails must not leave the other waiting
        let (go, mid) = mpsc::channel::<()>();
        let (done, destroyed) = mpsc::channel::<()>();
        let destroyer = std::thread::spawn(move || {
            let _ = mid.recv(); // the worker is a third of the way through (or gone)
            check(
                unsafe { fk_context_destroy(ctx_h.p()) },
                "fk_context_destroy",
            );
            let _ = done.send(());
        });
        let worker = std::thread::spawn(move || {
            let c = borrow_ctx(ctx_h);
            let s = Stream::new(&c);
            let s2 = Stream::new(&c);
            let mut rng = Rng::new(3000);
            let jobs: Vec<Job> = KINDS
                .iter()
                .map(|&k| Job::new(&c, k, &mut rng, s.0))
                .collect();
            let ev = Event::new(&c);
            let (mut before, mut after) = (0, 0);
            for it in 0..n_iter {
                if it == n_iter / 3 {
                    go.send(()).expect("destroyer thread"); // the handle goes now...
                }
                if it == 2 * n_iter / 3 {
                    destroyed.recv().expect("destroyer thread"); // ...and has by now
                }
                let st = if it % 3 == 0 { s2.0 } else { s.0 };
                jobs[it % jobs.len()].run_and_check(st, &format!("iteration {it}"));
                // ordering between the two streams by an event still works
                ev.record(st);
                check(
                    unsafe { fk_stream_wait_event(s.0, ev.0) },
                    "fk_stream_wait_event",
                );
                if it < n_iter / 3 {
                    before += 1;
                } else if it >= 2 * n_iter / 3 {
                    after += 1;
                }
            }
            assert!(before > 0 && after > 0);
            // the last handles go: the device runtime is released with them
            drop((jobs, ev, s2));
            drop(s);
        });
        destroyer
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        worker
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
    });
}

#[test]
fn events_waited_on_across_threads() {
    each_device("events waited on across threads", |ctx| {
        let ctx_h = H(ctx.0);
        let d = FK_DTYPE_F64;
        let slots = 3;
        let n = 4096;
        let n_iter = iters(3000);
        let mut rng = Rng::new(4000);
        let x0 = draw(&mut rng, d, n, 0.1, 1.0);
        let w0 = draw(&mut rng, d, n, 0.1, 1.0);
        let setup = Stream::new(&ctx);
        let x = upload(&ctx, d, &[n as i64], &x0, setup.0);
        let w = upload(&ctx, d, &[n as i64], &w0, setup.0);
        let ring: Vec<Buf> = (0..slots)
            .map(|_| Buf::new_on(&ctx, d, &[n as i64], setup.0))
            .collect();
        let ready: Vec<Event> = (0..slots).map(|_| Event::new(&ctx)).collect();
        let done: Vec<Event> = (0..slots).map(|_| Event::new(&ctx)).collect();
        setup.sync();
        let hb = |b: &Buf| H(b.0);
        let (xh, wh) = (hb(&x), hb(&w));
        let ring_h: Vec<H<fk_buffer>> = ring.iter().map(hb).collect();
        let ready_h: Vec<H<fk_event>> = ready.iter().map(|e| H(e.0)).collect();
        let done_h: Vec<H<fk_event>> = done.iter().map(|e| H(e.0)).collect();
        let scale = |i: usize| 1.0 + 0.25 * i as f64;
        let (to_consumer, from_producer) = mpsc::channel::<usize>();
        let (to_producer, acks) = mpsc::channel::<usize>();
        std::thread::scope(|sc| {
            let (ring_h, ready_h, done_h) = (&ring_h, &ready_h, &done_h);
            // producer: ring[i % slots] = x * scale(i), after the consumer's `done`
            sc.spawn(move || {
                let c = borrow_ctx(ctx_h);
                let sp = Stream::new(&c);
                for i in 0..n_iter {
                    let k = i % slots;
                    if i >= slots {
                        assert_eq!(acks.recv().expect("consumer alive"), i - slots);
                        check(
                            unsafe { fk_stream_wait_event(sp.0, done_h[k].0) },
                            "wait done",
                        );
                    }
                    check(
                        unsafe { fk_scalar_mul(xh.p(), re(scale(i)).scalar(), ring_h[k].0, sp.0) },
                        "fk_scalar_mul",
                    );
                    check(
                        unsafe { fk_event_record(ready_h[k].0, sp.0) },
                        "record ready",
                    );
                    to_consumer.send(i).expect("consumer alive");
                }
                sp.sync();
            });
            // consumer: z = ring[i % slots] + w once `ready` says the slot is written
            sc.spawn(move || {
                let c = borrow_ctx(ctx_h);
                let cs = Stream::new(&c);
                let z = Buf::new_on(&c, d, &[n as i64], cs.0);
                for i in from_producer {
                    let k = i % slots;
                    if i % 2 == 0 {
                        check(
                            unsafe { fk_stream_wait_event(cs.0, ready_h[k].0) },
                            "wait ready",
                        );
                    } else {
                        check(
                            unsafe { fk_event_synchronize(ready_h[k].0) },
                            "fk_event_synchronize",
                        );
                        let mut fin = -1;
                        check(
                            unsafe { fk_event_query(ready_h[k].0, &mut fin) },
                            "fk_event_query",
                        );
                        assert_eq!(fin, 1, "a synchronised event is complete");
                    }
                    check(unsafe { fk_add(ring_h[k].0, wh.p(), z.0, cs.0) }, "fk_add");
                    check(unsafe { fk_event_record(done_h[k].0, cs.0) }, "record done");
                    let _ = to_producer.send(i);
                    let got = read(&z, d, n, cs.0);
                    let want: Vec<Cx> = (0..n).map(|j| re(x0[j] * scale(i) + w0[j])).collect();
                    assert_close(&got, &want, tol(d), &format!("iteration {i}"));
                }
            });
        });
    });
}
