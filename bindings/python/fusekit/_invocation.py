"""One op call: :class:`Invocation` adapts the caller's arrays to buffers, allocates
the output in the caller's kind of array (torch, another library's array through
DLPack, Buffer or numpy), picks the stream and closes the temporary handles. An op
function is then a few lines (see ``fusekit/ops/elementwise.py``)."""

from __future__ import annotations

import numbers

import numpy as np

from ._buffer import Buffer, _Borrowed, _ctx_for_dlpack_device, as_buffer
from ._context import Context, _live_ctx
from ._dtype import DType, _is_torch_tensor, _torch
from ._foreign import Foreign, is_jax_tracer, library_of
from ._lib import ERROR_INVALID_ARGUMENT, ERROR_SHAPE_MISMATCH, ERROR_UNSUPPORTED_DTYPE, lib, raise_error
from ._stream import Stream, _handle_of, _stream_raw_of, _wrapped_stream, resolve_stream


KIND_NUMPY = "numpy"
KIND_TORCH = "torch"
KIND_BUFFER = "buffer"
#: another library's array (CuPy, JAX, any object with ``__dlpack__``): imported
#: and handed back through DLPack
KIND_FOREIGN = "foreign"


def array_kind(obj) -> str | None:
    """How an op sees an argument: a Buffer, a numpy array, a torch tensor,
    another library's DLPack array, or None (anything else: lists and the like go
    through ``numpy.asarray``). DLPack is asked before anything numpy would do
    with the object: ``numpy.asarray`` of a CuPy array is no array of numbers."""
    if isinstance(obj, Buffer):
        return KIND_BUFFER
    if isinstance(obj, np.ndarray):
        return KIND_NUMPY
    if _is_torch_tensor(obj):
        return KIND_TORCH
    if hasattr(obj, "__dlpack__") or is_jax_tracer(obj):
        return KIND_FOREIGN
    return None


