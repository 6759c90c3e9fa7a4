"""Linear algebra (docs/ops.md section 2): one function per C entry point. On torch
tensors they run the compiled ops (``fusekit.torch.linalg``, which also holds the
differentiable fused linear layer, ``fusekit.torch.linalg.linear``).

Each function takes numpy arrays, torch tensors (CPU or CUDA), fusekit Buffers or
other DLPack producers and returns the caller's kind of array (torch in -> torch
out). Matrices are row-major ``[rows, cols]`` or ``[batch, rows, cols]`` with unit
column stride (contiguous, or a row stride >= cols); transposes go through
``op_a``/``op_b`` (``"N"``, ``"T"``, ``"C"`` or the FK_OP_* integers).

- :func:`gemm`: ``c = alpha op(a) op(b) + beta c``; every dtype (half types
  accumulate in f32; ``allow_tf32=True`` lets f32/complex64 use TF32).
- :func:`linear_forward` / :func:`linear_backward`: ``y = act(x w^T + b)`` and its
  gradients (float16, bfloat16, float32); ``act`` named as torch names it:
  ``"none"``, ``"relu"``, ``"gelu"`` (exact, erf: ``torch.nn.functional.gelu(z)``),
  ``"gelu_tanh"`` (``gelu(z, approximate="tanh")``, cuBLASLt's epilogue). The
  backward needs ``saved``: the output ``y`` for relu, the pre-activation ``aux``
  the forward returns for the GELUs.
- :func:`gemm_chunked`: the product in tiles under a device-memory budget, with
  operands in pinned host memory streamed to the GPU.
- :func:`kron`: batched Kronecker product.

Gradient checks: the fused linear layer exists in float16, bfloat16 and float32
only (no float64 kernel), so ``torch.autograd.gradcheck`` runs it on the CPU in
float32 with tolerances for float32 finite differences, and the backward is also
compared with torch's own autograd of the same expression in float64
(``bindings/python/tests/test_linalg_torch.py``).
"""

from __future__ import annotations

import ctypes

from .._core import Invocation, as_dtype
from .._lib import ERROR_INVALID_ARGUMENT, lib, raise_error, scalar
from .._route import plain as _plain  # torch tensors: the compiled ops
from .._route import route as _route  # _route.linalg: fusekit.torch.linalg


__all__ = ["gemm", "gemm_chunked", "linear_aux_size", "linear_forward", "linear_backward", "kron"]

FK_OP_N, FK_OP_T, FK_OP_C = 0, 1, 2
FK_ACT_NONE, FK_ACT_RELU, FK_ACT_GELU_TANH, FK_ACT_GELU_ERF = 0, 1, 2, 3
FK_GEMM_ALLOW_TF32 = 1

_OPS = {"N": FK_OP_N, "T": FK_OP_T, "C": FK_OP_C, "n": FK_OP_N, "t": FK_OP_T, "c": FK_OP_C}
#: ``act`` names, as torch names the activations ("gelu" is the exact erf form).
LINEAR_ACTIVATIONS = {"none": FK_ACT_NONE, "relu": FK_ACT_RELU, "gelu": FK_ACT_GELU_ERF,
                      "gelu_tanh": FK_ACT_GELU_TANH}
_ACTS = {**LINEAR_ACTIVATIONS, None: FK_ACT_NONE}
_HAS_AUX = (FK_ACT_GELU_TANH, FK_ACT_GELU_ERF)


def _op(v):
    # unknown values go to the library, which names them in its error
    return _OPS.get(v, v) if isinstance(v, str) else int(v)


def _act(v):
    if isinstance(v, str) or v is None:
        if v not in _ACTS:
            return -1  # the library reports "act = -1 is not a valid fk_activation"
        return _ACTS[v]
    return int(v)


def _dims(shape, op):
    """(batch, rows, cols) of op(X) for a stored shape."""
    batch = shape[0] if len(shape) == 3 else 1
    r, c = (shape[-2], shape[-1]) if len(shape) >= 2 else (None, None)
    return batch, (c, r) if op != FK_OP_N else (r, c)


