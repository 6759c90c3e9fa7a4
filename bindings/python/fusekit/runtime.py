"""The runtime API (docs/abi.md: memory, pinned buffers, events, communicators).

- Memory: :meth:`Context.memory_stats` (a :class:`MemoryStats`),
  :meth:`Context.set_release_threshold`, :meth:`Context.trim`.
- Pinned host memory: :func:`pinned_empty` / :meth:`Buffer.pinned` (page-locked
  host memory of a CUDA context; an ordinary host buffer on the CPU), and
  :func:`copy_buffer` (``fk_buffer_copy``: any pair of host, pinned and device
  buffers, peers included). Named so as not to clash with the elementwise
  :func:`fusekit.copy` op.
- :func:`device_can_access_peer`.
- :class:`Event` (``record``, ``synchronize``, ``query``, ``elapsed_ms``) and
  :meth:`Stream.wait_event` / :func:`stream_wait_event`.
- :class:`Comm` (NCCL communicators; a single-rank communicator on the CPU) and
  the collectives :func:`all_reduce`, :func:`broadcast`, :func:`all_gather`,
  :func:`reduce_scatter`, which take Buffers, numpy arrays, torch tensors or
  DLPack producers like the ops, and return ``recv`` (allocated in the caller's
  kind of array when not given).

The classes and their methods live where the classes do (``_context``,
``_stream``, ``_buffer``; :class:`Event` beside :class:`Stream`); this module adds
:class:`Comm`, the collectives, and a module-level function for every C entry
point, listed in :data:`ENTRY_POINTS`.
"""

from __future__ import annotations

import contextlib
import numbers
from ctypes import byref, c_int32, c_uint8

from . import _lib
from ._core import (
    Buffer,
    _Borrowed,
    _Handle,
    Context,
    Event,
    Invocation,
    MemoryStats,
    Stream,
    _ctx_arg,
    _event_arg,
    _handle_of,
    _readonly,
    as_buffer,
    default_context,
    resolve_stream,
    stream_wait_event,
)
from ._lib import (
    ERROR_INVALID_ARGUMENT,
    ERROR_SHAPE_MISMATCH,
    lib,
    raise_error,
)

__all__ = [
    "MemoryStats",
    "memory_stats",
    "set_release_threshold",
    "trim_memory",
    "pinned_empty",
    "copy_buffer",
    "device_can_access_peer",
    "Event",
    "event_create",
    "event_destroy",
    "event_record",
    "event_synchronize",
    "event_query",
    "event_elapsed_ms",
    "stream_wait_event",
    "Comm",
    "comm_unique_id",
    "comm_init_rank",
    "comm_init_all",
    "comm_destroy",
    "comm_rank",
    "comm_size",
    "comm_group",
    "comm_group_start",
    "comm_group_end",
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "COMM_ID_BYTES",
]

COMM_ID_BYTES = _lib.COMM_ID_BYTES


def _i32(v, where: str, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} must be an int, got {v!r}")
    v = int(v)
    if not -(1 << 31) <= v < (1 << 31):
        raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} = {v} does not fit in int32")
    return v


# ---------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------


def memory_stats(ctx=None) -> MemoryStats:
    """``fk_context_memory_stats`` of ``ctx`` (a Context or device string; default
    ``"auto"``): :meth:`Context.memory_stats`."""
    return _ctx_arg(ctx).memory_stats()


def set_release_threshold(nbytes, ctx=None) -> None:
    """``fk_context_set_release_threshold``: :meth:`Context.set_release_threshold`
    (None = keep everything; 0 = return all unused memory at a synchronisation)."""
    _ctx_arg(ctx).set_release_threshold(nbytes)


def trim_memory(keep_bytes=0, ctx=None) -> None:
    """``fk_context_trim``: :meth:`Context.trim`."""
    _ctx_arg(ctx).trim(keep_bytes)


