"""The multi-layer perceptron through the Python bindings (CPU backend):
fusekit.mlp_forward / mlp_backward / mlp_saved_size (docs/ops.md section 6) against
a float64 reference written from the formulas, the backward also against finite
differences, on numpy arrays, Buffers and torch tensors, and the library's errors
(naming the argument and the layer). The module fusekit.nn.FusedMLP is in
test_mlp_torch.py."""

import math

import numpy as np
import pytest

import fusekit

_erf = np.vectorize(math.erf)
_C = math.sqrt(2.0 / math.pi)


def _act(name, z):
    if name == "none":
        return z
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "gelu":
        return 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * z * (1.0 + np.tanh(_C * (z + 0.044715 * z**3)))
    raise ValueError(name)


def _dact(name, z):
    if name == "none":
        return np.ones_like(z)
    if name == "relu":
        return (z > 0).astype(z.dtype)
    if name == "gelu":
        return 0.5 * (1.0 + _erf(z / math.sqrt(2.0))) + z * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    if name == "gelu_tanh":
        u = _C * (z + 0.044715 * z**3)
        t = np.tanh(u)
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _C * (1.0 + 3 * 0.044715 * z * z)
    raise ValueError(name)


def ref_forward(x, ws, bs, hidden, out):
    """float64: (y, pre-activations zs, layer inputs hs)."""
    h = x.astype(np.float64).reshape(-1, x.shape[-1])
    zs, hs = [], []
    for i, w in enumerate(ws):
        hs.append(h)
        z = h @ w.astype(np.float64).T
        if bs is not None and bs[i] is not None:
            z = z + bs[i].astype(np.float64)
        zs.append(z)
        h = _act(out if i == len(ws) - 1 else hidden, z)
    return h.reshape(x.shape[:-1] + (h.shape[-1],)), zs, hs


def ref_backward(dy, x, ws, bs, hidden, out):
    """float64: (dx, dweights, dbiases)."""
    _, zs, hs = ref_forward(x, ws, bs, hidden, out)
    g = dy.astype(np.float64).reshape(-1, dy.shape[-1])
    dws, dbs = [None] * len(ws), [None] * len(ws)
    for i in reversed(range(len(ws))):
        dz = g * _dact(out if i == len(ws) - 1 else hidden, zs[i])
        dws[i] = dz.T @ hs[i]
        dbs[i] = dz.sum(axis=0)
        g = dz @ ws[i].astype(np.float64)
    return g.reshape(x.shape), dws, dbs


def _net(rng, widths, lead=(6,), dtype=np.float32, bias_mask=None):
    x = rng.standard_normal(lead + (widths[0],)).astype(dtype)
    ws = [(rng.standard_normal((n, k)) / math.sqrt(k)).astype(dtype) for k, n in zip(widths[:-1], widths[1:])]
    bias_mask = bias_mask or [True] * len(ws)
    bs = [(0.5 * rng.standard_normal(w.shape[0])).astype(dtype) if m else None for w, m in zip(ws, bias_mask)]
    return x, ws, bs


def _close(got, want, tol=2e-5):
    got = np.asarray(got, dtype=np.float64)
    scale = max(1.0, float(np.abs(want).max()) if np.size(want) else 1.0)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale)


ACTS = [("relu", "none"), ("gelu", "none"), ("gelu_tanh", "relu"), ("none", "gelu"), ("relu", "relu")]


@pytest.mark.parametrize("hidden,out", ACTS)
def test_forward_matches_reference(rng, hidden, out):
    x, ws, bs = _net(rng, [5, 9, 7, 3], lead=(2, 4), bias_mask=[True, False, True])
    y = fusekit.mlp_forward(x, ws, bs, hidden, out)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (2, 4, 3)
    _close(y, ref_forward(x, ws, bs, hidden, out)[0])
    # without biases; the output array given
    y2 = np.empty((2, 4, 3), np.float32)
    assert fusekit.mlp_forward(x, ws, None, hidden, out, out=y2) is y2
    _close(y2, ref_forward(x, ws, None, hidden, out)[0])


