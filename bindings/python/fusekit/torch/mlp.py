"""The multi-layer perceptron family on torch (``fusekit/csrc/mlp.cpp``): the whole
network in one compiled op each way, behind :class:`fusekit.nn.FusedMLP`.

- ``fusekit::mlp(x, weights: Tensor[], biases: Tensor[], hidden_act, out_act,
  flags) -> (y, saved)``: ``fk_mlp_forward``; ``biases`` empty (no layer has one)
  or one per layer, an entry with no elements standing for a layer without (not a
  ``Tensor?[]``: ``register_autograd`` does not track the tensors of a list that
  holds None, so their gradients would be lost under ``torch.compile``); ``saved``
  (float32, what the backward reads: ReLU bit masks / GELU pre-activations and the hidden outputs,
  ``fk_mlp_saved_size`` bytes; 0 elements when nothing is needed) is not
  differentiable.
- ``fusekit::mlp_infer(x, weights, biases, hidden_act, out_act, flags) -> y``: the
  forward with nothing kept for a backward (``fk_mlp_forward`` without ``saved``),
  which :func:`mlp` runs eagerly when no gradient is wanted.
- ``fusekit::mlp_backward(dy, x, weights, saved, hidden_act, out_act, flags, want:
  int[]) -> (dx, dweights: Tensor[], dbiases: Tensor[])``: ``fk_mlp_backward``;
  ``want[0]`` for dx, ``want[1 + i]`` bits for layer i (1: weight, 2: bias); a
  gradient not wanted comes back empty and is not computed (nor are the layers
  below the lowest one wanted).

Why a custom op with tensor lists: PyTorch's stable ABI (torch >= 2.10) boxes
``Tensor[]``/``int[]`` as ``std::vector``, so one op call per
direction serves eager, ``torch.compile(fullgraph=True)`` (fake below, autograd
through ``torch.library.register_autograd``, which handles tensor lists) and CUDA
graph capture (the op runs on torch's current stream and allocates through
torch's caching allocator).

Eager, :func:`mlp` applies an ``autograd.Function`` over the flattened tensors (a
plain ``Function`` does not see tensors inside lists) with the same formula, and
skips autograd when no gradient is wanted; under ``torch.compile`` it calls the
registered op.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..ops.linalg import FK_GEMM_ALLOW_TF32, LINEAR_ACTIVATIONS, _act
from . import _ext
from ._register import _below_autograd, _fast_apply, _is_compiling, register

__all__ = ["mlp"]


def _saved_elems(x, weights, hidden_act, out_act) -> int:
    """float32 elements of ``saved`` (what csrc/mlp.cpp allocates), from the
    library's size on the tensors' backend."""
    from .. import _context
    from ..ops.mlp import mlp_saved_size

    widths = [x.shape[-1]] + [w.shape[0] for w in weights]
    rows = math.prod(x.shape[:-1])
    dev = x.device
    device = f"cuda:{dev.index or 0}" if dev.type == "cuda" else "cpu"
    try:
        ctx = _context.default_context(device)
    except Exception:  # fusekit built without CUDA: the layout is the same on both today
        ctx = _context.default_context("cpu")
    return -(-mlp_saved_size([int(w) for w in widths], int(rows), _fk_dtype(x.dtype), hidden_act, out_act,
                             device=ctx) // 4)


def _fk_dtype(dt):
    return {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}[dt]


def _mlp_fake(x, weights, biases, hidden_act, out_act, flags):
    torch._check(x.dtype in (torch.float16, torch.bfloat16, torch.float32),
                 lambda: f"fusekit::mlp takes float16, bfloat16 or float32, not {x.dtype}")
    torch._check(1 <= len(weights) <= 64, lambda: f"fusekit::mlp: n_layers = {len(weights)} is outside 1..=64")
    k = x.shape[-1]
    for i, w in enumerate(weights):
        torch._check(w.dim() == 2 and w.shape[1] == k,
                     lambda: f"fusekit::mlp: weights[{i}] {tuple(w.shape)} does not take {k} inputs")
        k = w.shape[0]
    y = x.new_empty(tuple(x.shape[:-1]) + (k,))
    saved = x.new_empty((_saved_elems(x, weights, hidden_act, out_act),), dtype=torch.float32)
    return y, saved


def _mlp_bwd_fake(dy, x, weights, saved, hidden_act, out_act, flags, want):
    dx = x.new_empty(x.shape if want[0] else (0,))
    dws = [w.new_empty(w.shape if want[i + 1] & 1 else (0,)) for i, w in enumerate(weights)]
    dbs = [dy.new_empty((w.shape[0],) if want[i + 1] & 2 else (0,)) for i, w in enumerate(weights)]
    return dx, dws, dbs


_mlp_bwd = register("mlp_backward", fake=_mlp_bwd_fake)


def _mlp_infer_fake(x, weights, biases, hidden_act, out_act, flags):
    return _mlp_fake(x, weights, biases, hidden_act, out_act, flags)[0]


_mlp_infer = register("mlp_infer", fake=_mlp_infer_fake)


def _want(need_x, need_w, need_b, has_bias):
    return [1 if need_x else 0] + [(1 if nw else 0) | (2 if nb and hb else 0)
                                   for nw, nb, hb in zip(need_w, need_b, has_bias)]


def _setup(ctx, inputs, output):
    x, weights, biases, hidden_act, out_act, flags = inputs
    _, saved = output
    ctx.mark_non_differentiable(saved)
    ctx.acts = (hidden_act, out_act, flags)
    ctx.n_biases = len(biases)
    ctx.has_bias = [b.numel() > 0 for b in biases] if biases else [False] * len(weights)
    ctx.save_for_backward(x, saved, *weights)


def _backward(ctx, gy, _gsaved):
    x, saved, *weights = ctx.saved_tensors
    need = ctx.needs_input_grad  # (x, [weights], [biases], ...) as register_autograd unflattens them
    need_b = need[2] if isinstance(need[2], (list, tuple)) and need[2] else [False] * len(weights)
    want = _want(need[0], need[1], need_b, ctx.has_bias)
    dx, dws, dbs = _mlp_bwd(gy, x, weights, saved, *ctx.acts, want)
    dws = [g if w & 1 else None for g, w in zip(dws, want[1:])]
    gb = [g if w & 2 else None for g, w in zip(dbs, want[1:])]
    return (dx if want[0] else None), dws, (gb if ctx.n_biases else []), None, None, None


_mlp = register("mlp", fake=_mlp_fake, backward=_backward, setup_context=_setup)


class _MLPFn(torch.autograd.Function):
    """Eager autograd over the flattened tensors: ``(hidden_act, out_act, flags, n,
    has_biases, x, *weights, *biases)``."""

    @staticmethod
    def forward(ctx, hidden_act, out_act, flags, n, has_biases, x, *params):
        weights, biases = list(params[:n]), (list(params[n:]) if has_biases else [])
        with _below_autograd():
            y, saved = _mlp(x, weights, biases, hidden_act, out_act, flags)
        ctx.mark_non_differentiable(saved)
        ctx.acts = (hidden_act, out_act, flags)
        ctx.n = n
        ctx.has_bias = [b.numel() > 0 for b in biases] if has_biases else [False] * n
        ctx.save_for_backward(x, saved, *weights)
        return y, saved

    @staticmethod
    def backward(ctx, gy, _gsaved):
        x, saved, *weights = ctx.saved_tensors
        n = ctx.n
        need = ctx.needs_input_grad[5:]
        need_w = need[1:1 + n]
        need_b = list(need[1 + n:]) or [False] * n
        want = _want(need[0], need_w, need_b, ctx.has_bias)
        dx, dws, dbs = _mlp_bwd(gy.contiguous(), x, weights, saved, *ctx.acts, want)
        grads = [dx if want[0] else None]
        grads += [g if w & 1 else None for g, w in zip(dws, want[1:])]
        if len(need) > 1 + n:
            grads += [g if w & 2 else None for g, w in zip(dbs, want[1:])]
        return (None, None, None, None, None, *grads)


# (the C++ apply: Function.apply's Python prologue unwraps every argument for
# functorch on each call, a cost per call that grows with the layers)
_mlp_fn_apply = _fast_apply(_MLPFn)


def _code(act):
    a = LINEAR_ACTIVATIONS.get(act) if isinstance(act, str) else None
    return _act(act) if a is None else a


def mlp(x: Tensor, weights, biases=None, hidden_act="relu", out_act="none", *, allow_tf32: bool = False) -> Tensor:
    """``act_L(... act_0(x w_0^T + b_0) ...)`` through ``torch.ops.fusekit.mlp``
    (differentiable; float16, bfloat16, float32). ``weights``: one ``[n_i, k_i]``
    tensor per layer; ``biases``: None or one tensor (or None) per layer."""
    weights = list(weights)
    biases = [b if b is not None else x.new_empty((0,)) for b in biases] if biases is not None else []
    ha, oa = _code(hidden_act), _code(out_act)
    flags = FK_GEMM_ALLOW_TF32 if allow_tf32 else 0
    if _is_compiling():
        return _mlp(x, weights, biases, ha, oa, flags)[0]
    try:
        if torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)
                                        or any(b.requires_grad for b in biases)):
            return _mlp_fn_apply(ha, oa, flags, len(weights), bool(biases), x, *weights, *biases)[0]
        with _below_autograd():  # nothing kept for a backward
            return _mlp_infer(x, weights, biases, ha, oa, flags)
    except RuntimeError as e:  # the library's errors as fusekit.Error subclasses
        raise _ext.translate(e) from None
