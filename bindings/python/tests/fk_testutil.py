"""Helpers shared by the fusekit Python tests (imported as a plain module; the
conftest puts this folder on sys.path)."""

import numpy as np

# The largest relative error (rel_err: a norm over the whole result) a test accepts
# per dtype: a small multiple of the dtype's unit roundoff, which leaves room for
# the rounding that short reductions and fused kernels accumulate (fp16 ~1e-3 and
# bf16 ~8e-3 per operation, hence 1e-2 and 2e-2; single precision 1e-5; double
# 1e-12), and fails on a wrong formula, which is off by far more. Tests of ops that
# accumulate more (long sums, iterations) widen it with assert_close's factor.
TOL = {
    "float16": 1e-2,
    "bfloat16": 2e-2,
    "float32": 1e-5,
    "float64": 1e-12,
    "complex64": 1e-5,
    "complex128": 1e-12,
}

NUMPY_DTYPES = [np.float16, np.float32, np.float64, np.complex64, np.complex128]


def rel_err(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ in float64/complex128; NaN never passes."""
    out = np.asarray(out).astype(np.complex128 if np.iscomplexobj(out) or np.iscomplexobj(ref) else np.float64)
    ref = np.asarray(ref).astype(out.dtype)
    if out.shape != ref.shape:
        raise AssertionError(f"shape {out.shape} != reference shape {ref.shape}")
    if np.isnan(out).any() and not np.array_equal(np.isnan(out), np.isnan(ref)):
        return float("inf")
    mask = ~np.isnan(ref)
    num = np.linalg.norm((out - ref)[mask])
    den = np.linalg.norm(ref[mask])
    return float(num / den) if den > 0 else float(num)


def assert_close(out, ref, dtype_name: str, factor: float = 1.0):
    err = rel_err(out, ref)
    assert err <= TOL[dtype_name] * factor, f"relative error {err:.3g} > {TOL[dtype_name] * factor:.3g} ({dtype_name})"


def random_array(rng, shape, dtype, low=-2.0, high=2.0, positive=False):
    dtype = np.dtype(dtype)
    if positive:
        low, high = 0.1, 3.0
    x = rng.uniform(low, high, size=shape)
    if dtype.kind == "c":
        x = x + 1j * rng.uniform(low, high, size=shape)
    return x.astype(dtype)



def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
