"""Loading ``libfusekit``, the ctypes prototypes of every C entry point, and errors.

Nothing here knows about numpy or torch. The library is loaded lazily, on the
first call of :func:`lib` (``import fusekit`` works without it), and every entry
point of ``include/fusekit.h`` gets its ``argtypes``/``restype`` from
:data:`PROTOTYPES`. Functions that return ``fk_status`` also get an ``errcheck``
that turns a non-zero status into the matching :class:`Error` subclass, carrying
the library's thread-local message.

Adding an op family: add its prototypes to :data:`PROTOTYPES` (the repository's
``tests/test_bindings_complete.py`` fails until every ``fk_`` function of the
header has one).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_uint8,
    c_void_p,
)
from pathlib import Path

__all__ = [
    "ABI_VERSION",
    "MAX_DIMS",
    "Error",
    "LibraryLoadError",
    "PROTOTYPES",
    "lib",
    "library_path",
    "candidate_paths",
    "fk_scalar",
    "status_name",
    "last_error_message",
]

# ---------------------------------------------------------------------------
# Constants of the header
# ---------------------------------------------------------------------------

#: ``FK_ABI_VERSION`` of the header these bindings were written against.
ABI_VERSION = 1002
#: ``FK_MAX_DIMS``.
MAX_DIMS = 8
#: ``FK_GEO_ALLOW_TF32``: geodesic ops may use TF32 tensor cores for f32 on CUDA.
GEO_ALLOW_TF32 = 1
#: ``FK_GEO_FORCE_GENERIC``: geodesic ops use the generic CUDA kernels (debugging).
GEO_FORCE_GENERIC = 2
#: ``FK_GEO_ALLOW_TF32X3``: the leapfrog forward may use 3xTF32 tensor-core products for
#: f32 on CUDA (f32-level accuracy, faster than the FFMA kernel).
GEO_ALLOW_TF32X3 = 4
#: ``FK_GEMM_ALLOW_TF32``: f32 products may use TF32 tensor cores on CUDA (GEMM and
#: the optimizer-math ops).
GEMM_ALLOW_TF32 = 1

#: ``fk_matpow_method`` values (``fk_matrix_power``).
MATPOW_AUTO = 0
MATPOW_EIGH = 1
MATPOW_NEWTON = 2

DEVICE_AUTO = 0
DEVICE_CPU = 1
DEVICE_CUDA = 2
#: ``FK_DEVICE_CUDA_HOST``: pinned host memory of a CUDA context (a buffer's kind
#: only, never a context's).
DEVICE_CUDA_HOST = 3

#: ``FK_COMM_ID_BYTES``: size of a communicator's unique id.
COMM_ID_BYTES = 128

REDUCE_SUM = 0
REDUCE_PROD = 1
REDUCE_MAX = 2
REDUCE_MIN = 3

DTYPE_F16 = 1
DTYPE_BF16 = 2
DTYPE_F32 = 3
DTYPE_F64 = 4
DTYPE_C64 = 5
DTYPE_C128 = 6

OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_NULL_POINTER = 2
ERROR_UNSUPPORTED_DTYPE = 3
ERROR_SHAPE_MISMATCH = 4
ERROR_DEVICE_MISMATCH = 5
ERROR_ALIASING = 6
ERROR_OUT_OF_MEMORY = 7
ERROR_CUDA_UNAVAILABLE = 8
ERROR_LIBRARY_NOT_FOUND = 9
ERROR_KERNEL_COMPILE = 10
ERROR_CUDA = 11
ERROR_ABI_MISMATCH = 12
ERROR_BUFFER_TOO_SMALL = 13
ERROR_UNSUPPORTED = 14
ERROR_INTERNAL = 15
ERROR_IO = 16
ERROR_DTYPE_MISMATCH = 17
ERROR_NOT_CONVERGED = 18

_STATUS_NAMES = {
    0: "FK_OK",
    1: "FK_ERROR_INVALID_ARGUMENT",
    2: "FK_ERROR_NULL_POINTER",
    3: "FK_ERROR_UNSUPPORTED_DTYPE",
    4: "FK_ERROR_SHAPE_MISMATCH",
    5: "FK_ERROR_DEVICE_MISMATCH",
    6: "FK_ERROR_ALIASING",
    7: "FK_ERROR_OUT_OF_MEMORY",
    8: "FK_ERROR_CUDA_UNAVAILABLE",
    9: "FK_ERROR_LIBRARY_NOT_FOUND",
    10: "FK_ERROR_KERNEL_COMPILE",
    11: "FK_ERROR_CUDA",
    12: "FK_ERROR_ABI_MISMATCH",
    13: "FK_ERROR_BUFFER_TOO_SMALL",
    14: "FK_ERROR_UNSUPPORTED",
    15: "FK_ERROR_INTERNAL",
    16: "FK_ERROR_IO",
    17: "FK_ERROR_DTYPE_MISMATCH",
    18: "FK_ERROR_NOT_CONVERGED",
}

# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class Error(Exception):
    """Base class of every error a fusekit call reports.

    Attributes:
        status: the ``fk_status`` value (int).
        status_name: its name, e.g. ``"FK_ERROR_SHAPE_MISMATCH"``.
        message: the library's message (``"<function>: <cause>"``), or for errors
            found by the Python layer before any C call, ``"fusekit.<func>: ..."``.
    """

    status: int = -1

    def __init__(self, message: str, status: int | None = None, status_name: str | None = None):
        if status is None:
            status = type(self).status
        self.status = int(status)
        self.status_name = status_name or status_name_of(self.status)
        self.message = message
        super().__init__(f"{message} [{self.status_name}]")


def _subclass(name: str, status: int, doc: str, *bases: type) -> type:
    cls = type(name, (Error, *bases), {"status": status, "__doc__": doc, "__module__": "fusekit"})
    return cls


InvalidArgumentError = _subclass(
    "InvalidArgumentError", ERROR_INVALID_ARGUMENT, "FK_ERROR_INVALID_ARGUMENT", ValueError
)
NullPointerError = _subclass("NullPointerError", ERROR_NULL_POINTER, "FK_ERROR_NULL_POINTER", ValueError)
UnsupportedDtypeError = _subclass(
    "UnsupportedDtypeError", ERROR_UNSUPPORTED_DTYPE, "FK_ERROR_UNSUPPORTED_DTYPE", TypeError
)
ShapeMismatchError = _subclass(
    "ShapeMismatchError", ERROR_SHAPE_MISMATCH, "FK_ERROR_SHAPE_MISMATCH", ValueError
)
DeviceMismatchError = _subclass(
    "DeviceMismatchError", ERROR_DEVICE_MISMATCH, "FK_ERROR_DEVICE_MISMATCH", ValueError
)
AliasingError = _subclass("AliasingError", ERROR_ALIASING, "FK_ERROR_ALIASING", ValueError)
OutOfMemoryError = _subclass("OutOfMemoryError", ERROR_OUT_OF_MEMORY, "FK_ERROR_OUT_OF_MEMORY", MemoryError)
CudaUnavailableError = _subclass(
    "CudaUnavailableError", ERROR_CUDA_UNAVAILABLE, "FK_ERROR_CUDA_UNAVAILABLE", RuntimeError
)
LibraryNotFoundError = _subclass(
    "LibraryNotFoundError",
    ERROR_LIBRARY_NOT_FOUND,
    "FK_ERROR_LIBRARY_NOT_FOUND: a run-time dependency of libfusekit (libnvrtc, the CUDA "
    "headers, ...) is missing. (Failing to find libfusekit itself is LibraryLoadError.)",
    RuntimeError,
)
KernelCompileError = _subclass(
    "KernelCompileError", ERROR_KERNEL_COMPILE, "FK_ERROR_KERNEL_COMPILE", RuntimeError
)
CudaError = _subclass("CudaError", ERROR_CUDA, "FK_ERROR_CUDA", RuntimeError)
AbiMismatchError = _subclass("AbiMismatchError", ERROR_ABI_MISMATCH, "FK_ERROR_ABI_MISMATCH", RuntimeError)
BufferTooSmallError = _subclass(
    "BufferTooSmallError", ERROR_BUFFER_TOO_SMALL, "FK_ERROR_BUFFER_TOO_SMALL", ValueError
)
UnsupportedError = _subclass("UnsupportedError", ERROR_UNSUPPORTED, "FK_ERROR_UNSUPPORTED", RuntimeError)
InternalError = _subclass("InternalError", ERROR_INTERNAL, "FK_ERROR_INTERNAL", RuntimeError)
IoError = _subclass("IoError", ERROR_IO, "FK_ERROR_IO", OSError)
DtypeMismatchError = _subclass(
    "DtypeMismatchError", ERROR_DTYPE_MISMATCH, "FK_ERROR_DTYPE_MISMATCH", TypeError
)


class NotConvergedError(Error, RuntimeError):
    """FK_ERROR_NOT_CONVERGED: an iterative method (``fk_matrix_power``'s Newton
    iteration, or the eigensolver) did not converge. The output then holds the last
    iterate.

    Attributes (set by :func:`fusekit.matrix_power`, else None):
        report: a :class:`fusekit.MatrixPowerReport` saying how far it got.
        out: the output array holding the last iterate (the caller's ``out``, or
            the one allocated for the call).
    """

    status = ERROR_NOT_CONVERGED

    def __init__(self, message: str, status: int | None = None, status_name: str | None = None):
        super().__init__(message, status, status_name)
        self.report = None
        self.out = None


NotConvergedError.__module__ = "fusekit"

#: status value -> Error subclass
ERRORS: dict[int, type] = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        NullPointerError,
        UnsupportedDtypeError,
        ShapeMismatchError,
        DeviceMismatchError,
        AliasingError,
        OutOfMemoryError,
        CudaUnavailableError,
        LibraryNotFoundError,
        KernelCompileError,
        CudaError,
        AbiMismatchError,
        BufferTooSmallError,
        UnsupportedError,
        InternalError,
        IoError,
        DtypeMismatchError,
        NotConvergedError,
    )
}


class LibraryLoadError(ImportError):
    """``libfusekit`` itself could not be found or loaded. ``.searched`` lists
    ``(path, reason)`` for every place that was tried."""

    def __init__(self, message: str, searched: list[tuple[str, str]]):
        self.searched = searched
        super().__init__(message)


def status_name_of(status: int) -> str:
    """The name of a status; asks the library when it is loaded (so that statuses
    added after these bindings still get their name)."""
    if _LIB is not None:
        raw = _LIB.fk_status_string(int(status))
        if raw:
            return raw.decode("utf-8", "replace")
    return _STATUS_NAMES.get(int(status), "FK_UNKNOWN_STATUS")


status_name = status_name_of


def error_for(status: int, message: str) -> Error:
    """An instance of the Error subclass for ``status``."""
    cls = ERRORS.get(int(status), Error)
    return cls(message, status=status)


def raise_error(status: int, where: str, message: str):
    """Raises the Error subclass of ``status`` for a problem the Python layer found.
    ``where`` names the Python function, e.g. ``"fusekit.add"``."""
    raise error_for(status, f"{where}: {message}")


# ---------------------------------------------------------------------------
# Types and prototypes
# ---------------------------------------------------------------------------


class fk_scalar(Structure):
    """``fk_scalar``: a complex number passed by value."""

    _fields_ = [("re", c_double), ("im", c_double)]

    def __repr__(self) -> str:
        return f"fk_scalar({self.re!r}, {self.im!r})"


class fk_matpow_report(Structure):
    """``fk_matpow_report``: what ``fk_matrix_power`` did (an out-parameter)."""

    _fields_ = [
        ("method", c_int32),
        ("iterations", c_int32),
        ("converged", c_int32),
        ("reserved", c_int32),
        ("residual", c_double),
        ("min_eigenvalue", c_double),
    ]


class fk_context(Structure):
    """Opaque ``fk_context``."""


class fk_stream(Structure):
    """Opaque ``fk_stream``."""


class fk_buffer(Structure):
    """Opaque ``fk_buffer``."""


class fk_event(Structure):
    """Opaque ``fk_event``."""


class fk_comm(Structure):
    """Opaque ``fk_comm``."""


class fk_memory_stats(Structure):
    """``fk_memory_stats``: a growable struct; set ``size`` to ``sizeof`` first."""

    _fields_ = [
        ("size", c_size_t),
        ("allocated_bytes", c_uint64),
        ("peak_allocated_bytes", c_uint64),
        ("reserved_bytes", c_uint64),
        ("peak_reserved_bytes", c_uint64),
        ("pool_used_bytes", c_uint64),
        ("live_allocations", c_uint64),
        ("device_free_bytes", c_uint64),
        ("device_total_bytes", c_uint64),
        ("release_threshold_bytes", c_uint64),
        ("pinned_bytes", c_uint64),
        ("pinned_allocations", c_uint64),
    ]


ctx_p = POINTER(fk_context)
stream_p = POINTER(fk_stream)
buffer_p = POINTER(fk_buffer)
event_p = POINTER(fk_event)
comm_p = POINTER(fk_comm)
fk_status = c_int32
fk_dtype = c_int32
fk_device_kind = c_int32

# The shapes of the elementwise entry points (shared by many functions).
_UNARY = (fk_status, [buffer_p, buffer_p, stream_p])
_BINARY = (fk_status, [buffer_p, buffer_p, buffer_p, stream_p])

#: name -> (restype, argtypes) for every ``fk_`` function of include/fusekit.h.
PROTOTYPES: dict[str, tuple] = {
    # versions, statuses, messages
    "fk_abi_version": (c_uint32, []),
    "fk_version_string": (c_char_p, []),
    "fk_status_string": (c_char_p, [fk_status]),
    "fk_last_error_message": (c_char_p, []),
    "fk_last_error_message_copy": (fk_status, [c_char_p, c_size_t, POINTER(c_size_t)]),
    "fk_dtype_size": (fk_status, [fk_dtype, POINTER(c_size_t)]),
    "fk_device_count": (fk_status, [POINTER(c_int32)]),
    # contexts
    "fk_context_create": (fk_status, [c_uint32, fk_device_kind, c_int32, POINTER(ctx_p)]),
    "fk_context_destroy": (fk_status, [ctx_p]),
    "fk_context_device": (fk_status, [ctx_p, POINTER(fk_device_kind), POINTER(c_int32)]),
    "fk_context_name": (fk_status, [ctx_p, c_char_p, c_size_t, POINTER(c_size_t)]),
    "fk_context_compute_capability": (fk_status, [ctx_p, POINTER(c_int32), POINTER(c_int32)]),
    "fk_context_memory": (fk_status, [ctx_p, POINTER(c_uint64), POINTER(c_uint64)]),
    "fk_context_warmup": (fk_status, [ctx_p]),
    # streams
    "fk_stream_create": (fk_status, [ctx_p, POINTER(stream_p)]),
    "fk_stream_wrap": (fk_status, [ctx_p, c_void_p, POINTER(stream_p)]),
    "fk_stream_destroy": (fk_status, [stream_p]),
    "fk_stream_synchronize": (fk_status, [stream_p]),
    "fk_stream_handle": (fk_status, [stream_p, POINTER(c_void_p)]),
    # buffers
    "fk_buffer_create": (
        fk_status,
        [ctx_p, fk_dtype, c_int32, POINTER(c_int64), stream_p, POINTER(buffer_p)],
    ),
    "fk_buffer_wrap": (
        fk_status,
        [ctx_p, c_void_p, fk_dtype, c_int32, POINTER(c_int64), POINTER(c_int64), POINTER(buffer_p)],
    ),
    "fk_buffer_destroy": (fk_status, [buffer_p]),
    "fk_buffer_from_dlpack": (fk_status, [ctx_p, c_void_p, POINTER(buffer_p)]),
    "fk_buffer_to_dlpack": (fk_status, [buffer_p, POINTER(c_void_p)]),
    "fk_buffer_copy_from_host": (fk_status, [buffer_p, c_void_p, c_size_t, stream_p]),
    "fk_buffer_copy_from_host_async": (fk_status, [buffer_p, c_void_p, c_size_t, stream_p]),
    "fk_buffer_copy_to_host": (fk_status, [buffer_p, c_void_p, c_size_t, stream_p]),
    "fk_buffer_copy_to_host_async": (fk_status, [buffer_p, c_void_p, c_size_t, stream_p]),
    "fk_buffer_dtype": (fk_status, [buffer_p, POINTER(fk_dtype)]),
    "fk_buffer_ndim": (fk_status, [buffer_p, POINTER(c_int32)]),
    "fk_buffer_shape": (fk_status, [buffer_p, POINTER(c_int64)]),
    "fk_buffer_strides": (fk_status, [buffer_p, POINTER(c_int64)]),
    "fk_buffer_data": (fk_status, [buffer_p, POINTER(c_void_p)]),
    "fk_buffer_device": (fk_status, [buffer_p, POINTER(fk_device_kind), POINTER(c_int32)]),
    "fk_buffer_numel": (fk_status, [buffer_p, POINTER(c_int64)]),
    "fk_buffer_nbytes": (fk_status, [buffer_p, POINTER(c_size_t)]),
    "fk_buffer_is_contiguous": (fk_status, [buffer_p, POINTER(c_int32)]),
    # elementwise (docs/ops.md section 1)
    "fk_add": _BINARY,
    "fk_sub": _BINARY,
    "fk_mul": _BINARY,
    "fk_div": _BINARY,
    "fk_axpby": (fk_status, [fk_scalar, buffer_p, fk_scalar, buffer_p, buffer_p, stream_p]),
    "fk_scalar_add": (fk_status, [buffer_p, fk_scalar, buffer_p, stream_p]),
    "fk_scalar_mul": (fk_status, [buffer_p, fk_scalar, buffer_p, stream_p]),
    "fk_neg": _UNARY,
    "fk_abs": _UNARY,
    "fk_exp": _UNARY,
    "fk_log": _UNARY,
    "fk_sqrt": _UNARY,
    "fk_sin": _UNARY,
    "fk_cos": _UNARY,
    "fk_tanh": _UNARY,
    "fk_sigmoid": _UNARY,
    "fk_relu": _UNARY,
    "fk_copy": _UNARY,
    # linear algebra (docs/ops.md section 2)
    "fk_gemm": (
        fk_status,
        [c_int32, c_int32, fk_scalar, buffer_p, buffer_p, fk_scalar, buffer_p, c_uint32, stream_p],
    ),
    "fk_gemm_chunked": (
        fk_status,
        [c_int32, c_int32, fk_scalar, buffer_p, buffer_p, fk_scalar, buffer_p, c_uint64, c_uint32, stream_p],
    ),
    "fk_linear_aux_size": (fk_status, [c_int32, fk_dtype, c_int64, c_int64, POINTER(c_size_t)]),
    "fk_linear_forward": (
        fk_status,
        [buffer_p, buffer_p, buffer_p, c_int32, buffer_p, buffer_p, stream_p],
    ),
    "fk_linear_backward": (
        fk_status,
        [buffer_p, buffer_p, buffer_p, c_int32, buffer_p, buffer_p, buffer_p, buffer_p, stream_p],
    ),
    "fk_kron": _BINARY,
    # runtime: memory, pinned buffers, copies, events, communicators (docs/abi.md)
    "fk_context_memory_stats": (fk_status, [ctx_p, POINTER(fk_memory_stats)]),
    "fk_context_set_release_threshold": (fk_status, [ctx_p, c_uint64]),
    "fk_context_trim": (fk_status, [ctx_p, c_uint64]),
    "fk_buffer_create_pinned": (
        fk_status,
        [ctx_p, fk_dtype, c_int32, POINTER(c_int64), POINTER(buffer_p)],
    ),
    "fk_buffer_copy": (fk_status, [buffer_p, buffer_p, stream_p]),
    "fk_device_can_access_peer": (fk_status, [c_int32, c_int32, POINTER(c_int32)]),
    "fk_event_create": (fk_status, [ctx_p, POINTER(event_p)]),
    "fk_event_destroy": (fk_status, [event_p]),
    "fk_event_record": (fk_status, [event_p, stream_p]),
    "fk_stream_wait_event": (fk_status, [stream_p, event_p]),
    "fk_event_synchronize": (fk_status, [event_p]),
    "fk_event_query": (fk_status, [event_p, POINTER(c_int32)]),
    "fk_event_elapsed_ms": (fk_status, [event_p, event_p, POINTER(c_float)]),
    "fk_comm_unique_id": (fk_status, [POINTER(c_uint8)]),
    "fk_comm_init_rank": (fk_status, [ctx_p, c_int32, POINTER(c_uint8), c_int32, POINTER(comm_p)]),
    "fk_comm_init_all": (fk_status, [POINTER(ctx_p), c_int32, POINTER(comm_p)]),
    "fk_comm_destroy": (fk_status, [comm_p]),
    "fk_comm_rank": (fk_status, [comm_p, POINTER(c_int32)]),
    "fk_comm_size": (fk_status, [comm_p, POINTER(c_int32)]),
    "fk_comm_group_start": (fk_status, []),
    "fk_comm_group_end": (fk_status, []),
    "fk_all_reduce": (fk_status, [comm_p, buffer_p, buffer_p, c_int32, stream_p]),
    "fk_broadcast": (fk_status, [comm_p, buffer_p, buffer_p, c_int32, stream_p]),
    "fk_all_gather": (fk_status, [comm_p, buffer_p, buffer_p, stream_p]),
    "fk_reduce_scatter": (fk_status, [comm_p, buffer_p, buffer_p, c_int32, stream_p]),
    # Gaussian field (docs/ops.md section 3)
    "fk_mahalanobis_forward": (fk_status, [buffer_p, buffer_p, buffer_p, c_double, buffer_p, stream_p]),
    "fk_mahalanobis_backward": (
        fk_status,
        [buffer_p, buffer_p, buffer_p, c_double, buffer_p, buffer_p, buffer_p, buffer_p, buffer_p, stream_p],
    ),
    "fk_gaussian_field_forward": (
        fk_status,
        [buffer_p, buffer_p, buffer_p, buffer_p, c_double, buffer_p, stream_p],
    ),
    "fk_gaussian_field_backward": (
        fk_status,
        [buffer_p, buffer_p, buffer_p, buffer_p, c_double, buffer_p, buffer_p, buffer_p, buffer_p, buffer_p,
         buffer_p, stream_p],
    ),
    "fk_gaussian_backward_workspace_size": (fk_status, [ctx_p, fk_dtype, c_int64, c_int64, POINTER(c_size_t)]),
    # Geodesic flow (docs/ops.md section 5)
    "fk_christoffel_forward": (fk_status, [buffer_p, buffer_p, buffer_p, c_double, c_uint32, buffer_p, stream_p]),
    "fk_christoffel_backward": (
        fk_status,
        [buffer_p, buffer_p, buffer_p, buffer_p, c_double, c_uint32, buffer_p, buffer_p, buffer_p, stream_p],
    ),
    "fk_leapfrog_forward": (
        fk_status,
        [buffer_p, buffer_p, buffer_p, buffer_p, buffer_p, buffer_p, c_double, c_int64, c_double, c_uint32,
         buffer_p, buffer_p, buffer_p, stream_p],
    ),
    "fk_leapfrog_backward": (
        fk_status,
        [buffer_p, buffer_p, buffer_p, buffer_p, buffer_p, c_double, c_int64, c_double, c_uint32, buffer_p,
         buffer_p, buffer_p, buffer_p, buffer_p, buffer_p, buffer_p, buffer_p, stream_p],
    ),
    # Optimizer math (docs/ops.md section 4)
    "fk_matrix_power": (
        fk_status,
        [buffer_p, c_double, c_double, c_int32, c_int32, c_double, c_uint32, buffer_p, POINTER(fk_matpow_report),
         stream_p],
    ),
    "fk_shampoo_stats": (fk_status, [buffer_p, c_double, c_double, buffer_p, buffer_p, stream_p]),
    "fk_shampoo_stats_ex": (fk_status, [buffer_p, c_double, c_double, buffer_p, buffer_p, c_uint32, stream_p]),
    "fk_shampoo_precondition": (fk_status, [buffer_p, buffer_p, buffer_p, buffer_p, c_uint32, stream_p]),
    "fk_per_sample_grads": (fk_status, [buffer_p, buffer_p, buffer_p, c_uint32, stream_p]),
    "fk_per_sample_grad_norms": (fk_status, [buffer_p, buffer_p, buffer_p, stream_p]),
    "fk_dp_clipped_grad_sum": (fk_status, [buffer_p, buffer_p, c_double, buffer_p, buffer_p, c_uint32, stream_p]),
}

#: Status-returning functions whose non-OK results are not errors to raise
#: (it reports FK_ERROR_BUFFER_TOO_SMALL as part of its protocol and never sets
#: the last message).
_NO_ERRCHECK = {"fk_last_error_message_copy"}


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------

if sys.platform == "win32":
    LIBRARY_FILE = "fusekit.dll"
elif sys.platform == "darwin":
    LIBRARY_FILE = "libfusekit.dylib"
else:
    LIBRARY_FILE = "libfusekit.so"

_LIB = None
_LIB_PATH: str | None = None
_LOCK = threading.Lock()


def candidate_paths(
    env: dict | None = None, package_dir: str | os.PathLike | None = None
) -> list[tuple[str, str]]:
    """Where the library is looked for, in order, as ``(description, path)``.

    1. ``$FUSEKIT_LIBRARY`` (the full path of the library file);
    2. ``libfusekit.so`` next to the package files;
    3. the repository's build output, walking up from the package: at each
       ancestor ``target/release`` then ``target/debug`` (and the same under
       ``$CARGO_TARGET_DIR`` when set);
    4. the system's search (``ctypes.util.find_library("fusekit")``).
    """
    env = os.environ if env is None else env
    package_dir = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parent
    out: list[tuple[str, str]] = []
    explicit = env.get("FUSEKIT_LIBRARY")
    if explicit:
        out.append(("$FUSEKIT_LIBRARY", explicit))
    out.append(("next to the package", str(package_dir / LIBRARY_FILE)))
    target_dir = env.get("CARGO_TARGET_DIR")
    if target_dir:
        for profile in ("release", "debug"):
            out.append((f"$CARGO_TARGET_DIR/{profile}", str(Path(target_dir) / profile / LIBRARY_FILE)))
    for ancestor in package_dir.parents:
        for profile in ("release", "debug"):
            p = ancestor / "target" / profile / LIBRARY_FILE
            out.append((f"build output target/{profile}", str(p)))
    return out


def _try_load(path: str):
    return ctypes.CDLL(path)


def load_library(env: dict | None = None, package_dir=None, system: bool = True):
    """Finds and loads the library (does not cache; see :func:`lib`).
    Returns ``(CDLL, path)`` or raises :class:`LibraryLoadError` listing every
    place it looked and why each failed."""
    env = os.environ if env is None else env
    searched: list[tuple[str, str]] = []
    explicit = env.get("FUSEKIT_LIBRARY")
    for desc, path in candidate_paths(env, package_dir):
        if not os.path.exists(path):
            searched.append((path, f"{desc}: no such file"))
            if explicit and desc == "$FUSEKIT_LIBRARY":
                # An explicit choice that is wrong is an error, not a hint to go
                # looking elsewhere (that would load a library the user did not ask for).
                break
            continue
        try:
            return _try_load(path), path
        except OSError as e:
            searched.append((path, f"{desc}: {e}"))
            if explicit and desc == "$FUSEKIT_LIBRARY":
                break
    else:
        if system:
            found = ctypes.util.find_library("fusekit")
            if found:
                try:
                    return _try_load(found), found
                except OSError as e:
                    searched.append((found, f"system search: {e}"))
            else:
                searched.append(("ctypes.util.find_library('fusekit')", "system search: not found"))
    lines = "\n".join(f"  - {p} ({why})" for p, why in searched)
    raise LibraryLoadError(
        "fusekit: could not load the native library "
        f"{LIBRARY_FILE}. Looked in:\n{lines}\n"
        "Build it with `cargo build --release` in the fusekit repository, or set "
        "FUSEKIT_LIBRARY to the full path of the library file.",
        searched,
    )


def _make_errcheck(name: str):
    def errcheck(result, func, args):
        if result != OK:
            raw = _LIB.fk_last_error_message() if _LIB is not None else None
            msg = raw.decode("utf-8", "replace") if raw else f"{name}: failed"
            raise error_for(result, msg)
        return result

    return errcheck


def apply_prototypes(cdll) -> None:
    """Declares ``argtypes``/``restype`` (and the error check) on every entry point."""
    missing = []
    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            fn = getattr(cdll, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
        if restype is fk_status and name not in _NO_ERRCHECK:
            fn.errcheck = _make_errcheck(name)
    if missing:
        raise LibraryLoadError(
            f"fusekit: the loaded library lacks entry points {missing}; it is older than "
            "these bindings (rebuild it)",
            [],
        )


def lib():
    """The loaded library (loaded and checked on first use)."""
    global _LIB, _LIB_PATH
    if _LIB is not None:
        return _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        cdll, path = load_library()
        apply_prototypes(cdll)
        abi = cdll.fk_abi_version()
        if abi // 1000 != ABI_VERSION // 1000 or abi < ABI_VERSION:
            raise LibraryLoadError(
                f"fusekit: {path} has ABI version {abi}, but these bindings need "
                f"{ABI_VERSION // 1000}.x with minor >= {ABI_VERSION % 1000}",
                [(path, "ABI mismatch")],
            )
        _LIB_PATH = path
        _LIB = cdll
        return _LIB


def library_path() -> str:
    """Path of the loaded library (loads it if needed)."""
    lib()
    return _LIB_PATH  # type: ignore[return-value]


def last_error_message() -> str:
    """This thread's last error message from the library."""
    raw = lib().fk_last_error_message()
    return raw.decode("utf-8", "replace") if raw else ""


