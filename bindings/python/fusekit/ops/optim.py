"""Optimizer math (docs/ops.md section 4, src/abi/optim.rs): one function per C entry
point.

Inputs (numpy arrays, torch tensors on the CPU or CUDA, fusekit Buffers, DLPack
producers; float32 or float64, one dtype for all, contiguous). Results are the
caller's kind of array (torch in, torch out); outputs are allocated when not given.
On CUDA, torch tensors run on torch's current stream of their device (``stream=``
overrides, as for every family). ``allow_tf32=True`` lets f32 products use TF32
tensor cores on CUDA (relative error ~1e-3; ignored for f64 and on the CPU).

- :func:`matrix_power`: ``(A + eps I)^power`` of symmetric PSD matrices
  ``[n, n]`` or ``[batch, n, n]`` (Shampoo's inverse p-th root is
  ``power = -1/p``), by eigendecomposition (``method="eigh"``, any real power) or
  the coupled Newton iteration (``"newton"``, inverse roots only); ``"auto"``
  picks. A Newton run that misses ``tol`` raises :class:`fusekit.NotConvergedError`
  (FK_ERROR_NOT_CONVERGED) carrying the report and the last iterate.
- :func:`shampoo_stats`: ``L = beta L + alpha G G^T``, ``R = beta R + alpha G^T G``
  in place.
- :func:`shampoo_precondition`: ``out = L_root G R_root`` (a missing root is the
  identity).
- :func:`per_sample_grads`: the per-sample gradients of a linear layer
  ``out[b] = g_b^T a_b`` ``[B, out, in]``; :func:`per_sample_grad_norms` their
  squared Frobenius norms without materialising them; :func:`dp_clipped_grad_sum`
  the DP-SGD clipped sum ``sum_b min(1, max_norm / |G_b|) G_b``.

On torch tensors the functions run the compiled ops (``fusekit.torch.optim``).
These ops have no backward, so none of them is differentiable: call them on
detached tensors (an ``out`` that requires grad is refused).
"""

from __future__ import annotations

import numbers
from ctypes import byref
from dataclasses import dataclass

from .._core import DType, Invocation, _is_torch_tensor, _torch
from .._lib import (
    ERROR_INVALID_ARGUMENT,
    GEMM_ALLOW_TF32,
    MATPOW_AUTO,
    MATPOW_EIGH,
    MATPOW_NEWTON,
    NotConvergedError,
    fk_matpow_report,
    lib,
    raise_error,
)
from .._route import plain as _plain  # torch tensors: the compiled ops
from .._route import route as _route  # _route.optim: fusekit.torch.optim


__all__ = [
    "MATPOW_AUTO",
    "MATPOW_EIGH",
    "MATPOW_NEWTON",
    "MatrixPowerReport",
    "matrix_power",
    "shampoo_stats",
    "shampoo_precondition",
    "per_sample_grads",
    "per_sample_grad_norms",
    "dp_clipped_grad_sum",
]

_METHODS = {"auto": MATPOW_AUTO, "eigh": MATPOW_EIGH, "newton": MATPOW_NEWTON}
_METHOD_NAMES = {v: k for k, v in _METHODS.items()}

#: Default Newton tolerances (``max |M - I|``), per dtype.
DEFAULT_TOL_F32 = 1e-5
DEFAULT_TOL_F64 = 1e-12
DEFAULT_TOL_TF32 = 3e-2


@dataclass(frozen=True)
class MatrixPowerReport:
    """What :func:`matrix_power` did (``fk_matpow_report``).

    Attributes:
        method: ``"eigh"`` or ``"newton"``, the method that produced the result.
        iterations: Newton iterations run (0 for the eigendecomposition).
        converged: every matrix converged (Newton: residual <= tol, or tol <= 0;
            eigh: the solver reported success).
        residual: Newton's largest ``max |M - I|`` over the batch after the last
            checked iteration; NaN when unchecked (tol <= 0) and for eigh.
        min_eigenvalue: eigh: the smallest eigenvalue of ``A + eps I`` over the
            batch (below ``eps`` means the spectrum was shifted); NaN for Newton.
    """

    method: str
    iterations: int
    converged: bool
    residual: float
    min_eigenvalue: float

    @classmethod
    def from_c(cls, r: fk_matpow_report) -> "MatrixPowerReport":
        return cls(
            method=_METHOD_NAMES.get(int(r.method), str(int(r.method))),
            iterations=int(r.iterations),
            converged=bool(r.converged),
            residual=float(r.residual),
            min_eigenvalue=float(r.min_eigenvalue),
        )


