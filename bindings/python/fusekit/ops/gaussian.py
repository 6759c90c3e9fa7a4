"""Gaussian field ops (docs/ops.md section 3, docs/gaussian.md): one function per C
entry point.

Inputs (numpy arrays, torch tensors on the CPU or CUDA, fusekit Buffers, DLPack
producers; float32 or float64, one dtype for all, contiguous): ``points [B,3]``,
``means [N,3]``, ``chol [N,3,3]`` (lower-triangular Cholesky factors; the upper
part is ignored), ``weights [N]``; ``eps`` (default 1e-6) is added to the diagonal
of every factor. Results are the caller's kind of array (torch in, torch out).

The backwards return a tuple of gradients, ``None`` for each one not asked for
(``needs``). On CUDA they need a workspace: by default it is allocated here (a
torch tensor from torch's caching allocator for torch inputs), or pass
``workspace=`` (any contiguous array of at least
``gaussian_backward_workspace_size(...)`` bytes) to reuse one. On torch tensors
the functions run the compiled ops (``fusekit.torch.gaussian``, which also holds
the differentiable versions).
"""

from __future__ import annotations

from ctypes import byref, c_size_t

from .._core import DType, Invocation, as_dtype, default_context
from .._lib import lib
from .._route import plain as _plain  # torch tensors: the compiled ops
from .._route import route as _route  # _route.gaussian: fusekit.torch.gaussian


__all__ = [
    "DEFAULT_EPS",
    "mahalanobis_forward",
    "mahalanobis_backward",
    "gaussian_field_forward",
    "gaussian_field_backward",
    "gaussian_backward_workspace_size",
]

#: ``FK_GAUSSIAN_DEFAULT_EPS``.
DEFAULT_EPS = 1e-6


def _lead(b) -> int:
    """The first extent (0 for a 0-d buffer: the C call then reports the shape)."""
    return int(b.shape[0]) if len(b.shape) else 0


