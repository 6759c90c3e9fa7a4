//! The CUDA backend against the CPU oracle, through the C ABI.
//!
//! Every test starts with `gpu()`: without a CUDA device it prints
//! "SKIPPED: no CUDA device" and returns, unless `FK_REQUIRE_GPU=1`, which turns the
//! skip into a failure (for CI machines that must have run these).
//!
//! Covered: every op x dtype on odd sizes (1, 7, 1023, 4097, 1_000_003 elements),
//! broadcasting, non-contiguous (transposed, strided, reversed, zero-stride) and
//! misaligned views (data pointer one element off, so the 16-byte vector path is
//! off), the 64-bit index path, outputs poisoned before every run, device
//! mismatches, wraps of host / pinned memory, borrowed streams, a CUDA graph
//! captured from fusekit ops, warm-up, DLPack on CUDA, empty and ndim-0 buffers.

mod common;
mod elementwise_table;

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::time::Instant;

use common::graph::{Graph, RawStream};
use common::*;
use cudarc::driver::result as cu;
use elementwise_table::*;

/// Runs `op` on placed operands of one context; the output is freshly poisoned.
fn run_placed(
    ctx: &Ctx,
    op: Op,
    dtype: fk_dtype,
    a: &Placed,
    b: Option<&Placed>,
    out: &View,
    stream: *const fk_stream,
) -> Vec<Cx> {
    let o = Placed::poisoned(ctx, op.out_dtype(dtype), out);
    let s = unsafe {
        op.call(
            a.handle(),
            b.map_or(null_mut(), |b| b.handle()),
            o.handle(),
            stream,
        )
    };
    ok_for(s, format_args!("{} {}", op.name(), dname(dtype)));
    sync_stream(stream);
    o.read_checked()
}

/// Runs `case` on the GPU and on the CPU oracle and compares.
#[track_caller]
fn check_case(gpu: &Ctx, cpu: &Ctx, case: &Case, stream: *const fk_stream) {
    let want = case.run(cpu, null());
    let got = case.run(gpu, stream);
    assert_close(
        &got,
        &want,
        tol(case.dtype),
        &format!("CUDA vs CPU: {}", case.describe()),
    );
}

/// `op` on random operands in the layouts `va` and `vb` (`with_random_case`), into `out`:
/// CUDA against the CPU (`check_case`).
fn check_views(
    (g, cpu): (&Ctx, &Ctx),
    rng: &mut Rng,
    (op, dtype): (Op, fk_dtype),
    (va, vb): (View, View),
    out: &View,
) {
    with_random_case(rng, (op, dtype), (va, vb), out, |case| {
        check_case(g, cpu, case, null())
    });
}

// ------------------------------------------------------------------ oracle sweeps

/// Every op on odd sizes of one dtype; inputs are placed once per size and context.
fn sweep_sizes(dtype: fk_dtype) {
    let Some(g) = gpu() else { return };
    let cpu = Ctx::cpu();
    let t0 = Instant::now();
    let mut rng = Rng::new(1000 + dtype as u64);
    let shapes: [&[i64]; 6] = [&[1], &[7], &[3, 341], &[4097], &[17, 1, 3], &[1_000_003]];
    let shapes = if sanitizing() {
        &shapes[..5]
    } else {
        &shapes[..]
    };
    for &shape in shapes {
        let v = View::contiguous(shape);
        let a_signed = Operand::random(&mut rng, dtype, v.clone(), Domain::Signed);
        let a_pos = Operand::random(&mut rng, dtype, v.clone(), Domain::Positive);
        let b = Operand::random(&mut rng, dtype, v.clone(), Domain::Signed);
        let place = |ctx: &Ctx| {
            (
                Placed::input(ctx, dtype, &a_signed),
                Placed::input(ctx, dtype, &a_pos),
                Placed::input(ctx, dtype, &b),
            )
        };
        let (ga, gp, gb) = place(&g);
        let (ca, cp, cb) = place(&cpu);
        for op in Op::supported(dtype) {
            let positive = matches!(op.domain_a(), Domain::Positive);
            let (ga, ca) = if positive { (&gp, &cp) } else { (&ga, &ca) };
            let (gb, cb) = if op.is_binary() {
                (Some(&gb), Some(&cb))
            } else {
                (None, None)
            };
            let want = run_placed(&cpu, op, dtype, ca, cb, &v, null());
            let got = run_placed(&g, op, dtype, ga, gb, &v, null());
            assert_close(
                &got,
                &want,
                tol(dtype),
                &format!(
                    "CUDA vs CPU: {} {} shape {shape:?}",
                    op.name(),
                    dname(dtype)
                ),
            );
        }
    }
    println!(
        "{}: every op on every size in {:?}",
        dname(dtype),
        t0.elapsed()
    );
}

