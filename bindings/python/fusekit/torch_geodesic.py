"""Deprecated alias of :mod:`fusekit.torch.geodesic` for one release (importing it
registers every family, as the old module did)."""

import sys

from . import torch as _torch_pkg
from ._deprecated import moved
from .torch import geodesic as _new

moved(__name__, "fusekit.torch.geodesic")
_torch_pkg.load()
sys.modules[__name__] = _new
