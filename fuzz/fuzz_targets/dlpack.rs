//! DLPack in and out: managed tensors as a producer might hand them over (any
//! version, device, dtype code/bits/lanes, ndim, NULL shape or strides, any
//! strides and byte offset, read-only flag, NULL deleter), then used as op
//! operands, exported again, re-imported into another context, destroyed in any
//! order. Oracle: `check` on every status; an import that succeeds reports the
//! producer's dtype, shape and data pointer; an import that fails leaves ownership
//! with the caller (the deleter has not run); every deleter runs exactly once by
//! the end (LIVE_MANAGED back to 0; a second run trips an assertion or ASan);
//! read-only imports are refused as outputs; an export describes its buffer.
#![no_main]

use fusekit_fuzz::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

/// Checks an export against the buffer it came from.
unsafe fn check_export(m: *mut DLManagedTensorVersioned, v: &View) {
    let t = unsafe { &(*m).dl_tensor };
    assert_eq!(unsafe { ((*m).version.major, (*m).version.minor) }, (1, 1));
    assert_eq!(t.ndim as usize, v.shape.len());
    let (dt, d) = (t.dtype, dl_dtype(v.dtype));
    assert_eq!((dt.code, dt.bits, dt.lanes), (d.code, d.bits, d.lanes));
    assert_eq!(t.device.device_type, 1);
    let shape = if t.ndim == 0 {
        vec![]
    } else {
        unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) }.to_vec()
    };
    assert_eq!(shape, v.shape, "exported shape");
    if !t.strides.is_null() && t.ndim > 0 {
        let strides = unsafe { std::slice::from_raw_parts(t.strides, t.ndim as usize) };
        assert_eq!(strides, v.strides, "exported strides");
    }
    assert_eq!(
        (t.data as usize).wrapping_add(t.byte_offset as usize),
        v.data as usize,
        "exported data"
    );
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let mut mk = Maker::new(&mut b);
    let other = cpu_context();
    let mut exports: Vec<*mut DLManagedTensorVersioned> = vec![];
    let mut imported: Vec<(*mut fk_buffer, bool)> = vec![];
    let mut steps = 0;
    while !b.is_empty() && steps < 32 {
        steps += 1;
        // SAFETY (the whole match): managed tensors are built over the arena
        // (placed so that every addressed element lies inside it) or describe no
        // memory that is ever accessed; handles are live or NULL.
        unsafe {
            match b.u8() % 5 {
                0 | 1 => {
                    let dtype = if b.one_in(6) { -1 } else { DTYPES[b.below(6)] };
                    let mut dl = dl_dtype(dtype);
                    if b.one_in(8) {
                        dl = DLDataType {
                            code: b.u8(),
                            bits: b.u8(),
                            lanes: b.u16(),
                        };
                    }
                    let ndim = if b.one_in(10) {
                        b.u8() as i8 as i32
                    } else {
                        b.below(4) as i32
                    };
                    let shape: Vec<i64> = (0..ndim.clamp(0, 10)).map(|_| b.dim()).collect();
                    let strides: Vec<i64> = contiguous(&shape)
                        .into_iter()
                        .map(|n| b.stride(n))
                        .collect();
                    let with_strides = b.bool();
                    let eff = if with_strides {
                        strides.clone()
                    } else {
                        contiguous(&shape)
                    };
                    let es = elem_size(dtype).max(1) as u64;
                    let byte_offset = if b.one_in(6) {
                        b.u64()
                    } else {
                        es * b.below(4) as u64
                    };
                    let pick = b.u16();
                    let at = mk.arena.place(dtype.max(1), &shape, &eff, pick);
                    let fits = at.is_some() && dtype > 0;
                    let base = at.unwrap_or(mk.arena.base());
                    let data_ptr = (base as usize).wrapping_sub(byte_offset as usize) as *mut u8;
                    let version = if b.one_in(8) {
                        (b.u8() as u32 % 3, b.u8() as u32)
                    } else {
                        (1, b.u8() as u32 % 3)
                    };
                    let device = if b.one_in(8) {
                        DLDevice {
                            device_type: b.u8() as i32 % 16,
                            device_id: b.u8() as i32 - 1,
                        }
                    } else {
                        DLDevice {
                            device_type: 1,
                            device_id: 0,
                        }
                    };
                    let flags = if b.one_in(4) { b.u64() } else { 0 };
                    let shape_null = ndim > 0 && b.one_in(16);
                    let m = managed_tensor(
                        version,
                        device,
                        dl,
                        data_ptr,
                        byte_offset,
                        shape.clone(),
                        with_strides.then_some(strides),
                        flags,
                        shape_null,
                    );
                    if b.one_in(10) {
                        (*m).deleter = None;
                        // Freed below by hand, since fusekit cannot.
                    }
                    let before = LIVE_MANAGED.load(Ordering::SeqCst);
                    let mut out = null_mut();
                    let ctx = if b.one_in(12) {
                        std::ptr::null()
                    } else {
                        mk.ctx as *const _
                    };
                    let outp = if b.one_in(12) {
                        null_mut()
                    } else {
                        &mut out as *mut _
                    };
                    let st = fk_buffer_from_dlpack(
                        ctx,
                        if b.one_in(16) {
                            null_mut()
                        } else {
                            m as *mut c_void
                        },
                        outp,
                    );
                    if check(st, "fk_buffer_from_dlpack") {
                        let v = view(out);
                        assert_eq!(v.shape, shape);
                        assert_eq!(v.data as usize, base as usize);
                        assert_eq!(v.dtype, dtype, "imported dtype");
                        let inside =
                            fits && mk.arena.contains(v.data, v.dtype, &v.shape, &v.strides);
                        if (*m).deleter.is_none() {
                            // Keep the holder alive until the buffer is gone: leak it
                            // on purpose is not allowed, so destroy now and free.
                            assert!(check(fk_buffer_destroy(out), "fk_buffer_destroy"));
                            (*m).deleter = None;
                            let d: unsafe extern "C" fn(*mut DLManagedTensorVersioned) =
                                std::mem::transmute(holder_deleter_ptr());
                            d(m);
                        } else {
                            imported.push((out, inside));
                            if inside {
                                mk.made.push(out);
                            }
                        }
                    } else {
                        assert_eq!(
                            LIVE_MANAGED.load(Ordering::SeqCst),
                            before,
                            "a failed import ran the deleter"
                        );
                        let d: unsafe extern "C" fn(*mut DLManagedTensorVersioned) =
                            std::mem::transmute(holder_deleter_ptr());
                        d(m);
                    }
                }
                2 => {
                    // Export a buffer (imported or owned) and keep or release it.
                    let all: Vec<*mut fk_buffer> = imported
                        .iter()
                        .map(|x| x.0)
                        .chain(mk.owned.buffers.iter().copied())
                        .collect();
                    if all.is_empty() {
                        continue;
                    }
                    let buf = all[b.below(all.len())];
                    let mut m: *mut c_void = null_mut();
                    if check(fk_buffer_to_dlpack(buf, &mut m), "fk_buffer_to_dlpack") {
                        let m = m as *mut DLManagedTensorVersioned;
                        check_export(m, &view(buf));
                        if b.bool() {
                            // Re-import into the other context: ownership moves.
                            let mut out = null_mut();
                            if check(
                                fk_buffer_from_dlpack(other, m as *mut c_void, &mut out),
                                "fk_buffer_from_dlpack",
                            ) {
                                imported.push((out, false));
                            } else {
                                (*m).deleter.unwrap()(m);
                            }
                        } else {
                            exports.push(m);
                        }
                    }
                }
                3 => {
                    // Use imported buffers as operands: out = a + b, read-only out refused.
                    let inside: Vec<*mut fk_buffer> =
                        imported.iter().filter(|x| x.1).map(|x| x.0).collect();
                    if inside.is_empty() {
                        continue;
                    }
                    let pick = |b: &mut Bytes| inside[b.below(inside.len())];
                    let (x, y, o) = (pick(&mut b), pick(&mut b), pick(&mut b));
                    check(fk_mul(x, y, o, std::ptr::null()), "fk_mul");
                    let mut n = 0usize;
                    check(fk_buffer_nbytes(o, &mut n), "fk_buffer_nbytes");
                }
                _ => {
                    // Release something: an import (maybe before its exports) or an export.
                    if b.bool() && !imported.is_empty() {
                        let (buf, _) = imported.remove(b.below(imported.len()));
                        mk.made.retain(|&p| p != buf);
                        assert!(check(fk_buffer_destroy(buf), "fk_buffer_destroy"));
                    } else if !exports.is_empty() {
                        let m = exports.remove(b.below(exports.len()));
                        (*m).deleter.unwrap()(m);
                    }
                }
            }
        }
    }
    // SAFETY: each handle and export released once.
    unsafe {
        for (buf, _) in imported {
            assert!(check(fk_buffer_destroy(buf), "fk_buffer_destroy"));
        }
        for m in exports {
            (*m).deleter.unwrap()(m);
        }
        assert!(check(fk_context_destroy(other), "fk_context_destroy"));
    }
    drop(mk); // asserts every deleter ran
});
