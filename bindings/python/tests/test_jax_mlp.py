"""fusekit.jax.mlp: the fused multi-layer perceptron (fk_mlp_forward /
fk_mlp_backward) as XLA custom calls: values against a jnp reference (f32 at
"highest" precision; f16 and bf16 at their rounding), gradients of the fused
backward against jax.grad of the reference, partial gradients (only those asked
for are computed: the backward call's masks), layers without bias, every
activation, jit, vmap (folded into the row axes of x), the TF32 flag from jax's
precision setting, and errors (JAX's terms before the call, fusekit's message
from the handler). Skipped when jax is not installed.
"""

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import fusekit.jax as fkj  # noqa: E402
from test_jax import rand  # noqa: E402
from test_jax_vmap import check_vmap  # noqa: E402

ACTS = {
    "none": lambda z: z,
    "relu": jax.nn.relu,
    "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True),
    "gelu": lambda z: jax.nn.gelu(z, approximate=False),
}


def mlp_ref(x, ws, bs=None, hidden_act="relu", out_act="none"):
    """The network in jnp, f32 products at full precision (accumulated in f32 for
    f16 / bf16 inputs, each layer rounded once, as fusekit does)."""
    bs = bs if bs is not None else [None] * len(ws)
    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        z = jnp.matmul(h.astype(jnp.float32), w.astype(jnp.float32).T, precision="highest")
        if b is not None:
            z = z + b.astype(jnp.float32)
        h = ACTS[hidden_act if i < len(ws) - 1 else out_act](z).astype(x.dtype)
    return h


def net(rng, widths=(8, 6, 7, 3), dtype=jnp.float32, bias=(True, False, True)):
    ws = [0.5 * rand(rng, (n, k), dtype) for k, n in zip(widths[:-1], widths[1:])]
    bs = [rand(rng, (n,), dtype) if has else None for n, has in zip(widths[1:], bias)]
    return ws, bs


def close(got, want, tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def sq(fn):
    return lambda *a: (fn(*a).astype(jnp.float32) ** 2).sum()


def backward_attrs(f, *args):
    """The attributes of the backward handler call in f's jaxpr."""
    text = str(jax.make_jaxpr(f)(*args))
    calls = [c for c in text.split("ffi_call[")[1:] if "target_name=fusekit_mlp_backward" in c]
    assert len(calls) == 1, text
    return dict(re.findall(r"\('(\w+)', np\.int64\((-?\d+)\)\)", calls[0].split("custom_call_api_version")[0]))


# ---------------------------------------------------------------- values


@pytest.mark.parametrize("hidden_act", ["relu", "gelu", "gelu_tanh", "none"])
@pytest.mark.parametrize("out_act", ["none", "relu", "gelu"])
def test_values_match_jnp(rng, hidden_act, out_act):
    x = rand(rng, (2, 5, 8), jnp.float32)
    ws, bs = net(rng)
    want = mlp_ref(x, ws, bs, hidden_act, out_act)
    got = jax.jit(lambda x, ws, bs: fkj.mlp(x, ws, bs, hidden_act, out_act))(x, ws, bs)
    close(got, want, 2e-5)
    # eager as well (the same handler)
    close(fkj.mlp(x, ws, bs, hidden_act=hidden_act, out_act=out_act), want, 2e-5)


@pytest.mark.parametrize("dtype,tol", [(jnp.float16, 4e-3), (jnp.bfloat16, 3e-2)])
def test_half_precision_values_and_grads(rng, dtype, tol):
    x = rand(rng, (7, 8), dtype)
    ws, bs = net(rng, dtype=dtype)
    got = jax.jit(fkj.mlp)(x, ws, bs)
    assert got.dtype == dtype
    close(got, mlp_ref(x, ws, bs), tol * 4)
    g = jax.grad(sq(fkj.mlp), (0, 1))(x, ws, bs)
    # against the f32 network's gradients (the inputs are exact in f32)
    up = lambda t: jax.tree.map(lambda v: v.astype(jnp.float32), t)  # noqa: E731
    g32 = jax.grad(sq(fkj.mlp), (0, 1))(up(x), up(ws), up(bs))
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g32)):
        assert a.dtype == dtype
        scale = float(np.abs(np.asarray(b)).max())
        close(np.asarray(a, np.float64) / scale, np.asarray(b, np.float64) / scale, 20 * tol)


