"""Arrays of other libraries (CuPy, JAX, any DLPack producer): what fusekit knows
of the library an argument comes from, so that an op hands its results back as
that library's arrays.

:func:`library_of` gives a :class:`Foreign` per array type (cached): the
library's ``from_dlpack`` (CuPy's, JAX's, else the array API namespace's
``x.__array_namespace__().from_dlpack``, else the ``from_dlpack`` of the
package the type comes from; None when there is none: the result is then a
fusekit Buffer), its current CUDA stream where it has one (CuPy), its allocator
where fusekit knows one (CuPy's ``empty``: an out-of-place result is then the
library's own array, allocated by it, written in place by the op; see
``Invocation.output``), and two facts the ordering on CUDA depends on:

- ``ready_at_import``: the consumer takes an imported array as ready once the
  work queued on its stream *at the import* is done (JAX's PJRT records its
  definition event then). A result exported before fusekit's kernel is queued
  must then be finished before the call returns (the op's stream is
  synchronised). True for libraries fusekit does not know: it is the safe rule.
- ``immutable``: its arrays must not be written (JAX): an ``out=`` of that
  library is refused.

Nothing here imports a library: they are looked up in ``sys.modules`` (an array
of a library means the library is imported).
"""

from __future__ import annotations

import sys
import threading

from . import _dlpack as dl


class Foreign:
    """What fusekit knows of one array library (see the module documentation)."""

    __slots__ = ("name", "from_dlpack", "current_stream", "empty", "ready_at_import", "immutable", "pointer")

    def __init__(self, name, from_dlpack, *, current_stream=None, empty=None, ready_at_import=True,
                 immutable=False, pointer=None):
        self.name = name
        self.from_dlpack = from_dlpack  # buffer -> the library's array (None: results stay Buffers)
        self.current_stream = current_stream  # (CUDA ordinal) -> raw stream, or None
        # (context, shape, DType) -> a new array of the library on that device, or
        # None for a dtype it cannot hold; None: fusekit allocates results
        self.empty = empty
        self.ready_at_import = ready_at_import
        self.immutable = immutable
        self.pointer = pointer or dlpack_data_pointer  # array -> address of its first element

    def __repr__(self) -> str:
        return f"<fusekit foreign array library {self.name}>"


def dlpack_data_pointer(obj) -> int:
    """The address of ``obj``'s first element, read from a DLPack capsule it makes
    (left unconsumed: its destructor releases it)."""
    kwargs = {}
    dev = int(tuple(obj.__dlpack_device__())[0])
    if dev in (dl.KDL_CUDA, dl.KDL_CUDA_MANAGED):
        kwargs["stream"] = -1  # no ordering: only the address is read
    try:
        cap = obj.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:
        cap = obj.__dlpack__(**kwargs)
    if dl.capsule_name(cap) == b"dltensor_versioned":
        t = dl.DLManagedTensorVersioned.from_address(dl.take_versioned_pointer(cap)).dl_tensor
    else:
        t = dl.DLManagedTensor.from_address(dl.take_legacy_pointer(cap)).dl_tensor
    return int(t.data or 0) + int(t.byte_offset)


def _cupy(mod) -> Foreign:
    def current(ordinal):
        with mod.cuda.Device(ordinal):
            return int(mod.cuda.get_current_stream().ptr)

    def empty(ctx, shape, dtype):
        # numpy's dtype; bfloat16 is ml_dtypes' where that is loaded (a CuPy that
        # knows it takes it; an older one raises)
        nd = dtype.numpy if dtype.numpy is not None else getattr(sys.modules.get("ml_dtypes"), dtype.name, None)
        if nd is None:
            return None
        with mod.cuda.Device(ctx.ordinal):
            return mod.empty(tuple(shape), dtype=nd)

    return Foreign("cupy", mod.from_dlpack, current_stream=current, empty=empty, ready_at_import=False,
                   pointer=lambda a: int(a.data.ptr))


def _jax(mod) -> Foreign:
    return Foreign("jax", mod.dlpack.from_dlpack, ready_at_import=True, immutable=True,
                   pointer=lambda a: int(a.unsafe_buffer_pointer()))


_cache: dict = {}
_lock = threading.Lock()


def is_jax_tracer(obj) -> bool:
    """A traced jax value (inside ``jax.jit``, ``grad``, ``vmap``): no memory to import."""
    core = getattr(sys.modules.get("jax"), "core", None)
    tracer = getattr(core, "Tracer", None)
    return tracer is not None and isinstance(obj, tracer)


def library_of(obj) -> Foreign:
    """The :class:`Foreign` of ``obj``'s type (``obj`` has ``__dlpack__``)."""
    t = type(obj)
    f = _cache.get(t)
    if f is not None:
        return f
    top = (t.__module__ or "").split(".")[0]
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(obj, getattr(jax, "Array", ())):
        f = _jax(jax)
    elif top == "cupy" and "cupy" in sys.modules:
        f = _cupy(sys.modules["cupy"])
    else:
        fn = None
        ns = getattr(obj, "__array_namespace__", None)
        if ns is not None:
            try:
                fn = getattr(ns(), "from_dlpack", None)
            except Exception:  # noqa: BLE001 - a namespace that fails: try the package
                fn = None
        if fn is None:
            fn = getattr(sys.modules.get(top), "from_dlpack", None)
        f = Foreign(top or t.__name__, fn)
    with _lock:
        _cache[t] = f
    return f
