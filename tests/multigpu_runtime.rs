//! The runtime on two CUDA devices, through the C ABI: peer copies both ways (with
//! values checked, ordered across devices by events), `fk_comm_init_all` on two
//! devices with all four collectives (every reduction, every real dtype, complex
//! sums, in place), `fk_comm_unique_id` + `fk_comm_init_rank` from two threads and
//! from one thread inside a group, and the device checks of collectives.
//!
//! Needs two GPUs: with fewer it prints "SKIPPED: needs 2 CUDA devices" unless
//! `FK_REQUIRE_MULTI_GPU=1`. NCCL must be loadable (`pip install nvidia-nccl-cu13`).
//! Every test body runs under a timeout (a hung collective fails the test instead
//! of hanging the run), the tests take a lock so that no two run NCCL at once, and
//! `NCCL_NVLS_ENABLE=0` is set before NCCL starts (NVLink multicast stays off).

mod common;

use std::ptr::null;
use std::sync::{Mutex, MutexGuard, Once};

use common::runtime::*;
use common::*;

const TIMEOUT_S: u64 = 60;

/// Serialises the tests (NCCL communicators must not run concurrently on the same
/// devices) and sets the environment once, before any NCCL use.
fn setup() -> Option<MutexGuard<'static, ()>> {
    static LOCK: Mutex<()> = Mutex::new(());
    static ENV: Once = Once::new();
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: under the lock and the Once; no other thread of this test binary is
    // inside fusekit or NCCL while the variable is set.
    ENV.call_once(|| unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") });
    let n = device_count();
    if n < 2 {
        if std::env::var("FK_REQUIRE_MULTI_GPU").as_deref() == Ok("1") {
            panic!("FK_REQUIRE_MULTI_GPU=1 but fk_device_count is {n}");
        }
        println!("SKIPPED: needs 2 CUDA devices (found {n})");
        return None;
    }
    Some(guard)
}

fn need_nccl() -> [u8; 128] {
    unique_id().unwrap_or_else(|| {
        panic!(
            "NCCL is needed for the multi-GPU tests (pip install nvidia-nccl-cu13): {}",
            last_error()
        )
    })
}

// ------------------------------------------------------------------ peer copies