def test_no_bias_one_layer_and_1d_x(rng):
    x = rand(rng, (4, 8), jnp.float32)
    ws, _ = net(rng)
    close(fkj.mlp(x, ws), mlp_ref(x, ws), 2e-5)
    close(fkj.mlp(x, ws, [None, None, None], "gelu"), mlp_ref(x, ws, None, "gelu"), 2e-5)
    # one layer without activation saves nothing (an empty `saved`); gradients still flow
    w = ws[0]
    close(fkj.mlp(x, [w]), x @ w.T, 2e-5)
    g = jax.grad(sq(lambda x, w: fkj.mlp(x, [w])), (0, 1))(x, w)
    gr = jax.grad(sq(lambda x, w: jnp.matmul(x, w.T, precision="highest")), (0, 1))(x, w)
    for a, b in zip(g, gr):
        close(a, b, 1e-4)
    # a 1-D x is one row
    close(fkj.mlp(x[0], ws), mlp_ref(x[0], ws), 2e-5)
    # an empty batch: zero weight gradients
    e = jnp.zeros((0, 8), jnp.float32)
    assert fkj.mlp(e, ws).shape == (0, 3)
    assert all(float(jnp.abs(v).max()) == 0 for v in jax.grad(sq(fkj.mlp), 1)(e, ws))


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("hidden_act", ["relu", "gelu", "gelu_tanh", "none"])
@pytest.mark.parametrize("out_act", ["none", "gelu_tanh"])
def test_fused_backward_matches_jax_grad(rng, hidden_act, out_act):
    x = rand(rng, (3, 4, 8), jnp.float32)
    ws, bs = net(rng)
    f = lambda x, ws, bs: fkj.mlp(x, ws, bs, hidden_act, out_act)  # noqa: E731
    ref = lambda x, ws, bs: mlp_ref(x, ws, bs, hidden_act, out_act)  # noqa: E731
    g = jax.jit(jax.grad(sq(f), (0, 1, 2)))(x, ws, bs)
    gr = jax.grad(sq(ref), (0, 1, 2))(x, ws, bs)
    assert jax.tree.structure(g) == jax.tree.structure(gr)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(gr)):
        close(a, b, 2e-4)
    # one fused backward: every gradient of this call from it
    attrs = backward_attrs(jax.grad(sq(f), (0, 1, 2)), x, ws, bs)
    assert (attrs["want_dx"], attrs["dw_mask"], attrs["db_mask"]) == ("1", "7", "5")


def test_check_grads(rng):
    x = rand(rng, (3, 6), jnp.float32)
    ws, bs = net(rng, widths=(6, 5, 4), bias=(True, True))
    with jax.default_matmul_precision("highest"):
        check_grads(lambda x, w0, w1, b1: fkj.mlp(x, [w0, w1], [None, b1], "gelu", "gelu_tanh"),
                    (x, ws[0], ws[1], bs[1]), order=1, modes=["rev"], eps=1e-2, atol=2e-2, rtol=2e-2)


def test_partial_gradients_compute_only_what_is_asked(rng):
    x = rand(rng, (5, 8), jnp.float32)
    ws, bs = net(rng)
    gr = jax.grad(sq(mlp_ref), (0, 1, 2))(x, ws, bs)
    # the weights only: no dx, no bias gradient
    gw = jax.jit(jax.grad(sq(fkj.mlp), 1))(x, ws, bs)
    for a, b in zip(gw, gr[1]):
        close(a, b, 2e-4)
    attrs = backward_attrs(jax.grad(sq(fkj.mlp), 1), x, ws, bs)
    assert (attrs["want_dx"], attrs["dw_mask"], attrs["db_mask"]) == ("0", "7", "0")
    # x only
    gx = jax.jit(jax.grad(sq(fkj.mlp)))(x, ws, bs)
    close(gx, gr[0], 2e-4)
    attrs = backward_attrs(jax.grad(sq(fkj.mlp)), x, ws, bs)
    assert (attrs["want_dx"], attrs["dw_mask"], attrs["db_mask"]) == ("1", "0", "0")
    # one layer's weight and one bias (a frozen rest)
    f = lambda w1, b2: sq(fkj.mlp)(x, [ws[0], w1, ws[2]], [bs[0], None, b2])  # noqa: E731
    g1, g2 = jax.grad(f, (0, 1))(ws[1], bs[2])
    close(g1, gr[1][1], 2e-4)
    close(g2, gr[2][2], 2e-4)
    attrs = backward_attrs(jax.grad(f, (0, 1)), ws[1], bs[2])
    assert (attrs["want_dx"], attrs["dw_mask"], attrs["db_mask"]) == ("0", "2", "4")