#[test]
fn oracle_sizes_f16() {
    sweep_sizes(FK_DTYPE_F16);
}
#[test]
fn oracle_sizes_bf16() {
    sweep_sizes(FK_DTYPE_BF16);
}
#[test]
fn oracle_sizes_f32() {
    sweep_sizes(FK_DTYPE_F32);
}
#[test]
fn oracle_sizes_f64() {
    sweep_sizes(FK_DTYPE_F64);
}
#[test]
fn oracle_sizes_c64() {
    sweep_sizes(FK_DTYPE_C64);
}
#[test]
fn oracle_sizes_c128() {
    sweep_sizes(FK_DTYPE_C128);
}

/// Broadcasting, strided, reversed, zero-stride and misaligned inputs and outputs.
fn sweep_layouts(dtype: fk_dtype) {
    let Some(g) = gpu() else { return };
    let cpu = Ctx::cpu();
    let mut rng = Rng::new(2000 + dtype as u64);
    let shape = [33i64, 65];
    let ins = layouts(&shape, true);
    let outs = layouts(&shape, false);
    for op in Op::supported(dtype) {
        // every input layout (b in another one), contiguous output
        for (i, (_, va)) in ins.iter().enumerate() {
            let vb = ins[(i + 1) % ins.len()].1.clone();
            let out = View::contiguous(&shape);
            check_views((&g, &cpu), &mut rng, (op, dtype), (va.clone(), vb), &out);
        }
        // every output layout; the misaligned output with aligned inputs
        for (_, vo) in &outs {
            let plain = (View::contiguous(&shape), View::contiguous(&shape));
            check_views((&g, &cpu), &mut rng, (op, dtype), plain, vo);
        }
        // broadcasting
        let pairs: &[(&[i64], &[i64])] = if op.is_binary() {
            &[
                (&[3, 1, 5], &[4, 1]),
                (&[], &[2, 3]),
                (&[4, 6], &[]),
                (&[129], &[7, 129]),
                (&[7, 1], &[1, 129]),
            ]
        } else {
            &[(&[], &[5, 3]), (&[129], &[7, 129]), (&[7, 1], &[7, 9])]
        };
        for &(sa, sb) in pairs {
            let so = if op.is_binary() {
                broadcast_shape(sa, sb).unwrap()
            } else {
                sb.to_vec()
            };
            let views = (View::contiguous(sa), View::reversed(sb));
            let out = View::contiguous(&so);
            check_views((&g, &cpu), &mut rng, (op, dtype), views, &out);
        }
    }
}

#[test]
fn oracle_layouts_f16() {
    sweep_layouts(FK_DTYPE_F16);
}
#[test]
fn oracle_layouts_bf16() {
    sweep_layouts(FK_DTYPE_BF16);
}
#[test]
fn oracle_layouts_f32() {
    sweep_layouts(FK_DTYPE_F32);
}
#[test]
fn oracle_layouts_f64() {
    sweep_layouts(FK_DTYPE_F64);
}
#[test]
fn oracle_layouts_c64() {
    sweep_layouts(FK_DTYPE_C64);
}
#[test]
fn oracle_layouts_c128() {
    sweep_layouts(FK_DTYPE_C128);
}