# ---------------------------------------------------------------------------
# Pinned buffers and copies
# ---------------------------------------------------------------------------


def pinned_empty(shape, dtype, ctx=None) -> Buffer:
    """``fk_buffer_create_pinned``: page-locked host memory for ``ctx``'s GPU (an
    ordinary host buffer on a CPU context): :meth:`Buffer.pinned`."""
    return Buffer.pinned(ctx, shape, dtype)


def _copy_stream(dst: Buffer, src: Buffer, stream, where: str):
    if isinstance(stream, Stream):
        return stream
    for b in (dst, src):
        if b.is_cuda:
            return resolve_stream(b.context, stream, where)
    if stream is not None:
        for b in (dst, src):
            if b.is_pinned:
                return resolve_stream(b.context, stream, where)
    return resolve_stream(dst.context, stream, where)


def copy_buffer(dst, src, stream=None):
    """``dst[...] = src`` through ``fk_buffer_copy``: contiguous, same dtype and
    element count (shapes may differ), any pair of host, pinned and device memory
    (two GPUs included). Asynchronous on CUDA: queued on ``stream`` (default: torch's
    current stream of the device side when torch is imported, else the default
    stream). Returns ``dst``."""
    where = "fusekit.copy_buffer"
    if isinstance(dst, Buffer) and dst.readonly:
        raise_error(ERROR_INVALID_ARGUMENT, where, "dst is a read-only buffer")
    with _Borrowed(dst, name="dst", where=where) as D:
        if D.readonly:
            raise_error(ERROR_INVALID_ARGUMENT, where, "dst is read-only")
        with _Borrowed(src, name="src", where=where) as S:
            s = _copy_stream(D, S, stream, where)
            lib().fk_buffer_copy(D.handle, S.handle, _handle_of(s))
            if isinstance(dst, Buffer):
                dst._last_stream = s
    return dst


def device_can_access_peer(device, peer) -> bool:
    """Whether CUDA device ``device`` can access memory of ``peer`` directly (True
    for ``device == peer``). Ordinals are ints (or ``"cuda:N"``/Contexts).
    CudaUnavailableError without a GPU."""
    where = "fusekit.device_can_access_peer"

    def ordinal(d, name):
        if isinstance(d, Context):
            return d.ordinal
        if isinstance(d, str) and d.lower().startswith("cuda:"):
            try:
                return int(d[5:])
            except ValueError:
                pass
        return _i32(d, where, name)

    out = c_int32(0)
    lib().fk_device_can_access_peer(ordinal(device, "device"), ordinal(peer, "peer"), byref(out))
    return bool(out.value)


# ---------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------


def event_create(ctx=None) -> Event:
    """``fk_event_create``: ``Event(ctx)``."""
    return Event(ctx)


def event_destroy(ev: Event) -> None:
    """``fk_event_destroy``: ``ev.close()``."""
    _event_arg(ev, "fusekit.event_destroy").close()


def event_record(ev: Event, stream=None) -> Event:
    """``fk_event_record``: ``ev.record(stream)``."""
    return _event_arg(ev, "fusekit.event_record").record(stream)


def event_synchronize(ev: Event) -> None:
    """``fk_event_synchronize``: ``ev.synchronize()``."""
    _event_arg(ev, "fusekit.event_synchronize").synchronize()


def event_query(ev: Event) -> bool:
    """``fk_event_query``: ``ev.query()``."""
    return _event_arg(ev, "fusekit.event_query").query()


def event_elapsed_ms(start: Event, end: Event) -> float:
    """``fk_event_elapsed_ms``: ``start.elapsed_ms(end)``."""
    return _event_arg(start, "fusekit.event_elapsed_ms").elapsed_ms(end)


# ---------------------------------------------------------------------------
# Communicators
# ---------------------------------------------------------------------------


