//! The linear-algebra family on CUDA against the CPU oracle, through the C ABI.
//!
//! Every test starts with `gpu()`: without a CUDA device it prints
//! "SKIPPED: no CUDA device" and returns, unless `FK_REQUIRE_GPU=1`. Under
//! `FK_SANITIZE=1` (compute-sanitizer) the sizes shrink.
//!
//! Covered: GEMM for every dtype and op pair on odd and aligned sizes, batches and
//! broadcasts, padded leading dimensions, beta = 0 over NaN, TF32 (tolerance 1e-3);
//! complex128 through cuBLAS's ZGEMM, including the sequence that used to crash
//! (docs/linalg.md); the fused linear layer forward (cuBLASLt epilogues and the
//! forced fallback) and backward per dtype and activation, the exact GELU also on
//! random odd shapes with and without aux; the Kronecker product
//! (every store width, outputs aligned to 16 bytes, to the element or to a complex
//! component, odd widths, batches, strided inputs); the chunked GEMM with pinned host
//! operands under small budgets (many tiles, rings of 2 and 3 buffers, both copy
//! streams); a CUDA graph capturing fusekit linear-algebra ops; and, with
//! `FK_TEST_HUGE=1`, a chunked product whose operands exceed the GPU's free memory.

mod common;
mod linalg_ref;

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::time::Instant;

use common::graph::{Graph, RawStream};
use common::*;
use cudarc::driver::{result as cu, sys};
use linalg_ref::*;

#[track_caller]
fn gemm_vs_cpu(
    g: &Ctx,
    cpu: &Ctx,
    case: &GemmCase,
    rng: &mut Rng,
    tol: f64,
    stream: *const fk_stream,
) {
    let d = case.data(rng);
    let want = case.run(cpu, &d, null(), None);
    let got = case.run(g, &d, stream, None);
    assert_close(
        &got,
        &want,
        tol,
        &format!("CUDA vs CPU: {}", case.describe()),
    );
}

/// The GEMM cases of a dtype: every op pair on odd and aligned sizes, then batches,
/// broadcasts, padded leading dimensions, beta = 0 over NaN, k = 0.
fn gemm_cases(dtype: fk_dtype) -> Vec<GemmCase> {
    let sizes: &[(i64, i64, i64)] = if sanitizing() {
        &[(1, 1, 1), (7, 5, 3)]
    } else {
        &[(1, 1, 1), (17, 13, 33), (64, 128, 96), (65, 129, 70)]
    };
    let mut v = Vec::new();
    for op_a in OPS {
        for op_b in OPS {
            for &(m, n, k) in sizes {
                v.push(GemmCase::new(dtype, op_a, op_b, m, n, k));
            }
        }
    }
    for (ba, bb, pad) in [
        (Some(3), Some(3), 0),
        (None, Some(3), 2),
        (Some(1), Some(3), 5),
        (Some(3), None, 1),
    ] {
        let mut c = GemmCase::new(dtype, FK_OP_T, FK_OP_N, 9, 11, 13);
        (c.batch_a, c.batch_b, c.batch_c, c.pad) = (ba, bb, Some(3), pad);
        v.push(c);
    }
    let mut c = GemmCase::new(dtype, FK_OP_N, FK_OP_C, 31, 17, 5);
    c.beta = re(0.0);
    v.push(c);
    v.push(GemmCase::new(dtype, FK_OP_N, FK_OP_N, 6, 7, 0));
    v
}

fn gemm_sweep(dtype: fk_dtype) {
    let Some(g) = gpu() else { return };
    let cpu = Ctx::cpu();
    let t0 = Instant::now();
    let mut rng = Rng::new(100 + dtype as u64);
    for c in gemm_cases(dtype) {
        gemm_vs_cpu(&g, &cpu, &c, &mut rng, tol(dtype), null());
    }
    println!(
        "gemm {}: every op pair and layout in {:?}",
        dname(dtype),
        t0.elapsed()
    );
}

#[test]
fn gemm_oracle_f16() {
    gemm_sweep(FK_DTYPE_F16);
}
#[test]
fn gemm_oracle_bf16() {
    gemm_sweep(FK_DTYPE_BF16);
}
#[test]
fn gemm_oracle_f32() {
    gemm_sweep(FK_DTYPE_F32);
}
#[test]
fn gemm_oracle_f64() {
    gemm_sweep(FK_DTYPE_F64);
}
#[test]
fn gemm_oracle_c64() {
    gemm_sweep(FK_DTYPE_C64);
}

/// complex128 through cuBLAS (`cublasGemmStridedBatchedEx`, CUDA_C_64F): every op
/// pair, odd sizes, batches, broadcasts, padded rows, beta = 0 over NaN, k = 0, and
/// products large enough for cuBLAS's tensor-core kernels, against the CPU oracle.
#[test]
fn gemm_oracle_c128() {
    gemm_sweep(FK_DTYPE_C128);
    let Some((g, cpu, mut rng)) = gpu_oracle(1128) else {
        return;
    };
    for (op_a, op_b, ba, bb, pad, beta0) in [
        (FK_OP_C, FK_OP_N, Some(2), None, 1, false),
        (FK_OP_N, FK_OP_C, None, Some(2), 0, true),
        (FK_OP_T, FK_OP_T, Some(2), Some(2), 2, false),
    ] {
        let mut c = GemmCase::new(FK_DTYPE_C128, op_a, op_b, 67, 65, 61);
        (c.batch_a, c.batch_b, c.batch_c, c.pad) = (ba, bb, Some(2), pad);
        if beta0 {
            c.beta = re(0.0);
        }
        gemm_vs_cpu(&g, &cpu, &c, &mut rng, tol(FK_DTYPE_C128), null());
    }
}

