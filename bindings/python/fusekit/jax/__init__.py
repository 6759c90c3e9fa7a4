"""fusekit ops inside ``jax.jit``, with gradients and ``vmap``, through XLA's FFI.

Import it explicitly (it is not imported by ``import fusekit``)::

    import jax, jax.numpy as jnp
    import fusekit.jax as fkj

    y = jax.jit(lambda a, b: fkj.add(a, b))(jnp.ones((4, 3)), jnp.arange(3.0))
    g = jax.grad(lambda p: fkj.gaussian_field(p, mu, L, w).sum())(points)

Each op is an XLA custom call (``jax.ffi.ffi_call``) to a handler in ``libfusekit``
(``fk_xla_<op>_cpu`` / ``fk_xla_<op>_cuda``, registered here through ctypes and
``jax.ffi.pycapsule``; nothing is compiled against jaxlib). The handlers take
XLA's buffers without copying, XLA's CUDA stream, and run the op through the
same validation as the C ABI. Gradients are ``jax.custom_vjp`` rules: the fused
linear layer, the MLP, the Gaussian ops, ``christoffel`` and ``leapfrog`` call fusekit's
fused backwards; elementwise ops and ``matmul`` differentiate with JAX's own
rules around fusekit's forward (``matmul``'s products are fusekit GEMMs), the
Shampoo and per-sample ops with JAX's rule of their formulas; ``matrix_power``
is not differentiable. docs/jax.md is the reference.

Supported jax: see :data:`SUPPORTED_JAX`; importing this module with another
version raises ``ImportError`` (set ``FUSEKIT_JAX_ANY_VERSION=1`` to try anyway).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading

import numpy as np

try:
    import jax
    import jax.numpy as jnp
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "fusekit.jax needs jax: pip install 'jax[cpu]' (or 'jax[cuda13]' for GPUs)"
    ) from e

from .. import _lib

#: The elementwise ops, by arity: one handler pair each (fk_xla_<op>_cpu / _cuda).
_BINARY_OPS = ("add", "sub", "mul", "div", "axpby")
_UNARY_OPS = ("neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "relu")
#: The optimizer-math ops, likewise.
_OPTIM_OPS = ("matrix_power", "shampoo_stats", "shampoo_precondition", "per_sample_grads",
              "per_sample_grad_norms", "dp_clipped_grad_sum")

__all__ = [
    "SUPPORTED_JAX", "TESTED_WITH", *_BINARY_OPS, *_UNARY_OPS, "matmul", "linear", "mlp", "mahalanobis",
    "gaussian_field", "DEFAULT_C", "christoffel", "leapfrog", *_OPTIM_OPS, "warmup", "call_count",
    "count_calls", "allow_tf32", "precision_mode",
]

#: The jax versions this module accepts: ``[low, high)``.
SUPPORTED_JAX = ((0, 10, 2), (0, 12, 0))
#: What it was tested with.
TESTED_WITH = "jax/jaxlib 0.10.2 on the CPU (XLA FFI API 0.3); jax 0.11.2 with the CUDA 13 plugin on the GPU"


def _jax_version() -> tuple[int, ...]:
    info = getattr(jax, "__version_info__", None)
    if info is None:
        info = tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in jax.__version__.split(".")[:3])
    return tuple(int(v) for v in info[:3])


def _check_version() -> None:
    v = _jax_version()
    lo, hi = SUPPORTED_JAX
    if not (lo <= v < hi) and os.environ.get("FUSEKIT_JAX_ANY_VERSION") != "1":
        raise ImportError(
            f"fusekit.jax supports jax >= {'.'.join(map(str, lo))} and < {'.'.join(map(str, hi))} "
            f"(tested: {TESTED_WITH}); this is jax {jax.__version__}. "
            "Install a supported jax, or set FUSEKIT_JAX_ANY_VERSION=1 to try this one."
        )


_check_version()

# ---------------------------------------------------------------------------
# Registration of the handlers
# ---------------------------------------------------------------------------

#: op -> the handlers' symbol stem in libfusekit (fk_xla_<stem>_cpu / _cuda)
_HANDLERS = {
    **{op: op for op in _BINARY_OPS + _UNARY_OPS},
    "gemm": "gemm",
    "linear_forward": "linear_forward",
    "linear_backward": "linear_backward",
    "mlp_forward": "mlp_forward",
    "mlp_backward": "mlp_backward",
    "mahalanobis_forward": "mahalanobis_forward",
    "mahalanobis_backward": "mahalanobis_backward",
    "field_forward": "gaussian_field_forward",
    "field_backward": "gaussian_field_backward",
    **{op: op for op in ("christoffel_forward", "christoffel_backward", "leapfrog_forward", "leapfrog_backward")},
    **{op: op for op in _OPTIM_OPS + ("matrix_power_eigh",)},
}

_lock = threading.Lock()
_registered: set[str] = set()


def _has_cuda() -> bool:
    try:
        return len(jax.devices("cuda")) > 0
    except RuntimeError:
        return False


def _library():
    L = _lib.lib()
    if not hasattr(L, "fk_xla_call_count"):
        raise ImportError(f"{_lib.library_path()} has no XLA handlers (fk_xla_*): rebuild libfusekit")
    L.fk_xla_call_count.argtypes = []
    L.fk_xla_call_count.restype = ctypes.c_uint64
    L.fk_xla_set_call_counting.argtypes = [ctypes.c_int32]
    L.fk_xla_set_call_counting.restype = ctypes.c_int32
    L.fk_xla_warmup.argtypes = [ctypes.c_int32, ctypes.c_int32]
    L.fk_xla_warmup.restype = ctypes.c_int32
    L.fk_xla_gaussian_workspace_bytes.argtypes = [
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_size_t),
    ]
    L.fk_xla_gaussian_workspace_bytes.restype = ctypes.c_int32
    L.fk_xla_mlp_saved_bytes.argtypes = [
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int64,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_size_t),
    ]
    L.fk_xla_mlp_saved_bytes.restype = ctypes.c_int32
    L.fk_xla_mlp_workspace_bytes.argtypes = [
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int64,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_size_t),
    ]
    L.fk_xla_mlp_workspace_bytes.restype = ctypes.c_int32
    return L


def _register() -> None:
    """Registers every handler with XLA once per process: for the CPU, and for
    CUDA when jax has a CUDA backend."""
    if _registered:
        return
    with _lock:
        if _registered:
            return
        L = _library()
        platforms = ["cpu"] + (["CUDA"] if _has_cuda() else [])
        for op, stem in _HANDLERS.items():
            for platform in platforms:
                suffix = "cpu" if platform == "cpu" else "cuda"
                fn = getattr(L, f"fk_xla_{stem}_{suffix}")
                jax.ffi.register_ffi_target(_target(op), jax.ffi.pycapsule(fn), platform=platform)
        _registered.update(platforms)


def _target(op: str) -> str:
    return f"fusekit_{op}"


def _manual_axis_type(x):
    """x's manual axis type inside shard_map (jax 0.10 and later), or None."""
    try:
        return getattr(jax.typeof(x), "manual_axis_type", None)
    except Exception:  # noqa: BLE001 - not a jax value
        return None


def _varying(x) -> frozenset:
    return frozenset(getattr(_manual_axis_type(x), "varying", None) or ())


def _unify(*xs):
    """Inside shard_map: every array made varying over the union of the mesh axes
    any of them varies over (``jax.lax.pcast``), so that the op's inputs, results
    and gradients share one type. Applied outside the ops' custom_vjp, so that JAX
    transposes the casts (a psum for an invariant input's gradient). Elsewhere a
    no-op."""
    axes = frozenset().union(*(_varying(x) for x in xs if x is not None))
    if not axes:
        return xs
    out = []
    for x in xs:
        missing = None if x is None else axes - _varying(x)
        out.append(jax.lax.pcast(x, tuple(sorted(missing)), to="varying") if missing else x)
    return tuple(out)


def _call(op: str, results, *args, vmap_method: str, aliases=None, **attrs):
    _register()
    args = _unify(*args)
    if args and _varying(args[0]):
        # the results vary over the same mesh axes as the operands
        aval = jax.typeof(args[0])
        sharding = jax.sharding.NamedSharding(aval.sharding.mesh, jax.sharding.PartitionSpec())
        one = not isinstance(results, (list, tuple))
        results = [
            jax.ShapeDtypeStruct(r.shape, r.dtype, sharding=sharding, manual_axis_type=aval.manual_axis_type)
            for r in ([results] if one else results)
        ]
        results = results[0] if one else results
    call = jax.ffi.ffi_call(_target(op), results, vmap_method=vmap_method, input_output_aliases=aliases)
    return call(*args, **attrs)


