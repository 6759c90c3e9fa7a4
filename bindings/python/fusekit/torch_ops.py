"""fusekit ops as torch custom ops (``torch.ops.fusekit.*``): autograd, fake
tensors and ``torch.compile(fullgraph=True)``.

Import this module explicitly (it imports torch; ``import fusekit`` does not)::

    import fusekit.torch_ops
    y = torch.ops.fusekit.axpby(a, b, 2.0, -1.0)   # or fusekit.torch_ops.axpby(2.0, a, -1.0, b)
    y.sum().backward()

The ops are compiled: ``fusekit/csrc/fusekit_torch.cpp`` defines every op's schema
and its CPU and CUDA kernels against PyTorch's stable ABI, calling libfusekit's C
entry points directly on torch's current stream (no ctypes, no Python wrappers per
call). Importing this module loads it (:mod:`fusekit._torch_ext`; ImportError with
build instructions when it was not built). What Python adds per op, here and in the
family modules, is what torch wants in Python:

- ``fake``: the op's signature, returning empty tensors of the right shape, dtype
  and device (what ``torch.compile`` and FakeTensor tracing use);
- ``backward(ctx, *grads)`` and ``setup_context(ctx, inputs, output)``: the
  autograd formula, written with registered ops (``torch.ops.fusekit.*``, e.g. the
  fusekit backward kernel as its own op) or plain torch ops, so that it traces
  under ``torch.compile`` too. Return one gradient per input (None for non-tensor
  inputs).

A new op family adds its kernels and schemas to fusekit_torch.cpp and calls
:func:`register` once per op; check it with ``torch.library.opcheck`` and
``torch.autograd.gradcheck`` in float64 on the CPU, as
``bindings/python/tests/test_torch_custom_ops.py`` does.
"""

from typing import Callable, Optional

import torch
from torch import Tensor

from . import _torch_ext

__all__ = ["register", "eager_call", "axpby", "scalar_mul", "relu", "NAMESPACE"]

NAMESPACE = "fusekit"

_torch_ext.load()


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

    def call(*args):
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
            raise _torch_ext.translate(e) from None

    return call


def _reduce_to(grad: Tensor, shape) -> Tensor:
    """Sums a broadcast gradient back to an input's shape."""
    if tuple(grad.shape) == tuple(shape):
        return grad
    return grad.sum_to_size(shape)


# --- fusekit::scalar_mul(Tensor a, float s) -> Tensor ------------------------


def _scalar_mul_fake(a: Tensor, s: float) -> Tensor:
    return torch.empty_like(a, memory_format=torch.contiguous_format)


def _scalar_mul_setup(ctx, inputs, output):
    ctx.s = inputs[1]


def _scalar_mul_backward(ctx, grad):
    return torch.ops.fusekit.scalar_mul(grad, ctx.s), None


_scalar_mul_op = eager_call(
    register("scalar_mul", fake=_scalar_mul_fake, backward=_scalar_mul_backward, setup_context=_scalar_mul_setup),
    _scalar_mul_backward, _scalar_mul_setup, (0,))


# --- fusekit::axpby(Tensor a, Tensor b, float alpha, float beta) -> Tensor --


def _axpby_fake(a: Tensor, b: Tensor, alpha: float, beta: float) -> Tensor:
    torch._check(a.dtype == b.dtype, lambda: f"fusekit::axpby: a is {a.dtype} but b is {b.dtype}")
    shape = torch.broadcast_shapes(a.shape, b.shape)
    return a.new_empty(shape)


def _axpby_setup(ctx, inputs, output):
    a, b, alpha, beta = inputs
    ctx.alpha, ctx.beta = alpha, beta
    ctx.a_shape, ctx.b_shape = a.shape, b.shape


def _axpby_backward(ctx, grad):
    ga = gb = None
    if ctx.needs_input_grad[0]:
        ga = _reduce_to(torch.ops.fusekit.scalar_mul(grad, ctx.alpha), ctx.a_shape)
    if ctx.needs_input_grad[1]:
        gb = _reduce_to(torch.ops.fusekit.scalar_mul(grad, ctx.beta), ctx.b_shape)
    return ga, gb, None, None


_axpby_op = eager_call(
    register("axpby", fake=_axpby_fake, backward=_axpby_backward, setup_context=_axpby_setup),
    _axpby_backward, _axpby_setup, (0, 1))


# --- fusekit::relu(Tensor a) -> Tensor ---------------------------------------


def _relu_fake(a: Tensor) -> Tensor:
    torch._check(not a.is_complex(), lambda: "fusekit::relu: complex input is not supported")
    return torch.empty_like(a, memory_format=torch.contiguous_format)


def _relu_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _relu_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    # d relu / da = 1 where the output is positive (0 at a == 0, as torch.relu).
    return torch.where(out > 0, grad, torch.zeros_like(grad))


_relu_op = eager_call(register("relu", fake=_relu_fake, backward=_relu_backward, setup_context=_relu_setup),
                      _relu_backward, _relu_setup, (0,))


# --- convenience wrappers with the argument order of the plain functions -------


def axpby(alpha: float, a: Tensor, beta: float, b: Tensor) -> Tensor:
    """``alpha*a + beta*b`` through ``torch.ops.fusekit.axpby`` (differentiable)."""
    return _axpby_op(a, b, float(alpha), float(beta))


def scalar_mul(a: Tensor, s: float) -> Tensor:
    """``a*s`` through ``torch.ops.fusekit.scalar_mul`` (differentiable)."""
    return _scalar_mul_op(a, float(s))


def relu(a: Tensor) -> Tensor:
    """``max(a, 0)`` through ``torch.ops.fusekit.relu`` (differentiable)."""
    return _relu_op(a)


# --- fusekit::linear, fusekit::linear_backward (the fused linear layer) ------
#: ``act(x w^T + b)``, differentiable (float16, bfloat16, float32); see fusekit.ops.linalg.
from .ops.linalg import register_torch_ops as _register_linalg  # noqa: E402

linear = _register_linalg(register)
__all__.append("linear")

# The op families with their own torch module register here too.
from . import torch_gaussian  # noqa: E402,F401
from . import torch_geodesic  # noqa: E402,F401
