"""Op families, one module each. A new family (geodesic, Gaussian field, GEMM, ...)
adds a module here with one function per C entry point and an ``ENTRY_POINTS``
table (C name -> Python function), and lists it in ``FAMILIES`` below;
``fusekit/__init__.py`` re-exports every family's ``__all__``.
"""

from .. import runtime
from . import elementwise, gaussian, geodesic, linalg, mlp, optim

#: Every op-family module (``fusekit.runtime``, the runtime API, included for its
#: entry points).
FAMILIES = (elementwise, gaussian, geodesic, linalg, mlp, optim, runtime)

#: C entry point name -> public Python function, over all families.
ENTRY_POINTS = {name: fn for fam in FAMILIES for name, fn in fam.ENTRY_POINTS.items()}
