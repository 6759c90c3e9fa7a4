"""The core objects of the package, gathered from the modules that define them:

- ``_dtype``: :class:`DType`, :func:`as_dtype` (and whether torch is imported)
- ``_handle``: ``_Handle``, the base of every object that owns a C handle
- ``_context``: :class:`Context`, :class:`MemoryInfo`, :class:`MemoryStats`,
  :func:`default_context`
- ``_stream``: :class:`Stream`, :func:`resolve_stream`, :class:`Event`,
  :func:`stream_wait_event`
- ``_buffer``: :class:`Buffer`, :func:`as_buffer`, :func:`from_dlpack`, and the
  views that op calls share (``_temp_view``)
- ``_invocation``: :class:`Invocation`, what op modules use for one call

``fusekit.X`` and ``fusekit._core.X`` name the same objects; the op modules, the
runtime API and the tests import them from here. A module's state (the view
table ``_VIEWS`` and its size ``_VIEWS_MAX``) is read and changed in the module
that holds it.
"""

from __future__ import annotations

# the imports are re-exports
# ruff: noqa: F401
from ._buffer import (
    Buffer,
    _Borrowed,
    _contiguous_strides,
    _ctx_for_dlpack_device,
    _is_contiguous,
    _shape_tuple,
    _temp_view,
    as_buffer,
    from_dlpack,
)
from ._context import (
    Context,
    MemoryInfo,
    MemoryStats,
    _ctx_arg,
    _default_of,
    _device_str,
    _live_ctx,
    _parse_device,
    default_context,
)
from ._dtype import DType, _is_torch_dtype, _is_torch_tensor, _torch, as_dtype
from ._handle import _Handle, _readonly
from ._invocation import KIND_BUFFER, KIND_NUMPY, KIND_TORCH, Invocation, array_kind
from ._stream import (
    Event,
    Stream,
    _event_arg,
    _handle_of,
    _raw_stream,
    _stream_raw_of,
    _torch_current_stream,
    _wrapped,
    _wrapped_stream,
    resolve_stream,
    stream_wait_event,
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
