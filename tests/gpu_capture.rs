//! Every op family captured into a CUDA graph as its very first use, through the
//! C ABI, against the CPU oracle (docs/abi.md, "CUDA graphs").
//!
//! Each test makes a NEW CUDA context and a NEW stream (`cuStreamCreate`, wrapped
//! with `fk_stream_wrap`), allocates its buffers, then begins a global-mode capture
//! (the mode `torch.cuda.graph` uses) and makes the op's first call inside it: the
//! context's kernel modules, cuBLAS handles and the stream's workspace are all
//! created during the capture. The graph is instantiated and replayed twice on
//! new random inputs written into the captured input buffers (outputs poisoned
//! first), and compared with the CPU context's result on the same inputs. A last
//! test checks that the calls documented as not capturable return
//! `FK_ERROR_UNSUPPORTED` with a message and leave the capture valid.
//!
//! The tests run one at a time (a lock): a global-mode capture forbids unsafe
//! CUDA calls on every other thread of the process.
//!
//! Every test starts with `gpu()`: without a CUDA device it prints
//! "SKIPPED: no CUDA device" and returns, unless `FK_REQUIRE_GPU=1`.

mod common;

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::Mutex;

use common::graph::RawStream;
use common::*;
use cudarc::driver::{result as cu, sys};
use fusekit::abi::gaussian::*;
use fusekit::abi::geodesic::*;
use fusekit::abi::linalg::*;
use fusekit::abi::optim::*;

static SERIAL: Mutex<()> = Mutex::new(());

/// How an input (or an in/out buffer's initial value) is drawn.
#[derive(Clone, Copy)]
enum Gen {
    /// Components in ±[0.25, 2) times the scale.
    Signed(f64),
    /// `[n, n]`: `X X^T / n + I` (symmetric positive definite, well conditioned).
    Spd(usize),
}

fn draw(rng: &mut Rng, dtype: fk_dtype, numel: usize, g: Gen) -> Vec<Cx> {
    match g {
        Gen::Signed(s) => random_values(rng, dtype, numel, Domain::Signed)
            .into_iter()
            .map(|v| re(v.re * s))
            .collect(),
        Gen::Spd(n) => {
            let x: Vec<f64> = random_values(rng, dtype, n * n, Domain::Signed)
                .iter()
                .map(|v| v.re)
                .collect();
            let mut a = vec![re(0.0); n * n];
            for i in 0..n {
                for j in 0..n {
                    let s: f64 = (0..n).map(|k| x[i * n + k] * x[j * n + k]).sum();
                    a[i * n + j] = re(s / n as f64 + if i == j { 1.0 } else { 0.0 });
                }
            }
            a
        }
    }
}

/// The buffers of one call: inputs, outputs (in/out ones included), and GPU-only
/// workspaces (NULL on the CPU).
struct Args {
    i: Vec<*mut fk_buffer>,
    o: Vec<*mut fk_buffer>,
    w: Vec<*mut fk_buffer>,
    s: *const fk_stream,
}

struct Spec {
    name: &'static str,
    dtype: fk_dtype,
    inputs: Vec<(Vec<i64>, Gen)>,
    /// Outputs: shape, and the initial value of an in/out buffer (None: poisoned
    /// on the GPU before each launch, overwritten by the op).
    outputs: Vec<(Vec<i64>, Option<Gen>)>,
    /// GPU workspaces, in bytes.
    workspaces: Vec<usize>,
    tol: f64,
    call: Box<dyn Fn(&Args) -> fk_status>,
}

fn numel(shape: &[i64]) -> usize {
    shape.iter().product::<i64>() as usize
}

fn upload(b: &Buf, dtype: fk_dtype, v: &[Cx], s: *const fk_stream) {
    let bytes = encode(dtype, v);
    ok(unsafe {
        fk_buffer_copy_from_host(b.raw(), bytes.as_ptr() as *const c_void, bytes.len(), s)
    });
}

fn download(b: &Buf, dtype: fk_dtype, s: *const fk_stream) -> Vec<Cx> {
    let mut host = vec![0u8; b.nbytes()];
    ok(unsafe { fk_buffer_copy_to_host(b.raw(), host.as_mut_ptr() as *mut c_void, host.len(), s) });
    decode(dtype, &host)
}