class Invocation:
    """One op call: adapts inputs, allocates or adapts the output, picks the stream,
    and closes the temporary handles on exit.

    ::

        with Invocation("fusekit.add", stream) as inv:
            A = inv.input(a, "a"); B = inv.input(b, "b")
            O = inv.output(out, "out", inv.broadcast(A, B), A.dtype)
            lib().fk_add(A.handle, B.handle, O.handle, inv.stream_handle)
            return inv.result()

    The result is the caller's kind of array, by the first argument of the
    highest rank: torch tensors, then other libraries' arrays (CuPy, JAX, any
    DLPack producer: the first one's library, which allocates the result itself
    where fusekit knows its allocator (CuPy), else receives the Buffer fusekit
    allocated through its ``from_dlpack``, zero copy), then Buffers, then numpy
    arrays. With ``out=`` given, ``out`` itself is returned (an ``out`` does not
    vote).

    Memory fusekit allocates is freed stream-ordered on the stream it was
    allocated on, possibly long after the call: :meth:`_empty` allocates only on
    a stream that lives that long, and no Buffer keeps a stream that may not
    (``_written``); see bindings/python/README.md, "CuPy, JAX and other DLPack
    libraries".
    :meth:`result` hands back the last output; an op with several outputs reads
    each one's array from :attr:`output_array` after its :meth:`output` call,
    and an op writing an input in place names it with :meth:`set_result`.
    """

    def __init__(self, where: str, stream=None):
        self.where = where
        self._stream_arg = stream
        self._stream: Stream | None = None
        self._stream_resolved = False
        # the op's stream is a library's current stream (CuPy's), which the library
        # destroys with its stream object: nothing fusekit keeps may use it
        self._stream_from_library = False
        # the op's stream outlives any memory allocated on it without the caller's
        # word: the default stream, torch's current one (torch never destroys its
        # streams), a stream fusekit owns (its memory keeps it)
        self._stream_lasting = True
        self._rehomed: list[Buffer] = []  # allocated on the default stream for a borrowed op stream
        self._temps: list[Buffer] = []
        self._views: list[Buffer] = []  # shared views in use (kept, not closed: _temp_view)
        self._kinds: list[str] = []
        self._torch_ref = None  # first torch tensor seen (device and dtype for outputs)
        self._buffers: dict[str, Buffer] = {}
        self._torch_cuda: list = []
        self._foreign: Foreign | None = None  # the first other library among the arguments
        self._exports: list = []  # (buffer, the library's array, Foreign): results handed out
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
            f = self._foreign
            raw = None
            if self._stream_arg is None and self.ctx.is_cuda and self._torch_ref is None and f is not None \
                    and f.current_stream is not None:
                raw = f.current_stream(self.ctx.ordinal)  # CuPy's current stream, as torch's for tensors
            if raw is not None:
                self._stream = _wrapped_stream(self.ctx, raw)
                self._stream_from_library = True
                self._stream_lasting = False
            else:
                arg = self._stream_arg
                self._stream = resolve_stream(self.ctx, arg, self.where)
                self._stream_lasting = arg is None or (isinstance(arg, Stream) and arg.owned)
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
        elif kind == KIND_FOREIGN:
            b = self._import(obj, name)
        else:
            b = as_buffer(obj, name=name, where=self.where, stream=self._stream_arg)
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

    def _import(self, obj, name: str) -> Buffer:
        """Another library's array, imported through DLPack (zero copy); on CUDA its
        library orders its work on it before the op's stream (DLPack's ``stream``)."""
        if is_jax_tracer(obj):
            raise_error(
                ERROR_INVALID_ARGUMENT,
                self.where,
                f"{name} is a traced jax value (inside jax.jit, grad or vmap), which has no memory to hand "
                f"to fusekit; use fusekit.jax.{self.where.rpartition('.')[2]} there (docs/jax.md)",
            )
        f = library_of(obj)
        if self._foreign is None:
            self._foreign = f
        dev_type, dev_id = (int(v) for v in obj.__dlpack_device__())
        ctx = _ctx_for_dlpack_device(dev_type, dev_id, self.where)
        if self.ctx is None:
            self.ctx = ctx
        stream = self.stream if ctx.is_cuda and ctx is self.ctx else None
        return Buffer.from_dlpack(obj, ctx, stream)

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
        if KIND_FOREIGN in self._kinds:
            return KIND_FOREIGN
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
                    f"{name} must be a numpy array, a torch tensor, a fusekit.Buffer or an array with __dlpack__, "
                    f"got {type(out).__name__}",
                )
            if kind == KIND_FOREIGN and not is_jax_tracer(out) and library_of(out).immutable:
                raise_error(
                    ERROR_INVALID_ARGUMENT,
                    where,
                    f"{name} is a {library_of(out).name} array, which cannot be written in place "
                    f"({library_of(out).name} arrays are immutable); call without {name}= to get a new one",
                )
            if kind == KIND_NUMPY and not out.flags.writeable:
                raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} is a read-only numpy array")
            if kind == KIND_TORCH:
                if out.requires_grad:
                    raise_error(
                        ERROR_INVALID_ARGUMENT,
                        where,
                        f"{name} requires grad; fusekit's functions do not record autograd "
                        "(use the ops in fusekit.torch, or pass out.detach())",
                    )
                if out.is_conj() or out.is_neg():
                    raise_error(
                        ERROR_INVALID_ARGUMENT,
                        where,
                        f"{name} is a lazily conjugated/negated view; call resolve_conj()/resolve_neg() first",
                    )
            if kind == KIND_BUFFER and isinstance(out, Buffer) and out.readonly:
                raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} is a read-only buffer")
            foreign = self._foreign
            b = self.input(out, name)
            self._kinds.pop()  # out does not vote on the result kind
            if kind == KIND_FOREIGN:
                self._foreign = foreign if foreign is not None else self._foreign
                if b.readonly:
                    raise_error(ERROR_INVALID_ARGUMENT, where,
                                f"{name} is read-only (its library exported it as read-only through DLPack)")
                self._exports.append((b, None, library_of(out)))
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
        elif kind == KIND_FOREIGN and self._foreign.empty is not None:
            # The caller's library allocates (CuPy): the result is its own array, its
            # memory freed by its own allocator, written in place by the op as an
            # out= (zero copy); nothing of fusekit outlives the call.
            f = self._foreign
            arr = f.empty(self.ctx, shape, dtype)
            if arr is None:
                raise_error(ERROR_UNSUPPORTED_DTYPE, where, f"{f.name} has no {dtype.name} arrays")
            return self.output(arr, name, shape, dtype)
        elif kind == KIND_BUFFER or (kind == KIND_FOREIGN and self._foreign.from_dlpack is None):
            b = self._empty(shape, dtype, handed_out=False)
            self._result = b
        elif kind == KIND_FOREIGN:
            # fusekit allocates, the caller's library takes it (zero copy) at once:
            # ops read each output's array right after this call. result() makes the
            # values the op writes later visible to that library (_finish_exports).
            b = self._empty(shape, dtype, handed_out=True)
            self._temps.append(b)  # the export keeps the memory; this handle goes at exit
            f = self._foreign
            arr = f.from_dlpack(b)
            self._exports.append((b, arr, f))
            self._result = arr
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

    def _empty(self, shape, dtype: DType, handed_out: bool) -> Buffer:
        """A buffer fusekit allocates for an output. Its memory may outlive the call
        and is freed on the stream it was allocated on, so that stream must live as
        long: the op's stream when it is lasting (``_stream_lasting``), or, for a
        Buffer result, when the caller named it (``stream=``: the caller's word,
        as in the C ABI). Otherwise (memory handed to another library, whose
        lifetime the caller does not control; a library's current stream) the
        buffer is allocated on the context's default stream, which lives as long
        as the context, and the op's stream waits for the allocation (an event);
        :meth:`result` orders the op before the default stream again."""
        s = self.stream
        ctx = _live_ctx(self.ctx)
        if s is None or self._stream_lasting or not (handed_out or self._stream_from_library):
            return Buffer.empty(ctx, shape, dtype, s)
        b = Buffer.empty(ctx, shape, dtype, _wrapped_stream(self.ctx, 0))
        b._order_before(s.cuda_stream)
        self._rehomed.append(b)
        return b

    def _written(self, b: Buffer, keep: bool) -> None:
        """The op wrote ``b``: its last stream is the op's when ``keep``; else the
        op is ordered before ``b``'s allocation stream (an event, now, while the
        op's stream surely lives), which becomes its last stream."""
        s = self.stream
        b._last_stream = s
        if not keep and s is not None:
            home = b._stream
            b._order_before(_stream_raw_of(home))
            b._last_stream = home

    def outputs(self, specs, dtype: DType, wanted, out):
        """The outputs of an op with several, some optional: for each ``(name,
        shape)`` of ``specs``, the caller's array from ``out`` (a tuple with one
        entry per spec, None allowed) or, where ``wanted``, a new one. Returns (the
        C handles, None for an output not wanted; the arrays in the caller's kind,
        None likewise)."""
        outs = tuple(out) if out is not None else (None,) * len(specs)
        if len(outs) != len(specs):
            raise ValueError(f"{self.where}: out must hold {len(specs)} entries (None for not wanted)")
        handles, arrays = [], []
        for (name, shape), want, o in zip(specs, wanted, outs):
            if not want and o is None:
                handles.append(None)
                arrays.append(None)
                continue
            b = self.output(o, name, shape, dtype)
            handles.append(b.handle)
            arrays.append(self.output_array)
        return handles, arrays

    @property
    def output_array(self):
        """The output that :meth:`output` adapted or allocated last, in the caller's
        kind (``out`` itself when given); what :meth:`result` returns unless
        :meth:`set_result` names another."""
        return self._result

    def set_result(self, obj) -> None:
        """Makes ``obj`` what :meth:`result` returns: an output that :meth:`output`
        does not make, such as an input written in place (a collective with
        ``recv is send``)."""
        self._result = obj

    def result(self):
        """The output in the caller's kind; records stream use for torch CUDA tensors
        and orders other libraries' results after the op."""
        out = self._result
        if isinstance(out, Buffer) and out not in self._rehomed:  # (Buffers compare by identity)
            self._written(out, keep=not self._stream_from_library)
        if self._exports:
            self._finish_exports()
        for b in self._rehomed:  # after _finish_exports: its copies read them on the op's stream
            self._written(b, keep=False)
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

    def _finish_exports(self) -> None:
        """After the op: other libraries' arrays hold its values. A library that
        copied at the import (it did not take fusekit's memory) gets the values
        copied in. On CUDA a library that orders by its current stream (CuPy) gets
        an event on it; one that took the arrays as ready at the import (JAX, and
        any library fusekit does not know) sees the op finished (the op's stream is
        synchronised) before the call returns."""
        exports, self._exports = self._exports, []
        stream = self.stream
        sync = False
        for b, arr, f in exports:
            if arr is not None and f.pointer(arr) != b.data_ptr:
                with _Borrowed(arr, name="result", where=self.where, stream=stream) as dst:
                    lib().fk_copy(b.handle, dst.handle, _handle_of(stream))
            if not b.is_cuda:
                continue
            if f.ready_at_import or f.current_stream is None:
                sync = True
                continue
            b._last_stream = stream
            b._order_before(f.current_stream(b.context.ordinal))
        if sync:
            (stream if stream is not None else _wrapped_stream(self.ctx, 0)).synchronize()
