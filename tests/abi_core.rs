//! The core C ABI (versions, statuses, messages, contexts, streams, buffers, DLPack)
//! driven through the `extern "C"` functions, as a C caller would.

mod common;

use std::ffi::{c_char, c_void};
use std::ptr::{null, null_mut};

use common::*;

/// Provokes a failure whose message mentions `tag` (an unknown dtype value).
fn fail_with(tag: i32) -> String {
    let mut sz = 0usize;
    let s = unsafe { fk_dtype_size(tag, &mut sz) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_dtype_size", &format!("dtype = {tag}")],
    );
    last_error()
}

/// `fk_last_error_message_copy` into a buffer of `cap` bytes prefilled with `#`;
/// returns the status, the buffer and `*needed`.
fn copy_message(cap: usize) -> (fk_status, Vec<u8>, usize) {
    let mut buf = vec![b'#'; cap];
    let mut needed = usize::MAX;
    let s =
        unsafe { fk_last_error_message_copy(buf.as_mut_ptr() as *mut c_char, cap, &mut needed) };
    (s, buf, needed)
}

// ------------------------------------------------------------------ versions, statuses

#[test]
fn versions() {
    assert_eq!(fk_abi_version(), FK_ABI_VERSION);
    assert_eq!(FK_ABI_VERSION, 1002);
    let v = cstr(fk_version_string());
    assert_eq!(v, format!("fusekit {}", env!("CARGO_PKG_VERSION")));
    // Static: the same pointer every time.
    assert_eq!(fk_version_string(), fk_version_string());
}

#[test]
fn abi_mismatch_is_refused() {
    for bad in [0u32, 999, 1003, 1999, 2000, u32::MAX] {
        let mut c = null_mut();
        let s = unsafe { fk_context_create(bad, FK_DEVICE_CPU, 0, &mut c) };
        expect_status(
            s,
            FK_ERROR_ABI_MISMATCH,
            &["fk_context_create", &format!("ABI version {bad}"), "1002"],
        );
        assert!(c.is_null());
    }
    let mut c = null_mut();
    ok(unsafe { fk_context_create(FK_ABI_VERSION, FK_DEVICE_CPU, 0, &mut c) });
    ok(unsafe { fk_context_destroy(c) });
}

/// The values the tests use (from the crate) are the header's.
#[test]
fn header_constants_match() {
    let h = Header::read();
    let define = |name: &str| h.define(name);
    for (name, v) in STATUSES {
        assert_eq!(define(name), *v as i64, "{name}");
    }
    for d in DTYPES {
        let name = format!("FK_DTYPE_{}", dname(d).to_uppercase())
            .replace("COMPLEX64", "C64")
            .replace("COMPLEX128", "C128");
        assert_eq!(define(&name), d as i64, "{name}");
    }
    assert_eq!(define("FK_DEVICE_AUTO"), FK_DEVICE_AUTO as i64);
    assert_eq!(define("FK_DEVICE_CPU"), FK_DEVICE_CPU as i64);
    assert_eq!(define("FK_DEVICE_CUDA"), FK_DEVICE_CUDA as i64);
    assert_eq!(define("FK_ABI_VERSION"), FK_ABI_VERSION as i64);
    assert_eq!(define("FK_MAX_DIMS"), 8);
}

const STATUSES: &[(&str, fk_status)] = &[
    ("FK_OK", FK_OK),
    ("FK_ERROR_INVALID_ARGUMENT", FK_ERROR_INVALID_ARGUMENT),
    ("FK_ERROR_NULL_POINTER", FK_ERROR_NULL_POINTER),
    ("FK_ERROR_UNSUPPORTED_DTYPE", FK_ERROR_UNSUPPORTED_DTYPE),
    ("FK_ERROR_SHAPE_MISMATCH", FK_ERROR_SHAPE_MISMATCH),
    ("FK_ERROR_DEVICE_MISMATCH", FK_ERROR_DEVICE_MISMATCH),
    ("FK_ERROR_ALIASING", FK_ERROR_ALIASING),
    ("FK_ERROR_OUT_OF_MEMORY", FK_ERROR_OUT_OF_MEMORY),
    ("FK_ERROR_CUDA_UNAVAILABLE", FK_ERROR_CUDA_UNAVAILABLE),
    ("FK_ERROR_LIBRARY_NOT_FOUND", FK_ERROR_LIBRARY_NOT_FOUND),
    ("FK_ERROR_KERNEL_COMPILE", FK_ERROR_KERNEL_COMPILE),
    ("FK_ERROR_CUDA", FK_ERROR_CUDA),
    ("FK_ERROR_ABI_MISMATCH", FK_ERROR_ABI_MISMATCH),
    ("FK_ERROR_BUFFER_TOO_SMALL", FK_ERROR_BUFFER_TOO_SMALL),
    ("FK_ERROR_UNSUPPORTED", FK_ERROR_UNSUPPORTED),
    ("FK_ERROR_INTERNAL", FK_ERROR_INTERNAL),
    ("FK_ERROR_IO", FK_ERROR_IO),
    ("FK_ERROR_DTYPE_MISMATCH", FK_ERROR_DTYPE_MISMATCH),
    ("FK_ERROR_NOT_CONVERGED", FK_ERROR_NOT_CONVERGED),
];

#[test]
fn every_status_has_its_name() {
    for (i, (name, v)) in STATUSES.iter().enumerate() {
        assert_eq!(*v, i as fk_status, "statuses are numbered densely from 0");
        assert_eq!(status_name(*v), *name);
        assert_eq!(fk_status_string(*v), fk_status_string(*v), "static string");
    }
    for unknown in [19, 20, 100, -1, i32::MIN, i32::MAX] {
        assert_eq!(status_name(unknown), "FK_UNKNOWN_STATUS", "{unknown}");
    }
}

// ------------------------------------------------------------------ last error message

