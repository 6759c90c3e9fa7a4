//! Findings of the C-ABI fuzz targets (fuzz/, docs/fuzzing.md), each reproduced
//! through the `extern "C"` functions as a C caller would make the call.

mod common;

use std::ptr::null;

use common::*;

/// fuzz/handles: an empty buffer whose non-zero dims multiply past i64 overflowed
/// while its contiguous strides were computed (a panic in debug builds, wrapped
/// strides in release). The strides now saturate at i64::MAX.
#[test]
fn empty_shape_with_huge_dims_gets_saturated_strides() {
    let ctx = Ctx::cpu();
    let shape = [0i64, 1 << 62, 8];
    for wrap in [false, true] {
        let mut out = std::ptr::null_mut();
        let s = unsafe {
            if wrap {
                fk_buffer_wrap(
                    ctx.raw(),
                    std::ptr::null_mut(),
                    FK_DTYPE_F32,
                    3,
                    shape.as_ptr(),
                    null(),
                    &mut out,
                )
            } else {
                fk_buffer_create(ctx.raw(), FK_DTYPE_F32, 3, shape.as_ptr(), null(), &mut out)
            }
        };
        ok(s);
        let mut strides = [0i64; 3];
        ok(unsafe { fk_buffer_strides(out, strides.as_mut_ptr()) });
        assert_eq!(strides, [i64::MAX, 8, 1]);
        let mut numel = -1;
        ok(unsafe { fk_buffer_numel(out, &mut numel) });
        assert_eq!(numel, 0);
        ok(unsafe { fk_buffer_destroy(out) });
    }
}

/// fuzz/dlpack: fk_buffer_nbytes of a zero-stride view with more elements than
/// bytes fit in size_t overflowed (a panic in debug builds; in release 2^62
/// complex128 elements gave 0 bytes). It now saturates at SIZE_MAX.
#[test]
fn nbytes_of_a_huge_broadcast_view_saturates() {
    let ctx = Ctx::cpu();
    let mut host = [0f64; 2];
    let shape = [1i64 << 62];
    let strides = [0i64];
    let mut out = std::ptr::null_mut();
    ok(unsafe {
        fk_buffer_wrap(
            ctx.raw(),
            host.as_mut_ptr().cast(),
            FK_DTYPE_C128,
            1,
            shape.as_ptr(),
            strides.as_ptr(),
            &mut out,
        )
    });
    let mut nbytes = 0usize;
    ok(unsafe { fk_buffer_nbytes(out, &mut nbytes) });
    assert_eq!(nbytes, usize::MAX);
    ok(unsafe { fk_buffer_destroy(out) });
}
