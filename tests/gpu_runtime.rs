//! The runtime on one CUDA device, through the C ABI: the context's memory pool
//! (statistics move with allocations, trim lowers the reserve, the release
//! threshold is honoured, out-of-memory names the sizes), pinned buffers, copies
//! between every pair of buffer kinds, events (ordering across streams, timing,
//! cross-backend waits), ops refusing pinned buffers, and the overlap pattern of
//! `examples/overlap.c` with its values checked.
//!
//! Every test starts with `gpu()`: without a CUDA device it prints
//! "SKIPPED: no CUDA device" and returns, unless `FK_REQUIRE_GPU=1`.

mod common;

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::time::Instant;

use common::runtime::*;
use common::*;

const MIB: u64 = 1 << 20;

fn f32_buf(ctx: &Ctx, n: usize, stream: &Stream) -> Buf {
    Buf::new_on(ctx, FK_DTYPE_F32, &[n as i64], stream.0)
}

// ------------------------------------------------------------------ the pool

#[test]
fn pool_stats_move_with_allocations_and_trim_lowers_reserved() {
    let Some(g) = gpu() else { return };
    let s = Stream::new(&g);
    let s0 = stats(&g);
    assert_eq!(
        (s0.allocated_bytes, s0.live_allocations),
        (0, 0),
        "a fresh context"
    );
    assert_eq!(s0.release_threshold_bytes, u64::MAX);
    assert!(s0.device_total_bytes > 0 && s0.device_free_bytes <= s0.device_total_bytes);

    let n = (64 * MIB / 4) as usize;
    let a = f32_buf(&g, n, &s);
    let b = f32_buf(&g, 1000, &s);
    let s1 = stats(&g);
    println!("after 64 MiB + 4000 B: {s1:?}");
    assert_eq!(s1.allocated_bytes, 64 * MIB + 4000);
    assert_eq!(s1.live_allocations, 2);
    assert_eq!(s1.peak_allocated_bytes, 64 * MIB + 4000);
    assert!(s1.reserved_bytes >= 64 * MIB + 4000, "{s1:?}");
    assert!(s1.pool_used_bytes >= 64 * MIB + 4000, "{s1:?}");
    assert!(s1.peak_reserved_bytes >= s1.reserved_bytes);

    drop(a);
    drop(b);
    s.sync();
    let s2 = stats(&g);
    println!("after destroy + sync: {s2:?}");
    assert_eq!((s2.allocated_bytes, s2.live_allocations), (0, 0));
    assert_eq!(s2.peak_allocated_bytes, 64 * MIB + 4000, "the peak stays");
    assert!(
        s2.reserved_bytes >= 64 * MIB,
        "the default threshold keeps the reserve: {s2:?}"
    );
    assert!(s2.pool_used_bytes < 64 * MIB, "{s2:?}");

    // Reuse: the same size again comes from the reserve (reserved does not grow).
    let c = f32_buf(&g, n, &s);
    assert_eq!(stats(&g).reserved_bytes, s2.reserved_bytes);
    drop(c);
    s.sync();

    ok(unsafe { fk_context_trim(g.0, 0) });
    let s3 = stats(&g);
    println!("after trim(0): {s3:?}");
    assert!(
        s3.reserved_bytes < s2.reserved_bytes && s3.reserved_bytes < 64 * MIB,
        "trim lowers the reserve: {} -> {}",
        s2.reserved_bytes,
        s3.reserved_bytes
    );
    assert!(s3.peak_reserved_bytes >= 64 * MIB, "the peak stays");

    // trim keeps what live buffers use
    let d = f32_buf(&g, n, &s);
    s.sync();
    ok(unsafe { fk_context_trim(g.0, 0) });
    assert!(stats(&g).reserved_bytes >= 64 * MIB);
    drop(d);
}

