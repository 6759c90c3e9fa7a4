//! Lifetimes and getters of every handle kind: contexts (CPU, and refused kinds,
//! ordinals and ABI versions), streams (create, wrap, synchronize, handle),
//! buffers (create with any dtype and shape, pinned, wrap with any strides, copies
//! to and from host, buffer-to-buffer copies, getters), events (record, wait,
//! query, elapsed time), memory statistics, message copies, and handles of the
//! wrong kind or NULL anywhere. Handles are destroyed in any order (buffers may
//! outlive their context). Oracle: `check` on every status, getters agree with
//! what was created, copies round-trip, statistics return to zero.
#![no_main]

use fusekit_fuzz::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

#[derive(Default)]
struct Handles {
    ctxs: Vec<*mut fk_context>,
    streams: Vec<*mut fk_stream>,
    bufs: Vec<(*mut fk_buffer, bool)>, // (handle, addresses only memory it owns or the arena)
    events: Vec<*mut fk_event>,
}

fn pick<T: Copy>(b: &mut Bytes, v: &[T]) -> Option<T> {
    if v.is_empty() {
        None
    } else {
        Some(v[b.below(v.len())])
    }
}

/// A handle argument: usually a live one of the right kind, sometimes NULL or a
/// live handle of another kind.
fn any<T>(b: &mut Bytes, h: &Handles, want: &[*mut T]) -> *mut T {
    match b.u8() {
        0..=219 => pick(b, want).unwrap_or(null_mut()),
        220..=234 => null_mut(),
        235..=244 => pick(b, &h.ctxs).map_or(null_mut(), |p| p as *mut T),
        _ => pick(b, &h.events).map_or(null_mut(), |p| p as *mut T),
    }
}

