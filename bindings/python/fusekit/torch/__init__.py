"""fusekit on torch: the compiled ``torch.ops.fusekit.*`` ops (``fusekit/csrc``,
PyTorch's stable ABI) and their Python parts, one module per op family of the C
ABI, each holding its ops' fake (meta) implementations, autograd formulas and the
route its plain functions take for torch tensors:

- :mod:`fusekit.torch.elementwise`: ``fusekit.add`` & co. on tensors;
  differentiable ``axpby``, ``scalar_mul``, ``relu``
- :mod:`fusekit.torch.linalg`: ``gemm``, ``kron``, ``linear_forward`` /
  ``linear_backward`` on tensors; the differentiable fused ``linear``
- :mod:`fusekit.torch.mlp`: the differentiable multi-layer perceptron ``mlp.mlp`` (one
  op each way, behind ``fusekit.nn.FusedMLP``)
- :mod:`fusekit.torch.gaussian`: differentiable ``gaussian_field``, ``mahalanobis``
- :mod:`fusekit.torch.geodesic`: differentiable ``christoffel``, ``leapfrog``
- :mod:`fusekit.torch.optim`: ``matrix_power``, Shampoo and per-sample ops on tensors
- :mod:`fusekit.torch.nn`: drop-in ``torch.nn`` modules on these ops (also
  ``fusekit.nn``)

and ``_register`` (the one helper every family registers its ops with) and
``_ext`` (loads the compiled library; the plain functions' route).

``import fusekit.torch`` imports neither torch nor the compiled library (``import
fusekit`` reaches ``_ext`` through the plain functions and must work without
torch). A family module loads them when imported::

    from fusekit.torch.linalg import linear       # or: fusekit.torch.linear
    y = linear(x, w, b, "gelu")

:func:`load` registers every family at once (what the plain functions do at their
first torch tensor); an op called as ``torch.ops.fusekit.<name>`` needs its
family registered. ImportError, saying how to build it, when the compiled library
is missing.
"""

import importlib
import sys
import warnings

from .. import _route
from . import _ext

__all__ = ["load", "enable_route", "FAMILIES", "axpby", "scalar_mul", "relu", "linear", "gaussian_field", "mahalanobis",
           "christoffel", "leapfrog", "register", "eager_call", "NAMESPACE"]

FAMILIES = _route.FAMILIES

# public names of the family modules (and of _register), reachable here
_HOME = {
    "axpby": "elementwise", "scalar_mul": "elementwise", "relu": "elementwise", "linear": "linalg",
    "gaussian_field": "gaussian", "mahalanobis": "gaussian", "christoffel": "geodesic", "leapfrog": "geodesic",
    "register": "_register", "eager_call": "_register", "NAMESPACE": "_register",
}


def load() -> str:
    """Loads the compiled library and registers every family's ops (fakes,
    autograd); returns the library's path."""
    path = _ext.load()
    for fam in FAMILIES:
        importlib.import_module(f"{__name__}.{fam}")
    return path


def enable_route() -> bool:
    """Fills the plain functions' route (``fusekit/_route.py``; installed there by
    ``import fusekit``): called when they see a torch tensor and the route is not
    decided yet. Loads the extension and the family modules (torch is imported by
    then); whether the route is open."""
    route = _route.route
    if route.tried:
        return route.tensor is not None
    route.tried = True
    torch = sys.modules.get("torch")
    if torch is None:
        route.tried = False
        return False
    try:
        # The family modules import torch, so this torch-free package reaches them
        # only here, once a tensor has been seen (torch is optional).
        # (import statements, not importlib: torch.compile traces a first plain call
        # through here, and Dynamo runs an import statement but refuses importlib)
        from . import elementwise, gaussian, geodesic, linalg, mlp, optim

        modules = {
            "elementwise": elementwise,
            "linalg": linalg,
            "mlp": mlp,
            "gaussian": gaussian,
            "geodesic": geodesic,
            "optim": optim,
        }
        assert tuple(modules) == FAMILIES
    except ImportError as e:
        warnings.warn(
            f"{e}. Plain fusekit functions on torch tensors take the slower ctypes path "
            "(about 20 us more per call).",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    for fam, module in modules.items():
        setattr(route, fam, module)
    route.tensor = torch.Tensor
    return True


def __getattr__(name):
    # The family modules import torch: imported on first use, not with this package.
    if name in FAMILIES or name == "nn":
        return importlib.import_module(f"{__name__}.{name}")
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
