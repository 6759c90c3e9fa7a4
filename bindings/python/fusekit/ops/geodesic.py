"""Geodesic flow ops (docs/ops.md section 5, include/fusekit.h): one function per C
entry point.

Inputs (numpy arrays, torch tensors on the CPU or CUDA, fusekit Buffers, DLPack
producers; float32 or float64, one dtype for all, contiguous): ``v, x, f, g``
``[B, D]``, ``U, W`` ``[D, R]``, ``mu`` ``[D]``. Results are the caller's kind of
array (torch in, torch out).

- Christoffel: ``p = v U``, ``s = p*p``, ``gamma = clamp(s W^T, -c, c)`` (``c``
  defaults to 5.0; ``c = inf`` disables clamping).
- Leapfrog (kick-drift-kick), ``steps`` fused::

      vh = v + 0.5*dt*(f - Gamma(v) - mu*v)
      x  = x + dt*vh
      v  = vh + 0.5*dt*(f - Gamma(vh) - mu*vh)

  ``f`` (constant force) and ``mu`` (per-feature friction) are optional (None = 0).

The backwards return a tuple of gradients, ``None`` for each one not asked for
(``want``). ``flags``: 0, ``GEO_ALLOW_TF32``, ``GEO_ALLOW_TF32X3`` (the leapfrog
forward: 3xTF32 tensor-core products, f32-level accuracy) and/or ``GEO_FORCE_GENERIC``.
On torch tensors the functions run the compiled ops (``fusekit.torch.geodesic``,
which also holds the differentiable versions).
"""

from __future__ import annotations

from .._core import Invocation
from .._lib import GEO_ALLOW_TF32, GEO_ALLOW_TF32X3, GEO_FORCE_GENERIC, lib
from .._route import plain as _plain  # torch tensors: the compiled ops
from .._route import route as _route  # _route.geodesic: fusekit.torch.geodesic


__all__ = [
    "DEFAULT_C",
    "GEO_ALLOW_TF32",
    "GEO_ALLOW_TF32X3",
    "GEO_FORCE_GENERIC",
    "christoffel_forward",
    "christoffel_backward",
    "leapfrog_forward",
    "leapfrog_backward",
]

#: Default clamp of the Christoffel term (the source model's value).
DEFAULT_C = 5.0


def _dims(b, n: int) -> tuple:
    """The first ``n`` extents (0 where the buffer has fewer: the C call then
    reports the shape)."""
    shape = tuple(int(s) for s in b.shape)
    return tuple(shape[i] if i < len(shape) else 0 for i in range(n))


def _opt(inv: Invocation, obj, name: str):
    """The handle of an optional input (None for None)."""
    return None if obj is None else inv.input(obj, name).handle


def _wanted(where: str, want, names) -> tuple:
    want = (want,) if isinstance(want, str) else tuple(want)
    unknown = [w for w in want if w not in names]
    if unknown:
        raise ValueError(f"{where}: want names unknown gradients {unknown}; choose from {list(names)}")
    return tuple(n in want for n in names)


def christoffel_forward(v, U, W, c: float = DEFAULT_C, flags: int = 0, *, out=None, stream=None):
    """``gamma = clamp((v U)**2 W^T, -c, c)``, ``[B, D]`` (``out`` may be ``v``)."""
    if stream is None and _plain(v, U, W, out):
        return _route.geodesic.christoffel_forward("fusekit.christoffel_forward", v, U, W, c, flags, out)
    with Invocation("fusekit.christoffel_forward", stream) as inv:
        V = inv.input(v, "v")
        Uh = inv.input(U, "U")
        Wh = inv.input(W, "W")
        O = inv.output(out, "gamma", tuple(V.shape), V.dtype)
        lib().fk_christoffel_forward(V.handle, Uh.handle, Wh.handle, float(c), int(flags), O.handle,
                                     inv.stream_handle)
        return inv.result()


def christoffel_backward(
    v, U, W, g, c: float = DEFAULT_C, flags: int = 0, *, want=("v", "U", "W"), out=None, stream=None
):
    """Given ``g = dL/dgamma [B, D]``: ``(dv [B, D], dU [D, R], dW [D, R])``, None for
    a gradient not in ``want``. ``out``: optional 3-tuple of output arrays."""
    where = "fusekit.christoffel_backward"
    wanted = _wanted(where, want, ("v", "U", "W"))
    if stream is None and _plain(v, U, W, g, *(out or ())):
        return _route.geodesic.christoffel_backward(where, v, U, W, g, c, flags, wanted, out)
    with Invocation(where, stream) as inv:
        V = inv.input(v, "v")
        Uh = inv.input(U, "U")
        Wh = inv.input(W, "W")
        G = inv.input(g, "g")
        specs = (("dv", tuple(V.shape)), ("dU", tuple(Uh.shape)), ("dW", tuple(Wh.shape)))
        handles, arrays = inv.outputs(specs, V.dtype, wanted, out)
        lib().fk_christoffel_backward(V.handle, Uh.handle, Wh.handle, G.handle, float(c), int(flags), *handles,
                                      inv.stream_handle)
        inv.result()
        return tuple(arrays)


