"""Elementwise ops (docs/ops.md section 1): one function per C entry point.

Each function takes numpy arrays, torch tensors (CPU or CUDA), fusekit Buffers or
other DLPack producers, and returns the caller's kind of array. Without ``out=``
the output is allocated with the NumPy broadcast shape of the inputs (and the
real dtype for ``abs`` of complex input); with ``out=`` the result is written
there (``out`` may be exactly one of the inputs: in place) and ``out`` is
returned. ``stream=`` (a fusekit.Stream, a torch.cuda.Stream or a raw CUstream)
overrides the default: torch's current stream of the device on CUDA.

The library's rules: a, b and out share one dtype (float16, bfloat16, float32,
float64, complex64, complex128); ``out`` must not partially overlap an input;
``relu`` refuses complex input.
"""

from __future__ import annotations

from .._core import DType, Invocation
from .._lib import lib, scalar
from .._route import plain as _plain  # torch tensors: the compiled ops
from .._route import route as _route  # _route.elementwise: fusekit.torch.elementwise


__all__ = [
    "add",
    "sub",
    "mul",
    "div",
    "axpby",
    "scalar_add",
    "scalar_mul",
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "copy",
]


def _binary(entry: str, where: str, a, b, out, stream):
    t = _route.tensor
    if (t is not None and type(a) is t and type(b) is t and out is None and stream is None
            and not (a.requires_grad or b.requires_grad or a.is_complex() or b.is_complex())):
        return _route.elementwise.binary_new(entry, a, b)  # the common case, with the fewest checks
    if stream is None and _plain(a, b, out):
        return _route.elementwise.binary(entry, where, a, b, out)
    with Invocation(where, stream) as inv:
        A = inv.input(a, "a")
        B = inv.input(b, "b")
        O = inv.output(out, "out", inv.broadcast(A, B, names=("a", "b")), A.dtype)
        getattr(lib(), entry)(A.handle, B.handle, O.handle, inv.stream_handle)
        return inv.result()


def _unary(entry: str, where: str, a, out, stream, out_dtype=None):
    t = _route.tensor
    if t is not None and type(a) is t and out is None and stream is None and not (a.requires_grad or a.is_complex()):
        return _route.elementwise.unary_new(entry, a)  # the common case, with the fewest checks
    if stream is None and _plain(a, out):
        return _route.elementwise.unary(entry, where, a, out)
    with Invocation(where, stream) as inv:
        A = inv.input(a, "a")
        dt = out_dtype(A.dtype) if out_dtype else A.dtype
        O = inv.output(out, "out", A.shape, dt)
        getattr(lib(), entry)(A.handle, O.handle, inv.stream_handle)
        return inv.result()


def add(a, b, *, out=None, stream=None):
    """``a + b`` (NumPy broadcasting)."""
    return _binary("fk_add", "fusekit.add", a, b, out, stream)


def sub(a, b, *, out=None, stream=None):
    """``a - b`` (NumPy broadcasting)."""
    return _binary("fk_sub", "fusekit.sub", a, b, out, stream)


def mul(a, b, *, out=None, stream=None):
    """``a * b`` (complex product for complex dtypes)."""
    return _binary("fk_mul", "fusekit.mul", a, b, out, stream)


def div(a, b, *, out=None, stream=None):
    """``a / b`` with IEEE semantics (x/0 gives inf or NaN)."""
    return _binary("fk_div", "fusekit.div", a, b, out, stream)


def axpby(alpha, a, beta, b, *, out=None, stream=None):
    """Fused ``alpha*a + beta*b`` in one pass (complex scalars for complex dtypes)."""
    where = "fusekit.axpby"
    sa = scalar(alpha, where, "alpha")
    sb = scalar(beta, where, "beta")
    if stream is None and _plain(a, b, out):
        return _route.elementwise.axpby_c(where, sa, a, sb, b, out)
    with Invocation(where, stream) as inv:
        A = inv.input(a, "a")
        B = inv.input(b, "b")
        O = inv.output(out, "out", inv.broadcast(A, B, names=("a", "b")), A.dtype)
        lib().fk_axpby(sa, A.handle, sb, B.handle, O.handle, inv.stream_handle)
        return inv.result()


