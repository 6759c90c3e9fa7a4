"""Helpers shared by the fusekit Python tests (imported as a plain module; the
conftest puts this folder on sys.path)."""

import gc
import weakref

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


def assert_kept_alive(make, wrap, use) -> None:
    """``wrap(make())`` keeps the array it wraps alive, when nothing else refers to
    it, until the wrapper is closed; ``use(wrapper)`` runs in between."""
    arr = make()
    r = weakref.ref(arr)
    b = wrap(arr)
    del arr
    gc.collect()
    assert r() is not None
    use(b)
    b.close()
    gc.collect()
    assert r() is None


# ---------------------------------------------------------------------------- torch (imported on use)

TORCH_DTYPES = ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"]


def torch_rand(shape, dtype: str, positive=False, seed=0, device="cpu"):
    """A seeded random torch tensor of dtype `dtype` (a name) on `device`: uniform
    in [-2, 2), or [0.1, 3) when `positive`; complex ones have both parts so."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    lo, hi = (0.1, 3.0) if positive else (-2.0, 2.0)
    x = torch.rand(shape, generator=g, dtype=torch.float64, device=device) * (hi - lo) + lo
    if dtype.startswith("complex"):
        x = torch.complex(x, torch.rand(shape, generator=g, dtype=torch.float64, device=device) * (hi - lo) + lo)
    return x.to(getattr(torch, dtype))


def torch_ref(x):
    """`x` in complex128 or float64: the precision references are computed in."""
    import torch

    return x.to(torch.complex128 if x.is_complex() else torch.float64)


def torch_elementwise_refs():
    """(UNARY, BINARY): fusekit's elementwise function name -> torch's formula."""
    import torch

    unary = {
        "neg": torch.neg,
        "abs": torch.abs,
        "exp": torch.exp,
        "log": torch.log,
        "sqrt": torch.sqrt,
        "sin": torch.sin,
        "cos": torch.cos,
        "tanh": torch.tanh,
        "sigmoid": lambda x: 1 / (1 + torch.exp(-x)),
        "relu": torch.relu,
        "copy": lambda x: x.clone(),
    }
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
    return unary, binary


def _host(x):
    return x.detach().cpu().numpy()


def check_torch_binary(fk, name: str, dtype: str, shape_a, shape_b, device="cpu"):
    """fusekit's binary op `name` on random torch tensors (a positive divisor for
    div) against torch's formula; returns (a, output)."""
    a = torch_rand(shape_a, dtype, seed=1, device=device)
    b = torch_rand(shape_b, dtype, positive=(name == "div"), seed=2, device=device)
    out = getattr(fk, name)(a, b)
    binary = torch_elementwise_refs()[1][name]
    assert_close(_host(torch_ref(out)), _host(binary(torch_ref(a), torch_ref(b))), dtype)
    return a, out


def check_torch_unary(fk, name: str, dtype: str, shape, device="cpu"):
    """fusekit's unary op `name` on a random torch tensor (positive for log and
    sqrt; complex tanh's imaginary part halved, away from the poles: see
    test_ops_numpy) against torch's formula; returns (a, output), or None after
    checking that relu refuses a complex input."""
    import pytest
    import torch

    a = torch_rand(shape, dtype, positive=name in ("log", "sqrt"), seed=3, device=device)
    if name == "tanh" and a.is_complex():
        a = torch.complex(a.real, a.imag * 0.5)
    if name == "relu" and a.is_complex():
        with pytest.raises(fk.UnsupportedDtypeError):
            fk.relu(a)
        return None
    out = getattr(fk, name)(a)
    unary = torch_elementwise_refs()[0][name]
    assert_close(_host(torch_ref(out)), _host(unary(torch_ref(a))), dtype)
    return a, out


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