def _workspace(inv: Invocation, workspace, dtype, b: int, n: int):
    if workspace is not None:
        return inv.input(workspace, "workspace").handle
    size = c_size_t()
    lib().fk_gaussian_backward_workspace_size(inv.ctx.handle, int(dtype), b, n, byref(size))
    if size.value == 0:
        return None
    return inv.output(None, "workspace", ((size.value + 3) // 4,), DType.float32).handle


def gaussian_backward_workspace_size(context, dtype, num_points: int, num_gaussians: int) -> int:
    """Bytes of workspace the backwards need on ``context`` (a fusekit.Context or a
    device string such as ``"cuda"``) for ``dtype`` (float32 or float64): 0 on the
    CPU; O(sqrt(B N)) on CUDA, never O(B N)."""
    ctx = default_context(context)
    dt = as_dtype(dtype, "fusekit.gaussian_backward_workspace_size")
    size = c_size_t()
    lib().fk_gaussian_backward_workspace_size(ctx.handle, int(dt), int(num_points), int(num_gaussians), byref(size))
    return size.value


def mahalanobis_forward(points, means, chol, eps: float = DEFAULT_EPS, *, out=None, stream=None):
    """Squared Mahalanobis distances ``m[b,n] = |(L_n + eps I)^-1 (p_b - mu_n)|^2``, ``[B,N]``."""
    if stream is None and _plain(points, means, chol, out):
        return _route.gaussian.mahalanobis_forward("fusekit.mahalanobis_forward", points, means, chol, eps, out)
    with Invocation("fusekit.mahalanobis_forward", stream) as inv:
        P = inv.input(points, "points")
        M = inv.input(means, "means")
        L = inv.input(chol, "chol")
        O = inv.output(out, "out", (_lead(P), _lead(M)), P.dtype)
        lib().fk_mahalanobis_forward(P.handle, M.handle, L.handle, float(eps), O.handle, inv.stream_handle)
        return inv.result()


def mahalanobis_backward(
    points, means, chol, g, eps: float = DEFAULT_EPS, *, needs=(True, True, True), out=None, workspace=None,
    stream=None
):
    """Given ``g = dL/dm [B,N]``: ``(dpoints [B,3], dmeans [N,3], dchol [N,3,3])``
    (exact full lower triangle of dchol; its upper part is 0)."""
    if stream is None and _plain(points, means, chol, g, workspace, *(out or ())):
        return _route.gaussian.mahalanobis_backward("fusekit.mahalanobis_backward", points, means, chol, g, eps,
                                                    needs, out, workspace)
    with Invocation("fusekit.mahalanobis_backward", stream) as inv:
        P = inv.input(points, "points")
        M = inv.input(means, "means")
        L = inv.input(chol, "chol")
        G = inv.input(g, "g")
        b, n = _lead(P), _lead(M)
        specs = (("dpoints", (b, 3)), ("dmeans", (n, 3)), ("dchol", (n, 3, 3)))
        handles, arrays = inv.outputs(specs, P.dtype, needs, out)
        ws = _workspace(inv, workspace, P.dtype, b, n) if any(h is not None for h in handles) else None
        lib().fk_mahalanobis_backward(
            P.handle, M.handle, L.handle, float(eps), G.handle, *handles, ws, inv.stream_handle
        )
        inv.result()
        return tuple(arrays)


def gaussian_field_forward(points, means, chol, weights, eps: float = DEFAULT_EPS, *, out=None, stream=None):
    """``out[b] = sum_n weights[n] exp(-0.5 m[b,n])``, ``[B]``, fused (no ``[B,N]`` array)."""
    if stream is None and _plain(points, means, chol, weights, out):
        return _route.gaussian.field_forward("fusekit.gaussian_field_forward", points, means, chol, weights, eps, out)
    with Invocation("fusekit.gaussian_field_forward", stream) as inv:
        P = inv.input(points, "points")
        M = inv.input(means, "means")
        L = inv.input(chol, "chol")
        W = inv.input(weights, "weights")
        O = inv.output(out, "out", (_lead(P),), P.dtype)
        lib().fk_gaussian_field_forward(
            P.handle, M.handle, L.handle, W.handle, float(eps), O.handle, inv.stream_handle
        )
        return inv.result()


def gaussian_field_backward(
    points, means, chol, weights, dout, eps: float = DEFAULT_EPS, *, needs=(True, True, True, True), out=None,
    workspace=None, stream=None
):
    """Given ``dout = dL/dout [B]``: ``(dpoints, dmeans, dchol, dweights)``, fused."""
    if stream is None and _plain(points, means, chol, weights, dout, workspace, *(out or ())):
        return _route.gaussian.field_backward("fusekit.gaussian_field_backward", points, means, chol, weights, dout,
                                              eps, needs, out, workspace)
    with Invocation("fusekit.gaussian_field_backward", stream) as inv:
        P = inv.input(points, "points")
        M = inv.input(means, "means")
        L = inv.input(chol, "chol")
        W = inv.input(weights, "weights")
        D = inv.input(dout, "dout")
        b, n = _lead(P), _lead(M)
        specs = (("dpoints", (b, 3)), ("dmeans", (n, 3)), ("dchol", (n, 3, 3)), ("dweights", (n,)))
        handles, arrays = inv.outputs(specs, P.dtype, needs, out)
        ws = _workspace(inv, workspace, P.dtype, b, n) if any(h is not None for h in handles) else None
        lib().fk_gaussian_field_backward(
            P.handle, M.handle, L.handle, W.handle, float(eps), D.handle, *handles, ws, inv.stream_handle
        )
        inv.result()
        return tuple(arrays)


ENTRY_POINTS = {
    "fk_mahalanobis_forward": mahalanobis_forward,
    "fk_mahalanobis_backward": mahalanobis_backward,
    "fk_gaussian_field_forward": gaussian_field_forward,
    "fk_gaussian_field_backward": gaussian_field_backward,
    "fk_gaussian_backward_workspace_size": gaussian_backward_workspace_size,
}
