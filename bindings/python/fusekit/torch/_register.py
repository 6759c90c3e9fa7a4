"""What every family module of ``fusekit.torch`` uses, the same way, to give its
compiled ops (``fusekit/csrc/<family>.cpp``) their Python parts, and to run them.

- :func:`register`: every op of a family, once, at the family module's import:
  ``fake`` (the op's signature, returning empty tensors of the right shape, dtype
  and device: what ``torch.compile`` and FakeTensor tracing use; :func:`no_output`
  for the in-place ``*_out`` / ``*_`` ops) and, for a differentiable op,
  ``backward(ctx, *grads)`` with ``setup_context(ctx, inputs, output)``: the
  autograd formula, written with registered ops (``torch.ops.fusekit.*``, e.g.
  the fusekit backward kernel as its own op) or plain torch ops, so that it
  traces under ``torch.compile`` too. Returns the op's default overload.
- :func:`eager_call`: the user-facing wrapper of a differentiable op (same op,
  same formula, without torch's generic Python autograd kernel).
- The tensor route's helpers (:func:`d`, :func:`new`, :func:`outputs`,
  :func:`run`, :func:`call`): how a family runs a plain function
  (``fusekit.gemm`` & co.) on torch tensors through its ``*_out`` op.
- :func:`want_bits`, :func:`reduce_to`: pieces of the autograd formulas.

Importing this module imports torch and loads the extension (``_ext.load``;
ImportError with build instructions when it was not built). Check a new op with
``torch.library.opcheck`` and ``torch.autograd.gradcheck`` in float64 on the CPU,
as ``bindings/python/tests/test_torch_custom_ops.py`` does.
"""

from typing import Callable, Optional

import torch
from torch import Tensor

from .. import _lib
from . import _ext

__all__ = ["NAMESPACE", "register", "no_output", "eager_call", "want_bits", "fused_autograd", "reduce_to", "d", "new",
           "outputs", "run", "call", "check_out"]

NAMESPACE = "fusekit"

_ext.load()


def register(
    name: str,
    *,
    fake: Callable,
    backward: Optional[Callable] = None,
    setup_context: Optional[Callable] = None,
):
    """Gives the compiled op ``fusekit::<name>`` its fake (meta) implementation and,
    when ``backward`` is given, its autograd formula. Returns the op's default
    overload (callable; also reachable as ``torch.ops.fusekit.<name>``)."""
    qualname = f"{NAMESPACE}::{name}"
    torch.library.register_fake(qualname, fake)
    if backward is not None:
        torch.library.register_autograd(qualname, backward, setup_context=setup_context)
    return getattr(torch.ops.fusekit, name).default


def no_output(*args) -> None:
    """The fake of an op that writes its outputs in place and returns nothing."""
    return None


_below_autograd = torch._C._AutoDispatchBelowAutograd
_is_compiling = torch.compiler.is_compiling
def _fast_apply(fn_cls):
    """``fn_cls.apply`` without ``Function.apply``'s Python prologue, which binds the
    arguments through ``inspect.signature`` on every call (about 15 us) when
    ``setup_context`` is defined: every argument is passed positionally here, so
    the C++ ``apply`` of ``torch._C._FunctionBase`` is called directly. Under
    functorch transforms (vmap, grad, ...) the full ``apply`` runs."""
    try:
        from torch.autograd.function import _SingleLevelFunction

        raw = super(_SingleLevelFunction, fn_cls).apply
    except (ImportError, AttributeError):  # another torch layout: the public path
        return fn_cls.apply
    full = fn_cls.apply
    transforms_active = torch._C._are_functorch_transforms_active

    def apply(*args):
        if transforms_active():
            return full(*args)
        return raw(*args)

    return apply