/// The sequence that crashed the process (SIGSEGV in cublasLtZZZMatmul) while
/// fusekit passed complex128 alpha / beta as an 8-byte aligned `[f64; 2]`: a 5x4x3
/// product, then 1x1x1 products and the rest of the complex128 sweep, each with
/// complex alpha and beta. cuBLAS loads these scalars with 16-byte aligned loads
/// (tests/c/c128_scalar_alignment.cu reproduces the fault in C).
#[test]
fn gemm_c128_sequence_that_crashed() {
    let Some((g, cpu, mut rng)) = gpu_oracle(128) else {
        return;
    };
    let mut cases = vec![GemmCase::new(FK_DTYPE_C128, FK_OP_N, FK_OP_N, 5, 4, 3)];
    cases.extend(gemm_cases(FK_DTYPE_C128));
    let unit = |c: &GemmCase| (c.m, c.n, c.k) == (1, 1, 1);
    assert!(
        cases.iter().skip(1).any(unit),
        "the sequence must contain a 1x1x1 product after others"
    );
    for c in &cases {
        gemm_vs_cpu(&g, &cpu, c, &mut rng, tol(FK_DTYPE_C128), null());
    }
}

#[test]
fn gemm_tf32_within_1e3_and_on_a_borrowed_stream() {
    let Some((g, cpu, mut rng)) = gpu_oracle(150) else {
        return;
    };
    let n = if sanitizing() { 64 } else { 384 };
    for dtype in [FK_DTYPE_F32, FK_DTYPE_C64] {
        let mut c = GemmCase::new(dtype, FK_OP_N, FK_OP_T, n, n + 1, n - 3);
        c.flags = FK_GEMM_ALLOW_TF32;
        gemm_vs_cpu(&g, &cpu, &c, &mut rng, 1e-3, null());
    }
    let raw = RawStream::create();
    {
        let s = raw.wrap(&g);
        let c = GemmCase::new(FK_DTYPE_F64, FK_OP_T, FK_OP_T, 33, 21, 40);
        gemm_vs_cpu(&g, &cpu, &c, &mut rng, 1e-12, s.raw());
        let owned = Stream::new(&g);
        gemm_vs_cpu(&g, &cpu, &c, &mut rng, 1e-12, owned.raw());
        // the owned stream's cuBLAS slot goes with it; a new one works
        drop(owned);
        let again = Stream::new(&g);
        gemm_vs_cpu(&g, &cpu, &c, &mut rng, 1e-12, again.raw());
    }
    drop(raw);
}

// ------------------------------------------------------------------ fused linear

fn linear_tol(dtype: fk_dtype, act: fk_activation) -> f64 {
    match (dtype, act) {
        // cuBLASLt's GELU epilogue may evaluate tanh differently from tanhf
        (FK_DTYPE_F32, FK_ACT_GELU_TANH) => 1e-4,
        (FK_DTYPE_F32, _) => 1e-5,
        _ => 1e-2,
    }
}

fn linear_cases(dtype: fk_dtype) -> Vec<LinearCase> {
    let shapes: Vec<(Vec<i64>, i64, i64)> = if sanitizing() {
        vec![(vec![3, 5], 7, 9), (vec![16], 32, 64)]
    } else {
        vec![
            (vec![3, 5], 7, 9),
            (vec![64], 128, 256),
            (vec![2, 33], 96, 130),
            (vec![257], 64, 8),
        ]
    };
    let mut v = Vec::new();
    for act in ACTS {
        for bias in [true, false] {
            for (lead, k, n) in &shapes {
                v.push(LinearCase {
                    dtype,
                    act,
                    lead: lead.clone(),
                    k: *k,
                    n: *n,
                    bias,
                });
            }
        }
    }
    v
}