#[test]
fn last_error_message_pointer_and_copy_forms() {
    // A fresh thread has an empty message.
    std::thread::spawn(|| {
        assert_eq!(last_error(), "");
        let mut needed = 0;
        ok(unsafe { fk_last_error_message_copy(null_mut(), 0, &mut needed) });
        assert_eq!(needed, 1);
        let (s, buf, _) = copy_message(1);
        ok(s);
        assert_eq!(buf[0], 0);
    })
    .join()
    .unwrap();

    let msg = fail_with(99);
    assert!(msg.starts_with("fk_dtype_size: "), "{msg}");
    let len = msg.len();

    // Size query: buf NULL (any capacity) returns FK_OK and the size with the NUL.
    let mut needed = 0usize;
    ok(unsafe { fk_last_error_message_copy(null_mut(), 0, &mut needed) });
    assert_eq!(needed, len + 1);
    ok(unsafe { fk_last_error_message_copy(null_mut(), 5, &mut needed) });
    assert_eq!(needed, len + 1);

    // Exact fit.
    let (s, buf, needed) = copy_message(len + 1);
    ok(s);
    assert_eq!(needed, len + 1);
    assert_eq!(&buf[..len], msg.as_bytes());
    assert_eq!(buf[len], 0);

    // Larger buffer: bytes after the NUL are untouched.
    let (s, buf, _) = copy_message(len + 8);
    ok(s);
    assert_eq!(&buf[..len], msg.as_bytes());
    assert_eq!(buf[len], 0);
    assert!(buf[len + 1..].iter().all(|&b| b == b'#'));

    // One byte short: a truncated, NUL-terminated prefix.
    let (s, buf, needed) = copy_message(len);
    assert_eq!(s, FK_ERROR_BUFFER_TOO_SMALL);
    assert_eq!(needed, len + 1);
    assert_eq!(&buf[..len - 1], &msg.as_bytes()[..len - 1]);
    assert_eq!(buf[len - 1], 0);

    let (s, buf, _) = copy_message(10);
    assert_eq!(s, FK_ERROR_BUFFER_TOO_SMALL);
    assert_eq!(&buf[..9], &msg.as_bytes()[..9]);
    assert_eq!(buf[9], 0);

    // Capacity 1: just the NUL. Capacity 0: nothing written.
    let (s, buf, _) = copy_message(1);
    assert_eq!(s, FK_ERROR_BUFFER_TOO_SMALL);
    assert_eq!(buf[0], 0);
    let mut b = [b'#'; 1];
    let s = unsafe { fk_last_error_message_copy(b.as_mut_ptr() as *mut c_char, 0, null_mut()) };
    assert_eq!(s, FK_ERROR_BUFFER_TOO_SMALL);
    assert_eq!(b[0], b'#');

    // `needed` is optional.
    let mut b = vec![0u8; len + 1];
    ok(unsafe { fk_last_error_message_copy(b.as_mut_ptr() as *mut c_char, len + 1, null_mut()) });

    // None of the copies (not even the too-small ones) changed the message.
    assert_eq!(last_error(), msg);

    // Successful calls leave it unchanged too.
    let mut sz = 0;
    ok(unsafe { fk_dtype_size(FK_DTYPE_F32, &mut sz) });
    let _ctx = Ctx::cpu();
    assert_eq!(last_error(), msg);

    // The next failure replaces it.
    let other = fail_with(-5);
    assert_ne!(other, msg);
    assert_eq!(last_error(), other);
}

#[test]
fn last_error_message_is_thread_local() {
    let mine = fail_with(41);
    let (tx, rx) = std::sync::mpsc::channel();
    let (tx2, rx2) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        assert_eq!(
            last_error(),
            "",
            "a new thread starts with an empty message"
        );
        let theirs = fail_with(42);
        tx.send(theirs.clone()).unwrap();
        // Wait until the main thread has checked its own message, then check ours.
        rx2.recv().unwrap();
        assert_eq!(last_error(), theirs);
    });
    let theirs = rx.recv().unwrap();
    assert!(theirs.contains("dtype = 42"));
    assert_eq!(
        last_error(),
        mine,
        "a failure on another thread changed this thread's message"
    );
    let (_, buf, needed) = copy_message(mine.len() + 1);
    assert_eq!(&buf[..needed - 1], mine.as_bytes());
    tx2.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(last_error(), mine);
}

// ------------------------------------------------------------------ dtypes, devices

#[test]
fn dtype_sizes() {
    for (d, n) in [
        (FK_DTYPE_F16, 2),
        (FK_DTYPE_BF16, 2),
        (FK_DTYPE_F32, 4),
        (FK_DTYPE_F64, 8),
        (FK_DTYPE_C64, 8),
        (FK_DTYPE_C128, 16),
    ] {
        let mut sz = 0;
        ok(unsafe { fk_dtype_size(d, &mut sz) });
        assert_eq!(sz, n, "{}", dname(d));
        assert_eq!(dsize(d), n);
    }
    for bad in [0, 7, -1, i32::MAX] {
        let mut sz = 0;
        let s = unsafe { fk_dtype_size(bad, &mut sz) };
        expect_status(
            s,
            FK_ERROR_INVALID_ARGUMENT,
            &["fk_dtype_size", "dtype", "not a valid fk_dtype"],
        );
    }
    let s = unsafe { fk_dtype_size(FK_DTYPE_F32, null_mut()) };
    expect_status(s, FK_ERROR_NULL_POINTER, &["fk_dtype_size", "out is NULL"]);
}

#[test]
fn device_count_reports_and_checks_its_argument() {
    let n = device_count();
    println!("fk_device_count = {n}");
    let s = unsafe { fk_device_count(null_mut()) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_device_count", "out is NULL"],
    );
}

// ------------------------------------------------------------------ contexts

