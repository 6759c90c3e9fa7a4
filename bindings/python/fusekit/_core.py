"""Context, Stream and Buffer, default contexts and streams, and the adaptation of
the caller's arrays (numpy, torch, DLPack producers, fusekit Buffers) to buffers.

:class:`Invocation` is what op modules use: it turns the caller's inputs into
buffers, allocates the output in the caller's kind of array, picks the stream and
cleans up the temporary handles. An op function is then a few lines (see
``fusekit/ops/elementwise.py``).
"""

from __future__ import annotations

import enum
import numbers
import sys
import threading
from collections import namedtuple
from ctypes import byref, c_int32, c_int64, c_uint64, c_void_p

import numpy as np

from . import _dlpack as dl
from . import _lib
from ._lib import (
    ERROR_DEVICE_MISMATCH,
    ERROR_INVALID_ARGUMENT,
    ERROR_SHAPE_MISMATCH,
    ERROR_UNSUPPORTED_DTYPE,
    MAX_DIMS,
    lib,
    raise_error,
)

__all__ = [
    "DType",
    "Context",
    "Stream",
    "Buffer",
    "MemoryInfo",
    "default_context",
    "as_buffer",
    "from_dlpack",
    "Invocation",
]

# ---------------------------------------------------------------------------
# Element types
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Devices and contexts
# ---------------------------------------------------------------------------

MemoryInfo = namedtuple("MemoryInfo", ["free", "total"])


def _parse_device(device, ordinal=None) -> tuple[int, int]:
    """"cpu", "cuda", "cuda:N", "auto", a torch.device or an int (CUDA ordinal)
    -> (FK_DEVICE_*, ordinal)."""
    if device is None:
        device = "auto"
    t = _torch()
    if t is not None and isinstance(device, t.device):
        device = str(device)
    if isinstance(device, int) and not isinstance(device, bool):
        return _lib.DEVICE_CUDA, int(device)
    if not isinstance(device, str):
        raise_error(ERROR_INVALID_ARGUMENT, "fusekit.Context", f"device must be a string, got {device!r}")
    s = device.strip().lower()
    kind_s, _, ord_s = s.partition(":")
    kinds = {"cpu": _lib.DEVICE_CPU, "cuda": _lib.DEVICE_CUDA, "gpu": _lib.DEVICE_CUDA, "auto": _lib.DEVICE_AUTO}
    if kind_s not in kinds:
        raise_error(
            ERROR_INVALID_ARGUMENT,
            "fusekit.Context",
            f"device {device!r} is not 'cpu', 'cuda', 'cuda:N' or 'auto'",
        )
    kind = kinds[kind_s]
    if ord_s:
        try:
            o = int(ord_s)
        except ValueError:
            raise_error(ERROR_INVALID_ARGUMENT, "fusekit.Context", f"device {device!r} has a bad ordinal")
        if ordinal is not None and int(ordinal) != o:
            raise_error(
                ERROR_INVALID_ARGUMENT,
                "fusekit.Context",
                f"device {device!r} disagrees with ordinal={ordinal}",
            )
        if kind == _lib.DEVICE_CPU and o != 0:
            raise_error(ERROR_INVALID_ARGUMENT, "fusekit.Context", f"device {device!r}: the CPU has ordinal 0")
        return kind, o
    return kind, int(ordinal or 0)


def _device_str(kind: int, ordinal: int) -> str:
    if kind == _lib.DEVICE_CUDA_HOST:
        return f"cuda_host:{ordinal}"  # pinned host memory of a CUDA context
    return "cpu" if kind == _lib.DEVICE_CPU else f"cuda:{ordinal}"


class _Handle:
    """Owns one C handle: ``handle`` (raises once closed), ``closed``, an idempotent
    ``close`` (destroys the handle, then drops what ``_after_close`` releases), a
    context manager, and release on garbage collection. Subclasses set ``_handle``
    and ``_destroy`` and name themselves in ``_where`` / ``_noun``."""

    _handle = None
    _where = "fusekit"
    _noun = "handle"

    @property
    def handle(self):
        """The C handle (raises once closed)."""
        h = self._handle
        if h is None:
            raise_error(ERROR_INVALID_ARGUMENT, self._where, f"the {self._noun} is closed")
        return h

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Releases the handle (idempotent)."""
        h, self._handle = self._handle, None
        if h is not None:
            self._destroy(h)
        self._after_close()

    def _after_close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Context(_Handle):
    """A device context: ``Context("cpu")``, ``Context("cuda")``, ``Context("cuda:1")``
    or ``Context("auto")`` (CUDA when a usable GPU is present, else the CPU).

    Release with :meth:`close` or a ``with`` block (also done on garbage
    collection). Streams and buffers made from it stay valid after it is closed.
    """

    _where = "fusekit.Context"
    _noun = "context"

    def __init__(self, device="auto", ordinal: int | None = None):
        kind, o = _parse_device(device, ordinal)
        L = lib()
        h = _lib.ctx_p()
        L.fk_context_create(_lib.ABI_VERSION, kind, o, byref(h))
        self._handle = h
        self._destroy = L.fk_context_destroy
        k, oo = c_int32(0), c_int32(0)
        L.fk_context_device(h, byref(k), byref(oo))
        self._kind, self._ordinal = int(k.value), int(oo.value)
        self._default = False  # one of default_context's (set there)

    # -- handle management
    def _kind_ordinal(self):
        return self._kind, self._ordinal


    # -- queries
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return _device_str(self._kind, self._ordinal)

    @property
    def is_cuda(self) -> bool:
        return self._kind == _lib.DEVICE_CUDA

    @property
    def kind(self) -> int:
        """``FK_DEVICE_CPU`` (1) or ``FK_DEVICE_CUDA`` (2)."""
        return self._kind

    @property
    def ordinal(self) -> int:
        return self._ordinal

    @property
    def name(self) -> str:
        """The device's name (e.g. ``"NVIDIA H100 80GB HBM3"``, or a CPU description)."""
        return _lib.read_string(lib().fk_context_name, self.handle)

    @property
    def compute_capability(self) -> tuple[int, int]:
        """``(major, minor)``; ``(0, 0)`` on the CPU."""
        a, b = c_int32(0), c_int32(0)
        lib().fk_context_compute_capability(self.handle, byref(a), byref(b))
        return int(a.value), int(b.value)

    def memory(self) -> MemoryInfo:
        """Free and total memory of the device in bytes (host memory on the CPU)."""
        f, t = c_uint64(0), c_uint64(0)
        lib().fk_context_memory(self.handle, byref(f), byref(t))
        return MemoryInfo(int(f.value), int(t.value))

    def warmup(self) -> None:
        """Compiles (or loads from the kernel cache) every kernel module now. No-op on the CPU."""
        lib().fk_context_warmup(self.handle)

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<fusekit.Context {self.device}{state}>"