#[test]
fn peer_copies_both_directions() {
    let Some(_g) = setup() else { return };
    with_timeout(TIMEOUT_S, "peer copies", || {
        let (c0, c1) = (Ctx::cuda(0), Ctx::cuda(1));
        let (mut p01, mut p10) = (-1, -1);
        ok(unsafe { fk_device_can_access_peer(0, 1, &mut p01) });
        ok(unsafe { fk_device_can_access_peer(1, 0, &mut p10) });
        println!(
            "peer access 0->1: {p01}, 1->0: {p10} ({})",
            if p01 == 1 && p10 == 1 {
                "direct copies"
            } else {
                "copies staged through host memory by the driver"
            }
        );
        let (s0, s1) = (Stream::new(&c0), Stream::new(&c1));
        let cpu = Ctx::cpu();
        let mut rng = Rng::new(5);
        for (dtype, n) in [
            (FK_DTYPE_F32, 16 << 20),
            (FK_DTYPE_C128, 1001),
            (FK_DTYPE_F16, 7),
        ] {
            let vals: Vec<Cx> = random_values(&mut rng, dtype, n, Domain::Signed)
                .into_iter()
                .map(|v| quantize(dtype, v))
                .collect();
            let shape = [n as i64];
            let host = Buf::from_vals(&cpu, dtype, &shape, &vals);
            let a0 = Buf::new_on(&c0, dtype, &shape, s0.0);
            let b1 = Buf::new_on(&c1, dtype, &shape, s1.0);
            let c0b = Buf::new_on(&c0, dtype, &shape, s0.0);
            ok(copy(&a0, &host, s0.0));
            let (e0, e1, t0, t1) = (
                Event::new(&c0),
                Event::new(&c1),
                Event::new(&c1),
                Event::new(&c1),
            );
            e0.record(s0.0);
            // cuda:0 -> cuda:1 on a stream of the destination, after s0's work
            ok(unsafe { fk_stream_wait_event(s1.0, e0.0) });
            t0.record(s1.0);
            ok(copy(&b1, &a0, s1.0));
            t1.record(s1.0);
            e1.record(s1.0);
            // cuda:1 -> cuda:0 on a stream of the source... of the destination here
            ok(unsafe { fk_stream_wait_event(s0.0, e1.0) });
            ok(copy(&c0b, &b1, s0.0));
            s0.sync();
            s1.sync();
            let back = Buf::new(&cpu, dtype, &shape);
            ok(copy(&back, &c0b, null()));
            assert!(
                back.read() == vals,
                "{} round trip 0 -> 1 -> 0",
                dname(dtype)
            );
            let back1 = Buf::new(&cpu, dtype, &shape);
            ok(copy(&back1, &b1, null()));
            assert!(back1.read() == vals, "{} on cuda:1", dname(dtype));
            let ms = t0.ms_to(&t1);
            let bytes = (n * dsize(dtype)) as f64;
            println!(
                "{}: {bytes} bytes cuda:0 -> cuda:1 in {ms:.3} ms ({:.1} GB/s)",
                dname(dtype),
                bytes / (ms as f64 * 1e-3) / 1e9
            );
            // 1 -> 0 on a stream of the source device, and with a NULL stream
            let d0 = Buf::new(&c0, dtype, &shape);
            ok(copy(&d0, &b1, s1.0));
            s1.sync();
            let back2 = Buf::new(&cpu, dtype, &shape);
            ok(copy(&back2, &d0, null()));
            assert!(back2.read() == vals);
            let d1 = Buf::new(&c1, dtype, &shape);
            ok(copy(&d1, &d0, null())); // the legacy default stream of cuda:1
            let back3 = Buf::new(&cpu, dtype, &shape);
            ok(copy(&back3, &d1, null()));
            assert!(back3.read() == vals);
        }
        // pinned memory of cuda:0's context to and from cuda:1 (portable)
        let p = pinned(&c0, FK_DTYPE_F32, &[1000]);
        p.write(&ramp(1000, 1.0, 0.0));
        let x1 = Buf::new_on(&c1, FK_DTYPE_F32, &[1000], s1.0);
        ok(copy(&x1, &p, s1.0));
        let q = pinned(&c0, FK_DTYPE_F32, &[1000]);
        ok(copy(&q, &x1, s1.0));
        s1.sync();
        assert_eq!(q.read(), ramp(1000, 1.0, 0.0));
        // a stream of a device the copy does not touch
        let a1 = Buf::new(&c1, FK_DTYPE_F32, &[4]);
        let b1 = Buf::new(&c1, FK_DTYPE_F32, &[4]);
        expect_status(
            copy(&a1, &b1, s0.0),
            FK_ERROR_DEVICE_MISMATCH,
            &[
                "fk_buffer_copy",
                "stream is on cuda:0",
                "from cuda:1 to cuda:1",
                "a stream of cuda:1",
            ],
        );
        // ops across devices are refused
        let a0 = Buf::new(&c0, FK_DTYPE_F32, &[4]);
        expect_status(
            unsafe { fk_neg(a0.0, a1.0, null()) },
            FK_ERROR_DEVICE_MISMATCH,
            &["fk_neg", "cuda:0", "cuda:1"],
        );
        // an event of cuda:0 cannot be recorded on cuda:1
        let e0 = Event::new(&c0);
        expect_status(
            unsafe { fk_event_record(e0.0, s1.0) },
            FK_ERROR_DEVICE_MISMATCH,
            &[
                "fk_event_record",
                "stream is on cuda:1 but the event belongs to cuda:0",
            ],
        );
    });
}

// ------------------------------------------------------------------ collectives

fn reduce(op: fk_reduce_op, a: f64, b: f64) -> f64 {
    match op {
        FK_REDUCE_SUM => a + b,
        FK_REDUCE_PROD => a * b,
        FK_REDUCE_MAX => a.max(b),
        FK_REDUCE_MIN => a.min(b),
        _ => unreachable!(),
    }
}