/// Large non-contiguous and misaligned cases (many blocks, grid-stride loops).
#[test]
fn oracle_large_strided_and_misaligned() {
    let Some((g, cpu, mut rng)) = gpu_oracle(3000) else {
        return;
    };
    let shape = if sanitizing() {
        [63i64, 65]
    } else {
        [1023i64, 1025]
    };
    for (op, dtype, va, vb, vo) in [
        (
            Op::Add,
            FK_DTYPE_F32,
            View::transposed(&shape),
            View::contiguous(&shape),
            View::contiguous(&shape),
        ),
        (
            Op::Mul,
            FK_DTYPE_F16,
            View::misaligned(&shape),
            View::misaligned(&shape),
            View::misaligned(&shape),
        ),
        (
            Op::Axpby(re(0.5), re(2.0)),
            FK_DTYPE_BF16,
            View::contiguous(&shape),
            View::contiguous(&shape),
            View::misaligned(&shape),
        ),
        (
            Op::Exp,
            FK_DTYPE_C64,
            View::reversed(&shape),
            View::contiguous(&shape),
            View::every_other(&shape),
        ),
        (
            Op::Div,
            FK_DTYPE_F64,
            View::zero_stride(&shape),
            View::every_other(&shape),
            View::transposed(&shape),
        ),
    ] {
        check_views((&g, &cpu), &mut rng, (op, dtype), (va, vb), &vo);
    }
}

/// A view reaching past 2^31 elements selects the kernels' 64-bit index path.
#[test]
fn sixty_four_bit_indexing() {
    let Some(g) = gpu() else { return };
    if sanitizing() {
        println!("SKIPPED under FK_SANITIZE: the 64-bit index test allocates 4 GiB");
        return;
    }
    let step = 1i64 << 30;
    let len = 2 * step + 1; // f16: 4 GiB + 2 bytes
    let (mut free, mut total) = (0u64, 0u64);
    ok(unsafe { fk_context_memory(g.raw(), &mut free, &mut total) });
    if free < (len as u64) * 2 + (1 << 30) {
        println!("SKIPPED: {free} bytes free, the 64-bit index test needs ~5 GiB");
        return;
    }
    let d = FK_DTYPE_F16;
    let storage = Buf::new(&g, d, &[len]);
    let base = storage.data() as *mut u8;
    let at = |i: i64| unsafe { base.add(i as usize * 2) } as *mut c_void;
    // Only the three elements the view touches are initialised, through 1-element wraps.
    let xs = [re(1.5), re(-2.0), re(0.25)];
    for (k, x) in xs.iter().enumerate() {
        let e = unsafe { Buf::wrap(&g, at(k as i64 * step), d, &[1], None) };
        e.write(&[*x]);
    }
    let huge = unsafe { Buf::wrap(&g, at(0), d, &[3], Some(&[step])) };
    let ys = [re(0.5), re(4.0), re(-1.0)];
    let b = Buf::from_vals(&g, d, &[3], &ys);
    let out = Buf::from_vals(&g, d, &[3], &[re(f64::NAN); 3]);
    ok(unsafe { fk_add(huge.raw(), b.raw(), out.raw(), null()) });
    let want: Vec<Cx> = xs.iter().zip(&ys).map(|(x, y)| x.add(*y)).collect();
    assert_eq!(out.read(), want, "strided 64-bit input");
    // ...and as a strided output (written through the same huge view).
    ok(unsafe { fk_neg(b.raw(), huge.raw(), null()) });
    for (k, y) in ys.iter().enumerate() {
        let e = unsafe { Buf::wrap(&g, at(k as i64 * step), d, &[1], None) };
        assert_eq!(
            e.read(),
            vec![y.neg()],
            "strided 64-bit output, element {k}"
        );
    }
    // A reversed huge view.
    let rev = unsafe { Buf::wrap(&g, at(2 * step), d, &[3], Some(&[-step])) };
    ok(unsafe { fk_copy(rev.raw(), out.raw(), null()) });
    assert_eq!(out.read(), vec![ys[2].neg(), ys[1].neg(), ys[0].neg()]);
}

// ------------------------------------------------------------------ contexts, devices