/// Captures `spec`'s call on a fresh stream of the fresh context `g` as its first
/// use, replays it twice on new inputs and compares with the CPU.
fn capture_and_replay(g: &Ctx, spec: Spec, seed: u64) {
    let cpu = Ctx::cpu();
    let d = spec.dtype;
    let raw = RawStream::create();
    let s = raw.wrap(g);
    let ins: Vec<Buf> = spec
        .inputs
        .iter()
        .map(|(sh, _)| Buf::new_on(g, d, sh, s.raw()))
        .collect();
    let outs: Vec<Buf> = spec
        .outputs
        .iter()
        .map(|(sh, _)| Buf::new_on(g, d, sh, s.raw()))
        .collect();
    let wss: Vec<Buf> = spec
        .workspaces
        .iter()
        .map(|&b| Buf::new_on(g, FK_DTYPE_F64, &[(b.div_ceil(8)).max(1) as i64], s.raw()))
        .collect();
    s.sync();
    let gpu_args = Args {
        i: ins.iter().map(|b| b.raw()).collect(),
        o: outs.iter().map(|b| b.raw()).collect(),
        w: wss.iter().map(|b| b.raw()).collect(),
        s: s.raw(),
    };

    unsafe {
        cu::stream::begin_capture(
            raw.0,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        )
    }
    .expect("cuStreamBeginCapture");
    let st = (spec.call)(&gpu_args);
    let msg = if st == FK_OK {
        String::new()
    } else {
        last_error()
    };
    let ended = unsafe { cu::stream::end_capture(raw.0) };
    assert_eq!(
        st,
        FK_OK,
        "{}: the first call, inside the capture, failed: {}: {msg}",
        spec.name,
        status_name(st)
    );
    let graph = ended.unwrap_or_else(|e| {
        panic!(
            "{}: cuStreamEndCapture failed ({e:?}): the capture was invalidated",
            spec.name
        )
    });
    assert!(!graph.is_null(), "{}: empty graph", spec.name);
    let exec = unsafe { cu::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
        .unwrap_or_else(|e| panic!("{}: cuGraphInstantiate: {e:?}", spec.name));

    let mut rng = Rng::new(seed);
    for replay in 0..2 {
        let in_vals: Vec<Vec<Cx>> = spec
            .inputs
            .iter()
            .map(|(sh, gen_)| draw(&mut rng, d, numel(sh), *gen_))
            .collect();
        let out_init: Vec<Option<Vec<Cx>>> = spec
            .outputs
            .iter()
            .map(|(sh, gen_)| gen_.map(|gg| draw(&mut rng, d, numel(sh), gg)))
            .collect();
        for (b, v) in ins.iter().zip(&in_vals) {
            upload(b, d, v, s.raw());
        }
        for (b, v) in outs.iter().zip(&out_init) {
            match v {
                Some(v) => upload(b, d, v, s.raw()),
                None => {
                    let poison = vec![0xFFu8; b.nbytes()];
                    ok(unsafe {
                        fk_buffer_copy_from_host(
                            b.raw(),
                            poison.as_ptr() as *const c_void,
                            poison.len(),
                            s.raw(),
                        )
                    });
                }
            }
        }
        unsafe { cu::graph::launch(exec, raw.0) }.expect("cuGraphLaunch");
        s.sync();
        let got: Vec<Vec<Cx>> = outs.iter().map(|b| download(b, d, s.raw())).collect();

        // The oracle: the same call on the CPU context, same inputs.
        let c_ins: Vec<Buf> = spec
            .inputs
            .iter()
            .zip(&in_vals)
            .map(|((sh, _), v)| Buf::from_vals(&cpu, d, sh, v))
            .collect();
        let c_outs: Vec<Buf> = spec
            .outputs
            .iter()
            .zip(&out_init)
            .map(|((sh, _), v)| match v {
                Some(v) => Buf::from_vals(&cpu, d, sh, v),
                None => Buf::new(&cpu, d, sh),
            })
            .collect();
        let cpu_args = Args {
            i: c_ins.iter().map(|b| b.raw()).collect(),
            o: c_outs.iter().map(|b| b.raw()).collect(),
            w: vec![null_mut(); spec.workspaces.len()],
            s: null(),
        };
        ok((spec.call)(&cpu_args));
        for (k, (gv, cb)) in got.iter().zip(&c_outs).enumerate() {
            assert_close(
                gv,
                &cb.read(),
                spec.tol,
                &format!("{}: output {k}, graph replay {replay}", spec.name),
            );
        }
    }
    unsafe {
        cu::graph::exec_destroy(exec).unwrap();
        cu::graph::destroy(graph).unwrap();
    }
    drop((ins, outs, wss));
    drop(s);
    drop(raw);
}

fn run(spec: impl FnOnce(&Ctx) -> Spec, seed: u64) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = gpu() else { return };
    let sp = spec(&g);
    capture_and_replay(&g, sp, seed);
}