#[test]
fn release_threshold_is_honoured() {
    let Some(g) = gpu() else { return };
    let s = Stream::new(&g);
    let n = (128 * MIB / 4) as usize;

    // What stays reserved under `threshold` once a 128 MiB buffer is freed and the
    // stream synchronised.
    let reserved_after = |threshold: u64| {
        ok(unsafe { fk_context_set_release_threshold(g.0, threshold) });
        assert_eq!(stats(&g).release_threshold_bytes, threshold);
        drop(f32_buf(&g, n, &s));
        s.sync();
        stats(&g).reserved_bytes
    };
    let r0 = reserved_after(0);
    assert!(
        r0 <= 2 * MIB,
        "threshold 0: the reserve goes back at the synchronisation, but {r0} bytes stay"
    );
    let r32 = reserved_after(32 * MIB);
    assert!(
        r32 <= 32 * MIB,
        "threshold 32 MiB: {r32} bytes stay reserved"
    );
    let rbig = reserved_after(1 << 40);
    assert!(
        rbig >= 128 * MIB,
        "threshold 1 TiB keeps the 128 MiB: {rbig}"
    );
    println!("reserved after sync: threshold 0 -> {r0}, 32 MiB -> {r32}, 1 TiB -> {rbig}");

    // Contexts on one device have separate pools and statistics.
    let g2 = Ctx::cuda(0);
    let before = stats(&g2);
    let x = Buf::new(&g, FK_DTYPE_F32, &[1 << 20]);
    assert_eq!(stats(&g2).allocated_bytes, before.allocated_bytes);
    drop(x);
}

#[test]
fn out_of_memory_names_the_sizes() {
    let Some(g) = gpu() else { return };
    let before = stats(&g);
    let shape = [1i64 << 48]; // 2^48 f32 = 1 PiB
    let mut p = null_mut();
    let st = unsafe { fk_buffer_create(g.0, FK_DTYPE_F32, 1, shape.as_ptr(), null(), &mut p) };
    expect_status(
        st,
        FK_ERROR_OUT_OF_MEMORY,
        &[
            "fk_buffer_create",
            "1125899906842624 bytes",
            "cuda:0",
            "free",
        ],
    );
    println!("OOM message: {}", last_error());
    assert!(p.is_null());
    let after = stats(&g);
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(after.live_allocations, before.live_allocations);
    // pinned host memory too: 2^60 bytes, beyond any host's address space, so the
    // driver refuses at once (a merely too large size could start pinning pages)
    let huge = [1i64 << 58];
    let st = unsafe { fk_buffer_create_pinned(g.0, FK_DTYPE_F32, 1, huge.as_ptr(), &mut p) };
    expect_status(
        st,
        FK_ERROR_OUT_OF_MEMORY,
        &[
            "fk_buffer_create_pinned",
            "1152921504606846976 bytes",
            "pinned",
            "free",
        ],
    );
    assert!(p.is_null());
    assert_eq!(stats(&g).pinned_bytes, 0);
    // The context still works.
    let b = Buf::from_vals(&g, FK_DTYPE_F32, &[3], &f32s(&[1.0, 2.0, 3.0]));
    assert_eq!(b.read(), f32s(&[1.0, 2.0, 3.0]));
}

// ------------------------------------------------------------------ pinned buffers

