"""The Gaussian field ops as torch custom ops (autograd, fake tensors,
``torch.compile``), registered by ``import fusekit.torch_ops`` (which imports this
module) under ``torch.ops.fusekit``:

- ``gaussian_field(points, means, chol, weights, eps) -> [B]`` and
  ``mahalanobis(points, means, chol, eps) -> [B,N]``: differentiable with respect to
  every tensor input (``loss.backward()`` works);
- ``gaussian_field_backward(points, means, chol, weights, dout, eps, want=15)`` and
  ``mahalanobis_backward(points, means, chol, g, eps, want=7)``: the fused fusekit
  backward kernels as their own ops (what the autograd formulas call); ``want`` is a
  bit mask of the gradients to compute, in output order (a gradient not wanted
  comes back as an empty tensor).

The kernels are compiled (``fusekit/csrc/fusekit_torch.cpp``); this module gives
them their fake implementations and autograd formulas.

::

    import fusekit.torch_ops
    from fusekit.torch_gaussian import gaussian_field
    f = gaussian_field(points, means, chol, weights)   # eps defaults to 1e-6
    ((f - target) ** 2).mean().backward()

Double backward is not supported (the backward ops have no autograd formula).
"""

import torch
from torch import Tensor

from .ops import gaussian as _g
from .torch_ops import eager_call, register

__all__ = ["gaussian_field", "mahalanobis"]


def _want(needs) -> int:
    return sum(1 << i for i, n in enumerate(needs) if n)


def _maybe(t: Tensor, want: int, i: int, shape):
    return t.new_empty(shape if want >> i & 1 else (0,))


# --- fusekit::gaussian_field_backward -------------------------------------------------


def _field_bwd_fake(points, means, chol, weights, dout, eps, want=15):
    return (_maybe(points, want, 0, points.shape), _maybe(means, want, 1, means.shape),
            _maybe(chol, want, 2, chol.shape), _maybe(weights, want, 3, weights.shape))


register("gaussian_field_backward", fake=_field_bwd_fake)


# --- fusekit::gaussian_field -------------------------------------------------------------


def _field_fake(points, means, chol, weights, eps):
    torch._check(points.dim() == 2 and points.shape[-1] == 3, lambda: "fusekit::gaussian_field: points must be [B,3]")
    return points.new_empty((points.shape[0],))


def _field_setup(ctx, inputs, output):
    points, means, chol, weights, eps = inputs
    ctx.save_for_backward(points, means, chol, weights)
    ctx.eps = eps


def _field_backward(ctx, grad):
    points, means, chol, weights = ctx.saved_tensors
    need = ctx.needs_input_grad[:4]
    dp, dm, dc, dw = torch.ops.fusekit.gaussian_field_backward(points, means, chol, weights, grad, ctx.eps,
                                                               _want(need))
    return (dp if need[0] else None, dm if need[1] else None, dc if need[2] else None,
            dw if need[3] else None, None)


_field = eager_call(register("gaussian_field", fake=_field_fake, backward=_field_backward, setup_context=_field_setup),
                    _field_backward, _field_setup, (0, 1, 2, 3))


# --- fusekit::mahalanobis_backward --------------------------------------------------------


def _maha_bwd_fake(points, means, chol, g, eps, want=7):
    return (_maybe(points, want, 0, points.shape), _maybe(means, want, 1, means.shape),
            _maybe(chol, want, 2, chol.shape))


register("mahalanobis_backward", fake=_maha_bwd_fake)


# --- fusekit::mahalanobis --------------------------------------------------------------------


def _maha_fake(points, means, chol, eps):
    return points.new_empty((points.shape[0], means.shape[0]))


def _maha_setup(ctx, inputs, output):
    points, means, chol, eps = inputs
    ctx.save_for_backward(points, means, chol)
    ctx.eps = eps


def _maha_backward(ctx, grad):
    points, means, chol = ctx.saved_tensors
    need = ctx.needs_input_grad[:3]
    dp, dm, dc = torch.ops.fusekit.mahalanobis_backward(points, means, chol, grad, ctx.eps, _want(need))
    return dp if need[0] else None, dm if need[1] else None, dc if need[2] else None, None


_maha = eager_call(register("mahalanobis", fake=_maha_fake, backward=_maha_backward, setup_context=_maha_setup),
                   _maha_backward, _maha_setup, (0, 1, 2))


# --- wrappers with the default eps ------------------------------------------------------------


def gaussian_field(points: Tensor, means: Tensor, chol: Tensor, weights: Tensor, eps: float = _g.DEFAULT_EPS) -> Tensor:
    """Differentiable fused Gaussian field ``[B]`` (``torch.ops.fusekit.gaussian_field``)."""
    return _field(points, means, chol, weights, float(eps))


def mahalanobis(points: Tensor, means: Tensor, chol: Tensor, eps: float = _g.DEFAULT_EPS) -> Tensor:
    """Differentiable squared Mahalanobis distances ``[B,N]`` (``torch.ops.fusekit.mahalanobis``)."""
    return _maha(points, means, chol, float(eps))
