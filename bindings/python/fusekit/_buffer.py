"""Buffers: :class:`Buffer` (owned memory, or a zero-copy view of numpy arrays,
torch tensors and DLPack producers), its copies and DLPack export, :func:`as_buffer`
and :func:`from_dlpack`, and the table of views that op calls share
(``_temp_view``)."""

from __future__ import annotations

import numbers
import threading
from ctypes import byref, c_int32, c_int64, c_void_p

import numpy as np

from . import _dlpack as dl
from . import _lib
from ._context import Context, _ctx_arg, _default_of, _live_ctx, _Placed, default_context
from ._dtype import _FROM_DLPACK, _FROM_NUMPY, DType, _is_torch_tensor, _torch, as_dtype
from ._handle import _readonly
from ._lib import (
    ERROR_DEVICE_MISMATCH,
    ERROR_INVALID_ARGUMENT,
    ERROR_SHAPE_MISMATCH,
    ERROR_UNSUPPORTED_DTYPE,
    MAX_DIMS,
    lib,
    raise_error,
)
from ._stream import Event, Stream, _handle_of, _stream_raw_of, _wrapped_stream, resolve_stream


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


class Buffer(_Placed):
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
    def pinned(cls, ctx, shape, dtype) -> "Buffer":
        """An uninitialised contiguous buffer of page-locked host memory for ``ctx``'s
        GPU (``fk_buffer_create_pinned``; device ``"cuda_host:N"``); on a CPU context
        an ordinary host buffer. ``to_numpy()``, ``copy_from()``, ``numpy.from_dlpack``
        and :func:`fusekit.copy_buffer` work on it; ops refuse it. Free it
        (``close()``) only after the copies that use it have finished."""
        where = "fusekit.pinned_empty"
        ctx = _ctx_arg(ctx)
        dt = as_dtype(dtype, where)
        shape = _shape_tuple(shape, where)
        arr = (c_int64 * max(len(shape), 1))(*shape)
        h = _lib.buffer_p()
        lib().fk_buffer_create_pinned(ctx.handle, int(dt), len(shape), arr, byref(h))
        return cls(h, ctx)

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
    dtype = _readonly("_dtype")
    shape = _readonly("_shape")
    strides = _readonly("_strides", """Strides in elements.""")

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

    is_contiguous = _readonly("_contiguous")

    @property
    def is_pinned(self) -> bool:
        """Page-locked host memory of a CUDA context (``fusekit.pinned_empty``;
        device ``"cuda_host:N"``): a copy endpoint, not an operand of ops."""
        return self._kind == _lib.DEVICE_CUDA_HOST

    data_ptr = _readonly("_data", """Address of the first element (host or device).""")
    context = _readonly("_context")
    readonly = _readonly("_readonly")
    owner = _readonly("_owner", """The object whose memory this buffer views (None for owned memory).""")

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
    def _copy_stream(self, stream, where: str) -> Stream | None:
        """The stream of a copy to or from the host: resolved as for ops on CUDA; on
        the CPU a fusekit Stream given, else none."""
        if self.is_cuda:
            return resolve_stream(self._context, stream, where)
        return stream if isinstance(stream, Stream) else None

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
        s = self._copy_stream(stream, where)
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
        s = self._copy_stream(stream, where)
        torch = _torch()
        if self.is_pinned and (isinstance(src, Buffer) or (torch is not None and isinstance(src, torch.Tensor))):
            # ops refuse pinned buffers: a buffer-to-buffer copy (same element count)
            with _Borrowed(src, name="src", where=where, stream=s) as b:
                if b.is_cuda and s is None:
                    s = resolve_stream(b.context, stream, where)
                lib().fk_buffer_copy(self.handle, b.handle, _handle_of(s))
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
            ctx = _live_ctx(self._context) if not isinstance(src, Buffer) else None
            with _Borrowed(src, ctx, name="src", where=where, stream=s) as b:
                lib().fk_copy(b.handle, self.handle, _handle_of(s))
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


class _Borrowed:
    """``with _Borrowed(obj, ...) as b``: ``b`` is ``as_buffer(obj, ...)`` for the
    block; a view made for it is closed at the end (a Buffer given stays open)."""

    __slots__ = ("obj", "buf")

    def __init__(self, obj, *args, **kwargs):
        self.obj = obj
        self.buf = as_buffer(obj, *args, **kwargs)

    def __enter__(self) -> Buffer:
        return self.buf

    def __exit__(self, *exc) -> None:
        if self.buf is not self.obj:
            self.buf.close()


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
