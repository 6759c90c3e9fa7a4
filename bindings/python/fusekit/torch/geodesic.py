"""The geodesic flow family on torch (``fusekit/csrc/geodesic.cpp``): the ops
under ``torch.ops.fusekit``, with fake tensors, autograd and ``torch.compile``:

- ``christoffel(v, U, W, c) -> gamma [B,D]``: differentiable with respect to ``v``,
  ``U``, ``W`` (through ``fk_christoffel_backward``);
- ``leapfrog(x0, v0, U, W, f, mu, dt, steps, c, keep_traj=True) -> (x_T, v_T, traj)``:
  differentiable with respect to ``x0``, ``v0``, ``U``, ``W`` and ``f`` (through
  ``fk_leapfrog_backward``; ``mu`` gets no gradient). With ``keep_traj`` the forward
  writes the trajectory ``traj [steps,2,B,D]`` and saves it for the backward
  (``steps*2*B*D`` extra elements, no recomputation); without, ``traj`` is empty
  (``[0,2,B,D]``) and a backward recomputes the trajectory on chip (slower, no extra
  memory). ``traj`` itself gets no gradient. The wrapper :func:`leapfrog` keeps it
  only where a gradient can be asked for (``save_traj``);
- ``christoffel_backward(v, U, W, g, c, want=7)`` and
  ``leapfrog_backward(v0, U, W, f, mu, traj, gx, gv, dt, steps, c, want=31)``: the
  fusekit backward kernels as their own ops (what the autograd formulas call).
  ``want`` is a bit mask of the gradients to compute (bit i: the i-th of
  ``CHR_GRADS`` / ``LF_GRADS`` below, the outputs' order; the kernels skip the
  products of the others, e.g. the dU, dW accumulations when U and W are frozen); a
  gradient not wanted comes back as an empty tensor.

::

    from fusekit.torch.geodesic import christoffel, leapfrog
    x, v = leapfrog(x0, v0, U, W, dt=0.1, steps=4, f=f)   # c defaults to 5.0
    (x.square().sum() + v.square().sum()).backward()

The tensor route of the plain functions of ``fusekit.ops.geodesic``
(:func:`christoffel_forward`, :func:`christoffel_backward`,
:func:`leapfrog_forward`, :func:`leapfrog_backward`) runs their C entry points
one to one through the ``*_out`` ops (every output given; None = not wanted).

**Precision** (the f32 forwards on CUDA; the CPU, float64 and the backwards are
always strict): :func:`christoffel` and :func:`leapfrog` take ``precision``, one
of :data:`PRECISIONS` (``"strict"``, ``"tf32x3"``, ``"tf32"``, the modes of
``fusekit.jax.precision_mode``), or None (default) to follow
``torch.get_float32_matmul_precision()`` through :func:`mode_for_torch_setting`:

===============  =========================  ===================================
torch setting    mode                       flags of the forwards
===============  =========================  ===================================
``"highest"``    ``"strict"``               0 (both)
``"high"``       ``"tf32x3"``               leapfrog ``GEO_ALLOW_TF32X3``;
                                            christoffel 0 (it has no 3xTF32)
``"medium"``     ``"tf32x3"`` (as "high")   as ``"high"``
===============  =========================  ===================================

``"tf32"`` (``GEO_ALLOW_TF32`` for both forwards; about 5e-4 relative error in the
Christoffel term) is only had by asking for it. The setting is read on every eager
call, and under ``torch.compile`` when the call is traced: torch.compile re-traces
when TF32 is switched on or off (its guard on global state), which is the only
change that alters this mapping. :func:`geo_flags` resolves ``precision`` and a raw ``flags``
word (``GEO_*`` bits, e.g. ``GEO_FORCE_GENERIC``) into the forward's flags;
docs/geodesic.md ("Precision in torch and JAX") gives the reasons.

This module gives the compiled kernels their fake implementations and autograd
formulas (``_register``). Double backward is not supported (the backward ops have
no autograd formula).
"""

from typing import Optional

import torch
from torch import Tensor

from ..ops.geodesic import DEFAULT_C, GEO_ALLOW_TF32, GEO_ALLOW_TF32X3, _dims
from ._register import d, eager_call, fused_autograd, new, no_output, outputs, register, run, want_bits

__all__ = ["christoffel", "leapfrog", "PRECISIONS", "TORCH_MODES", "mode_for_torch_setting", "precision_mode",
           "geo_flags"]


# --- precision: fusekit's modes and torch's float32 matmul setting --------------------

#: The values of ``precision`` (None: follow torch): strict f32, 3xTF32 where an op
#: has it (the leapfrog forward; strict elsewhere), TF32.
PRECISIONS = ("strict", "tf32x3", "tf32")

