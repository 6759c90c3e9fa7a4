"""Multi-layer perceptron (docs/ops.md section 6): a network of fused linear layers
in one call each way, one function per C entry point.

``h_0 = x``, ``h_{i+1} = act_i(h_i w_i^T + b_i)``, ``y = h_L``, with ``act_i =
hidden_act`` below the last layer and ``out_act`` on it; activations named as
:func:`fusekit.linear_forward` names them (``"none"``, ``"relu"``, ``"gelu"`` the
exact erf form, ``"gelu_tanh"``). float16, bfloat16 and float32.

- :func:`mlp_forward`: ``y``; with ``saved=True`` (or an array to fill) also what
  the backward needs, returned as ``(y, saved)``.
- :func:`mlp_backward`: ``(dx, dweights, dbiases)`` from ``dy``, ``x``, the weights
  and ``saved``; each gradient optional.
- :func:`mlp_saved_size`: the bytes of ``saved`` for a network's widths and rows.

Each takes numpy arrays, torch tensors (CPU or CUDA, run through the ctypes path on
torch's current stream), fusekit Buffers or other DLPack producers, and returns the
caller's kind of array. ``weights`` and ``biases`` are sequences (a bias entry may be
None: that layer has none). The differentiable module is
:class:`fusekit.nn.FusedMLP` (``fusekit.torch.nn``).
"""

from __future__ import annotations

import ctypes

from .._abi import _buffer_p
from .._core import Invocation, as_dtype
from .._context import default_context
from .._lib import ERROR_INVALID_ARGUMENT, lib, raise_error
from .linalg import FK_GEMM_ALLOW_TF32, _act

__all__ = ["mlp_saved_size", "mlp_forward", "mlp_backward"]

#: FK_MLP_MAX_LAYERS: the most layers one call takes.
MLP_MAX_LAYERS = 64
#: dtype of a ``saved`` array this module allocates (any dtype will do: the
#: library reads it as bytes), and its element size.
_SAVED_DTYPE = "float32"
_SAVED_ITEM = 4


def _rows(shape) -> int:
    r = 1
    for d in shape[:-1]:
        r *= int(d)
    return r


def _seq(v, where, name):
    if isinstance(v, (list, tuple)):
        return list(v)
    raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} must be a list or tuple, got {type(v).__name__}")


def _handles(bufs):
    """A C array of handles (None entries are NULL), or None for an empty list
    (the library then names the bad n_layers)."""
    if not bufs:
        return None
    return (_buffer_p * len(bufs))(*[b.handle if b is not None else None for b in bufs])


def _flags(allow_tf32) -> int:
    return FK_GEMM_ALLOW_TF32 if allow_tf32 else 0


def _saved_bytes(ctx, widths, rows, dtype, hidden, out) -> int:
    n = len(widths) - 1
    arr = (ctypes.c_int64 * max(len(widths), 1))(*[int(w) for w in widths])
    bytes_ = ctypes.c_size_t()
    lib().fk_mlp_saved_size(ctx.handle, n, arr, int(rows), int(dtype), hidden, out, ctypes.byref(bytes_))
    return bytes_.value


def mlp_saved_size(widths, rows: int, dtype, hidden_act="relu", out_act="none", *, device="auto") -> int:
    """Bytes of the ``saved`` array :func:`mlp_forward` fills for
    :func:`mlp_backward`: ``widths = [k_0, n_0, ..., n_{L-1}]`` (x's features, then
    each layer's outputs), ``rows`` (x's leading dimensions multiplied), on
    ``device``'s backend (a device string or a fusekit.Context; the layout may
    differ between backends)."""
    where = "fusekit.mlp_saved_size"
    widths = _seq(widths, where, "widths")
    ctx = default_context(device)
    return _saved_bytes(ctx, widths, rows, as_dtype(dtype, where), _act(hidden_act), _act(out_act))


def _weight_widths(X, W):
    """``[k_0, n_0, ..., n_{L-1}]`` from x's and the weights' shapes (the library
    checks them: a malformed shape gives 0 here and the library's message there)."""
    return [X.shape[-1] if X.shape else 0] + [w.shape[0] if len(w.shape) == 2 else 0 for w in W]