fn linear_sweep(dtype: fk_dtype, fallback: bool) {
    let Some(g) = gpu() else { return };
    let cpu = Ctx::cpu();
    let mut rng = Rng::new(200 + dtype as u64 + fallback as u64);
    // a switch of this test's own context: the other tests' contexts keep cuBLASLt
    unsafe { &*g.raw() }
        .context()
        .cuda_dev()
        .set_linalg_fallback(fallback);
    for c in linear_cases(dtype) {
        let d = c.data(&mut rng);
        let want = c.forward(&cpu, &d, null());
        let (before, _) = fusekit::testing::lt_declines_on_this_thread();
        let got = c.forward(&g, &d, null());
        let what = format!("CUDA vs CPU (fallback {fallback}): {}", c.describe());
        let (after, why) = fusekit::testing::lt_declines_on_this_thread();
        if !fallback && after > before {
            // cuBLASLt must take the aligned half-precision layouts the benchmarks use
            let aligned = c.k % 64 == 0 && c.n % 64 == 0 && dtype != FK_DTYPE_F32;
            assert!(
                !aligned,
                "{what}: cuBLASLt declined the fused epilogue ({why})"
            );
            println!("{what}: fallback ({why})");
        }
        let tol = linear_tol(dtype, c.act);
        assert_close(&got.y, &want.y, tol, &what);
        if let (Some(ga), Some(wa)) = (&got.aux, &want.aux) {
            assert_close(ga, wa, tol, &format!("{what}: aux"));
        }
        // backward: both backends from the same saved tensor (the CPU's)
        let saved = match c.act {
            FK_ACT_RELU => Some(want.y.clone()),
            FK_ACT_GELU_TANH | FK_ACT_GELU_ERF => want.aux.clone(),
            _ => None,
        };
        let gw = c.backward(&cpu, &d, saved.as_deref(), null());
        let gg = c.backward(&g, &d, saved.as_deref(), null());
        let btol = if dtype == FK_DTYPE_F32 { 1e-5 } else { 1e-2 };
        assert_close(&gg.dx, &gw.dx, btol, &format!("{what}: dx"));
        assert_close(&gg.dw, &gw.dw, btol, &format!("{what}: dw"));
        assert_close(&gg.db, &gw.db, btol, &format!("{what}: db"));
    }
}

/// The exact GELU (cuBLASLt's `BIAS` epilogue, then fusekit's kernel; and the
/// forced fallback) on random odd shapes, with and without bias and aux: y against
/// the CPU and the f64 reference, aux against the CPU, y without aux the same as y
/// with it, and the backward against the CPU from the same saved pre-activation.
#[test]
fn linear_gelu_erf_random_odd_shapes() {
    let Some((g, cpu, mut rng)) = gpu_oracle(260) else {
        return;
    };
    let dev = unsafe { &*g.raw() }.context().cuda_dev();
    let cap = if sanitizing() { 40 } else { 300 };
    for fallback in [false, true] {
        dev.set_linalg_fallback(fallback);
        for dtype in LINEAR_DTYPES {
            for round in 0..6 {
                let mut odd = || 2 * rng.below(cap / 2) as i64 + 1;
                let lead = if round % 2 == 0 {
                    vec![odd()]
                } else {
                    vec![3, odd()]
                };
                let c = LinearCase {
                    dtype,
                    act: FK_ACT_GELU_ERF,
                    lead,
                    k: odd(),
                    n: odd(),
                    bias: round % 3 != 2,
                };
                let d = c.data(&mut rng);
                let what = format!("CUDA vs CPU (fallback {fallback}): {}", c.describe());
                let tol = linear_tol(dtype, c.act);
                let want = c.forward(&cpu, &d, null());
                let got = c.forward(&g, &d, null());
                assert_close(&got.y, &want.y, tol, &what);
                assert_close(&got.y, &c.y_ref(&d), tol, &format!("{what}: vs f64"));
                assert_close(
                    got.aux.as_ref().unwrap(),
                    want.aux.as_ref().unwrap(),
                    tol,
                    &format!("{what}: aux"),
                );
                // inference (no aux): z goes through y itself
                let lone = c.forward_aux(&g, &d, null(), false);
                assert_close(&lone.y, &got.y, tol, &format!("{what}: y without aux"));
                let gw = c.backward(&cpu, &d, want.aux.as_deref(), null());
                let gg = c.backward(&g, &d, want.aux.as_deref(), null());
                let btol = if dtype == FK_DTYPE_F32 { 1e-5 } else { 1e-2 };
                assert_close(&gg.dx, &gw.dx, btol, &format!("{what}: dx"));
                assert_close(&gg.dw, &gw.dw, btol, &format!("{what}: dw"));
                assert_close(&gg.db, &gw.db, btol, &format!("{what}: db"));
            }
        }
    }
    dev.set_linalg_fallback(false);
}

#[test]
fn linear_oracle_f16() {
    linear_sweep(FK_DTYPE_F16, false);
}
#[test]
fn linear_oracle_bf16() {
    linear_sweep(FK_DTYPE_BF16, false);
}
#[test]
fn linear_oracle_f32() {
    linear_sweep(FK_DTYPE_F32, false);
}

/// The epilogue-kernel path cuBLASLt-declined configurations take, forced for
/// every case (the flag is process-wide: tests running meanwhile may take it too,
/// which is also correct).
#[test]
fn linear_fallback_path_every_dtype() {
    for dtype in LINEAR_DTYPES {
        linear_sweep(dtype, true);
    }
}

// ------------------------------------------------------------------ Kronecker

#[test]
fn kron_oracle_every_dtype_and_layout() {
    let Some((g, cpu, mut rng)) = gpu_oracle(300) else {
        return;
    };
    let big: (&[i64], &[i64]) = if sanitizing() {
        (&[8, 8], &[8, 8])
    } else {
        (&[64, 64], &[64, 64])
    };
    let cases: Vec<(&[i64], &[i64])> = vec![
        big,
        (&[2, 3], &[4, 5]),
        (&[3, 7, 5], &[3, 4, 8]),
        (&[5, 3], &[2, 6, 16]),
        (&[3, 1, 2], &[1, 3, 9]),
    ];
    let layouts = [
        ("contiguous", "contiguous"),
        ("transposed", "reversed"),
        ("misaligned", "misaligned"),
    ];
    each_kron(&mut rng, &cases, &layouts, |dtype, k, what| {
        let want = k.run(&cpu, dtype, null());
        let got = k.run(&g, dtype, null());
        assert_close(&got, &want, tol(dtype), what);
    });
}

