"""The compiled torch ops (``fusekit/csrc/*.cpp``, built into one library,
``_fusekit_torch.so``): loading them, turning their errors into fusekit's, and the
route the plain functions (``fusekit.add`` & co.) take for torch tensors.

The library is built against PyTorch's stable ABI when the package is installed
with torch present (see bindings/python/README.md, "The torch path"). It defines
the ``torch.ops.fusekit.*`` ops and calls libfusekit's C entry points directly;
:func:`load` loads it into torch (``torch.ops.load_library``) and hands it the
path of the libfusekit the ctypes package loaded, so both share one library.
Python's part of each op (fake implementation, autograd, tensor route) is in the
family modules beside this one, which register it through ``_register``.

Where it is looked for: ``$FUSEKIT_TORCH_LIBRARY`` (full path), then
``_fusekit_torch*.so`` in the package folder (``fusekit/``).

Errors: the C++ side raises ``RuntimeError("fusekit[<status>]: <message>")``;
:func:`translate` turns that into the matching :class:`fusekit.Error` subclass.

This module does not import torch: the op modules of ``fusekit.ops`` import it
for :data:`route`, and ``import fusekit`` must work without torch.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import sys
import threading
import warnings

from .. import _lib

__all__ = ["load", "available", "translate", "library_path", "NOT_BUILT", "route", "enable_route", "plain"]

_LOCK = threading.Lock()
_PATH: str | None = None
_ERROR: str | None = None  # why loading failed (kept, so the next call says it again cheaply)
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The message when the extension is missing.
NOT_BUILT = (
    "fusekit's compiled torch ops are not built. Install the package with torch present: "
    "`pip install --no-build-isolation ./bindings/python` (or, in a source tree, "
    "`python bindings/python/setup.py build_ext --inplace`), or set FUSEKIT_TORCH_LIBRARY "
    "to the built _fusekit_torch.so"
)


def _candidates() -> list[str]:
    explicit = os.environ.get("FUSEKIT_TORCH_LIBRARY")
    if explicit:
        return [explicit]
    return sorted(glob.glob(os.path.join(_PKG_DIR, "_fusekit_torch*.so")))


def load() -> str:
    """Loads the extension into torch (once); returns its path. Raises ImportError
    saying how to build it when it is missing or does not load. The ops then exist
    without their Python parts: a family module registers those when imported
    (``fusekit.torch.load()`` imports them all)."""
    global _PATH, _ERROR
    if _PATH is not None:
        return _PATH
    with _LOCK:
        if _PATH is not None:
            return _PATH
        if _ERROR is not None:
            raise ImportError(_ERROR)
        import torch

        paths = _candidates()
        if not paths:
            _ERROR = NOT_BUILT
            raise ImportError(_ERROR)
        path = paths[0]
        try:
            torch.ops.load_library(path)
            cdll = ctypes.CDLL(path)
            init = cdll.fusekit_torch_init
            init.restype = ctypes.c_int
            init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
            err = ctypes.create_string_buffer(1024)
            if init(_lib.library_path().encode(), err, len(err)) != 0:
                raise OSError(err.value.decode("utf-8", "replace"))
        except (OSError, RuntimeError) as e:
            _ERROR = f"fusekit: the compiled torch ops at {path} did not load: {e}. {NOT_BUILT}"
            raise ImportError(_ERROR) from e
        _PATH = path
        return path


def available(loader=None) -> bool:
    """Whether the extension is (or can be) loaded (by ``loader``, default
    :func:`load`); never raises."""
    try:
        (loader or load)()
        return True
    except ImportError:
        return False


def library_path() -> str:
    """Path of the loaded extension (loads it)."""
    return load()


_MSG = re.compile(r"fusekit\[(-?\d+)\]: ([^\n]*)")


def translate(e: BaseException) -> BaseException:
    """The fusekit.Error for a RuntimeError the extension raised (``e`` itself when
    it is not one of fusekit's)."""
    m = _MSG.search(str(e))
    if m is None:
        return e
    status, msg = int(m.group(1)), m.group(2)
    if status == -1:
        return RuntimeError(msg)
    return _lib.error_for(status, msg)


# ---------------------------------------------------------------------------
# The plain functions' route for torch tensors
# ---------------------------------------------------------------------------


class _Route:
    """``tensor``: the torch.Tensor class once the extension is loaded (None before,
    and for good when it cannot load: the plain functions then take the ctypes
    path, with one warning). Then one attribute per op family (``elementwise``,
    ``linalg``, ``mlp``, ``gaussian``, ``geodesic``, ``optim``): the family's module of
    ``fusekit.torch``, whose functions run the plain functions on tensors."""

    tensor = None
    tried = False


route = _Route()

#: The op families of the C ABI, one module each here and in ``fusekit.ops``.
FAMILIES = ("elementwise", "linalg", "mlp", "gaussian", "geodesic", "optim")


def enable_route() -> bool:
    """Called by the plain functions when they see a torch tensor and the route is
    not decided yet: loads the extension and the family modules (torch is
    imported by then)."""
    if route.tried:
        return route.tensor is not None
    route.tried = True
    torch = sys.modules.get("torch")
    if torch is None:
        route.tried = False
        return False
    try:
        # The family modules import torch, so this torch-free module reaches them
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


def plain(*arrays) -> bool:
    """Whether a plain function's arrays (None entries skipped; at least one given)
    all take the compiled route: torch tensors, the extension loaded, no lazily
    conjugated/negated view. The caller also requires ``stream=None``."""
    t = route.tensor
    if t is None:
        torch = sys.modules.get("torch")
        first = next((x for x in arrays if x is not None), None)
        if route.tried or torch is None or not isinstance(first, torch.Tensor) or not enable_route():
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