#[test]
fn cpu_context_queries() {
    let ctx = Ctx::cpu();
    assert_eq!(ctx.device(), (FK_DEVICE_CPU, 0));
    // Either out-pointer may be NULL.
    let mut k = -1;
    ok(unsafe { fk_context_device(ctx.raw(), &mut k, null_mut()) });
    assert_eq!(k, FK_DEVICE_CPU);
    let mut o = -1;
    ok(unsafe { fk_context_device(ctx.raw(), null_mut(), &mut o) });
    assert_eq!(o, 0);

    // Name, with the copy protocol.
    let mut needed = 0usize;
    ok(unsafe { fk_context_name(ctx.raw(), null_mut(), 0, &mut needed) });
    assert!(needed > 1);
    let mut buf = vec![b'#'; needed];
    let mut needed2 = 0usize;
    ok(unsafe {
        fk_context_name(
            ctx.raw(),
            buf.as_mut_ptr() as *mut c_char,
            needed,
            &mut needed2,
        )
    });
    assert_eq!(needed2, needed);
    assert_eq!(buf[needed - 1], 0);
    let name = String::from_utf8(buf[..needed - 1].to_vec()).unwrap();
    assert!(!name.is_empty() && !name.contains('\0'));
    println!("CPU context name: {name}");
    let mut small = vec![b'#'; 4];
    let s = unsafe { fk_context_name(ctx.raw(), small.as_mut_ptr() as *mut c_char, 4, null_mut()) };
    expect_status(s, FK_ERROR_BUFFER_TOO_SMALL, &["fk_context_name", "buf"]);
    assert_eq!(&small[..3], &name.as_bytes()[..3]);
    assert_eq!(small[3], 0);

    // Compute capability 0.0 on the CPU.
    let (mut ma, mut mi) = (-1, -1);
    ok(unsafe { fk_context_compute_capability(ctx.raw(), &mut ma, &mut mi) });
    assert_eq!((ma, mi), (0, 0));

    // Host memory.
    let (mut free, mut total) = (0u64, 0u64);
    ok(unsafe { fk_context_memory(ctx.raw(), &mut free, &mut total) });
    assert!(
        total > 0 && free > 0 && free <= total,
        "free {free} total {total}"
    );

    // Warm-up is a no-op on the CPU.
    ok(unsafe { fk_context_warmup(ctx.raw()) });

    // NULL arguments.
    let s = unsafe { fk_context_device(null(), &mut k, &mut o) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_context_device", "ctx is NULL"],
    );
    let s = unsafe { fk_context_name(null(), null_mut(), 0, &mut needed) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_context_name", "ctx is NULL"],
    );
    let s = unsafe { fk_context_compute_capability(ctx.raw(), null_mut(), &mut mi) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_context_compute_capability", "major is NULL"],
    );
    let s = unsafe { fk_context_compute_capability(ctx.raw(), &mut ma, null_mut()) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_context_compute_capability", "minor is NULL"],
    );
    let s = unsafe { fk_context_memory(ctx.raw(), null_mut(), &mut total) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_context_memory", "free_bytes is NULL"],
    );
    let s = unsafe { fk_context_memory(ctx.raw(), &mut free, null_mut()) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_context_memory", "total_bytes is NULL"],
    );
    let s = unsafe { fk_context_warmup(null()) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_context_warmup", "ctx is NULL"],
    );
    let s = unsafe { fk_context_create(FK_ABI_VERSION, FK_DEVICE_CPU, 0, null_mut()) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_context_create", "out is NULL"],
    );
}

#[test]
fn auto_context_falls_back_to_the_cpu() {
    let ctx = Ctx::try_new(FK_DEVICE_AUTO, 0).expect("AUTO never fails");
    let want = if device_count() == 0 {
        FK_DEVICE_CPU
    } else {
        FK_DEVICE_CUDA
    };
    assert_eq!(ctx.device().0, want);
}

#[test]
fn cuda_context_and_invalid_kinds() {
    if device_count() == 0 {
        let mut c = null_mut();
        let s = unsafe { fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, 0, &mut c) };
        expect_status(s, FK_ERROR_CUDA_UNAVAILABLE, &["fk_context_create"]);
        assert!(c.is_null());
        println!("no GPU: FK_DEVICE_CUDA refused with: {}", last_error());
    } else {
        println!("a GPU is present: the CUDA_UNAVAILABLE assertion does not apply");
    }
    let mut c = null_mut();
    let s = unsafe { fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, -1, &mut c) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_context_create", "ordinal = -1"],
    );
    for kind in [3, -1, 99] {
        let s = unsafe { fk_context_create(FK_ABI_VERSION, kind, 0, &mut c) };
        expect_status(
            s,
            FK_ERROR_INVALID_ARGUMENT,
            &["fk_context_create", &format!("kind = {kind}")],
        );
        assert!(c.is_null());
    }
}

// ------------------------------------------------------------------ streams

#[test]
fn cpu_streams() {
    let ctx = Ctx::cpu();
    let s = Stream::new(&ctx);
    s.sync();
    assert!(s.handle().is_null(), "a CPU stream has no CUstream");
    drop(s);

    let mut w = null_mut();
    let st = unsafe { fk_stream_wrap(ctx.raw(), null_mut(), &mut w) };
    expect_status(st, FK_ERROR_UNSUPPORTED, &["fk_stream_wrap", "CPU context"]);
    assert!(w.is_null());
    let mut fake = 0x1234usize as *mut c_void;
    let st = unsafe { fk_stream_wrap(ctx.raw(), fake, &mut w) };
    expect_status(st, FK_ERROR_UNSUPPORTED, &["fk_stream_wrap"]);

    let st = unsafe { fk_stream_create(null(), &mut w) };
    expect_status(
        st,
        FK_ERROR_NULL_POINTER,
        &["fk_stream_create", "ctx is NULL"],
    );
    let st = unsafe { fk_stream_create(ctx.raw(), null_mut()) };
    expect_status(
        st,
        FK_ERROR_NULL_POINTER,
        &["fk_stream_create", "out is NULL"],
    );
    let st = unsafe { fk_stream_synchronize(null()) };
    expect_status(
        st,
        FK_ERROR_NULL_POINTER,
        &["fk_stream_synchronize", "stream is NULL"],
    );
    let st = unsafe { fk_stream_handle(null(), &mut fake) };
    expect_status(
        st,
        FK_ERROR_NULL_POINTER,
        &["fk_stream_handle", "stream is NULL"],
    );
    let s = Stream::new(&ctx);
    let st = unsafe { fk_stream_handle(s.raw(), null_mut()) };
    expect_status(
        st,
        FK_ERROR_NULL_POINTER,
        &["fk_stream_handle", "out is NULL"],
    );
}

// ------------------------------------------------------------------ buffers

#[test]
fn buffers_of_every_dtype_and_their_accessors() {
    let ctx = Ctx::cpu();
    let mut rng = Rng::new(100);
    for d in DTYPES {
        let b = Buf::new(&ctx, d, &[2, 3, 4]);
        assert_eq!(b.dtype(), d);
        assert_eq!(b.ndim(), 3);
        assert_eq!(b.shape(), vec![2, 3, 4]);
        assert_eq!(b.strides(), vec![12, 4, 1]);
        assert_eq!(b.numel(), 24);
        assert_eq!(b.nbytes(), 24 * dsize(d));
        assert!(b.is_contiguous());
        assert!(!b.data().is_null());
        assert_eq!(b.device(), (FK_DEVICE_CPU, 0));
        let vals = random_values(&mut rng, d, 24, Domain::Signed);
        b.write(&vals);
        assert_eq!(b.read(), vals);
        // Either device out-pointer may be NULL.
        ok(unsafe { fk_buffer_device(b.raw(), null_mut(), null_mut()) });
    }
}

