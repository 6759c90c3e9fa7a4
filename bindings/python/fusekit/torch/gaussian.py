"""The Gaussian field family on torch (``fusekit/csrc/gaussian.cpp``): the ops
under ``torch.ops.fusekit``, with fake tensors, autograd and ``torch.compile``:

- ``gaussian_field(points, means, chol, weights, eps) -> [B]`` and
  ``mahalanobis(points, means, chol, eps) -> [B,N]``: differentiable with respect to
  every tensor input (``loss.backward()`` works);
- ``gaussian_field_backward(points, means, chol, weights, dout, eps, want=15)`` and
  ``mahalanobis_backward(points, means, chol, g, eps, want=7)``: the fused fusekit
  backward kernels as their own ops (what the autograd formulas call); ``want`` is a
  bit mask of the gradients to compute, in output order (a gradient not wanted
  comes back as an empty tensor).

The tensor route of the plain functions of ``fusekit.ops.gaussian``
(:func:`mahalanobis_forward`, :func:`mahalanobis_backward`,
:func:`field_forward`, :func:`field_backward`) runs their C entry points one to
one through the ``*_out`` ops (every output given; None = not wanted).

This module gives the compiled kernels their fake implementations and autograd
formulas (``_register``)::

    from fusekit.torch.gaussian import gaussian_field
    f = gaussian_field(points, means, chol, weights)   # eps defaults to 1e-6
    ((f - target) ** 2).mean().backward()

Double backward is not supported (the backward ops have no autograd formula).
"""

import torch
from torch import Tensor

from ..ops.gaussian import DEFAULT_EPS, _lead
from ._register import d, eager_call, fused_autograd, new, no_output, outputs, register, run

__all__ = ["gaussian_field", "mahalanobis"]


def _maybe(t: Tensor, want: int, i: int, shape):
    return t.new_empty(shape if want >> i & 1 else (0,))


# --- the plain functions' ops: the entry points one to one ---------------------------

_maha_fwd_out = register("mahalanobis_forward_out", fake=no_output)
_maha_bwd_out = register("mahalanobis_backward_out", fake=no_output)
_field_fwd_out = register("gaussian_field_forward_out", fake=no_output)
_field_bwd_out = register("gaussian_field_backward_out", fake=no_output)


def mahalanobis_forward(where: str, points, means, chol, eps: float, out):
    """``fusekit.mahalanobis_forward`` on tensors."""
    P = d(points)
    O = out if out is not None else new((_lead(P), _lead(means)), P)
    run(where, _maha_fwd_out, (P, d(means), d(chol), float(eps), O), (out,))
    return O


def mahalanobis_backward(where: str, points, means, chol, g, eps: float, needs, out, workspace):
    """``fusekit.mahalanobis_backward`` on tensors."""
    P, M = d(points), d(means)
    b, n = _lead(P), _lead(M)
    specs = (("dpoints", (b, 3)), ("dmeans", (n, 3)), ("dchol", (n, 3, 3)))
    outs, given = outputs(where, specs, needs, out, P)
    run(where, _maha_bwd_out, (P, M, d(chol), float(eps), d(g), *outs, workspace), given)
    return tuple(outs)


def field_forward(where: str, points, means, chol, weights, eps: float, out):
    """``fusekit.gaussian_field_forward`` on tensors."""
    P = d(points)
    O = out if out is not None else new((_lead(P),), P)
    run(where, _field_fwd_out, (P, d(means), d(chol), d(weights), float(eps), O), (out,))
    return O


def field_backward(where: str, points, means, chol, weights, dout, eps: float, needs, out, workspace):
    """``fusekit.gaussian_field_backward`` on tensors."""
    P, M = d(points), d(means)
    b, n = _lead(P), _lead(M)
    specs = (("dpoints", (b, 3)), ("dmeans", (n, 3)), ("dchol", (n, 3, 3)), ("dweights", (n,)))
    outs, given = outputs(where, specs, needs, out, P)
    run(where, _field_bwd_out, (P, M, d(chol), d(weights), float(eps), d(dout), *outs, workspace), given)
    return tuple(outs)


# --- fusekit::gaussian_field_backward -------------------------------------------------


def _field_bwd_fake(points, means, chol, weights, dout, eps, want=15):
    return (_maybe(points, want, 0, points.shape), _maybe(means, want, 1, means.shape),
            _maybe(chol, want, 2, chol.shape), _maybe(weights, want, 3, weights.shape))


register("gaussian_field_backward", fake=_field_bwd_fake)


# --- fusekit::gaussian_field -------------------------------------------------------------


def _field_fake(points, means, chol, weights, eps):
    torch._check(points.dim() == 2 and points.shape[-1] == 3, lambda: "fusekit::gaussian_field: points must be [B,3]")
    return points.new_empty((points.shape[0],))


_field_setup, _field_backward = fused_autograd(4, "gaussian_field_backward")
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


_maha_setup, _maha_backward = fused_autograd(3, "mahalanobis_backward")
_maha = eager_call(register("mahalanobis", fake=_maha_fake, backward=_maha_backward, setup_context=_maha_setup),
                   _maha_backward, _maha_setup, (0, 1, 2))


# --- wrappers with the default eps ------------------------------------------------------------


def gaussian_field(points: Tensor, means: Tensor, chol: Tensor, weights: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """Differentiable fused Gaussian field ``[B]`` (``torch.ops.fusekit.gaussian_field``)."""
    return _field(points, means, chol, weights, float(eps))


def mahalanobis(points: Tensor, means: Tensor, chol: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """Differentiable squared Mahalanobis distances ``[B,N]`` (``torch.ops.fusekit.mahalanobis``)."""
    return _maha(points, means, chol, float(eps))