@pytest.mark.parametrize("hidden,out", ACTS)
def test_backward_matches_reference(rng, hidden, out):
    x, ws, bs = _net(rng, [5, 9, 7, 3], lead=(2, 4), bias_mask=[True, False, True])
    y, saved = fusekit.mlp_forward(x, ws, bs, hidden, out, saved=True)
    assert saved.nbytes >= fusekit.mlp_saved_size([5, 9, 7, 3], 8, "float32", hidden, out)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dws, dbs = fusekit.mlp_backward(dy, x, ws, saved, hidden, out)
    rdx, rdws, rdbs = ref_backward(dy, x, ws, bs, hidden, out)
    _close(dx, rdx, 1e-4)
    for i in range(3):
        _close(dws[i], rdws[i], 1e-4)
        _close(dbs[i], rdbs[i], 1e-4)  # asked for whether or not the layer had a bias


@pytest.mark.parametrize("hidden,out", [("gelu", "none"), ("gelu_tanh", "gelu"), ("none", "none")])
def test_backward_matches_finite_differences(rng, hidden, out):
    """Directional derivatives of L = sum(y * dy) (smooth activations) in float32."""
    x, ws, bs = _net(rng, [4, 6, 5, 2], lead=(5,))
    y, saved = fusekit.mlp_forward(x, ws, bs, hidden, out, saved=True)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dws, dbs = fusekit.mlp_backward(dy, x, ws, saved, hidden, out)

    def loss(x_, ws_, bs_):
        return float((fusekit.mlp_forward(x_, ws_, bs_, hidden, out).astype(np.float64) * dy).sum())

    eps = 1e-2
    params = [("x", x, dx)] + [(f"w{i}", w, g) for i, (w, g) in enumerate(zip(ws, dws))] + \
        [(f"b{i}", b, g) for i, (b, g) in enumerate(zip(bs, dbs))]
    for name, p, g in params:
        v = rng.standard_normal(p.shape).astype(np.float32)
        orig = p.copy()
        p[...] = orig + eps * v
        lp = loss(x, ws, bs)
        p[...] = orig - eps * v
        lm = loss(x, ws, bs)
        p[...] = orig
        fd = (lp - lm) / (2 * eps)
        an = float((g.astype(np.float64) * v).sum())
        assert abs(fd - an) <= 2e-2 * max(1.0, abs(an)), (name, fd, an)


def test_saved_size():
    assert fusekit.mlp_saved_size([8, 3], 100, "float32", "relu", "none") == 0  # one layer, no activation
    relu = fusekit.mlp_saved_size([8, 16, 4], 100, "float32", "relu", "none")
    gelu = fusekit.mlp_saved_size([8, 16, 4], 100, "float32", "gelu", "none")
    # the hidden output h_1 (100 * 16 f32) in both; ReLU's bit mask is smaller than GELU's z
    assert 100 * 16 * 4 < relu < gelu
    assert fusekit.mlp_saved_size([8, 16, 4], 100, fusekit.float16, "gelu", "none") < gelu
    with pytest.raises(fusekit.UnsupportedDtypeError):
        fusekit.mlp_saved_size([8, 16, 4], 100, "float64", "relu", "none")
    with pytest.raises(fusekit.InvalidArgumentError, match="hidden_act = -1"):
        fusekit.mlp_saved_size([8, 16, 4], 100, "float32", "swish", "none")


