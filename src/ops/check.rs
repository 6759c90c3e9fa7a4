//! Argument validation shared by every op family: dtype, shape, contiguity,
//! device, aliasing and scalar checks, with one message style.
//!
//! Every message starts with the argument's name as the C API spells it, says
//! what the argument is (its dtype, shape, strides) and what the call needs, and
//! ends with the remedy where there is one:
//!
//! - `{name} has dtype {got} but {other} has dtype {want}`
//! - `{name} has dtype {got}; {what} take {allowed}`
//! - `{name} has shape {got} but must be {form} = {want}` (exact shape)
//! - `{name} has shape {got} but must be {form}` (a pattern: `[B, 3]`)
//! - `{name} must be {form} but has shape {got}` (rank or form only)
//! - `{name} with shape {s} and strides {t} is not contiguous; {name} must be
//!   contiguous (row-major): copy it with fk_copy first`
//! - `{name} is on {device} but the operation runs on {device}` (`check_same_device`)
//! - `{name} overlaps {other}; outputs must not share memory with inputs or other outputs`
//! - `{name} has imaginary part {im} but the dtype {dtype} is real`
//!
//! The status of each check is fixed: dtype mismatches `FK_ERROR_DTYPE_MISMATCH`,
//! dtypes an op does not take `FK_ERROR_UNSUPPORTED_DTYPE`, shapes
//! `FK_ERROR_SHAPE_MISMATCH`, layouts `FK_ERROR_UNSUPPORTED`, devices
//! `FK_ERROR_DEVICE_MISMATCH`, overlaps `FK_ERROR_ALIASING`, scalars
//! `FK_ERROR_INVALID_ARGUMENT`.

use crate::buffer::{Buffer, check_same_device};
use crate::context::Device;
use crate::dtype::DType;
use crate::error::{
    FK_ERROR_ALIASING, FK_ERROR_DTYPE_MISMATCH, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_SHAPE_MISMATCH,
    FK_ERROR_UNSUPPORTED, FK_ERROR_UNSUPPORTED_DTYPE, Result,
};
use crate::plan::elementwise::Scalar;
use crate::stream::Stream;

/// A named argument: `(buffer, name)`.
pub type Named<'a> = (&'a Buffer, &'a str);

/// `buf`'s dtype is one of `allowed`; `what` names the ops ("the Gaussian ops").
pub fn dtype_in(buf: &Buffer, name: &str, allowed: &[DType], what: &str) -> Result<DType> {
    crate::ensure!(
        allowed.contains(&buf.dtype),
        FK_ERROR_UNSUPPORTED_DTYPE,
        "{name} has dtype {}; {what} take {}",
        buf.dtype,
        alternatives(allowed)
    );
    Ok(buf.dtype)
}

/// "f32 or f64", "f16, bf16 or f32".
fn alternatives(allowed: &[DType]) -> String {
    let names: Vec<String> = allowed.iter().map(|d| d.to_string()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

/// `buf` has the dtype `dtype` of the argument `other` (a buffer-level check:
/// copies between buffers make it too).
pub use crate::buffer::same_dtype;

/// Every buffer has the dtype of the first.
pub fn same_dtypes(bufs: &[Named]) -> Result<()> {
    let Some(&(first, fname)) = bufs.first() else {
        return Ok(());
    };
    for &(b, name) in &bufs[1..] {
        same_dtype(b, name, first.dtype, fname)?;
    }
    Ok(())
}

/// The inputs `a`, `b` and the output `out` (named `out_name`) share one dtype; the
/// message names all three ("dtypes differ: a is f32, b is f64, out is f32").
pub fn binary_dtypes(a: &Buffer, b: &Buffer, out: &Buffer, out_name: &str) -> Result<()> {
    crate::ensure!(
        a.dtype == b.dtype && a.dtype == out.dtype,
        FK_ERROR_DTYPE_MISMATCH,
        "dtypes differ: a is {}, b is {}, {out_name} is {}",
        a.dtype,
        b.dtype,
        out.dtype
    );
    Ok(())
}

/// `buf` has exactly the shape `want`; `form` says how it is derived
/// ("[N, 3, 3] (N from means)").
pub fn shape(buf: &Buffer, name: &str, want: &[i64], form: &str) -> Result<()> {
    crate::ensure!(
        buf.shape.as_slice() == want,
        FK_ERROR_SHAPE_MISMATCH,
        "{name} has shape {:?} but must be {form} = {want:?}",
        buf.shape
    );
    Ok(())
}

/// `buf`'s shape matches `pattern`, `None` matching any extent; `form` spells
/// the pattern ("[B, 3]"). Returns the shape.
pub fn shape_like<'a>(
    buf: &'a Buffer,
    name: &str,
    pattern: &[Option<i64>],
    form: &str,
) -> Result<&'a [i64]> {
    crate::ensure!(
        buf.shape.len() == pattern.len()
            && buf
                .shape
                .iter()
                .zip(pattern)
                .all(|(&d, p)| p.is_none_or(|p| p == d)),
        FK_ERROR_SHAPE_MISMATCH,
        "{name} has shape {:?} but must be {form}",
        buf.shape
    );
    Ok(&buf.shape)
}

