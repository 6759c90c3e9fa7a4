"""Deprecated alias of :mod:`fusekit.torch.gaussian` for one release (importing it
registers every family, as the old module did)."""

import sys

from . import torch as _torch_pkg
from ._deprecated import moved
from .torch import gaussian as _new

moved(__name__, "fusekit.torch.gaussian")
_torch_pkg.load()
sys.modules[__name__] = _new