#: ``torch.get_float32_matmul_precision()`` -> mode. "medium" asks for bfloat16
#: products where a fast algorithm with them exists and otherwise for "high"
#: (torch's definition); the geodesic ops have none, so it is "high".
TORCH_MODES = {"highest": "strict", "high": "tf32x3", "medium": "tf32x3"}


def mode_for_torch_setting(setting: str) -> str:
    """The mode (one of :data:`PRECISIONS`) for a value of
    ``torch.get_float32_matmul_precision()``: "highest" -> "strict", "high" and
    "medium" -> "tf32x3" (:data:`TORCH_MODES`). Another value is a ValueError."""
    try:
        return TORCH_MODES[setting]
    except (KeyError, TypeError):
        raise ValueError(
            f"fusekit.torch.geodesic: torch's float32 matmul precision {setting!r} is not one of "
            f"{', '.join(map(repr, TORCH_MODES))}"
        ) from None


@torch.compiler.assume_constant_result
def _torch_setting() -> str:
    """``torch.get_float32_matmul_precision()``; under torch.compile a constant of the
    trace (torch's guard on global state re-traces when TF32 is switched on or off,
    the one change that alters the mode). Where the legacy and the new precision APIs
    were mixed torch refuses to name one setting; then the CUDA matmul backend's
    setting of the new API decides ("tf32": "high", else "highest")."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        p = torch.backends.cuda.matmul.fp32_precision
        if p == "none":  # inherited from the generic setting
            p = torch.backends.fp32_precision
        return "high" if p == "tf32" else "highest"


def _check_precision(where: str, precision) -> str:
    if isinstance(precision, str) and precision in PRECISIONS:
        return precision
    raise ValueError(
        f"{where}: precision must be None (follow torch.get_float32_matmul_precision()) or one of "
        f"{', '.join(map(repr, PRECISIONS))}, got {precision!r}"
    )


def precision_mode(precision: Optional[str] = None, where: str = "fusekit.torch.geodesic") -> str:
    """``precision`` checked (one of :data:`PRECISIONS`), or, when None, the mode of
    ``torch.get_float32_matmul_precision()`` (:func:`mode_for_torch_setting`), read
    now (eager) or when torch.compile traces the call."""
    if precision is None:
        return mode_for_torch_setting(_torch_setting())
    return _check_precision(where, precision)


def _effective(mode: str, x3: bool) -> str:
    """What a mode does to an op (``x3``: the op has 3xTF32, the leapfrog forward)."""
    return "strict" if mode == "tf32x3" and not x3 else mode


def _flags_mode(flags: int, x3: bool) -> str:
    """The mode a raw flags word gives an op (TF32 wins over 3xTF32, as in the C ABI)."""
    if flags & GEO_ALLOW_TF32:
        return "tf32"
    return "tf32x3" if flags & GEO_ALLOW_TF32X3 and x3 else "strict"


def geo_flags(precision: Optional[str] = None, flags: Optional[int] = None, *, x3: bool,
              where: str = "fusekit.torch.geodesic") -> int:
    """The ``flags`` word of a geodesic forward (``x3``: the op has 3xTF32, i.e. the
    leapfrog forward; the Christoffel forward has not).

    - ``flags`` given (raw ``GEO_*`` bits): used as given; with ``precision`` also
      given, the two must ask the op for the same mode, else a ValueError.
    - else ``precision`` (see :func:`precision_mode`; None follows torch): "tf32" ->
      ``GEO_ALLOW_TF32``, "tf32x3" -> ``GEO_ALLOW_TF32X3`` where ``x3``, else 0."""
    if flags is not None:
        if isinstance(flags, bool) or not isinstance(flags, int):
            raise TypeError(f"{where}: flags must be an int (GEO_* bits), not {type(flags).__name__}")
        if not 0 <= flags < 1 << 32:  # the C ABI's uint32_t; it rejects unknown bits itself
            raise ValueError(f"{where}: flags must be in [0, 2**32) (GEO_* bits), got {flags}")
        if precision is not None:
            asked, given = _effective(_check_precision(where, precision), x3), _flags_mode(flags, x3)
            if asked != given:
                raise ValueError(f"{where}: precision={precision!r} and flags={flags:#x} disagree "
                                 f"(the flags ask this op for {given!r}, the precision for {asked!r}); give one")
        return flags
    mode = _effective(precision_mode(precision, where), x3)
    return GEO_ALLOW_TF32 if mode == "tf32" else (GEO_ALLOW_TF32X3 if mode == "tf32x3" else 0)


# The backward ops' ``want`` bits: the Christoffel backward's gradients (v, U, W) and
# the leapfrog backward's (x0, v0, f, U, W), in their output order.
CHR_GRADS = ("v", "U", "W")
LF_GRADS = ("x0", "v0", "f", "U", "W")


# --- the plain functions' ops: the entry points one to one ---------------------------

_chr_fwd_out = register("christoffel_forward_out", fake=no_output)
_chr_bwd_out = register("christoffel_backward_out", fake=no_output)
_lf_fwd_out = register("leapfrog_forward_out", fake=no_output)
_lf_bwd_out = register("leapfrog_backward_out", fake=no_output)


def christoffel_forward(where: str, v, U, W, c: float, flags: int, out):
    """``fusekit.christoffel_forward`` on tensors."""
    V = d(v)
    O = out if out is not None else new(V.shape, V)
    run(where, _chr_fwd_out, (V, d(U), d(W), float(c), int(flags), O), (out,))
    return O


def christoffel_backward(where: str, v, U, W, g, c: float, flags: int, wanted, out):
    """``fusekit.christoffel_backward`` on tensors (``wanted``: flags in CHR_GRADS order)."""
    V, Ut, Wt = d(v), d(U), d(W)
    specs = (("dv", tuple(V.shape)), ("dU", tuple(Ut.shape)), ("dW", tuple(Wt.shape)))
    outs, given = outputs(where, specs, wanted, out, V)
    run(where, _chr_bwd_out, (V, Ut, Wt, d(g), float(c), int(flags), *outs), given)
    return tuple(outs)


def leapfrog_forward(where: str, x0, v0, U, W, dt: float, steps: int, f, mu, c: float, flags: int, traj, out):
    """``fusekit.leapfrog_forward`` on tensors (``traj``: False, True or a tensor)."""
    X, V = d(x0), d(v0)
    outs = list(out) if out is not None else [None, None]
    if len(outs) != 2:
        raise ValueError(f"{where}: out must hold 2 entries (x_out, v_out)")
    xo = outs[0] if outs[0] is not None else new(X.shape, X)
    vo = outs[1] if outs[1] is not None else new(V.shape, V)
    b, dd = _dims(V, 2)
    traj_given = traj is not None and not isinstance(traj, bool)
    T = traj if traj_given else (new((int(steps), 2, b, dd), V) if traj is True else None)
    run(where, _lf_fwd_out,
        (X, V, d(f), d(U), d(W), d(mu), float(dt), int(steps), float(c), int(flags), xo, vo, T),
        (outs[0], outs[1], traj if traj_given else None))
    return (xo, vo, T) if T is not None else (xo, vo)


def leapfrog_backward(where: str, v0, U, W, dt: float, steps: int, gx, gv, f, mu, traj, c: float, flags: int, wanted,
                      out):
    """``fusekit.leapfrog_backward`` on tensors (``wanted``: flags in LF_GRADS order)."""
    V, Ut, Wt = d(v0), d(U), d(W)
    bd = tuple(V.shape)
    specs = (("dx0", bd), ("dv0", bd), ("df", bd), ("dU", tuple(Ut.shape)), ("dW", tuple(Wt.shape)))
    outs, given = outputs(where, specs, wanted, out, V)
    run(where, _lf_bwd_out,
        (V, d(f), Ut, Wt, d(mu), float(dt), int(steps), float(c), int(flags), d(traj), d(gx), d(gv), *outs), given)
    return tuple(outs)


# --- fusekit::christoffel_backward ----------------------------------------------------


def _chr_bwd_fake(v, U, W, g, c, want=7):
    return tuple(t.new_empty(t.shape if want >> i & 1 else (0,)) for i, t in enumerate((v, U, W)))


register("christoffel_backward", fake=_chr_bwd_fake)


# --- fusekit::christoffel ------------------------------------------------------------------


def _chr_fake(v, U, W, c, flags=0):
    torch._check(v.dim() == 2, lambda: "fusekit::christoffel: v must be [B,D]")
    torch._check(U.dim() == 2 and W.dim() == 2, lambda: "fusekit::christoffel: U and W must be [D,R]")
    return v.new_empty(v.shape)


# (flags: the forward's only; the backward is strict)
_chr_setup, _chr_backward = fused_autograd(3, "christoffel_backward", forward_only=1)

_chr = eager_call(register("christoffel", fake=_chr_fake, backward=_chr_backward, setup_context=_chr_setup),
                  _chr_backward, _chr_setup, (0, 1, 2))


# --- fusekit::leapfrog_backward -------------------------------------------------------------


def _lf_bwd_fake(v0, U, W, f, mu, traj, gx, gv, dt, steps, c, want=31):
    return tuple(t.new_empty(t.shape if want >> i & 1 else (0,)) for i, t in enumerate((v0, v0, v0, U, W)))


register("leapfrog_backward", fake=_lf_bwd_fake)


# --- fusekit::leapfrog --------------------------------------------------------------------------


def _lf_fake(x0, v0, U, W, f, mu, dt, steps, c, keep_traj=True, flags=0):
    torch._check(v0.dim() == 2, lambda: "fusekit::leapfrog: v0 must be [B,D]")
    torch._check(steps >= 1, lambda: "fusekit::leapfrog: steps must be >= 1")
    b, d = v0.shape
    return x0.new_empty(x0.shape), v0.new_empty(v0.shape), v0.new_empty((steps if keep_traj else 0, 2, b, d))


def _lf_setup(ctx, inputs, output):
    x0, v0, U, W, f, mu, dt, steps, c, keep_traj, flags = inputs  # flags: the forward's only
    ctx.save_for_backward(v0, U, W, f, mu, output[2] if keep_traj else None)
    ctx.dt, ctx.steps, ctx.c = dt, steps, c


def _lf_backward(ctx, gx, gv, gtraj):
    v0, U, W, f, mu, traj = ctx.saved_tensors  # traj None: recomputed on chip
    need = ctx.needs_input_grad  # inputs (x0, v0, U, W, f, ...); outputs (x0, v0, f, U, W)
    want = want_bits((need[0], need[1], need[4], need[2], need[3]))
    dx0, dv0, df, dU, dW = torch.ops.fusekit.leapfrog_backward(
        v0, U, W, f, mu, traj, gx, gv, ctx.dt, ctx.steps, ctx.c, want
    )
    return (dx0 if need[0] else None, dv0 if need[1] else None, dU if need[2] else None, dW if need[3] else None,
            df if need[4] else None, None, None, None, None, None, None)


_lf = eager_call(register("leapfrog", fake=_lf_fake, backward=_lf_backward, setup_context=_lf_setup),
                 _lf_backward, _lf_setup, (0, 1, 2, 3, 4, 5), materialize=False)


# --- wrappers with the default c ----------------------------------------------------------------


def christoffel(v: Tensor, U: Tensor, W: Tensor, c: float = DEFAULT_C, *, precision: Optional[str] = None,
                flags: Optional[int] = None) -> Tensor:
    """Differentiable clamped Christoffel term ``[B,D]`` (``torch.ops.fusekit.christoffel``).

    ``precision``: "strict" or "tf32" (TF32 tensor cores for the f32 forward on
    CUDA); "tf32x3" is strict here (the op has no 3xTF32); None (default) follows
    ``torch.get_float32_matmul_precision()`` (see the module's table). ``flags``:
    the raw forward flags instead (``GEO_*``; see :func:`geo_flags`). The backward
    is strict."""
    return _chr(v, U, W, float(c), geo_flags(precision, flags, x3=False, where="fusekit.torch.geodesic.christoffel"))


def _keep_traj(save_traj: Optional[bool], return_traj: bool, differentiable) -> bool:
    """:func:`leapfrog`'s ``keep_traj``: asked for, or (None) whether a gradient can be."""
    if return_traj or save_traj:
        return True
    if save_traj is None:
        return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in differentiable)
    return False