def _gemm_shape(sa, sb, oa, ob):
    """The shape of ``op(a) op(b)`` for stored shapes ``sa``, ``sb``."""
    ba, (m, _) = _dims(sa, oa)
    bb, (_, n) = _dims(sb, ob)
    if m is None or n is None:
        return (0, 0)  # the library reports the rank error
    return (m, n) if len(sa) < 3 and len(sb) < 3 else (max(ba, bb), m, n)


def gemm(a, b, *, op_a="N", op_b="N", alpha=1.0, beta=0.0, c=None, allow_tf32=False, stream=None):
    """``c = alpha op(a) op(b) + beta c``. Without ``c`` a new ``[m, n]`` (or
    ``[batch, m, n]``) result is allocated and ``beta`` must be 0."""
    where = "fusekit.gemm"
    sa, sb = scalar(alpha, where, "alpha"), scalar(beta, where, "beta")
    oa, ob = _op(op_a), _op(op_b)
    if c is None and beta != 0:
        raise_error(ERROR_INVALID_ARGUMENT, where, "beta != 0 needs c")
    if stream is None and _plain(a, b, c):
        return _route.linalg.gemm(where, oa, ob, sa, a, b, sb, c, allow_tf32)
    with Invocation(where, stream) as inv:
        A = inv.input(a, "a")
        B = inv.input(b, "b")
        shape = _gemm_shape(tuple(A.shape), tuple(B.shape), oa, ob) if c is None else None
        C = inv.output(c, "c", shape, A.dtype)
        flags = FK_GEMM_ALLOW_TF32 if allow_tf32 else 0
        lib().fk_gemm(oa, ob, sa, A.handle, B.handle, sb, C.handle, flags, inv.stream_handle)
        return inv.result()


def gemm_chunked(a, b, c, *, device_budget_bytes, op_a="N", op_b="N", alpha=1.0, beta=0.0, allow_tf32=False,
                 stream=None):
    """``gemm`` in tiles whose device staging stays within ``device_budget_bytes``;
    ``a``, ``b``, ``c`` may be pinned host memory (e.g. ``tensor.pin_memory()``)."""
    where = "fusekit.gemm_chunked"
    sa, sb = scalar(alpha, where, "alpha"), scalar(beta, where, "beta")
    with Invocation(where, stream) as inv:
        A = inv.input(a, "a")
        B = inv.input(b, "b")
        C = inv.output(c, "c", None, A.dtype)
        flags = FK_GEMM_ALLOW_TF32 if allow_tf32 else 0
        lib().fk_gemm_chunked(_op(op_a), _op(op_b), sa, A.handle, B.handle, sb, C.handle,
                              int(device_budget_bytes), flags, inv.stream_handle)
        return inv.result()


def linear_aux_size(act, dtype, m: int, n: int) -> int:
    """Bytes of the aux tensor ``linear_forward`` returns for ``act`` (the GELUs'
    pre-activation, shaped like y; 0 for relu and none)."""
    out = ctypes.c_size_t()
    lib().fk_linear_aux_size(_act(act), int(as_dtype(dtype, "fusekit.linear_aux_size")), int(m), int(n), ctypes.byref(out))
    return out.value


def linear_forward(x, w, b=None, *, act="relu", y=None, aux=None, want_aux=False, stream=None):
    """``y = act(x w^T + b)``. With ``want_aux=True`` (a GELU) or ``aux`` given, also
    the pre-activation for the backward: returns ``(y, aux)``; else ``y``."""
    a = _act(act)
    if stream is None and _plain(x, w, b, y, aux):
        return _route.linalg.linear_forward("fusekit.linear_forward", x, w, b, a, y, aux, want_aux)
    with Invocation("fusekit.linear_forward", stream) as inv:
        X = inv.input(x, "x")
        W = inv.input(w, "w")
        Bb = inv.input(b, "b") if b is not None else None
        yshape = tuple(X.shape[:-1]) + (W.shape[0] if len(W.shape) == 2 else 0,)
        Y = inv.output(y, "y", yshape, X.dtype)
        y_res = inv.output_array
        A = None
        if aux is not None or want_aux:
            A = inv.output(aux, "aux", yshape, X.dtype)
        a_res = inv.output_array if A is not None else None
        lib().fk_linear_forward(X.handle, W.handle, Bb.handle if Bb else None, a, Y.handle,
                                A.handle if A else None, inv.stream_handle)
        inv.result()
        return (y_res, a_res) if A is not None else y_res