fn sg(s: f64) -> Gen {
    Gen::Signed(s)
}

const F32_TOL: f64 = 1e-4;
const F64_TOL: f64 = 1e-10;

// ------------------------------------------------------------------ elementwise

#[test]
fn capture_elementwise_first_use() {
    run(
        |_| Spec {
            name: "fk_mul + fk_axpby + fk_exp + fk_add",
            dtype: FK_DTYPE_F32,
            inputs: vec![(vec![1000], sg(1.0)), (vec![1000], sg(1.0))],
            outputs: vec![(vec![1000], None), (vec![1000], None), (vec![1000], None)],
            workspaces: vec![],
            tol: 1e-5,
            call: Box::new(|a| unsafe {
                let st = fk_mul(a.i[0], a.i[1], a.o[0], a.s);
                if st != FK_OK {
                    return st;
                }
                let st = fk_axpby(
                    re(0.5).scalar(),
                    a.o[0],
                    re(-0.25).scalar(),
                    a.i[1],
                    a.o[1],
                    a.s,
                );
                if st != FK_OK {
                    return st;
                }
                let st = fk_exp(a.o[1], a.o[2], a.s);
                if st != FK_OK {
                    return st;
                }
                fk_add(a.o[2], a.i[0], a.o[2], a.s)
            }),
        },
        1,
    );
}

// ------------------------------------------------------------------ linear algebra

fn linear_spec(act: fk_activation, name: &'static str) -> Spec {
    let (m, k, n) = (48i64, 40i64, 24i64);
    let gelu = act == FK_ACT_GELU_TANH || act == FK_ACT_GELU_ERF;
    let mut outputs = vec![
        (vec![m, n], None), // y
        (vec![m, k], None), // dx
        (vec![n, k], None), // dw
        (vec![n], None),    // db
    ];
    if gelu {
        outputs.push((vec![m, n], None)); // aux
    }
    Spec {
        name,
        dtype: FK_DTYPE_F32,
        // x, w, b, dy
        inputs: vec![
            (vec![m, k], sg(1.0)),
            (vec![n, k], sg(0.2)),
            (vec![n], sg(0.5)),
            (vec![m, n], sg(1.0)),
        ],
        outputs,
        workspaces: vec![],
        tol: F32_TOL,
        call: Box::new(move |a| unsafe {
            let aux = if gelu { a.o[4] } else { null_mut() };
            let st = fk_linear_forward(a.i[0], a.i[1], a.i[2], act, a.o[0], aux, a.s);
            if st != FK_OK {
                return st;
            }
            let saved = if gelu { aux } else { a.o[0] };
            fk_linear_backward(
                a.i[3], a.i[0], a.i[1], act, saved, a.o[1], a.o[2], a.o[3], a.s,
            )
        }),
    }
}

#[test]
fn capture_linear_relu_first_use() {
    run(
        |_| linear_spec(FK_ACT_RELU, "fk_linear_forward + backward (relu)"),
        2,
    );
}

#[test]
fn capture_linear_gelu_tanh_first_use() {
    run(
        |_| linear_spec(FK_ACT_GELU_TANH, "fk_linear_forward + backward (gelu_tanh)"),
        3,
    );
}

#[test]
fn capture_linear_gelu_erf_first_use() {
    run(
        |_| linear_spec(FK_ACT_GELU_ERF, "fk_linear_forward + backward (gelu_erf)"),
        3,
    );
}