def _real(value, where: str, name: str) -> float:
    """A Python float from a real number, numpy scalar or 0-d tensor
    (InvalidArgumentError otherwise; NaN and infinities go through, for the library
    to judge)."""
    if value is None or isinstance(value, (bool, complex, str, bytes)):
        raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} must be a real number, got {type(value).__name__}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} must be a real number, got {type(value).__name__}")


def _int32(value, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} must be an integer, got {type(value).__name__}")
    v = int(value)
    if not -(2**31) <= v < 2**31:
        raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} = {v} does not fit in an int32")
    return v


def _method(method, where: str) -> int:
    if isinstance(method, str):
        key = method.lower()
        if key not in _METHODS:
            raise_error(
                ERROR_INVALID_ARGUMENT, where, f"method = {method!r}; choose 'auto', 'eigh' or 'newton'"
            )
        return _METHODS[key]
    # integers (FK_MATPOW_*) go to the library, which names an unknown one
    return _int32(method, where, "method")


def _flags(allow_tf32) -> int:
    return GEMM_ALLOW_TF32 if allow_tf32 else 0


def _dims(b) -> tuple:
    return tuple(int(s) for s in b.shape)


def _finish(inv: Invocation, *written):
    """``inv.result()``, and torch's version counter bumped on every caller-given
    torch output (Invocation bumps only the last ``out`` it adapted)."""
    last = getattr(inv, "_torch_out", None)
    inv.result()
    torch = _torch()
    inc = getattr(getattr(getattr(torch, "autograd", None), "graph", None), "increment_version", None)
    if inc is None:
        return
    for t in written:
        if t is not None and t is not last and _is_torch_tensor(t):
            inc(t)


def _default_tol(dtype: DType, allow_tf32: bool) -> float:
    if dtype == DType.float64:
        return DEFAULT_TOL_F64
    return DEFAULT_TOL_TF32 if allow_tf32 else DEFAULT_TOL_F32


def matrix_power(a, power, eps=0.0, *, method="auto", max_iter=100, tol=None, allow_tf32=False, out=None,
                 stream=None, return_report=False):
    """``out = (a + eps I)^power`` for symmetric positive semi-definite ``a``
    ``[n, n]`` or ``[batch, n, n]`` (float32 or float64).

    - ``method``: ``"auto"`` (Newton for inverse roots of matrices larger than 32
      on CUDA, falling back to the eigendecomposition when it does not converge;
      the eigendecomposition otherwise), ``"eigh"`` (any real power; only the upper
      triangle of ``a`` is read; an indefinite spectrum is shifted up to ``eps``)
      or ``"newton"`` (inverse roots ``power = -1/p``, integer ``1 <= p <= 64``;
      ``a + eps I`` must be positive definite). The ``MATPOW_*`` integers work too.
    - ``max_iter`` (Newton, >= 1) and ``tol``: Newton stops when every matrix has
      ``max |M - I| <= tol``. ``tol=None`` picks 1e-12 for float64, 1e-5 for
      float32, 3e-2 for float32 with ``allow_tf32`` (the strict residual of a TF32 result). ``tol <= 0`` runs exactly
      ``max_iter`` iterations without checking (fully asynchronous on CUDA; a
      checked run waits for the stream every iteration).
    - ``return_report=True`` returns ``(out, MatrixPowerReport)``.

    A Newton run that misses ``tol`` raises :class:`fusekit.NotConvergedError`
    with ``.report`` (the :class:`MatrixPowerReport`) and ``.out`` (the array
    holding the last iterate); ``method="auto"`` never does (it recomputes with
    the eigendecomposition).
    """
    where = "fusekit.matrix_power"
    p = _real(power, where, "power")
    e = _real(eps, where, "eps")
    m = _method(method, where)
    it = _int32(max_iter, where, "max_iter")
    tol = None if tol is None else _real(tol, where, "tol")
    if stream is None and _plain(a, out):
        return _route.optim.matrix_power(where, a, p, e, m, it, tol, allow_tf32, out, return_report)
    with Invocation(where, stream) as inv:
        A = inv.input(a, "a")
        O = inv.output(out, "out", _dims(A), A.dtype)
        result = inv.output_array
        t = _default_tol(A.dtype, allow_tf32) if tol is None else tol
        rep = fk_matpow_report()
        try:
            lib().fk_matrix_power(A.handle, p, e, m, it, t, _flags(allow_tf32), O.handle, byref(rep),
                                  inv.stream_handle)
        except NotConvergedError as err:
            err.report = MatrixPowerReport.from_c(rep)
            err.out = result
            inv.result()
            raise
        inv.result()
        return (result, MatrixPowerReport.from_c(rep)) if return_report else result


