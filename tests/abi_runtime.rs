//! The runtime C ABI on the CPU backend (no GPU needed): memory statistics and the
//! growable stats struct, pinned buffers (ordinary host buffers on the CPU), copies
//! between every pair of buffers the CPU has, events (host timestamps), the
//! single-rank communicator and its collectives with checked values, and every bad
//! input with its status and message.

mod common;

use std::ptr::{null, null_mut};
use std::time::Duration;

use common::runtime::*;
use common::*;

// ------------------------------------------------------------------ header constants

#[test]
fn header_constants_match() {
    let h = Header::read();
    let define = |name: &str| h.define(name);
    assert_eq!(define("FK_DEVICE_CUDA_HOST"), 3);
    assert_eq!(FK_DEVICE_CUDA_HOST, 3);
    assert_eq!(define("FK_COMM_ID_BYTES"), 128);
    assert_eq!(FK_COMM_ID_BYTES, 128);
    for (name, v) in [
        ("FK_REDUCE_SUM", FK_REDUCE_SUM),
        ("FK_REDUCE_PROD", FK_REDUCE_PROD),
        ("FK_REDUCE_MAX", FK_REDUCE_MAX),
        ("FK_REDUCE_MIN", FK_REDUCE_MIN),
    ] {
        assert_eq!(define(name), v as i64, "{name}");
    }
    assert!(h.0.contains("} fk_memory_stats;"));
    assert!(h.0.contains("typedef struct fk_event fk_event;"));
    assert!(h.0.contains("typedef struct fk_comm fk_comm;"));
}

// ------------------------------------------------------------------ memory statistics

#[test]
fn memory_stats_follow_allocations() {
    let ctx = Ctx::cpu();
    let s0 = stats(&ctx);
    assert_eq!(s0.allocated_bytes, 0);
    assert_eq!(s0.live_allocations, 0);
    assert_eq!(s0.peak_allocated_bytes, 0);
    assert_eq!(s0.reserved_bytes, 0);
    assert_eq!(s0.pinned_bytes, 0);
    assert_eq!(
        s0.release_threshold_bytes,
        u64::MAX,
        "default threshold: keep everything"
    );
    assert!(s0.device_total_bytes > 0 && s0.device_free_bytes <= s0.device_total_bytes);

    let a = Buf::new(&ctx, FK_DTYPE_F32, &[1000]);
    let b = Buf::new(&ctx, FK_DTYPE_C128, &[3, 5]);
    let s1 = stats(&ctx);
    assert_eq!(s1.allocated_bytes, 4000 + 15 * 16);
    assert_eq!(s1.live_allocations, 2);
    assert_eq!(s1.peak_allocated_bytes, 4240);
    assert_eq!(
        s1.reserved_bytes, s1.allocated_bytes,
        "CPU: reserved = allocated"
    );
    assert_eq!(s1.peak_reserved_bytes, s1.peak_allocated_bytes);
    assert_eq!(s1.pool_used_bytes, s1.allocated_bytes);
    drop(a);
    let s2 = stats(&ctx);
    assert_eq!(s2.allocated_bytes, 240);
    assert_eq!(s2.live_allocations, 1);
    assert_eq!(s2.peak_allocated_bytes, 4240, "the peak stays");
    drop(b);
    let s3 = stats(&ctx);
    assert_eq!((s3.allocated_bytes, s3.live_allocations), (0, 0));

    // Pinned on a CPU context is an ordinary host buffer, counted as one.
    let p = pinned(&ctx, FK_DTYPE_F64, &[10]);
    assert_eq!(p.device(), (FK_DEVICE_CPU, 0));
    assert_eq!(stats(&ctx).allocated_bytes, 80);
    assert_eq!(stats(&ctx).pinned_bytes, 0);
    drop(p);

    // Another context has its own counters.
    let other = Ctx::cpu();
    let _x = Buf::new(&other, FK_DTYPE_F32, &[8]);
    assert_eq!(stats(&ctx).allocated_bytes, 0);
    assert_eq!(stats(&other).allocated_bytes, 32);
}