#[test]
fn capture_gemm_first_use() {
    run(
        |_| Spec {
            name: "fk_gemm (f64, T x N, beta != 0)",
            dtype: FK_DTYPE_F64,
            inputs: vec![(vec![3, 37, 29], sg(1.0)), (vec![3, 37, 41], sg(1.0))],
            outputs: vec![(vec![3, 29, 41], Some(sg(1.0)))],
            workspaces: vec![],
            tol: F64_TOL,
            call: Box::new(|a| unsafe {
                fk_gemm(
                    FK_OP_T,
                    FK_OP_N,
                    re(0.75).scalar(),
                    a.i[0],
                    a.i[1],
                    re(-0.5).scalar(),
                    a.o[0],
                    0,
                    a.s,
                )
            }),
        },
        4,
    );
}

#[test]
fn capture_gemm_f32_first_use() {
    run(
        |_| Spec {
            name: "fk_gemm (f32)",
            dtype: FK_DTYPE_F32,
            inputs: vec![(vec![64, 48], sg(1.0)), (vec![48, 80], sg(1.0))],
            outputs: vec![(vec![64, 80], None)],
            workspaces: vec![],
            tol: F32_TOL,
            call: Box::new(|a| unsafe {
                fk_gemm(
                    FK_OP_N,
                    FK_OP_N,
                    re(1.0).scalar(),
                    a.i[0],
                    a.i[1],
                    re(0.0).scalar(),
                    a.o[0],
                    0,
                    a.s,
                )
            }),
        },
        5,
    );
}

#[test]
fn capture_kron_first_use() {
    run(
        |_| Spec {
            name: "fk_kron",
            dtype: FK_DTYPE_F64,
            inputs: vec![(vec![2, 3, 5], sg(1.0)), (vec![2, 4, 7], sg(1.0))],
            outputs: vec![(vec![2, 12, 35], None)],
            workspaces: vec![],
            tol: F64_TOL,
            call: Box::new(|a| unsafe { fk_kron(a.i[0], a.i[1], a.o[0], a.s) }),
        },
        6,
    );
}

// ------------------------------------------------------------------ gaussian

fn ws_bytes(g: &Ctx, dtype: fk_dtype, b: i64, n: i64) -> usize {
    let mut bytes = 0usize;
    ok(unsafe { fk_gaussian_backward_workspace_size(g.raw(), dtype, b, n, &mut bytes) });
    bytes
}

#[test]
fn capture_mahalanobis_first_use() {
    run(
        |g| {
            let (b, n) = (300i64, 17i64);
            Spec {
                name: "fk_mahalanobis_forward + backward",
                dtype: FK_DTYPE_F64,
                // points, means, chol, g
                inputs: vec![
                    (vec![b, 3], sg(1.0)),
                    (vec![n, 3], sg(1.0)),
                    (vec![n, 3, 3], sg(1.0)),
                    (vec![b, n], sg(1.0)),
                ],
                outputs: vec![
                    (vec![b, n], None),
                    (vec![b, 3], None),
                    (vec![n, 3], None),
                    (vec![n, 3, 3], None),
                ],
                workspaces: vec![ws_bytes(g, FK_DTYPE_F64, b, n)],
                tol: 1e-9,
                call: Box::new(|a| unsafe {
                    let st = fk_mahalanobis_forward(a.i[0], a.i[1], a.i[2], 1e-6, a.o[0], a.s);
                    if st != FK_OK {
                        return st;
                    }
                    fk_mahalanobis_backward(
                        a.i[0], a.i[1], a.i[2], 1e-6, a.i[3], a.o[1], a.o[2], a.o[3], a.w[0], a.s,
                    )
                }),
            }
        },
        7,
    );
}