def linear_backward(dy, x, w, *, act="relu", saved=None, dx=True, dw=True, db=True, stream=None):
    """Gradients of ``linear_forward`` given ``dy``: returns ``(dx, dw, db)``. Each
    of ``dx``, ``dw``, ``db`` is ``True`` (allocate), an array to write, or
    ``False``/``None`` (not wanted: None is returned in its place). ``saved``: y for
    relu, aux for the GELUs, unused for none."""
    given = tuple(o for o in (dx, dw, db) if o is not None and not isinstance(o, bool))
    if stream is None and _plain(dy, x, w, saved, *given):
        return _route.linalg.linear_backward("fusekit.linear_backward", dy, x, w, _act(act), saved, dx, dw, db)
    with Invocation("fusekit.linear_backward", stream) as inv:
        DY = inv.input(dy, "dy")
        X = inv.input(x, "x")
        W = inv.input(w, "w")
        S = inv.input(saved, "saved") if saved is not None else None
        outs = []
        for arg, name, shape in ((dx, "dx", tuple(X.shape)), (dw, "dw", tuple(W.shape)),
                                 (db, "db", (W.shape[0],) if len(W.shape) == 2 else (0,))):
            if arg is None or arg is False:
                outs.append((None, None))
                continue
            O = inv.output(None if arg is True else arg, name, shape, DY.dtype)
            outs.append((O, inv.output_array))
        h = [o.handle if o is not None else None for o, _ in outs]
        lib().fk_linear_backward(DY.handle, X.handle, W.handle, _act(act), S.handle if S else None,
                                 h[0], h[1], h[2], inv.stream_handle)
        inv.result()
        return tuple(r for _, r in outs)


def _kron_shape(sa, sb):
    """The shape of ``kron(a, b)`` for shapes ``sa``, ``sb``."""
    if len(sa) in (2, 3) and len(sb) in (2, 3):
        ba, bb = (sa[0] if len(sa) == 3 else 1), (sb[0] if len(sb) == 3 else 1)
        shape = (sa[-2] * sb[-2], sa[-1] * sb[-1])
        if len(sa) == 3 or len(sb) == 3:
            shape = (max(ba, bb),) + shape
        return shape
    return (0, 0)  # the library reports the rank error


def kron(a, b, *, out=None, stream=None):
    """Batched Kronecker product: ``kron(a [m, n], b [p, q]) -> [m*p, n*q]``, or
    ``[batch, m*p, n*q]`` when either is 3-D (a batch of 1 broadcasts)."""
    if stream is None and _plain(a, b, out):
        return _route.linalg.kron("fusekit.kron", a, b, out)
    with Invocation("fusekit.kron", stream) as inv:
        A = inv.input(a, "a")
        B = inv.input(b, "b")
        O = inv.output(out, "out", _kron_shape(tuple(A.shape), tuple(B.shape)), A.dtype)
        lib().fk_kron(A.handle, B.handle, O.handle, inv.stream_handle)
        return inv.result()


#: C entry point -> Python wrapper (checked by tests/test_bindings_complete.py).
ENTRY_POINTS = {
    "fk_gemm": gemm,
    "fk_gemm_chunked": gemm_chunked,
    "fk_linear_aux_size": linear_aux_size,
    "fk_linear_forward": linear_forward,
    "fk_linear_backward": linear_backward,
    "fk_kron": kron,
}
