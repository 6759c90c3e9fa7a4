"""Loading ``libfusekit``, the ctypes prototypes of every C entry point, and errors.

Nothing here knows about numpy or torch. The library is loaded lazily, on the
first call of :func:`lib` (``import fusekit`` works without it), and every entry
point of ``include/fusekit.h`` gets its ``argtypes``/``restype`` from
:data:`PROTOTYPES`. Functions that return ``fk_status`` also get an ``errcheck``
that turns a non-zero status into the matching :class:`Error` subclass, carrying
the library's thread-local message.

The constants, the status names, the C structs and :data:`PROTOTYPES` come from
``_abi.py``, which ``scripts/gen_bindings.py`` generates from the header (every
name of ``_abi`` is also a name of this module). A new entry point needs no edit
here: regenerate with ``python scripts/gen_bindings.py`` (the repository's
``tests/test_generated_bindings.py`` fails while ``_abi.py`` is stale).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from ctypes import POINTER, c_int32, c_size_t
from pathlib import Path

from . import _abi
from ._abi import *  # noqa: F401,F403  (every constant, type and PROTOTYPES of the header)
from ._abi import (
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_CONVERGED,
    OK,
    PROTOTYPES,
    STATUS_NAMES,
    fk_buffer,
    fk_comm,
    fk_context,
    fk_event,
    fk_scalar,
    fk_status,
    fk_stream,
)

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
# Constants of the header: from _abi (ABI_VERSION, MAX_DIMS, DTYPE_*, ERROR_*, ...)
# ---------------------------------------------------------------------------

_STATUS_NAMES = STATUS_NAMES

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


def _subclass(name: str, code: str, base: type, doc: str = "") -> type:
    """The Error subclass `name` of status FK_ERROR_<code>, also a `base` (ValueError,
    ...); its docstring is the status name, then `doc`."""
    status_name = "FK_ERROR_" + code
    doc = f"{status_name}: {doc}" if doc else status_name
    ns = {"status": getattr(_abi, status_name[len("FK_"):]), "__doc__": doc, "__module__": "fusekit"}
    return type(name, (Error, base), ns)


InvalidArgumentError = _subclass("InvalidArgumentError", "INVALID_ARGUMENT", ValueError)
NullPointerError = _subclass("NullPointerError", "NULL_POINTER", ValueError)
UnsupportedDtypeError = _subclass("UnsupportedDtypeError", "UNSUPPORTED_DTYPE", TypeError)
ShapeMismatchError = _subclass("ShapeMismatchError", "SHAPE_MISMATCH", ValueError)
DeviceMismatchError = _subclass("DeviceMismatchError", "DEVICE_MISMATCH", ValueError)
AliasingError = _subclass("AliasingError", "ALIASING", ValueError)
OutOfMemoryError = _subclass("OutOfMemoryError", "OUT_OF_MEMORY", MemoryError)
CudaUnavailableError = _subclass("CudaUnavailableError", "CUDA_UNAVAILABLE", RuntimeError)
LibraryNotFoundError = _subclass(
    "LibraryNotFoundError", "LIBRARY_NOT_FOUND", RuntimeError,
    "a run-time dependency of libfusekit (libnvrtc, the CUDA headers, ...) is missing. (Failing to find "
    "libfusekit itself is LibraryLoadError.)",
)
KernelCompileError = _subclass("KernelCompileError", "KERNEL_COMPILE", RuntimeError)
CudaError = _subclass("CudaError", "CUDA", RuntimeError)
AbiMismatchError = _subclass("AbiMismatchError", "ABI_MISMATCH", RuntimeError)
BufferTooSmallError = _subclass("BufferTooSmallError", "BUFFER_TOO_SMALL", ValueError)
UnsupportedError = _subclass("UnsupportedError", "UNSUPPORTED", RuntimeError)
InternalError = _subclass("InternalError", "INTERNAL", RuntimeError)
IoError = _subclass("IoError", "IO", OSError)
DtypeMismatchError = _subclass("DtypeMismatchError", "DTYPE_MISMATCH", TypeError)


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


# fk_scalar, fk_matpow_report, fk_memory_stats and the opaque handle types: from _abi
ctx_p = POINTER(fk_context)
stream_p = POINTER(fk_stream)
buffer_p = POINTER(fk_buffer)
event_p = POINTER(fk_event)
comm_p = POINTER(fk_comm)

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