# ---------------------------------------------------------------------------
# vmap: the vmapped axis folded into an op's row axis
# ---------------------------------------------------------------------------
#
# The batch-parallel ops take row operands (``v [B, D]``, ``points [B, 3]``, the
# per-sample ``a``, ``g`` ...) and shared ones (``U``, ``W``, ``means`` ...); a row
# of the result depends on its own row and the shared operands only. Under
# ``vmap`` with only row operands batched, ``[n, B, ...]`` is folded into
# ``[n * B, ...]``, the op runs once and the result is unfolded: exact, the same
# arithmetic row by row. A batched shared operand cannot be folded: then a loop
# (``jax.vmap`` of the call, whose ``ffi_call`` is ``vmap_method="sequential"``).
#
# Two places use it:
#
# - inside each op's ``custom_vjp`` (the primal and the forward of the rule), the
#   forward ``ffi_call`` is a ``jax.custom_batching.custom_vmap`` (``_foldable``):
#   the forward folds wherever vmap meets it (``vmap(jit(f))``, ``vmap(grad(f))``,
#   a ``scan`` body, the batched ``custom_vjp`` of ``grad(vmap(f))``). The backward
#   calls stay loops there: ``vmap`` of a ``custom_vjp`` rule needs a shared
#   operand's cotangent per element (``[n, D, R]`` for ``U``; JAX sums it when the
#   shared operand is unbatched), and the fused backwards only give the sum over
#   rows.
# - around the whole op (``_fold_under_vmap``), when ``vmap`` is the innermost
#   transformation at the call (``grad(vmap(f))``, ``jit(vmap(f))``, ``vmap(f)``):
#   the op's ``custom_vjp`` itself runs once on the folded operands, so its fused
#   backward runs once too and sums the shared operands' gradients over all
#   ``n * B`` rows, which is what JAX wants for an unbatched ``U``. ``custom_vmap``
#   has no reverse-mode rule, so it must not be bound where a JVP trace would see
#   it: it is used only when the current trace is the ``vmap``'s and an operand is
#   batched by it (then ``vmap`` applies the rule at once and only the op's own
#   ``custom_vjp`` reaches the traces outside).


def _current_batch_trace():
    """The current trace when it is a ``vmap``'s (``BatchTrace``), else None (also
    when this jax has no such internals: then only the forwards fold)."""
    try:
        from jax._src import core as _core
        from jax._src.interpreters import batching as _batching

        t = _core.unsafe_get_current_trace()
        return t if isinstance(t, _batching.BatchTrace) else None
    except (ImportError, AttributeError):  # pragma: no cover - other jax layouts
        return None


def _mapped_by(trace, x) -> bool:
    from jax._src.interpreters import batching as _batching

    return isinstance(x, _batching.BatchTracer) and x._trace.tag is trace.tag and isinstance(x.batch_dim, int)


def _fold_rule(fn, rows, out_axes, merge, again):
    """A custom_vmap rule: ``again`` (fn, folding further out) on the folded
    operands when only row operands (``rows[i]``) are batched, else a loop."""

    def rule(n, in_batched, *xs):
        if any(b and not r for b, r in zip(in_batched, rows)):
            out = jax.vmap(fn, in_axes=tuple(0 if b else None for b in in_batched))(*xs)
            return out, jax.tree.map(lambda _: True, out)
        folded = []
        for x, b, r in zip(xs, in_batched, rows):
            if r and x is not None:
                if not b:
                    x = jnp.broadcast_to(x, (n,) + x.shape)
                if merge:
                    x = x.reshape((n * x.shape[1],) + x.shape[2:])
            folded.append(x)
        out = again(*folded)
        leaves, tree = jax.tree.flatten(out)
        unfolded = []
        for o, a in zip(leaves, out_axes):
            if merge:
                o = o.reshape(o.shape[:a] + (n, o.shape[a] // n) + o.shape[a + 1:])
            unfolded.append(jnp.moveaxis(o, a, 0))
        return jax.tree.unflatten(tree, unfolded), jax.tree.unflatten(tree, [True] * len(leaves))

    return rule


def _foldable(fn, rows, out_axes=(0,), merge=True):
    """``fn`` (arrays or None in, arrays out; a forward ``ffi_call``) as a
    ``custom_vmap`` that folds the vmapped axis into the row axis of the operands
    ``rows`` marks (axis 0) and of the results (axis ``out_axes[i]``), or loops
    when a shared operand is batched. ``merge=False``: the op takes the vmapped
    axis as one more leading row axis (``linear``), nothing is reshaped."""
    cv = jax.custom_batching.custom_vmap(fn)
    cv.def_vmap(_fold_rule(fn, rows, out_axes, merge, lambda *a: cv(*a)))
    return cv


def _fold_under_vmap(fn, args, rows, out_axes=(0,), merge=True):
    """``fn(*args)``, where ``fn`` is a whole op (its ``custom_vjp`` included): when
    the current trace is a ``vmap``'s that batches some operand and no shared one,
    ``fn`` runs once on the folded operands (see above), else as it is."""
    trace = _current_batch_trace()
    if trace is None:
        return fn(*args)
    batched = [x is not None and _mapped_by(trace, x) for x in args]
    if not any(batched) or any(b and not r for b, r in zip(batched, rows)):
        return fn(*args)
    again = lambda *a: _fold_under_vmap(fn, a, rows, out_axes, merge)  # noqa: E731
    cv = jax.custom_batching.custom_vmap(lambda *a: fn(*a))
    cv.def_vmap(_fold_rule(fn, rows, out_axes, merge, again))
    return cv(*args)


def _check(status: int, where: str) -> None:
    if status != 0:
        _lib.raise_error(status, where, _lib.last_error_message())


def warmup(platform: str = "cuda", device: int = 0) -> None:
    """Compiles (or loads from fusekit's kernel cache) every kernel of the handlers'
    context on ``platform`` (``"cuda"``; ``"cpu"`` is a no-op), so that no first
    call compiles while XLA captures a CUDA graph."""
    kind = {"cpu": _lib.DEVICE_CPU, "cuda": _lib.DEVICE_CUDA, "gpu": _lib.DEVICE_CUDA}[platform.lower()]
    _check(_library().fk_xla_warmup(kind, device), "fk_xla_warmup")


def call_count() -> int:
    """Executions of fusekit's XLA handlers counted so far (see :func:`count_calls`).
    A handler replayed from an XLA CUDA graph is not entered, so it is not counted."""
    return int(_library().fk_xla_call_count())


@contextlib.contextmanager
def count_calls():
    """Counts handler executions inside the ``with`` block (a debug counter that
    costs one relaxed atomic load per call when off)::

        with fkj.count_calls() as n:
            f(x).block_until_ready()
        print(n())
    """
    L = _library()
    was = L.fk_xla_set_call_counting(1)
    start = call_count()
    try:
        yield lambda: call_count() - start
    finally:
        L.fk_xla_set_call_counting(was)


# ---------------------------------------------------------------------------
# Checks in JAX's terms
# ---------------------------------------------------------------------------

_FLOATS = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)
_ALL = _FLOATS + (jnp.complex64, jnp.complex128)


def _arr(x, name: str, where: str):
    try:
        return jnp.asarray(x)
    except TypeError as e:
        raise TypeError(f"fusekit.jax.{where}: {name} is not an array: {e}") from None


def _dtype_in(x, name: str, allowed, where: str):
    if x.dtype not in [np.dtype(d) for d in allowed]:
        names = ", ".join(np.dtype(d).name for d in allowed)
        raise TypeError(f"fusekit.jax.{where}: {name} has dtype {x.dtype}; this op takes {names}")


def _same_dtype(where: str, **arrays):
    items = list(arrays.items())
    first_name, first = items[0]
    for name, x in items[1:]:
        if x.dtype != first.dtype:
            raise TypeError(
                f"fusekit.jax.{where}: {first_name} has dtype {first.dtype} but {name} has dtype {x.dtype}; "
                f"fusekit does not promote (jnp would compute in {jnp.promote_types(first.dtype, x.dtype)}): "
                "cast with .astype first"
            )


def _is_number(x) -> bool:
    """A Python number: it takes the other operand's dtype (as jnp's weak types do)."""
    return isinstance(x, (int, float, complex)) and not isinstance(x, bool)


def _shape(x, name: str, want: tuple, form: str, where: str):
    ok = len(x.shape) == len(want) and all(w is None or s == w for s, w in zip(x.shape, want))
    if not ok:
        raise ValueError(f"fusekit.jax.{where}: {name} must be {form}, got shape {tuple(x.shape)}")


# ---------------------------------------------------------------------------
# Precision (f32 products: strict or TF32)
# ---------------------------------------------------------------------------

_STRICT = {"highest", "float32", "f32_f32_f32", "bf16_bf16_f32_x6", "bf16_bf16_f32_x9", "f64_f64_f64"}
_TF32 = {"default", "fastest", "bfloat16", "tensorfloat32", "tf32_tf32_f32", "bf16_bf16_f32",
         "bf16_bf16_bf16", "f16_f16_f32", "f16_f16_f16"}


def _config_precision():
    try:
        from jax._src import config as _config

        return _config.default_matmul_precision.value
    except (ImportError, AttributeError):  # pragma: no cover - other jax layouts
        return jax.config.jax_default_matmul_precision


#: the settings that ask for about f32 accuracy from three passes: 3xTF32 where an
#: op has it (the leapfrog forward), strict f32 elsewhere
_X3 = {"high", "tf32_tf32_f32_x3", "bf16_bf16_f32_x3"}


def precision_mode(precision=None) -> str:
    """The f32 product mode that ``precision`` asks for: ``"tf32"``, ``"tf32x3"`` or
    ``"strict"``. None reads ``jax.config.jax_default_matmul_precision`` (the
    ``jax.default_matmul_precision`` context included).

    - ``"tf32"``: ``"default"``, ``"fastest"``, ``"bfloat16"``, ``"tensorfloat32"``,
      ``"TF32_TF32_F32"`` and the other one-pass presets, ``jax.lax.Precision.DEFAULT``,
      ``True``;
    - ``"tf32x3"``: ``"high"``, ``"TF32_TF32_F32_X3"``, ``"BF16_BF16_F32_X3"``,
      ``jax.lax.Precision.HIGH`` (3xTF32 where an op has it, the leapfrog forward;
      strict f32 elsewhere);
    - ``"strict"``: unset (None), ``"highest"``, ``"float32"``, ``"F32_F32_F32"``,
      the ``_X6`` / ``_X9`` presets, ``jax.lax.Precision.HIGHEST``, ``False``.
    """
    p = _config_precision() if precision is None else precision
    if p is None:
        return "strict"
    if isinstance(p, bool):
        return "tf32" if p else "strict"
    if isinstance(p, jax.lax.Precision):
        return {jax.lax.Precision.DEFAULT: "tf32", jax.lax.Precision.HIGH: "tf32x3"}.get(p, "strict")
    if isinstance(p, str):
        s = p.lower()
        if s in _TF32:
            return "tf32"
        if s in _X3:
            return "tf32x3"
        if s in _STRICT:
            return "strict"
    raise ValueError(
        f"fusekit.jax: precision {p!r} is not understood; use True/False, a jax.lax.Precision, "
        "or one of jax_default_matmul_precision's values"
    )


def allow_tf32(precision=None) -> bool:
    """Whether f32 products may use TF32 tensor cores (CUDA; the CPU is always
    strict), from ``precision`` or, when it is None, from
    ``jax.config.jax_default_matmul_precision`` (the ``jax.default_matmul_precision``
    context included). Strict unless the setting names TF32 or a lower precision:
    ``"default"``, ``"fastest"``, ``"bfloat16"``, ``"tensorfloat32"``,
    ``"TF32_TF32_F32"``, ``jax.lax.Precision.DEFAULT`` or ``True``. Unset (None),
    ``"highest"``, ``"float32"``, ``"high"``, the ``_X3`` presets,
    ``jax.lax.Precision.HIGH`` / ``HIGHEST`` or ``False`` are strict (see
    :func:`precision_mode` for the ops that have 3xTF32).
    """
    return precision_mode(precision) == "tf32"


# ---------------------------------------------------------------------------
# Elementwise
# ---------------------------------------------------------------------------


def _broadcast_pair(where: str, a, b):
    try:
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise ValueError(
            f"fusekit.jax.{where}: Incompatible shapes for broadcasting: {tuple(a.shape)} and {tuple(b.shape)}"
        ) from None
    r = len(shape)
    # equal ranks, so that vmap's leading batch axis lines up (vmap_method="expand_dims")
    a = a.reshape((1,) * (r - a.ndim) + a.shape)
    b = b.reshape((1,) * (r - b.ndim) + b.shape)
    return a, b, shape


def _ew(op: str, a, b, **attrs):
    a, b, shape = _broadcast_pair(op, a, b)
    return _call(op, jax.ShapeDtypeStruct(shape, a.dtype), a, b, vmap_method="expand_dims", **attrs)


_JNP_BINARY = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _binary(op, a, b):
    return _ew(op, a, b)


def _binary_fwd(op, a, b):
    return _binary(op, a, b), (a, b)


def _binary_bwd(op, res, g):
    a, b = res
    return jax.vjp(_JNP_BINARY[op], a, b)[1](g)


_binary.defvjp(_binary_fwd, _binary_bwd)


def _binary_op(op: str):
    def f(a, b):
        if _is_number(a) and not _is_number(b):
            b = _arr(b, "b", op)
            a = jnp.asarray(a, dtype=b.dtype)
        elif _is_number(b):
            a = _arr(a, "a", op)
            b = jnp.asarray(b, dtype=a.dtype)
        a, b = _arr(a, "a", op), _arr(b, "b", op)
        _dtype_in(a, "a", _ALL, op)
        _same_dtype(op, a=a, b=b)
        return _binary(op, *_unify(a, b))

    f.__name__ = op
    f.__doc__ = (
        f"``{op}(a, b)``: fusekit's elementwise {op} (fk_{op}), with NumPy broadcasting; "
        "a and b share one dtype (f16, bf16, f32, f64, complex64, complex128; Python numbers take the "
        "other operand's). Differentiable (JAX's rule), batch-parallel under vmap."
    )
    return f


add = _binary_op("add")
sub = _binary_op("sub")
mul = _binary_op("mul")
div = _binary_op("div")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 2))
def _axpby(alpha, a, beta, b):
    attrs = {}
    for name, v in (("alpha", alpha), ("beta", beta)):
        c = complex(v)
        attrs[name] = np.float64(c.real)
        if c.imag:
            attrs[f"{name}_im"] = np.float64(c.imag)
    return _ew("axpby", a, b, **attrs)