/// `fk_kron` into an output that starts `off` bytes into a poisoned device
/// allocation (0: 256-byte aligned); checks that no byte outside the output was
/// written and returns the output's values.
fn kron_at_offset(g: &Ctx, dtype: fk_dtype, k: &KronCase, off: usize) -> Vec<Cx> {
    let shape = &k.shape[..];
    let pa = Placed::input(g, dtype, &k.a);
    let pb = Placed::input(g, dtype, &k.b);
    let sz = dsize(dtype);
    let len = shape.iter().product::<i64>() as usize * sz;
    let storage = Buf::new(g, FK_DTYPE_F16, &[((off + len + 64) / 2) as i64]);
    storage.write_bytes(&vec![0xFFu8; storage.nbytes()]);
    let out = unsafe {
        Buf::wrap(
            g,
            (storage.data() as *mut u8).add(off) as *mut c_void,
            dtype,
            shape,
            None,
        )
    };
    let s = unsafe { fk_kron(pa.handle(), pb.handle(), out.raw(), null()) };
    ok_for(s, format_args!("fk_kron {} at offset {off}", dname(dtype)));
    drop(out);
    let bytes = storage.read_bytes();
    assert!(
        bytes[..off]
            .iter()
            .chain(&bytes[off + len..])
            .all(|&x| x == 0xFF),
        "fk_kron {} at offset {off} {shape:?}: a byte outside the output was written",
        dname(dtype)
    );
    decode(dtype, &bytes[off..off + len])
}

/// The store widths of the Kronecker kernel (kernels/linalg.cu): 16-byte stores when
/// the rows and the output are 16-byte aligned, narrower ones otherwise, the split
/// complex stores for an output aligned only to its components; row lengths that are
/// and are not multiples of the vector, units straddling segments (q < vector),
/// batches and broadcasts, strided inputs.
#[test]
fn kron_store_widths_alignments_and_odd_sizes() {
    let Some((g, cpu, mut rng)) = gpu_oracle(310) else {
        return;
    };
    let big: (&[i64], &[i64]) = if sanitizing() {
        (&[8, 16], &[8, 16])
    } else {
        (&[64, 64], &[64, 64])
    };
    let cases: Vec<(&[i64], &[i64])> = vec![
        big,
        (&[32, 16, 16], &[32, 16, 16]),
        (&[3, 5], &[7, 9]),
        (&[4, 6], &[3, 5]),
        (&[5, 9], &[4, 1]),
        (&[3, 8], &[2, 3]),
        (&[33, 1], &[17, 1]),
        (&[2, 40], &[3, 50]),
        (&[2, 3], &[300, 2]),
        (&[600, 1], &[3, 2]),
        (&[3, 7, 8], &[1, 5, 16]),
        (&[1, 9, 4], &[4, 11, 4]),
    ];
    // output offsets in bytes: 0, one element, 8, and those of a complex component
    let offsets = |dtype: fk_dtype| {
        let es = dsize(dtype);
        let comp = if matches!(dtype, FK_DTYPE_C64 | FK_DTYPE_C128) {
            es / 2
        } else {
            es
        };
        let mut offs = vec![0, es, 8, 16 - comp, comp];
        offs.retain(|o| o % comp == 0);
        offs.sort();
        offs.dedup();
        offs
    };
    let layouts = [("contiguous", "contiguous"), ("transposed", "reversed")];
    each_kron(&mut rng, &cases, &layouts, |dtype, k, what| {
        let want = k.run(&cpu, dtype, null());
        for off in offsets(dtype) {
            let got = kron_at_offset(&g, dtype, k, off);
            let what = format!("{what}, output at byte offset {off}");
            assert_close(&got, &want, tol(dtype), &what);
        }
    });
}

// ------------------------------------------------------------------ chunked GEMM

/// An operand in pinned host memory (cuMemHostAlloc), wrapped for `ctx`.
struct Pinned {
    wrap: Option<Buf>,
    ptr: *mut c_void,
    view: View,
    dtype: fk_dtype,
}

impl Pinned {
    fn new(ctx: &Ctx, dtype: fk_dtype, view: &View, bytes: &[u8]) -> Pinned {
        let n = (view.storage_len as usize * dsize(dtype)).max(1);
        let ptr = unsafe { cu::malloc_host(n, 0) }.expect("cuMemHostAlloc");
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr as *mut u8, bytes.len()) };
        // SAFETY: the allocation holds the view's storage; Drop frees it after the wrap.
        let wrap = Some(unsafe { view.wrap_at(ctx, dtype, ptr) });
        Pinned {
            wrap,
            ptr,
            view: view.clone(),
            dtype,
        }
    }
    fn read(&self) -> Vec<Cx> {
        let sz = dsize(self.dtype);
        let bytes = unsafe {
            std::slice::from_raw_parts(self.ptr as *const u8, self.view.storage_len as usize * sz)
        };
        self.view
            .offsets()
            .into_iter()
            .map(|o| decode(self.dtype, &bytes[o * sz..(o + 1) * sz])[0])
            .collect()
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.wrap.take();
        unsafe { cu::free_host(self.ptr) }.expect("cuMemFreeHost");
    }
}