/// Small integers (exact in every dtype, also after a product): rank r's values.
fn rank_vals(r: usize, n: usize) -> Vec<Cx> {
    (0..n)
        .map(|i| re(((i * 3 + r * 5) % 8) as f64 - 3.0))
        .collect()
}

/// Runs `f(rank)` for both ranks inside one group (one thread drives both devices).
fn grouped(mut f: impl FnMut(usize) -> fk_status) {
    ok(fk_comm_group_start());
    let st: Vec<fk_status> = (0..2).map(&mut f).collect();
    ok(fk_comm_group_end());
    for s in st {
        ok(s);
    }
}

#[test]
fn init_all_and_the_four_collectives() {
    let Some(_g) = setup() else { return };
    need_nccl();
    with_timeout(TIMEOUT_S * 2, "init_all collectives", || {
        let ctxs = [Ctx::cuda(0), Ctx::cuda(1)];
        let comms = Comm::init_all(&[&ctxs[0], &ctxs[1]])
            .unwrap_or_else(|s| panic!("fk_comm_init_all: {} {}", status_name(s), last_error()));
        assert_eq!((comms[0].rank(), comms[1].rank()), (0, 1));
        assert_eq!((comms[0].size(), comms[1].size()), (2, 2));
        let streams = [Stream::new(&ctxs[0]), Stream::new(&ctxs[1])];
        let sync = || streams.iter().for_each(|s| s.sync());
        let n = 1027usize;
        for dtype in [FK_DTYPE_F32, FK_DTYPE_F64, FK_DTYPE_F16, FK_DTYPE_BF16] {
            // a buffer on each rank: new, or holding that rank's `rank_vals`
            let new_per_rank = |shape: &[i64]| -> Vec<Buf> {
                (0..2).map(|r| Buf::new(&ctxs[r], dtype, shape)).collect()
            };
            let vals_per_rank = |len: usize| -> Vec<Buf> {
                (0..2)
                    .map(|r| Buf::from_vals(&ctxs[r], dtype, &[len as i64], &rank_vals(r, len)))
                    .collect()
            };
            let sends = vals_per_rank(n);
            for op in [FK_REDUCE_SUM, FK_REDUCE_PROD, FK_REDUCE_MAX, FK_REDUCE_MIN] {
                let want: Vec<Cx> = (0..n)
                    .map(|i| re(reduce(op, rank_vals(0, n)[i].re, rank_vals(1, n)[i].re)))
                    .collect();
                // all-reduce
                let recvs = new_per_rank(&[n as i64]);
                grouped(|r| unsafe {
                    fk_all_reduce(comms[r].0, sends[r].0, recvs[r].0, op, streams[r].0)
                });
                sync();
                for r in 0..2 {
                    assert_eq!(
                        recvs[r].read(),
                        want,
                        "all-reduce {} op {op} rank {r}",
                        dname(dtype)
                    );
                }
                // reduce-scatter: send 2n, rank r gets slice r of the reduction
                let big = vals_per_rank(2 * n);
                let outs = new_per_rank(&[n as i64]);
                grouped(|r| unsafe {
                    fk_reduce_scatter(comms[r].0, big[r].0, outs[r].0, op, streams[r].0)
                });
                sync();
                for r in 0..2 {
                    let want: Vec<Cx> = (r * n..(r + 1) * n)
                        .map(|i| {
                            re(reduce(
                                op,
                                rank_vals(0, 2 * n)[i].re,
                                rank_vals(1, 2 * n)[i].re,
                            ))
                        })
                        .collect();
                    assert_eq!(
                        outs[r].read(),
                        want,
                        "reduce-scatter {} op {op} rank {r}",
                        dname(dtype)
                    );
                }
            }
            // broadcast from rank 1 (rank 0 passes no send buffer)
            let recvs = new_per_rank(&[n as i64]);
            grouped(|r| unsafe {
                let send = if r == 1 {
                    sends[1].0 as *const fk_buffer
                } else {
                    null()
                };
                fk_broadcast(comms[r].0, send, recvs[r].0, 1, streams[r].0)
            });
            sync();
            for r in 0..2 {
                assert_eq!(
                    recvs[r].read(),
                    rank_vals(1, n),
                    "broadcast {} rank {r}",
                    dname(dtype)
                );
            }
            // all-gather: rank order
            let gath = new_per_rank(&[2, n as i64]);
            grouped(|r| unsafe { fk_all_gather(comms[r].0, sends[r].0, gath[r].0, streams[r].0) });
            sync();
            let mut want = rank_vals(0, n);
            want.extend(rank_vals(1, n));
            for r in 0..2 {
                assert_eq!(gath[r].read(), want, "all-gather {} rank {r}", dname(dtype));
            }
            // in-place all-reduce (sum)
            let inpl = vals_per_rank(n);
            grouped(|r| unsafe {
                fk_all_reduce(
                    comms[r].0,
                    inpl[r].0,
                    inpl[r].0,
                    FK_REDUCE_SUM,
                    streams[r].0,
                )
            });
            sync();
            let want: Vec<Cx> = (0..n)
                .map(|i| re(rank_vals(0, n)[i].re + rank_vals(1, n)[i].re))
                .collect();
            for r in 0..2 {
                assert_eq!(inpl[r].read(), want, "in-place all-reduce {}", dname(dtype));
            }
        }
        // complex sum
        for dtype in [FK_DTYPE_C64, FK_DTYPE_C128] {
            let v = |r: usize| -> Vec<Cx> {
                (0..5)
                    .map(|i| cx(i as f64 + r as f64, -(i as f64) * 0.5 - r as f64))
                    .collect()
            };
            let sends: Vec<Buf> = (0..2)
                .map(|r| Buf::from_vals(&ctxs[r], dtype, &[5], &v(r)))
                .collect();
            let recvs: Vec<Buf> = (0..2).map(|r| Buf::new(&ctxs[r], dtype, &[5])).collect();
            grouped(|r| unsafe {
                fk_all_reduce(
                    comms[r].0,
                    sends[r].0,
                    recvs[r].0,
                    FK_REDUCE_SUM,
                    streams[r].0,
                )
            });
            sync();
            let want: Vec<Cx> = (0..5).map(|i| v(0)[i].add(v(1)[i])).collect();
            for r in 0..2 {
                assert_eq!(recvs[r].read(), want, "complex sum {}", dname(dtype));
            }
        }
        // device checks (before NCCL is called: no group needed)
        let on1 = Buf::new(&ctxs[1], FK_DTYPE_F32, &[4]);
        let on0 = Buf::new(&ctxs[0], FK_DTYPE_F32, &[4]);
        expect_status(
            unsafe { fk_all_reduce(comms[0].0, on1.0, on0.0, FK_REDUCE_SUM, streams[0].0) },
            FK_ERROR_DEVICE_MISMATCH,
            &[
                "fk_all_reduce",
                "send is on cuda:1 but the communicator is on cuda:0",
            ],
        );
        expect_status(
            unsafe { fk_all_gather(comms[0].0, on0.0, on0.0, streams[1].0) },
            FK_ERROR_DEVICE_MISMATCH,
            &[
                "fk_all_gather",
                "stream is on cuda:1 but the communicator is on cuda:0",
            ],
        );
        let pin = pinned(&ctxs[0], FK_DTYPE_F32, &[4]);
        expect_status(
            unsafe { fk_broadcast(comms[0].0, pin.0, on0.0, 0, streams[0].0) },
            FK_ERROR_DEVICE_MISMATCH,
            &["fk_broadcast", "send is a pinned host buffer"],
        );
        expect_status(
            unsafe { fk_all_gather(comms[0].0, on0.0, on0.0, streams[0].0) },
            FK_ERROR_SHAPE_MISMATCH,
            &["fk_all_gather", "over 2 ranks", "needs 8"],
        );
        expect_status(
            unsafe { fk_broadcast(comms[0].0, on0.0, on0.0, 2, streams[0].0) },
            FK_ERROR_INVALID_ARGUMENT,
            &["fk_broadcast", "root = 2 is outside 0..2"],
        );
        // init_all refusals
        let twice = Comm::init_all(&[&ctxs[0], &ctxs[0]]);
        assert_eq!(twice.err(), Some(FK_ERROR_INVALID_ARGUMENT));
        assert!(last_error().contains("both on cuda:0"), "{}", last_error());
        let cpu = Ctx::cpu();
        let mixed = Comm::init_all(&[&ctxs[0], &cpu]);
        assert_eq!(mixed.err(), Some(FK_ERROR_DEVICE_MISMATCH));
        assert!(
            last_error().contains("mixes CPU and CUDA"),
            "{}",
            last_error()
        );
        drop(comms);
    });
}