_defaults: dict[tuple[int, int], Context] = {}
_defaults_lock = threading.RLock()


def default_context(device="auto") -> Context:
    """The module-level context of a device, created on first use and shared.
    ``"auto"`` is CUDA device 0 when fusekit can use a GPU, else the CPU."""
    if isinstance(device, Context):
        return device
    kind, o = _parse_device(device)
    if kind == _lib.DEVICE_AUTO:
        kind = _lib.DEVICE_CUDA if _lib.device_count() > o else _lib.DEVICE_CPU
        if kind == _lib.DEVICE_CPU:
            o = 0
    key = (kind, o)
    ctx = _defaults.get(key)
    if ctx is None or ctx.closed:
        with _defaults_lock:
            ctx = _defaults.get(key)
            if ctx is None or ctx.closed:
                ctx = Context(_device_str(kind, o))
                ctx._default = True
                _defaults[key] = ctx
    return ctx


def _default_of(kind: int, o: int) -> Context:
    """``default_context`` of a parsed device: one dict lookup once it exists (the
    per-call path of the array adapters)."""
    ctx = _defaults.get((kind, o))
    if ctx is None or ctx._handle is None:
        ctx = default_context(_device_str(kind, o))
    return ctx


def _live_ctx(ctx: Context) -> Context:
    """``ctx``, or the default context of its device once ``ctx`` was closed (its
    buffers stay valid, and new ones for them go on the same device)."""
    return ctx if not ctx.closed else default_context(ctx.device)


def _ctx_arg(ctx, where="fusekit") -> Context:
    if ctx is None:
        return default_context("auto")
    if isinstance(ctx, Context):
        return ctx
    return default_context(ctx)


# ---------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------


class Stream(_Handle):
    """A fusekit stream.

    ``Stream(ctx)`` creates an owned stream (a non-blocking CUDA stream; on the
    CPU a queue that runs each op within its call). ``Stream.wrap(ctx, handle)``
    borrows a caller's ``CUstream`` (an int, or an object with ``cuda_stream``
    such as ``torch.cuda.Stream``); fusekit never destroys it.
    """

    _where = "fusekit.Stream"
    _noun = "stream"

    def __init__(self, ctx=None, *, _handle=None, _owned=True, _keepalive=None):
        self._context = _ctx_arg(ctx)
        L = lib()
        if _handle is None:
            h = _lib.stream_p()
            L.fk_stream_create(self._context.handle, byref(h))
            _handle = h
        self._handle = _handle
        self._owned = _owned
        self._keepalive = _keepalive
        self._destroy = L.fk_stream_destroy

    @classmethod
    def wrap(cls, ctx, cuda_stream, keepalive=None) -> "Stream":
        """Borrows ``cuda_stream`` (int ``CUstream``/``cudaStream_t``, 0 or None for
        the legacy default stream, or an object with a ``cuda_stream``/``ptr``
        attribute, which is then kept alive by the wrapper)."""
        ctx = _ctx_arg(ctx)
        raw, ka = _raw_stream(cuda_stream)
        h = _lib.stream_p()
        lib().fk_stream_wrap(ctx.handle, c_void_p(raw or None), byref(h))
        return cls(ctx, _handle=h, _owned=False, _keepalive=keepalive if keepalive is not None else ka)

    @property
    def owned(self) -> bool:
        return self._owned

    @property
    def context(self) -> Context:
        return self._context

    @property
    def cuda_stream(self) -> int:
        """The raw ``CUstream`` (0 for the legacy default stream and on the CPU)."""
        out = c_void_p()
        lib().fk_stream_handle(self.handle, byref(out))
        return int(out.value or 0)

    def synchronize(self) -> None:
        """Blocks until all queued work has finished (kernel faults surface here)."""
        lib().fk_stream_synchronize(self.handle)

    def _after_close(self) -> None:
        self._keepalive = None

    def __repr__(self) -> str:
        kind = "owned" if self._owned else "borrowed"
        state = " closed" if self.closed else f" 0x{self.cuda_stream:x}"
        return f"<fusekit.Stream {kind} {self._context.device}{state}>"


def _raw_stream(s) -> tuple[int, object]:
    """(raw handle, object to keep alive) from an int, None, or a stream object."""
    if s is None:
        return 0, None
    if isinstance(s, int) and not isinstance(s, bool):
        return int(s), None
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(s, attr, None)
        if isinstance(v, int):
            return int(v), s
    raise_error(
        ERROR_INVALID_ARGUMENT,
        "fusekit.Stream",
        f"stream must be a fusekit.Stream, a raw CUstream (int) or a torch.cuda.Stream, got {type(s).__name__}",
    )


# Borrowed wrappers of raw streams, cached per (ordinal, handle) so that the
# per-op lookup of torch's current stream costs a dict lookup.
_wrapped: dict[tuple[int, int], Stream] = {}
_wrapped_lock = threading.Lock()


def _wrapped_stream(ctx: Context, raw: int, keepalive=None) -> Stream:
    key = (ctx.ordinal, raw)
    s = _wrapped.get(key)
    if s is None or s.closed:
        with _wrapped_lock:
            s = _wrapped.get(key)
            if s is None or s.closed:
                s = Stream.wrap(default_context(ctx.device), raw, keepalive=keepalive)
                _wrapped[key] = s
    return s


def resolve_stream(ctx: Context, stream, where: str = "fusekit") -> Stream | None:
    """The stream an op on ``ctx`` runs on.

    Explicit ``stream`` (a fusekit Stream, a torch stream or a raw int) wins. By
    default on CUDA: torch's current stream of the device when torch is imported
    (so fusekit orders with the caller's own kernels), else None (the library's
    default stream). On the CPU: None.
    """
    if isinstance(stream, Stream):
        return stream
    if stream is not None:
        if not ctx.is_cuda:
            raise_error(
                ERROR_DEVICE_MISMATCH,
                where,
                f"stream {stream!r} is a CUDA stream but the arguments are on {ctx.device}",
            )
        raw, ka = _raw_stream(stream)
        return _wrapped_stream(ctx, raw, ka)
    if not ctx.is_cuda:
        return None
    t = _torch()
    if t is not None:
        raw = _torch_current_stream(t, ctx.ordinal)
        if raw is not None:
            return _wrapped_stream(ctx, raw)
    return None


