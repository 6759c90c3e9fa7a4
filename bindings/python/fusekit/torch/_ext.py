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

This module does not import torch (``import fusekit`` must work without torch);
``route``, ``plain`` and ``FAMILIES`` here are those of ``fusekit/_route.py``.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import threading

from .. import _lib
from .._route import FAMILIES, plain, route  # noqa: F401  (the plain functions' route, reachable here too)

__all__ = ["load", "available", "translate", "library_path", "NOT_BUILT", "route", "plain"]

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