#[test]
fn pinned_buffers_are_copy_endpoints() {
    let Some(g) = gpu() else { return };
    let s = Stream::new(&g);
    let n = 4099usize;
    let p = pinned(&g, FK_DTYPE_F32, &[n as i64]);
    assert_eq!(p.device(), (FK_DEVICE_CUDA_HOST, 0));
    let st = stats(&g);
    assert_eq!((st.pinned_bytes, st.pinned_allocations), (4 * n as u64, 1));
    assert_eq!(st.live_allocations, 0, "pinned buffers are counted apart");
    // Host access through the data pointer.
    let hp = p.data() as *mut f32;
    for i in 0..n {
        unsafe { *hp.add(i) = i as f32 };
    }
    // pinned -> device, op on the device, device -> pinned, all on one stream
    let d = Buf::new_on(&g, FK_DTYPE_F32, &[n as i64], s.0);
    let o = Buf::new_on(&g, FK_DTYPE_F32, &[n as i64], s.0);
    ok(copy(&d, &p, s.0));
    ok(unsafe { fk_scalar_mul(d.0, re(2.0).scalar(), o.0, s.0) });
    ok(copy(&p, &o, s.0));
    let e = Event::new(&g);
    e.record(s.0);
    e.sync();
    for i in 0..n {
        assert_eq!(unsafe { *hp.add(i) }, 2.0 * i as f32, "element {i}");
    }
    // The host-copy entry points work on pinned buffers too.
    let vals = ramp(n, 0.25, 1.0);
    p.write(&vals);
    assert_eq!(p.read(), vals);

    // Ops refuse pinned buffers, naming the argument.
    let dev = Buf::new(&g, FK_DTYPE_F32, &[n as i64]);
    expect_status(
        unsafe { fk_neg(p.0, dev.0, null()) },
        FK_ERROR_DEVICE_MISMATCH,
        &[
            "fk_neg",
            "a is a pinned host buffer",
            "FK_DEVICE_CUDA_HOST",
            "fk_buffer_copy",
        ],
    );
    expect_status(
        unsafe { fk_neg(dev.0, p.0, null()) },
        FK_ERROR_DEVICE_MISMATCH,
        &["fk_neg", "out is a pinned host buffer"],
    );
    expect_status(
        unsafe { fk_add(dev.0, p.0, dev.0, null()) },
        FK_ERROR_DEVICE_MISMATCH,
        &["fk_add", "b is a pinned host buffer"],
    );
    expect_status(
        unsafe { fk_add(p.0, p.0, p.0, null()) },
        FK_ERROR_DEVICE_MISMATCH,
        &["fk_add", "pinned host buffer"],
    );
    // DLPack export says kDLCUDAHost.
    let m = export_dlpack(&p);
    unsafe {
        assert_eq!((*m).dl_tensor.device.device_type, 3);
        ((*m).deleter.unwrap())(m);
    }
    drop(p);
    let st = stats(&g);
    assert_eq!((st.pinned_bytes, st.pinned_allocations), (0, 0));
}

// ------------------------------------------------------------------ copies

#[test]
fn copies_between_every_pair_on_one_gpu() {
    let Some(g) = gpu() else { return };
    let cpu = Ctx::cpu();
    let s = Stream::new(&g);
    let mut rng = Rng::new(11);
    for dtype in [FK_DTYPE_F16, FK_DTYPE_F32, FK_DTYPE_C128] {
        let n = 1_000_003usize;
        let vals: Vec<Cx> = random_values(&mut rng, dtype, n, Domain::Signed)
            .into_iter()
            .map(|v| quantize(dtype, v))
            .collect();
        let shape = [n as i64];
        let host = Buf::from_vals(&cpu, dtype, &shape, &vals); // pageable CPU buffer
        let pin = pinned(&g, dtype, &shape);
        let pin2 = pinned(&g, dtype, &shape);
        let d1 = Buf::new_on(&g, dtype, &shape, s.0);
        let d2 = Buf::new_on(&g, dtype, &shape, s.0);
        let back = Buf::new(&cpu, dtype, &shape);
        // CPU -> device -> device -> pinned -> pinned -> device(d1) -> CPU
        ok(copy(&d1, &host, s.0));
        ok(copy(&d2, &d1, s.0));
        ok(copy(&pin, &d2, s.0));
        ok(copy(&pin2, &pin, s.0));
        ok(copy(&d1, &pin2, s.0));
        ok(copy(&back, &d1, s.0));
        s.sync();
        assert!(
            back.read() == vals,
            "{}: round trip through every kind",
            dname(dtype)
        );
        // CPU <-> pinned, NULL stream (the pinned side's default stream)
        let back2 = Buf::new(&cpu, dtype, &shape);
        ok(copy(&pin, &host, null()));
        ok(copy(&back2, &pin, null()));
        assert!(back2.read() == vals);
        // device -> CPU with a NULL stream (the device's legacy default stream,
        // which orders after the blocking default-stream work)
        let back3 = Buf::new(&cpu, dtype, &shape);
        ok(copy(&d2, &host, null()));
        ok(copy(&back3, &d2, null()));
        assert!(back3.read() == vals);
    }

    // streams on the wrong backend
    let c1 = Buf::new(&cpu, FK_DTYPE_F32, &[4]);
    let c2 = Buf::new(&cpu, FK_DTYPE_F32, &[4]);
    let dv = Buf::new(&g, FK_DTYPE_F32, &[4]);
    expect_status(
        copy(&c1, &c2, s.0),
        FK_ERROR_DEVICE_MISMATCH,
        &[
            "fk_buffer_copy",
            "stream is on cuda:0",
            "NULL or a stream of a CPU context",
        ],
    );
    let cs = Stream::new(&cpu);
    expect_status(
        copy(&dv, &c1, cs.0),
        FK_ERROR_DEVICE_MISMATCH,
        &[
            "fk_buffer_copy",
            "stream is on cpu",
            "from cpu to cuda:0",
            "a stream of cuda:0",
        ],
    );
    let ps = pinned(&g, FK_DTYPE_F32, &[4]);
    expect_status(
        copy(&c1, &ps, cs.0),
        FK_ERROR_DEVICE_MISMATCH,
        &["fk_buffer_copy", "pinned host memory (cuda:0)"],
    );
}

