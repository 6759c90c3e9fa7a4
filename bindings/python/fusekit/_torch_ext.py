"""The compiled torch integration (``fusekit/csrc/fusekit_torch.cpp``): loading it,
and the fast route of the plain functions (``fusekit.add`` & co.) for torch tensors.

The extension is a shared library built against PyTorch's stable ABI when the
package is installed with torch present (see bindings/python/README.md, "The torch
path"). It defines the ``torch.ops.fusekit.*`` ops and calls libfusekit's C entry
points directly; this module loads it into torch (``torch.ops.load_library``) and
hands it the path of the libfusekit the ctypes package loaded, so both share one
library.

Where it is looked for: ``$FUSEKIT_TORCH_LIBRARY`` (full path), then
``_fusekit_torch*.so`` beside this file.

Errors: the C++ side raises ``RuntimeError("fusekit[<status>]: <message>")``;
:func:`translate` turns that into the matching :class:`fusekit.Error` subclass.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import sys
import threading

from . import _lib

__all__ = ["load", "available", "translate", "library_path", "NOT_BUILT"]

_LOCK = threading.Lock()
_PATH: str | None = None
_ERROR: str | None = None  # why loading failed (kept, so the next call says it again cheaply)

#: The message when the extension is missing.
NOT_BUILT = (
    "fusekit's compiled torch ops are not built. Install the package with torch present: "
    "`pip install --no-build-isolation ./bindings/python` (or, in a source tree, "
    "`python bindings/python/setup.py build_ext --inplace`), or set FUSEKIT_TORCH_LIBRARY "
    "to the built _fusekit_torch.so"
)

# Op codes shared with fusekit_torch.cpp (binary_fn, unary_fn, scalar_fn).
BINARY = {"fk_add": 0, "fk_sub": 1, "fk_mul": 2, "fk_div": 3}
UNARY = {
    "fk_neg": 0, "fk_abs": 1, "fk_exp": 2, "fk_log": 3, "fk_sqrt": 4, "fk_sin": 5, "fk_cos": 6,
    "fk_tanh": 7, "fk_sigmoid": 8, "fk_relu": 9, "fk_copy": 10,
}
SCALAR = {"fk_scalar_add": 0, "fk_scalar_mul": 1}


def _candidates() -> list[str]:
    explicit = os.environ.get("FUSEKIT_TORCH_LIBRARY")
    if explicit:
        return [explicit]
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(glob.glob(os.path.join(here, "_fusekit_torch*.so")))


def load() -> str:
    """Loads the extension into torch (once); returns its path. Raises ImportError
    saying how to build it when it is missing or does not load."""
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
        _register_fakes(torch)
        _PATH = path
        return path


def _register_fakes(torch) -> None:
    """Fake (meta) implementations of the plain functions' ops, so that code calling
    ``fusekit.add`` & co. on tensors traces under ``torch.compile`` (the
    differentiable ops get theirs in fusekit.torch_ops and the family modules). The
    in-place ``*_out`` / ``*_`` ops return nothing: their fakes do nothing."""
    lib = "fusekit::"

    def bshape(a, b):
        return torch.broadcast_shapes(a.shape, b.shape)

    torch.library.register_fake(lib + "binary", lambda a, b, op: a.new_empty(bshape(a, b)))
    torch.library.register_fake(
        lib + "unary",
        lambda a, op: a.new_empty(a.shape, dtype=a.real.dtype if (op == UNARY["fk_abs"] and a.is_complex()) else a.dtype),
    )
    torch.library.register_fake(lib + "scalar", lambda a, re, im, op: a.new_empty(a.shape))
    torch.library.register_fake(lib + "axpby_c", lambda a, b, ar, ai, br, bi: a.new_empty(bshape(a, b)))
    for name in ("binary_out", "unary_out", "scalar_out", "axpby_c_out", "gemm_", "kron_out", "matrix_power_out",
                 "shampoo_stats_", "shampoo_precondition_out", "per_sample_grads_out", "per_sample_grad_norms_out",
                 "dp_clipped_grad_sum_out", "linear_forward_out", "linear_backward_out", "christoffel_forward_out",
                 "christoffel_backward_out", "leapfrog_forward_out", "leapfrog_backward_out",
                 "mahalanobis_forward_out", "gaussian_field_forward_out", "mahalanobis_backward_out",
                 "gaussian_field_backward_out"):
        torch.library.register_fake(lib + name, lambda *args: None)


def available() -> bool:
    """Whether the extension is (or can be) loaded; never raises."""
    try:
        load()
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
    path, with one warning)."""

    tensor = None
    tried = False