def version_string() -> str:
    """E.g. ``"fusekit 0.1.0"``."""
    return lib().fk_version_string().decode()


def abi_version() -> int:
    return int(lib().fk_abi_version())


def read_string(fn, *args) -> str:
    """Calls a ``(..., char *buf, size_t capacity, size_t *needed)`` getter with the
    size-query protocol of ``fk_last_error_message_copy``."""
    needed = c_size_t(0)
    st = fn(*args, None, 0, ctypes.byref(needed))
    if st != OK:
        raise error_for(st, last_error_message())
    buf = ctypes.create_string_buffer(max(int(needed.value), 1))
    st = fn(*args, buf, len(buf), ctypes.byref(needed))
    if st != OK:
        raise error_for(st, last_error_message())
    return buf.value.decode("utf-8", "replace")


def dtype_size(code: int) -> int:
    out = c_size_t(0)
    lib().fk_dtype_size(int(code), ctypes.byref(out))
    return int(out.value)


def device_count() -> int:
    """Number of CUDA devices fusekit can use (0 without a driver or GPU)."""
    out = c_int32(0)
    lib().fk_device_count(ctypes.byref(out))
    return int(out.value)


def scalar(value, where: str = "fusekit", name: str = "s") -> fk_scalar:
    """Converts a Python/numpy/0-d torch number to an ``fk_scalar``."""
    if isinstance(value, fk_scalar):
        return value
    if isinstance(value, (bool, int, float, complex)):
        z = complex(value)
    else:
        try:
            z = complex(value)
        except (TypeError, ValueError):
            raise_error(
                ERROR_INVALID_ARGUMENT,
                where,
                f"{name} must be a number (int, float or complex), got {type(value).__name__}",
            )
    return fk_scalar(z.real, z.imag)