#[test]
fn release_threshold_and_trim_on_cpu() {
    let ctx = Ctx::cpu();
    ok(unsafe { fk_context_set_release_threshold(ctx.0, 12345) });
    assert_eq!(stats(&ctx).release_threshold_bytes, 12345);
    ok(unsafe { fk_context_set_release_threshold(ctx.0, 0) });
    assert_eq!(stats(&ctx).release_threshold_bytes, 0);
    let _b = Buf::new(&ctx, FK_DTYPE_F32, &[16]);
    ok(unsafe { fk_context_trim(ctx.0, 0) });
    assert_eq!(
        stats(&ctx).allocated_bytes,
        64,
        "trim frees nothing that is in use"
    );

    expect_status(
        unsafe { fk_context_set_release_threshold(null(), 1) },
        FK_ERROR_NULL_POINTER,
        &["fk_context_set_release_threshold", "ctx is NULL"],
    );
    expect_status(
        unsafe { fk_context_trim(null(), 0) },
        FK_ERROR_NULL_POINTER,
        &["fk_context_trim", "ctx is NULL"],
    );
    let b = Buf::new(&ctx, FK_DTYPE_F32, &[1]);
    expect_status(
        unsafe { fk_context_trim(b.0 as *const fk_context, 0) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_context_trim", "ctx is not a live fk_context"],
    );
}

#[test]
fn memory_stats_struct_grows_compatibly() {
    let ctx = Ctx::cpu();
    let _b = Buf::new(&ctx, FK_DTYPE_F32, &[25]);
    let full = std::mem::size_of::<fk_memory_stats>();
    assert_eq!(full, 8 + 11 * 8, "size_t + 11 uint64_t fields");

    // An older caller that knows only the first three fields: the rest of its
    // memory (here: our poison) is never written.
    const POISON: u64 = 0xdead_beef_dead_beef;
    let mut raw = [POISON; 16];
    raw[0] = 8 + 3 * 8; // size
    ok(unsafe { fk_context_memory_stats(ctx.0, raw.as_mut_ptr() as *mut fk_memory_stats) });
    assert_eq!(raw[0], 32, "size is left as the caller set it");
    assert_eq!(raw[1], 100, "allocated_bytes");
    assert_eq!(raw[2], 100, "peak_allocated_bytes");
    assert_eq!(raw[3], 100, "reserved_bytes");
    assert!(
        raw[4..].iter().all(|&w| w == POISON),
        "wrote past size: {raw:x?}"
    );

    // A size that ends inside a field: only whole fields are written.
    let mut raw = [POISON; 16];
    raw[0] = 8 + 8 + 4;
    ok(unsafe { fk_context_memory_stats(ctx.0, raw.as_mut_ptr() as *mut fk_memory_stats) });
    assert_eq!(raw[1], 100);
    assert_eq!(raw[2], POISON);

    // A newer caller with a longer struct: our fields are filled, its extra ones
    // are left alone.
    let mut raw = [POISON; 16];
    raw[0] = (16 * 8) as u64;
    ok(unsafe { fk_context_memory_stats(ctx.0, raw.as_mut_ptr() as *mut fk_memory_stats) });
    assert_eq!(raw[0], 128);
    assert_eq!(raw[6], 1, "live_allocations");
    assert!(raw[12..].iter().all(|&w| w == POISON));

    // Too small to hold any field.
    for size in [0usize, 1, 8, 15] {
        let mut raw = [POISON; 4];
        raw[0] = size as u64;
        expect_status(
            unsafe { fk_context_memory_stats(ctx.0, raw.as_mut_ptr() as *mut fk_memory_stats) },
            FK_ERROR_INVALID_ARGUMENT,
            &[
                "fk_context_memory_stats",
                &format!("stats->size = {size}"),
                "sizeof(fk_memory_stats) = 96",
            ],
        );
        assert!(raw[1..].iter().all(|&w| w == POISON));
    }
    expect_status(
        unsafe { fk_context_memory_stats(ctx.0, null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["fk_context_memory_stats", "stats is NULL"],
    );
    let mut s = fk_memory_stats {
        size: full,
        ..Default::default()
    };
    expect_status(
        unsafe { fk_context_memory_stats(null(), &mut s) },
        FK_ERROR_NULL_POINTER,
        &["fk_context_memory_stats", "ctx is NULL"],
    );
}

// ------------------------------------------------------------------ pinned buffers

#[test]
fn pinned_on_cpu_is_a_host_buffer() {
    let ctx = Ctx::cpu();
    let p = pinned(&ctx, FK_DTYPE_F32, &[2, 3]);
    assert_eq!(p.shape(), vec![2, 3]);
    assert_eq!(p.dtype(), FK_DTYPE_F32);
    assert!(p.is_contiguous());
    // Direct host access through the data pointer.
    let data = p.data() as *mut f32;
    for i in 0..6 {
        unsafe { *data.add(i) = i as f32 * 1.5 };
    }
    assert_eq!(p.read(), ramp(6, 1.5, 0.0));
    // An op accepts it (it is not pinned memory on the CPU).
    let out = Buf::new(&ctx, FK_DTYPE_F32, &[2, 3]);
    ok(unsafe { fk_neg(p.0, out.0, null()) });
    assert_eq!(out.read(), ramp(6, -1.5, 0.0));

    let shape = [4i64];
    let mut o = null_mut();
    expect_status(
        unsafe { fk_buffer_create_pinned(ctx.0, 42, 1, shape.as_ptr(), &mut o) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_create_pinned", "dtype = 42"],
    );
    expect_status(
        unsafe { fk_buffer_create_pinned(ctx.0, FK_DTYPE_F32, 9, shape.as_ptr(), &mut o) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_create_pinned", "ndim = 9"],
    );
    expect_status(
        unsafe { fk_buffer_create_pinned(ctx.0, FK_DTYPE_F32, 1, null(), &mut o) },
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_create_pinned", "shape is NULL"],
    );
    let neg = [-3i64];
    expect_status(
        unsafe { fk_buffer_create_pinned(ctx.0, FK_DTYPE_F32, 1, neg.as_ptr(), &mut o) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_create_pinned", "-3"],
    );
    expect_status(
        unsafe { fk_buffer_create_pinned(ctx.0, FK_DTYPE_F32, 1, shape.as_ptr(), null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_create_pinned", "out is NULL"],
    );
    expect_status(
        unsafe { fk_buffer_create_pinned(null(), FK_DTYPE_F32, 1, shape.as_ptr(), &mut o) },
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_create_pinned", "ctx is NULL"],
    );
    assert!(o.is_null());
}

// ------------------------------------------------------------------ copies

#[test]
fn copies_between_cpu_buffers() {
    let ctx = Ctx::cpu();
    let other = Ctx::cpu();
    let s = Stream::new(&ctx);
    let mut rng = Rng::new(7);
    for dtype in DTYPES {
        let vals: Vec<Cx> = random_values(&mut rng, dtype, 37, Domain::Signed)
            .into_iter()
            .map(|v| quantize(dtype, v))
            .collect();
        let src = Buf::from_vals(&ctx, dtype, &[37], &vals);
        // owned -> owned (another context), NULL stream
        let a = Buf::new(&other, dtype, &[37]);
        ok(copy(&a, &src, null()));
        assert_eq!(a.read(), vals, "{}", dname(dtype));
        // owned -> "pinned" (host on CPU), CPU stream
        let p = pinned(&ctx, dtype, &[37]);
        ok(copy(&p, &a, s.0));
        assert_eq!(p.read(), vals);
        // -> a wrap of caller memory with another shape of the same size
        let mut host = vec![0u8; 37 * dsize(dtype)];
        let w = unsafe { Buf::wrap_host(&ctx, &mut host, dtype, &[1, 37], None) };
        ok(copy(&w, &p, null()));
        drop(w);
        assert_eq!(decode(dtype, &host), vals);
    }
    // Empty buffers copy nothing and succeed.
    let e1 = Buf::new(&ctx, FK_DTYPE_F32, &[0, 3]);
    let e2 = Buf::new(&ctx, FK_DTYPE_F32, &[0]);
    ok(copy(&e1, &e2, null()));
    // The same buffer is a no-op.
    let x = Buf::from_vals(&ctx, FK_DTYPE_F64, &[3], &[re(1.0), re(2.0), re(3.0)]);
    ok(copy(&x, &x, null()));
    assert_eq!(x.read(), vec![re(1.0), re(2.0), re(3.0)]);
    // ndim 0 (one element)
    let s0 = Buf::from_vals(&ctx, FK_DTYPE_F32, &[], &[re(4.5)]);
    let d0 = Buf::new(&ctx, FK_DTYPE_F32, &[1]);
    ok(copy(&d0, &s0, null()));
    assert_eq!(d0.read(), vec![re(4.5)]);
}

#[test]
fn copy_errors() {
    let ctx = Ctx::cpu();
    let a = Buf::new(&ctx, FK_DTYPE_F32, &[4, 3]);
    let b = Buf::new(&ctx, FK_DTYPE_F64, &[12]);
    expect_status(
        copy(&a, &b, null()),
        FK_ERROR_DTYPE_MISMATCH,
        &["fk_buffer_copy", "dst has dtype f32 but src has dtype f64"],
    );
    let c = Buf::new(&ctx, FK_DTYPE_F32, &[13]);
    expect_status(
        copy(&a, &c, null()),
        FK_ERROR_SHAPE_MISMATCH,
        &[
            "fk_buffer_copy",
            "dst has shape [4, 3] (12 elements)",
            "src has shape [13] (13 elements)",
        ],
    );
    // non-contiguous: a transposed wrap
    let mut host = vec![0f32; 12];
    let t = unsafe { Buf::wrap_host(&ctx, &mut host, FK_DTYPE_F32, &[3, 4], Some(&[1, 3])) };
    expect_status(
        copy(&t, &a, null()),
        FK_ERROR_UNSUPPORTED,
        &["fk_buffer_copy", "dst", "not contiguous"],
    );
    expect_status(
        copy(&a, &t, null()),
        FK_ERROR_UNSUPPORTED,
        &["fk_buffer_copy", "src", "not contiguous"],
    );
    // partial overlap: two wraps of one array, shifted by one element
    let mut arr = vec![0f32; 8];
    let lo = unsafe { Buf::wrap_host(&ctx, &mut arr, FK_DTYPE_F32, &[6], None) };
    let hi = unsafe { Buf::wrap_host(&ctx, &mut arr[1..], FK_DTYPE_F32, &[6], None) };
    expect_status(
        copy(&lo, &hi, null()),
        FK_ERROR_ALIASING,
        &["fk_buffer_copy", "overlap partially"],
    );
    // NULL and wrong-kind handles
    expect_status(
        unsafe { fk_buffer_copy(null(), a.0, null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_copy", "dst is NULL"],
    );
    expect_status(
        unsafe { fk_buffer_copy(a.0, null(), null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_copy", "src is NULL"],
    );
    let s = Stream::new(&ctx);
    expect_status(
        unsafe { fk_buffer_copy(a.0, s.0 as *const fk_buffer, null()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_copy", "src is not a live fk_buffer"],
    );
    expect_status(
        unsafe { fk_buffer_copy(a.0, a.0, a.0 as *const fk_stream) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_copy", "stream is not a live fk_stream"],
    );
    // read-only destination (a DLPack import flagged read-only)
    let vals = [re(1.0), re(2.0)];
    let ro = read_only_f32(&ctx, &vals);
    let src = Buf::from_vals(&ctx, FK_DTYPE_F32, &[2], &vals);
    expect_status(
        copy(&ro, &src, null()),
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_copy", "dst", "read-only"],
    );
    drop(host);
}

// ------------------------------------------------------------------ events

#[test]
fn events_on_cpu_are_ordered_host_timestamps() {
    let ctx = Ctx::cpu();
    let s = Stream::new(&ctx);
    let (e0, e1, e2) = (Event::new(&ctx), Event::new(&ctx), Event::new(&ctx));
    assert!(e0.query(), "an event never recorded is complete");
    e0.sync();
    e0.record(null());
    let a = Buf::from_vals(&ctx, FK_DTYPE_F32, &[1 << 16], &ramp(1 << 16, 1e-4, 0.0));
    let out = Buf::new(&ctx, FK_DTYPE_F32, &[1 << 16]);
    ok(unsafe { fk_exp(a.0, out.0, s.0) });
    e1.record(s.0);
    std::thread::sleep(Duration::from_millis(30));
    e2.record(s.0);
    assert!(e1.query() && e2.query());
    e2.sync();
    let t01 = e0.ms_to(&e1);
    let t12 = e1.ms_to(&e2);
    let t02 = e0.ms_to(&e2);
    assert!(t01 >= 0.0, "{t01}");
    assert!(t12 >= 25.0, "the 30 ms sleep measured as {t12} ms");
    assert!((t02 - (t01 + t12)).abs() < 0.5, "{t02} vs {t01} + {t12}");
    assert!(e2.ms_to(&e1) <= 0.0, "reversed order gives a negative time");
    assert_eq!(e1.ms_to(&e1), 0.0);
    // Waits are no-ops on the CPU (ops ran already).
    ok(unsafe { fk_stream_wait_event(s.0, e2.0) });
    ok(unsafe { fk_stream_wait_event(null(), e2.0) });
    // Re-recording moves the event.
    e0.record(null());
    assert!(e1.ms_to(&e0) >= 25.0);
    // Events of two CPU contexts are on one device (the host).
    let other = Ctx::cpu();
    let e3 = Event::new(&other);
    e3.record(null());
    assert!(e1.ms_to(&e3) >= 0.0);
}

#[test]
fn event_errors() {
    let ctx = Ctx::cpu();
    let e = Event::new(&ctx);
    let f = Event::new(&ctx);
    let mut ms = 0f32;
    expect_status(
        unsafe { fk_event_elapsed_ms(e.0, f.0, &mut ms) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_event_elapsed_ms", "start has not been recorded"],
    );
    e.record(null());
    expect_status(
        unsafe { fk_event_elapsed_ms(e.0, f.0, &mut ms) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_event_elapsed_ms", "end has not been recorded"],
    );
    f.record(null());
    expect_status(
        unsafe { fk_event_elapsed_ms(e.0, f.0, null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["fk_event_elapsed_ms", "ms is NULL"],
    );
    expect_status(
        unsafe { fk_event_elapsed_ms(null(), f.0, &mut ms) },
        FK_ERROR_NULL_POINTER,
        &["fk_event_elapsed_ms", "start is NULL"],
    );
    expect_status(
        unsafe { fk_event_elapsed_ms(e.0, null(), &mut ms) },
        FK_ERROR_NULL_POINTER,
        &["fk_event_elapsed_ms", "end is NULL"],
    );
    let mut p = null_mut();
    expect_status(
        unsafe { fk_event_create(null(), &mut p) },
        FK_ERROR_NULL_POINTER,
        &["fk_event_create", "ctx is NULL"],
    );
    expect_status(
        unsafe { fk_event_create(ctx.0, null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["fk_event_create", "out is NULL"],
    );
    expect_status(
        unsafe { fk_event_record(null(), null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_event_record", "event is NULL"],
    );
    expect_status(
        unsafe { fk_event_synchronize(null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_event_synchronize", "event is NULL"],
    );
    expect_status(
        unsafe { fk_stream_wait_event(null(), null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_stream_wait_event", "event is NULL"],
    );
    let mut d = 0;
    expect_status(
        unsafe { fk_event_query(e.0, null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["fk_event_query", "done is NULL"],
    );
    expect_status(
        unsafe { fk_event_query(null(), &mut d) },
        FK_ERROR_NULL_POINTER,
        &["fk_event_query", "event is NULL"],
    );
    // wrong kinds of handles
    let b = Buf::new(&ctx, FK_DTYPE_F32, &[1]);
    expect_status(
        unsafe { fk_event_record(b.0 as *const fk_event, null()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_event_record", "event is not a live fk_event"],
    );
    expect_status(
        unsafe { fk_event_record(e.0, b.0 as *const fk_stream) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_event_record", "stream is not a live fk_stream"],
    );
    expect_status(
        unsafe { fk_stream_wait_event(e.0 as *const fk_stream, e.0) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_stream_wait_event", "stream is not a live fk_stream"],
    );
    expect_status(
        unsafe { fk_event_destroy(b.0 as *mut fk_event) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_event_destroy", "not a live fk_event"],
    );
    ok(unsafe { fk_event_destroy(null_mut()) });
    // A destroyed handle is caught while the allocator has not reused it.
    let g = Event::new(&ctx);
    let raw = g.0;
    std::mem::forget(g);
    ok(unsafe { fk_event_destroy(raw) });
}

// ------------------------------------------------------------------ communicators (CPU: one rank)

fn cpu_comm(ctx: &Ctx) -> Comm {
    Comm::init_rank(ctx, 1, &[0u8; 128], 0)
        .unwrap_or_else(|s| panic!("fk_comm_init_rank: {} {}", status_name(s), last_error()))
}

#[test]
fn single_rank_collectives_on_cpu() {
    let ctx = Ctx::cpu();
    let s = Stream::new(&ctx);
    for comm in [
        cpu_comm(&ctx),
        Comm::init_all(&[&ctx]).expect("init_all").pop().unwrap(),
    ] {
        assert_eq!((comm.rank(), comm.size()), (0, 1));
        for dtype in [FK_DTYPE_F16, FK_DTYPE_BF16, FK_DTYPE_F32, FK_DTYPE_F64] {
            let vals: Vec<Cx> = ramp(10, 0.5, -2.0);
            let send = Buf::from_vals(&ctx, dtype, &[2, 5], &vals);
            for op in [FK_REDUCE_SUM, FK_REDUCE_PROD, FK_REDUCE_MAX, FK_REDUCE_MIN] {
                let recv = Buf::from_vals(&ctx, dtype, &[10], &[re(99.0); 10]);
                ok(unsafe { fk_all_reduce(comm.0, send.0, recv.0, op, s.0) });
                assert_eq!(recv.read(), vals, "{} op {op}", dname(dtype));
                let recv = Buf::from_vals(&ctx, dtype, &[10], &[re(99.0); 10]);
                ok(unsafe { fk_reduce_scatter(comm.0, send.0, recv.0, op, null()) });
                assert_eq!(recv.read(), vals);
            }
            let recv = Buf::from_vals(&ctx, dtype, &[10], &[re(99.0); 10]);
            ok(unsafe { fk_broadcast(comm.0, send.0, recv.0, 0, s.0) });
            assert_eq!(recv.read(), vals);
            let recv = Buf::from_vals(&ctx, dtype, &[5, 2], &[re(99.0); 10]);
            ok(unsafe { fk_all_gather(comm.0, send.0, recv.0, null()) });
            assert_eq!(recv.read(), vals);
            // in place
            let x = Buf::from_vals(&ctx, dtype, &[10], &vals);
            ok(unsafe { fk_all_reduce(comm.0, x.0, x.0, FK_REDUCE_SUM, null()) });
            ok(unsafe { fk_broadcast(comm.0, x.0, x.0, 0, null()) });
            ok(unsafe { fk_all_gather(comm.0, x.0, x.0, null()) });
            ok(unsafe { fk_reduce_scatter(comm.0, x.0, x.0, FK_REDUCE_MAX, null()) });
            assert_eq!(x.read(), vals);
        }
        // complex: sum (as pairs of reals) and data movement
        for dtype in [FK_DTYPE_C64, FK_DTYPE_C128] {
            let vals = vec![cx(1.0, -2.0), cx(0.5, 3.0), cx(-4.0, 0.25)];
            let send = Buf::from_vals(&ctx, dtype, &[3], &vals);
            let recv = Buf::new(&ctx, dtype, &[3]);
            ok(unsafe { fk_all_reduce(comm.0, send.0, recv.0, FK_REDUCE_SUM, null()) });
            assert_eq!(recv.read(), vals);
            let recv = Buf::new(&ctx, dtype, &[3]);
            ok(unsafe { fk_all_gather(comm.0, send.0, recv.0, null()) });
            assert_eq!(recv.read(), vals);
            let recv = Buf::new(&ctx, dtype, &[3]);
            ok(unsafe { fk_broadcast(comm.0, send.0, recv.0, 0, null()) });
            assert_eq!(recv.read(), vals);
            for op in [FK_REDUCE_PROD, FK_REDUCE_MAX, FK_REDUCE_MIN] {
                expect_status(
                    unsafe { fk_all_reduce(comm.0, send.0, recv.0, op, null()) },
                    FK_ERROR_UNSUPPORTED_DTYPE,
                    &[
                        "fk_all_reduce",
                        dname(dtype),
                        "only right for FK_REDUCE_SUM",
                    ],
                );
                expect_status(
                    unsafe { fk_reduce_scatter(comm.0, send.0, recv.0, op, null()) },
                    FK_ERROR_UNSUPPORTED_DTYPE,
                    &["fk_reduce_scatter", "FK_REDUCE_"],
                );
            }
        }
        // empty buffers
        let e = Buf::new(&ctx, FK_DTYPE_F32, &[0]);
        ok(unsafe { fk_all_reduce(comm.0, e.0, e.0, FK_REDUCE_SUM, null()) });
    }
}

#[test]
fn comm_creation_errors() {
    let ctx = Ctx::cpu();
    let id = [0u8; 128];
    let mut out = null_mut();
    expect_status(
        unsafe { fk_comm_init_rank(ctx.0, 2, id.as_ptr(), 0, &mut out) },
        FK_ERROR_UNSUPPORTED,
        &[
            "fk_comm_init_rank",
            "nranks = 2 on a CPU context",
            "single-rank",
        ],
    );
    expect_status(
        unsafe { fk_comm_init_rank(ctx.0, 0, id.as_ptr(), 0, &mut out) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_comm_init_rank", "nranks = 0"],
    );
    expect_status(
        unsafe { fk_comm_init_rank(ctx.0, 1, id.as_ptr(), 1, &mut out) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_comm_init_rank", "rank = 1 is outside 0..1"],
    );
    expect_status(
        unsafe { fk_comm_init_rank(ctx.0, 1, id.as_ptr(), -1, &mut out) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_comm_init_rank", "rank = -1"],
    );
    expect_status(
        unsafe { fk_comm_init_rank(ctx.0, 1, null(), 0, &mut out) },
        FK_ERROR_NULL_POINTER,
        &["fk_comm_init_rank", "id is NULL"],
    );
    expect_status(
        unsafe { fk_comm_init_rank(null(), 1, id.as_ptr(), 0, &mut out) },
        FK_ERROR_NULL_POINTER,
        &["fk_comm_init_rank", "ctx is NULL"],
    );
    expect_status(
        unsafe { fk_comm_init_rank(ctx.0, 1, id.as_ptr(), 0, null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["fk_comm_init_rank", "out is NULL"],
    );
    assert!(out.is_null());

    let other = Ctx::cpu();
    let mut comms = [null_mut(); 2];
    let two = [ctx.0 as *const fk_context, other.0 as *const _];
    expect_status(
        unsafe { fk_comm_init_all(two.as_ptr(), 2, comms.as_mut_ptr()) },
        FK_ERROR_UNSUPPORTED,
        &["fk_comm_init_all", "n = 2 CPU contexts"],
    );
    expect_status(
        unsafe { fk_comm_init_all(two.as_ptr(), 0, comms.as_mut_ptr()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_comm_init_all", "n = 0"],
    );
    expect_status(
        unsafe { fk_comm_init_all(null(), 1, comms.as_mut_ptr()) },
        FK_ERROR_NULL_POINTER,
        &["fk_comm_init_all", "ctxs is NULL"],
    );
    expect_status(
        unsafe { fk_comm_init_all(two.as_ptr(), 1, null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["fk_comm_init_all", "comms_out is NULL"],
    );
    let with_null = [ctx.0 as *const fk_context, null()];
    expect_status(
        unsafe { fk_comm_init_all(with_null.as_ptr(), 2, comms.as_mut_ptr()) },
        FK_ERROR_NULL_POINTER,
        &["fk_comm_init_all", "ctxs[1] is NULL"],
    );
    let b = Buf::new(&ctx, FK_DTYPE_F32, &[1]);
    let bad = [b.0 as *const fk_context];
    expect_status(
        unsafe { fk_comm_init_all(bad.as_ptr(), 1, comms.as_mut_ptr()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_comm_init_all", "ctxs[0] is not a live fk_context"],
    );
    assert!(comms.iter().all(|p| p.is_null()));

    let c = cpu_comm(&ctx);
    let mut r = 0;
    expect_status(
        unsafe { fk_comm_rank(c.0, null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["fk_comm_rank", "out is NULL"],
    );
    expect_status(
        unsafe { fk_comm_size(null(), &mut r) },
        FK_ERROR_NULL_POINTER,
        &["fk_comm_size", "comm is NULL"],
    );
    expect_status(
        unsafe { fk_comm_rank(b.0 as *const fk_comm, &mut r) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_comm_rank", "comm is not a live fk_comm"],
    );
    expect_status(
        unsafe { fk_comm_destroy(b.0 as *mut fk_comm) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_comm_destroy", "not a live fk_comm"],
    );
    ok(unsafe { fk_comm_destroy(null_mut()) });
}

#[test]
fn collective_errors() {
    let ctx = Ctx::cpu();
    let comm = cpu_comm(&ctx);
    let a = Buf::new(&ctx, FK_DTYPE_F32, &[6]);
    let b = Buf::new(&ctx, FK_DTYPE_F32, &[6]);
    let c7 = Buf::new(&ctx, FK_DTYPE_F32, &[7]);
    let d = Buf::new(&ctx, FK_DTYPE_F64, &[6]);
    expect_status(
        unsafe { fk_all_reduce(comm.0, a.0, b.0, 4, null()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_all_reduce", "op = 4", "FK_REDUCE_SUM=0"],
    );
    expect_status(
        unsafe { fk_reduce_scatter(comm.0, a.0, b.0, -1, null()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_reduce_scatter", "op = -1"],
    );
    expect_status(
        unsafe { fk_all_reduce(comm.0, a.0, c7.0, FK_REDUCE_SUM, null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &["fk_all_reduce", "recv has 7 elements but send has 6"],
    );
    expect_status(
        unsafe { fk_all_gather(comm.0, a.0, c7.0, null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &[
            "fk_all_gather",
            "recv has 7 elements",
            "over 1 ranks",
            "needs 6",
        ],
    );
    expect_status(
        unsafe { fk_reduce_scatter(comm.0, c7.0, a.0, FK_REDUCE_SUM, null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &["fk_reduce_scatter", "send has 7 elements", "needs 6"],
    );
    expect_status(
        unsafe { fk_broadcast(comm.0, a.0, c7.0, 0, null()) },
        FK_ERROR_SHAPE_MISMATCH,
        &["fk_broadcast", "recv has 7 elements but send has 6"],
    );
    expect_status(
        unsafe { fk_all_reduce(comm.0, a.0, d.0, FK_REDUCE_SUM, null()) },
        FK_ERROR_DTYPE_MISMATCH,
        &["fk_all_reduce", "recv has dtype f64 but send has dtype f32"],
    );
    expect_status(
        unsafe { fk_broadcast(comm.0, a.0, b.0, 1, null()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_broadcast", "root = 1 is outside 0..1"],
    );
    expect_status(
        unsafe { fk_broadcast(comm.0, null(), b.0, 0, null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_broadcast", "send is NULL on the root rank 0"],
    );
    expect_status(
        unsafe { fk_all_reduce(comm.0, null(), b.0, FK_REDUCE_SUM, null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_all_reduce", "send is NULL"],
    );
    expect_status(
        unsafe { fk_all_gather(comm.0, a.0, null(), null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_all_gather", "recv is NULL"],
    );
    expect_status(
        unsafe { fk_reduce_scatter(null(), a.0, b.0, FK_REDUCE_SUM, null()) },
        FK_ERROR_NULL_POINTER,
        &["fk_reduce_scatter", "comm is NULL"],
    );
    expect_status(
        unsafe { fk_all_reduce(a.0 as *const fk_comm, a.0, b.0, FK_REDUCE_SUM, null()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_all_reduce", "comm is not a live fk_comm"],
    );
    // non-contiguous
    let mut host = vec![0f32; 12];
    let strided = unsafe { Buf::wrap_host(&ctx, &mut host, FK_DTYPE_F32, &[6], Some(&[2])) };
    expect_status(
        unsafe { fk_all_reduce(comm.0, strided.0, b.0, FK_REDUCE_SUM, null()) },
        FK_ERROR_UNSUPPORTED,
        &["fk_all_reduce", "send", "not contiguous"],
    );
    // partial overlap
    let mut arr = vec![0f32; 8];
    let lo = unsafe { Buf::wrap_host(&ctx, &mut arr, FK_DTYPE_F32, &[6], None) };
    let hi = unsafe { Buf::wrap_host(&ctx, &mut arr[2..], FK_DTYPE_F32, &[6], None) };
    expect_status(
        unsafe { fk_all_reduce(comm.0, lo.0, hi.0, FK_REDUCE_SUM, null()) },
        FK_ERROR_ALIASING,
        &["fk_all_reduce", "send and recv overlap"],
    );
    expect_status(
        unsafe { fk_all_gather(comm.0, hi.0, lo.0, null()) },
        FK_ERROR_ALIASING,
        &["fk_all_gather", "overlap"],
    );
    // read-only recv
    let ro = read_only_f32(&ctx, &[re(1.0); 6]);
    expect_status(
        unsafe { fk_all_reduce(comm.0, a.0, ro.0, FK_REDUCE_SUM, null()) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_all_reduce", "recv is a read-only DLPack tensor"],
    );
    // a stream handle of the wrong kind
    expect_status(
        unsafe { fk_all_reduce(comm.0, a.0, b.0, FK_REDUCE_SUM, a.0 as *const fk_stream) },
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_all_reduce", "stream is not a live fk_stream"],
    );
    drop(host);
}

#[test]
fn groups_nest_and_balance() {
    let ctx = Ctx::cpu();
    let comm = cpu_comm(&ctx);
    let a = Buf::from_vals(&ctx, FK_DTYPE_F32, &[3], &f32s(&[1.0, 2.0, 3.0]));
    let b = Buf::new(&ctx, FK_DTYPE_F32, &[3]);
    // A fresh thread has no open group.
    std::thread::spawn(|| {
        expect_status(
            fk_comm_group_end(),
            FK_ERROR_INVALID_ARGUMENT,
            &["fk_comm_group_end", "no group is open on this thread"],
        );
    })
    .join()
    .unwrap();
    ok(fk_comm_group_start());
    ok(fk_comm_group_start());
    ok(unsafe { fk_all_reduce(comm.0, a.0, b.0, FK_REDUCE_SUM, null()) });
    ok(fk_comm_group_end());
    ok(fk_comm_group_end());
    assert_eq!(b.read(), f32s(&[1.0, 2.0, 3.0]));
    expect_status(
        fk_comm_group_end(),
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_comm_group_end"],
    );
}

#[test]
fn unique_id_needs_nccl() {
    match unique_id() {
        Some(id) => {
            assert!(id.iter().any(|&b| b != 0), "an id of zeros");
            let id2 = unique_id().unwrap();
            assert_ne!(id, id2, "two ids are different");
        }
        None => {
            assert!(
                std::env::var("FK_REQUIRE_NCCL").as_deref() != Ok("1"),
                "FK_REQUIRE_NCCL=1 but NCCL could not be loaded: {}",
                last_error()
            );
            let msg = last_error();
            assert!(
                msg.contains("nvidia-nccl-cu13") || msg.contains("FK_NCCL_PATH"),
                "{msg}"
            );
            println!("NCCL not found (as expected on a machine without it): {msg}");
        }
    }
    expect_status(
        unsafe { fk_comm_unique_id(null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["fk_comm_unique_id", "out is NULL"],
    );
}

#[test]
fn peer_query_without_gpu() {
    let mut v = -1;
    expect_status(
        unsafe { fk_device_can_access_peer(0, 0, null_mut()) },
        FK_ERROR_NULL_POINTER,
        &["fk_device_can_access_peer", "out is NULL"],
    );
    let n = device_count();
    if n == 0 {
        let s = unsafe { fk_device_can_access_peer(0, 0, &mut v) };
        assert!(
            s == FK_ERROR_CUDA_UNAVAILABLE || s == FK_ERROR_INVALID_ARGUMENT,
            "{} {}",
            status_name(s),
            last_error()
        );
        assert!(last_error().contains("fk_device_can_access_peer"));
    } else {
        ok(unsafe { fk_device_can_access_peer(0, 0, &mut v) });
        assert_eq!(v, 1);
        expect_status(
            unsafe { fk_device_can_access_peer(0, n, &mut v) },
            FK_ERROR_INVALID_ARGUMENT,
            &["fk_device_can_access_peer", &format!("peer = {n}")],
        );
        expect_status(
            unsafe { fk_device_can_access_peer(-1, 0, &mut v) },
            FK_ERROR_INVALID_ARGUMENT,
            &["fk_device_can_access_peer", "device = -1"],
        );
    }
}

#[test]
fn cpu_stream_for_a_cpu_copy_and_its_event_ordering() {
    // The overlap pattern on the CPU: chunks copied "in" on one stream, computed on
    // another, ordered by events; on the CPU everything runs in the calls, so the
    // result is right and every recorded time is non-negative.
    let ctx = Ctx::cpu();
    let (copy_s, comp_s) = (Stream::new(&ctx), Stream::new(&ctx));
    let n = 4usize;
    let chunk = 1000usize;
    let host = pinned(&ctx, FK_DTYPE_F32, &[(n * chunk) as i64]);
    let hp = host.data() as *mut f32;
    for i in 0..n * chunk {
        unsafe { *hp.add(i) = (i % 17) as f32 * 0.1 };
    }
    let mut outs = Vec::new();
    let mut evs = Vec::new();
    for c in 0..n {
        let src = unsafe { host.wrap_range(&ctx, c * chunk, chunk) };
        let dev = Buf::new(&ctx, FK_DTYPE_F32, &[chunk as i64]);
        let out = Buf::new(&ctx, FK_DTYPE_F32, &[chunk as i64]);
        let (e0, e1, e2) = (Event::new(&ctx), Event::new(&ctx), Event::new(&ctx));
        e0.record(copy_s.0);
        ok(copy(&dev, &src, copy_s.0));
        e1.record(copy_s.0);
        ok(unsafe { fk_stream_wait_event(comp_s.0, e1.0) });
        ok(unsafe { fk_exp(dev.0, out.0, comp_s.0) });
        e2.record(comp_s.0);
        outs.push((out, c));
        evs.push((e0, e1, e2));
    }
    for (out, c) in &outs {
        let got = out.read();
        for (i, v) in got.iter().enumerate() {
            let x = ((c * chunk + i) % 17) as f32 * 0.1;
            assert!((v.re - (x.exp() as f64)).abs() < 1e-5);
        }
    }
    for (e0, e1, e2) in &evs {
        assert!(e0.ms_to(e1) >= 0.0 && e1.ms_to(e2) >= 0.0);
    }
}
