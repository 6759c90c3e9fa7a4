"""Streams and events: :class:`Stream` (owned, or a borrowed ``CUstream``), the
cached wrappers of raw streams, :func:`resolve_stream`, the stream an op runs on
(explicit, else torch's current stream on CUDA), and :class:`Event` with
:func:`stream_wait_event`, which order work between streams."""

from __future__ import annotations

import threading
from ctypes import byref, c_float, c_int32, c_void_p

from . import _lib
from ._context import Context, _ctx_arg, default_context
from ._dtype import _torch
from ._handle import _Handle, _readonly
from ._lib import ERROR_DEVICE_MISMATCH, ERROR_INVALID_ARGUMENT, lib, raise_error


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

    owned = _readonly("_owned")
    context = _readonly("_context")

    @property
    def cuda_stream(self) -> int:
        """The raw ``CUstream`` (0 for the legacy default stream and on the CPU)."""
        out = c_void_p()
        lib().fk_stream_handle(self.handle, byref(out))
        return int(out.value or 0)

    def synchronize(self) -> None:
        """Blocks until all queued work has finished (kernel faults surface here)."""
        lib().fk_stream_synchronize(self.handle)

    def wait_event(self, ev: "Event") -> None:
        """Makes work queued on this stream after this call wait for ``ev``."""
        stream_wait_event(self, ev)

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
# Events
# ---------------------------------------------------------------------------


class Event(_Handle):
    """An event on a context's device (a timing CUDA event; a host timestamp on
    the CPU)::

        start, end = fusekit.Event("cuda"), fusekit.Event("cuda")
        start.record(); fusekit.relu(x, out=x); end.record()
        ms = start.elapsed_ms(end)

    ``record()`` without a stream uses the stream ops use by default (torch's
    current stream on CUDA when torch is imported). Release with :meth:`close`, a
    ``with`` block, or garbage collection.
    """

    _where = "fusekit.Event"
    _noun = "event"

    def __init__(self, ctx=None):
        self._context = _ctx_arg(ctx)
        L = lib()
        h = _lib.event_p()
        L.fk_event_create(self._context.handle, byref(h))
        self._handle = h
        self._destroy = L.fk_event_destroy

    context = _readonly("_context")
    device = _readonly("_context.device")

    def record(self, stream=None) -> "Event":
        """Records the event on ``stream`` (a fusekit Stream, torch stream or raw
        int; default as for ops). Returns ``self``."""
        s = resolve_stream(self._context, stream, "fusekit.Event.record")
        lib().fk_event_record(self.handle, _handle_of(s))
        return self

    def synchronize(self) -> None:
        """Blocks until the event completes."""
        lib().fk_event_synchronize(self.handle)

    def query(self) -> bool:
        """True when the event has completed (or was never recorded); never blocks."""
        done = c_int32(0)
        lib().fk_event_query(self.handle, byref(done))
        return bool(done.value)

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (blocks until ``end`` completes).
        InvalidArgumentError if either was never recorded."""
        Event._arg(end, "fusekit.Event.elapsed_ms", "end")
        ms = c_float(0.0)
        lib().fk_event_elapsed_ms(self.handle, end.handle, byref(ms))
        return float(ms.value)

    elapsed_time = elapsed_ms  # torch.cuda.Event's name

    def wait(self, stream=None) -> None:
        """Makes ``stream`` (default as for ops) wait for this event."""
        stream_wait_event(stream, self)

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<fusekit.Event {self._context.device}{state}>"


def _event_arg(ev, where: str) -> Event:
    return Event._arg(ev, where, "event")


def stream_wait_event(stream, ev: Event) -> None:
    """Makes work queued on ``stream`` after this call wait for ``ev`` without
    blocking the host (``fk_stream_wait_event``). ``stream``: a fusekit Stream, a
    torch stream or raw int on the event's device, or None (the stream ops use by
    default on the event's device)."""
    where = "fusekit.stream_wait_event"
    ev = _event_arg(ev, where)
    s = resolve_stream(ev.context, stream, where)
    lib().fk_stream_wait_event(_handle_of(s), ev.handle)