def _torch_current_stream(t, ordinal: int) -> int | None:
    """torch's current stream of CUDA device ``ordinal`` (None without CUDA in torch):
    once torch's CUDA state is initialised, one call into torch
    (``torch._C._cuda_getCurrentRawStream``, what torch.compile's generated code uses;
    ``torch.cuda.current_stream`` costs several microseconds more)."""
    fast = getattr(t._C, "_cuda_getCurrentRawStream", None)
    if fast is not None and t.cuda.is_initialized():
        return int(fast(ordinal))
    if not t.cuda.is_available():
        return None
    return int(t.cuda.current_stream(ordinal).cuda_stream)


def _stream_raw_of(s: Stream | None) -> int:
    return 0 if s is None else s.cuda_stream


def _handle_of(s: Stream | None):
    return None if s is None else s.handle


# ---------------------------------------------------------------------------
# Buffers
# ---------------------------------------------------------------------------


def _contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


def _is_contiguous(shape, strides):
    """Row-major dense (size-1 dims ignored; empty shapes are contiguous), as the library."""
    if 0 in shape:
        return True
    expected = 1
    for d, s in zip(reversed(shape), reversed(strides)):
        if d == 1:
            continue
        if s != expected:
            return False
        expected *= d
    return True


class Buffer(_Handle):
    """A fusekit buffer: owned device/host memory, or a zero-copy view of the
    caller's memory (numpy, torch, DLPack), which it keeps alive.

    Create with :meth:`empty`, :meth:`from_numpy`, :meth:`from_torch`,
    :meth:`from_dlpack`, :meth:`wrap` or :func:`fusekit.as_buffer`. Release with
    :meth:`close` or a ``with`` block (also done on garbage collection).
    """

    _where = "fusekit.Buffer"
    _noun = "buffer"
    _shared = False  # a `_temp_view` (closed by garbage collection only)

    def __init__(self, handle, ctx: Context, *, owner=None, stream: Stream | None = None, readonly=False, meta=None):
        # Internal: use the classmethods. ``meta`` = (dtype, shape, strides, data)
        # when the caller already knows them (wrap/empty: the hot path of every op
        # call), which saves seven ctypes round trips.
        L = lib()
        self._handle = handle
        self._destroy = L.fk_buffer_destroy
        self._context = ctx
        self._owner = owner  # the caller's object whose memory this views
        self._stream = stream  # allocation stream (kept alive for the free)
        self._last_stream = stream  # stream of the last write by fusekit
        self._readonly = bool(readonly)
        self._imported = False  # a DLPack import (the library owns the producer's tensor)
        if meta is not None:
            dt, shape, strides, data = meta
            self._dtype = dt
            self._shape = shape
            self._strides = strides if strides is not None else _contiguous_strides(shape)
            self._kind, self._ordinal = ctx._kind_ordinal()
            self._data = int(data or 0)
            self._contiguous = _is_contiguous(self._shape, self._strides)
            return
        d, n = c_int32(0), c_int32(0)
        L.fk_buffer_dtype(handle, byref(d))
        L.fk_buffer_ndim(handle, byref(n))
        nd = int(n.value)
        shp = (c_int64 * max(nd, 1))()
        st = (c_int64 * max(nd, 1))()
        L.fk_buffer_shape(handle, shp)
        L.fk_buffer_strides(handle, st)
        k, o = c_int32(0), c_int32(0)
        L.fk_buffer_device(handle, byref(k), byref(o))
        p = c_void_p()
        L.fk_buffer_data(handle, byref(p))
        c = c_int32(0)
        L.fk_buffer_is_contiguous(handle, byref(c))
        self._dtype = DType(int(d.value))
        self._shape = tuple(int(shp[i]) for i in range(nd))
        self._strides = tuple(int(st[i]) for i in range(nd))
        self._kind, self._ordinal = int(k.value), int(o.value)
        self._data = int(p.value or 0)
        self._contiguous = bool(c.value)

    # -- constructors
    @classmethod
    def empty(cls, ctx, shape, dtype, stream=None) -> "Buffer":
        """An uninitialised contiguous buffer on ``ctx`` (a Context or a device
        string). On CUDA the allocation is stream-ordered on ``stream`` (default:
        torch's current stream when torch is imported, else the default stream)."""
        ctx = _ctx_arg(ctx)
        dt = as_dtype(dtype, "fusekit.Buffer.empty")
        shape = _shape_tuple(shape, "fusekit.Buffer.empty")
        s = resolve_stream(ctx, stream, "fusekit.Buffer.empty")
        h = _lib.buffer_p()
        arr = (c_int64 * max(len(shape), 1))(*shape)
        lib().fk_buffer_create(ctx.handle, int(dt), len(shape), arr, _handle_of(s), byref(h))
        p = c_void_p()
        lib().fk_buffer_data(h, byref(p))
        return cls(h, ctx, stream=s, meta=(dt, shape, None, p.value))

    @classmethod
    def zeros(cls, ctx, shape, dtype, stream=None) -> "Buffer":
        """A buffer of zeros (host zeros copied in; bfloat16 needs torch)."""
        b = cls.empty(ctx, shape, dtype, stream)
        torch = _torch()
        if b.dtype.numpy is not None:
            b.copy_from(np.zeros(b.shape, dtype=b.dtype.numpy), stream=stream)
        elif torch is not None:
            b.copy_from(torch.zeros(b.shape, dtype=b.dtype.torch), stream=stream)
        else:
            b.close()
            raise_error(ERROR_UNSUPPORTED_DTYPE, "fusekit.Buffer.zeros", "bfloat16 host data needs torch")
        return b

    @classmethod
    def wrap(cls, ctx, data_ptr: int, shape, dtype, strides=None, owner=None, readonly=False) -> "Buffer":
        """Wraps caller memory by pointer (no copy). ``strides`` are in elements
        (None = contiguous). ``owner`` is kept alive as long as the buffer (and any
        DLPack export of it)."""
        ctx = _ctx_arg(ctx)
        where = "fusekit.Buffer.wrap"
        dt = as_dtype(dtype, where)
        shape = _shape_tuple(shape, where)
        n = len(shape)
        if strides is not None and 0 in shape:
            strides = None  # (as _view)
        if strides is not None:
            strides = tuple(int(s) for s in strides)
            if len(strides) != n:
                raise_error(ERROR_SHAPE_MISMATCH, where, f"strides {strides} do not match shape {shape}")
        return cls._view(ctx, int(data_ptr), shape, dt, strides, owner, readonly)

    @classmethod
    def _view(cls, ctx: Context, data_ptr: int, shape: tuple, dt: DType, strides, owner, readonly) -> "Buffer":
        """``wrap`` of checked arguments: ``shape`` and ``strides`` (or None) tuples of
        ints of one length (the per-call path of the array adapters)."""
        n = len(shape)
        if strides is not None and 0 in shape:
            # No element is addressed, so strides are meaningless; numpy >= 2 gives
            # empty arrays zero strides, which the library would take for a
            # self-overlapping output.
            strides = None
        st = None if strides is None else (c_int64 * max(n, 1))(*strides)
        h = _lib.buffer_p()
        lib().fk_buffer_wrap(ctx.handle, c_void_p(data_ptr or None), int(dt), n, (c_int64 * max(n, 1))(*shape), st,
                             byref(h))
        return cls(h, ctx, owner=owner, readonly=readonly, meta=(dt, shape, strides, data_ptr))

    @classmethod
    def from_numpy(
        cls, arr, ctx=None, *, name: str = "array", where: str = "fusekit.Buffer.from_numpy", _temp: bool = False
    ) -> "Buffer":
        """Zero-copy view of a numpy array (CPU context). Byte strides must be
        multiples of the item size. (``_temp``: a shared view for one op call, see
        ``_temp_view``.)"""
        if not isinstance(arr, np.ndarray):
            raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} must be a numpy.ndarray, got {type(arr).__name__}")
        ctx = _default_of(_lib.DEVICE_CPU, 0) if ctx is None else _ctx_arg(ctx)
        if ctx.is_cuda:
            raise_error(
                ERROR_DEVICE_MISMATCH,
                where,
                f"{name} is a numpy array in host memory but the context is {ctx.device}",
            )
        nd = arr.dtype
        if not nd.isnative:
            raise_error(
                ERROR_UNSUPPORTED_DTYPE,
                where,
                f"{name} has non-native byte order ({nd}); convert it with .astype({nd.newbyteorder('=')})",
            )
        dt = _FROM_NUMPY.get(nd)
        if dt is None:
            raise_error(
                ERROR_UNSUPPORTED_DTYPE,
                where,
                f"{name} has dtype {nd}, which fusekit does not support "
                f"(numpy arrays: float16, float32, float64, complex64, complex128; bfloat16 via torch)",
            )
        if arr.ndim > MAX_DIMS:
            raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} has {arr.ndim} dimensions; at most {MAX_DIMS}")
        isz = nd.itemsize
        if any(s % isz for s in arr.strides):
            raise_error(
                ERROR_INVALID_ARGUMENT,
                where,
                f"{name} has byte strides {arr.strides} that are not multiples of its item size "
                f"{isz} (e.g. a view of a structured or reinterpreted array); "
                "copy it with numpy.ascontiguousarray first",
            )
        strides = tuple(s // isz for s in arr.strides)
        if _temp and ctx._default:
            return _temp_view(ctx, arr.ctypes.data or 0, arr.shape, dt, strides)
        return cls._view(ctx, arr.ctypes.data or 0, arr.shape, dt, strides, arr, not arr.flags.writeable)

    @classmethod
    def from_torch(
        cls, t, ctx=None, *, name: str = "tensor", where: str = "fusekit.Buffer.from_torch", _temp: bool = False
    ) -> "Buffer":
        """Zero-copy view of a torch tensor on the CPU or a CUDA device (kept alive).
        A lazily conjugated or negated view (``t.conj()``) is resolved to a copy.
        (``_temp``: a shared view for one op call, see ``_temp_view``.)"""
        torch = _torch()
        if torch is None or not isinstance(t, torch.Tensor):
            raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} must be a torch.Tensor, got {type(t).__name__}")
        dev = t.device
        typ = dev.type
        if typ == "cuda":
            need = _default_of(_lib.DEVICE_CUDA, dev.index or 0) if ctx is None else _ctx_arg(ctx)
        elif typ == "cpu":
            need = _default_of(_lib.DEVICE_CPU, 0) if ctx is None else _ctx_arg(ctx)
        else:
            raise_error(ERROR_DEVICE_MISMATCH, where, f"{name} is on torch device {dev}, which fusekit cannot use")
        if t.layout != torch.strided:
            raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} has layout {t.layout}; only strided tensors")
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
            _temp = False  # the copy lives as long as the buffer
        dt = as_dtype(t.dtype, where, name)
        if _temp and need._default:
            return _temp_view(need, t.data_ptr(), tuple(t.shape), dt, t.stride())
        return cls._view(need, t.data_ptr(), tuple(t.shape), dt, t.stride(), t, False)

    @classmethod
    def from_array(cls, obj, ctx=None, stream=None) -> "Buffer":
        """Any supported array as a Buffer, zero-copy where possible (see
        :func:`fusekit.as_buffer`)."""
        return as_buffer(obj, ctx, where="fusekit.Buffer.from_array", stream=stream)

    @classmethod
    def from_dlpack(cls, obj, ctx=None, stream=None) -> "Buffer":
        """Zero-copy import of an object with ``__dlpack__`` (or of a DLPack capsule).

        Asks for a DLPack 1.x versioned capsule, hands its tensor to
        ``fk_buffer_from_dlpack`` (which calls the producer's deleter when the
        buffer and its exports are gone) and marks the capsule used. A producer
        that only makes legacy ``"dltensor"`` capsules is wrapped by pointer while
        the buffer keeps the capsule alive. On CUDA the producer is asked to order
        its work before ``stream`` (default: as for ops).
        """
        where = "fusekit.from_dlpack"
        if dl.is_capsule(obj):
            capsule = obj
            ctx0 = _ctx_arg(ctx) if ctx is not None else None
        else:
            if not hasattr(obj, "__dlpack__"):
                raise_error(ERROR_INVALID_ARGUMENT, where, f"{type(obj).__name__} has no __dlpack__")
            if ctx is None:
                dev_type, dev_id = (int(v) for v in obj.__dlpack_device__())
                ctx0 = _ctx_for_dlpack_device(dev_type, dev_id, where)
            else:
                ctx0 = _ctx_arg(ctx)
            kwargs = {"max_version": (1, 0)}
            if ctx0.is_cuda:
                s = resolve_stream(ctx0, stream, where)
                raw = _stream_raw_of(s)
                kwargs["stream"] = 1 if raw == 0 else raw  # 1 = legacy default per the spec
            try:
                capsule = obj.__dlpack__(**kwargs)
            except TypeError:
                # a producer predating DLPack 1.0 (no max_version keyword)
                kwargs.pop("max_version")
                capsule = obj.__dlpack__(**kwargs)
        name = dl.capsule_name(capsule)
        if name == b"dltensor_versioned":
            ptr = dl.take_versioned_pointer(capsule)
            m = dl.DLManagedTensorVersioned.from_address(ptr)
            if ctx0 is None:
                ctx0 = _ctx_for_dlpack_device(m.dl_tensor.device.device_type, m.dl_tensor.device.device_id, where)
            readonly = bool(m.flags & dl.FLAG_READ_ONLY)
            h = _lib.buffer_p()
            lib().fk_buffer_from_dlpack(ctx0.handle, c_void_p(ptr), byref(h))
            # fusekit now owns the tensor: tell the capsule's destructor so.
            dl.mark_versioned_used(capsule)
            b = cls(h, ctx0, readonly=readonly)
            b._imported = True
            return b
        if name == b"dltensor":
            ptr = dl.take_legacy_pointer(capsule)
            m = dl.DLManagedTensor.from_address(ptr)
            t = m.dl_tensor
            if ctx0 is None:
                ctx0 = _ctx_for_dlpack_device(t.device.device_type, t.device.device_id, where)
            dt = _FROM_DLPACK.get((int(t.dtype.code), int(t.dtype.bits)))
            if dt is None or t.dtype.lanes != 1:
                raise_error(
                    ERROR_UNSUPPORTED_DTYPE,
                    where,
                    f"DLPack dtype (code {t.dtype.code}, bits {t.dtype.bits}, lanes {t.dtype.lanes}) "
                    "is not a fusekit element type",
                )
            nd = int(t.ndim)
            shape = tuple(int(t.shape[i]) for i in range(nd))
            strides = tuple(int(t.strides[i]) for i in range(nd)) if (nd and t.strides) else None
            data = (int(t.data or 0) + int(t.byte_offset)) if (t.data or t.byte_offset) else 0
            # The capsule stays unconsumed and owned by the buffer; its destructor
            # calls the producer's deleter once the buffer lets go of it.
            return cls.wrap(ctx0, data, shape, dt, strides, owner=capsule)
        raise_error(
            ERROR_INVALID_ARGUMENT,
            where,
            f"expected a DLPack capsule named 'dltensor_versioned' or 'dltensor', got {name!r} "
            "(a capsule can be consumed only once)",
        )

    # -- handle management
    def _after_close(self) -> None:
        self._owner = None

    # -- properties
    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements."""
        return self._strides

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self._shape:
            n *= s
        return n

    numel = size

    @property
    def itemsize(self) -> int:
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        return self._contiguous

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return _device_str(self._kind, self._ordinal)

    @property
    def is_cuda(self) -> bool:
        return self._kind == _lib.DEVICE_CUDA

    @property
    def is_pinned(self) -> bool:
        """Page-locked host memory of a CUDA context (``fusekit.pinned_empty``;
        device ``"cuda_host:N"``): a copy endpoint, not an operand of ops."""
        return self._kind == _lib.DEVICE_CUDA_HOST

    @property
    def data_ptr(self) -> int:
        """Address of the first element (host or device)."""
        return self._data

    @property
    def context(self) -> Context:
        return self._context

    @property
    def readonly(self) -> bool:
        return self._readonly

    @property
    def owner(self):
        """The object whose memory this buffer views (None for owned memory)."""
        return self._owner

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d buffer")
        return self._shape[0]

    def __repr__(self) -> str:
        if self.closed:
            return "<fusekit.Buffer closed>"
        kind = "borrowed" if self._owner is not None or self._shared else ("dlpack" if self._imported else "owned")
        return f"<fusekit.Buffer {self._dtype.name}{list(self._shape)} {self.device} {kind}>"

    # -- copies
    def contiguous(self, stream=None) -> "Buffer":
        """Itself if contiguous, else a contiguous copy (``fk_copy``)."""
        if self._contiguous:
            return self
        s = resolve_stream(self._context, stream, "fusekit.Buffer.contiguous")
        out = Buffer.empty(_live_ctx(self._context), self._shape, self._dtype, s)
        lib().fk_copy(self.handle, out.handle, _handle_of(s))
        out._last_stream = s
        return out

    def to_numpy(self, stream=None) -> np.ndarray:
        """A numpy copy of the buffer (CPU or CUDA). Waits for the copy."""
        where = "fusekit.Buffer.to_numpy"
        nd = self._dtype.numpy
        if nd is None:
            raise_error(
                ERROR_UNSUPPORTED_DTYPE,
                where,
                "numpy has no bfloat16; use torch.from_dlpack(buffer) (then .float() or .cpu())",
            )
        s = resolve_stream(self._context, stream, where) if self.is_cuda else (
            stream if isinstance(stream, Stream) else None
        )
        src = self.contiguous(s)
        out = np.empty(self._shape, dtype=nd)
        try:
            if out.nbytes:
                lib().fk_buffer_copy_to_host(src.handle, c_void_p(out.ctypes.data), out.nbytes, _handle_of(s))
        finally:
            if src is not self:
                src.close()
        return out

    def numpy(self) -> np.ndarray:
        """Alias of :meth:`to_numpy`."""
        return self.to_numpy()

    def copy_from(self, src, stream=None) -> "Buffer":
        """Copies ``src`` into this buffer, broadcasting it to this shape: a numpy
        array (or anything ``numpy.asarray`` takes), a torch tensor, a Buffer or a
        DLPack producer. Host data is converted to this dtype; device data must
        have it already. Returns ``self``."""
        where = "fusekit.Buffer.copy_from"
        if self._readonly:
            raise_error(ERROR_INVALID_ARGUMENT, where, "the buffer is read-only")
        s = resolve_stream(self._context, stream, where) if self.is_cuda else (
            stream if isinstance(stream, Stream) else None
        )
        torch = _torch()
        if self.is_pinned and (isinstance(src, Buffer) or (torch is not None and isinstance(src, torch.Tensor))):
            # ops refuse pinned buffers: a buffer-to-buffer copy (same element count)
            b = as_buffer(src, name="src", where=where, stream=s)
            try:
                if b.is_cuda and s is None:
                    s = resolve_stream(b.context, stream, where)
                lib().fk_buffer_copy(self.handle, b.handle, _handle_of(s))
            finally:
                if b is not src:
                    b.close()
            self._last_stream = s
            return self
        same_device_obj = isinstance(src, Buffer) or (
            torch is not None and isinstance(src, torch.Tensor) and (src.device.type == "cuda") == self.is_cuda
        )
        if not same_device_obj and not isinstance(src, np.ndarray) and hasattr(src, "__dlpack_device__"):
            dev = tuple(int(v) for v in src.__dlpack_device__())
            same_device_obj = (dev[0] in (dl.KDL_CUDA, dl.KDL_CUDA_MANAGED)) == self.is_cuda
        if same_device_obj or (not self.is_cuda and torch is not None and isinstance(src, torch.Tensor)):
            if torch is not None and isinstance(src, torch.Tensor) and src.dtype != self._dtype.torch:
                src = src.to(self._dtype.torch)
            b = as_buffer(src, ctx=_live_ctx(self._context) if not isinstance(src, Buffer) else None, name="src", where=where, stream=s)
            try:
                lib().fk_copy(b.handle, self.handle, _handle_of(s))
            finally:
                if b is not src:
                    b.close()
            self._last_stream = s
            return self
        # host data -> this buffer
        if torch is not None and isinstance(src, torch.Tensor):
            host = src.detach().to("cpu", self._dtype.torch)
            host = host.broadcast_to(self._shape).contiguous()
            ptr, nbytes, keep = host.data_ptr(), host.numel() * host.element_size(), host
        else:
            nd = self._dtype.numpy
            if nd is None:
                raise_error(ERROR_UNSUPPORTED_DTYPE, where, "bfloat16 data must come from a torch tensor")
            try:
                arr = np.asarray(src, dtype=nd)
                arr = np.ascontiguousarray(np.broadcast_to(arr, self._shape))
            except ValueError as e:
                raise_error(ERROR_SHAPE_MISMATCH, where, f"src does not broadcast to {self._shape}: {e}")
            ptr, nbytes, keep = arr.ctypes.data, arr.nbytes, arr
        if not self.is_cuda and not self.is_pinned:
            tmp = Buffer.wrap(_live_ctx(self._context), ptr, self._shape, self._dtype, owner=keep)
            try:
                lib().fk_copy(tmp.handle, self.handle, _handle_of(s))
            finally:
                tmp.close()
        elif self._contiguous:
            if nbytes:
                lib().fk_buffer_copy_from_host(self.handle, c_void_p(ptr), nbytes, _handle_of(s))
        else:
            tmp = Buffer.empty(_live_ctx(self._context), self._shape, self._dtype, s)
            try:
                if nbytes:
                    lib().fk_buffer_copy_from_host(tmp.handle, c_void_p(ptr), nbytes, _handle_of(s))
                lib().fk_copy(tmp.handle, self.handle, _handle_of(s))
            finally:
                tmp.close()
        self._last_stream = s
        return self

    # -- DLPack export
    def __dlpack_device__(self) -> tuple[int, int]:
        if self.is_pinned:
            return (dl.KDL_CUDA_HOST, 0)
        return (dl.KDL_CUDA, self._ordinal) if self.is_cuda else (dl.KDL_CPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Exports the buffer as a DLPack capsule (zero-copy unless ``copy=True``).

        ``max_version`` >= (1, 0) gives a ``"dltensor_versioned"`` capsule, else a
        legacy ``"dltensor"`` one. On CUDA, ``stream`` is the consumer's stream
        (None/1: legacy default, 2: per-thread default, -1: no ordering): work that
        fusekit queued on this buffer is ordered before it.
        """
        if dl_device is not None and tuple(int(v) for v in dl_device) != self.__dlpack_device__():
            raise BufferError(
                f"fusekit.Buffer.__dlpack__: cannot export a {self.device} buffer to DLPack device {tuple(dl_device)}"
            )
        if copy is True:
            src = Buffer.empty(_live_ctx(self._context), self._shape, self._dtype, self._last_stream)
            lib().fk_copy(self.handle, src.handle, _handle_of(self._last_stream))
            src._last_stream = self._last_stream
        else:
            src = self
        if self.is_cuda and stream != -1:
            # None means the legacy default stream (the array API's rule)
            src._order_before(1 if stream is None else int(stream))
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        if not versioned and self._readonly:
            raise BufferError(
                "fusekit.Buffer.__dlpack__: a read-only buffer cannot be exported as a legacy "
                "(DLPack 0.x) capsule, which cannot mark it read-only"
            )
        out = c_void_p()
        lib().fk_buffer_to_dlpack(src.handle, byref(out))
        addr = int(out.value)
        # The library keeps its own storage alive, but not the Python object whose
        # memory a wrapped buffer borrows: the export keeps that alive itself.
        keep = src._owner
        if src is not self:
            src.close()  # the export keeps the copy's storage alive
        if versioned:
            return dl.make_versioned_capsule(addr, keep, dl.FLAG_READ_ONLY if src._readonly else 0)
        return dl.make_legacy_capsule(addr, keep)

    def _order_before(self, consumer: int) -> None:
        """Orders fusekit's last work on this buffer before the consumer's stream,
        with fusekit's own event (``fk_event_record`` on the producer stream,
        ``fk_stream_wait_event`` on the consumer's). torch's events recorded on a
        ``torch.cuda.ExternalStream`` of the producer's pointer did not order when
        that pointer was one of torch's own pool streams (7 of the first 9
        ``torch.cuda.Stream()`` of a fresh process on the H100 machine, 2026-11-26;
        ``bindings/python/tests/test_cuda.py`` repeats the case over fresh streams)."""
        raw_consumer = {1: 0, 2: 2}.get(consumer, consumer)
        producer = self._last_stream
        raw_producer = _stream_raw_of(producer)
        if raw_producer == raw_consumer:
            return
        from .runtime import Event

        ev = Event(self._context)
        try:
            ev.record(producer if producer is not None else _wrapped_stream(self._context, 0))
            ev.wait(_wrapped_stream(self._context, raw_consumer))
        finally:
            ev.close()