def _axpby_fwd(alpha, a, beta, b):
    return _axpby(alpha, a, beta, b), (a, b)


def _axpby_bwd(alpha, beta, res, g):
    a, b = res
    return jax.vjp(lambda x, y: alpha * x + beta * y, a, b)[1](g)


_axpby.defvjp(_axpby_fwd, _axpby_bwd)


def axpby(alpha, a, beta, b):
    """``alpha * a + beta * b`` in one pass (fk_axpby); ``alpha`` and ``beta`` are
    Python numbers (static), ``a`` and ``b`` broadcast and share one dtype."""
    a, b = _arr(a, "a", "axpby"), _arr(b, "b", "axpby")
    _dtype_in(a, "a", _ALL, "axpby")
    _same_dtype("axpby", a=a, b=b)
    for name, v in (("alpha", alpha), ("beta", beta)):
        if not isinstance(v, (int, float, complex, np.number)):
            raise TypeError(f"fusekit.jax.axpby: {name} must be a Python number (static), got {type(v).__name__}")
        if complex(v).imag and not jnp.issubdtype(a.dtype, jnp.complexfloating):
            raise TypeError(f"fusekit.jax.axpby: {name} = {v} is complex but the arrays are {a.dtype}")
    a, b = _unify(a, b)
    return _axpby(alpha, a, beta, b)


_JNP_UNARY = {
    "neg": jnp.negative,
    "abs": jnp.abs,
    "exp": jnp.exp,
    "log": jnp.log,
    "sqrt": jnp.sqrt,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "relu": jax.nn.relu,
}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _unary(op, a):
    dt = a.dtype
    if op == "abs" and jnp.issubdtype(dt, jnp.complexfloating):
        dt = jnp.finfo(dt).dtype
    return _call(op, jax.ShapeDtypeStruct(a.shape, dt), a, vmap_method="expand_dims")


def _unary_fwd(op, a):
    return _unary(op, a), a


def _unary_bwd(op, a, g):
    return jax.vjp(_JNP_UNARY[op], a)[1](g)


_unary.defvjp(_unary_fwd, _unary_bwd)


def _unary_op(op: str):
    def f(a):
        a = _arr(a, "a", op)
        allowed = _FLOATS if op == "relu" else _ALL
        _dtype_in(a, "a", allowed, op)
        return _unary(op, a)

    f.__name__ = op
    f.__doc__ = f"``{op}(a)``: fusekit's elementwise {op} (fk_{op}). Differentiable (JAX's rule), batch-parallel under vmap."
    return f


neg = _unary_op("neg")
abs = _unary_op("abs")  # noqa: A001 - the op's name
exp = _unary_op("exp")
log = _unary_op("log")
sqrt = _unary_op("sqrt")
sin = _unary_op("sin")
cos = _unary_op("cos")
tanh = _unary_op("tanh")
sigmoid = _unary_op("sigmoid")
relu = _unary_op("relu")

# ---------------------------------------------------------------------------
# Matrix product
# ---------------------------------------------------------------------------

_OP_N, _OP_T = 0, 1