#[test]
fn scalar_and_empty_buffers() {
    let ctx = Ctx::cpu();
    for d in DTYPES {
        // ndim 0 with a NULL shape: one element.
        let mut p = null_mut();
        ok(unsafe { fk_buffer_create(ctx.raw(), d, 0, null(), null(), &mut p) });
        let b = Buf(p);
        assert_eq!(b.ndim(), 0);
        assert_eq!(b.numel(), 1);
        assert_eq!(b.nbytes(), dsize(d));
        assert!(b.is_contiguous());
        ok(unsafe { fk_buffer_shape(b.raw(), null_mut()) });
        ok(unsafe { fk_buffer_strides(b.raw(), null_mut()) });
        b.write(&[cx(2.5, if is_complex(d) { -1.0 } else { 0.0 })]);
        assert_eq!(b.read()[0].re, 2.5);

        for shape in [&[0i64][..], &[4, 0, 3][..], &[0, 0][..]] {
            let b = Buf::new(&ctx, d, shape);
            assert_eq!(b.shape(), shape);
            assert_eq!(b.numel(), 0);
            assert_eq!(b.nbytes(), 0);
            assert!(b.is_contiguous());
            // Zero-byte copies, with or without a pointer.
            ok(unsafe { fk_buffer_copy_from_host(b.raw(), null(), 0, null()) });
            ok(unsafe { fk_buffer_copy_to_host(b.raw(), null_mut(), 0, null()) });
            let x = [0u8; 1];
            ok(unsafe {
                fk_buffer_copy_from_host(b.raw(), x.as_ptr() as *const c_void, 0, null())
            });
            let s = unsafe {
                fk_buffer_copy_from_host(b.raw(), x.as_ptr() as *const c_void, 1, null())
            };
            expect_status(
                s,
                FK_ERROR_SHAPE_MISMATCH,
                &["fk_buffer_copy_from_host", "bytes = 1"],
            );
        }
    }
}

#[test]
fn invalid_buffer_arguments() {
    let ctx = Ctx::cpu();
    let mut p = null_mut();
    let create = |dtype: fk_dtype, ndim: i32, shape: *const i64, p: &mut *mut fk_buffer| unsafe {
        fk_buffer_create(ctx.raw(), dtype, ndim, shape, null(), p)
    };
    let s = create(FK_DTYPE_F32, 2, [3i64, -2].as_ptr(), &mut p);
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_create", "shape[1] = -2 is negative"],
    );
    let nine = [1i64; 9];
    let s = create(FK_DTYPE_F32, 9, nine.as_ptr(), &mut p);
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_create", "ndim = 9"],
    );
    let s = create(FK_DTYPE_F32, -1, nine.as_ptr(), &mut p);
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_create", "ndim = -1"],
    );
    // ndim 8 is the maximum and fine.
    let s = create(FK_DTYPE_F32, 8, nine.as_ptr(), &mut p);
    ok(s);
    let b = Buf(p);
    assert_eq!(b.shape(), vec![1; 8]);
    drop(b);
    p = null_mut();
    let s = create(FK_DTYPE_F32, 2, null(), &mut p);
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_create", "shape is NULL"],
    );
    let s = create(0, 1, [2i64].as_ptr(), &mut p);
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_create", "dtype = 0"],
    );
    let s = create(7, 1, [2i64].as_ptr(), &mut p);
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_create", "dtype = 7"],
    );
    let s = create(FK_DTYPE_F32, 2, [1i64 << 40, 1 << 40].as_ptr(), &mut p);
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_create", "shape", "64 bits"],
    );
    let s = create(FK_DTYPE_C128, 2, [1i64 << 40, 1 << 20].as_ptr(), &mut p);
    expect_status(s, FK_ERROR_OUT_OF_MEMORY, &["fk_buffer_create"]);
    assert!(p.is_null(), "no handle is written on failure");
    let s = unsafe { fk_buffer_create(null(), FK_DTYPE_F32, 1, [2i64].as_ptr(), null(), &mut p) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_create", "ctx is NULL"],
    );
    let s = unsafe {
        fk_buffer_create(
            ctx.raw(),
            FK_DTYPE_F32,
            1,
            [2i64].as_ptr(),
            null(),
            null_mut(),
        )
    };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_create", "out is NULL"],
    );
    // A stream handle of the wrong kind.
    let s = unsafe {
        fk_buffer_create(
            ctx.raw(),
            FK_DTYPE_F32,
            1,
            [2i64].as_ptr(),
            ctx.raw() as *const fk_stream,
            &mut p,
        )
    };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_create", "stream", "fk_stream"],
    );

    // Accessors with NULL arguments.
    let b = Buf::new(&ctx, FK_DTYPE_F32, &[2]);
    let mut i = 0i32;
    let mut l = 0i64;
    let mut z = 0usize;
    let mut v = null_mut();
    let checks: [(&str, fk_status); 9] = unsafe {
        [
            ("fk_buffer_dtype", fk_buffer_dtype(null(), &mut i)),
            ("fk_buffer_ndim", fk_buffer_ndim(null(), &mut i)),
            ("fk_buffer_shape", fk_buffer_shape(null(), &mut l)),
            ("fk_buffer_strides", fk_buffer_strides(null(), &mut l)),
            ("fk_buffer_numel", fk_buffer_numel(null(), &mut l)),
            ("fk_buffer_nbytes", fk_buffer_nbytes(null(), &mut z)),
            (
                "fk_buffer_is_contiguous",
                fk_buffer_is_contiguous(null(), &mut i),
            ),
            ("fk_buffer_data", fk_buffer_data(null(), &mut v)),
            ("fk_buffer_device", fk_buffer_device(null(), &mut i, &mut i)),
        ]
    };
    for (name, s) in checks {
        assert_eq!(s, FK_ERROR_NULL_POINTER, "{name}");
    }
    let s = unsafe { fk_buffer_numel(null(), &mut l) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_numel", "buf is NULL"],
    );
    let checks: [(&str, fk_status); 8] = unsafe {
        [
            ("fk_buffer_dtype", fk_buffer_dtype(b.raw(), null_mut())),
            ("fk_buffer_ndim", fk_buffer_ndim(b.raw(), null_mut())),
            ("fk_buffer_shape", fk_buffer_shape(b.raw(), null_mut())),
            ("fk_buffer_strides", fk_buffer_strides(b.raw(), null_mut())),
            ("fk_buffer_numel", fk_buffer_numel(b.raw(), null_mut())),
            ("fk_buffer_nbytes", fk_buffer_nbytes(b.raw(), null_mut())),
            (
                "fk_buffer_is_contiguous",
                fk_buffer_is_contiguous(b.raw(), null_mut()),
            ),
            ("fk_buffer_data", fk_buffer_data(b.raw(), null_mut())),
        ]
    };
    for (name, s) in checks {
        assert_eq!(s, FK_ERROR_NULL_POINTER, "{name}");
    }
    let s = unsafe { fk_buffer_shape(b.raw(), null_mut()) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_shape", "out is NULL"],
    );
}