def _ctx_for_dlpack_device(dev_type: int, dev_id: int, where: str) -> Context:
    if dev_type in (dl.KDL_CPU, dl.KDL_CUDA_HOST):
        return default_context("cpu")
    if dev_type in (dl.KDL_CUDA, dl.KDL_CUDA_MANAGED):
        return default_context(f"cuda:{dev_id}")
    raise_error(
        ERROR_DEVICE_MISMATCH,
        where,
        f"DLPack device type {dev_type} (id {dev_id}) is neither the CPU nor CUDA",
    )


def _shape_tuple(shape, where: str) -> tuple[int, ...]:
    if isinstance(shape, numbers.Integral):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise_error(ERROR_INVALID_ARGUMENT, where, f"shape must be a sequence of ints, got {shape!r}")
    if len(shape) > MAX_DIMS:
        raise_error(ERROR_INVALID_ARGUMENT, where, f"shape {shape} has more than {MAX_DIMS} dimensions")
    return shape


def from_dlpack(obj, ctx=None, stream=None) -> Buffer:
    """Zero-copy import of a DLPack producer (see :meth:`Buffer.from_dlpack`)."""
    return Buffer.from_dlpack(obj, ctx, stream)


# Views that op calls made of the caller's numpy arrays and torch tensors on a
# default context, by all that defines one: (context, address, shape, strides,
# dtype). A borrowed view is nothing but those (the library keeps no other state per
# buffer; the Python-side read-only flag only guards Buffers given as outputs, which
# these never are: Invocation.output checks the array itself), so the view made for
# an earlier array with the same key serves any later one: an op call on arrays seen
# before makes no fk_buffer_wrap and no fk_buffer_destroy (bindings/python/README.md,
# "Host time per call"). A view holds no reference to the array (the call's caller
# does, for the length of the call). When the table is full its oldest quarter goes;
# a call still using a dropped view holds it (Invocation._views), and garbage
# collection destroys it after.
_VIEWS: dict = {}
_VIEWS_MAX = 256
_views_lock = threading.Lock()