/// Runs a chunked GEMM with `which` operands (a, b, c) in pinned host memory.
fn chunked_vs_cpu(
    g: &Ctx,
    cpu: &Ctx,
    case: &GemmCase,
    host: [bool; 3],
    budget: u64,
    rng: &mut Rng,
) {
    let d = case.data(rng);
    let want = case.run(cpu, &d, null(), None);
    let dt = case.dtype;
    let place_in = |h: bool, op: &Operand| -> (Option<Pinned>, Option<Placed>) {
        let bytes = encode(dt, &op.storage);
        if h {
            (Some(Pinned::new(g, dt, &op.view, &bytes)), None)
        } else {
            (None, Some(Placed::new(g, dt, &op.view, &bytes)))
        }
    };
    let (pa, da) = place_in(host[0], &d.a);
    let (pb, db) = place_in(host[1], &d.b);
    let c_op = {
        let sz = dsize(dt);
        let mut bytes = vec![0xFFu8; d.c_view.storage_len as usize * sz];
        for (o, v) in d.c_view.offsets().into_iter().zip(&d.c0) {
            bytes[o * sz..(o + 1) * sz].copy_from_slice(&encode(dt, &[*v]));
        }
        bytes
    };
    let (pc, dc) = if host[2] {
        (Some(Pinned::new(g, dt, &d.c_view, &c_op)), None)
    } else {
        (None, Some(Placed::new(g, dt, &d.c_view, &c_op)))
    };
    let h = |p: &Option<Pinned>, q: &Option<Placed>| {
        p.as_ref().map_or_else(
            || q.as_ref().unwrap().handle(),
            |p| p.wrap.as_ref().unwrap().raw(),
        )
    };
    let stream = Stream::new(g);
    let abc: (*const _, *const _, _) = (h(&pa, &da), h(&pb, &db), h(&pc, &dc));
    let s = unsafe { case.call(abc, Some(budget), stream.raw()) };
    ok_for(s, case.describe());
    stream.sync();
    let got = match &pc {
        Some(p) => p.read(),
        None => dc.as_ref().unwrap().read_checked(),
    };
    assert_close(
        &got,
        &want,
        tol(dt),
        &format!("chunked {host:?} budget {budget}: {}", case.describe()),
    );
}

#[test]
fn chunked_gemm_with_pinned_host_operands_under_small_budgets() {
    let Some((g, cpu, mut rng)) = gpu_oracle(400) else {
        return;
    };
    let (m, n, k) = if sanitizing() {
        (150, 140, 130)
    } else {
        (600, 520, 700)
    };
    for dtype in [FK_DTYPE_F32, FK_DTYPE_F64, FK_DTYPE_C64, FK_DTYPE_BF16] {
        for (op_a, op_b) in [(FK_OP_N, FK_OP_N), (FK_OP_T, FK_OP_C)] {
            for host in [
                [true, false, false],
                [false, true, true],
                [true, true, true],
            ] {
                // unlimited, and a budget of a few 128-element tiles (many tiles)
                for budget in [1u64 << 40, dsize(dtype) as u64 * (200 << 10)] {
                    let mut c = GemmCase::new(dtype, op_a, op_b, m, n, k);
                    c.pad = 3;
                    chunked_vs_cpu(&g, &cpu, &c, host, budget, &mut rng);
                }
            }
        }
    }
    // batches with a broadcast operand, beta = 0
    let mut c = GemmCase::new(FK_DTYPE_F32, FK_OP_N, FK_OP_T, 300, 200, 260);
    (c.batch_a, c.batch_b, c.batch_c) = (Some(2), None, Some(2));
    c.beta = re(0.0);
    chunked_vs_cpu(&g, &cpu, &c, [true, true, true], 600 << 10, &mut rng);
    // every operand on the device: a plain GEMM
    let c = GemmCase::new(FK_DTYPE_F64, FK_OP_N, FK_OP_N, 50, 40, 30);
    chunked_vs_cpu(&g, &cpu, &c, [false, false, false], 1, &mut rng);
    // a budget below the smallest tiles
    let a = Buf::new(&g, FK_DTYPE_F32, &[4, 4]);
    let pinned = Pinned::new(&g, FK_DTYPE_F32, &View::contiguous(&[4096, 4096]), &[]);
    let c2 = Buf::new(&g, FK_DTYPE_F32, &[4, 4096]);
    let pb = pinned.wrap.as_ref().unwrap().raw();
    let s = unsafe { product(a.raw(), pb, c2.raw(), Some(1000), null()) };
    // a is [4, 4] but b [4096, 4096]: the shape check comes first
    expect_status(s, FK_ERROR_SHAPE_MISMATCH, &["fk_gemm_chunked"]);
    let a = Buf::new(&g, FK_DTYPE_F32, &[4, 4096]);
    let s = unsafe { product(a.raw(), pb, c2.raw(), Some(1000), null()) };
    expect_status(
        s,
        FK_ERROR_OUT_OF_MEMORY,
        &["fk_gemm_chunked", "device_budget_bytes = 1000", "at least"],
    );
}