#[test]
fn wrapped_memory_is_shared() {
    let ctx = Ctx::cpu();
    let mut mem: Vec<f64> = (0..6).map(|i| i as f64).collect();
    let p = mem.as_mut_ptr() as *mut c_void;
    // Without strides: contiguous.
    let b = unsafe { Buf::wrap(&ctx, p, FK_DTYPE_F64, &[2, 3], None) };
    assert_eq!(b.data(), p);
    assert_eq!(b.strides(), vec![3, 1]);
    assert!(b.is_contiguous());
    assert_eq!(b.read(), (0..6).map(|i| re(i as f64)).collect::<Vec<_>>());
    // Write through the buffer, see it in the caller's memory...
    b.write(&[re(10.0), re(11.0), re(12.0), re(13.0), re(14.0), re(15.0)]);
    drop(b);
    assert_eq!(mem, vec![10.0, 11.0, 12.0, 13.0, 14.0, 15.0]);
    // ...and the other way round.
    let b = unsafe { Buf::wrap(&ctx, p, FK_DTYPE_F64, &[2, 3], Some(&[3, 1])) };
    assert!(b.is_contiguous());
    mem[4] = -4.0;
    assert_eq!(b.read()[4], re(-4.0));
    drop(b);

    // Explicit strides: a transposed view, a zero-stride view and a reversed view.
    let t = unsafe { Buf::wrap(&ctx, p, FK_DTYPE_F64, &[3, 2], Some(&[1, 3])) };
    assert_eq!(t.strides(), vec![1, 3]);
    assert!(!t.is_contiguous());
    let z = unsafe { Buf::wrap(&ctx, p, FK_DTYPE_F64, &[4, 3], Some(&[0, 1])) };
    assert_eq!(z.strides(), vec![0, 1]);
    assert!(!z.is_contiguous());
    let last = unsafe { (p as *mut f64).add(5) } as *mut c_void;
    let r = unsafe { Buf::wrap(&ctx, last, FK_DTYPE_F64, &[6], Some(&[-1])) };
    assert_eq!(r.strides(), vec![-1]);
    assert_eq!(r.data(), last);
    assert!(!r.is_contiguous());
    // Non-contiguous views cannot be copied to or from the host...
    let mut host = [0.0f64; 6];
    let s =
        unsafe { fk_buffer_copy_to_host(t.raw(), host.as_mut_ptr() as *mut c_void, 48, null()) };
    expect_status(
        s,
        FK_ERROR_UNSUPPORTED,
        &["fk_buffer_copy_to_host", "not contiguous", "fk_copy"],
    );
    let s =
        unsafe { fk_buffer_copy_from_host(r.raw(), host.as_ptr() as *const c_void, 48, null()) };
    expect_status(
        s,
        FK_ERROR_UNSUPPORTED,
        &["fk_buffer_copy_from_host", "not contiguous"],
    );
    // ...but fk_copy makes them contiguous, reading the shared memory.
    let out = Buf::new(&ctx, FK_DTYPE_F64, &[6]);
    ok(unsafe { fk_copy(r.raw(), out.raw(), null()) });
    let m: Vec<Cx> = mem.iter().rev().map(|&v| re(v)).collect();
    assert_eq!(out.read(), m);
    let out = Buf::new(&ctx, FK_DTYPE_F64, &[3, 2]);
    ok(unsafe { fk_copy(t.raw(), out.raw(), null()) });
    assert_eq!(out.read(), [0, 3, 1, 4, 2, 5].map(|i| re(mem[i])).to_vec());
    let out = Buf::new(&ctx, FK_DTYPE_F64, &[4, 3]);
    ok(unsafe { fk_copy(z.raw(), out.raw(), null()) });
    assert_eq!(
        out.read(),
        (0..12).map(|i| re(mem[i % 3])).collect::<Vec<_>>()
    );
    drop((t, z, r));

    // Bad wraps.
    let mut h = null_mut();
    let s = unsafe {
        fk_buffer_wrap(
            ctx.raw(),
            null_mut(),
            FK_DTYPE_F64,
            1,
            [3i64].as_ptr(),
            null(),
            &mut h,
        )
    };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_wrap", "data is NULL"],
    );
    let s = unsafe {
        fk_buffer_wrap(
            ctx.raw(),
            p,
            FK_DTYPE_F64,
            1,
            [-3i64].as_ptr(),
            null(),
            &mut h,
        )
    };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_wrap", "shape[0] = -3"],
    );
    let s = unsafe {
        fk_buffer_wrap(
            ctx.raw(),
            p,
            FK_DTYPE_F64,
            9,
            [1i64; 9].as_ptr(),
            null(),
            &mut h,
        )
    };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_wrap", "ndim = 9"],
    );
    let s = unsafe { fk_buffer_wrap(ctx.raw(), p, FK_DTYPE_F64, 2, null(), null(), &mut h) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_wrap", "shape is NULL"],
    );
    let s = unsafe { fk_buffer_wrap(ctx.raw(), p, 9, 1, [3i64].as_ptr(), null(), &mut h) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_wrap", "dtype = 9"],
    );
    let s = unsafe {
        fk_buffer_wrap(
            ctx.raw(),
            p,
            FK_DTYPE_F64,
            2,
            [3i64, 3].as_ptr(),
            [i64::MAX, 1].as_ptr(),
            &mut h,
        )
    };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_wrap", "strides[0]", "overflows"],
    );
    let s = unsafe { fk_buffer_wrap(null(), p, FK_DTYPE_F64, 1, [3i64].as_ptr(), null(), &mut h) };
    expect_status(s, FK_ERROR_NULL_POINTER, &["fk_buffer_wrap", "ctx is NULL"]);
    let s = unsafe {
        fk_buffer_wrap(
            ctx.raw(),
            p,
            FK_DTYPE_F64,
            1,
            [3i64].as_ptr(),
            null(),
            null_mut(),
        )
    };
    expect_status(s, FK_ERROR_NULL_POINTER, &["fk_buffer_wrap", "out is NULL"]);
    assert!(h.is_null());
    // An empty wrap may have a NULL pointer; a scalar wrap needs no shape.
    let e = unsafe { Buf::wrap(&ctx, null_mut(), FK_DTYPE_F64, &[0, 5], None) };
    assert_eq!(e.numel(), 0);
    ok(unsafe { fk_buffer_wrap(ctx.raw(), p, FK_DTYPE_F64, 0, null(), null(), &mut h) });
    let sc = Buf(h);
    assert_eq!(sc.read(), vec![re(mem[0])]);
}