#[test]
fn cuda_context_queries_and_warmup() {
    let Some(g) = gpu() else { return };
    assert_eq!(g.device(), (FK_DEVICE_CUDA, 0));
    let mut needed = 0usize;
    ok(unsafe { fk_context_name(g.raw(), null_mut(), 0, &mut needed) });
    let mut buf = vec![0u8; needed];
    ok(unsafe { fk_context_name(g.raw(), buf.as_mut_ptr() as *mut _, needed, null_mut()) });
    let name = String::from_utf8(buf[..needed - 1].to_vec()).unwrap();
    let (mut ma, mut mi) = (0, 0);
    ok(unsafe { fk_context_compute_capability(g.raw(), &mut ma, &mut mi) });
    assert!(ma >= 5, "compute capability {ma}.{mi}");
    let (mut free, mut total) = (0u64, 0u64);
    ok(unsafe { fk_context_memory(g.raw(), &mut free, &mut total) });
    assert!(free > 0 && free <= total);
    println!("{name}: sm_{ma}{mi}, {free} of {total} bytes free");

    let t = Instant::now();
    ok(unsafe { fk_context_warmup(g.raw()) });
    println!("fk_context_warmup: {:?}", t.elapsed());
    let t = Instant::now();
    ok(unsafe { fk_context_warmup(g.raw()) });
    println!("fk_context_warmup again (cached): {:?}", t.elapsed());

    // AUTO picks the GPU; an ordinal past the last device is refused.
    let auto = Ctx::try_new(FK_DEVICE_AUTO, 0).unwrap();
    assert_eq!(auto.device(), (FK_DEVICE_CUDA, 0));
    let n = device_count();
    let mut c = null_mut();
    let s = unsafe { fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, n, &mut c) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_context_create", &format!("ordinal = {n}")],
    );

    // Owned streams have a CUstream; buffers report the device.
    let st = Stream::new(&g);
    assert!(!st.handle().is_null());
    st.sync();
    let b = Buf::new_on(&g, FK_DTYPE_F32, &[3], st.raw());
    assert_eq!(b.device(), (FK_DEVICE_CUDA, 0));
    drop(b);
}

#[test]
fn device_mismatches_are_refused() {
    let Some(g) = gpu() else { return };
    let cpu = Ctx::cpu();
    let d = FK_DTYPE_F32;
    let ga = Buf::new(&g, d, &[4]);
    let gb = Buf::new(&g, d, &[4]);
    let gout = Buf::new(&g, d, &[4]);
    let ca = Buf::new(&cpu, d, &[4]);
    let cout = Buf::new(&cpu, d, &[4]);
    // Operands, output or stream (the last cases) of another device; b is unused by
    // the unary ops.
    let (cs, gs) = (Stream::new(&cpu), Stream::new(&g));
    let cases: [(Op, [&Buf; 3], *const fk_stream, &[&str]); 6] = [
        (
            Op::Add,
            [&ca, &gb, &gout],
            null(),
            &["fk_add", "a is on cpu", "cuda:0"],
        ),
        (
            Op::Add,
            [&ga, &ca, &gout],
            null(),
            &["fk_add", "b is on cpu"],
        ),
        (
            Op::Add,
            [&ga, &gb, &cout],
            null(),
            &["fk_add", "a is on cuda:0", "runs on cpu"],
        ),
        (
            Op::Exp,
            [&ca, &gb, &gout],
            null(),
            &["fk_exp", "a is on cpu"],
        ),
        (
            Op::Mul,
            [&ga, &gb, &gout],
            cs.raw(),
            &["fk_mul", "stream is on cpu"],
        ),
        (
            Op::Neg,
            [&ca, &gb, &cout],
            gs.raw(),
            &["fk_neg", "stream is on cuda:0"],
        ),
    ];
    for (op, [a, b, out], stream, needles) in cases {
        let s = unsafe { op.call(a.raw(), b.raw(), out.raw(), stream) };
        expect_status(s, FK_ERROR_DEVICE_MISMATCH, needles);
    }
    let mut p = null_mut();
    let s = unsafe { fk_buffer_create(g.raw(), d, 1, [4i64].as_ptr(), cs.raw(), &mut p) };
    expect_status(s, FK_ERROR_DEVICE_MISMATCH, &["fk_buffer_create", "stream"]);
    let host = [0f32; 4];
    let s =
        unsafe { fk_buffer_copy_from_host(ga.raw(), host.as_ptr() as *const c_void, 16, cs.raw()) };
    expect_status(
        s,
        FK_ERROR_DEVICE_MISMATCH,
        &["fk_buffer_copy_from_host", "stream"],
    );
}

