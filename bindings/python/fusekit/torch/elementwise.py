"""The elementwise family on torch (``fusekit/csrc/elementwise.cpp``).

- The tensor route of the plain functions (``fusekit.add`` and every other op of
  ``fusekit.ops.elementwise``): :func:`binary`, :func:`unary`, :func:`scalar`,
  :func:`axpby_c` run ``fusekit::binary`` / ``unary`` / ``scalar`` / ``axpby_c``
  (a new output) or their ``*_out`` ops (the caller's ``out``), choosing the entry
  point by its op code (:data:`BINARY`, :data:`UNARY`, :data:`SCALAR`).
- The differentiable ops ``fusekit::axpby``, ``scalar_mul`` and ``relu`` with their
  autograd, and the wrappers :func:`axpby`, :func:`scalar_mul`, :func:`relu` with
  the argument order of the plain functions::

      from fusekit.torch.elementwise import axpby
      y = axpby(2.0, a, -1.0, b)          # or torch.ops.fusekit.axpby(a, b, 2.0, -1.0)
      y.sum().backward()
"""

import torch
from torch import Tensor

from .._abi import TORCH_BINARY_OPS as BINARY
from .._abi import TORCH_SCALAR_OPS as SCALAR
from .._abi import TORCH_UNARY_OPS as UNARY
from ._ext import translate
from ._register import call, d, eager_call, no_output, reduce_to, register, run

__all__ = ["axpby", "scalar_mul", "relu"]

# BINARY, UNARY, SCALAR: the op codes of fusekit::binary, unary and scalar (entry
# point -> code), generated from the table that also writes csrc/fk_abi.h's
# FK_TORCH_*_OPS (scripts/gen_bindings.py).

_ABS = UNARY["fk_abs"]


# --- the plain functions' ops (not differentiable) ---------------------------


def _bshape(a: Tensor, b: Tensor):
    return torch.broadcast_shapes(a.shape, b.shape)


_binary = register("binary", fake=lambda a, b, op: a.new_empty(_bshape(a, b)))
_binary_out = register("binary_out", fake=no_output)
_unary = register(
    "unary",
    fake=lambda a, op: a.new_empty(a.shape, dtype=a.real.dtype if (op == _ABS and a.is_complex()) else a.dtype),
)
_unary_out = register("unary_out", fake=no_output)
_scalar = register("scalar", fake=lambda a, re, im, op: a.new_empty(a.shape))
_scalar_out = register("scalar_out", fake=no_output)
_axpby_c = register("axpby_c", fake=lambda a, b, ar, ai, br, bi: a.new_empty(_bshape(a, b)))
_axpby_c_out = register("axpby_c_out", fake=no_output)


def _routed(where, fn, fn_out, out, *args):
    """Runs a plain op: functional, or into the caller's ``out``."""
    if out is None:
        return call(fn, *args)
    run(where, fn_out, (*args, out), (out,))
    return out


def binary(entry: str, where: str, a, b, out):
    """``fusekit.add`` & co. (``entry``: the C entry point) on tensors."""
    return _routed(where, _binary, _binary_out, out, d(a), d(b), BINARY[entry])


def binary_new(entry: str, a, b):
    """:func:`binary` of the common case, kept short (host time per call): two real
    tensors without autograd history, a new output."""
    try:
        return _binary(a, b, BINARY[entry])
    except RuntimeError as e:
        raise translate(e) from None


def unary(entry: str, where: str, a, out):
    """``fusekit.exp`` & co. on tensors."""
    return _routed(where, _unary, _unary_out, out, d(a), UNARY[entry])


def unary_new(entry: str, a):
    """:func:`unary` of the common case, kept short: a real tensor without autograd
    history, a new output."""
    try:
        return _unary(a, UNARY[entry])
    except RuntimeError as e:
        raise translate(e) from None