def shampoo_stats(grad, l=None, r=None, alpha=1.0, beta=1.0, *, allow_tf32=False, stream=None):  # noqa: E741
    """Shampoo statistics, in place: ``l = beta l + alpha grad grad^T`` and
    ``r = beta r + alpha grad^T grad`` (``alpha = beta = 1`` accumulates;
    ``beta = decay, alpha = 1 - decay`` is the exponential moving average).

    ``grad`` ``[m, n]`` or ``[batch, m, n]``; ``l`` ``[(batch,) m, m]`` and ``r``
    ``[(batch,) n, n]``, each optional (None = not updated) but not both. Only
    their upper triangle is read (nothing with ``beta = 0``); both triangles are
    written, exactly symmetric. Returns ``(l, r)`` (None where not given).

    ``allow_tf32``: float32 on CUDA, the products on TF32 tensor cores (each
    element of ``grad`` rounded to TF32 once, sums in float32: the statistics of
    the rounded gradient, about 1e-3 relative error per element)."""
    where = "fusekit.shampoo_stats"
    sa, sb = _real(alpha, where, "alpha"), _real(beta, where, "beta")
    if stream is None and _plain(grad, l, r):
        return _route.optim.shampoo_stats(where, grad, l, r, sa, sb, allow_tf32)
    with Invocation(where, stream) as inv:
        G = inv.input(grad, "grad")
        L = inv.output(l, "l", None, G.dtype) if l is not None else None
        R = inv.output(r, "r", None, G.dtype) if r is not None else None
        lib().fk_shampoo_stats_ex(G.handle, sa, sb, L.handle if L else None, R.handle if R else None,
                                  _flags(allow_tf32), inv.stream_handle)
        _finish(inv, l, r)
        return l, r


def shampoo_precondition(grad, l_root=None, r_root=None, *, out=None, allow_tf32=False, stream=None):
    """``out = l_root grad r_root``: ``grad`` ``[m, n]`` or ``[batch, m, n]``,
    ``l_root`` ``[m, m]`` and ``r_root`` ``[n, n]`` (or with grad's batch, or a
    batch of 1 shared by all), each optional (None = the identity), e.g. from
    :func:`matrix_power` with ``power = -1/4``. ``out`` has grad's shape."""
    where = "fusekit.shampoo_precondition"
    if stream is None and _plain(grad, l_root, r_root, out):
        return _route.optim.shampoo_precondition(where, grad, l_root, r_root, out, allow_tf32)
    with Invocation(where, stream) as inv:
        G = inv.input(grad, "grad")
        Lh = inv.input(l_root, "l_root").handle if l_root is not None else None
        Rh = inv.input(r_root, "r_root").handle if r_root is not None else None
        O = inv.output(out, "out", _dims(G), G.dtype)
        lib().fk_shampoo_precondition(Lh, G.handle, Rh, O.handle, _flags(allow_tf32), inv.stream_handle)
        return inv.result()


def _psg_dims(A, G) -> tuple[int, int, int]:
    """(B, in, out) of per-sample inputs ``a [B, (T,) in]``, ``g [B, (T,) out]``
    (0 where a shape is too short: the C call then reports it)."""
    sa, sg = _dims(A), _dims(G)
    b = sa[0] if sa else 0
    din = sa[-1] if len(sa) >= 2 else 0
    dout = sg[-1] if len(sg) >= 2 else 0
    return b, din, dout