def leapfrog(
    x0: Tensor, v0: Tensor, U: Tensor, W: Tensor, dt: float, steps: int, f: Optional[Tensor] = None,
    mu: Optional[Tensor] = None, c: float = DEFAULT_C, return_traj: bool = False,
    save_traj: Optional[bool] = None, *, precision: Optional[str] = None, flags: Optional[int] = None
):
    """Differentiable fused leapfrog (``torch.ops.fusekit.leapfrog``): ``(x_T, v_T)``,
    plus the trajectory ``[steps,2,B,D]`` when ``return_traj``.

    ``save_traj``: whether the forward writes the trajectory for the backward
    (``steps*2*B*D`` elements; the backward then reads it) or the backward recomputes
    it on chip (about 1.3x its time at the benchmark shape, no extra memory). The
    default (None) saves it exactly when a gradient can be asked for: grad mode on
    and one of ``x0, v0, U, W, f`` requiring grad; so inference (``torch.no_grad()``,
    or no input requiring grad) writes no trajectory. ``return_traj`` implies it.

    ``precision``: "strict", "tf32x3" (3xTF32 tensor-core products, f32-level
    accuracy) or "tf32" (TF32; 1.4e-4 relative at T = 8) for the f32 forward on
    CUDA; None (default) follows ``torch.get_float32_matmul_precision()`` (see the
    module's table). ``flags``: the raw forward flags instead (``GEO_*``;
    see :func:`geo_flags`). The backward, including a recomputed trajectory, is
    strict."""
    fl = geo_flags(precision, flags, x3=True, where="fusekit.torch.geodesic.leapfrog")
    keep = _keep_traj(save_traj, return_traj, (x0, v0, U, W, f))
    x, v, traj = _lf(x0, v0, U, W, f, mu, float(dt), int(steps), float(c), keep, fl)
    return (x, v, traj) if return_traj else (x, v)