def comm_unique_id() -> bytes:
    """A new communicator id (``FK_COMM_ID_BYTES`` bytes) for :meth:`Comm.init_rank`:
    pass the same bytes to every rank. Needs NCCL (LibraryNotFoundError without)."""
    buf = (c_uint8 * COMM_ID_BYTES)()
    lib().fk_comm_unique_id(buf)
    return bytes(buf)


class Comm(_Handle):
    """A communicator rank (NCCL on CUDA; a single-rank communicator on the CPU).

    ``Comm.init_all([ctx0, ctx1])`` makes all ranks of a clique in this process;
    ``Comm.init_rank(ctx, nranks, Comm.unique_id(), rank)`` makes one rank (per
    thread or process). Issue collectives of several ranks from one thread inside
    ``with fusekit.Comm.group():``. Release with :meth:`close` (after the
    collectives that use it have completed), a ``with`` block or garbage collection.
    """

    _where = "fusekit.Comm"
    _noun = "communicator"

    def __init__(self, handle, ctx: Context):
        # Internal: use init_rank / init_all.
        self._handle = handle
        self._context = ctx
        self._destroy = lib().fk_comm_destroy
        r, n = c_int32(0), c_int32(0)
        lib().fk_comm_rank(handle, byref(r))
        lib().fk_comm_size(handle, byref(n))
        self._rank, self._size = int(r.value), int(n.value)

    unique_id = staticmethod(comm_unique_id)

    @classmethod
    def init_rank(cls, ctx, nranks: int, uid: bytes, rank: int) -> "Comm":
        """Rank ``rank`` of ``nranks`` on ``ctx``'s device from ``uid`` (bytes of
        :meth:`unique_id`). On CUDA it blocks until all ranks joined (or until the
        enclosing :meth:`group` ends)."""
        where = "fusekit.Comm.init_rank"
        ctx = _ctx_arg(ctx)
        nranks = _i32(nranks, where, "nranks")
        rank = _i32(rank, where, "rank")
        try:
            raw = bytes(uid)
        except TypeError:
            raise_error(ERROR_INVALID_ARGUMENT, where, f"uid must be bytes, got {type(uid).__name__}")
        if len(raw) != COMM_ID_BYTES:
            raise_error(
                ERROR_INVALID_ARGUMENT, where, f"uid has {len(raw)} bytes; a communicator id has {COMM_ID_BYTES}"
            )
        idb = (c_uint8 * COMM_ID_BYTES).from_buffer_copy(raw)
        h = _lib.comm_p()
        lib().fk_comm_init_rank(ctx.handle, nranks, idb, rank, byref(h))
        return cls(h, ctx)

    @classmethod
    def init_all(cls, ctxs) -> list:
        """All ranks of a clique in this process: rank ``i`` on ``ctxs[i]`` (Contexts
        or device strings; CUDA contexts on distinct devices, or one CPU context)."""
        where = "fusekit.Comm.init_all"
        if isinstance(ctxs, (Context, str)):
            ctxs = [ctxs]
        cs = [c if isinstance(c, Context) else default_context(c) for c in ctxs]
        n = len(cs)
        if n < 1:
            raise_error(ERROR_INVALID_ARGUMENT, where, "ctxs is empty")
        arr = (_lib.ctx_p * n)(*[c.handle for c in cs])
        out = (_lib.comm_p * n)()
        lib().fk_comm_init_all(arr, n, out)
        comms = []
        try:
            for i in range(n):
                comms.append(cls(out[i], cs[i]))
        except BaseException:
            for c in comms:
                c.close()
            raise
        return comms

    @staticmethod
    @contextlib.contextmanager
    def group():
        """``with Comm.group():`` wraps the calls in ``fk_comm_group_start`` /
        ``fk_comm_group_end`` (collectives are queued, or initialisations complete,
        when the outermost group ends)."""
        lib().fk_comm_group_start()
        try:
            yield
        except BaseException:
            try:
                lib().fk_comm_group_end()
            except Exception:  # the body's error is the one to report
                pass
            raise
        lib().fk_comm_group_end()

    context = _readonly("_context")
    device = _readonly("_context.device")
    rank = _readonly("_rank")
    size = _readonly("_size")


    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<fusekit.Comm rank {self._rank}/{self._size} {self._context.device}{state}>"


