//! Runtime benchmarks through the C ABI:
//!
//! 1. host cost of a pooled `fk_buffer_create` + `fk_buffer_destroy` pair (CUDA:
//!    `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on the context's pool; goal
//!    <= 2 us; median over many pairs), with the CPU backend's pair for reference;
//! 2. the overlap pattern of `examples/overlap.c` (chunked pinned host-to-device
//!    copies on one stream, compute on another, ordered by events): total time
//!    relative to max(sum of copies, sum of compute) (goal <= 1.15);
//! 3. all-reduce of 1 GiB of f32 across all GPUs (`fk_comm_init_all`, one thread
//!    driving every device inside a group), in place as PyTorch's: bus bandwidth
//!    `2 (n - 1) / n * bytes / time` (compare with `benches/allreduce_torch.py`;
//!    goal: >= 90% of PyTorch's).
//!
//! `cargo bench --bench runtime [-- --json PATH]`. Without a GPU only the CPU rows
//! run; the all-reduce needs two or more GPUs and NCCL. `NCCL_NVLS_ENABLE=0` is set
//! before NCCL starts (NVLink multicast stays off on shared machines).

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::time::Instant;

use fusekit::abi::core::*;
use fusekit::abi::elementwise::*;
use fusekit::abi::runtime::*;
use fusekit::abi::{fk_buffer, fk_comm, fk_context, fk_event, fk_scalar, fk_stream};
use fusekit::context::{FK_DEVICE_CPU, FK_DEVICE_CUDA};
use fusekit::dtype::FK_DTYPE_F32;
use fusekit::error::FK_OK;

fn check(s: i32, what: &str) {
    if s != FK_OK {
        let msg = unsafe { std::ffi::CStr::from_ptr(fk_last_error_message()) };
        panic!("{what}: status {s}: {}", msg.to_string_lossy());
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn context(kind: i32, ordinal: i32) -> *mut fk_context {
    let mut c = null_mut();
    check(
        unsafe { fk_context_create(FK_ABI_VERSION, kind, ordinal, &mut c) },
        "context",
    );
    c
}

fn stream(ctx: *mut fk_context) -> *mut fk_stream {
    let mut s = null_mut();
    check(unsafe { fk_stream_create(ctx, &mut s) }, "stream");
    s
}

fn event(ctx: *mut fk_context) -> *mut fk_event {
    let mut e = null_mut();
    check(unsafe { fk_event_create(ctx, &mut e) }, "event");
    e
}

fn elapsed(a: *mut fk_event, b: *mut fk_event) -> f64 {
    let mut ms = 0f32;
    check(unsafe { fk_event_elapsed_ms(a, b, &mut ms) }, "elapsed");
    ms as f64
}

fn f32_buffer(ctx: *mut fk_context, n: i64, s: *mut fk_stream) -> *mut fk_buffer {
    let mut b = null_mut();
    check(
        unsafe { fk_buffer_create(ctx, FK_DTYPE_F32, 1, &n, s, &mut b) },
        "buffer",
    );
    b
}

struct Row {
    name: String,
    value: f64,
    unit: &'static str,
    goal: String,
}

/// Median microseconds of one create + destroy pair (batches of 10 000 pairs).
fn create_destroy_us(ctx: *mut fk_context, s: *mut fk_stream, shape: &[i64]) -> f64 {
    let pair = || unsafe {
        let mut p = null_mut();
        check(
            fk_buffer_create(
                ctx,
                FK_DTYPE_F32,
                shape.len() as i32,
                shape.as_ptr(),
                s,
                &mut p,
            ),
            "create",
        );
        check(fk_buffer_destroy(p), "destroy");
    };
    for _ in 0..2000 {
        pair();
    }
    let per_batch = 10_000;
    let batches: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_batch {
                pair();
            }
            t.elapsed().as_secs_f64() * 1e6 / per_batch as f64
        })
        .collect();
    if !s.is_null() {
        check(unsafe { fk_stream_synchronize(s) }, "sync");
    }
    median(batches)
}