def mlp_forward(x, weights, biases=None, hidden_act="relu", out_act="none", *, allow_tf32=False, saved=False,
                out=None, stream=None):
    """``y = act_L(... act_0(x w_0^T + b_0) ...)``. ``saved``: False/None (inference:
    returns ``y``), True (allocate ``mlp_saved_size`` bytes) or an array to fill
    (contiguous, 16-byte aligned); then returns ``(y, saved)`` for
    :func:`mlp_backward`. ``out``: the array for ``y``."""
    where = "fusekit.mlp_forward"
    weights = _seq(weights, where, "weights")
    if biases is not None:
        biases = _seq(biases, where, "biases")
        if len(biases) != len(weights):
            raise_error(ERROR_INVALID_ARGUMENT, where,
                        f"biases has {len(biases)} entries but weights has {len(weights)} (one per layer, None for none)")
    ha, oa = _act(hidden_act), _act(out_act)
    with Invocation(where, stream) as inv:
        X = inv.input(x, "x")
        W = [inv.input(w, f"weights[{i}]") for i, w in enumerate(weights)]
        B = None
        if biases is not None:
            B = [inv.input(b, f"biases[{i}]") if b is not None else None for i, b in enumerate(biases)]
        widths = _weight_widths(X, W)
        Y = inv.output(out, "out", tuple(X.shape[:-1]) + (widths[-1],), X.dtype)
        y_res = inv.output_array
        S, s_res = None, None
        want_saved = saved is not None and saved is not False
        if want_saved:
            if saved is True:
                size = 0
                if 1 <= len(W) <= MLP_MAX_LAYERS and 0 <= ha <= 3 and 0 <= oa <= 3:
                    size = _saved_bytes(X.context, widths, _rows(X.shape), X.dtype, ha, oa)
                S = inv.output(None, "saved", (-(-size // _SAVED_ITEM),), as_dtype(_SAVED_DTYPE, where))
            else:
                S = inv.output(saved, "saved", None, X.dtype)
            s_res = inv.output_array
        sh = S.handle if S is not None and S.nbytes > 0 else None
        lib().fk_mlp_forward(X.handle, len(W), _handles(W), _handles(B) if B is not None else None, ha, oa,
                             _flags(allow_tf32), Y.handle, sh, inv.stream_handle)
        inv.set_result(y_res)
        inv.result()
        return (y_res, s_res) if want_saved else y_res


def _per_layer(arg, n, where, name):
    """``True``/``False``/``None`` for every layer, or one entry per layer."""
    if arg is None or isinstance(arg, bool):
        return [arg] * n
    arg = _seq(arg, where, name)
    if len(arg) != n:
        raise_error(ERROR_INVALID_ARGUMENT, where, f"{name} has {len(arg)} entries but weights has {n}")
    return arg


def mlp_backward(dy, x, weights, saved, hidden_act="relu", out_act="none", *, allow_tf32=False, dx=True,
                 dweights=True, dbiases=True, stream=None):
    """Gradients of :func:`mlp_forward` given ``dy`` and the forward's ``saved``
    (None only where its size is 0): returns ``(dx, dweights, dbiases)``, the last
    two lists with one entry per layer. ``dx``: True (allocate), an array to write
    or False/None (not wanted: None returned). ``dweights``/``dbiases``: the same
    for every layer, or a list with one such entry per layer. Gradients are
    overwritten, never accumulated; only the layers down to the lowest wanted
    gradient are computed."""
    where = "fusekit.mlp_backward"
    weights = _seq(weights, where, "weights")
    n = len(weights)
    dws = _per_layer(dweights, n, where, "dweights")
    dbs = _per_layer(dbiases, n, where, "dbiases")
    ha, oa = _act(hidden_act), _act(out_act)
    with Invocation(where, stream) as inv:
        DY = inv.input(dy, "dy")
        X = inv.input(x, "x")
        W = [inv.input(w, f"weights[{i}]") for i, w in enumerate(weights)]
        S = inv.input(saved, "saved") if saved is not None else None

        def out(arg, name, shape):
            if arg is None or arg is False:
                return None, None
            O = inv.output(None if arg is True else arg, name, shape, DY.dtype)
            return O, inv.output_array

        DX, dx_res = out(dx, "dx", tuple(X.shape))
        gw = [out(a, f"dweights[{i}]", tuple(w.shape)) for i, (a, w) in enumerate(zip(dws, W))]
        gb = [out(a, f"dbiases[{i}]", (w.shape[0] if len(w.shape) == 2 else 0,))
              for i, (a, w) in enumerate(zip(dbs, W))]
        hw = _handles([o for o, _ in gw]) if any(o is not None for o, _ in gw) else None
        hb = _handles([o for o, _ in gb]) if any(o is not None for o, _ in gb) else None
        sh = S.handle if S is not None and S.nbytes > 0 else None
        lib().fk_mlp_backward(DY.handle, X.handle, n, _handles(W), ha, oa, _flags(allow_tf32), sh,
                              DX.handle if DX is not None else None, hw, hb, inv.stream_handle)
        inv.set_result(dx_res)
        inv.result()
        return dx_res, [r for _, r in gw], [r for _, r in gb]


#: C entry point -> Python wrapper (checked by tests/test_bindings_complete.py).
ENTRY_POINTS = {
    "fk_mlp_saved_size": mlp_saved_size,
    "fk_mlp_forward": mlp_forward,
    "fk_mlp_backward": mlp_backward,
}