#[test]
fn unique_id_and_init_rank_from_two_threads() {
    let Some(_g) = setup() else { return };
    let id = need_nccl();
    let results = with_timeout(TIMEOUT_S, "init_rank from two threads", move || {
        let threads: Vec<_> = (0..2)
            .map(|r| {
                std::thread::spawn(move || {
                    let ctx = Ctx::cuda(r);
                    let comm = Comm::init_rank(&ctx, 2, &id, r).unwrap_or_else(|s| {
                        panic!(
                            "rank {r}: fk_comm_init_rank: {} {}",
                            status_name(s),
                            last_error()
                        )
                    });
                    assert_eq!((comm.rank(), comm.size()), (r, 2));
                    let s = Stream::new(&ctx);
                    let n = 4096usize;
                    let send =
                        Buf::from_vals(&ctx, FK_DTYPE_F32, &[n as i64], &rank_vals(r as usize, n));
                    let recv = Buf::new(&ctx, FK_DTYPE_F32, &[n as i64]);
                    ok(unsafe { fk_all_reduce(comm.0, send.0, recv.0, FK_REDUCE_SUM, s.0) });
                    // a larger one, to cross NCCL's protocol thresholds
                    let m = 8usize << 20;
                    let big = Buf::from_vals(
                        &ctx,
                        FK_DTYPE_F32,
                        &[m as i64],
                        &vec![re(r as f64 + 1.0); m],
                    );
                    ok(unsafe { fk_all_reduce(comm.0, big.0, big.0, FK_REDUCE_SUM, s.0) });
                    s.sync();
                    let b = big.read();
                    assert!(
                        b.iter().all(|v| v.re == 3.0),
                        "rank {r}: 1 + 2 != 3 somewhere"
                    );
                    recv.read()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank thread"))
            .collect::<Vec<_>>()
    });
    let n = 4096;
    let want: Vec<Cx> = (0..n)
        .map(|i| re(rank_vals(0, n)[i].re + rank_vals(1, n)[i].re))
        .collect();
    for (r, got) in results.iter().enumerate() {
        assert_eq!(got, &want, "rank {r}");
    }
}

#[test]
fn init_rank_from_one_thread_inside_a_group() {
    let Some(_g) = setup() else { return };
    let id = need_nccl();
    with_timeout(TIMEOUT_S, "grouped init_rank", move || {
        let ctxs = [Ctx::cuda(0), Ctx::cuda(1)];
        ok(fk_comm_group_start());
        let comms: Vec<Comm> = (0..2)
            .map(|r| {
                Comm::init_rank(&ctxs[r], 2, &id, r as i32)
                    .unwrap_or_else(|s| panic!("rank {r}: {} {}", status_name(s), last_error()))
            })
            .collect();
        ok(fk_comm_group_end());
        let streams = [Stream::new(&ctxs[0]), Stream::new(&ctxs[1])];
        let bufs: Vec<Buf> = (0..2)
            .map(|r| Buf::from_vals(&ctxs[r], FK_DTYPE_F64, &[3], &[re(r as f64 + 1.0); 3]))
            .collect();
        grouped(|r| unsafe {
            fk_all_reduce(
                comms[r].0,
                bufs[r].0,
                bufs[r].0,
                FK_REDUCE_MAX,
                streams[r].0,
            )
        });
        streams.iter().for_each(|s| s.sync());
        for b in &bufs {
            assert_eq!(b.read(), vec![re(2.0); 3]);
        }
    });
}