/// The overlap pipeline; returns (total, copy sum, compute sum) in ms.
unsafe fn overlap_once(
    ctx: *mut fk_context,
    copy_s: *mut fk_stream,
    comp_s: *mut fk_stream,
    host: &[*mut fk_buffer],
    din: &[*mut fk_buffer],
    dout: &[*mut fk_buffer],
    reps: usize,
) -> (f64, f64, f64) {
    let two = fk_scalar { re: 2.0, im: 0.0 };
    let m1 = fk_scalar { re: -1.0, im: 0.0 };
    let n = host.len();
    let evs: Vec<[*mut fk_event; 4]> = (0..n)
        .map(|_| [event(ctx), event(ctx), event(ctx), event(ctx)])
        .collect();
    let (t0, t1) = (event(ctx), event(ctx));
    unsafe {
        check(fk_event_record(t0, copy_s), "record");
        check(fk_stream_wait_event(comp_s, t0), "wait");
        for c in 0..n {
            let [a, b, k, l] = evs[c];
            check(fk_event_record(a, copy_s), "record");
            check(fk_buffer_copy(din[c], host[c], copy_s), "copy");
            check(fk_event_record(b, copy_s), "record");
            check(fk_stream_wait_event(comp_s, b), "wait");
            check(fk_event_record(k, comp_s), "record");
            for _ in 0..reps {
                check(fk_exp(din[c], dout[c], comp_s), "exp");
                check(fk_axpby(two, dout[c], m1, din[c], dout[c], comp_s), "axpby");
            }
            check(fk_event_record(l, comp_s), "record");
        }
        check(fk_event_record(t1, comp_s), "record");
        check(fk_event_synchronize(t1), "sync");
    }
    let total = elapsed(t0, t1);
    let (mut cs, mut ks) = (0.0, 0.0);
    for e in &evs {
        cs += elapsed(e[0], e[1]);
        ks += elapsed(e[2], e[3]);
        for x in e {
            unsafe { fk_event_destroy(*x) };
        }
    }
    unsafe {
        fk_event_destroy(t0);
        fk_event_destroy(t1);
    }
    (total, cs, ks)
}

fn overlap_rows(ctx: *mut fk_context, cuda: bool, rows: &mut Vec<Row>) {
    let chunks = 16usize;
    let m: i64 = if cuda { 2 << 20 } else { 64 << 10 };
    let (copy_s, comp_s) = (stream(ctx), stream(ctx));
    let mut host = Vec::new();
    let (mut din, mut dout) = (Vec::new(), Vec::new());
    for _ in 0..chunks {
        let mut h = null_mut();
        check(
            unsafe { fk_buffer_create_pinned(ctx, FK_DTYPE_F32, 1, &m, &mut h) },
            "pinned",
        );
        let mut p: *mut c_void = null_mut();
        unsafe { fk_buffer_data(h, &mut p) };
        let p = p as *mut f32;
        for i in 0..m as usize {
            unsafe { *p.add(i) = (i % 1000) as f32 * 1e-3 };
        }
        host.push(h);
        din.push(f32_buffer(ctx, m, copy_s));
        dout.push(f32_buffer(ctx, m, copy_s));
    }
    check(unsafe { fk_stream_synchronize(copy_s) }, "sync");
    // calibration: one chunk's copy vs one compute pass
    let (_, c1, k1) =
        unsafe { overlap_once(ctx, copy_s, comp_s, &host[..1], &din[..1], &dout[..1], 1) };
    let (_, c1b, k1b) =
        unsafe { overlap_once(ctx, copy_s, comp_s, &host[..1], &din[..1], &dout[..1], 1) };
    let (c1, k1) = (c1.min(c1b), k1.min(k1b));
    let reps = if cuda {
        ((c1 / k1.max(1e-6)).round() as usize).clamp(1, 200)
    } else {
        1
    };
    let runs: Vec<(f64, f64, f64)> = (0..5)
        .map(|_| unsafe { overlap_once(ctx, copy_s, comp_s, &host, &din, &dout, reps) })
        .collect();
    let ratios: Vec<f64> = runs
        .iter()
        .map(|&(t, c, k)| if cuda { t / c.max(k) } else { t / (c + k) })
        .collect();
    let r = median(ratios);
    let (t, c, k) = runs[runs.len() / 2];
    println!(
        "overlap: {chunks} chunks of {:.2} MiB, {reps} compute pass(es) per chunk (one copy {c1:.3} ms, one pass {k1:.3} ms)",
        m as f64 * 4.0 / (1 << 20) as f64
    );
    println!(
        "overlap: total {t:.3} ms, copies {c:.3} ms ({:.1} GB/s), compute {k:.3} ms -> {}",
        chunks as f64 * m as f64 * 4.0 / (c * 1e-3) / 1e9,
        if cuda {
            format!(
                "total / max = {:.3} (perfect: {:.3}; goal <= 1.15)",
                t / c.max(k),
                (chunks as f64 + 1.0) / chunks as f64
            )
        } else {
            format!(
                "total / (copy + compute) = {:.3} (CPU: ops run inside their calls, no overlap)",
                t / (c + k)
            )
        }
    );
    rows.push(Row {
        name: format!(
            "overlap total / max(copy, compute) ({})",
            if cuda { "cuda" } else { "cpu: no overlap" }
        ),
        value: r,
        unit: "ratio",
        goal: if cuda { "<= 1.15".into() } else { "-".into() },
    });
    for i in 0..chunks {
        unsafe {
            fk_buffer_destroy(host[i]);
            fk_buffer_destroy(din[i]);
            fk_buffer_destroy(dout[i]);
        }
    }
    unsafe {
        fk_stream_destroy(copy_s);
        fk_stream_destroy(comp_s);
    }
}