#[test]
fn capture_gaussian_field_first_use() {
    run(
        |g| {
            let (b, n) = (257i64, 33i64);
            Spec {
                name: "fk_gaussian_field_forward + backward",
                dtype: FK_DTYPE_F64,
                // points, means, chol, weights, dout
                inputs: vec![
                    (vec![b, 3], sg(1.0)),
                    (vec![n, 3], sg(1.0)),
                    (vec![n, 3, 3], sg(1.0)),
                    (vec![n], sg(1.0)),
                    (vec![b], sg(1.0)),
                ],
                outputs: vec![
                    (vec![b], None),
                    (vec![b, 3], None),
                    (vec![n, 3], None),
                    (vec![n, 3, 3], None),
                    (vec![n], None),
                ],
                workspaces: vec![ws_bytes(g, FK_DTYPE_F64, b, n)],
                tol: 1e-9,
                call: Box::new(|a| unsafe {
                    let st = fk_gaussian_field_forward(
                        a.i[0], a.i[1], a.i[2], a.i[3], 1e-6, a.o[0], a.s,
                    );
                    if st != FK_OK {
                        return st;
                    }
                    fk_gaussian_field_backward(
                        a.i[0], a.i[1], a.i[2], a.i[3], 1e-6, a.i[4], a.o[1], a.o[2], a.o[3],
                        a.o[4], a.w[0], a.s,
                    )
                }),
            }
        },
        8,
    );
}

// ------------------------------------------------------------------ geodesic

fn christoffel_spec(d: i64, r: i64, name: &'static str) -> Spec {
    let b = 37i64;
    Spec {
        name,
        dtype: FK_DTYPE_F64,
        // v, U, W, g
        inputs: vec![
            (vec![b, d], sg(1.0)),
            (vec![d, r], sg(0.1)),
            (vec![d, r], sg(0.1)),
            (vec![b, d], sg(1.0)),
        ],
        outputs: vec![
            (vec![b, d], None),
            (vec![b, d], None),
            (vec![d, r], None),
            (vec![d, r], None),
        ],
        workspaces: vec![],
        tol: 1e-9,
        call: Box::new(|a| unsafe {
            let st = fk_christoffel_forward(a.i[0], a.i[1], a.i[2], 0.5, 0, a.o[0], a.s);
            if st != FK_OK {
                return st;
            }
            fk_christoffel_backward(
                a.i[0], a.i[1], a.i[2], a.i[3], 0.5, 0, a.o[1], a.o[2], a.o[3], a.s,
            )
        }),
    }
}

#[test]
fn capture_christoffel_first_use() {
    run(
        |_| christoffel_spec(64, 16, "fk_christoffel_forward + backward (fast kernels)"),
        9,
    );
}

#[test]
fn capture_christoffel_cublas_route_first_use() {
    run(
        |_| {
            christoffel_spec(
                96,
                48,
                "fk_christoffel_forward + backward (R > 32: cuBLAS route)",
            )
        },
        10,
    );
}

fn leapfrog_spec(d: i64, r: i64, name: &'static str) -> Spec {
    let (b, steps) = (29i64, 3i64);
    Spec {
        name,
        dtype: FK_DTYPE_F64,
        // x0, v0, f, U, W, mu, gx, gv
        inputs: vec![
            (vec![b, d], sg(1.0)),
            (vec![b, d], sg(1.0)),
            (vec![b, d], sg(0.5)),
            (vec![d, r], sg(0.1)),
            (vec![d, r], sg(0.1)),
            (vec![d], sg(0.1)),
            (vec![b, d], sg(1.0)),
            (vec![b, d], sg(1.0)),
        ],
        // x_out, v_out, traj, dx0, dv0, df, dU, dW
        outputs: vec![
            (vec![b, d], None),
            (vec![b, d], None),
            (vec![steps, 2, b, d], None),
            (vec![b, d], None),
            (vec![b, d], None),
            (vec![b, d], None),
            (vec![d, r], None),
            (vec![d, r], None),
        ],
        workspaces: vec![],
        tol: 1e-9,
        call: Box::new(move |a| unsafe {
            let (dt, c) = (0.05, 0.5);
            let st = fk_leapfrog_forward(
                a.i[0], a.i[1], a.i[2], a.i[3], a.i[4], a.i[5], dt, steps, c, 0, a.o[0], a.o[1],
                a.o[2], a.s,
            );
            if st != FK_OK {
                return st;
            }
            let st = fk_leapfrog_backward(
                a.i[1], a.i[2], a.i[3], a.i[4], a.i[5], dt, steps, c, 0, a.o[2], a.i[6], a.i[7],
                a.o[3], a.o[4], a.o[5], a.o[6], a.o[7], a.s,
            );
            if st != FK_OK {
                return st;
            }
            // and once without the trajectory (the recomputing backward)
            fk_leapfrog_backward(
                a.i[1],
                a.i[2],
                a.i[3],
                a.i[4],
                a.i[5],
                dt,
                steps,
                c,
                0,
                null(),
                a.i[6],
                a.i[7],
                a.o[3],
                a.o[4],
                a.o[5],
                a.o[6],
                a.o[7],
                a.s,
            )
        }),
    }
}