def eager_call(op, backward: Callable, setup_context: Callable, grad_args: tuple, materialize: bool = True) -> Callable:
    """What the user-facing wrappers (``linear``, ``gaussian_field``, ...) call: the
    same compiled op with the same autograd formula, minus torch's generic Python
    autograd kernel of ``register_autograd`` (its per-call tree walk and redispatch
    cost tens of microseconds of host time).

    - Eager, a gradient wanted (grad mode on and an argument at a position in
      ``grad_args`` requiring grad): a ``torch.autograd.Function`` with the op's own
      ``setup_context`` and ``backward``, whose forward calls the kernel below the
      autograd key.
    - Eager, no gradient wanted: the kernel below the autograd key.
    - Under ``torch.compile``: the registered op itself, so the graph holds the
      custom op and its registered autograd.

    Eager, the library's errors come out as fusekit.Error subclasses.

    ``materialize=False`` (ops with several outputs whose backward takes None for an
    unused one, e.g. the trajectory): no zero gradients are made for unused outputs."""

    class _Fn(torch.autograd.Function):
        @staticmethod
        def forward(*args):
            with _below_autograd():
                return op(*args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            if not materialize:
                ctx.set_materialize_grads(False)
            setup_context(ctx, inputs, output)

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    _Fn.__name__ = _Fn.__qualname__ = f"fusekit_{op._schema.name.split('::')[-1]}"
    apply = _fast_apply(_Fn)
    grad_enabled = torch.is_grad_enabled

    def wrapper(*args):
        if _is_compiling():
            return op(*args)
        try:
            if grad_enabled():
                for i in grad_args:
                    t = args[i]
                    if t is not None and t.requires_grad:
                        return apply(*args)
            with _below_autograd():
                return op(*args)
        except RuntimeError as e:  # the library's errors as fusekit.Error subclasses
            raise _ext.translate(e) from None

    return wrapper


def want_bits(needs) -> int:
    """An op's ``want`` mask from flags in its outputs' order (bit i: output i)."""
    return sum(1 << i for i, n in enumerate(needs) if n)


def fused_autograd(n: int, backward_op: str, forward_only: int = 0) -> tuple[Callable, Callable]:
    """``(setup_context, backward)`` of a differentiable op whose first ``n`` inputs
    are the tensors it differentiates and whose other inputs are numbers, with a
    fused backward op ``fusekit::<backward_op>(*those tensors, grad, *the numbers,
    want)`` returning one gradient per tensor (an empty one where not wanted). The
    last ``forward_only`` numbers are the forward's alone (its precision flags, say)
    and do not go to the backward op."""

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:n])
        ctx.rest = inputs[n:len(inputs) - forward_only]

    def backward(ctx, grad):
        need = ctx.needs_input_grad[:n]
        grads = getattr(torch.ops.fusekit, backward_op)(*ctx.saved_tensors, grad, *ctx.rest, want_bits(need))
        return (*[g if wanted else None for g, wanted in zip(grads, need)], *[None] * (len(ctx.rest) + forward_only))

    return setup_context, backward


def reduce_to(grad: Tensor, shape) -> Tensor:
    """Sums a broadcast gradient back to an input's shape."""
    if tuple(grad.shape) == tuple(shape):
        return grad
    return grad.sum_to_size(shape)


# ---------------------------------------------------------------------------
# The tensor route's helpers (the plain functions on torch tensors)
# ---------------------------------------------------------------------------

_increment_version = torch.autograd.graph.increment_version


def check_out(where: str, out) -> None:
    """The ctypes path's rules for a torch ``out``."""
    if out.requires_grad:
        _lib.raise_error(
            _lib.ERROR_INVALID_ARGUMENT,
            where,
            "out requires grad; fusekit's functions do not record autograd "
            "(use the ops in fusekit.torch, or pass out.detach())",
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
        raise _ext.translate(e) from None


def d(t):
    """An input without autograd history (plain functions record none)."""
    return t.detach() if t is not None and t.requires_grad else t


def new(shape, like):
    """A new tensor of ``shape`` with ``like``'s dtype and device."""
    return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)


def outputs(where: str, specs, wanted, out, like):
    """The outputs of a plain function with several (the ctypes path's rule): for
    each ``(name, shape)`` of ``specs``, the caller's tensor from ``out`` (a tuple,
    None entries allowed), else a new one where wanted, else None. Returns
    (tensors, the caller's tensors)."""
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
        raise _ext.translate(e) from None
    for o in written:
        if o is not None:
            _increment_version(o)
