"""Deprecated: the torch ops moved to :mod:`fusekit.torch` (one module per op
family; ``register`` and ``eager_call`` in ``fusekit.torch._register``). This alias,
kept for one release, registers every family as the old module did and
re-exports its names."""

from . import torch as _torch_pkg
from ._deprecated import moved
from .torch._register import NAMESPACE, eager_call, register
from .torch.elementwise import axpby, relu, scalar_mul
from .torch.linalg import linear

moved(__name__, "fusekit.torch (fusekit.torch.elementwise, fusekit.torch.linalg, ...)")
_torch_pkg.load()

__all__ = ["register", "eager_call", "axpby", "scalar_mul", "relu", "NAMESPACE", "linear"]