// ------------------------------------------------------------------ events

#[test]
fn events_order_streams_and_time_work() {
    let Some(g) = gpu() else { return };
    let (s1, s2) = (Stream::new(&g), Stream::new(&g));
    let n = if sanitizing() { 1 << 16 } else { 1 << 24 };
    let x = Buf::new_on(&g, FK_DTYPE_F32, &[n], s1.0);
    let y = Buf::new_on(&g, FK_DTYPE_F32, &[n], s1.0);
    let z = Buf::new_on(&g, FK_DTYPE_F32, &[n], s1.0);
    s1.sync(); // the buffers are used on s2 too
    let cpu = Ctx::cpu();
    let ones = Buf::from_vals(&cpu, FK_DTYPE_F32, &[n], &vec![re(1.0); n as usize]);
    let (start, mid, end) = (Event::new(&g), Event::new(&g), Event::new(&g));
    for round in 0..3 {
        // s1: x = 1; y = x + 1 (repeated, so s1 is busy for a while); record mid
        ok(copy(&x, &ones, s1.0));
        start.record(s1.0);
        ok(unsafe { fk_scalar_add(x.0, re(1.0).scalar(), y.0, s1.0) });
        for _ in 0..20 {
            ok(unsafe { fk_scalar_add(y.0, re(0.0).scalar(), y.0, s1.0) });
        }
        mid.record(s1.0);
        // s2 waits for mid, then z = 3 * y: correct only if ordered after s1's work
        ok(unsafe { fk_stream_wait_event(s2.0, mid.0) });
        ok(unsafe { fk_scalar_mul(y.0, re(3.0).scalar(), z.0, s2.0) });
        end.record(s2.0);
        end.sync();
        assert!(end.query() && mid.query());
        let got = z.read();
        assert!(
            got.iter().all(|v| v.re == 6.0),
            "round {round}: s2 ran before s1's work"
        );
        let t_work = start.ms_to(&mid);
        let t_all = start.ms_to(&end);
        assert!(t_work > 0.0 && t_all >= t_work, "{t_work} ms, {t_all} ms");
        println!("round {round}: s1 work {t_work:.3} ms, until s2 done {t_all:.3} ms");
        s2.sync();
    }
    // A CUDA stream waiting on a CPU event: no-op. A CPU stream waiting on a CUDA
    // event: the host waits.
    let ce = Event::new(&cpu);
    ce.record(null());
    ok(unsafe { fk_stream_wait_event(s1.0, ce.0) });
    let cs = Stream::new(&cpu);
    ok(unsafe { fk_scalar_add(x.0, re(1.0).scalar(), y.0, s1.0) });
    mid.record(s1.0);
    ok(unsafe { fk_stream_wait_event(cs.0, mid.0) });
    assert!(
        mid.query(),
        "a CPU stream's wait blocks until the CUDA event is complete"
    );
    // Mixed-device timing is refused; recording on a CPU stream too.
    let mut ms = 0f32;
    expect_status(
        unsafe { fk_event_elapsed_ms(ce.0, end.0, &mut ms) },
        FK_ERROR_DEVICE_MISMATCH,
        &[
            "fk_event_elapsed_ms",
            "start is an event of cpu but end of cuda:0",
        ],
    );
    expect_status(
        unsafe { fk_event_record(mid.0, cs.0) },
        FK_ERROR_DEVICE_MISMATCH,
        &[
            "fk_event_record",
            "stream is on cpu but the event belongs to cuda:0",
        ],
    );
    // Default stream record.
    let e = Event::new(&g);
    e.record(null());
    e.sync();
    let mut v = 0;
    ok(unsafe { fk_device_can_access_peer(0, 0, &mut v) });
    assert_eq!(v, 1);
}

