"""The optimizer-math family on torch (``fusekit/csrc/optim.cpp``): the tensor
route of the plain functions of ``fusekit.ops.optim`` (:func:`matrix_power`,
:func:`shampoo_stats`, :func:`shampoo_precondition`, :func:`per_sample_grads`,
:func:`per_sample_grad_norms`, :func:`dp_clipped_grad_sum`), each its C entry
point through an in-place op. These ops have no backward (no autograd formula):
``fusekit.optim.Shampoo`` and ``fusekit.privacy.DPSGD`` call them on detached
tensors.
"""

import torch

from .._core import as_dtype
from .._lib import NotConvergedError, fk_matpow_report
from ..ops.optim import MatrixPowerReport, _default_tol, _flags, _psg_dims
from ._register import d, new, no_output, register, run

__all__ = []

_matrix_power_out = register("matrix_power_out", fake=no_output)
_shampoo_stats_ = register("shampoo_stats_", fake=no_output)
_shampoo_precondition_out = register("shampoo_precondition_out", fake=no_output)
_per_sample_grads_out = register("per_sample_grads_out", fake=no_output)
_per_sample_grad_norms_out = register("per_sample_grad_norms_out", fake=no_output)
_dp_clipped_grad_sum_out = register("dp_clipped_grad_sum_out", fake=no_output)


def _report(t) -> MatrixPowerReport:
    """The report tensor of ``fusekit::matrix_power_out`` (method, iterations,
    converged, residual, min_eigenvalue) as a :class:`MatrixPowerReport`."""
    v = t.tolist()
    rep = fk_matpow_report()
    rep.method, rep.iterations, rep.converged = int(v[0]), int(v[1]), int(v[2])
    rep.residual, rep.min_eigenvalue = v[3], v[4]
    return MatrixPowerReport.from_c(rep)


def matrix_power(where: str, a, p: float, e: float, m: int, it: int, tol, allow_tf32: bool, out, return_report: bool):
    """``fusekit.matrix_power`` on tensors (``tol`` None: the dtype's default)."""
    A = d(a)
    O = out if out is not None else new(A.shape, A)
    t = _default_tol(as_dtype(A.dtype), allow_tf32) if tol is None else tol
    rep = torch.zeros(5, dtype=torch.float64)
    try:
        run(where, _matrix_power_out, (A, p, e, m, it, t, _flags(allow_tf32), O, rep), (out,))
    except NotConvergedError as err:
        err.report, err.out = _report(rep), O
        raise
    return (O, _report(rep)) if return_report else O


def shampoo_stats(where: str, grad, l, r, alpha: float, beta: float, allow_tf32: bool):  # noqa: E741
    """``fusekit.shampoo_stats`` on tensors (``l``, ``r`` updated in place)."""
    run(where, _shampoo_stats_, (d(grad), l, r, alpha, beta, _flags(allow_tf32)), (l, r))
    return l, r


def shampoo_precondition(where: str, grad, l_root, r_root, out, allow_tf32: bool):
    """``fusekit.shampoo_precondition`` on tensors."""
    G = d(grad)
    O = out if out is not None else new(G.shape, G)
    run(where, _shampoo_precondition_out, (G, d(l_root), d(r_root), _flags(allow_tf32), O), (out,))
    return O


def per_sample_grads(where: str, a, g, out, allow_tf32: bool):
    """``fusekit.per_sample_grads`` on tensors."""
    A, G = d(a), d(g)
    b, din, dout = _psg_dims(A, G)
    O = out if out is not None else new((b, dout, din), A)
    run(where, _per_sample_grads_out, (A, G, _flags(allow_tf32), O), (out,))
    return O


def per_sample_grad_norms(where: str, a, g, out):
    """``fusekit.per_sample_grad_norms`` on tensors."""
    A, G = d(a), d(g)
    O = out if out is not None else new((_psg_dims(A, G)[0],), A)
    run(where, _per_sample_grad_norms_out, (A, G, O), (out,))
    return O


def dp_clipped_grad_sum(where: str, a, g, max_norm: float, out, sq_norms, allow_tf32: bool):
    """``fusekit.dp_clipped_grad_sum`` on tensors (``sq_norms``: None/False, True or
    a tensor): ``out``, or ``(out, sq_norms)``."""
    want_norms = sq_norms is not None and sq_norms is not False
    given_norms = None if sq_norms is None or isinstance(sq_norms, bool) else sq_norms
    A, G = d(a), d(g)
    b, din, dout = _psg_dims(A, G)
    O = out if out is not None else new((dout, din), A)
    N = (given_norms if given_norms is not None else new((b,), A)) if want_norms else None
    run(where, _dp_clipped_grad_sum_out, (A, G, max_norm, _flags(allow_tf32), O, N), (out, given_norms))
    return (O, N) if want_norms else O
