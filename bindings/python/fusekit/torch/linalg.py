"""The linear algebra family on torch (``fusekit/csrc/linalg.cpp``): GEMM,
Kronecker products and the fused linear layer.

- The tensor route of the plain functions of ``fusekit.ops.linalg``:
  :func:`gemm` (``fusekit::gemm_``), :func:`kron` (``kron_out``),
  :func:`linear_forward` / :func:`linear_backward` (``linear_forward_out`` /
  ``linear_backward_out``, the C entry points one to one). ``gemm_chunked``
  (operands in host memory) stays on ctypes.
- The differentiable fused linear layer: ``fusekit::linear(x, w, b, act) -> (y,
  aux)`` (aux is the GELUs' pre-activation, empty otherwise) and
  ``fusekit::linear_backward(dy, x, w, saved, act, want=7)`` (``want`` bits: dx,
  dw, db; a gradient not wanted comes back empty), and the wrapper :func:`linear`::

      from fusekit.torch.linalg import linear
      y = linear(x, w, b, "gelu")         # act(x w^T + b): float16, bfloat16, float32
"""

import torch
from torch import Tensor

from ..ops.linalg import _HAS_AUX, FK_ACT_RELU, FK_GEMM_ALLOW_TF32, LINEAR_ACTIVATIONS, _act, _gemm_shape, _kron_shape
from ._register import d, eager_call, new, no_output, register, run

__all__ = ["linear"]


# --- the plain functions' ops ----------------------------------------------------

_gemm_ = register("gemm_", fake=no_output)
_kron_out = register("kron_out", fake=no_output)
_linear_forward_out = register("linear_forward_out", fake=no_output)
_linear_backward_out = register("linear_backward_out", fake=no_output)


def gemm(where: str, oa: int, ob: int, sa, a, b, sb, c, allow_tf32: bool):
    """``fusekit.gemm`` on tensors (``sa``, ``sb``: ``fk_scalar``s; ``c`` None: a new
    result, the caller checked ``beta == 0``)."""
    A, B = d(a), d(b)
    C = c if c is not None else new(_gemm_shape(tuple(A.shape), tuple(B.shape), oa, ob), A)
    flags = FK_GEMM_ALLOW_TF32 if allow_tf32 else 0
    run(where, _gemm_, (oa, ob, sa.re, sa.im, A, B, sb.re, sb.im, C, flags), (c,))
    return C


def kron(where: str, a, b, out):
    """``fusekit.kron`` on tensors."""
    A, B = d(a), d(b)
    O = out if out is not None else new(_kron_shape(tuple(A.shape), tuple(B.shape)), A)
    run(where, _kron_out, (A, B, O), (out,))
    return O


def linear_forward(where: str, x, w, b, act: int, y, aux, want_aux: bool):
    """``fusekit.linear_forward`` on tensors: ``y``, or ``(y, aux)``."""
    X, Wt = d(x), d(w)
    yshape = tuple(X.shape[:-1]) + (Wt.shape[0] if Wt.dim() == 2 else 0,)
    Y = y if y is not None else new(yshape, X)
    A = aux if aux is not None else (new(yshape, X) if want_aux else None)
    run(where, _linear_forward_out, (X, Wt, d(b), act, Y, A), (y, aux))
    return (Y, A) if A is not None else Y


def linear_backward(where: str, dy, x, w, act: int, saved, dx, dw, db):
    """``fusekit.linear_backward`` on tensors: ``(dx, dw, db)``, each of the three
    arguments True (allocate), a tensor to write, or False/None (not wanted)."""
    DY, X, Wt = d(dy), d(x), d(w)
    shapes = (tuple(X.shape), tuple(Wt.shape), (Wt.shape[0],) if Wt.dim() == 2 else (0,))
    outs = [None if o is None or o is False else (new(sh, DY) if o is True else o)
            for o, sh in zip((dx, dw, db), shapes)]
    given = tuple(o for o in (dx, dw, db) if o is not None and not isinstance(o, bool))
    run(where, _linear_backward_out, (DY, X, Wt, act, d(saved), *outs), given)
    return tuple(outs)


# --- fusekit::linear, fusekit::linear_backward (the fused linear layer) ------------


def _linear_fake(x, w, b, act):
    torch._check(x.dtype in (torch.float16, torch.bfloat16, torch.float32),
                 lambda: f"fusekit::linear takes float16, bfloat16 or float32, not {x.dtype}")
    torch._check(w.dim() == 2 and w.shape[1] == x.shape[-1],
                 lambda: f"fusekit::linear: w {tuple(w.shape)} does not match x {tuple(x.shape)}")
    shape = tuple(x.shape[:-1]) + (w.shape[0],)
    y = x.new_empty(shape)
    aux = x.new_empty(shape) if act in _HAS_AUX else x.new_empty((0,))
    return y, aux


def _linear_bwd_fake(dy, x, w, saved, act, want=7):
    return (x.new_empty(x.shape if want & 1 else (0,)), w.new_empty(w.shape if want & 2 else (0,)),
            dy.new_empty((w.shape[0],) if want & 4 else (0,)))


_linear_bwd = register("linear_backward", fake=_linear_bwd_fake)


def _linear_setup(ctx, inputs, output):
    x, w, b, act = inputs
    y, aux = output
    saved = y if act == FK_ACT_RELU else aux  # relu's backward reads y itself; none needs nothing
    ctx.act = act
    ctx.has_bias = b is not None
    ctx.save_for_backward(x, w, saved)


def _linear_backward(ctx, gy, _gsaved):
    if gy is None:  # only aux was used (it gets no gradient)
        return None, None, None, None
    x, w, saved = ctx.saved_tensors
    need = ctx.needs_input_grad
    want = (1 if need[0] else 0) | (2 if need[1] else 0) | (4 if ctx.has_bias and need[2] else 0)
    dx, dw, db = _linear_bwd(gy, x, w, saved, ctx.act, want)
    return (dx if want & 1 else None), (dw if want & 2 else None), (db if want & 4 else None), None


_linear = eager_call(
    register("linear", fake=_linear_fake, backward=_linear_backward, setup_context=_linear_setup),
    _linear_backward, _linear_setup, (0, 1, 2), materialize=False)


def linear(x: Tensor, w: Tensor, b: Tensor = None, act="relu") -> Tensor:
    """``act(x w^T + b)`` through ``torch.ops.fusekit.linear`` (differentiable;
    float16, bfloat16, float32). ``act``: ``"relu"``, ``"gelu"`` (erf),
    ``"gelu_tanh"``, ``"none"`` (or an ``FK_ACT_*`` integer)."""
    a = LINEAR_ACTIVATIONS.get(act) if isinstance(act, str) else None
    y, _ = _linear(x, w, b, _act(act) if a is None else a)
    return y