def _temp_view(ctx: Context, ptr: int, shape: tuple, dt: DType, strides) -> Buffer:
    if 0 in shape:
        strides = None  # (as Buffer._view)
    key = (ctx, ptr, shape, strides, dt)
    b = _VIEWS.get(key)
    if b is not None and b._handle is not None:
        return b
    b = Buffer._view(ctx, ptr, shape, dt, strides, None, False)
    b._shared = True
    with _views_lock:
        if len(_VIEWS) >= _VIEWS_MAX:
            for k in list(_VIEWS)[: len(_VIEWS) - _VIEWS_MAX * 3 // 4]:
                _VIEWS.pop(k, None)
        _VIEWS[key] = b
    return b


# ---------------------------------------------------------------------------
# Adapting the caller's arrays
# ---------------------------------------------------------------------------

KIND_NUMPY = "numpy"
KIND_TORCH = "torch"
KIND_BUFFER = "buffer"


def array_kind(obj) -> str | None:
    if isinstance(obj, Buffer):
        return KIND_BUFFER
    if isinstance(obj, np.ndarray):
        return KIND_NUMPY
    if _is_torch_tensor(obj):
        return KIND_TORCH
    if hasattr(obj, "__dlpack__"):
        return KIND_BUFFER
    return None


def as_buffer(obj, ctx=None, *, name: str = "array", where: str = "fusekit.as_buffer", stream=None) -> Buffer:
    """The caller's array as a Buffer, without copying where possible: a Buffer is
    returned as is; numpy arrays and torch tensors are wrapped; other objects with
    ``__dlpack__`` are imported; anything else goes through ``numpy.asarray``."""
    if isinstance(obj, Buffer):
        if obj.closed:
            raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} is a closed fusekit.Buffer")
        return obj
    if isinstance(obj, np.ndarray):
        return Buffer.from_numpy(obj, ctx, name=name, where=where)
    if _is_torch_tensor(obj):
        return Buffer.from_torch(obj, ctx, name=name, where=where)
    if hasattr(obj, "__dlpack__"):
        return Buffer.from_dlpack(obj, ctx, stream)
    if isinstance(obj, (numbers.Number, np.generic)) and not isinstance(obj, np.ndarray):
        raise_error(
            ERROR_INVALID_ARGUMENT,
            where,
            f"{name} is a scalar ({obj!r}), not an array; use the scalar_* ops, or wrap it in an array",
        )
    try:
        arr = np.asarray(obj)
    except Exception as e:  # noqa: BLE001
        raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} ({type(obj).__name__}) is not an array: {e}")
    return Buffer.from_numpy(arr, ctx, name=name, where=where)