#[test]
fn capture_leapfrog_first_use() {
    run(
        |_| leapfrog_spec(64, 16, "fk_leapfrog_forward + backward (fast kernels)"),
        11,
    );
}

#[test]
fn capture_leapfrog_cublas_route_first_use() {
    run(
        |_| {
            leapfrog_spec(
                80,
                40,
                "fk_leapfrog_forward + backward (R > 32: cuBLAS route)",
            )
        },
        12,
    );
}

// ------------------------------------------------------------------ optimizer ops

#[test]
fn capture_shampoo_first_use() {
    run(
        |_| {
            let (bt, m, n) = (2i64, 24i64, 40i64);
            Spec {
                name: "fk_shampoo_stats + fk_shampoo_precondition",
                dtype: FK_DTYPE_F64,
                // grad, l_root, r_root
                inputs: vec![
                    (vec![bt, m, n], sg(1.0)),
                    (vec![bt, m, m], sg(0.2)),
                    (vec![bt, n, n], sg(0.2)),
                ],
                // L, R (in/out), out
                outputs: vec![
                    (vec![bt, m, m], Some(sg(1.0))),
                    (vec![bt, n, n], Some(sg(1.0))),
                    (vec![bt, m, n], None),
                ],
                workspaces: vec![],
                tol: F64_TOL,
                call: Box::new(|a| unsafe {
                    let st = fk_shampoo_stats(a.i[0], 0.25, 0.9, a.o[0], a.o[1], a.s);
                    if st != FK_OK {
                        return st;
                    }
                    fk_shampoo_precondition(a.i[1], a.i[0], a.i[2], a.o[2], 0, a.s)
                }),
            }
        },
        13,
    );
}

#[test]
fn capture_shampoo_stats_unbatched_first_use() {
    // batch 1: the SYRK path
    run(
        |_| Spec {
            name: "fk_shampoo_stats (SYRK)",
            dtype: FK_DTYPE_F32,
            inputs: vec![(vec![33, 20], sg(1.0))],
            outputs: vec![(vec![33, 33], Some(sg(1.0))), (vec![20, 20], Some(sg(1.0)))],
            workspaces: vec![],
            tol: F32_TOL,
            call: Box::new(|a| unsafe { fk_shampoo_stats(a.i[0], 1.0, 0.5, a.o[0], a.o[1], a.s) }),
        },
        14,
    );
}

#[test]
fn capture_shampoo_stats_tf32_first_use() {
    // fk_shampoo_stats_ex with FK_GEMM_ALLOW_TF32: the GEMM route on tensor cores
    // (about 1e-3 relative against the CPU's f32)
    run(
        |_| Spec {
            name: "fk_shampoo_stats_ex (TF32)",
            dtype: FK_DTYPE_F32,
            inputs: vec![(vec![300, 129], sg(1.0))],
            outputs: vec![
                (vec![300, 300], Some(sg(1.0))),
                (vec![129, 129], Some(sg(1.0))),
            ],
            workspaces: vec![],
            tol: 5e-3,
            call: Box::new(|a| unsafe {
                fk_shampoo_stats_ex(a.i[0], 1.0, 0.5, a.o[0], a.o[1], FK_GEMM_ALLOW_TF32, a.s)
            }),
        },
        17,
    );
}