def test_partial_gradients_and_inference(rng):
    x, ws, bs = _net(rng, [5, 9, 7, 3])
    y0 = fusekit.mlp_forward(x, ws, bs)  # inference: no saved
    y, saved = fusekit.mlp_forward(x, ws, bs, saved=True)
    np.testing.assert_array_equal(y0, y)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    rdx, rdws, rdbs = ref_backward(dy, x, ws, bs, "relu", "none")
    dx, dws, dbs = fusekit.mlp_backward(dy, x, ws, saved, dx=False, dweights=[False, True, None],
                                        dbiases=False)
    assert dx is None and dws[0] is None and dws[2] is None and dbs == [None] * 3
    _close(dws[1], rdws[1], 1e-4)
    # into given arrays: overwritten, not accumulated
    gw2 = np.full(ws[2].shape, 7.0, np.float32)
    gdx = np.full(x.shape, 7.0, np.float32)
    dx, dws, dbs = fusekit.mlp_backward(dy, x, ws, saved, dx=gdx, dweights=[None, None, gw2], dbiases=False)
    assert dx is gdx and dws[2] is gw2
    _close(gdx, rdx, 1e-4)
    _close(gw2, rdws[2], 1e-4)
    # a saved array of the caller's
    buf = np.empty(fusekit.mlp_saved_size([5, 9, 7, 3], 6, "float32") // 4 + 1, np.float32)
    y3, s3 = fusekit.mlp_forward(x, ws, bs, saved=buf)
    assert s3 is buf
    np.testing.assert_array_equal(y3, y)


def test_one_linear_layer_needs_no_saved(rng):
    x, ws, bs = _net(rng, [4, 3])
    y, saved = fusekit.mlp_forward(x, ws, bs, "relu", "none", saved=True)
    assert saved.nbytes == 0
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dws, dbs = fusekit.mlp_backward(dy, x, ws, None, "relu", "none")
    rdx, rdws, rdbs = ref_backward(dy, x, ws, bs, "relu", "none")
    _close(dx, rdx, 1e-5)
    _close(dws[0], rdws[0], 1e-5)
    _close(dbs[0], rdbs[0], 1e-5)


def test_empty_batch(rng):
    x, ws, bs = _net(rng, [4, 6, 3], lead=(0,))
    y, saved = fusekit.mlp_forward(x, ws, bs, saved=True)
    assert y.shape == (0, 3)
    dx, dws, dbs = fusekit.mlp_backward(np.zeros((0, 3), np.float32), x, ws, saved)
    assert dx.shape == (0, 4)
    assert all((g == 0).all() for g in dws + dbs)


def test_buffers_in_buffers_out(rng):
    x, ws, bs = _net(rng, [5, 8, 3])
    X = fusekit.as_buffer(x)
    W = [fusekit.as_buffer(w) for w in ws]
    B = [fusekit.as_buffer(b) for b in bs]
    Y, S = fusekit.mlp_forward(X, W, B, "gelu", "none", saved=True)
    assert isinstance(Y, fusekit.Buffer) and isinstance(S, fusekit.Buffer)
    _close(Y.to_numpy(), ref_forward(x, ws, bs, "gelu", "none")[0])
    dy = rng.standard_normal((6, 3)).astype(np.float32)
    DX, DW, DB = fusekit.mlp_backward(fusekit.as_buffer(dy), X, W, S, "gelu", "none")
    rdx, rdws, rdbs = ref_backward(dy, x, ws, bs, "gelu", "none")
    _close(DX.to_numpy(), rdx, 1e-4)
    _close(DW[1].to_numpy(), rdws[1], 1e-4)
    _close(DB[0].to_numpy(), rdbs[0], 1e-4)


def test_torch_tensors_in_torch_out(rng):
    torch = pytest.importorskip("torch")
    x, ws, bs = _net(rng, [5, 8, 3])
    tx, tws, tbs = torch.from_numpy(x), [torch.from_numpy(w) for w in ws], [torch.from_numpy(b) for b in bs]
    y, saved = fusekit.mlp_forward(tx, tws, tbs, saved=True)
    assert isinstance(y, torch.Tensor) and isinstance(saved, torch.Tensor)
    _close(y.numpy(), ref_forward(x, ws, bs, "relu", "none")[0])
    dy = torch.randn(6, 3)
    dx, dws, dbs = fusekit.mlp_backward(dy, tx, tws, saved)
    rdx, rdws, _ = ref_backward(dy.numpy(), x, ws, bs, "relu", "none")
    assert isinstance(dx, torch.Tensor)
    _close(dx.numpy(), rdx, 1e-4)
    _close(dws[0].numpy(), rdws[0], 1e-4)
    # bfloat16 (numpy has none): each layer rounded once to bf16
    yb = fusekit.mlp_forward(tx.bfloat16(), [w.bfloat16() for w in tws], [b.bfloat16() for b in tbs])
    assert yb.dtype == torch.bfloat16
    _close(yb.float().numpy(), ref_forward(x, ws, bs, "relu", "none")[0], 3e-2)


def test_errors_name_argument_and_layer(rng):
    x, ws, bs = _net(rng, [6, 8, 8, 3], lead=(4,))
    bad = [ws[0], ws[1][:, :7].copy(), ws[2]]
    with pytest.raises(fusekit.ShapeMismatchError, match=r"fk_mlp_forward: weights\[1\] has shape \[8, 7\] but "
                                                         r"layer 1 takes 8 inputs \(layer 0 gives 8\)"):
        fusekit.mlp_forward(x, bad, bs)
    with pytest.raises(fusekit.ShapeMismatchError, match=r"weights\[0\] has shape \[8, 6\] but layer 0 takes 5"):
        fusekit.mlp_forward(x[:, :5].copy(), ws, bs)
    with pytest.raises(fusekit.DtypeMismatchError, match=r"weights\[2\] has dtype f16 but x has dtype f32"):
        fusekit.mlp_forward(x, [ws[0], ws[1], ws[2].astype(np.float16)], bs)
    with pytest.raises(fusekit.ShapeMismatchError, match=r"biases\[1\] has shape \[7\] but layer 1 has 8 outputs"):
        fusekit.mlp_forward(x, ws, [bs[0], bs[1][:7].copy(), bs[2]])
    with pytest.raises(fusekit.UnsupportedDtypeError, match="x has dtype f64"):
        fusekit.mlp_forward(x.astype(np.float64), [w.astype(np.float64) for w in ws])
    with pytest.raises(fusekit.InvalidArgumentError, match=r"n_layers = 0 is outside 1..=64"):
        fusekit.mlp_forward(x, [])
    with pytest.raises(fusekit.InvalidArgumentError, match="n_layers = 65"):
        fusekit.mlp_forward(x, [np.eye(6, dtype=np.float32)] * 65)
    with pytest.raises(fusekit.InvalidArgumentError, match="hidden_act = -1 is not a valid fk_activation"):
        fusekit.mlp_forward(x, ws, bs, "swish")
    with pytest.raises(fusekit.InvalidArgumentError, match="out_act = 9"):
        fusekit.mlp_forward(x, ws, bs, "relu", 9)
    with pytest.raises(fusekit.InvalidArgumentError, match="biases has 2 entries but weights has 3"):
        fusekit.mlp_forward(x, ws, bs[:2])
    with pytest.raises(fusekit.ShapeMismatchError, match=r"out has shape \[4, 5\] but must be \[4, 3\]|"
                                                         r"y has shape \[4, 5\] but must be \[4, 3\]"):
        fusekit.mlp_forward(x, ws, bs, out=np.empty((4, 5), np.float32))
    with pytest.raises(fusekit.BufferTooSmallError, match="saved holds 16 bytes but this call needs"):
        fusekit.mlp_forward(x, ws, bs, saved=np.empty(4, np.float32))
    y, saved = fusekit.mlp_forward(x, ws, bs, saved=True)
    dy = np.ones_like(y)
    with pytest.raises(fusekit.ShapeMismatchError,
                       match=r"fk_mlp_backward: dweights\[1\] has shape \[8, 7\] but weights\[1\] has \[8, 8\]"):
        fusekit.mlp_backward(dy, x, ws, saved, dweights=[None, np.empty((8, 7), np.float32), None])
    with pytest.raises(fusekit.NullPointerError, match="saved"):
        fusekit.mlp_backward(dy, x, ws, None)
    with pytest.raises(fusekit.InvalidArgumentError, match="dbiases has 1 entries but weights has 3"):
        fusekit.mlp_backward(dy, x, ws, saved, dbiases=[True])