class Invocation:
    """One op call: adapts inputs, allocates or adapts the output, picks the stream,
    and closes the temporary handles on exit.

    ::

        with Invocation("fusekit.add", stream) as inv:
            A = inv.input(a, "a"); B = inv.input(b, "b")
            O = inv.output(out, "out", inv.broadcast(A, B), A.dtype)
            lib().fk_add(A.handle, B.handle, O.handle, inv.stream_handle)
            return inv.result()

    The result is the caller's kind of array: torch in -> torch out, else
    Buffer in -> Buffer out, else numpy. With ``out=`` given, ``out`` itself is
    returned.
    """

    def __init__(self, where: str, stream=None):
        self.where = where
        self._stream_arg = stream
        self._stream: Stream | None = None
        self._stream_resolved = False
        self._temps: list[Buffer] = []
        self._views: list[Buffer] = []  # shared views in use (kept, not closed: _temp_view)
        self._kinds: list[str] = []
        self._torch_ref = None  # first torch tensor seen (device and dtype for outputs)
        self._buffers: dict[str, Buffer] = {}
        self._torch_cuda: list = []
        self.ctx: Context | None = None
        self._result = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        temps, self._temps = self._temps, []
        self._views = []
        for b in temps:
            b.close()

    # -- streams
    @property
    def stream(self) -> Stream | None:
        if not self._stream_resolved:
            if self.ctx is None:
                raise_error(ERROR_INVALID_ARGUMENT, self.where, "no array argument given")
            self._stream = resolve_stream(self.ctx, self._stream_arg, self.where)
            self._stream_resolved = True
        return self._stream

    @property
    def stream_handle(self):
        return _handle_of(self.stream)

    # -- arguments
    def input(self, obj, name: str) -> Buffer:
        kind = array_kind(obj)
        if kind is None and obj is not None and not isinstance(obj, (numbers.Number, np.generic)):
            kind = KIND_NUMPY  # lists etc. go through numpy.asarray
        if kind is not None:
            self._kinds.append(kind)
        if kind == KIND_TORCH and self._torch_ref is None:
            self._torch_ref = obj
        if kind == KIND_TORCH:
            b = Buffer.from_torch(obj, name=name, where=self.where, _temp=True)
        elif kind == KIND_NUMPY and isinstance(obj, np.ndarray):
            b = Buffer.from_numpy(obj, name=name, where=self.where, _temp=True)
        else:
            stream = self._stream_arg
            if kind == KIND_BUFFER and not isinstance(obj, Buffer) and self.ctx is not None and self.ctx.is_cuda:
                stream = self.stream
            b = as_buffer(obj, name=name, where=self.where, stream=stream)
        if b._shared:
            self._views.append(b)
        elif b is not obj:
            self._temps.append(b)
        if kind == KIND_TORCH and obj.is_cuda:
            self._torch_cuda.append(obj)
        if self.ctx is None:
            self.ctx = b.context
        self._buffers[name] = b
        return b

    def broadcast(self, *bufs: Buffer, names: tuple[str, ...] | None = None) -> tuple[int, ...]:
        """The NumPy broadcast shape of the buffers (ShapeMismatchError if none)."""
        try:
            return tuple(np.broadcast_shapes(*(b.shape for b in bufs)))
        except ValueError:
            if names is None:
                names = tuple(n for b in bufs for n, bb in self._buffers.items() if bb is b)
            desc = " and ".join(f"{n} has shape {tuple(b.shape)}" for n, b in zip(names, bufs))
            raise_error(ERROR_SHAPE_MISMATCH, self.where, f"{desc}, which do not broadcast")

    def result_kind(self) -> str:
        if KIND_TORCH in self._kinds:
            return KIND_TORCH
        if KIND_BUFFER in self._kinds:
            return KIND_BUFFER
        return KIND_NUMPY

    def output(self, out, name: str, shape, dtype: DType) -> Buffer:
        """Adapts the caller's ``out`` (checked writable), or allocates one of
        ``shape`` and ``dtype`` in the caller's kind of array on the inputs' device."""
        where = self.where
        if out is not None:
            kind = array_kind(out)
            if kind is None:
                raise_error(
                    ERROR_INVALID_ARGUMENT,
                    where,
                    f"{name} must be a numpy array, a torch tensor or a fusekit.Buffer, got {type(out).__name__}",
                )
            if kind == KIND_NUMPY and not out.flags.writeable:
                raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} is a read-only numpy array")
            if kind == KIND_TORCH:
                if out.requires_grad:
                    raise_error(
                        ERROR_INVALID_ARGUMENT,
                        where,
                        f"{name} requires grad; fusekit's functions do not record autograd "
                        "(use the ops in fusekit.torch_ops, or pass out.detach())",
                    )
                if out.is_conj() or out.is_neg():
                    raise_error(
                        ERROR_INVALID_ARGUMENT,
                        where,
                        f"{name} is a lazily conjugated/negated view; call resolve_conj()/resolve_neg() first",
                    )
            if kind == KIND_BUFFER and isinstance(out, Buffer) and out.readonly:
                raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} is a read-only buffer")
            b = self.input(out, name)
            self._kinds.pop()  # out does not vote on the result kind
            self._result = out
            if kind == KIND_TORCH:
                self._torch_out = out
            self._out_buffer = b
            return b
        kind = self.result_kind()
        if self.ctx is None:
            raise_error(ERROR_INVALID_ARGUMENT, where, "no array argument given")
        if kind == KIND_TORCH:
            torch = _torch()
            ref = self._torch_ref
            t = torch.empty(tuple(shape), dtype=dtype.torch, device=ref.device)
            b = Buffer.from_torch(t, name=name, where=where, _temp=True)
            (self._views if b._shared else self._temps).append(b)
            if t.is_cuda:
                self._torch_cuda.append(t)
            self._result = t
        elif kind == KIND_BUFFER:
            b = Buffer.empty(_live_ctx(self.ctx), shape, dtype, self.stream)
            self._result = b
        else:
            nd = dtype.numpy
            if nd is None:
                raise_error(ERROR_UNSUPPORTED_DTYPE, where, f"numpy has no {dtype.name}")
            arr = np.empty(tuple(shape), dtype=nd)
            b = Buffer.from_numpy(arr, name=name, where=where, _temp=True)
            (self._views if b._shared else self._temps).append(b)
            self._result = arr
        self._out_buffer = b
        return b

    def result(self):
        """The output in the caller's kind; records stream use for torch CUDA tensors."""
        out = self._result
        if isinstance(out, Buffer):
            out._last_stream = self.stream
        t_out = getattr(self, "_torch_out", None)
        torch = _torch()
        if t_out is not None and torch is not None:
            inc = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)
            if inc is not None:
                inc(t_out)
        arg = self._stream_arg
        if self._torch_cuda and torch is not None and isinstance(arg, torch.cuda.Stream):
            dev = self._torch_cuda[0].device
            if arg.cuda_stream != torch.cuda.current_stream(dev).cuda_stream:
                # Ran on a torch stream other than the current one: tell torch's
                # caching allocator, so it does not reuse the memory too early.
                # (Not done for fusekit-owned streams or raw handles: the allocator
                # records an event on the stream when the tensor is freed, and such
                # a stream may be destroyed by then. With those, keep the tensors
                # alive until the stream has finished, as for any stream torch
                # does not manage.)
                for t in self._torch_cuda:
                    t.record_stream(arg)
        return out
