"""Deprecated alias of :mod:`fusekit.torch._ext` for one release. ``load()`` and
``available()`` also register every family (:func:`fusekit.torch.load`), as the
old module's did; its helpers (``run``, ``call``, ``d``, ``new``, ``outputs``,
``check_out``, ``ops``) and op codes (``BINARY``, ``UNARY``, ``SCALAR``) come from
their new modules (``fusekit.torch._register``, ``fusekit.torch.elementwise``)
on first use, which imports torch."""

import importlib

from . import torch as _torch_pkg
from ._deprecated import moved
from .torch import _ext
from .torch import enable_route  # noqa: F401
from .torch._ext import NOT_BUILT, plain, route, translate  # noqa: F401

moved(__name__, "fusekit.torch._ext")

__all__ = ["load", "available", "translate", "library_path", "NOT_BUILT"]


def load() -> str:
    """:func:`fusekit.torch.load`."""
    return _torch_pkg.load()


def available() -> bool:
    """Whether the compiled ops load (and register); never raises."""
    return _ext.available(load)


def library_path() -> str:
    return load()


_LATER = {"check_out": "_register", "call": "_register", "d": "_register", "new": "_register",
          "outputs": "_register", "run": "_register", "BINARY": "elementwise", "UNARY": "elementwise",
          "SCALAR": "elementwise"}


def ops():
    """``torch.ops.fusekit``."""
    load()
    import torch

    return torch.ops.fusekit


def __getattr__(name):
    home = _LATER.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{_torch_pkg.__name__}.{home}"), name)