def _comm_arg(comm, where: str) -> Comm:
    return Comm._arg(comm, where, "comm")


def comm_init_rank(ctx, nranks: int, uid: bytes, rank: int) -> Comm:
    """``fk_comm_init_rank``: :meth:`Comm.init_rank`."""
    return Comm.init_rank(ctx, nranks, uid, rank)


def comm_init_all(ctxs) -> list:
    """``fk_comm_init_all``: :meth:`Comm.init_all`."""
    return Comm.init_all(ctxs)


def comm_destroy(comm: Comm) -> None:
    """``fk_comm_destroy``: ``comm.close()``."""
    _comm_arg(comm, "fusekit.comm_destroy").close()


def comm_rank(comm: Comm) -> int:
    """``fk_comm_rank``: ``comm.rank``."""
    c = _comm_arg(comm, "fusekit.comm_rank")
    out = c_int32(0)
    lib().fk_comm_rank(c.handle, byref(out))
    return int(out.value)


def comm_size(comm: Comm) -> int:
    """``fk_comm_size``: ``comm.size``."""
    c = _comm_arg(comm, "fusekit.comm_size")
    out = c_int32(0)
    lib().fk_comm_size(c.handle, byref(out))
    return int(out.value)


comm_group = Comm.group


def comm_group_start() -> None:
    """``fk_comm_group_start`` (prefer ``with fusekit.comm_group():``)."""
    lib().fk_comm_group_start()


def comm_group_end() -> None:
    """``fk_comm_group_end``."""
    lib().fk_comm_group_end()


_REDUCE = {
    "sum": _lib.REDUCE_SUM,
    "prod": _lib.REDUCE_PROD,
    "product": _lib.REDUCE_PROD,
    "max": _lib.REDUCE_MAX,
    "min": _lib.REDUCE_MIN,
}


def _reduce_op(op, where: str) -> int:
    if isinstance(op, str):
        v = _REDUCE.get(op.lower())
        if v is None:
            raise_error(ERROR_INVALID_ARGUMENT, where, f"op {op!r} is not 'sum', 'prod', 'max' or 'min'")
        return v
    return _i32(op, where, "op")  # other ints: the library names them in its error


def _collective(where, comm, send, recv, out_shape, stream, call):
    """send -> recv through ``call(S, R, stream_handle)``; allocates recv of
    ``out_shape(send_buffer)`` in the caller's kind when it is None."""
    c = _comm_arg(comm, where)
    with Invocation(where, stream) as inv:
        S = inv.input(send, "send") if send is not None else None
        if recv is not None and recv is send:
            R = S  # in place: one handle for both
            inv.set_result(recv)
        else:
            if recv is None and S is None:
                raise_error(ERROR_INVALID_ARGUMENT, where, "recv is required when send is None")
            shape = out_shape(S) if S is not None else None
            R = inv.output(recv, "recv", shape, S.dtype if S is not None else None)
            if recv is not None and R.readonly:
                raise_error(ERROR_INVALID_ARGUMENT, where, "recv is read-only")
        call(c.handle, S.handle if S is not None else None, R.handle, inv.stream_handle)
        return inv.result()


def all_reduce(send, recv=None, op="sum", *, comm: Comm, stream=None):
    """Every rank's ``recv`` becomes the element-wise ``op`` (``"sum"``, ``"prod"``,
    ``"max"``, ``"min"``) over all ranks' ``send``; in place when ``recv is send``.
    Without ``recv`` a new array like ``send`` is returned."""
    where = "fusekit.all_reduce"
    o = _reduce_op(op, where)
    return _collective(
        where, comm, send, recv, lambda S: S.shape, stream, lambda c, s, r, st: lib().fk_all_reduce(c, s, r, o, st)
    )