#[test]
fn wraps_of_host_and_pinned_memory() {
    let Some(g) = gpu() else { return };
    let d = FK_DTYPE_F32;
    // Plain host memory is not something a CUDA buffer can hold.
    let mut host = vec![1f32; 8];
    let mut p = null_mut();
    let s = unsafe {
        fk_buffer_wrap(
            g.raw(),
            host.as_mut_ptr() as *mut c_void,
            d,
            1,
            [8i64].as_ptr(),
            null(),
            &mut p,
        )
    };
    expect_status(
        s,
        FK_ERROR_DEVICE_MISMATCH,
        &["fk_buffer_wrap", "data", "cuda:0"],
    );
    assert!(p.is_null());

    // Pinned host memory is.
    let n = 1000usize;
    let pinned = unsafe { cu::malloc_host(n * 4, 0) }.expect("cuMemHostAlloc") as *mut f32;
    let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 100.0).collect();
    unsafe { std::ptr::copy_nonoverlapping(xs.as_ptr(), pinned, n) };
    {
        let w = unsafe { Buf::wrap(&g, pinned as *mut c_void, d, &[n as i64], None) };
        assert_eq!(w.device(), (FK_DEVICE_CUDA, 0));
        let out = Buf::new(&g, d, &[n as i64]);
        ok(unsafe { fk_scalar_mul(w.raw(), re(2.0).scalar(), out.raw(), null()) });
        let want: Vec<Cx> = xs.iter().map(|&x| re(2.0 * x as f64)).collect();
        assert_eq!(out.read(), want);
        // ...and written by a kernel (in place on the pinned memory).
        ok(unsafe { fk_neg(w.raw(), w.raw(), null()) });
        g.sync_default();
        let back = unsafe { std::slice::from_raw_parts(pinned, n) };
        assert!(back.iter().zip(&xs).all(|(b, x)| *b == -*x));
    }
    unsafe { cu::free_host(pinned as *mut c_void) }.expect("cuMemFreeHost");

    // A DLPack tensor on the CPU is refused by a CUDA context (and not deleted).
    let made = make_tensor(
        vec![0u8; 16],
        None,
        DLDataType {
            code: 2,
            bits: 32,
            lanes: 1,
        },
        &[4],
        None,
        DLDevice {
            device_type: K_DL_CPU,
            device_id: 0,
        },
    );
    let r = import_dlpack(&g, made.managed);
    assert!(r.is_err());
    expect_status(
        r.err().unwrap(),
        FK_ERROR_DEVICE_MISMATCH,
        &["fk_buffer_from_dlpack", "device type 1"],
    );
    assert_eq!(made.calls(), 0);
    unsafe { counting_deleter(made.managed) };
}

#[test]
fn empty_and_scalar_buffers() {
    let Some(g) = gpu() else { return };
    for dtype in DTYPES {
        for op in Op::supported(dtype) {
            let a = Buf::new(&g, dtype, &[0, 3]);
            let b = Buf::new(&g, dtype, &[3]);
            let out = Buf::new(&g, op.out_dtype(dtype), &[0, 3]);
            ok(unsafe { op.call(a.raw(), b.raw(), out.raw(), null()) });
            let e = unsafe { Buf::wrap(&g, null_mut(), op.out_dtype(dtype), &[0], None) };
            let a0 = Buf::new(&g, dtype, &[0]);
            ok(unsafe { op.call(a0.raw(), a0.raw(), e.raw(), null()) });
        }
        // ndim-0 operands
        let cpu = Ctx::cpu();
        let mut rng = Rng::new(4000 + dtype as u64);
        for op in Op::supported(dtype) {
            let v = View::contiguous(&[]);
            check_views(
                (&g, &cpu),
                &mut rng,
                (op, dtype),
                (v.clone(), v.clone()),
                &v,
            );
        }
    }
}