/// Times (s) of copying `bytes` host->device (from `h_src`) alone, device->host (to
/// `h_dst`) alone, and both at once on two streams, from pinned memory (CUDA events).
fn link_times(h_src: usize, h_dst: usize, bytes: usize) -> (f64, f64, f64) {
    unsafe {
        let d_a = cu::malloc_sync(bytes).expect("cuMemAlloc");
        let d_b = cu::malloc_sync(bytes).expect("cuMemAlloc");
        let s_up = cu::stream::create(cu::stream::StreamKind::NonBlocking).unwrap();
        let s_down = cu::stream::create(cu::stream::StreamKind::NonBlocking).unwrap();
        let ev = |_| cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).unwrap();
        let (e0, e_up, e_down) = (ev(0), ev(1), ev(2));
        let run = |up: bool, down: bool| -> f64 {
            cu::event::record(e0, s_up).unwrap();
            sys::cuStreamWaitEvent(s_down, e0, 0).result().unwrap();
            if up {
                sys::cuMemcpyHtoDAsync_v2(d_a, h_src as *const c_void, bytes, s_up)
                    .result()
                    .unwrap();
            }
            if down {
                sys::cuMemcpyDtoHAsync_v2(h_dst as *mut c_void, d_b, bytes, s_down)
                    .result()
                    .unwrap();
            }
            cu::event::record(e_up, s_up).unwrap();
            cu::event::record(e_down, s_down).unwrap();
            sys::cuEventSynchronize(e_up).result().unwrap();
            sys::cuEventSynchronize(e_down).result().unwrap();
            let t_up = cu::event::elapsed(e0, e_up).unwrap() as f64;
            let t_down = cu::event::elapsed(e0, e_down).unwrap() as f64;
            t_up.max(t_down) * 1e-3
        };
        let best = |up, down| {
            run(up, down);
            (0..3).map(|_| run(up, down)).fold(f64::INFINITY, f64::min)
        };
        let r = (best(true, false), best(false, true), best(true, true));
        for e in [e0, e_up, e_down] {
            cu::event::destroy(e).ok();
        }
        cu::stream::destroy(s_up).ok();
        cu::stream::destroy(s_down).ok();
        cu::free_sync(d_a).ok();
        cu::free_sync(d_b).ok();
        r
    }
}