#[test]
fn host_copies_blocking_and_async() {
    let ctx = Ctx::cpu();
    let stream = Stream::new(&ctx);
    let b = Buf::new(&ctx, FK_DTYPE_F32, &[5]);
    let src: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0, 5.0];
    let mut dst = vec![0f32; 5];
    let sp = src.as_ptr() as *const c_void;
    let dp = dst.as_mut_ptr() as *mut c_void;
    for st in [null(), stream.raw() as *const fk_stream] {
        ok(unsafe { fk_buffer_copy_from_host(b.raw(), sp, 20, st) });
        ok(unsafe { fk_buffer_copy_to_host(b.raw(), dp, 20, st) });
        assert_eq!(dst, src);
        dst.fill(0.0);
        ok(unsafe { fk_buffer_copy_from_host_async(b.raw(), sp, 20, st) });
        ok(unsafe { fk_buffer_copy_to_host_async(b.raw(), dp, 20, st) });
        if !st.is_null() {
            ok(unsafe { fk_stream_synchronize(st) });
        }
        assert_eq!(dst, src);
        dst.fill(0.0);
    }
    type CopyIn =
        unsafe extern "C" fn(*const fk_buffer, *const c_void, usize, *const fk_stream) -> fk_status;
    type CopyOut =
        unsafe extern "C" fn(*const fk_buffer, *mut c_void, usize, *const fk_stream) -> fk_status;
    let ins: [(&str, CopyIn); 2] = [
        ("fk_buffer_copy_from_host", fk_buffer_copy_from_host),
        (
            "fk_buffer_copy_from_host_async",
            fk_buffer_copy_from_host_async,
        ),
    ];
    let outs: [(&str, CopyOut); 2] = [
        ("fk_buffer_copy_to_host", fk_buffer_copy_to_host),
        ("fk_buffer_copy_to_host_async", fk_buffer_copy_to_host_async),
    ];
    for (name, f) in ins {
        let s = unsafe { f(b.raw(), sp, 16, null()) };
        expect_status(
            s,
            FK_ERROR_SHAPE_MISMATCH,
            &[name, "bytes = 16", "20 bytes"],
        );
        let s = unsafe { f(b.raw(), sp, 24, null()) };
        expect_status(s, FK_ERROR_SHAPE_MISMATCH, &[name, "bytes = 24"]);
        let s = unsafe { f(b.raw(), null(), 20, null()) };
        expect_status(s, FK_ERROR_NULL_POINTER, &[name, "src is NULL"]);
        let s = unsafe { f(null(), sp, 20, null()) };
        expect_status(s, FK_ERROR_NULL_POINTER, &[name, "buf is NULL"]);
        let s = unsafe { f(b.raw(), sp, 20, b.raw() as *const fk_stream) };
        expect_status(s, FK_ERROR_INVALID_ARGUMENT, &[name, "stream"]);
    }
    for (name, f) in outs {
        let s = unsafe { f(b.raw(), dp, 4, null()) };
        expect_status(s, FK_ERROR_SHAPE_MISMATCH, &[name, "bytes = 4"]);
        let s = unsafe { f(b.raw(), null_mut(), 20, null()) };
        expect_status(s, FK_ERROR_NULL_POINTER, &[name, "dst is NULL"]);
        let s = unsafe { f(null(), dp, 20, null()) };
        expect_status(s, FK_ERROR_NULL_POINTER, &[name, "buf is NULL"]);
    }
    assert_eq!(dst, vec![0.0; 5], "failed copies wrote nothing");
}

#[test]
fn destroy_accepts_null_and_refuses_other_handle_kinds() {
    ok(unsafe { fk_context_destroy(null_mut()) });
    ok(unsafe { fk_stream_destroy(null_mut()) });
    ok(unsafe { fk_buffer_destroy(null_mut()) });

    let ctx = Ctx::cpu();
    let stream = Stream::new(&ctx);
    let buf = Buf::from_vals(&ctx, FK_DTYPE_F32, &[2], &[re(1.0), re(2.0)]);
    let s = unsafe { fk_buffer_destroy(stream.raw() as *mut fk_buffer) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_destroy", "not a live fk_buffer"],
    );
    let s = unsafe { fk_buffer_destroy(ctx.raw() as *mut fk_buffer) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_destroy", "fk_buffer"],
    );
    let s = unsafe { fk_stream_destroy(buf.raw() as *mut fk_stream) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_stream_destroy", "not a live fk_stream"],
    );
    let s = unsafe { fk_context_destroy(stream.raw() as *mut fk_context) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_context_destroy", "not a live fk_context"],
    );
    let s = unsafe { fk_context_destroy(buf.raw() as *mut fk_context) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_context_destroy", "fk_context"],
    );
    // Accessors and users check the kind as well.
    let mut n = 0i64;
    let s = unsafe { fk_buffer_numel(stream.raw() as *const fk_buffer, &mut n) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_numel", "buf", "fk_buffer"],
    );
    let s = unsafe { fk_stream_synchronize(buf.raw() as *const fk_stream) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_stream_synchronize", "stream", "fk_stream"],
    );
    let mut k = 0;
    let s = unsafe { fk_context_device(buf.raw() as *const fk_context, &mut k, null_mut()) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_context_device", "ctx", "fk_context"],
    );
    // The refused destroys left every handle alive.
    stream.sync();
    assert_eq!(buf.read(), vec![re(1.0), re(2.0)]);
    assert_eq!(ctx.device(), (FK_DEVICE_CPU, 0));
}

#[test]
fn buffers_and_streams_outlive_their_context_handle() {
    let ctx = Ctx::cpu();
    let stream = Stream::new(&ctx);
    let a = Buf::from_vals(&ctx, FK_DTYPE_F64, &[3], &[re(1.0), re(2.0), re(3.0)]);
    let b = Buf::new_on(&ctx, FK_DTYPE_F64, &[3], stream.raw());
    let out = Buf::new(&ctx, FK_DTYPE_F64, &[3]);
    drop(ctx); // fk_context_destroy, before any of its buffers
    b.write(&[re(10.0), re(20.0), re(30.0)]);
    ok(unsafe { fk_add(a.raw(), b.raw(), out.raw(), stream.raw()) });
    ok(unsafe { fk_exp(a.raw(), b.raw(), null()) });
    stream.sync();
    assert_eq!(out.read(), vec![re(11.0), re(22.0), re(33.0)]);
    assert_eq!(b.read()[0], re(1f64.exp()));
    assert_eq!(a.device(), (FK_DEVICE_CPU, 0));
    let m = export_dlpack(&a);
    drop((a, b, out));
    unsafe { delete_dlpack(m) };
    drop(stream);
}