/// `buf` has `ndim` dimensions; `form` describes them ("a [B, D] matrix").
pub fn rank(buf: &Buffer, name: &str, ndim: usize, form: &str) -> Result<()> {
    crate::ensure!(
        buf.shape.len() == ndim,
        FK_ERROR_SHAPE_MISMATCH,
        "{name} must be {form} but has shape {:?}",
        buf.shape
    );
    Ok(())
}

/// `buf` has 2 or 3 dimensions (a matrix, or a batch of them); `rule` ends the
/// message ("it must be [rows, cols] or [batch, rows, cols]"). Returns the rank.
pub fn rank_2_or_3(buf: &Buffer, name: &str, rule: &str) -> Result<usize> {
    let nd = buf.shape.len();
    crate::ensure!(
        nd == 2 || nd == 3,
        FK_ERROR_SHAPE_MISMATCH,
        "{name} has shape {:?}; {rule}",
        buf.shape
    );
    Ok(nd)
}

/// `buf` is contiguous (row-major, dense).
pub fn contiguous(buf: &Buffer, name: &str) -> Result<()> {
    crate::ensure!(
        buf.is_contiguous(),
        FK_ERROR_UNSUPPORTED,
        "{name} with shape {:?} and strides {:?} is not contiguous; {name} must be contiguous (row-major): copy it with fk_copy first",
        buf.shape,
        buf.strides
    );
    Ok(())
}

/// Every present buffer is on `device` (and not pinned host memory), and so is
/// `stream`.
pub fn devices(device: Device, bufs: &[(Option<&Buffer>, &str)], stream: &Stream) -> Result<()> {
    let present: Vec<Named> = bufs
        .iter()
        .filter_map(|&(b, n)| b.map(|b| (b, n)))
        .collect();
    check_same_device(device, &present)?;
    stream.check_device(device)
}

/// `buf` shares no memory with any of `others`.
pub fn disjoint(buf: &Buffer, name: &str, others: &[Named]) -> Result<()> {
    for &(o, oname) in others {
        crate::ensure!(
            !buf.overlaps(o),
            FK_ERROR_ALIASING,
            "{name} overlaps {oname}; outputs must not share memory with inputs or other outputs"
        );
    }
    Ok(())
}

/// The output `out` shares no memory with `input` unless it is the same view
/// (same address, dtype, shape and strides): an in-place operation.
pub fn disjoint_or_in_place(out: &Buffer, name: &str, input: &Buffer, iname: &str) -> Result<()> {
    crate::ensure!(
        !out.overlaps(input) || out.same_view(input),
        FK_ERROR_ALIASING,
        "{name} overlaps {iname} without being the same view (in-place is allowed only with identical data pointer, shape and strides)"
    );
    Ok(())
}

/// A dense output: dtype `dtype` (that of the argument `dtype_of`), shape `want`
/// (`form`), contiguous, writable and disjoint from `others`.
pub fn dense_output(
    buf: &Buffer,
    name: &str,
    (dtype, dtype_of): (DType, &str),
    (want, form): (&[i64], &str),
    others: &[Named],
) -> Result<()> {
    same_dtype(buf, name, dtype, dtype_of)?;
    shape(buf, name, want, form)?;
    contiguous(buf, name)?;
    buf.check_writable(name)?;
    disjoint(buf, name, others)
}

/// A scalar for an op of dtype `dtype`: a real dtype takes no imaginary part.
pub fn real_scalar(s: Scalar, dtype: DType, name: &str) -> Result<()> {
    crate::ensure!(
        dtype.is_complex() || s.im == 0.0,
        FK_ERROR_INVALID_ARGUMENT,
        "{name} has imaginary part {} but the dtype {dtype} is real",
        s.im
    );
    Ok(())
}

/// A finite scalar `v >= 0` (`eps`, a damping).
pub fn finite_nonneg(v: f64, name: &str) -> Result<()> {
    crate::ensure!(
        v.is_finite() && v >= 0.0,
        FK_ERROR_INVALID_ARGUMENT,
        "{name} = {v} must be finite and >= 0"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alternatives_read_as_a_list() {
        assert_eq!(alternatives(&[DType::F32]), "f32");
        assert_eq!(alternatives(&[DType::F32, DType::F64]), "f32 or f64");
        assert_eq!(
            alternatives(&[DType::F16, DType::BF16, DType::F32]),
            "f16, bf16 or f32"
        );
    }

    #[test]
    fn scalars() {
        let s = Scalar { re: 1.0, im: 0.5 };
        let e = real_scalar(s, DType::F32, "alpha").unwrap_err();
        assert_eq!(e.status, FK_ERROR_INVALID_ARGUMENT);
        assert!(
            e.message.contains("alpha has imaginary part 0.5"),
            "{}",
            e.message
        );
        real_scalar(s, DType::C64, "alpha").unwrap();
        let e = finite_nonneg(f64::NAN, "eps").unwrap_err();
        assert!(
            e.message.contains("eps = NaN must be finite"),
            "{}",
            e.message
        );
        finite_nonneg(0.0, "eps").unwrap();
        assert!(finite_nonneg(-1.0, "eps").is_err());
        assert!(finite_nonneg(f64::INFINITY, "eps").is_err());
    }
}