#[test]
fn in_place_and_validation_on_cuda() {
    let Some((g, cpu, mut rng)) = gpu_oracle(5000) else {
        return;
    };
    for dtype in DTYPES {
        let x = random_values(&mut rng, dtype, 4099, Domain::Signed);
        let y = random_values(&mut rng, dtype, 4099, Domain::Signed);
        let (alpha, beta) = if is_complex(dtype) {
            (cx(0.5, 1.0), cx(-2.0, 0.25))
        } else {
            (re(0.5), re(-2.0))
        };
        let mut results = Vec::new();
        for ctx in [&g, &cpu] {
            let a = Buf::from_vals(ctx, dtype, &[4099], &x);
            let b = Buf::from_vals(ctx, dtype, &[4099], &y);
            ok(unsafe { Op::Axpby(alpha, beta).call(a.raw(), b.raw(), a.raw(), null()) });
            ok(unsafe { fk_mul(a.raw(), b.raw(), b.raw(), null()) });
            ok(unsafe { fk_sin(b.raw(), b.raw(), null()) });
            results.push((a.read(), b.read()));
        }
        assert_close(&results[0].0, &results[1].0, tol(dtype), "in-place axpby");
        assert_close(
            &results[0].1,
            &results[1].1,
            tol(dtype),
            "in-place mul, sin",
        );
    }
    // Aliasing and self-overlap are refused on CUDA buffers as well.
    let d = FK_DTYPE_F32;
    let st = Buf::new(&g, d, &[16]);
    let base = st.data() as *mut f32;
    let a = unsafe { Buf::wrap(&g, base as *mut c_void, d, &[8], None) };
    let shifted = unsafe { Buf::wrap(&g, base.add(1) as *mut c_void, d, &[8], None) };
    let s = unsafe { fk_add(a.raw(), a.raw(), shifted.raw(), null()) };
    expect_status(s, FK_ERROR_ALIASING, &["fk_add", "out overlaps a"]);
    let zero = unsafe { Buf::wrap(&g, base as *mut c_void, d, &[8], Some(&[0])) };
    let s = unsafe { fk_exp(shifted.raw(), zero.raw(), null()) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_exp", "out has strides [0]"],
    );
}

#[test]
fn context_handle_destroyed_before_its_buffers() {
    let Some(g) = gpu() else { return };
    let st = Stream::new(&g);
    let a = Buf::from_vals(&g, FK_DTYPE_F64, &[3], &[re(1.0), re(2.0), re(3.0)]);
    let out = Buf::new_on(&g, FK_DTYPE_F64, &[3], st.raw());
    drop(g);
    ok(unsafe { fk_scalar_add(a.raw(), re(1.0).scalar(), out.raw(), st.raw()) });
    st.sync();
    assert_eq!(out.read(), vec![re(2.0), re(3.0), re(4.0)]);
    drop((a, out));
    drop(st);
}

// ------------------------------------------------------------------ streams, graphs

