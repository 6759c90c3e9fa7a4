//! Findings of the C-ABI fuzz targets (fuzz/, docs/fuzzing.md), each reproduced
//! through the `extern "C"` functions as a C caller would make the call.

mod common;

use std::ptr::{null, null_mut};

use common::*;

/// `fk_buffer_wrap` of caller memory `host` with `shape` and `strides`, as a C caller
/// makes it: the status and the handle written (NULL where none is).
fn wrap<T>(
    ctx: &Ctx,
    host: &mut [T],
    dtype: fk_dtype,
    shape: &[i64],
    strides: &[i64],
) -> (fk_status, *mut fk_buffer) {
    let (rank, data) = (shape.len() as i32, host.as_mut_ptr().cast());
    let mut out = null_mut();
    let s = unsafe {
        fk_buffer_wrap(
            ctx.raw(),
            data,
            dtype,
            rank,
            shape.as_ptr(),
            strides.as_ptr(),
            &mut out,
        )
    };
    (s, out)
}

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
    let (s, out) = wrap(&ctx, &mut host, FK_DTYPE_C128, &shape, &strides);
    ok(s);
    let mut nbytes = 0usize;
    ok(unsafe { fk_buffer_nbytes(out, &mut nbytes) });
    assert_eq!(nbytes, usize::MAX);
    ok(unsafe { fk_buffer_destroy(out) });
}

/// fuzz/ops: fk_gemm with empty operand matrices (k = 0) whose batch stride is
/// huge computed each matrix's address as `i * batch_stride * size` unchecked (a
/// panic with overflow checks). The address of an empty matrix is never read; the
/// product is C = beta C.
#[test]
fn gemm_of_empty_batched_operands_with_huge_batch_stride() {
    let ctx = Ctx::cpu();
    let mut host = [0f64; 4];
    let (sa, ta) = ([2i64, 2, 0], [1i64 << 61, 1, 1]);
    let (sb, tb) = ([2i64, 0, 2], [1i64 << 61, 2, 1]);
    let (s, a) = wrap(&ctx, &mut host, FK_DTYPE_C128, &sa, &ta);
    ok(s);
    let (s, b) = wrap(&ctx, &mut host, FK_DTYPE_C128, &sb, &tb);
    ok(s);
    let c = Buf::new(&ctx, FK_DTYPE_C128, &[2, 2, 2]);
    let ones = [1f64; 16];
    ok(unsafe { fk_buffer_copy_from_host(c.raw(), ones.as_ptr().cast(), 128, null()) });
    let one = fk_scalar { re: 1.0, im: 0.0 };
    let half = fk_scalar { re: 0.5, im: 0.0 };
    ok(unsafe { fusekit::abi::linalg::fk_gemm(0, 0, one, a, b, half, c.raw(), 0, null()) });
    let mut back = [0f64; 16];
    ok(unsafe { fk_buffer_copy_to_host(c.raw(), back.as_mut_ptr().cast(), 128, null()) });
    assert_eq!(back, [0.5; 16]);
    ok(unsafe { fk_buffer_destroy(a) });
    ok(unsafe { fk_buffer_destroy(b) });
}

/// Found reading the code during the fuzzing work (docs/fuzzing.md): fk_buffer_wrap
/// accepted views whose byte addresses overflow 64 bits (shape [2, 2] of f32 with
/// strides [2^61, 2^61]; or a negative stride reaching below the i64 range), which
/// `Buffer::byte_range` and the ops' overlap checks would then compute with
/// overflowing arithmetic. Such a view is now refused when it is wrapped.
#[test]
fn wrap_refuses_a_view_whose_addresses_overflow() {
    let ctx = Ctx::cpu();
    let mut host = [0f32; 4];
    for (shape, strides) in [
        // each stride times its dimension fits (the earlier check), the bytes do not
        (vec![2i64, 2], vec![1i64 << 61, 1i64 << 61]),
        (vec![3i64], vec![-(1i64 << 61)]),
        (vec![2i64], vec![i64::MAX / 2]),
    ] {
        let (s, out) = wrap(&ctx, &mut host, FK_DTYPE_F32, &shape, &strides);
        expect_status(
            s,
            FK_ERROR_INVALID_ARGUMENT,
            &["fk_buffer_wrap", "spans addresses beyond 64 bits"],
        );
        assert!(out.is_null());
    }
    // a large but representable view is still accepted (it is only wrapped)
    let (shape, strides) = ([2i64, 2], [1i64 << 40, 1]);
    let (s, out) = wrap(&ctx, &mut host, FK_DTYPE_F32, &shape, &strides);
    ok(s);
    ok(unsafe { fk_buffer_destroy(out) });
}
