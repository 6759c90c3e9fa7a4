"""``fusekit.nn`` is :mod:`fusekit.torch.nn` (the same module object): the
drop-in ``torch.nn`` modules keep their short public name, like ``torch.nn``."""

import sys

from .torch import nn as _nn

sys.modules[__name__] = _nn