/// A raw CUstream made by the caller (cudarc) and wrapped; also an owned stream's
/// handle re-wrapped. Ops, allocations and copies queued there order with each other.
#[test]
fn borrowed_streams() {
    let Some((g, cpu, mut rng)) = gpu_oracle(6000) else {
        return;
    };
    let raw = RawStream::create();
    {
        let s = raw.wrap(&g);
        assert_eq!(s.handle(), raw.0 as *mut c_void);
        for dtype in [FK_DTYPE_F32, FK_DTYPE_C128, FK_DTYPE_BF16] {
            let n = if sanitizing() { 4099i64 } else { 100_003 };
            let x = random_values(&mut rng, dtype, n as usize, Domain::Signed);
            let y = random_values(&mut rng, dtype, n as usize, Domain::Signed);
            let a = Buf::new_on(&g, dtype, &[n], s.raw());
            let b = Buf::new_on(&g, dtype, &[n], s.raw());
            let out = Buf::new_on(&g, dtype, &[n], s.raw());
            let (xb, yb) = (encode(dtype, &x), encode(dtype, &y));
            ok(unsafe {
                fk_buffer_copy_from_host_async(
                    a.raw(),
                    xb.as_ptr() as *const c_void,
                    xb.len(),
                    s.raw(),
                )
            });
            ok(unsafe {
                fk_buffer_copy_from_host_async(
                    b.raw(),
                    yb.as_ptr() as *const c_void,
                    yb.len(),
                    s.raw(),
                )
            });
            ok(unsafe { fk_mul(a.raw(), b.raw(), out.raw(), s.raw()) });
            ok(unsafe { fk_tanh(out.raw(), out.raw(), s.raw()) });
            let mut host = vec![0u8; xb.len()];
            ok(unsafe {
                fk_buffer_copy_to_host_async(
                    out.raw(),
                    host.as_mut_ptr() as *mut c_void,
                    host.len(),
                    s.raw(),
                )
            });
            s.sync();
            let got = decode(dtype, &host);
            let ca = Buf::from_vals(&cpu, dtype, &[n], &x);
            let cb = Buf::from_vals(&cpu, dtype, &[n], &y);
            let co = Buf::new(&cpu, dtype, &[n]);
            ok(unsafe { fk_mul(ca.raw(), cb.raw(), co.raw(), null()) });
            ok(unsafe { fk_tanh(co.raw(), co.raw(), null()) });
            assert_close(&got, &co.read(), tol(dtype), "ops on a borrowed stream");
        }
        // The buffers allocated on `raw` are gone (freed on it) before it is destroyed.
    }
    drop(raw);

    // An owned stream's handle, wrapped a second time.
    let owned = Stream::new(&g);
    let h = owned.handle();
    assert!(!h.is_null());
    let again = Stream::wrap(&g, h);
    let a = Buf::from_vals(&g, FK_DTYPE_F64, &[2], &[re(1.0), re(4.0)]);
    let out = Buf::new_on(&g, FK_DTYPE_F64, &[2], owned.raw());
    ok(unsafe { fk_sqrt(a.raw(), out.raw(), again.raw()) });
    again.sync();
    assert_eq!(out.read(), vec![re(1.0), re(2.0)]);
    drop(out);
    drop(again);
    owned.sync();
}

/// Captures a chain of fusekit ops on a borrowed stream into a CUDA graph and
/// replays it on new inputs: the ops neither synchronise nor allocate (either would
/// invalidate the capture) and read their arguments only at launch (kernel params).
#[test]
fn cuda_graph_capture_of_fusekit_ops() {
    let Some(g) = gpu() else { return };
    let cpu = Ctx::cpu();
    ok(unsafe { fk_context_warmup(g.raw()) });
    let dtype = FK_DTYPE_F32;
    let n = 4097i64;
    let (alpha, beta) = (re(0.5), re(-0.25));
    let raw = RawStream::create();
    let s = raw.wrap(&g);
    let mk = || Buf::new_on(&g, dtype, &[n], s.raw());
    let (x, y, z, t1, t2, t3, out) = (mk(), mk(), mk(), mk(), mk(), mk(), mk());
    let chain = |x: &Buf,
                 y: &Buf,
                 z: &Buf,
                 t1: &Buf,
                 t2: &Buf,
                 t3: &Buf,
                 out: &Buf,
                 st: *const fk_stream| unsafe {
        ok(fk_mul(x.raw(), y.raw(), t1.raw(), st));
        ok(Op::Axpby(alpha, beta).call(t1.raw(), z.raw(), t2.raw(), st));
        ok(fk_exp(t2.raw(), t3.raw(), st));
        ok(fk_add(t3.raw(), x.raw(), out.raw(), st));
    };
    let mut rng = Rng::new(7000);
    let mut inputs = || {
        (
            random_values(&mut rng, dtype, n as usize, Domain::Signed),
            random_values(&mut rng, dtype, n as usize, Domain::Signed),
            random_values(&mut rng, dtype, n as usize, Domain::Signed),
        )
    };
    // One eager run first (module loading, first-use work happen outside the capture).
    let (xv, yv, zv) = inputs();
    x.write(&xv);
    y.write(&yv);
    z.write(&zv);
    chain(&x, &y, &z, &t1, &t2, &t3, &out, s.raw());
    s.sync();

    let graph = Graph::capture(raw.0, || chain(&x, &y, &z, &t1, &t2, &t3, &out, s.raw()));

    let oracle = |xv: &[Cx], yv: &[Cx], zv: &[Cx]| {
        let b = |v: &[Cx]| Buf::from_vals(&cpu, dtype, &[n], v);
        let (cx_, cy, cz) = (b(xv), b(yv), b(zv));
        let (c1, c2, c3, co) = (b(xv), b(xv), b(xv), b(xv));
        chain(&cx_, &cy, &cz, &c1, &c2, &c3, &co, null());
        co.read()
    };
    for replay in 0..2 {
        let (xv, yv, zv) = inputs();
        // New inputs, queued on the same stream before the launch.
        for (buf, v) in [(&x, &xv), (&y, &yv), (&z, &zv)] {
            let bytes = encode(dtype, v);
            ok(unsafe {
                fk_buffer_copy_from_host(
                    buf.raw(),
                    bytes.as_ptr() as *const c_void,
                    bytes.len(),
                    s.raw(),
                )
            });
        }
        // Poison the output: only the graph can make it right.
        out.write_bytes(&vec![0xFF; n as usize * 4]);
        graph.launch(raw.0);
        s.sync();
        let mut host = vec![0u8; n as usize * 4];
        ok(unsafe {
            fk_buffer_copy_to_host(
                out.raw(),
                host.as_mut_ptr() as *mut c_void,
                host.len(),
                s.raw(),
            )
        });
        assert_close(
            &decode(dtype, &host),
            &oracle(&xv, &yv, &zv),
            tol(dtype),
            &format!("graph replay {replay}"),
        );
    }
    drop(graph);
    drop((x, y, z, t1, t2, t3, out));
    drop(s);
    drop(raw);
}