def _scalar_op(entry: str, where: str, a, s, out, stream):
    sc = scalar(s, where, "s")
    if stream is None and _plain(a, out):
        return _route.elementwise.scalar(entry, where, a, sc, out)
    with Invocation(where, stream) as inv:
        A = inv.input(a, "a")
        O = inv.output(out, "out", A.shape, A.dtype)
        getattr(lib(), entry)(A.handle, sc, O.handle, inv.stream_handle)
        return inv.result()


def scalar_add(a, s, *, out=None, stream=None):
    """``a + s`` for a number ``s`` (complex only for complex dtypes)."""
    return _scalar_op("fk_scalar_add", "fusekit.scalar_add", a, s, out, stream)


def scalar_mul(a, s, *, out=None, stream=None):
    """``a * s`` for a number ``s`` (complex only for complex dtypes)."""
    return _scalar_op("fk_scalar_mul", "fusekit.scalar_mul", a, s, out, stream)


def neg(a, *, out=None, stream=None):
    """``-a``."""
    return _unary("fk_neg", "fusekit.neg", a, out, stream)


def abs(a, *, out=None, stream=None):  # noqa: A001 - mirrors the C name
    """``|a|``; complex input gives the real magnitude (float32/float64)."""
    return _unary("fk_abs", "fusekit.abs", a, out, stream, out_dtype=lambda d: DType(d).real)


def exp(a, *, out=None, stream=None):
    """``exp(a)``."""
    return _unary("fk_exp", "fusekit.exp", a, out, stream)


def log(a, *, out=None, stream=None):
    """Natural logarithm (complex: principal branch)."""
    return _unary("fk_log", "fusekit.log", a, out, stream)


def sqrt(a, *, out=None, stream=None):
    """Square root (complex: principal root)."""
    return _unary("fk_sqrt", "fusekit.sqrt", a, out, stream)


def sin(a, *, out=None, stream=None):
    """``sin(a)``."""
    return _unary("fk_sin", "fusekit.sin", a, out, stream)


def cos(a, *, out=None, stream=None):
    """``cos(a)``."""
    return _unary("fk_cos", "fusekit.cos", a, out, stream)


def tanh(a, *, out=None, stream=None):
    """``tanh(a)``."""
    return _unary("fk_tanh", "fusekit.tanh", a, out, stream)


def sigmoid(a, *, out=None, stream=None):
    """``1 / (1 + exp(-a))``."""
    return _unary("fk_sigmoid", "fusekit.sigmoid", a, out, stream)


def relu(a, *, out=None, stream=None):
    """``max(a, 0)``, NaN propagating; complex input raises UnsupportedDtypeError."""
    return _unary("fk_relu", "fusekit.relu", a, out, stream)


def copy(a, *, out=None, stream=None):
    """A strided copy of ``a`` (contiguous when ``out`` is not given); with ``out``,
    ``a`` is broadcast to ``out``'s shape."""
    return _unary("fk_copy", "fusekit.copy", a, out, stream)


#: C entry point -> Python wrapper (checked by tests/test_bindings_complete.py).
ENTRY_POINTS = {
    "fk_add": add,
    "fk_sub": sub,
    "fk_mul": mul,
    "fk_div": div,
    "fk_axpby": axpby,
    "fk_scalar_add": scalar_add,
    "fk_scalar_mul": scalar_mul,
    "fk_neg": neg,
    "fk_abs": abs,
    "fk_exp": exp,
    "fk_log": log,
    "fk_sqrt": sqrt,
    "fk_sin": sin,
    "fk_cos": cos,
    "fk_tanh": tanh,
    "fk_sigmoid": sigmoid,
    "fk_relu": relu,
    "fk_copy": copy,
}