# ---------------------------------------------------------------- vmap, precision


def test_vmap_folds_x(rng):
    dtype = jnp.float32
    x = rand(rng, (3, 5, 8), dtype)  # N = 3 elements
    ws, bs = net(rng, widths=(8, 6, 4), bias=(False, True))
    w0, w1, b1 = ws[0], ws[1], bs[1]
    fn = lambda x, w0, w1, b1: fkj.mlp(x, [w0, w1], [None, b1], "gelu")  # noqa: E731
    ref = lambda x, w0, w1, b1: mlp_ref(x, [w0, w1], [None, b1], "gelu")  # noqa: E731
    check_vmap(fn, ref, (x, w0, w1, b1), (0, None, None, None), dtype, folds=True)
    check_vmap(fn, ref, (x[:, 0], w0, w1, b1), (0, None, None, None), dtype, folds=True)  # 1-D x per element
    # a batched weight: a loop
    check_vmap(fn, ref, (x, jnp.stack([w0, 2 * w0, -w0]), w1, b1), (0, 0, None, None), dtype, folds=False)


def test_precision_sets_the_tf32_flag(rng):
    x = rand(rng, (2, 8), jnp.float32)
    ws, bs = net(rng)

    def flags(**kw):
        text = str(jax.make_jaxpr(lambda x: fkj.mlp(x, ws, bs, **kw))(x))
        return re.search(r"\('flags', np\.int64\((\d+)\)\)", text).group(1)

    assert flags() == "0"
    assert flags(precision=True) == "1"
    assert flags(precision="highest") == "0"
    with jax.default_matmul_precision("tensorfloat32"):
        assert flags() == "1"
        assert flags(precision=jax.lax.Precision.HIGHEST) == "0"
    # strict f32 on the CPU either way (the CPU device: jax's default is CUDA on a GPU machine)
    x, ws, bs = jax.device_put((x, ws, bs), jax.devices("cpu")[0])
    with jax.default_matmul_precision("tensorfloat32"):
        close(fkj.mlp(x, ws, bs), mlp_ref(x, ws, bs), 2e-5)


# ---------------------------------------------------------------- errors


def test_errors_in_jax_terms(rng):
    x = rand(rng, (2, 8), jnp.float32)
    ws, bs = net(rng)
    with pytest.raises(TypeError, match="x has dtype float64; this op takes float16, bfloat16, float32"):
        fkj.mlp(x.astype(jnp.float64), [w.astype(jnp.float64) for w in ws])
    with pytest.raises(TypeError, match=r"x has dtype float32 but weights\[1\] has dtype float16"):
        fkj.mlp(x, [ws[0], ws[1].astype(jnp.float16), ws[2]])
    with pytest.raises(ValueError, match=re.escape("weights[1] must be [n, 6] (layer 1 takes 6 inputs: layer 0 "
                                                   "gives 6), got shape (7, 5)")):
        fkj.mlp(x, [ws[0], ws[1][:, :5], ws[2]])
    with pytest.raises(ValueError, match=re.escape("weights[0] must be [n, 8] (layer 0 takes 8 inputs: x has 8")):
        fkj.mlp(x, [ws[0][:, :4]])
    with pytest.raises(ValueError, match=re.escape("biases[2] must be [3]")):
        fkj.mlp(x, ws, [None, None, bs[0]])
    with pytest.raises(ValueError, match="biases must be None or a sequence of 3 entries"):
        fkj.mlp(x, ws, bs[:2])
    with pytest.raises(ValueError, match="hidden_act 'swish' is not one of"):
        fkj.mlp(x, ws, hidden_act="swish")
    with pytest.raises(ValueError, match="out_act 'tanh' is not one of"):
        fkj.mlp(x, ws, out_act="tanh")
    with pytest.raises(ValueError, match="weights has 0 layers; the op takes 1 to 64"):
        fkj.mlp(x, [])
    with pytest.raises(TypeError, match="weights must be a sequence of arrays"):
        fkj.mlp(x, 3)