/// `FK_TEST_HUGE=1`: a bf16 product whose host operands (A [M, K] and C [M, N] in
/// pinned memory) are 10% larger than the GPU's free memory, B on the device, under
/// an 8 GiB budget; sampled rows against an f64 reference. Prints each phase's time
/// and the achieved rate against the floor max(A up and C down at the measured rates
/// of the two directions at once, compute at 765 TFLOP/s), and the old serial floor
/// (every byte at the host-to-device rate). On an H100 (80 GB) with 128 GiB of host
/// RAM: about 93 GB pinned, a few seconds of GPU work, a minute or two in all
/// (pinning and filling the host memory dominate).
#[test]
fn chunked_gemm_larger_than_gpu_memory() {
    if std::env::var("FK_TEST_HUGE").as_deref() != Ok("1") {
        println!(
            "SKIPPED: set FK_TEST_HUGE=1 (needs ~1.1x the GPU's free memory in pinned host RAM)"
        );
        return;
    }
    let Some(g) = gpu() else { return };
    let t_all = Instant::now();
    let (k, n) = (8192i64, 8192i64);
    let (mut free, mut total) = (0u64, 0u64);
    ok(unsafe { fk_context_memory(g.raw(), &mut free, &mut total) });
    let host_avail = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024;
    let want_bytes = free + free / 10;
    let m = (want_bytes / (2 * (k + n) as u64)) as i64;
    let need = (m * (k + n) * 2) as u64 + (k * n * 2) as u64;
    if host_avail < need + need / 8 {
        println!(
            "SKIPPED: needs {} GiB of host RAM, {} GiB available",
            need >> 30,
            host_avail >> 30
        );
        return;
    }
    let gib = |b: f64| b / (1u64 << 30) as f64;
    println!(
        "M = {m}, K = N = {k}: A + C = {:.1} GiB in pinned host memory, GPU free {:.1} GiB of {:.1}, host available {:.1} GiB",
        gib((m * (k + n) * 2) as f64),
        gib(free as f64),
        gib(total as f64),
        gib(host_avail as f64)
    );
    let a_bytes = (m * k * 2) as usize;
    let c_bytes = (m * n * 2) as usize;
    let t0 = Instant::now();
    let a_ptr = unsafe { cu::malloc_host(a_bytes, 0) }.expect("cuMemHostAlloc A") as usize;
    let c_ptr = unsafe { cu::malloc_host(c_bytes, 0) }.expect("cuMemHostAlloc C") as usize;
    println!("pinned A and C in {:.1} s", t0.elapsed().as_secs_f64());
    // A[i, l] = ((7 i + 13 l) mod 17 - 8) / 8: exact in bf16, cheap to regenerate
    let a_val = |i: i64, l: i64| (((7 * i + 13 * l) % 17) - 8) as f64 / 8.0;
    let t0 = Instant::now();
    let threads = std::thread::available_parallelism().map_or(8, |x| x.get());
    std::thread::scope(|s| {
        for t in 0..threads as i64 {
            s.spawn(move || {
                // the 17 values of a row's period, then the row as repeats of them
                let table: Vec<u16> = (0..17)
                    .map(|r| half::bf16::from_f64((r - 8) as f64 / 8.0).to_bits())
                    .collect();
                let (r0, r1) = (m * t / threads as i64, m * (t + 1) / threads as i64);
                for i in r0..r1 {
                    let row = unsafe {
                        std::slice::from_raw_parts_mut(
                            (a_ptr + (i * k) as usize * 2) as *mut u16,
                            k as usize,
                        )
                    };
                    let mut r = (7 * i) % 17;
                    for v in row.iter_mut() {
                        *v = table[r as usize];
                        r += 13;
                        if r >= 17 {
                            r -= 17;
                        }
                    }
                }
            });
        }
    });
    println!("filled A in {:.1} s", t0.elapsed().as_secs_f64());
    // the host link: A up and C down, 1 GiB each, alone and at once
    let probe = (1usize << 30).min(a_bytes).min(c_bytes);
    let (t_up, t_down, t_both) = link_times(a_ptr, c_ptr, probe);
    let rate = |t: f64| probe as f64 / t / 1e9;
    println!(
        "host link (pinned, {} MiB): up {:.1} GB/s alone, down {:.1} GB/s alone, both at once {:.1} + {:.1} GB/s",
        probe >> 20,
        rate(t_up),
        rate(t_down),
        rate(t_both),
        rate(t_both)
    );
    let mut rng = Rng::new(500);
    let bv: Vec<Cx> = (0..k * n)
        .map(|_| quantize(FK_DTYPE_BF16, re(rng.uniform(-1.0, 1.0))))
        .collect();
    let b = Buf::from_vals(&g, FK_DTYPE_BF16, &[k, n], &bv);
    let a = unsafe { Buf::wrap(&g, a_ptr as *mut c_void, FK_DTYPE_BF16, &[m, k], None) };
    let c = unsafe { Buf::wrap(&g, c_ptr as *mut c_void, FK_DTYPE_BF16, &[m, n], None) };
    let stream = Stream::new(&g);
    let t0 = Instant::now();
    ok(unsafe { product(a.raw(), b.raw(), c.raw(), Some(8 << 30), stream.raw()) });
    stream.sync();
    let secs = t0.elapsed().as_secs_f64();
    let flops = 2.0 * (m * n * k) as f64;
    let moved = (a_bytes + c_bytes) as f64;
    let t_link =
        (a_bytes as f64 / probe as f64 * t_both).max(c_bytes as f64 / probe as f64 * t_both);
    let t_comp = flops / 765e12;
    let floor = t_link.max(t_comp);
    println!(
        "chunked GEMM: {secs:.2} s, {:.1} TFLOP/s, {:.1} GB/s host<->device ({:.1} up + {:.1} down); floor max(both directions at once = {t_link:.2} s, compute at 765 TFLOP/s = {t_comp:.2} s) = {floor:.2} s: {:.0}% of the floor's rate; old serial floor (all bytes at {:.1} GB/s) {:.2} s",
        flops / secs / 1e12,
        moved / secs / 1e9,
        a_bytes as f64 / secs / 1e9,
        c_bytes as f64 / secs / 1e9,
        100.0 * floor / secs,
        rate(t_up),
        moved / (probe as f64 / t_up)
    );
    let t0 = Instant::now();
    let rows: Vec<i64> = (0..48i64).map(|t| (t * 7919 * 104729) % m).collect();
    // the reference rows, l outer (B read in order)
    let refs: Vec<Vec<f64>> = {
        let rows = &rows;
        let bv = &bv;
        std::thread::scope(|s| {
            let hs: Vec<_> = rows
                .iter()
                .map(|&i| {
                    s.spawn(move || {
                        let mut acc = vec![0f64; n as usize];
                        for l in 0..k {
                            let x = a_val(i, l);
                            let brow = &bv[(l * n) as usize..((l + 1) * n) as usize];
                            for (o, bb) in acc.iter_mut().zip(brow) {
                                *o += x * bb.re;
                            }
                        }
                        acc
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    for (&i, want) in rows.iter().zip(&refs) {
        let row = unsafe {
            std::slice::from_raw_parts((c_ptr + (i * n) as usize * 2) as *const u16, n as usize)
        };
        let got: Vec<Cx> = row
            .iter()
            .map(|&b| re(half::bf16::from_bits(b).to_f64()))
            .collect();
        let want: Vec<Cx> = want.iter().map(|&w| re(w)).collect();
        assert_close(
            &got,
            &want,
            1e-2,
            &format!("row {i} of the huge chunked GEMM"),
        );
    }
    println!(
        "checked {} rows in {:.1} s; {:.0} s in all",
        rows.len(),
        t0.elapsed().as_secs_f64(),
        t_all.elapsed().as_secs_f64()
    );
    drop((a, c));
    unsafe {
        cu::free_host(a_ptr as *mut c_void).unwrap();
        cu::free_host(c_ptr as *mut c_void).unwrap();
    }
}

// ------------------------------------------------------------------ graphs

/// After one eager run (handles, workspace, algorithms, modules), fk_gemm and
/// fk_linear_forward are captured into a CUDA graph and replayed.
#[test]
fn cuda_graph_capture_of_linalg_ops() {
    let Some((g, cpu, mut rng)) = gpu_oracle(600) else {
        return;
    };
    let raw = RawStream::create();
    let s = raw.wrap(&g);
    let dt = FK_DTYPE_BF16;
    let (m, k, n) = (96i64, 64i64, 128i64);
    let xv = rand_vals(&mut rng, dt, (m * k) as usize);
    let wv = rand_vals(&mut rng, dt, (n * k) as usize);
    let bv = rand_vals(&mut rng, dt, n as usize);
    let run = |ctx: &Ctx, st: *const fk_stream, x: &Buf, w: &Buf, b: &Buf, y: &Buf, z: &Buf| unsafe {
        ok(fk_linear_forward(
            x.raw(),
            w.raw(),
            b.raw(),
            FK_ACT_RELU,
            y.raw(),
            null_mut(),
            st,
        ));
        // z = y^T y (n x n)
        ok(fk_gemm(
            FK_OP_T,
            FK_OP_N,
            re(1.0).scalar(),
            y.raw(),
            y.raw(),
            re(0.0).scalar(),
            z.raw(),
            0,
            st,
        ));
        let _ = ctx;
    };
    let mk = |ctx: &Ctx, st: *const fk_stream| {
        let x = Buf::new_on(ctx, dt, &[m, k], st);
        let w = Buf::new_on(ctx, dt, &[n, k], st);
        let b = Buf::new_on(ctx, dt, &[n], st);
        let y = Buf::new_on(ctx, dt, &[m, n], st);
        let z = Buf::new_on(ctx, dt, &[n, n], st);
        (x, w, b, y, z)
    };
    let (x, w, b, y, z) = mk(&g, s.raw());
    s.sync();
    x.write(&xv);
    w.write(&wv);
    b.write(&bv);
    run(&g, s.raw(), &x, &w, &b, &y, &z);
    s.sync();
    let graph = Graph::capture(raw.0, || run(&g, s.raw(), &x, &w, &b, &y, &z));
    z.write_bytes(&vec![0xFF; (n * n * 2) as usize]);
    graph.launch(raw.0);
    s.sync();
    let (cx_, cw, cb, cy, cz) = mk(&cpu, null());
    cx_.write(&xv);
    cw.write(&wv);
    cb.write(&bv);
    run(&cpu, null(), &cx_, &cw, &cb, &cy, &cz);
    assert_close(&z.read(), &cz.read(), 2e-2, "graph replay of linear + gemm");
    drop(graph);
    drop((x, w, b, y, z));
    drop(s);
    drop(raw);
}

// ------------------------------------------------------------------ one cuBLAS

/// The cuBLAS / cuBLASLt files mapped into this process (canonical paths).
fn mapped(prefix: &str) -> Vec<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut v: Vec<std::path::PathBuf> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(std::path::PathBuf::from)
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// fusekit maps exactly one cuBLAS / cuBLASLt pair, of one install and one version,
/// after GEMMs (cuBLAS, which calls into cuBLASLt for complex128). With
/// `FK_EXPECT_CUBLAS_DIR` (the GPU suite's `cublas_wheel_pair` step, which sets
/// `FK_CUBLAS_PATH` to the nvidia-cublas wheel while the toolkit's cuBLAS is on the
/// loader path) the pair must come from that folder.
#[test]
fn one_cublas_pair_per_process() {
    let Some((g, cpu, mut rng)) = gpu_oracle(4242) else {
        return;
    };
    for dtype in [FK_DTYPE_F32, FK_DTYPE_C128] {
        let c = GemmCase::new(dtype, FK_OP_N, FK_OP_T, 33, 17, 9);
        gemm_vs_cpu(&g, &cpu, &c, &mut rng, tol(dtype), null());
    }
    let (blas, lt, version) = fusekit::testing::loaded_pair().expect("cuBLAS loaded");
    println!("cuBLAS {version}: {} and {}", blas.display(), lt.display());
    assert_eq!(
        mapped("libcublas.so"),
        vec![blas.clone()],
        "cuBLAS files mapped"
    );
    assert_eq!(
        mapped("libcublasLt.so"),
        vec![lt.clone()],
        "cuBLASLt files mapped"
    );
    assert_eq!(blas.parent(), lt.parent(), "one install");
    if let Some(dir) = std::env::var_os("FK_EXPECT_CUBLAS_DIR") {
        let dir = std::path::PathBuf::from(dir).canonicalize().unwrap();
        assert_eq!(
            blas.parent(),
            Some(dir.as_path()),
            "FK_CUBLAS_PATH's folder"
        );
    }
}