// ------------------------------------------------------------------ the overlap pattern

/// `examples/overlap.c` as a test: chunks of pinned input copied to the device on
/// one stream while the previous chunks are computed on another, ordered by events;
/// results checked, timeline printed.
#[test]
fn overlap_of_copies_and_compute() {
    let Some(g) = gpu() else { return };
    let chunks = 8usize;
    let m: usize = if sanitizing() { 1 << 14 } else { 1 << 22 };
    let (cs, ks) = (Stream::new(&g), Stream::new(&g));
    let input = pinned(&g, FK_DTYPE_F32, &[(chunks * m) as i64]);
    let hp = input.data() as *mut f32;
    for i in 0..chunks * m {
        unsafe { *hp.add(i) = ((i % 1000) as f32) * 1e-3 };
    }
    let dev_in: Vec<Buf> = (0..chunks)
        .map(|_| Buf::new_on(&g, FK_DTYPE_F32, &[m as i64], cs.0))
        .collect();
    let dev_out: Vec<Buf> = (0..chunks)
        .map(|_| Buf::new_on(&g, FK_DTYPE_F32, &[m as i64], cs.0))
        .collect();
    cs.sync();
    let ev = |_: usize| {
        (
            Event::new(&g),
            Event::new(&g),
            Event::new(&g),
            Event::new(&g),
        )
    };
    let evs: Vec<_> = (0..chunks).map(ev).collect();
    let (t0, t1) = (Event::new(&g), Event::new(&g));
    let wall = Instant::now();
    t0.record(cs.0);
    ok(unsafe { fk_stream_wait_event(ks.0, t0.0) });
    for c in 0..chunks {
        let src = unsafe { input.wrap_range(&g, c * m, m) };
        let (cp0, cp1, k0, k1) = &evs[c];
        cp0.record(cs.0);
        ok(copy(&dev_in[c], &src, cs.0));
        cp1.record(cs.0);
        ok(unsafe { fk_stream_wait_event(ks.0, cp1.0) });
        k0.record(ks.0);
        ok(unsafe { fk_exp(dev_in[c].0, dev_out[c].0, ks.0) });
        ok(unsafe {
            fk_axpby(
                re(2.0).scalar(),
                dev_out[c].0,
                re(-1.0).scalar(),
                dev_in[c].0,
                dev_out[c].0,
                ks.0,
            )
        });
        k1.record(ks.0);
    }
    t1.record(ks.0);
    t1.sync();
    let host_ms = wall.elapsed().as_secs_f64() * 1e3;
    let total = t0.ms_to(&t1);
    let (mut copy_ms, mut comp_ms) = (0f32, 0f32);
    println!("chunk  copy start..end (ms)   compute start..end (ms)");
    for (c, (cp0, cp1, k0, k1)) in evs.iter().enumerate() {
        let (a, b, k, l) = (t0.ms_to(cp0), t0.ms_to(cp1), t0.ms_to(k0), t0.ms_to(k1));
        copy_ms += b - a;
        comp_ms += l - k;
        println!("{c:5}  {a:8.3} .. {b:8.3}       {k:8.3} .. {l:8.3}");
        assert!(
            k >= b - 0.01,
            "chunk {c}: compute started before its copy ended"
        );
    }
    println!(
        "total {total:.3} ms (host {host_ms:.3} ms); copies {copy_ms:.3} ms, compute {comp_ms:.3} ms; total / max = {:.3}",
        total / copy_ms.max(comp_ms)
    );
    assert!(total <= copy_ms + comp_ms + 1.0);
    // values: out = 2 exp(x) - x
    for (c, out) in dev_out.iter().enumerate() {
        let got = out.read();
        for (i, v) in got.iter().enumerate().step_by(997) {
            let x = (((c * m + i) % 1000) as f32) * 1e-3;
            let want = 2.0 * (x as f64).exp() - x as f64;
            assert!(
                (v.re - want).abs() < 1e-5 * want.abs().max(1.0),
                "chunk {c} element {i}: {} vs {want}",
                v.re
            );
        }
    }
}