def broadcast(send, recv=None, root: int = 0, *, comm: Comm, stream=None):
    """Every rank's ``recv`` becomes rank ``root``'s ``send`` (``send`` may be None
    on the other ranks, which must then pass ``recv``); in place when
    ``recv is send``."""
    where = "fusekit.broadcast"
    r = _i32(root, where, "root")
    return _collective(
        where, comm, send, recv, lambda S: S.shape, stream, lambda c, s, rr, st: lib().fk_broadcast(c, s, rr, r, st)
    )


def all_gather(send, recv=None, *, comm: Comm, stream=None):
    """Every rank's ``recv`` (``comm.size`` times ``send``'s elements) becomes the
    concatenation of all ranks' ``send`` in rank order. Without ``recv`` the result
    has shape ``(size * send.shape[0], *send.shape[1:])`` (``(size,)`` for 0-d)."""
    where = "fusekit.all_gather"
    c = _comm_arg(comm, where)

    def shape(S):
        if not S.shape:
            return (c.size,)
        return (c.size * S.shape[0],) + tuple(S.shape[1:])

    return _collective(where, c, send, recv, shape, stream, lambda h, s, r, st: lib().fk_all_gather(h, s, r, st))


def reduce_scatter(send, recv=None, op="sum", *, comm: Comm, stream=None):
    """``send`` holds ``comm.size`` times ``recv``'s elements; rank ``r``'s ``recv``
    becomes slice ``r`` of the element-wise ``op`` over all ranks' ``send``. Without
    ``recv`` the result has shape ``(send.shape[0] // size, *send.shape[1:])``."""
    where = "fusekit.reduce_scatter"
    c = _comm_arg(comm, where)
    o = _reduce_op(op, where)

    def shape(S):
        if not S.shape or S.shape[0] % c.size:
            raise_error(
                ERROR_SHAPE_MISMATCH,
                where,
                f"send has shape {tuple(S.shape)}, whose first dimension is not a multiple of "
                f"the {c.size} ranks; pass recv",
            )
        return (S.shape[0] // c.size,) + tuple(S.shape[1:])

    return _collective(
        where, c, send, recv, shape, stream, lambda h, s, r, st: lib().fk_reduce_scatter(h, s, r, o, st)
    )


# ---------------------------------------------------------------------------
# The entry-point table
# ---------------------------------------------------------------------------

#: C entry point -> public Python function (checked by tests/test_bindings_complete.py).
ENTRY_POINTS = {
    "fk_context_memory_stats": memory_stats,
    "fk_context_set_release_threshold": set_release_threshold,
    "fk_context_trim": trim_memory,
    "fk_buffer_create_pinned": pinned_empty,
    "fk_buffer_copy": copy_buffer,
    "fk_device_can_access_peer": device_can_access_peer,
    "fk_event_create": event_create,
    "fk_event_destroy": event_destroy,
    "fk_event_record": event_record,
    "fk_event_synchronize": event_synchronize,
    "fk_event_query": event_query,
    "fk_event_elapsed_ms": event_elapsed_ms,
    "fk_stream_wait_event": stream_wait_event,
    "fk_comm_unique_id": comm_unique_id,
    "fk_comm_init_rank": comm_init_rank,
    "fk_comm_init_all": comm_init_all,
    "fk_comm_destroy": comm_destroy,
    "fk_comm_rank": comm_rank,
    "fk_comm_size": comm_size,
    "fk_comm_group_start": comm_group_start,
    "fk_comm_group_end": comm_group_end,
    "fk_all_reduce": all_reduce,
    "fk_broadcast": broadcast,
    "fk_all_gather": all_gather,
    "fk_reduce_scatter": reduce_scatter,
}
