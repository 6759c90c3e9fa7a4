"""The route the plain functions (``fusekit.add`` & co., ``fusekit.ops``) take for
torch tensors: the compiled torch ops of ``fusekit.torch``, once they are known
to load. Torch-free and below every op module: the op modules ask :func:`plain`,
then call ``route.<family>.<function>``.

What fills the route (loading the compiled library and the torch family modules,
which import the op modules) sits above them: ``fusekit.torch.enable_route``,
which ``import fusekit`` installs here (:func:`install`). So the op modules never
import the torch layer, and the package's import graph, imports inside functions
included, has no circle.
"""

from __future__ import annotations

import sys

__all__ = ["FAMILIES", "route", "plain", "install"]

#: The op families of the C ABI, one module each in ``fusekit.ops`` and in
#: ``fusekit.torch``.
FAMILIES = ("elementwise", "linalg", "mlp", "gaussian", "geodesic", "optim")


class _Route:
    """``tensor``: the torch.Tensor class once the extension is loaded (None before,
    and for good when it cannot load: the plain functions then take the ctypes
    path, with one warning). Then one attribute per op family (``elementwise``,
    ``linalg``, ``mlp``, ``gaussian``, ``geodesic``, ``optim``): the family's module of
    ``fusekit.torch``, whose functions run the plain functions on tensors."""

    tensor = None
    tried = False


route = _Route()

# the function that fills `route` (fusekit.torch.enable_route), once installed
_enable = None


def install(enable) -> None:
    """Sets the function :func:`plain` calls to fill the route at the first torch
    tensor it sees (``enable() -> bool``: whether the route is open)."""
    global _enable
    _enable = enable


def plain(*arrays) -> bool:
    """Whether a plain function's arrays (None entries skipped; at least one given)
    all take the compiled route: torch tensors, the extension loaded, no lazily
    conjugated/negated view. The caller also requires ``stream=None``."""
    t = route.tensor
    if t is None:
        torch = sys.modules.get("torch")
        first = next((x for x in arrays if x is not None), None)
        if (route.tried or torch is None or not isinstance(first, torch.Tensor) or _enable is None
                or not _enable()):
            return False
        t = route.tensor
    seen = False
    for x in arrays:
        if x is None:
            continue
        if not isinstance(x, t) or (x.is_complex() and (x.is_conj() or x.is_neg())):
            return False
        seen = True
    return seen