// ------------------------------------------------------------------ DLPack

#[test]
fn dlpack_on_cuda() {
    let Some(g) = gpu() else { return };
    let b = Buf::from_vals(&g, FK_DTYPE_C64, &[2, 2], &[cx(1.0, 2.0); 4]);
    let m = export_dlpack(&b);
    unsafe {
        let t = &(*m).dl_tensor;
        assert_eq!(
            t.device,
            DLDevice {
                device_type: K_DL_CUDA,
                device_id: 0
            }
        );
        assert_eq!(t.data, b.data());
        assert_eq!(
            t.dtype,
            DLDataType {
                code: 5,
                bits: 64,
                lanes: 1
            }
        );
    }
    // Re-import on the CUDA context: same memory.
    let b2 = import_dlpack(&g, m).unwrap();
    assert_eq!(b2.data(), b.data());
    assert_eq!(b2.device(), (FK_DEVICE_CUDA, 0));
    drop(b);
    assert_eq!(b2.read(), vec![cx(1.0, 2.0); 4]);
    drop(b2);

    // A producer's CUDA tensor of another ordinal is refused, and not deleted.
    let dev = Buf::new(&g, FK_DTYPE_F32, &[4]);
    let made = make_tensor(
        Vec::new(),
        Some(dev.data()),
        DLDataType {
            code: 2,
            bits: 32,
            lanes: 1,
        },
        &[4],
        None,
        DLDevice {
            device_type: K_DL_CUDA,
            device_id: device_count(),
        },
    );
    let r = import_dlpack(&g, made.managed);
    expect_status(
        r.err().unwrap(),
        FK_ERROR_DEVICE_MISMATCH,
        &["fk_buffer_from_dlpack"],
    );
    assert_eq!(made.calls(), 0);
    // With the right ordinal it is imported, and deleted once with its buffer.
    unsafe { (*made.managed).dl_tensor.device.device_id = 0 };
    let imp = import_dlpack(&g, made.managed).unwrap();
    imp.write(&[re(1.0), re(2.0), re(3.0), re(4.0)]);
    assert_eq!(dev.read(), vec![re(1.0), re(2.0), re(3.0), re(4.0)]);
    drop(imp);
    assert_eq!(made.calls(), 1);
}