fn allreduce_rows(n: i32, rows: &mut Vec<Row>) {
    let mut id = [0u8; 128];
    if unsafe { fk_comm_unique_id(id.as_mut_ptr()) } != FK_OK {
        let msg = unsafe { std::ffi::CStr::from_ptr(fk_last_error_message()) };
        println!(
            "all-reduce: SKIPPED (NCCL not loadable): {}",
            msg.to_string_lossy()
        );
        return;
    }
    let ctxs: Vec<*mut fk_context> = (0..n).map(|o| context(FK_DEVICE_CUDA, o)).collect();
    let mut comms: Vec<*mut fk_comm> = vec![null_mut(); n as usize];
    let raw: Vec<*const fk_context> = ctxs.iter().map(|&c| c as *const _).collect();
    check(
        unsafe { fk_comm_init_all(raw.as_ptr(), n, comms.as_mut_ptr()) },
        "init_all",
    );
    let count: i64 = 1 << 28; // 1 GiB of f32
    let bytes = (count * 4) as f64;
    let streams: Vec<*mut fk_stream> = ctxs.iter().map(|&c| stream(c)).collect();
    let bufs: Vec<*mut fk_buffer> = (0..n as usize)
        .map(|r| f32_buffer(ctxs[r], count, streams[r]))
        .collect();
    // fill with ones (a real reduction of finite values)
    let ones = vec![1f32; count as usize];
    for r in 0..n as usize {
        check(
            unsafe {
                fk_buffer_copy_from_host(
                    bufs[r],
                    ones.as_ptr() as *const c_void,
                    count as usize * 4,
                    streams[r],
                )
            },
            "fill",
        );
    }
    drop(ones);
    let starts: Vec<*mut fk_event> = ctxs.iter().map(|&c| event(c)).collect();
    let ends: Vec<*mut fk_event> = ctxs.iter().map(|&c| event(c)).collect();
    let iteration = || {
        for r in 0..n as usize {
            check(unsafe { fk_event_record(starts[r], streams[r]) }, "record");
        }
        check(fk_comm_group_start(), "group start");
        for r in 0..n as usize {
            check(
                unsafe { fk_all_reduce(comms[r], bufs[r], bufs[r], FK_REDUCE_SUM, streams[r]) },
                "all_reduce",
            );
        }
        check(fk_comm_group_end(), "group end");
        for r in 0..n as usize {
            check(unsafe { fk_event_record(ends[r], streams[r]) }, "record");
        }
        (0..n as usize)
            .map(|r| {
                check(unsafe { fk_event_synchronize(ends[r]) }, "sync");
                elapsed(starts[r], ends[r])
            })
            .fold(0.0f64, f64::max)
    };
    for _ in 0..5 {
        iteration();
    }
    let t = median((0..20).map(|_| iteration()).collect());
    let algbw = bytes / (t * 1e-3) / 1e9;
    let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
    println!(
        "all-reduce 1 GiB f32 over {n} GPUs (in place, sum): {t:.3} ms, algbw {algbw:.1} GB/s, busbw {busbw:.1} GB/s"
    );
    rows.push(Row {
        name: format!("all-reduce 1 GiB f32, {n} GPUs, bus bandwidth"),
        value: busbw,
        unit: "GB/s",
        goal: ">= 90% of benches/allreduce_torch.py".into(),
    });
    // values: after 25 in-place sums of ones over n ranks the elements are n^25
    // (exact in f32 for n = 2); spot-check one element of rank 0.
    let mut first = [0f32; 1];
    let mut one: *mut fk_buffer = null_mut();
    let shape1 = [1i64];
    let mut p: *mut c_void = null_mut();
    unsafe { fk_buffer_data(bufs[0], &mut p) };
    check(
        unsafe {
            fk_buffer_wrap(
                ctxs[0],
                p,
                FK_DTYPE_F32,
                1,
                shape1.as_ptr(),
                null(),
                &mut one,
            )
        },
        "wrap",
    );
    check(
        unsafe { fk_buffer_copy_to_host(one, first.as_mut_ptr() as *mut c_void, 4, streams[0]) },
        "read",
    );
    let want = (n as f32).powi(25);
    println!("all-reduce check: element 0 = {} (want {want})", first[0]);
    assert!(
        (first[0] - want).abs() <= want * 1e-6,
        "all-reduce gave a wrong sum"
    );
    unsafe {
        fk_buffer_destroy(one);
        for r in 0..n as usize {
            fk_event_destroy(starts[r]);
            fk_event_destroy(ends[r]);
            fk_buffer_destroy(bufs[r]);
            fk_stream_synchronize(streams[r]);
            fk_stream_destroy(streams[r]);
        }
        for c in comms {
            fk_comm_destroy(c);
        }
        for c in ctxs {
            fk_context_destroy(c);
        }
    }
}