def scalar(entry: str, where: str, a, s, out):
    """``fusekit.scalar_add`` / ``scalar_mul`` on tensors (``s``: an ``fk_scalar``)."""
    return _routed(where, _scalar, _scalar_out, out, d(a), s.re, s.im, SCALAR[entry])


def axpby_c(where: str, sa, a, sb, b, out):
    """``fusekit.axpby`` on tensors (``sa``, ``sb``: ``fk_scalar``s)."""
    return _routed(where, _axpby_c, _axpby_c_out, out, d(a), d(b), sa.re, sa.im, sb.re, sb.im)


# --- fusekit::scalar_mul(Tensor a, float s) -> Tensor ------------------------


def _scalar_mul_fake(a: Tensor, s: float) -> Tensor:
    return torch.empty_like(a, memory_format=torch.contiguous_format)


def _scalar_mul_setup(ctx, inputs, output):
    ctx.s = inputs[1]


def _scalar_mul_backward(ctx, grad):
    return torch.ops.fusekit.scalar_mul(grad, ctx.s), None


_scalar_mul_op = eager_call(
    register("scalar_mul", fake=_scalar_mul_fake, backward=_scalar_mul_backward, setup_context=_scalar_mul_setup),
    _scalar_mul_backward, _scalar_mul_setup, (0,))


# --- fusekit::axpby(Tensor a, Tensor b, float alpha, float beta) -> Tensor --


def _axpby_fake(a: Tensor, b: Tensor, alpha: float, beta: float) -> Tensor:
    torch._check(a.dtype == b.dtype, lambda: f"fusekit::axpby: a is {a.dtype} but b is {b.dtype}")
    return a.new_empty(_bshape(a, b))


def _axpby_setup(ctx, inputs, output):
    a, b, alpha, beta = inputs
    ctx.alpha, ctx.beta = alpha, beta
    ctx.a_shape, ctx.b_shape = a.shape, b.shape


def _axpby_backward(ctx, grad):
    ga = gb = None
    if ctx.needs_input_grad[0]:
        ga = reduce_to(torch.ops.fusekit.scalar_mul(grad, ctx.alpha), ctx.a_shape)
    if ctx.needs_input_grad[1]:
        gb = reduce_to(torch.ops.fusekit.scalar_mul(grad, ctx.beta), ctx.b_shape)
    return ga, gb, None, None


_axpby_op = eager_call(
    register("axpby", fake=_axpby_fake, backward=_axpby_backward, setup_context=_axpby_setup),
    _axpby_backward, _axpby_setup, (0, 1))


# --- fusekit::relu(Tensor a) -> Tensor ---------------------------------------


def _relu_fake(a: Tensor) -> Tensor:
    torch._check(not a.is_complex(), lambda: "fusekit::relu: complex input is not supported")
    return torch.empty_like(a, memory_format=torch.contiguous_format)


def _relu_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _relu_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    # d relu / da = 1 where the output is positive (0 at a == 0, as torch.relu).
    return torch.where(out > 0, grad, torch.zeros_like(grad))


_relu_op = eager_call(register("relu", fake=_relu_fake, backward=_relu_backward, setup_context=_relu_setup),
                      _relu_backward, _relu_setup, (0,))


# --- the wrappers, with the argument order of the plain functions --------------


def axpby(alpha: float, a: Tensor, beta: float, b: Tensor) -> Tensor:
    """``alpha*a + beta*b`` through ``torch.ops.fusekit.axpby`` (differentiable)."""
    return _axpby_op(a, b, float(alpha), float(beta))


def scalar_mul(a: Tensor, s: float) -> Tensor:
    """``a*s`` through ``torch.ops.fusekit.scalar_mul`` (differentiable)."""
    return _scalar_mul_op(a, float(s))


def relu(a: Tensor) -> Tensor:
    """``max(a, 0)`` through ``torch.ops.fusekit.relu`` (differentiable)."""
    return _relu_op(a)
