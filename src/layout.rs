//! Shapes, strides and broadcasting: pure index arithmetic shared by every backend.
//!
//! Strides are in elements (as in DLPack, NumPy divided by the item size, and
//! PyTorch) and may be zero (broadcast views) or negative (reversed views).

use smallvec::SmallVec;

use crate::error::{FK_ERROR_INVALID_ARGUMENT, FK_ERROR_SHAPE_MISMATCH, Result};

/// Largest rank a buffer may have.
pub const FK_MAX_DIMS: usize = 8;

/// A shape or strides on the stack (no allocation on the per-call path).
pub type Dims = SmallVec<[i64; FK_MAX_DIMS]>;

pub fn numel(shape: &[i64]) -> i64 {
    shape.iter().product()
}

/// Row-major contiguous strides for `shape`. They saturate at `i64::MAX`: the
/// product of the non-zero dims may exceed i64 when a dim is 0 (an empty tensor,
/// whose strides address nothing).
pub fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc = acc.saturating_mul(shape[i].max(1));
    }
    s
}

/// True when elements are laid out row-major with no gaps (size-1 dims ignored).
/// An empty tensor has no elements to lay out and is contiguous whatever its strides.
pub fn is_contiguous(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for i in (0..shape.len()).rev() {
        if shape[i] == 1 {
            continue;
        }
        if strides[i] != expected {
            return false;
        }
        expected *= shape[i];
    }
    true
}

/// Validates a shape (and optional strides) given through the ABI; returns the
/// strides (contiguous when none were given). `what` names the argument.
pub fn validate(shape: &[i64], strides: Option<&[i64]>, what: &str) -> Result<Vec<i64>> {
    crate::ensure!(
        shape.len() <= FK_MAX_DIMS,
        FK_ERROR_INVALID_ARGUMENT,
        "{what}: ndim = {} exceeds the maximum of {FK_MAX_DIMS}",
        shape.len()
    );
    let mut total: i64 = 1;
    for (i, &d) in shape.iter().enumerate() {
        crate::ensure!(
            d >= 0,
            FK_ERROR_INVALID_ARGUMENT,
            "{what}: shape[{i}] = {d} is negative"
        );
        total = total.checked_mul(d).ok_or_else(|| {
            crate::error::Error::new(
                FK_ERROR_INVALID_ARGUMENT,
                format!("{what}: shape {shape:?} has more elements than fit in 64 bits"),
            )
        })?;
    }
    match strides {
        None => Ok(contiguous_strides(shape)),
        Some(s) => {
            for (i, &st) in s.iter().enumerate() {
                crate::ensure!(
                    st.checked_mul(shape[i].max(1)).is_some(),
                    FK_ERROR_INVALID_ARGUMENT,
                    "{what}: strides[{i}] = {st} overflows"
                );
            }
            Ok(s.to_vec())
        }
    }
}

/// Offsets (in elements, relative to the data pointer) of the lowest and highest
/// element addressed; `None` for an empty tensor.
pub fn extent(shape: &[i64], strides: &[i64]) -> Option<(i64, i64)> {
    if shape.contains(&0) {
        return None;
    }
    let (mut lo, mut hi) = (0i64, 0i64);
    for (&d, &s) in shape.iter().zip(strides) {
        let span = (d - 1) * s;
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    Some((lo, hi))
}

/// Checks that every byte address of a view at `base` (`elem` bytes per element),
/// as `Buffer::byte_range` and the ops' overlap checks compute them, fits in an
/// `i64`: a view like shape [2, 2] of f32 with strides [2^61, 2^61] passes
/// `validate` (each stride times its dimension fits) but not this.
pub fn check_addresses(
    shape: &[i64],
    strides: &[i64],
    elem: usize,
    base: usize,
    what: &str,
) -> Result<()> {
    if shape.contains(&0) {
        return Ok(());
    }
    let span = || -> Option<()> {
        let (mut lo, mut hi) = (0i64, 0i64);
        for (&d, &s) in shape.iter().zip(strides) {
            let step = (d - 1).checked_mul(s)?;
            if step < 0 {
                lo = lo.checked_add(step)?;
            } else {
                hi = hi.checked_add(step)?;
            }
        }
        let (elem, base) = (i64::try_from(elem).ok()?, i64::try_from(base).ok()?);
        base.checked_add(lo.checked_mul(elem)?)?;
        base.checked_add(hi.checked_add(1)?.checked_mul(elem)?)?;
        Some(())
    };
    crate::ensure!(
        span().is_some(),
        FK_ERROR_INVALID_ARGUMENT,
        "{what}: the view (shape {shape:?}, strides {strides:?}, {elem} bytes per element) spans addresses beyond 64 bits"
    );
    Ok(())
}

/// True when two distinct indices may address the same element (zero strides,
/// or dimensions that interleave). Conservative: sorts dimensions by |stride| and
/// requires each stride to exceed the extent of the smaller ones.
pub fn may_self_overlap(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return false; // no elements, nothing to overlap (numpy gives empties zero strides)
    }
    let mut dims: SmallVec<[(i64, i64); FK_MAX_DIMS]> = shape
        .iter()
        .zip(strides)
        .filter(|(d, _)| **d > 1)
        .map(|(&d, &s)| (d, s.abs()))
        .collect();
    dims.sort_by_key(|&(_, s)| s);
    let mut reach = 0i64; // largest offset reachable with the smaller dims
    for (d, s) in dims {
        if s <= reach {
            return true;
        }
        reach += (d - 1) * s;
    }
    false
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[i64], b: &[i64]) -> Result<Dims> {
    let n = a.len().max(b.len());
    let mut out: Dims = smallvec::smallvec![0i64; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            crate::bail!(
                FK_ERROR_SHAPE_MISMATCH,
                "shapes {a:?} and {b:?} cannot be broadcast together (dimension {i}: {da} vs {db})"
            );
        };
    }
    Ok(out)
}

