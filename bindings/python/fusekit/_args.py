"""Argument checks of the modules' constructors, shared by ``fusekit.nn``
(torch) and ``fusekit.jax.nn``: a ``TypeError`` for the wrong type, a
``ValueError`` for a bad value, each naming the module and the argument
(docs/nn.md). Nothing here imports torch or jax."""

from __future__ import annotations

import math
import numbers
from typing import Tuple

#: The activations of the fused linear layer, named as torch names them: ``"gelu"``
#: is the exact (erf) GELU of ``F.gelu(x)``, ``"gelu_tanh"`` the tanh approximation
#: of ``F.gelu(x, approximate="tanh")``.
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "none")


def check_int(where: str, name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {value}")
    return int(value)


def check_float(where: str, name: str, value, *, positive=False, nonnegative=False, allow_inf=False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: {name} must be a float, not {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{where}: {name} must be finite, got {v}")
    if positive and not v > 0:
        raise ValueError(f"{where}: {name} must be > 0, got {v}")
    if nonnegative and not v >= 0:
        raise ValueError(f"{where}: {name} must be >= 0, got {v}")
    return v


def check_bool(where: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be a bool, not {type(value).__name__}")
    return value


def check_activation(where: str, activation) -> str:
    if not isinstance(activation, str):
        raise TypeError(f"{where}: activation must be a str (one of {', '.join(ACTIVATIONS)}), "
                        f"not {type(activation).__name__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{where}: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    return activation


def check_volume(where: str, volume_size) -> Tuple[float, float, float]:
    """A Gaussian field's box: one edge for all three axes, or three edges (> 0)."""
    if isinstance(volume_size, numbers.Real) and not isinstance(volume_size, bool):
        sizes = (volume_size,) * 3
    elif isinstance(volume_size, (tuple, list)) and len(volume_size) == 3:
        sizes = tuple(volume_size)
    else:
        raise TypeError(f"{where}: volume_size must be a float or three floats, not {volume_size!r}")
    return tuple(check_float(where, "volume_size", s, positive=True) for s in sizes)