fn main() {
    // SAFETY: before any thread or NCCL exists.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    let json_path = std::env::args().skip_while(|a| a != "--json").nth(1);
    let mut n = 0i32;
    unsafe { fk_device_count(&mut n) };
    let mut rows = Vec::new();

    let cpu = context(FK_DEVICE_CPU, 0);
    let us = create_destroy_us(cpu, null_mut(), &[1024, 256]);
    println!("cpu: fk_buffer_create + fk_buffer_destroy (1 MiB, host): median {us:.3} us");
    rows.push(Row {
        name: "create+destroy pair, cpu, 1 MiB".into(),
        value: us,
        unit: "us",
        goal: "-".into(),
    });

    if n == 0 {
        println!("SKIPPED: no CUDA device (CUDA rows and the all-reduce need one)");
        overlap_rows(cpu, false, &mut rows);
    } else {
        let g = context(FK_DEVICE_CUDA, 0);
        let mut name = [0 as std::ffi::c_char; 256];
        unsafe { fk_context_name(g, name.as_mut_ptr(), 256, null_mut()) };
        let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        check(unsafe { fk_context_warmup(g) }, "warmup");
        println!("device: {name} ({n} GPU(s))");
        let s = stream(g);
        for (label, shape) in [
            ("4 KiB", vec![1024i64]),
            ("1 MiB", vec![1024, 256]),
            ("64 MiB", vec![1 << 24]),
        ] {
            let us = create_destroy_us(g, s, &shape);
            println!(
                "cuda: pooled fk_buffer_create + fk_buffer_destroy ({label}): median {us:.3} us (goal <= 2 us)"
            );
            rows.push(Row {
                name: format!("pooled create+destroy pair, cuda, {label}"),
                value: us,
                unit: "us",
                goal: "<= 2".into(),
            });
        }
        unsafe { fk_stream_destroy(s) };
        overlap_rows(g, true, &mut rows);
        unsafe { fk_context_destroy(g) };
        if n >= 2 {
            allreduce_rows(n, &mut rows);
        } else {
            println!("all-reduce: SKIPPED (needs >= 2 GPUs, found {n})");
        }
    }
    unsafe { fk_context_destroy(cpu) };

    println!("\n{:<58} {:>12} {:>6}  goal", "row", "value", "unit");
    for r in &rows {
        println!("{:<58} {:>12.3} {:>6}  {}", r.name, r.value, r.unit, r.goal);
    }
    if let Some(p) = json_path {
        let body: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"name\": {:?}, \"value\": {}, \"unit\": {:?}, \"goal\": {:?}}}",
                    r.name, r.value, r.unit, r.goal
                )
            })
            .collect();
        std::fs::write(&p, format!("[\n  {}\n]\n", body.join(",\n  "))).expect("write json");
        println!("wrote {p}");
    }
}