#[test]
fn capture_matrix_power_newton_first_use() {
    for (n, p, seed) in [(40usize, -0.5, 15u64), (48, -0.25, 16)] {
        run(
            |_| Spec {
                name: "fk_matrix_power (Newton, tol = 0)",
                dtype: FK_DTYPE_F64,
                inputs: vec![(vec![n as i64, n as i64], Gen::Spd(n))],
                outputs: vec![(vec![n as i64, n as i64], None)],
                workspaces: vec![],
                tol: 1e-8,
                call: Box::new(move |a| unsafe {
                    let mut rep = std::mem::zeroed::<fk_matpow_report>();
                    let st = fk_matrix_power(
                        a.i[0],
                        p,
                        1e-6,
                        FK_MATPOW_NEWTON,
                        25,
                        0.0,
                        0,
                        a.o[0],
                        &mut rep,
                        a.s,
                    );
                    if st == FK_OK {
                        assert_eq!(rep.iterations, 25);
                        assert_eq!(rep.converged, 1);
                        assert!(rep.residual.is_nan());
                    }
                    st
                }),
            },
            seed,
        );
    }
}

#[test]
fn capture_per_sample_first_use() {
    for (steps, seed) in [(0i64, 17u64), (5, 18)] {
        run(
            |_| {
                let (b, din, dout) = (12i64, 20i64, 9i64);
                let sh = |last: i64| {
                    if steps == 0 {
                        vec![b, last]
                    } else {
                        vec![b, steps, last]
                    }
                };
                Spec {
                    name: "fk_per_sample_grads + norms + dp_clipped_grad_sum",
                    dtype: FK_DTYPE_F64,
                    inputs: vec![(sh(din), sg(1.0)), (sh(dout), sg(1.0))],
                    // per-sample grads, sq norms, clipped sum, its norms, clipped sum
                    // without norms
                    outputs: vec![
                        (vec![b, dout, din], None),
                        (vec![b], None),
                        (vec![dout, din], None),
                        (vec![b], None),
                        (vec![dout, din], None),
                    ],
                    workspaces: vec![],
                    tol: F64_TOL,
                    call: Box::new(|a| unsafe {
                        let st = fk_per_sample_grads(a.i[0], a.i[1], a.o[0], 0, a.s);
                        if st != FK_OK {
                            return st;
                        }
                        let st = fk_per_sample_grad_norms(a.i[0], a.i[1], a.o[1], a.s);
                        if st != FK_OK {
                            return st;
                        }
                        let st =
                            fk_dp_clipped_grad_sum(a.i[0], a.i[1], 3.0, a.o[2], a.o[3], 0, a.s);
                        if st != FK_OK {
                            return st;
                        }
                        fk_dp_clipped_grad_sum(a.i[0], a.i[1], 3.0, a.o[4], null_mut(), 0, a.s)
                    }),
                }
            },
            seed,
        );
    }
}

// ------------------------------------------------------------------ refused calls