def per_sample_grads(a, g, *, out=None, allow_tf32=False, stream=None):
    """Per-sample gradients of a linear layer ``y = a W^T``, materialised:
    ``out[b] = g_b^T a_b`` ``[B, out, in]`` from activations ``a`` ``[B, in]`` or
    ``[B, T, in]`` and output gradients ``g`` ``[B, out]`` or ``[B, T, out]``
    (sequences sum over T). ``allow_tf32`` applies to sequences (one step is an
    exact outer product)."""
    where = "fusekit.per_sample_grads"
    if stream is None and _plain(a, g, out):
        return _route.optim.per_sample_grads(where, a, g, out, allow_tf32)
    with Invocation(where, stream) as inv:
        A = inv.input(a, "a")
        G = inv.input(g, "g")
        b, din, dout = _psg_dims(A, G)
        O = inv.output(out, "out", (b, dout, din), A.dtype)
        lib().fk_per_sample_grads(A.handle, G.handle, O.handle, _flags(allow_tf32), inv.stream_handle)
        return inv.result()


def per_sample_grad_norms(a, g, *, out=None, stream=None):
    """Squared Frobenius norms ``|g_b^T a_b|_F^2`` ``[B]`` of the per-sample
    gradients, without materialising them (``a``, ``g`` as
    :func:`per_sample_grads`)."""
    where = "fusekit.per_sample_grad_norms"
    if stream is None and _plain(a, g, out):
        return _route.optim.per_sample_grad_norms(where, a, g, out)
    with Invocation(where, stream) as inv:
        A = inv.input(a, "a")
        G = inv.input(g, "g")
        b, _, _ = _psg_dims(A, G)
        O = inv.output(out, "sq_norms", (b,), A.dtype)
        lib().fk_per_sample_grad_norms(A.handle, G.handle, O.handle, inv.stream_handle)
        return inv.result()


def dp_clipped_grad_sum(a, g, max_norm, *, out=None, sq_norms=None, allow_tf32=False, stream=None):
    """The DP-SGD clipped sum ``out = sum_b min(1, max_norm / |G_b|_F) G_b``
    ``[out, in]`` with ``G_b = g_b^T a_b`` (``a``, ``g`` as
    :func:`per_sample_grads`), never materialising the ``G_b``; a zero gradient
    keeps factor 1. ``max_norm``: finite, >= 0.

    ``sq_norms``: None (not wanted; returns ``out``), True (allocated) or a ``[B]``
    array to write: then returns ``(out, sq_norms)`` with ``|G_b|_F^2``."""
    where = "fusekit.dp_clipped_grad_sum"
    c = _real(max_norm, where, "max_norm")
    want_norms = sq_norms is not None and sq_norms is not False
    given_norms = None if sq_norms is None or isinstance(sq_norms, bool) else sq_norms
    if stream is None and _plain(a, g, out, given_norms):
        return _route.optim.dp_clipped_grad_sum(where, a, g, c, out, sq_norms, allow_tf32)
    with Invocation(where, stream) as inv:
        A = inv.input(a, "a")
        G = inv.input(g, "g")
        b, din, dout = _psg_dims(A, G)
        O = inv.output(out, "out", (dout, din), A.dtype)
        out_res = inv.output_array
        N = None
        norms_res = None
        if want_norms:
            N = inv.output(None if sq_norms is True else sq_norms, "sq_norms", (b,), A.dtype)
            norms_res = inv.output_array
        lib().fk_dp_clipped_grad_sum(A.handle, G.handle, c, O.handle, N.handle if N else None,
                                     _flags(allow_tf32), inv.stream_handle)
        _finish(inv, out, None if sq_norms is True else sq_norms)
        return (out_res, norms_res) if want_norms else out_res


#: C entry point -> Python wrapper (checked by tests/test_bindings_complete.py).
ENTRY_POINTS = {
    "fk_matrix_power": matrix_power,
    "fk_shampoo_stats": shampoo_stats,
    "fk_shampoo_stats_ex": shampoo_stats,
    "fk_shampoo_precondition": shampoo_precondition,
    "fk_per_sample_grads": per_sample_grads,
    "fk_per_sample_grad_norms": per_sample_grad_norms,
    "fk_dp_clipped_grad_sum": dp_clipped_grad_sum,
}