/// Strides that view `(shape, strides)` as `target` under broadcasting (zero
/// stride on broadcast dimensions). The caller has checked compatibility.
pub fn broadcast_strides(shape: &[i64], strides: &[i64], target: &[i64]) -> Dims {
    let n = target.len();
    let off = n - shape.len();
    (0..n)
        .map(|i| {
            if i < off || shape[i - off] == 1 {
                0
            } else {
                strides[i - off]
            }
        })
        .collect()
}

/// Merges adjacent dimensions that are contiguous with each other in every operand,
/// and drops size-1 dimensions. All operands share `shape`. Returns the reduced shape
/// and the reduced strides of each operand (at least one dimension).
pub fn coalesce<const K: usize>(shape: &[i64], strides: [&[i64]; K]) -> (Dims, [Dims; K]) {
    let mut out_shape = Dims::new();
    let mut out_strides: [Dims; K] = std::array::from_fn(|_| Dims::new());
    for i in 0..shape.len() {
        if shape[i] == 1 {
            continue;
        }
        if let Some(&last) = out_shape.last() {
            let mergeable = strides
                .iter()
                .zip(&out_strides)
                .all(|(s, os)| *os.last().unwrap() == s[i] * shape[i]);
            if mergeable {
                let n = out_shape.len() - 1;
                out_shape[n] = last * shape[i];
                for (k, s) in strides.iter().enumerate() {
                    out_strides[k][n] = s[i];
                }
                continue;
            }
        }
        out_shape.push(shape[i]);
        for (k, s) in strides.iter().enumerate() {
            out_strides[k].push(s[i]);
        }
    }
    if out_shape.is_empty() {
        out_shape.push(if shape.contains(&0) { 0 } else { 1 });
        for os in out_strides.iter_mut() {
            os.push(1);
        }
    }
    (out_shape, out_strides)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(
            broadcast_shapes(&[3, 1, 5], &[4, 1]).unwrap().as_slice(),
            &[3, 4, 5]
        );
        assert_eq!(broadcast_shapes(&[], &[2]).unwrap().as_slice(), &[2]);
        assert!(broadcast_shapes(&[3], &[4]).is_err());
        assert_eq!(
            broadcast_strides(&[4, 1], &[1, 1], &[3, 4, 5]).as_slice(),
            &[0, 1, 0]
        );
    }

    #[test]
    fn coalescing() {
        let (s, st) = coalesce(&[2, 3, 4], [&[12, 4, 1], &[12, 4, 1]]);
        assert_eq!(s.as_slice(), &[24]);
        assert_eq!((st[0].as_slice(), st[1].as_slice()), (&[1][..], &[1][..]));
        // a broadcast row vector keeps two dims
        let (s, st) = coalesce(&[2, 3, 4], [&[12, 4, 1], &[0, 0, 1]]);
        assert_eq!(s.as_slice(), &[6, 4]);
        assert_eq!(
            (st[0].as_slice(), st[1].as_slice()),
            (&[4, 1][..], &[0, 1][..])
        );
        // transposed operand
        let (s, _) = coalesce(&[3, 4], [&[4, 1], &[1, 3]]);
        assert_eq!(s.as_slice(), &[3, 4]);
        let (s, st) = coalesce(&[1, 1], [&[1, 1]]);
        assert_eq!((s.as_slice(), st[0].as_slice()), (&[1][..], &[1][..]));
    }

    #[test]
    fn contiguity() {
        assert!(is_contiguous(&[2, 3], &[3, 1]));
        assert!(!is_contiguous(&[2, 3], &[1, 2]));
        assert!(is_contiguous(&[2, 1, 3], &[3, 7, 1]));
        // empty tensors, with the strides `contiguous_strides` gives them
        assert!(is_contiguous(&[4, 0, 3], &contiguous_strides(&[4, 0, 3])));
        assert!(is_contiguous(&[0, 0], &contiguous_strides(&[0, 0])));
    }

    #[test]
    fn overlap() {
        assert!(!may_self_overlap(&[3, 4], &[4, 1]));
        assert!(may_self_overlap(&[3, 4], &[0, 1]));
        assert!(may_self_overlap(&[3, 4], &[2, 1]));
        assert!(!may_self_overlap(&[3, 4], &[1, 3]));
        assert!(!may_self_overlap(&[3, 4], &[-4, 1]));
        assert_eq!(extent(&[3, 4], &[-4, 1]), Some((-8, 3)));
    }
}