fn take<T: Copy>(b: &mut Bytes, v: &mut Vec<T>) -> Option<T> {
    if v.is_empty() {
        None
    } else {
        Some(v.remove(b.below(v.len())))
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let mut arena = Arena::new(&mut b);
    let mut h = Handles::default();
    let mut steps = 0;
    while !b.is_empty() && steps < 64 {
        steps += 1;
        // SAFETY (the whole match): every handle passed is live, NULL, or a live
        // handle of another kind; memory passed is the arena or local vectors
        // of the stated size; wrapped views that do not fit the arena are only
        // queried, never read or written through.
        unsafe {
            match b.u8() % 24 {
                0 => {
                    let version = if b.one_in(6) {
                        b.u16() as u32
                    } else {
                        fk_abi_version()
                    };
                    let kind = if b.one_in(6) { b.u8() as i32 - 128 } else { 1 };
                    let ordinal = if b.one_in(6) { b.u8() as i32 - 128 } else { 0 };
                    let mut c: *mut fk_context = null_mut();
                    let out = if b.one_in(10) {
                        null_mut()
                    } else {
                        &mut c as *mut _
                    };
                    if check(
                        fk_context_create(version, kind, ordinal, out),
                        "fk_context_create",
                    ) {
                        assert!(!c.is_null());
                        h.ctxs.push(c);
                    }
                }
                1 => {
                    if let Some(c) = take(&mut b, &mut h.ctxs) {
                        assert!(check(fk_context_destroy(c), "fk_context_destroy"));
                    } else {
                        assert!(check(fk_context_destroy(null_mut()), "fk_context_destroy"));
                    }
                }
                2 => {
                    let c = any(&mut b, &h, &h.ctxs);
                    let mut s = null_mut();
                    if check(fk_stream_create(c, &mut s), "fk_stream_create") {
                        h.streams.push(s);
                    }
                    let mut w = null_mut();
                    let raw = b.u64() as usize as *mut c_void;
                    assert!(
                        !check(fk_stream_wrap(c, raw, &mut w), "fk_stream_wrap"),
                        "a CPU context wrapped a CUstream"
                    );
                }
                3 => {
                    if let Some(s) = take(&mut b, &mut h.streams) {
                        assert!(check(fk_stream_destroy(s), "fk_stream_destroy"));
                    }
                }
                4 => {
                    let s = any(&mut b, &h, &h.streams);
                    check(fk_stream_synchronize(s), "fk_stream_synchronize");
                    let mut raw = null_mut();
                    check(fk_stream_handle(s, &mut raw), "fk_stream_handle");
                }
                5 | 6 => {
                    let c = any(&mut b, &h, &h.ctxs);
                    let dtype = b.dtype();
                    let ndim = if b.one_in(12) {
                        b.u8() as i8 as i32
                    } else {
                        b.below(4) as i32
                    };
                    let shape: Vec<i64> = (0..ndim.clamp(0, 12)).map(|_| b.dim()).collect();
                    let shp = if b.one_in(16) { null() } else { shape.as_ptr() };
                    let s = if b.bool() {
                        any(&mut b, &h, &h.streams) as *const _
                    } else {
                        null()
                    };
                    let mut buf = null_mut();
                    let st = if b.one_in(8) {
                        fk_buffer_create_pinned(c, dtype, ndim, shp, &mut buf)
                    } else {
                        fk_buffer_create(c, dtype, ndim, shp, s, &mut buf)
                    };
                    let name =
                        if st == FK_OK || !last_message().starts_with("fk_buffer_create_pinned") {
                            "fk_buffer_create"
                        } else {
                            "fk_buffer_create_pinned"
                        };
                    if check(st, name) {
                        let v = view(buf);
                        assert_eq!((v.dtype, &v.shape[..]), (dtype, &shape[..]));
                        h.bufs.push((buf, true));
                    }
                }
                7 | 8 => {
                    let c = any(&mut b, &h, &h.ctxs);
                    let dtype = b.dtype();
                    let ndim = if b.one_in(12) {
                        b.u8() as i8 as i32
                    } else {
                        b.below(4) as i32
                    };
                    let shape: Vec<i64> = (0..ndim.clamp(0, 12)).map(|_| b.dim()).collect();
                    let strides: Vec<i64> = contiguous(&shape)
                        .into_iter()
                        .map(|n| b.stride(n))
                        .collect();
                    let pick16 = b.u16();
                    let fits = arena.place(dtype, &shape, &strides, pick16);
                    let data = match (fits, b.u8() % 8) {
                        (_, 0) => null_mut(),
                        (Some(p), _) => p as *mut c_void,
                        (None, _) => arena.base() as *mut c_void,
                    };
                    let st_ptr = if b.one_in(4) {
                        null()
                    } else {
                        strides.as_ptr()
                    };
                    let mut buf = null_mut();
                    if check(
                        fk_buffer_wrap(c, data, dtype, ndim, shape.as_ptr(), st_ptr, &mut buf),
                        "fk_buffer_wrap",
                    ) {
                        let v = view(buf);
                        assert_eq!(
                            (v.dtype, &v.shape[..], v.data as *mut c_void),
                            (dtype, &shape[..], data)
                        );
                        if !st_ptr.is_null() {
                            assert_eq!(v.strides, strides);
                        }
                        let inside = arena.contains(v.data, v.dtype, &v.shape, &v.strides);
                        h.bufs.push((buf, inside));
                    }
                }
                9 => {
                    if let Some((buf, _)) = take(&mut b, &mut h.bufs) {
                        assert!(check(fk_buffer_destroy(buf), "fk_buffer_destroy"));
                    }
                }
                10 | 11 => {
                    // Copies between host memory and a buffer; only buffers whose
                    // memory is theirs or in the arena.
                    let safe: Vec<*mut fk_buffer> =
                        h.bufs.iter().filter(|x| x.1).map(|x| x.0).collect();
                    let Some(buf) = pick(&mut b, &safe) else {
                        continue;
                    };
                    let mut nbytes = 0usize;
                    if !check(fk_buffer_nbytes(buf, &mut nbytes), "fk_buffer_nbytes")
                        || nbytes > 1 << 20
                    {
                        continue;
                    }
                    let bytes = if b.one_in(6) {
                        nbytes.wrapping_add(b.u8() as usize).wrapping_sub(128)
                    } else {
                        nbytes
                    };
                    // Exactly the buffer's size: a call that reads or writes `bytes` when it
                    // differs from nbytes overflows this allocation (ASan).
                    let mut host = vec![0u8; nbytes];
                    let src_v = view(buf);
                    fill(&mut host, src_v.dtype, &mut b);
                    let s = if b.bool() {
                        any(&mut b, &h, &h.streams) as *const _
                    } else {
                        null()
                    };
                    let p = if b.one_in(10) {
                        null_mut()
                    } else {
                        host.as_mut_ptr() as *mut c_void
                    };
                    let is_async = b.bool();
                    let (name, st) = if is_async {
                        (
                            "fk_buffer_copy_from_host_async",
                            fk_buffer_copy_from_host_async(buf, p, bytes, s),
                        )
                    } else {
                        (
                            "fk_buffer_copy_from_host",
                            fk_buffer_copy_from_host(buf, p, bytes, s),
                        )
                    };
                    if check(st, name) {
                        assert_eq!(
                            bytes, nbytes,
                            "{name} accepted {bytes} bytes for a buffer of {nbytes}"
                        );
                        let mut back = vec![0u8; nbytes];
                        let (name2, st2) = if b.bool() {
                            (
                                "fk_buffer_copy_to_host_async",
                                fk_buffer_copy_to_host_async(
                                    buf,
                                    back.as_mut_ptr() as *mut c_void,
                                    nbytes,
                                    s,
                                ),
                            )
                        } else {
                            (
                                "fk_buffer_copy_to_host",
                                fk_buffer_copy_to_host(
                                    buf,
                                    back.as_mut_ptr() as *mut c_void,
                                    nbytes,
                                    s,
                                ),
                            )
                        };
                        if check(st2, name2) && s.is_null() || st2 == FK_OK {
                            assert_eq!(
                                back,
                                host[..nbytes],
                                "copy to host after copy from host differs"
                            );
                        }
                    } else if !p.is_null() {
                        let (name2, st2) = (
                            "fk_buffer_copy_to_host",
                            fk_buffer_copy_to_host(buf, p, bytes, s),
                        );
                        check(st2, name2);
                    }
                }
                12 => {
                    let safe: Vec<*mut fk_buffer> =
                        h.bufs.iter().filter(|x| x.1).map(|x| x.0).collect();
                    let (dst, src) = (
                        pick(&mut b, &safe).unwrap_or(null_mut()),
                        pick(&mut b, &safe).unwrap_or(null_mut()),
                    );
                    let s = if b.bool() {
                        any(&mut b, &h, &h.streams) as *const _
                    } else {
                        null()
                    };
                    check(fk_buffer_copy(dst, src, s), "fk_buffer_copy");
                }
                13 => {
                    let all: Vec<*mut fk_buffer> = h.bufs.iter().map(|x| x.0).collect();
                    let buf = any(&mut b, &h, &all);
                    let (mut kind, mut ord, mut nb, mut dt) = (0, 0, 0usize, 0);
                    check(
                        fk_buffer_device(buf, &mut kind, &mut ord),
                        "fk_buffer_device",
                    );
                    check(fk_buffer_nbytes(buf, &mut nb), "fk_buffer_nbytes");
                    check(fk_buffer_dtype(buf, null_mut()), "fk_buffer_dtype");
                    if check(fk_buffer_dtype(buf, &mut dt), "fk_buffer_dtype") {
                        view(buf);
                    }
                }
                14 => {
                    let c = any(&mut b, &h, &h.ctxs);
                    let mut e = null_mut();
                    if check(fk_event_create(c, &mut e), "fk_event_create") {
                        h.events.push(e);
                    }
                }
                15 => {
                    if let Some(e) = take(&mut b, &mut h.events) {
                        assert!(check(fk_event_destroy(e), "fk_event_destroy"));
                    }
                }
                16 => {
                    let e = any(&mut b, &h, &h.events);
                    let s = if b.bool() {
                        any(&mut b, &h, &h.streams) as *const _
                    } else {
                        null()
                    };
                    check(fk_event_record(e, s), "fk_event_record");
                    let s2 = any(&mut b, &h, &h.streams);
                    check(fk_stream_wait_event(s2, e), "fk_stream_wait_event");
                    check(fk_event_synchronize(e), "fk_event_synchronize");
                    let mut done = 0;
                    if check(fk_event_query(e, &mut done), "fk_event_query") {
                        assert!(done == 0 || done == 1);
                    }
                    let e2 = any(&mut b, &h, &h.events);
                    let mut ms = 0f32;
                    check(
                        fk_event_elapsed_ms(e, e2, if b.one_in(8) { null_mut() } else { &mut ms }),
                        "fk_event_elapsed_ms",
                    );
                }
                17 => {
                    let c = any(&mut b, &h, &h.ctxs);
                    let mut stats = [0u64; 12];
                    let size = match b.u8() % 4 {
                        0 => b.u8() as u64,
                        _ => 96,
                    };
                    stats[0] = size;
                    check(
                        fk_context_memory_stats(
                            c,
                            if b.one_in(10) {
                                null_mut()
                            } else {
                                stats.as_mut_ptr() as *mut _
                            },
                        ),
                        "fk_context_memory_stats",
                    );
                    assert_eq!(stats[0], size, "fk_context_memory_stats changed size");
                    check(
                        fk_context_set_release_threshold(c, b.u64()),
                        "fk_context_set_release_threshold",
                    );
                    check(fk_context_trim(c, b.u64()), "fk_context_trim");
                    let (mut f, mut t) = (0u64, 0u64);
                    check(fk_context_memory(c, &mut f, &mut t), "fk_context_memory");
                }
                18 => {
                    let c = any(&mut b, &h, &h.ctxs);
                    let cap = b.below(40);
                    let mut name = vec![0x55u8; cap];
                    let mut needed = 0usize;
                    let bufp = if b.one_in(4) {
                        null_mut()
                    } else {
                        name.as_mut_ptr() as *mut std::ffi::c_char
                    };
                    let st = fk_context_name(c, bufp, cap, &mut needed);
                    if st != FK_ERROR_BUFFER_TOO_SMALL {
                        check(st, "fk_context_name");
                    }
                    if st == FK_OK && !bufp.is_null() {
                        assert!(needed <= cap && name[needed - 1] == 0);
                    }
                    let (mut kind, mut ord, mut maj, mut min) = (0, 0, 0, 0);
                    check(
                        fk_context_device(c, &mut kind, &mut ord),
                        "fk_context_device",
                    );
                    check(
                        fk_context_compute_capability(c, &mut maj, &mut min),
                        "fk_context_compute_capability",
                    );
                    check(fk_context_warmup(c), "fk_context_warmup");
                }
                19 => {
                    // Message copies into buffers of any capacity.
                    let cap = b.below(64);
                    let mut buf = vec![0x55u8; cap + 1];
                    let mut needed = 0usize;
                    let st =
                        fk_last_error_message_copy(buf.as_mut_ptr() as *mut _, cap, &mut needed);
                    let msg = last_message();
                    assert_eq!(needed, msg.len() + 1);
                    if cap > 0 {
                        let n = msg.len().min(cap - 1);
                        assert_eq!(&buf[..n], &msg.as_bytes()[..n]);
                        assert_eq!(buf[n], 0);
                        assert_eq!(st == FK_OK, n == msg.len());
                    }
                    assert_eq!(
                        buf[cap], 0x55,
                        "fk_last_error_message_copy wrote past capacity"
                    );
                }
                20 => {
                    let d = b.dtype();
                    let mut sz = 0usize;
                    if check(fk_dtype_size(d, &mut sz), "fk_dtype_size") {
                        assert_eq!(sz, elem_size(d));
                    }
                    let s = fk_status_string(b.u8() as i32 - 20);
                    assert!(!s.is_null());
                    let mut n = 0;
                    check(fk_device_count(&mut n), "fk_device_count");
                    let mut peer = 0;
                    check(
                        fk_device_can_access_peer(b.u8() as i32 - 1, b.u8() as i32 - 1, &mut peer),
                        "fk_device_can_access_peer",
                    );
                }
                21 => {
                    // An op on handles from two different contexts (both CPU).
                    let safe: Vec<*mut fk_buffer> =
                        h.bufs.iter().filter(|x| x.1).map(|x| x.0).collect();
                    let (x, y, o) = (
                        pick(&mut b, &safe).unwrap_or(null_mut()),
                        pick(&mut b, &safe).unwrap_or(null_mut()),
                        pick(&mut b, &safe).unwrap_or(null_mut()),
                    );
                    let s = if b.bool() {
                        any(&mut b, &h, &h.streams) as *const _
                    } else {
                        null()
                    };
                    check(fk_add(x, y, o, s), "fk_add");
                }
                22 => {
                    // Export and let the consumer release it, now or after the buffer.
                    let all: Vec<*mut fk_buffer> = h.bufs.iter().map(|x| x.0).collect();
                    let buf = any(&mut b, &h, &all);
                    let mut m: *mut c_void = null_mut();
                    if check(fk_buffer_to_dlpack(buf, &mut m), "fk_buffer_to_dlpack") {
                        let m = m as *mut DLManagedTensorVersioned;
                        if let Some(del) = (*m).deleter {
                            del(m);
                        }
                    }
                }
                _ => {
                    let c = any(&mut b, &h, &h.ctxs);
                    let mut id = [0u8; 128];
                    check(fk_comm_unique_id(id.as_mut_ptr()), "fk_comm_unique_id");
                    let mut comm = null_mut();
                    if check(
                        fk_comm_init_rank(
                            c,
                            b.u8() as i32 - 1,
                            id.as_ptr(),
                            b.u8() as i32 - 1,
                            &mut comm,
                        ),
                        "fk_comm_init_rank",
                    ) {
                        assert!(check(fk_comm_destroy(comm), "fk_comm_destroy"));
                    }
                }
            }
        }
    }
    // Teardown in an order the input chooses: buffers and streams may outlive
    // their context.
    // SAFETY: every handle is live and destroyed once.
    unsafe {
        if b.bool() {
            for c in h.ctxs.drain(..) {
                assert!(check(fk_context_destroy(c), "fk_context_destroy"));
            }
        }
        for (x, _) in h.bufs.drain(..) {
            assert!(check(fk_buffer_destroy(x), "fk_buffer_destroy"));
        }
        for s in h.streams.drain(..) {
            assert!(check(fk_stream_destroy(s), "fk_stream_destroy"));
        }
        for e in h.events.drain(..) {
            assert!(check(fk_event_destroy(e), "fk_event_destroy"));
        }
        for c in h.ctxs.drain(..) {
            let mut stats = [0u64; 12];
            stats[0] = 96;
            assert!(check(
                fk_context_memory_stats(c, stats.as_mut_ptr() as *mut _),
                "fk_context_memory_stats"
            ));
            assert_eq!(
                (stats[1], stats[6]),
                (0, 0),
                "allocated bytes / live allocations left after every buffer was destroyed"
            );
            assert!(check(fk_context_destroy(c), "fk_context_destroy"));
        }
    }
});
