"""fusekit: fused GPU kernels (CPU fallback) behind a stable C ABI, from Python.

Pure ctypes over ``libfusekit``; numpy arrays, torch tensors (CPU and CUDA) and
DLPack producers go in and come out without copies::

    import numpy as np, fusekit
    a = np.linspace(0, 1, 5); b = np.ones(5)
    fusekit.add(a, b)                    # numpy in, numpy out (CPU backend)
    fusekit.axpby(2.0, a, -1.0, b, out=a)  # in place

With torch CUDA tensors the ops run on the CUDA backend, on torch's current
stream. See README.md in this package's source for more.
"""

from . import _lib  # noqa: F401
from ._core import (
    Buffer,
    Context,
    DType,
    Invocation,
    MemoryInfo,
    Stream,
    as_buffer,
    default_context,
    from_dlpack,
)
from ._lib import (
    ABI_VERSION,
    MAX_DIMS,
    AbiMismatchError,
    AliasingError,
    BufferTooSmallError,
    CudaError,
    CudaUnavailableError,
    DeviceMismatchError,
    DtypeMismatchError,
    Error,
    InternalError,
    InvalidArgumentError,
    IoError,
    KernelCompileError,
    LibraryLoadError,
    LibraryNotFoundError,
    NotConvergedError,
    NullPointerError,
    OutOfMemoryError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedError,
    abi_version,
    device_count,
    library_path,
    version_string,
)
from .ops import ENTRY_POINTS
from .ops.elementwise import *  # noqa: F401,F403
from .ops.elementwise import __all__ as _elementwise_all
from .ops.linalg import *  # noqa: F401,F403
from .ops.linalg import __all__ as _linalg_all
from .ops.mlp import *  # noqa: F401,F403
from .ops.mlp import __all__ as _mlp_all
from .runtime import *  # noqa: F401,F403
from .runtime import __all__ as _runtime_all
from .ops.gaussian import *  # noqa: F401,F403
from .ops.gaussian import __all__ as _gaussian_all
from .ops.geodesic import *  # noqa: F401,F403
from .ops.geodesic import __all__ as _geodesic_all
from .ops.optim import *  # noqa: F401,F403
from .ops.optim import __all__ as _optim_all
from . import _route
from .torch import enable_route as _enable_route

# the plain functions reach the compiled torch ops through fusekit/_route.py, which the
# torch layer fills at their first tensor: installed here, above both layers
_route.install(_enable_route)

Error.__module__ = "fusekit"
LibraryLoadError.__module__ = "fusekit"

# the dtypes as names of the package (fusekit.float32 is DType.float32), in DType's order
float16, bfloat16, float32, float64, complex64, complex128 = DType

try:  # written by setup.py from Cargo.toml's version (the one source)
    from ._version import __version__
except ImportError:  # a source tree where setup.py has not run: read Cargo.toml
    import re as _re
    from pathlib import Path as _Path

    _cargo = _Path(__file__).resolve().parents[3] / "Cargo.toml"
    _m = _re.search(r'^version\s*=\s*"([^"]+)"', _cargo.read_text() if _cargo.is_file() else "", _re.M)
    __version__ = _m.group(1) if _m else "0+unknown"
    del _re, _Path, _cargo, _m

__all__ = [
    "Buffer",
    "Context",
    "DType",
    "Invocation",
    "MemoryInfo",
    "Stream",
    "as_buffer",
    "default_context",
    "from_dlpack",
    "ABI_VERSION",
    "MAX_DIMS",
    "Error",
    "AbiMismatchError",
    "AliasingError",
    "BufferTooSmallError",
    "CudaError",
    "CudaUnavailableError",
    "DeviceMismatchError",
    "DtypeMismatchError",
    "InternalError",
    "InvalidArgumentError",
    "IoError",
    "KernelCompileError",
    "LibraryLoadError",
    "LibraryNotFoundError",
    "NotConvergedError",
    "NullPointerError",
    "OutOfMemoryError",
    "ShapeMismatchError",
    "UnsupportedDtypeError",
    "UnsupportedError",
    "abi_version",
    "device_count",
    "library_path",
    "version_string",
    "ENTRY_POINTS",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    *_elementwise_all,
    *_linalg_all,
    *_mlp_all,
    *_runtime_all,
    *_gaussian_all,
    *_geodesic_all,
    *_optim_all,
]
