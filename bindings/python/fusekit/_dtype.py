"""fusekit's element types: :class:`DType` (the ABI's ``FK_DTYPE_*``), :func:`as_dtype`
(every spelling the functions accept: names, numpy and torch dtypes) and the tables
that map numpy, torch and DLPack element types to it; and how fusekit sees torch
(only once the caller has imported it)."""

from __future__ import annotations

import enum
import sys

import numpy as np

from . import _lib
from ._lib import ERROR_UNSUPPORTED_DTYPE, raise_error


class DType(enum.IntEnum):
    """fusekit's element types; the values are the ABI's ``FK_DTYPE_*``."""

    float16 = _lib.DTYPE_F16
    bfloat16 = _lib.DTYPE_BF16
    float32 = _lib.DTYPE_F32
    float64 = _lib.DTYPE_F64
    complex64 = _lib.DTYPE_C64
    complex128 = _lib.DTYPE_C128

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_complex(self) -> bool:
        return self in (DType.complex64, DType.complex128)

    @property
    def real(self) -> "DType":
        """The real type of a complex type (itself for real types)."""
        return {DType.complex64: DType.float32, DType.complex128: DType.float64}.get(self, self)

    @property
    def numpy(self):
        """The numpy dtype (None for bfloat16, which numpy lacks)."""
        return _TO_NUMPY.get(self)

    @property
    def torch(self):
        import torch

        return getattr(torch, self.name)

    def __str__(self) -> str:
        return self.name


_ITEMSIZE = {
    DType.float16: 2,
    DType.bfloat16: 2,
    DType.float32: 4,
    DType.float64: 8,
    DType.complex64: 8,
    DType.complex128: 16,
}
_TO_NUMPY = {
    DType.float16: np.dtype(np.float16),
    DType.float32: np.dtype(np.float32),
    DType.float64: np.dtype(np.float64),
    DType.complex64: np.dtype(np.complex64),
    DType.complex128: np.dtype(np.complex128),
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}
_ALIASES = {
    "f16": DType.float16,
    "half": DType.float16,
    "bf16": DType.bfloat16,
    "f32": DType.float32,
    "float": DType.float32,
    "f64": DType.float64,
    "double": DType.float64,
    "c64": DType.complex64,
    "c128": DType.complex128,
}
# torch dtype -> DType, filled by as_dtype (torch is never imported here)
_FROM_TORCH: dict = {}
_SUPPORTED = "float16, bfloat16, float32, float64, complex64, complex128"

# DLPack (code, bits) -> DType, for legacy capsules wrapped by pointer.
_FROM_DLPACK = {
    (2, 16): DType.float16,
    (4, 16): DType.bfloat16,
    (2, 32): DType.float32,
    (2, 64): DType.float64,
    (5, 64): DType.complex64,
    (5, 128): DType.complex128,
}


def _torch():
    """torch if it is already imported (fusekit never imports it by itself)."""
    return sys.modules.get("torch")


def _is_torch_tensor(obj) -> bool:
    t = _torch()
    return t is not None and isinstance(obj, t.Tensor)


def _is_torch_dtype(x) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.dtype)


def as_dtype(x, where: str = "fusekit", name: str = "dtype") -> DType:
    """Accepts a DType, its value, a name ("float32", "f32", "bf16", ...), a numpy
    dtype or a torch dtype."""
    if isinstance(x, DType):
        return x
    # the per-call paths: a native numpy dtype, a torch dtype seen before
    if isinstance(x, np.dtype):
        d = _FROM_NUMPY.get(x)
        if d is not None:
            return d
    else:
        d = _FROM_TORCH.get(x) if _FROM_TORCH and _is_torch_dtype(x) else None
        if d is not None:
            return d
    if isinstance(x, int) and not isinstance(x, bool):
        try:
            return DType(x)
        except ValueError:
            pass
    elif isinstance(x, str):
        key = x.lower()
        if key in DType.__members__:
            return DType[key]
        if key in _ALIASES:
            return _ALIASES[key]
    t = _torch()
    if t is not None and isinstance(x, t.dtype):
        name_ = str(x).replace("torch.", "")
        if name_ in DType.__members__:
            _FROM_TORCH[x] = DType[name_]
            return DType[name_]
    else:
        try:
            nd = np.dtype(x)
        except (TypeError, ValueError):
            nd = None
        if nd is not None and nd.isnative and nd.newbyteorder("=") in _FROM_NUMPY:
            return _FROM_NUMPY[nd.newbyteorder("=")]
    raise_error(
        ERROR_UNSUPPORTED_DTYPE,
        where,
        f"{name} {x!r} is not a fusekit element type (supported: {_SUPPORTED})",
    )