def leapfrog_forward(
    x0, v0, U, W, dt: float, steps: int, f=None, mu=None, c: float = DEFAULT_C, flags: int = 0, *,
    traj=False, out=None, stream=None
):
    """``steps`` fused leapfrog steps from ``(x0, v0)``: ``(x_T, v_T)``, or
    ``(x_T, v_T, traj)`` when ``traj`` is True (allocated here) or an array
    ``[steps, 2, B, D]`` to write (``traj[t][0] = x``, ``traj[t][1] = v`` after step
    t; pass it to :func:`leapfrog_backward`). ``out``: optional ``(x_out, v_out)``
    (``x_out`` may be ``x0`` and ``v_out`` ``v0``)."""
    traj_given = traj is not None and not isinstance(traj, bool)
    if stream is None and _plain(x0, v0, U, W, f, mu, *(out or ()), traj if traj_given else None):
        return _route.geodesic.leapfrog_forward("fusekit.leapfrog_forward", x0, v0, U, W, dt, steps, f, mu, c, flags,
                                                traj, out)
    with Invocation("fusekit.leapfrog_forward", stream) as inv:
        X = inv.input(x0, "x0")
        V = inv.input(v0, "v0")
        fh = _opt(inv, f, "f")
        Uh = inv.input(U, "U")
        Wh = inv.input(W, "W")
        muh = _opt(inv, mu, "mu")
        b, d = _dims(V, 2)
        specs = [("x_out", tuple(X.shape)), ("v_out", tuple(V.shape))]
        outs = list(out) if out is not None else [None, None]
        if len(outs) != 2:
            raise ValueError(f"{inv.where}: out must hold 2 entries (x_out, v_out)")
        want_traj = traj is not None and traj is not False
        if want_traj:
            specs.append(("traj", (int(steps), 2, b, d)))
            outs.append(None if traj is True else traj)
        handles, arrays = inv.outputs(specs, V.dtype, (True,) * len(specs), outs)
        if not want_traj:
            handles.append(None)
        lib().fk_leapfrog_forward(
            X.handle, V.handle, fh, Uh.handle, Wh.handle, muh, float(dt), int(steps), float(c), int(flags),
            *handles, inv.stream_handle
        )
        inv.result()
        return tuple(arrays)


def leapfrog_backward(
    v0, U, W, dt: float, steps: int, gx, gv, f=None, mu=None, traj=None, c: float = DEFAULT_C, flags: int = 0, *,
    want=("x0", "v0", "f", "U", "W"), out=None, stream=None
):
    """Gradients of a loss ``L(x_T, v_T)`` of :func:`leapfrog_forward` (same ``v0, f,
    U, W, mu, dt, steps, c``), given ``gx = dL/dx_T`` and ``gv = dL/dv_T`` (each may
    be None = zero): ``(dx0, dv0, df, dU, dW)``, None for a gradient not in
    ``want``. ``traj``: the forward's trajectory (optional; without it the states
    are recomputed). ``out``: optional 5-tuple of output arrays."""
    where = "fusekit.leapfrog_backward"
    wanted = _wanted(where, want, ("x0", "v0", "f", "U", "W"))
    if stream is None and _plain(v0, U, W, f, mu, traj, gx, gv, *(out or ())):
        return _route.geodesic.leapfrog_backward(where, v0, U, W, dt, steps, gx, gv, f, mu, traj, c, flags, wanted,
                                                 out)
    with Invocation(where, stream) as inv:
        V = inv.input(v0, "v0")
        fh = _opt(inv, f, "f")
        Uh = inv.input(U, "U")
        Wh = inv.input(W, "W")
        muh = _opt(inv, mu, "mu")
        th = _opt(inv, traj, "traj")
        gxh = _opt(inv, gx, "gx")
        gvh = _opt(inv, gv, "gv")
        bd = tuple(V.shape)
        specs = (("dx0", bd), ("dv0", bd), ("df", bd), ("dU", tuple(Uh.shape)), ("dW", tuple(Wh.shape)))
        handles, arrays = inv.outputs(specs, V.dtype, wanted, out)
        lib().fk_leapfrog_backward(
            V.handle, fh, Uh.handle, Wh.handle, muh, float(dt), int(steps), float(c), int(flags), th, gxh, gvh,
            *handles, inv.stream_handle
        )
        inv.result()
        return tuple(arrays)


ENTRY_POINTS = {
    "fk_christoffel_forward": christoffel_forward,
    "fk_christoffel_backward": christoffel_backward,
    "fk_leapfrog_forward": leapfrog_forward,
    "fk_leapfrog_backward": leapfrog_backward,
}