// ------------------------------------------------------------------ DLPack
//
// The DLPack structs (tests/common) are written from dlpack.h, so these tests also
// check the layout the library reads and writes.

#[test]
fn dlpack_struct_layout_is_the_spec() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<DLDevice>(), 8);
    assert_eq!(size_of::<DLDataType>(), 4);
    assert_eq!(size_of::<DLTensor>(), 48);
    assert_eq!(offset_of!(DLTensor, device), 8);
    assert_eq!(offset_of!(DLTensor, ndim), 16);
    assert_eq!(offset_of!(DLTensor, dtype), 20);
    assert_eq!(offset_of!(DLTensor, shape), 24);
    assert_eq!(offset_of!(DLTensor, byte_offset), 40);
    assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
    assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
    assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
    assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
    assert_eq!(size_of::<DLManagedTensorVersioned>(), 80);
}

const F32: DLDataType = DLDataType {
    code: 2,
    bits: 32,
    lanes: 1,
};
const CPU: DLDevice = DLDevice {
    device_type: K_DL_CPU,
    device_id: 0,
};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn dlpack_round_trip_shares_memory_and_deletes_once() {
    let ctx = Ctx::cpu();
    for destroy_original_first in [true, false] {
        let made = make_tensor(
            f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            None,
            F32,
            &[2, 3],
            Some(&[3, 1]),
            CPU,
        );
        let b1 = import_dlpack(&ctx, made.managed).unwrap();
        assert_eq!(b1.data(), made.data as *mut c_void, "import does not copy");
        assert_eq!(b1.shape(), vec![2, 3]);
        assert_eq!(b1.strides(), vec![3, 1]);
        assert_eq!(b1.dtype(), FK_DTYPE_F32);
        assert_eq!(b1.device(), (FK_DEVICE_CPU, 0));
        assert_eq!(b1.read()[5], re(6.0));

        // Export the imported buffer: a DLPack 1.1 tensor over the same memory.
        let m2 = export_dlpack(&b1);
        unsafe {
            let m = &*m2;
            assert_eq!(m.version, DLPackVersion { major: 1, minor: 1 });
            assert!(m.deleter.is_some());
            assert_eq!(m.flags, 0);
            let t = &m.dl_tensor;
            assert_eq!(t.data, made.data as *mut c_void);
            assert_eq!(t.device, CPU);
            assert_eq!(t.ndim, 2);
            assert_eq!(t.dtype, F32);
            assert_eq!(std::slice::from_raw_parts(t.shape, 2), &[2, 3]);
            assert_eq!(std::slice::from_raw_parts(t.strides, 2), &[3, 1]);
            assert_eq!(t.byte_offset, 0);
        }
        // Import that export: fusekit now owns m2.
        let b2 = import_dlpack(&ctx, m2).unwrap();
        assert_eq!(b2.data(), made.data as *mut c_void);
        b2.write(&[re(-1.0), re(-2.0), re(-3.0), re(-4.0), re(-5.0), re(-6.0)]);
        assert_eq!(b1.read()[0], re(-1.0), "the two buffers share memory");

        let (first, second) = if destroy_original_first {
            (b1, b2)
        } else {
            (b2, b1)
        };
        drop(first);
        assert_eq!(made.calls(), 0, "deleted while a view is alive");
        assert_eq!(second.read()[1], re(-2.0));
        drop(second);
        assert_eq!(made.calls(), 1, "the deleter runs exactly once");
    }
}

#[test]
fn dlpack_export_keeps_memory_alive_after_destroy() {
    let ctx = Ctx::cpu();
    let b = Buf::from_vals(&ctx, FK_DTYPE_F64, &[3], &[re(7.0), re(8.0), re(9.0)]);
    let m = export_dlpack(&b);
    let m_b = export_dlpack(&b); // a second export, re-imported below
    drop(b);
    unsafe {
        let t = &(*m).dl_tensor;
        let v = std::slice::from_raw_parts(t.data as *const f64, 3);
        assert_eq!(v, &[7.0, 8.0, 9.0]);
        assert_eq!(
            t.dtype,
            DLDataType {
                code: 2,
                bits: 64,
                lanes: 1
            }
        );
        delete_dlpack(m);
    }
    let b2 = import_dlpack(&ctx, m_b).unwrap();
    assert_eq!(b2.read(), vec![re(7.0), re(8.0), re(9.0)]);
}

#[test]
fn dlpack_dtypes_devices_offsets_and_default_strides() {
    let ctx = Ctx::cpu();
    let codes = [
        (FK_DTYPE_F16, (2u8, 16u8)),
        (FK_DTYPE_BF16, (4, 16)),
        (FK_DTYPE_F32, (2, 32)),
        (FK_DTYPE_F64, (2, 64)),
        (FK_DTYPE_C64, (5, 64)),
        (FK_DTYPE_C128, (5, 128)),
    ];
    let mut rng = Rng::new(200);
    for (d, (code, bits)) in codes {
        // Export reports the DLPack dtype.
        let b = Buf::new(&ctx, d, &[2, 2]);
        let m = export_dlpack(&b);
        unsafe {
            assert_eq!(
                (*m).dl_tensor.dtype,
                DLDataType {
                    code,
                    bits,
                    lanes: 1
                },
                "{}",
                dname(d)
            );
            delete_dlpack(m);
        }
        // Import of that DLPack dtype, with NULL strides (compact row-major) and a
        // byte offset of one element, on kDLCUDAHost memory (fine for the CPU).
        let vals = random_values(&mut rng, d, 5, Domain::Signed);
        let made = make_tensor(
            encode(d, &vals),
            None,
            DLDataType {
                code,
                bits,
                lanes: 1,
            },
            &[2, 2],
            None,
            DLDevice {
                device_type: K_DL_CUDA_HOST,
                device_id: 0,
            },
        );
        unsafe { (*made.managed).dl_tensor.byte_offset = dsize(d) as u64 };
        let b = import_dlpack(&ctx, made.managed).unwrap();
        assert_eq!(b.dtype(), d);
        assert_eq!(b.strides(), vec![2, 1]);
        assert_eq!(b.data(), unsafe { made.data.add(dsize(d)) } as *mut c_void);
        assert_eq!(b.read(), vals[1..].to_vec());
        drop(b);
        assert_eq!(made.calls(), 1);
    }
}