def _gemm(a, b, op_a: int, op_b: int, tf32: bool):
    m = a.shape[-1] if op_a == _OP_T else a.shape[-2]
    n = b.shape[-2] if op_b == _OP_T else b.shape[-1]
    batch = max(a.shape[0] if a.ndim == 3 else 1, b.shape[0] if b.ndim == 3 else 1)
    shape = (batch, m, n) if max(a.ndim, b.ndim) == 3 else (m, n)
    # 2-D operands batch in one call under vmap (fusekit's batch-1 broadcast);
    # 3-D ones would need a fourth dimension: a loop
    vm = "expand_dims" if a.ndim == 2 and b.ndim == 2 else "sequential"
    return _call(
        "gemm",
        jax.ShapeDtypeStruct(shape, a.dtype),
        a,
        b,
        vmap_method=vm,
        op_a=np.int64(op_a),
        op_b=np.int64(op_b),
        alpha=np.float64(1.0),
        flags=np.int64(1 if tf32 else 0),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(a, b, tf32):
    return _gemm(a, b, _OP_N, _OP_N, tf32)


def _matmul_fwd(a, b, tf32):
    return _matmul(a, b, tf32), (a, b)


def _matmul_bwd(tf32, res, g):
    a, b = res
    da = _gemm(g, b, _OP_N, _OP_T, tf32)  # g b^T
    db = _gemm(a, g, _OP_T, _OP_N, tf32)  # a^T g
    # an operand used for every matrix of the batch gets the batch's sum
    if da.ndim > a.ndim:
        da = da.sum(0)
    if db.ndim > b.ndim:
        db = db.sum(0)
    return da, db


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(a, b, *, precision=None):
    """``a @ b`` as a fusekit GEMM (fk_gemm): ``a`` ``[m, k]`` or ``[batch, m, k]``,
    ``b`` ``[k, n]`` or ``[batch, k, n]`` (a 2-D operand is used for every matrix of
    the batch); one dtype (f16, bf16, f32, f64, complex64, complex128).
    ``precision`` (see :func:`allow_tf32`) chooses strict f32 or TF32 products on
    CUDA; None follows ``jax_default_matmul_precision``. Differentiable (both
    products of the backward are fusekit GEMMs)."""
    a, b = _arr(a, "a", "matmul"), _arr(b, "b", "matmul")
    _dtype_in(a, "a", _ALL, "matmul")
    _same_dtype("matmul", a=a, b=b)
    for name, x in (("a", a), ("b", b)):
        if x.ndim not in (2, 3):
            raise ValueError(f"fusekit.jax.matmul: {name} must be 2-D or 3-D (batched), got shape {tuple(x.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise TypeError(
            f"fusekit.jax.matmul: dot_general requires contracting dimensions to have the same shape, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.ndim == 3 and b.ndim == 3 and 1 not in (a.shape[0], b.shape[0]) and a.shape[0] != b.shape[0]:
        raise ValueError(f"fusekit.jax.matmul: batch sizes differ: {a.shape[0]} and {b.shape[0]}")
    return _matmul(*_unify(a, b), allow_tf32(precision))


# ---------------------------------------------------------------------------
# Fused linear layer
# ---------------------------------------------------------------------------

_ACTIVATIONS = {"none": 0, None: 0, "relu": 1, "gelu_tanh": 2, "gelu": 3, "gelu_erf": 3}


def _linear_fwd_call(x, w, b, act: int):
    def call(x, w, b):
        shape = x.shape[:-1] + (w.shape[0],)
        res = [jax.ShapeDtypeStruct(shape, x.dtype)] * (2 if act in (2, 3) else 1)
        args = (x, w) if b is None else (x, w, b)
        return tuple(_call("linear_forward", res, *args, vmap_method="sequential", act=np.int64(act)))

    # x's leading axes are all rows: a vmapped axis of x is one more (nothing reshaped)
    nres = 2 if act in (2, 3) else 1
    out = _foldable(call, rows=(True, False, False), out_axes=(0,) * nres, merge=False)(x, w, b)
    return out[0], (out[1] if nres == 2 else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _linear(x, w, b, act):
    return _linear_fwd_call(x, w, b, act)[0]


def _linear_fwd(x, w, b, act):
    y, aux = _linear_fwd_call(x, w, b, act)
    saved = {0: None, 1: y}.get(act, aux)
    return y, (x, w, saved, b is not None)


def _linear_bwd(act, res, dy):
    x, w, saved, has_bias = res
    outs = [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(w.shape, w.dtype)]
    if has_bias:
        outs.append(jax.ShapeDtypeStruct((w.shape[0],), w.dtype))
    args = (dy, x, w) if saved is None else (dy, x, w, saved)
    grads = _call("linear_backward", outs, *args, vmap_method="sequential", act=np.int64(act))
    return grads[0], grads[1], (grads[2] if has_bias else None)


_linear.defvjp(_linear_fwd, _linear_bwd)


def linear(x, w, b=None, activation: str = "none"):
    """The fused linear layer ``act(x @ w.T + b)`` (fk_linear_forward): ``x``
    ``[..., k]``, ``w`` ``[n, k]``, ``b`` ``[n]`` or None; ``activation`` one of
    ``"none"``, ``"relu"``, ``"gelu_tanh"``, ``"gelu"`` (exact, erf). f16, bf16 or
    f32 (one dtype). Its gradient is fusekit's fused backward
    (fk_linear_backward). ``vmap``: a batched ``x`` alone is one more leading
    axis, one call (and one fused backward for ``grad`` of ``vmap``); a batched
    ``w`` or ``b`` loops."""
    x, w = _arr(x, "x", "linear"), _arr(w, "w", "linear")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"fusekit.jax.linear: activation {activation!r} is not one of none, relu, gelu_tanh, gelu")
    _dtype_in(x, "x", (jnp.float16, jnp.bfloat16, jnp.float32), "linear")
    arrays = {"x": x, "w": w}
    if b is not None:
        b = _arr(b, "b", "linear")
        arrays["b"] = b
    _same_dtype("linear", **arrays)
    if x.ndim < 1:
        raise ValueError("fusekit.jax.linear: x must have at least one dimension")
    _shape(w, "w", (None, x.shape[-1]), f"[n, {x.shape[-1]}] (x has {x.shape[-1]} features)", "linear")
    if b is not None:
        _shape(b, "b", (w.shape[0],), f"[{w.shape[0]}]", "linear")
    act = _ACTIVATIONS[activation]
    return _fold_under_vmap(lambda x, w, b: _linear(x, w, b, act), _unify(x, w, b), rows=(True, False, False),
                            merge=False)


# ---------------------------------------------------------------------------
# Multi-layer perceptron
# ---------------------------------------------------------------------------

_MLP_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32)
_MLP_DTYPE_CODES = {np.dtype(jnp.float16): _lib.DTYPE_F16, np.dtype(jnp.bfloat16): _lib.DTYPE_BF16,
                    np.dtype(jnp.float32): _lib.DTYPE_F32}


def _mlp_net(x, ws) -> tuple[tuple, int]:
    """The network's widths (``k_0, n_0, ..., n_{L-1}``) and rows (x's leading
    elements), as the size queries take them."""
    return (x.shape[-1],) + tuple(w.shape[0] for w in ws), int(np.prod(x.shape[:-1], dtype=np.int64))


@functools.lru_cache(maxsize=256)
def _mlp_saved_elems(widths: tuple, rows: int, dtype, hidden: int, out: int) -> int:
    """Elements of ``dtype`` in the forward's ``saved`` result: fk_xla_mlp_saved_bytes
    for the CPU and, when jax has a CUDA backend, CUDA (the larger of the two:
    tracing does not say where the call will run)."""
    _register()
    L = _library()
    code = _MLP_DTYPE_CODES[np.dtype(dtype)]
    arr = (ctypes.c_int64 * len(widths))(*widths)
    nbytes = 0
    for kind in (_lib.DEVICE_CPU,) + ((_lib.DEVICE_CUDA,) if "CUDA" in _registered else ()):
        v = ctypes.c_size_t(0)
        _check(L.fk_xla_mlp_saved_bytes(kind, len(widths) - 1, arr, rows, code, hidden, out, ctypes.byref(v)),
               "fk_xla_mlp_saved_bytes")
        nbytes = max(nbytes, v.value)
    itemsize = np.dtype(dtype).itemsize
    return (nbytes + itemsize - 1) // itemsize


@functools.lru_cache(maxsize=256)
def _mlp_workspace(widths: tuple, rows: int, dtype) -> jax.ShapeDtypeStruct:
    """The backward's ``workspace`` result: fk_xla_mlp_workspace_bytes for CUDA when
    jax has a CUDA backend (the CPU needs none), in elements of ``dtype``."""
    _register()
    nbytes = 0
    if "CUDA" in _registered:
        code = _MLP_DTYPE_CODES[np.dtype(dtype)]
        arr = (ctypes.c_int64 * len(widths))(*widths)
        v = ctypes.c_size_t(0)
        _check(_library().fk_xla_mlp_workspace_bytes(_lib.DEVICE_CUDA, len(widths) - 1, arr, rows, code,
                                                     ctypes.byref(v)), "fk_xla_mlp_workspace_bytes")
        nbytes = v.value
    itemsize = np.dtype(dtype).itemsize
    return jax.ShapeDtypeStruct(((nbytes + itemsize - 1) // itemsize,), dtype)


def _mask(bits) -> np.int64:
    """A layer bit mask as the handlers' int64 attribute (bit i: layer i)."""
    m = sum(1 << i for i, b in enumerate(bits) if b)
    return np.int64(m - (1 << 64) if m >= 1 << 63 else m)


def _mlp_attrs(n_layers: int, cfg) -> dict:
    hidden, out, flags, _ = cfg
    return dict(n_layers=np.int64(n_layers), hidden_act=np.int64(hidden), out_act=np.int64(out),
                flags=np.int64(flags))


def _mlp_call(x, ws, bs, cfg):
    """The forward handler: (y, saved). ``bs``: the biases of the layers that have
    one (``cfg[3]``, a tuple of bools), in layer order."""
    hidden, out, _, has_bias = cfg
    widths, rows = _mlp_net(x, ws)
    saved = jax.ShapeDtypeStruct((_mlp_saved_elems(widths, rows, np.dtype(x.dtype), hidden, out),), x.dtype)
    y = jax.ShapeDtypeStruct(x.shape[:-1] + (widths[-1],), x.dtype)
    return tuple(_call("mlp_forward", (y, saved), x, *ws, *bs, vmap_method="sequential",
                       bias_mask=_mask(has_bias), **_mlp_attrs(len(ws), cfg)))


def _mlp_y(x, ws, bs, cfg):
    """y alone, folding a vmapped axis of x (one more leading row axis)."""
    n = len(ws)
    call = lambda x, *p: (_mlp_call(x, p[:n], p[n:], cfg)[0],)  # noqa: E731
    rows = (True,) + (False,) * (n + len(bs))
    return _foldable(call, rows=rows, out_axes=(0,), merge=False)(x, *ws, *bs)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _mlp(x, ws, bs, cfg):
    return _mlp_y(x, ws, bs, cfg)


def _wanted(b) -> tuple | None:
    """A static bool in the residuals' tree structure (residual leaves are arrays)."""
    return () if b else None


def _mlp_fwd(x, ws, bs, cfg):
    # symbolic_zeros: each differentiable input comes as CustomVJPPrimal(value,
    # perturbed); only the perturbed ones get gradients from the fused backward.
    # `saved` is not per row: under vmap this forward loops (as the backward does).
    xv, wv, bv = x.value, tuple(w.value for w in ws), tuple(b.value for b in bs)
    y, saved = _mlp_call(xv, wv, bv, cfg)
    want = (_wanted(x.perturbed), tuple(_wanted(w.perturbed) for w in ws), tuple(_wanted(b.perturbed) for b in bs))
    return y, (xv, wv, saved, want)


def _mlp_bwd(cfg, res, dy):
    x, ws, saved, (want_x, want_w, want_b) = res
    n_bias = len(want_b)
    none = (None, (None,) * len(ws), (None,) * n_bias)
    if isinstance(dy, jax.custom_derivatives.SymbolicZero):
        return none
    want_dx, want_dw = want_x is not None, [w is not None for w in want_w]
    # the biases' layers, then which of them are wanted
    layers = [i for i, h in enumerate(cfg[3]) if h]
    want_db = [False] * len(ws)
    for i, w in zip(layers, want_b):
        want_db[i] = w is not None
    outs = [jax.ShapeDtypeStruct(x.shape, x.dtype)] if want_dx else []
    outs += [jax.ShapeDtypeStruct(w.shape, w.dtype) for w, k in zip(ws, want_dw) if k]
    outs += [jax.ShapeDtypeStruct((w.shape[0],), w.dtype) for w, k in zip(ws, want_db) if k]
    if not outs:
        return none
    outs.append(_mlp_workspace(*_mlp_net(x, ws), np.dtype(x.dtype)))
    g = list(_call("mlp_backward", outs, dy, x, *ws, saved, vmap_method="sequential", want_dx=np.int64(want_dx),
                   dw_mask=_mask(want_dw), db_mask=_mask(want_db), **_mlp_attrs(len(ws), cfg)))[:-1]
    dx = g.pop(0) if want_dx else None
    dws = tuple(g.pop(0) if k else None for k in want_dw)
    dbs = tuple(g.pop(0) if want_db[i] else None for i in layers)
    return dx, dws, dbs


_mlp.defvjp(_mlp_fwd, _mlp_bwd, symbolic_zeros=True)


def mlp(x, weights, biases=None, hidden_act: str = "relu", out_act: str = "none", *, precision=None):
    """A multi-layer perceptron in one fused call each way (fk_mlp_forward /
    fk_mlp_backward): ``h = act_i(h @ weights[i].T + biases[i])`` for each layer
    from ``h = x``, ``act_i`` ``hidden_act`` below the last layer and ``out_act`` on
    it (``"none"``, ``"relu"``, ``"gelu_tanh"``, ``"gelu"`` (exact, erf)).

    ``x`` ``[..., k_0]`` (any leading shape); ``weights`` a sequence of 1 to 64
    arrays, ``weights[i]`` ``[n_i, k_i]`` with ``k_{i+1} = n_i``; ``biases`` None
    (no layer has one) or a sequence of ``len(weights)`` entries, each ``[n_i]`` or
    None (that layer has none). f16, bf16 or f32 (one dtype; f32 accumulation).
    ``precision`` (see :func:`allow_tf32`) chooses strict f32 or TF32 products on
    CUDA; None follows ``jax_default_matmul_precision``. The gradient is the fused
    backward, computing only the gradients asked for (``jax.grad`` with respect to
    the weights alone computes no ``dx``). ``vmap``: a batched ``x`` alone is one
    more leading axis, one call (and one fused backward for ``grad`` of ``vmap``);
    a batched weight or bias loops."""
    where = "mlp"
    x = _arr(x, "x", where)
    for name, act in (("hidden_act", hidden_act), ("out_act", out_act)):
        if act not in _ACTIVATIONS:
            raise ValueError(f"fusekit.jax.mlp: {name} {act!r} is not one of none, relu, gelu_tanh, gelu")
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise TypeError(f"fusekit.jax.mlp: weights must be a sequence of arrays, got {type(weights).__name__}")
    n = len(weights)
    if not 1 <= n <= _lib.MLP_MAX_LAYERS:
        raise ValueError(f"fusekit.jax.mlp: weights has {n} layers; the op takes 1 to {_lib.MLP_MAX_LAYERS}")
    if biases is None:
        biases = (None,) * n
    if isinstance(biases, (str, bytes)) or not hasattr(biases, "__len__") or len(biases) != n:
        raise ValueError(f"fusekit.jax.mlp: biases must be None or a sequence of {n} entries (one per layer, "
                         "each an array or None)")
    ws = [_arr(w, f"weights[{i}]", where) for i, w in enumerate(weights)]
    bs = [None if b is None else _arr(b, f"biases[{i}]", where) for i, b in enumerate(biases)]
    _dtype_in(x, "x", _MLP_DTYPES, where)
    arrays = {"x": x, **{f"weights[{i}]": w for i, w in enumerate(ws)},
              **{f"biases[{i}]": b for i, b in enumerate(bs) if b is not None}}
    _same_dtype(where, **arrays)
    if x.ndim < 1:
        raise ValueError("fusekit.jax.mlp: x must have at least one dimension")
    k = x.shape[-1]
    for i, w in enumerate(ws):
        src = f"x has {k} features" if i == 0 else f"layer {i - 1} gives {k}"
        _shape(w, f"weights[{i}]", (None, k), f"[n, {k}] (layer {i} takes {k} inputs: {src})", where)
        if bs[i] is not None:
            _shape(bs[i], f"biases[{i}]", (w.shape[0],), f"[{w.shape[0]}] (layer {i} has {w.shape[0]} outputs)",
                   where)
        k = w.shape[0]
    has_bias = tuple(b is not None for b in bs)
    cfg = (_ACTIVATIONS[hidden_act], _ACTIVATIONS[out_act], 1 if allow_tf32(precision) else 0, has_bias)
    present = [b for b in bs if b is not None]
    args = _unify(x, *ws, *present)
    fn = lambda x, *p: _mlp(x, tuple(p[:n]), tuple(p[n:]), cfg)  # noqa: E731
    return _fold_under_vmap(fn, args, rows=(True,) + (False,) * (len(args) - 1), merge=False)


# ---------------------------------------------------------------------------
# Gaussian field
# ---------------------------------------------------------------------------


def _workspace(dtype, b: int, n: int):
    """The workspace result of a Gaussian backward: the CUDA size when jax has a
    CUDA backend (the CPU needs none), in elements of ``dtype``."""
    _register()
    nbytes = 0
    if "CUDA" in _registered:
        v = ctypes.c_size_t(0)
        code = {np.dtype(jnp.float32): _lib.DTYPE_F32, np.dtype(jnp.float64): _lib.DTYPE_F64}[np.dtype(dtype)]
        _check(_library().fk_xla_gaussian_workspace_bytes(_lib.DEVICE_CUDA, code, b, n, ctypes.byref(v)),
               "fk_xla_gaussian_workspace_bytes")
        nbytes = v.value
    itemsize = np.dtype(dtype).itemsize
    return jax.ShapeDtypeStruct(((nbytes + itemsize - 1) // itemsize,), dtype)


def _gaussian_inputs(where: str, points, means, chol, weights=None):
    points, means, chol = (_arr(points, "points", where), _arr(means, "means", where), _arr(chol, "chol", where))
    _dtype_in(points, "points", (jnp.float32, jnp.float64), where)
    arrays = {"points": points, "means": means, "chol": chol}
    if weights is not None:
        weights = _arr(weights, "weights", where)
        arrays["weights"] = weights
    _same_dtype(where, **arrays)
    _shape(points, "points", (None, 3), "[B, 3]", where)
    _shape(means, "means", (None, 3), "[N, 3]", where)
    n = means.shape[0]
    _shape(chol, "chol", (n, 3, 3), f"[N, 3, 3] with N = {n} from means", where)
    if weights is not None:
        _shape(weights, "weights", (n,), f"[N] with N = {n} from means", where)
    return points, means, chol, weights


def _eps(eps, where: str) -> float:
    if not isinstance(eps, (int, float, np.floating, np.integer)):
        raise TypeError(f"fusekit.jax.{where}: eps must be a Python number (static), got {type(eps).__name__}")
    return float(eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _mahalanobis(points, means, chol, eps):
    def call(points, means, chol):
        shape = (points.shape[0], means.shape[0])
        return _call("mahalanobis_forward", jax.ShapeDtypeStruct(shape, points.dtype), points, means, chol,
                     vmap_method="sequential", eps=np.float64(eps))

    return _foldable(call, rows=(True, False, False))(points, means, chol)


def _mahalanobis_fwd(points, means, chol, eps):
    return _mahalanobis(points, means, chol, eps), (points, means, chol)


def _mahalanobis_bwd(eps, res, g):
    points, means, chol = res
    dt = points.dtype
    outs = [
        jax.ShapeDtypeStruct(points.shape, dt),
        jax.ShapeDtypeStruct(means.shape, dt),
        jax.ShapeDtypeStruct(chol.shape, dt),
        _workspace(dt, points.shape[0], means.shape[0]),
    ]
    dp, dm, dl, _ = _call(
        "mahalanobis_backward", outs, points, means, chol, g, vmap_method="sequential", eps=np.float64(eps)
    )
    return dp, dm, dl


_mahalanobis.defvjp(_mahalanobis_fwd, _mahalanobis_bwd)


def mahalanobis(points, means, chol, eps: float = 0.0):
    """Squared Mahalanobis distances ``out[b, n] = |(L_n + eps I)^-1 (p_b - mu_n)|^2``
    (fk_mahalanobis_forward): ``points [B, 3]``, ``means [N, 3]``, ``chol [N, 3, 3]``
    (lower-triangular factors; the upper part is ignored), f32 or f64; ``eps``
    static. The gradient is fusekit's fused backward (fk_mahalanobis_backward).
    ``vmap``: with only ``points`` batched the vmapped axis is folded into ``B``,
    one call (and one fused backward for ``grad`` of ``vmap``); a batched
    ``means`` or ``chol`` loops."""
    points, means, chol, _ = _gaussian_inputs("mahalanobis", points, means, chol)
    eps = _eps(eps, "mahalanobis")
    return _fold_under_vmap(lambda p, m, L: _mahalanobis(p, m, L, eps), _unify(points, means, chol),
                            rows=(True, False, False))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _field(points, means, chol, weights, eps):
    def call(points, means, chol, weights):
        return _call("field_forward", jax.ShapeDtypeStruct((points.shape[0],), points.dtype), points, means, chol,
                     weights, vmap_method="sequential", eps=np.float64(eps))

    return _foldable(call, rows=(True, False, False, False))(points, means, chol, weights)


def _field_fwd(points, means, chol, weights, eps):
    return _field(points, means, chol, weights, eps), (points, means, chol, weights)


def _field_bwd(eps, res, dout):
    points, means, chol, weights = res
    dt = points.dtype
    outs = [
        jax.ShapeDtypeStruct(points.shape, dt),
        jax.ShapeDtypeStruct(means.shape, dt),
        jax.ShapeDtypeStruct(chol.shape, dt),
        jax.ShapeDtypeStruct(weights.shape, dt),
        _workspace(dt, points.shape[0], means.shape[0]),
    ]
    dp, dm, dl, dw, _ = _call(
        "field_backward", outs, points, means, chol, weights, dout, vmap_method="sequential", eps=np.float64(eps)
    )
    return dp, dm, dl, dw


_field.defvjp(_field_fwd, _field_bwd)


def gaussian_field(points, means, chol, weights, eps: float = 0.0):
    """The fused Gaussian field ``out[b] = sum_n w_n exp(-m[b, n] / 2)``
    (fk_gaussian_field_forward; ``m`` as :func:`mahalanobis`), ``weights [N]``. The
    gradient is fusekit's fused backward (fk_gaussian_field_backward, no ``[B, N]``
    intermediate). ``vmap``: as :func:`mahalanobis` (a batched ``weights`` loops
    too)."""
    points, means, chol, weights = _gaussian_inputs("gaussian_field", points, means, chol, weights)
    eps = _eps(eps, "gaussian_field")
    return _fold_under_vmap(lambda p, m, L, w: _field(p, m, L, w, eps), _unify(points, means, chol, weights),
                            rows=(True, False, False, False))


# ---------------------------------------------------------------------------
# Geodesic flow
# ---------------------------------------------------------------------------

#: The clamp bound the bindings default to (the source model's value).
DEFAULT_C = 5.0

_GEO_ALLOW_TF32, _GEO_ALLOW_TF32X3 = 1, 4
_GEO_REAL = (jnp.float32, jnp.float64)


def _geo_flags(precision, x3: bool) -> int:
    """The geodesic ``flags`` for a forward: TF32, 3xTF32 where the op has it
    (``x3``: the leapfrog forward), else strict."""
    mode = precision_mode(precision)
    if mode == "tf32":
        return _GEO_ALLOW_TF32
    if mode == "tf32x3" and x3:
        return _GEO_ALLOW_TF32X3
    return 0


def _static(x, name: str, where: str, kind=float):
    ok = (int, np.integer) if kind is int else (int, float, np.floating, np.integer)
    if isinstance(x, bool) or not isinstance(x, ok):
        what = "an integer" if kind is int else "a Python number"
        raise TypeError(f"fusekit.jax.{where}: {name} must be {what} (static), got {type(x).__name__}")
    return kind(x)


def _geo_inputs(where: str, vname: str, v, U, W, **rows):
    """Checks ``v [B, D]``, ``U``/``W`` ``[D, R]`` and the ``[B, D]`` arrays in
    ``rows`` (None skipped); returns them as arrays, in order."""
    v, U, W = _arr(v, vname, where), _arr(U, "U", where), _arr(W, "W", where)
    _dtype_in(v, vname, _GEO_REAL, where)
    rows = {k: (None if x is None else _arr(x, k, where)) for k, x in rows.items()}
    _same_dtype(where, **{vname: v, "U": U, "W": W}, **{k: x for k, x in rows.items() if x is not None})
    _shape(v, vname, (None, None), "[B, D]", where)
    b, d = v.shape
    _shape(U, "U", (d, None), f"[D, R] with D = {d} from {vname}", where)
    _shape(W, "W", tuple(U.shape), f"[D, R] = {list(U.shape)} like U", where)
    for k, x in rows.items():
        if x is not None:
            _shape(x, k, (b, d), f"[B, D] = [{b}, {d}] like {vname}", where)
    return (v, U, W, *rows.values())


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _christoffel(v, U, W, c, flags):
    def call(v, U, W):
        return _call("christoffel_forward", jax.ShapeDtypeStruct(v.shape, v.dtype), v, U, W,
                     vmap_method="sequential", c=np.float64(c), flags=np.int64(flags))

    return _foldable(call, rows=(True, False, False))(v, U, W)


def _christoffel_fwd(v, U, W, c, flags):
    return _christoffel(v, U, W, c, flags), (v, U, W)


def _christoffel_bwd(c, flags, res, g):
    v, U, W = res
    outs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (v, U, W)]
    # the backward is strict whatever the forward's flags (fusekit ignores them there)
    dv, dU, dW = _call(
        "christoffel_backward", outs, v, U, W, g, vmap_method="sequential", c=np.float64(c), want=np.int64(7)
    )
    return dv, dU, dW


_christoffel.defvjp(_christoffel_fwd, _christoffel_bwd)


def christoffel(v, U, W, c: float = DEFAULT_C, *, precision=None):
    """The clamped low-rank Christoffel map ``clamp((v U)^2 W^T, -c, c)``
    (fk_christoffel_forward): ``v [B, D]``, ``U``, ``W`` ``[D, R]``, f32 or f64
    (one dtype); ``c`` static (``inf`` disables the clamp; NaN passes it). The
    gradient (``v``, ``U``, ``W``) is fusekit's fused backward
    (fk_christoffel_backward; strict f32). ``precision`` (see
    :func:`precision_mode`): TF32 lets the f32 CUDA forward use tensor cores
    (``FK_GEO_ALLOW_TF32``, ~5e-4 relative); None follows
    ``jax_default_matmul_precision``. ``vmap``: with only ``v`` batched the
    vmapped axis is folded into ``B``, one call (and one fused backward for
    ``grad`` of ``vmap``, ``U``, ``W`` gradients summed over all rows); a batched
    ``U`` or ``W`` loops. Rows are independent, so it shards along ``B``
    (``shard_map``)."""
    v, U, W = _geo_inputs("christoffel", "v", v, U, W)
    c = _static(c, "c", "christoffel")
    flags = _geo_flags(precision, x3=False)
    return _fold_under_vmap(lambda v, U, W: _christoffel(v, U, W, c, flags), _unify(v, U, W),
                            rows=(True, False, False))


def _leapfrog_attrs(f, mu, dt, steps, c, flags):
    return dict(
        has_f=np.int64(f is not None),
        has_mu=np.int64(mu is not None),
        dt=np.float64(dt),
        steps=np.int64(steps),
        c=np.float64(c),
        flags=np.int64(flags),
    )


#: which of the leapfrog's (x0, v0, U, W, f, mu) are row operands
_LEAPFROG_ROWS = (True, True, False, False, True, False)


def _leapfrog_call(x0, v0, U, W, f, mu, dt, steps, c, flags, traj: bool):
    attrs = _leapfrog_attrs(f, mu, dt, steps, c, flags)

    def call(x0, v0, U, W, f, mu):
        args = [x for x in (x0, v0, U, W, f, mu) if x is not None]
        shapes = [jax.ShapeDtypeStruct(x0.shape, x0.dtype), jax.ShapeDtypeStruct(v0.shape, v0.dtype)]
        if traj:
            shapes.append(jax.ShapeDtypeStruct((steps, 2) + tuple(v0.shape), v0.dtype))
        return tuple(_call("leapfrog_forward", shapes, *args, vmap_method="sequential", **attrs))

    # the trajectory [steps, 2, B, D] has its rows on axis 2
    return _foldable(call, rows=_LEAPFROG_ROWS, out_axes=(0, 0, 2) if traj else (0, 0))(x0, v0, U, W, f, mu)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _leapfrog(x0, v0, U, W, f, mu, dt, steps, c, flags, save_traj):
    x, v = _leapfrog_call(x0, v0, U, W, f, mu, dt, steps, c, flags, traj=False)
    return x, v


def _leapfrog_fwd(x0, v0, U, W, f, mu, dt, steps, c, flags, save_traj):
    out = _leapfrog_call(x0, v0, U, W, f, mu, dt, steps, c, flags, traj=save_traj)
    traj = out[2] if save_traj else None
    return (out[0], out[1]), (v0, U, W, f, mu, traj)


def _leapfrog_bwd(dt, steps, c, flags, save_traj, res, gs):
    v0, U, W, f, mu, traj = res
    gx, gv = gs
    # dx0 = gx (x enters x_T only additively); the others from fusekit's backward
    # (strict; its recomputed forward too)
    want = 2 | (4 if f is not None else 0) | 8 | 16
    outs = [jax.ShapeDtypeStruct(v0.shape, v0.dtype)]
    if f is not None:
        outs.append(jax.ShapeDtypeStruct(f.shape, f.dtype))
    outs += [jax.ShapeDtypeStruct(U.shape, U.dtype), jax.ShapeDtypeStruct(W.shape, W.dtype)]
    args = [x for x in (v0, U, W, f, mu, traj) if x is not None] + [gx, gv]
    attrs = _leapfrog_attrs(f, mu, dt, steps, c, 0)
    grads = list(_call("leapfrog_backward", outs, *args, vmap_method="sequential",
                       has_traj=np.int64(traj is not None), want=np.int64(want), **attrs))
    dv0 = grads.pop(0)
    df = grads.pop(0) if f is not None else None
    dU, dW = grads
    # mu gets no gradient (fusekit's backward has none; leapfrog stops it)
    return gx, dv0, dU, dW, df, (None if mu is None else jnp.zeros_like(mu))


_leapfrog.defvjp(_leapfrog_fwd, _leapfrog_bwd)


def leapfrog(x0, v0, U, W, dt: float, steps: int, f=None, mu=None, c: float = DEFAULT_C, *,
             save_traj: bool = True, precision=None):
    """``steps`` fused kick-drift-kick steps (fk_leapfrog_forward): returns
    ``(x_T, v_T)``. ``x0``, ``v0`` ``[B, D]``, ``U``, ``W`` ``[D, R]``, ``f`` ``[B, D]``
    (a constant force) and ``mu`` ``[D]`` (per-feature friction) optional; f32 or
    f64 (one dtype); ``dt``, ``steps``, ``c`` static.

    Differentiable with respect to ``x0``, ``v0``, ``U``, ``W`` and ``f`` through
    fusekit's backward (fk_leapfrog_backward, strict). ``mu`` gets no gradient
    (fusekit has none: it is wrapped in ``jax.lax.stop_gradient``). With
    ``save_traj`` (the default) the differentiated forward also writes the
    trajectory ``[steps, 2, B, D]`` for the backward to read; ``False`` saves that
    memory and the backward recomputes it. ``precision`` (see
    :func:`precision_mode`): TF32 (``FK_GEO_ALLOW_TF32``) or 3xTF32
    (``FK_GEO_ALLOW_TF32X3``, f32-level accuracy) for the f32 CUDA forward; None
    follows ``jax_default_matmul_precision``. ``vmap``: as :func:`christoffel`,
    one call with only the rows (``x0``, ``v0``, ``f``) batched, a loop with a
    batched ``U``, ``W`` or ``mu``; rows are independent, so it shards along ``B``."""
    where = "leapfrog"
    v0, U, W, x0, f = _geo_inputs(where, "v0", v0, U, W, x0=x0, f=f)
    if mu is not None:
        mu = _arr(mu, "mu", where)
        _same_dtype(where, v0=v0, mu=mu)
        _shape(mu, "mu", (v0.shape[1],), f"[D] with D = {v0.shape[1]} from v0", where)
        mu = jax.lax.stop_gradient(mu)
    dt = _static(dt, "dt", where)
    steps = _static(steps, "steps", where, int)
    if steps < 1:
        raise ValueError(f"fusekit.jax.leapfrog: steps must be >= 1, got {steps}")
    c = _static(c, "c", where)
    flags, save_traj = _geo_flags(precision, x3=True), bool(save_traj)
    return _fold_under_vmap(lambda *a: _leapfrog(*a, dt, steps, c, flags, save_traj), _unify(x0, v0, U, W, f, mu),
                            rows=_LEAPFROG_ROWS, out_axes=(0, 0))


# ---------------------------------------------------------------------------
# Optimizer math
# ---------------------------------------------------------------------------

_GEMM_ALLOW_TF32 = 1


def _mats(x, name: str, where: str):
    """``[rows, cols]`` or ``[batch, rows, cols]``."""
    if x.ndim not in (2, 3):
        raise ValueError(f"fusekit.jax.{where}: {name} must be [rows, cols] or [batch, rows, cols], "
                         f"got shape {tuple(x.shape)}")


def _not_differentiable(where: str, why: str):
    """A custom_vjp rule whose backward refuses, at trace time, with a message."""

    def bwd(*_):
        raise TypeError(f"fusekit.jax.{where} is not differentiable: {why}")

    return bwd


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5))
def _matrix_power(a, power, eps, method, max_iter, flags):
    vm = "expand_dims" if a.ndim == 2 else "sequential"
    out = jax.ShapeDtypeStruct(a.shape, a.dtype)
    if method == "eigh":
        return _call("matrix_power_eigh", out, a, vmap_method=vm, power=np.float64(power), eps=np.float64(eps))
    return _call("matrix_power", out, a, vmap_method=vm, power=np.float64(power), eps=np.float64(eps),
                 max_iter=np.int64(max_iter), flags=np.int64(flags))


_matrix_power.defvjp(
    lambda a, *rest: (_matrix_power(a, *rest), None),
    _not_differentiable("matrix_power", "fusekit has no backward for fk_matrix_power"),
)


def matrix_power(a, power: float, eps: float = 0.0, *, method: str = "newton", max_iter: int = 20,
                 precision=None):
    """``(A + eps I)^power`` of symmetric positive (semi-)definite matrices
    (fk_matrix_power): ``a [n, n]`` or ``[batch, n, n]``, f32 or f64; ``power``,
    ``eps`` static.

    - ``method="newton"`` (default): the coupled Newton iteration for inverse roots
      (``power = -1/p``, integer ``1 <= p <= 64``), exactly ``max_iter`` iterations
      with no residual check (``tol = 0``): nothing is read on the host, so the
      handler is capturable into XLA's CUDA graphs. All of ``a`` is read (it must
      be symmetric) and ``A + eps I`` must be positive definite; 20 iterations
      reach f32 accuracy for condition numbers up to about 1e6, f64 needs a few
      more. ``precision``: TF32 GEMMs (f32 on CUDA, ~1e-3 relative) or strict.
    - ``method="eigh"``: the eigendecomposition, any real power, reads the upper
      triangle and shifts a spectrum whose minimum is below ``eps`` up to ``eps``.
      It reads cuSOLVER's flags on the host, so its handler is declared not
      capturable (XLA runs it outside its CUDA graphs).

    Not differentiable (fusekit has no backward; ``jax.grad`` raises). ``vmap``:
    one call for a 2-D ``a`` (a batch), a loop for a 3-D one."""
    where = "matrix_power"
    a = _arr(a, "a", where)
    _dtype_in(a, "a", _GEO_REAL, where)
    _mats(a, "a", where)
    if a.shape[-1] != a.shape[-2]:
        raise ValueError(f"fusekit.jax.matrix_power: a must hold square matrices, got shape {tuple(a.shape)}")
    if method not in ("newton", "eigh"):
        raise ValueError(f"fusekit.jax.matrix_power: method {method!r} is not 'newton' or 'eigh'")
    power, eps = _static(power, "power", where), _static(eps, "eps", where)
    max_iter = _static(max_iter, "max_iter", where, int)
    flags = _GEMM_ALLOW_TF32 if method == "newton" and allow_tf32(precision) else 0
    return _matrix_power(a, power, eps, method, max_iter, flags)


def _sym_upper(x):
    """The symmetric matrix whose upper triangle is ``x``'s (what fusekit reads)."""
    u = jnp.triu(x)
    return u + jnp.swapaxes(jnp.triu(x, 1), -1, -2)


def _stats_ref(grad, l, r, alpha, beta):
    hp = jax.lax.Precision.HIGHEST
    gt = jnp.swapaxes(grad, -1, -2)
    lo = None if l is None else beta * _sym_upper(l) + alpha * jnp.matmul(grad, gt, precision=hp)
    ro = None if r is None else beta * _sym_upper(r) + alpha * jnp.matmul(gt, grad, precision=hp)
    return lo, ro


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _shampoo_stats(grad, l, r, alpha, beta, flags):
    outs, args, aliases = [], [grad], {}
    for x in (l, r):
        if x is not None:
            aliases[len(args)] = len(outs)
            args.append(x)
            outs.append(jax.ShapeDtypeStruct(x.shape, x.dtype))
    vm = "broadcast_all" if grad.ndim == 2 else "sequential"
    res = _call("shampoo_stats", outs, *args, vmap_method=vm, aliases=aliases,
                has_l=np.int64(l is not None), has_r=np.int64(r is not None),
                alpha=np.float64(alpha), beta=np.float64(beta), flags=np.int64(flags))
    res = list(res)
    return (res.pop(0) if l is not None else None), (res.pop(0) if r is not None else None)


def _shampoo_stats_fwd(grad, l, r, alpha, beta, flags):
    return _shampoo_stats(grad, l, r, alpha, beta, flags), (grad, l, r)


def _shampoo_stats_bwd(alpha, beta, flags, res, g):
    grad, l, r = res
    return jax.vjp(lambda *p: _stats_ref(*p, alpha, beta), grad, l, r)[1](g)


_shampoo_stats.defvjp(_shampoo_stats_fwd, _shampoo_stats_bwd)


def shampoo_stats(grad, l=None, r=None, alpha: float = 1.0, beta: float = 1.0, *, precision=None):
    """Shampoo's statistics (fk_shampoo_stats_ex): returns ``(L', R')`` with
    ``L' = beta L + alpha G G^T`` and ``R' = beta R + alpha G^T G``; ``grad``
    ``[m, n]`` or ``[batch, m, n]``, ``l`` ``[(batch,) m, m]`` and ``r``
    ``[(batch,) n, n]``, each optional (None: not computed, None returned) but not
    both; f32 or f64. Only the upper triangles of ``l`` and ``r`` are read; the
    results are exactly symmetric. ``alpha``, ``beta`` static. The update is in
    place in XLA's terms (``input_output_aliases``: ``l`` and ``r`` are donated to
    the results where XLA can). ``precision``: TF32 products for f32 on CUDA.
    Differentiable (JAX's rule of the formula); ``vmap``: one call for a 2-D
    ``grad``, a loop for a 3-D one."""
    where = "shampoo_stats"
    grad = _arr(grad, "grad", where)
    _dtype_in(grad, "grad", _GEO_REAL, where)
    _mats(grad, "grad", where)
    if l is None and r is None:
        raise ValueError("fusekit.jax.shampoo_stats: give l, r or both (the statistics to update)")
    arrays = {"grad": grad}
    m, n = grad.shape[-2:]
    lead = tuple(grad.shape[:-2])
    l = None if l is None else _arr(l, "l", where)
    r = None if r is None else _arr(r, "r", where)
    for name, x, k in (("l", l, m), ("r", r, n)):
        if x is not None:
            arrays[name] = x
            want = lead + (k, k)
            _shape(x, name, want, f"[{', '.join(map(str, want))}] for grad of shape {tuple(grad.shape)}", where)
    _same_dtype(where, **arrays)
    alpha, beta = _static(alpha, "alpha", where), _static(beta, "beta", where)
    flags = _GEMM_ALLOW_TF32 if allow_tf32(precision) else 0
    grad, l, r = _unify(grad, l, r)
    return _shampoo_stats(grad, l, r, alpha, beta, flags)


def _precondition_ref(grad, l, r):
    hp = jax.lax.Precision.HIGHEST
    out = grad if r is None else jnp.matmul(grad, r, precision=hp)
    return out if l is None else jnp.matmul(l, out, precision=hp)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _precondition(grad, l, r, flags):
    vm = "broadcast_all" if grad.ndim == 2 else "sequential"
    args = [x for x in (grad, l, r) if x is not None]
    return _call("shampoo_precondition", jax.ShapeDtypeStruct(grad.shape, grad.dtype), *args, vmap_method=vm,
                 has_l=np.int64(l is not None), has_r=np.int64(r is not None), flags=np.int64(flags))


def _precondition_fwd(grad, l, r, flags):
    return _precondition(grad, l, r, flags), (grad, l, r)


def _precondition_bwd(flags, res, g):
    return jax.vjp(_precondition_ref, *res)[1](g)


_precondition.defvjp(_precondition_fwd, _precondition_bwd)


def shampoo_precondition(grad, l_root=None, r_root=None, *, precision=None):
    """Shampoo's preconditioned direction ``L_root grad R_root``
    (fk_shampoo_precondition): ``grad`` ``[m, n]`` or ``[batch, m, n]``, ``l_root``
    ``[m, m]`` and ``r_root`` ``[n, n]`` (or with grad's batch), each optional
    (None: the identity); f32 or f64. ``precision``: TF32 products for f32 on
    CUDA. Differentiable (JAX's rule of the products); ``vmap``: one call for a 2-D
    ``grad``, a loop for a 3-D one."""
    where = "shampoo_precondition"
    grad = _arr(grad, "grad", where)
    _dtype_in(grad, "grad", _GEO_REAL, where)
    _mats(grad, "grad", where)
    m, n = grad.shape[-2:]
    arrays = {"grad": grad}
    roots = []
    for name, x, k in (("l_root", l_root, m), ("r_root", r_root, n)):
        if x is not None:
            x = _arr(x, name, where)
            arrays[name] = x
            ok = x.shape[-2:] == (k, k) and (x.ndim == 2 or (x.ndim == 3 and grad.ndim == 3
                                                                and x.shape[0] in (1, grad.shape[0])))
            if not ok:
                raise ValueError(f"fusekit.jax.shampoo_precondition: {name} must be [{k}, {k}] (or with grad's "
                                 f"batch), got shape {tuple(x.shape)} for grad of shape {tuple(grad.shape)}")
        roots.append(x)
    _same_dtype(where, **arrays)
    flags = _GEMM_ALLOW_TF32 if allow_tf32(precision) else 0
    grad, l, r = _unify(grad, *roots)
    return _precondition(grad, l, r, flags)


def _psg_inputs(where: str, a, g):
    a, g = _arr(a, "a", where), _arr(g, "g", where)
    _dtype_in(a, "a", _GEO_REAL, where)
    _same_dtype(where, a=a, g=g)
    if a.ndim not in (2, 3) or g.ndim != a.ndim or a.shape[:-1] != g.shape[:-1]:
        raise ValueError(
            f"fusekit.jax.{where}: a must be [B, in] or [B, T, in] and g [B, out] or [B, T, out] with the same "
            f"leading dimensions, got {tuple(a.shape)} and {tuple(g.shape)}"
        )
    return _unify(a, g)


def _psg_ref(a, g):
    hp = jax.lax.Precision.HIGHEST
    if a.ndim == 2:
        return jnp.einsum("bo,bi->boi", g, a, precision=hp)
    return jnp.einsum("bto,bti->boi", g, a, precision=hp)


def _norms_ref(a, g):
    hp = jax.lax.Precision.HIGHEST
    if a.ndim == 2:
        return (g * g).sum(-1) * (a * a).sum(-1)
    aa = jnp.einsum("bti,bsi->bts", a, a, precision=hp)
    gg = jnp.einsum("bto,bso->bts", g, g, precision=hp)
    return (aa * gg).sum((-1, -2))


def _clipped_ref(a, g, max_norm):
    sq = _norms_ref(a, g)
    norm = jnp.sqrt(sq)
    s = jnp.where(norm > max_norm, max_norm / jnp.where(norm > 0, norm, 1), 1.0)
    hp = jax.lax.Precision.HIGHEST
    gs = g * (s[:, None] if g.ndim == 2 else s[:, None, None])
    out = jnp.einsum("bo,bi->oi" if a.ndim == 2 else "bto,bti->oi", gs, a, precision=hp)
    return out, sq


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _per_sample_grads(a, g, flags):
    def call(a, g):
        shape = (a.shape[0], g.shape[-1], a.shape[-1])
        return _call("per_sample_grads", jax.ShapeDtypeStruct(shape, a.dtype), a, g, vmap_method="sequential",
                     flags=np.int64(flags))

    # samples are independent: a vmapped axis folds into B (the backward is jnp's)
    return _foldable(call, rows=(True, True))(a, g)


_per_sample_grads.defvjp(
    lambda a, g, flags: (_per_sample_grads(a, g, flags), (a, g)),
    lambda flags, res, ct: jax.vjp(_psg_ref, *res)[1](ct),
)


def per_sample_grads(a, g, *, precision=None):
    """Per-sample gradients of a linear layer ``y = a W^T``, materialised
    (fk_per_sample_grads): ``out[b] = g_b^T a_b`` ``[B, out, in]`` for ``a``
    ``[B, in]`` or ``[B, T, in]`` and ``g`` ``[B, out]`` or ``[B, T, out]``; f32 or
    f64. ``precision``: TF32 for f32 sequences on CUDA. Differentiable (JAX's
    rule); ``vmap``: the vmapped axis folds into ``B``, one call; shards along
    ``B``."""
    a, g = _psg_inputs("per_sample_grads", a, g)
    return _per_sample_grads(a, g, _GEMM_ALLOW_TF32 if allow_tf32(precision) else 0)


@jax.custom_vjp
def _norms(a, g):
    def call(a, g):
        return _call("per_sample_grad_norms", jax.ShapeDtypeStruct((a.shape[0],), a.dtype), a, g,
                     vmap_method="sequential")

    return _foldable(call, rows=(True, True))(a, g)


_norms.defvjp(lambda a, g: (_norms(a, g), (a, g)), lambda res, ct: jax.vjp(_norms_ref, *res)[1](ct))


def per_sample_grad_norms(a, g):
    """Squared Frobenius norms ``|g_b^T a_b|_F^2`` ``[B]`` of a linear layer's
    per-sample gradients without forming them (fk_per_sample_grad_norms): ``a``,
    ``g`` as :func:`per_sample_grads` (``|g_b|^2 |a_b|^2``, or the Gram form for
    sequences). Differentiable (JAX's rule of the formula); ``vmap``: folded into
    ``B``, one call.
    Samples are independent: it shards along ``B`` (``shard_map``)."""
    a, g = _psg_inputs("per_sample_grad_norms", a, g)
    return _norms(a, g)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _clipped(a, g, max_norm, flags):
    res = [jax.ShapeDtypeStruct((g.shape[-1], a.shape[-1]), a.dtype), jax.ShapeDtypeStruct((a.shape[0],), a.dtype)]
    out, sq = _call("dp_clipped_grad_sum", res, a, g, vmap_method="sequential", max_norm=np.float64(max_norm),
                    flags=np.int64(flags))
    return out, sq


_clipped.defvjp(
    lambda a, g, max_norm, flags: (_clipped(a, g, max_norm, flags), (a, g)),
    lambda max_norm, flags, res, ct: jax.vjp(lambda a, g: _clipped_ref(a, g, max_norm), *res)[1](ct),
)


def dp_clipped_grad_sum(a, g, max_norm: float, *, return_norms: bool = False, precision=None):
    """The DP-SGD clipped sum ``sum_b min(1, C / |G_b|_F) G_b`` ``[out, in]`` with
    ``G_b = g_b^T a_b`` and ``C = max_norm`` (static), never forming the ``G_b``
    (fk_dp_clipped_grad_sum); ``a``, ``g`` as :func:`per_sample_grads`. With
    ``return_norms`` also the squared norms ``[B]``. ``precision``: TF32 for the
    final f32 GEMM on CUDA. Differentiable (JAX's rule of the formula); ``vmap``: a
    loop (each element sums its own samples: folding them into ``B`` would sum
    across elements). Under ``shard_map`` along ``B`` each shard sums its samples: ``psum``
    the result."""
    a, g = _psg_inputs("dp_clipped_grad_sum", a, g)
    max_norm = _static(max_norm, "max_norm", "dp_clipped_grad_sum")
    out, sq = _clipped(a, g, max_norm, _GEMM_ALLOW_TF32 if allow_tf32(precision) else 0)
    return (out, sq) if return_norms else out
