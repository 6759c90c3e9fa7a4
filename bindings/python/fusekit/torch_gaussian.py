"""The Gaussian field ops as torch custom ops (autograd, fake tensors,
``torch.compile``), registered by ``import fusekit.torch_ops`` (which imports this
module) under ``torch.ops.fusekit``:

- ``gaussian_field(points, means, chol, weights, eps) -> [B]`` and
  ``mahalanobis(points, means, chol, eps) -> [B,N]``: differentiable with respect to
  every tensor input (``loss.backward()`` works);
- ``gaussian_field_backward(points, means, chol, weights, dout, eps)`` and
  ``mahalanobis_backward(points, means, chol, g, eps)``: the fused fusekit backward
  kernels as their own ops (what the autograd formulas call).

::

    import fusekit.torch_ops
    from fusekit.torch_gaussian import gaussian_field
    f = gaussian_field(points, means, chol, weights)   # eps defaults to 1e-6
    ((f - target) ** 2).mean().backward()

Double backward is not supported (the backward ops have no autograd formula).
"""

from typing import Tuple

import torch
from torch import Tensor

from .ops import gaussian as _g
from .torch_ops import register

__all__ = ["gaussian_field", "mahalanobis"]


def _c(t: Tensor) -> Tensor:
    return t.detach().contiguous()


# --- fusekit::gaussian_field_backward -------------------------------------------------


def _field_bwd(
    points: Tensor, means: Tensor, chol: Tensor, weights: Tensor, dout: Tensor, eps: float
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dp, dm, dc, dw = _g.gaussian_field_backward(_c(points), _c(means), _c(chol), _c(weights), _c(dout), eps)
    return dp, dm, dc, dw


def _field_bwd_fake(points, means, chol, weights, dout, eps):
    return (points.new_empty(points.shape), means.new_empty(means.shape), chol.new_empty(chol.shape),
            weights.new_empty(weights.shape))


register("gaussian_field_backward", _field_bwd, fake=_field_bwd_fake)


# --- fusekit::gaussian_field -------------------------------------------------------------


def _field(points: Tensor, means: Tensor, chol: Tensor, weights: Tensor, eps: float) -> Tensor:
    return _g.gaussian_field_forward(_c(points), _c(means), _c(chol), _c(weights), eps)


def _field_fake(points, means, chol, weights, eps):
    torch._check(points.dim() == 2 and points.shape[-1] == 3, lambda: "fusekit::gaussian_field: points must be [B,3]")
    return points.new_empty((points.shape[0],))


def _field_setup(ctx, inputs, output):
    points, means, chol, weights, eps = inputs
    ctx.save_for_backward(points, means, chol, weights)
    ctx.eps = eps


def _field_backward(ctx, grad):
    points, means, chol, weights = ctx.saved_tensors
    dp, dm, dc, dw = torch.ops.fusekit.gaussian_field_backward(points, means, chol, weights, grad, ctx.eps)
    need = ctx.needs_input_grad
    return (dp if need[0] else None, dm if need[1] else None, dc if need[2] else None,
            dw if need[3] else None, None)


register("gaussian_field", _field, fake=_field_fake, backward=_field_backward, setup_context=_field_setup)


# --- fusekit::mahalanobis_backward --------------------------------------------------------


def _maha_bwd(points: Tensor, means: Tensor, chol: Tensor, g: Tensor, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    dp, dm, dc = _g.mahalanobis_backward(_c(points), _c(means), _c(chol), _c(g), eps)
    return dp, dm, dc


def _maha_bwd_fake(points, means, chol, g, eps):
    return points.new_empty(points.shape), means.new_empty(means.shape), chol.new_empty(chol.shape)


register("mahalanobis_backward", _maha_bwd, fake=_maha_bwd_fake)


# --- fusekit::mahalanobis --------------------------------------------------------------------


def _maha(points: Tensor, means: Tensor, chol: Tensor, eps: float) -> Tensor:
    return _g.mahalanobis_forward(_c(points), _c(means), _c(chol), eps)


def _maha_fake(points, means, chol, eps):
    return points.new_empty((points.shape[0], means.shape[0]))


def _maha_setup(ctx, inputs, output):
    points, means, chol, eps = inputs
    ctx.save_for_backward(points, means, chol)
    ctx.eps = eps


def _maha_backward(ctx, grad):
    points, means, chol = ctx.saved_tensors
    dp, dm, dc = torch.ops.fusekit.mahalanobis_backward(points, means, chol, grad, ctx.eps)
    need = ctx.needs_input_grad
    return dp if need[0] else None, dm if need[1] else None, dc if need[2] else None, None


register("mahalanobis", _maha, fake=_maha_fake, backward=_maha_backward, setup_context=_maha_setup)


# --- wrappers with the default eps ------------------------------------------------------------


def gaussian_field(points: Tensor, means: Tensor, chol: Tensor, weights: Tensor, eps: float = _g.DEFAULT_EPS) -> Tensor:
    """Differentiable fused Gaussian field ``[B]`` (``torch.ops.fusekit.gaussian_field``)."""
    return torch.ops.fusekit.gaussian_field(points, means, chol, weights, float(eps))


def mahalanobis(points: Tensor, means: Tensor, chol: Tensor, eps: float = _g.DEFAULT_EPS) -> Tensor:
    """Differentiable squared Mahalanobis distances ``[B,N]`` (``torch.ops.fusekit.mahalanobis``)."""
    return torch.ops.fusekit.mahalanobis(points, means, chol, float(eps))