#[test]
fn dlpack_read_only_tensors_are_never_outputs() {
    let ctx = Ctx::cpu();
    let made = make_tensor(f32_bytes(&[1.0, -2.0, 3.0]), None, F32, &[3], None, CPU);
    unsafe { (*made.managed).flags = DL_READ_ONLY };
    let ro = import_dlpack(&ctx, made.managed).unwrap();
    // Fine as an input.
    let out = Buf::new(&ctx, FK_DTYPE_F32, &[3]);
    ok(unsafe { fk_neg(ro.raw(), out.raw(), null()) });
    assert_eq!(out.read(), vec![re(-1.0), re(2.0), re(-3.0)]);
    // Refused as an output, of unary and binary ops, and in place.
    let s = unsafe { fk_neg(out.raw(), ro.raw(), null()) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_neg", "out", "read-only"],
    );
    let s = unsafe { fk_add(out.raw(), out.raw(), ro.raw(), null()) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_add", "out", "read-only"],
    );
    let s = unsafe { fk_relu(ro.raw(), ro.raw(), null()) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_relu", "out", "read-only"],
    );
    // And as the destination of a host copy.
    let src = [0f32; 3];
    let s =
        unsafe { fk_buffer_copy_from_host(ro.raw(), src.as_ptr() as *const c_void, 12, null()) };
    expect_status(
        s,
        FK_ERROR_INVALID_ARGUMENT,
        &["fk_buffer_copy_from_host", "read-only"],
    );
    assert_eq!(
        ro.read(),
        vec![re(1.0), re(-2.0), re(3.0)],
        "nothing was written"
    );
    // An export of it carries the flag.
    let m = export_dlpack(&ro);
    unsafe {
        assert_eq!((*m).flags & DL_READ_ONLY, DL_READ_ONLY);
        delete_dlpack(m);
    }
    drop(ro);
    assert_eq!(made.calls(), 1);
}

#[test]
fn dlpack_refused_imports_leave_ownership_with_the_caller() {
    let ctx = Ctx::cpu();
    let cases: Vec<(
        &str,
        Box<dyn Fn(&mut DLManagedTensorVersioned)>,
        fk_status,
        &[&str],
    )> = vec![
        (
            "CUDA device on a CPU context",
            Box::new(|m| {
                m.dl_tensor.device = DLDevice {
                    device_type: K_DL_CUDA,
                    device_id: 0,
                }
            }),
            FK_ERROR_DEVICE_MISMATCH,
            &["device type 2"],
        ),
        (
            "unknown device type",
            Box::new(|m| {
                m.dl_tensor.device = DLDevice {
                    device_type: 99,
                    device_id: 0,
                }
            }),
            FK_ERROR_DEVICE_MISMATCH,
            &["device type 99"],
        ),
        (
            "DLPack major version 0",
            Box::new(|m| m.version = DLPackVersion { major: 0, minor: 8 }),
            FK_ERROR_UNSUPPORTED,
            &["DLPack version 0.8"],
        ),
        (
            "DLPack major version 2",
            Box::new(|m| m.version = DLPackVersion { major: 2, minor: 0 }),
            FK_ERROR_UNSUPPORTED,
            &["DLPack version 2.0"],
        ),
        (
            "int32",
            Box::new(|m| {
                m.dl_tensor.dtype = DLDataType {
                    code: 0,
                    bits: 32,
                    lanes: 1,
                }
            }),
            FK_ERROR_UNSUPPORTED_DTYPE,
            &["code 0, bits 32"],
        ),
        (
            "float32x2 vector lanes",
            Box::new(|m| {
                m.dl_tensor.dtype = DLDataType {
                    code: 2,
                    bits: 32,
                    lanes: 2,
                }
            }),
            FK_ERROR_UNSUPPORTED_DTYPE,
            &["lanes 2"],
        ),
        (
            "ndim 9",
            Box::new(|m| m.dl_tensor.ndim = 9),
            FK_ERROR_INVALID_ARGUMENT,
            &["ndim = 9"],
        ),
        (
            "negative extent",
            Box::new(|m| unsafe { *m.dl_tensor.shape = -1 }),
            FK_ERROR_INVALID_ARGUMENT,
            &["negative"],
        ),
        (
            "NULL shape",
            Box::new(|m| m.dl_tensor.shape = null_mut()),
            FK_ERROR_NULL_POINTER,
            &["shape is NULL"],
        ),
        (
            "NULL data",
            Box::new(|m| m.dl_tensor.data = null_mut()),
            FK_ERROR_NULL_POINTER,
            &["data is NULL"],
        ),
    ];
    for (what, mutate, status, needles) in cases {
        let made = make_tensor(f32_bytes(&[1.0, 2.0]), None, F32, &[2], None, CPU);
        unsafe { mutate(&mut *made.managed) };
        let mut p = null_mut();
        let s = unsafe { fk_buffer_from_dlpack(ctx.raw(), made.managed as *mut c_void, &mut p) };
        let mut all = vec!["fk_buffer_from_dlpack"];
        all.extend_from_slice(needles);
        expect_status(s, status, &all);
        assert!(p.is_null(), "{what}");
        assert_eq!(
            made.calls(),
            0,
            "{what}: the deleter ran on a refused import"
        );
        // The caller still owns it and deletes it.
        unsafe { counting_deleter(made.managed) };
        assert_eq!(made.calls(), 1);
    }
    // NULL arguments.
    let mut p = null_mut();
    let s = unsafe { fk_buffer_from_dlpack(ctx.raw(), null_mut(), &mut p) };
    expect_status(s, FK_ERROR_NULL_POINTER, &["fk_buffer_from_dlpack", "NULL"]);
    let made = make_tensor(f32_bytes(&[1.0]), None, F32, &[1], None, CPU);
    let s = unsafe { fk_buffer_from_dlpack(ctx.raw(), made.managed as *mut c_void, null_mut()) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_from_dlpack", "out is NULL"],
    );
    let s = unsafe { fk_buffer_from_dlpack(null(), made.managed as *mut c_void, &mut p) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_from_dlpack", "ctx is NULL"],
    );
    assert_eq!(made.calls(), 0);
    unsafe { counting_deleter(made.managed) };
    let mut q = null_mut();
    let s = unsafe { fk_buffer_to_dlpack(null(), &mut q) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_to_dlpack", "buf is NULL"],
    );
    let b = Buf::new(&ctx, FK_DTYPE_F32, &[1]);
    let s = unsafe { fk_buffer_to_dlpack(b.raw(), null_mut()) };
    expect_status(
        s,
        FK_ERROR_NULL_POINTER,
        &["fk_buffer_to_dlpack", "out is NULL"],
    );
}