route = _Route()


def enable_route() -> bool:
    """Called by the plain functions when they see a torch tensor and the route is
    not decided yet: loads the extension (torch is imported by then)."""
    if route.tried:
        return route.tensor is not None
    route.tried = True
    torch = sys.modules.get("torch")
    if torch is None:
        route.tried = False
        return False
    try:
        load()
    except ImportError as e:
        import warnings

        warnings.warn(
            f"{e}. Plain fusekit functions on torch tensors take the slower ctypes path "
            "(about 20 us more per call).",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    ops = torch.ops.fusekit
    route.binary, route.binary_out = ops.binary.default, ops.binary_out.default
    route.unary, route.unary_out = ops.unary.default, ops.unary_out.default
    route.scalar, route.scalar_out = ops.scalar.default, ops.scalar_out.default
    route.axpby, route.axpby_out = ops.axpby_c.default, ops.axpby_c_out.default
    route.increment_version = torch.autograd.graph.increment_version
    route.tensor = torch.Tensor
    return True


def check_out(where: str, out) -> None:
    """The ctypes path's rules for a torch ``out``."""
    if out.requires_grad:
        _lib.raise_error(
            _lib.ERROR_INVALID_ARGUMENT,
            where,
            "out requires grad; fusekit's functions do not record autograd "
            "(use the ops in fusekit.torch_ops, or pass out.detach())",
        )
    if out.is_conj() or out.is_neg():
        _lib.raise_error(
            _lib.ERROR_INVALID_ARGUMENT,
            where,
            "out is a lazily conjugated/negated view; call resolve_conj()/resolve_neg() first",
        )


def call(fn, *args):
    """Runs a compiled op, with fusekit's exceptions."""
    try:
        return fn(*args)
    except RuntimeError as e:
        raise translate(e) from None


def ops():
    """``torch.ops.fusekit`` (the extension is loaded by the time a route is taken)."""
    return sys.modules["torch"].ops.fusekit


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


def d(t):
    """An input without autograd history (plain functions record none)."""
    return t.detach() if t is not None and t.requires_grad else t


def new(shape, like):
    """A new tensor of ``shape`` with ``like``'s dtype and device."""
    return sys.modules["torch"].empty(tuple(shape), dtype=like.dtype, device=like.device)


def outputs(where: str, specs, wanted, out, like):
    """The compiled route's ``_outputs`` (the ctypes path's rule): for each
    ``(name, shape)`` of ``specs``, the caller's tensor from ``out`` (a tuple, None
    entries allowed), else a new one where wanted, else None. Returns (tensors,
    the caller's tensors)."""
    outs = tuple(out) if out is not None else (None,) * len(specs)
    if len(outs) != len(specs):
        raise ValueError(f"{where}: out must hold {len(specs)} entries (None for not wanted)")
    res = [o if o is not None else (new(shape, like) if w else None) for (_, shape), w, o in zip(specs, wanted, outs)]
    return res, tuple(o for o in outs if o is not None)


def run(where: str, op, args, written=()):
    """Runs a compiled in-place op: the caller's outputs in ``written`` (None
    skipped) are checked first and get their version counters bumped after."""
    for o in written:
        if o is not None:
            check_out(where, o)
    try:
        op(*args)
    except RuntimeError as e:
        raise translate(e) from None
    for o in written:
        if o is not None:
            route.increment_version(o)