/// The calls documented as not capturable return `FK_ERROR_UNSUPPORTED` with a
/// message naming the entry point, queue nothing, and leave the capture valid: a
/// capturable op after them is captured and the graph replays correctly.
#[test]
fn capture_refuses_non_capturable_calls_cleanly() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = gpu() else { return };
    let d = FK_DTYPE_F64;
    let n = 40i64;
    let raw = RawStream::create();
    let s = raw.wrap(&g);
    let mut rng = Rng::new(99);
    let av = draw(&mut rng, d, (n * n) as usize, Gen::Spd(n as usize));
    let a = Buf::new_on(&g, d, &[n, n], s.raw());
    let out = Buf::new_on(&g, d, &[n, n], s.raw());
    upload(&a, d, &av, s.raw());
    // chunked GEMM operands in pinned host memory (cuMemHostAlloc, wrapped for the
    // CUDA context: what fk_gemm_chunked streams tile by tile)
    let mut hosts: Vec<*mut c_void> = Vec::new();
    let mut mk_pinned = |shape: &[i64]| {
        let n = shape.iter().product::<i64>() as usize * 8; // f64
        let ptr = unsafe { cu::malloc_host(n, 0) }.expect("cuMemHostAlloc");
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0x3f, n) };
        hosts.push(ptr);
        let mut b = null_mut();
        ok(unsafe {
            fusekit::abi::core::fk_buffer_wrap(
                g.raw(),
                ptr,
                d,
                shape.len() as i32,
                shape.as_ptr(),
                null(),
                &mut b,
            )
        });
        b
    };
    let (pa, pb, pc) = (mk_pinned(&[8, 8]), mk_pinned(&[8, 8]), mk_pinned(&[8, 8]));
    s.sync();

    unsafe {
        cu::stream::begin_capture(
            raw.0,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        )
    }
    .expect("cuStreamBeginCapture");
    let mut rep = unsafe { std::mem::zeroed::<fk_matpow_report>() };
    // fk_matrix_power(A, -1/2, eps 1e-6) with `method`, `max_iter`, `tol`, into `out`
    let matpow = |a: &Buf,
                  out: &Buf,
                  method,
                  max_iter,
                  tol,
                  rep: *mut fk_matpow_report,
                  st: *mut fk_stream| unsafe {
        fk_matrix_power(
            a.raw(),
            -0.5,
            1e-6,
            method,
            max_iter,
            tol,
            0,
            out.raw(),
            rep,
            st,
        )
    };
    let eigh = matpow(&a, &out, FK_MATPOW_EIGH, 1, 0.0, &mut rep, s.raw());
    let eigh_msg = last_error();
    let newton_tol = matpow(&a, &out, FK_MATPOW_NEWTON, 30, 1e-9, &mut rep, s.raw());
    let newton_msg = last_error();
    // AUTO on a 40 x 40 inverse root picks Newton; with tol > 0 it is refused too
    let auto_small = matpow(&a, &out, FK_MATPOW_AUTO, 30, 1e-9, &mut rep, s.raw());
    let auto_msg = last_error();
    let chunked = unsafe {
        fk_gemm_chunked(
            FK_OP_N,
            FK_OP_N,
            re(1.0).scalar(),
            pa,
            pb,
            re(0.0).scalar(),
            pc,
            1 << 20,
            0,
            s.raw(),
        )
    };
    let chunked_msg = last_error();
    // A capturable call after the refusals: the capture must still be valid.
    let newton = matpow(&a, &out, FK_MATPOW_NEWTON, 25, 0.0, &mut rep, s.raw());
    let newton_err = if newton == FK_OK {
        String::new()
    } else {
        last_error()
    };
    let ended = unsafe { cu::stream::end_capture(raw.0) };

    for (st, msg, entry) in [
        (eigh, &eigh_msg, "fk_matrix_power"),
        (newton_tol, &newton_msg, "fk_matrix_power"),
        (auto_small, &auto_msg, "fk_matrix_power"),
        (chunked, &chunked_msg, "fk_gemm_chunked"),
    ] {
        assert_eq!(
            st,
            FK_ERROR_UNSUPPORTED,
            "{entry} under capture: {}: {msg}",
            status_name(st)
        );
        assert!(
            msg.contains(entry) && msg.contains("CUDA graph"),
            "message: {msg}"
        );
    }
    assert!(eigh_msg.contains("eigendecomposition"), "{eigh_msg}");
    assert!(newton_msg.contains("tol"), "{newton_msg}");
    assert_eq!(newton, FK_OK, "Newton tol = 0 under capture: {newton_err}");
    let graph = ended.expect("cuStreamEndCapture: the refusals invalidated the capture");
    let exec = unsafe { cu::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
        .expect("cuGraphInstantiate");
    unsafe { cu::graph::launch(exec, raw.0) }.expect("cuGraphLaunch");
    s.sync();
    // the graph computed A^(-1/2): check against the CPU
    let cpu = Ctx::cpu();
    let ca = Buf::from_vals(&cpu, d, &[n, n], &av);
    let co = Buf::new(&cpu, d, &[n, n]);
    ok(matpow(
        &ca,
        &co,
        FK_MATPOW_NEWTON,
        25,
        0.0,
        null_mut(),
        null_mut(),
    ));
    assert_close(
        &download(&out, d, s.raw()),
        &co.read(),
        1e-8,
        "graph after refusals",
    );
    // Outside a capture the refused calls run.
    ok(matpow(&a, &out, FK_MATPOW_EIGH, 1, 0.0, &mut rep, s.raw()));
    s.sync();
    unsafe {
        cu::graph::exec_destroy(exec).unwrap();
        cu::graph::destroy(graph).unwrap();
        fk_buffer_destroy(pa);
        fk_buffer_destroy(pb);
        fk_buffer_destroy(pc);
    }
    for p in hosts {
        unsafe { cu::free_host(p) }.expect("cuMemFreeHost");
    }
    drop((a, out));
    drop(s);
    drop(raw);
}