#[test]
fn pooled_create_destroy_is_cheap() {
    let Some(g) = gpu() else { return };
    let s = Stream::new(&g);
    let shape = [1024i64, 256];
    let mut t = Vec::new();
    for _ in 0..20_000 {
        let mut p = null_mut();
        let t0 = Instant::now();
        ok(unsafe { fk_buffer_create(g.0, FK_DTYPE_F32, 2, shape.as_ptr(), s.0, &mut p) });
        ok(unsafe { fk_buffer_destroy(p) });
        t.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    s.sync();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let med = t[t.len() / 2];
    println!(
        "pooled fk_buffer_create + fk_buffer_destroy: median {med:.2} us, p90 {:.2} us",
        t[t.len() * 9 / 10]
    );
    if !sanitizing() {
        assert!(
            med < 20.0,
            "median {med} us (goal <= 2 us; benches/runtime.rs measures it)"
        );
    }
}

// ------------------------------------------------------------------ wrap's pointer check

/// `fk_buffer_wrap` on CUDA checks the pointer once per device allocation and
/// remembers the allocation's range: pointers anywhere inside it wrap (also after
/// many others), while host memory is refused every time, before and after.
#[test]
fn wrap_remembers_checked_allocations_and_still_refuses_host_memory() {
    let Some(g) = gpu() else { return };
    let s = Stream::new(&g);
    let dev = f32_buf(&g, 1 << 16, &s);
    s.sync();
    let host = vec![0f32; 64];
    let try_wrap = |p: *mut c_void| {
        let mut b = null_mut();
        let shape = [16i64];
        let st =
            unsafe { fk_buffer_wrap(g.raw(), p, FK_DTYPE_F32, 1, shape.as_ptr(), null(), &mut b) };
        if !b.is_null() {
            unsafe { fk_buffer_destroy(b) };
        }
        st
    };
    let hp = host.as_ptr() as *mut c_void;
    assert_eq!(try_wrap(hp), FK_ERROR_DEVICE_MISMATCH, "{}", last_error());
    let base = dev.data() as *mut u8;
    for off in [0usize, 4, 4096, (1 << 18) - 64] {
        assert_eq!(
            try_wrap(unsafe { base.add(off) } as *mut c_void),
            FK_OK,
            "offset {off}"
        );
    }
    // many other allocations push this one's range out, then in again
    let others: Vec<Buf> = (0..40).map(|_| f32_buf(&g, 1024, &s)).collect();
    s.sync();
    for o in &others {
        assert_eq!(try_wrap(o.data()), FK_OK);
    }
    assert_eq!(try_wrap(base as *mut c_void), FK_OK);
    assert_eq!(
        try_wrap(hp),
        FK_ERROR_DEVICE_MISMATCH,
        "host memory after cached ranges"
    );
    assert!(
        last_error().contains("not memory CUDA knows"),
        "{}",
        last_error()
    );
}