def test_handler_errors_carry_fusekits_message(rng):
    # the handler called directly with layers that do not chain: fusekit's check
    x, w0, w1 = rand(rng, (2, 3), jnp.float32), rand(rng, (4, 3), jnp.float32), rand(rng, (2, 5), jnp.float32)
    fkj._register()
    call = jax.ffi.ffi_call("fusekit_mlp_forward", (jax.ShapeDtypeStruct((2, 2), jnp.float32),
                                                    jax.ShapeDtypeStruct((64,), jnp.float32)),
                            vmap_method="sequential")
    attrs = dict(n_layers=np.int64(2), hidden_act=np.int64(1), out_act=np.int64(0), flags=np.int64(0))
    msg = ("fk_xla_mlp_forward_(cpu|cuda): weights\\[1\\] has shape \\[2, 5\\] but layer 1 takes 4 inputs "
           "\\(layer 0 gives 4\\) \\(FK_ERROR_SHAPE_MISMATCH\\)")
    with pytest.raises(Exception, match=msg):
        jax.block_until_ready(jax.jit(lambda *a: call(*a, **attrs))(x, w0, w1))
    # a saved result that is too small
    w1 = rand(rng, (2, 4), jnp.float32)
    small = jax.ffi.ffi_call("fusekit_mlp_forward", (jax.ShapeDtypeStruct((2, 2), jnp.float32),
                                                     jax.ShapeDtypeStruct((1,), jnp.float32)),
                             vmap_method="sequential")
    with pytest.raises(Exception, match=r"saved holds 4 bytes but this call needs \d+ .*FK_ERROR_BUFFER_TOO_SMALL"):
        jax.block_until_ready(small(x, w0, w1, **attrs))


# ---------------------------------------------------------------- fusekit.jax.nn.FusedMLP


def test_fused_mlp_module():
    import fusekit.jax.nn as fknn

    net_ = fknn.FusedMLP((8, 6, 5, 3), bias=(True, False, True), hidden_activation="gelu", out_activation="relu")
    # fusekit.nn.FusedMLP's child names: nn.Sequential(Linear, GELU, Linear, GELU, Linear, ReLU)
    assert net_.layer_names == ("0", "2", "4")
    assert fknn.FusedMLP((4, 3, 2), hidden_activation="none").layer_names == ("0", "1")
    params = net_.init(jax.random.key(0))
    assert {k: sorted(v) for k, v in params.items()} == {"0": ["bias", "weight"], "2": ["weight"],
                                                          "4": ["bias", "weight"]}
    assert params["2"]["weight"].shape == (5, 6) and params["4"]["bias"].shape == (3,)
    bound = 1 / np.sqrt(6)  # nn.Linear's: uniform in +-1/sqrt(in_features)
    assert 0.8 * bound < float(jnp.abs(params["2"]["weight"]).max()) <= bound
    x = jax.random.normal(jax.random.key(1), (4, 8), jnp.float32)
    ws = [params[n]["weight"] for n in net_.layer_names]
    bs = [params["0"]["bias"], None, params["4"]["bias"]]
    close(jax.jit(net_)(params, x), mlp_ref(x, ws, bs, "gelu", "relu"), 2e-5)
    g = jax.grad(lambda p: sq(net_)(p, x))(params)
    gr = jax.grad(sq(lambda ws, bs: mlp_ref(x, ws, bs, "gelu", "relu")), (0, 1))(ws, bs)
    close(g["2"]["weight"], gr[0][1], 2e-4)
    close(g["4"]["bias"], gr[1][2], 2e-4)
    assert fknn.FusedMLP((4, 3)) == fknn.FusedMLP([4, 3], bias=(True,)) and hash(fknn.FusedMLP((4, 3))) == hash(
        fknn.FusedMLP([4, 3]))
    with pytest.raises(ValueError, match="FusedMLP: widths must have 2 to 65 entries"):
        fknn.FusedMLP((4,))
    with pytest.raises(ValueError, match="FusedMLP: bias has 1 entries but there are 2 layers"):
        fknn.FusedMLP((4, 3, 2), bias=(True,))
    with pytest.raises(ValueError, match="FusedMLP: widths\\[1\\] must be >= 1, got 0"):
        fknn.FusedMLP((4, 0))
    with pytest.raises(ValueError, match="FusedMLP: activation must be one of"):
        fknn.FusedMLP((4, 3), out_activation="swish")
    with pytest.raises(TypeError, match="FusedMLP: dtype must be one of float16, bfloat16, float32, not float64"):
        fknn.FusedMLP((4, 3), dtype=jnp.float64)
