"""Devices and contexts: device strings (``"cpu"``, ``"cuda:N"``, ``"auto"``),
:class:`Context` (with its memory statistics, :class:`MemoryStats`, and pool
controls), and the shared default context of each device
(:func:`default_context`)."""

from __future__ import annotations

import numbers
import threading
from collections import namedtuple
from ctypes import byref, c_int32, c_uint64, sizeof
from dataclasses import dataclass, fields

from . import _lib
from ._dtype import _torch
from ._handle import _Handle, _readonly
from ._lib import ERROR_INVALID_ARGUMENT, lib, raise_error


MemoryInfo = namedtuple("MemoryInfo", ["free", "total"])

_U64_MAX = (1 << 64) - 1


def _u64(v, where: str, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} must be an int number of bytes, got {v!r}")
    v = int(v)
    if not 0 <= v <= _U64_MAX:
        raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} = {v} is outside 0..2**64-1")
    return v


@dataclass(frozen=True)
class MemoryStats:
    """A context's memory statistics (``fk_memory_stats``), in bytes or counts.

    ``allocated_bytes``/``live_allocations`` count the context's live owned
    buffers (as requested; pinned ones apart in ``pinned_bytes``/
    ``pinned_allocations``); ``reserved_bytes`` is what the CUDA pool holds (in use
    or cached; equal to ``allocated_bytes`` on the CPU)."""

    allocated_bytes: int
    peak_allocated_bytes: int
    reserved_bytes: int
    peak_reserved_bytes: int
    pool_used_bytes: int
    live_allocations: int
    device_free_bytes: int
    device_total_bytes: int
    release_threshold_bytes: int
    pinned_bytes: int
    pinned_allocations: int


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


class _Placed(_Handle):
    """A handle on a device of its own, ``_kind`` and ``_ordinal`` (a Context, a
    Buffer)."""

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return _device_str(self._kind, self._ordinal)

    @property
    def is_cuda(self) -> bool:
        return self._kind == _lib.DEVICE_CUDA


class Context(_Placed):
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


    # -- queries (also device, is_cuda)
    kind = _readonly("_kind", """``FK_DEVICE_CPU`` (1) or ``FK_DEVICE_CUDA`` (2).""")
    ordinal = _readonly("_ordinal")

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

    # -- memory (docs/abi.md: memory)
    def memory_stats(self) -> MemoryStats:
        """Memory statistics of this context (``fk_context_memory_stats``)."""
        st = _lib.fk_memory_stats()
        st.size = sizeof(_lib.fk_memory_stats)
        lib().fk_context_memory_stats(self.handle, byref(st))
        return MemoryStats(**{f.name: int(getattr(st, f.name)) for f in fields(MemoryStats)})

    def set_release_threshold(self, nbytes) -> None:
        """Bytes the context's CUDA pool keeps reserved at a synchronisation point
        (None = keep everything, the initial setting; 0 = return all unused memory).
        Stored and reported only on the CPU."""
        n = _U64_MAX if nbytes is None else _u64(nbytes, "fusekit.set_release_threshold", "nbytes")
        lib().fk_context_set_release_threshold(self.handle, c_uint64(n))

    def trim(self, keep_bytes=0) -> None:
        """Returns unused pool memory to the device until at most ``keep_bytes`` stay
        reserved (``fk_context_trim``; synchronise first to release queued frees).
        No-op on the CPU."""
        lib().fk_context_trim(self.handle, c_uint64(_u64(keep_bytes, "fusekit.trim_memory", "keep_bytes")))

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
