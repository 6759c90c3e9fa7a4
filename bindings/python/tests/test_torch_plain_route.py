"""The plain functions on torch tensors take the compiled ops (fusekit.torch);
on numpy arrays, ctypes. Both call the same C entry points, so for the same inputs
and options (out=, want/needs subsets, trajectories, caller workspaces, flags) they
must give the same values, bit for bit, and the same errors. CPU tensors here; the
CUDA route is exercised by test_cuda.py and test_torch_graphs.py."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fusekit  # noqa: E402
from fusekit.torch import _ext as _torch_ext  # noqa: E402

import test_gaussian as tg  # noqa: E402
import test_geodesic as tgeo  # noqa: E402

pytestmark = pytest.mark.skipif(not _torch_ext.available(), reason="the compiled torch ops are not built")


def _t(arrays):
    return [None if a is None else torch.from_numpy(np.array(a)) for a in arrays]


def _same(torch_out, numpy_out):
    if isinstance(numpy_out, (tuple, list)):
        assert len(torch_out) == len(numpy_out)
        for a, b in zip(torch_out, numpy_out):
            _same(a, b)
        return
    if numpy_out is None:
        assert torch_out is None
        return
    assert isinstance(torch_out, torch.Tensor)
    np.testing.assert_array_equal(torch_out.numpy(), numpy_out)


def test_route_is_taken():
    a = torch.randn(3, 4)
    fusekit.add(a, a)
    assert _torch_ext.route.tensor is torch.Tensor


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_geodesic_plain_functions(dtype):
    rng = np.random.default_rng(1)
    x, v, U, W, f, mu = tgeo.problem(rng, b=6, d=9, r=3, dtype=dtype)
    tx, tv, tU, tW, tf, tmu = _t((x, v, U, W, f, mu))
    _same(fusekit.christoffel_forward(tv, tU, tW, 0.7), fusekit.christoffel_forward(v, U, W, 0.7))
    out = torch.full_like(tv, float("nan"))
    assert fusekit.christoffel_forward(tv, tU, tW, 0.7, out=out) is out
    _same(out, fusekit.christoffel_forward(v, U, W, 0.7))
    g = rng.uniform(-1, 1, v.shape).astype(dtype)
    for want in (("v", "U", "W"), ("U",), ("v", "W")):
        _same(fusekit.christoffel_backward(tv, tU, tW, torch.from_numpy(g), 0.7, want=want),
              fusekit.christoffel_backward(v, U, W, g, 0.7, want=want))
    for traj in (False, True):
        _same(fusekit.leapfrog_forward(tx, tv, tU, tW, 0.1, 3, f=tf, mu=tmu, traj=traj),
              fusekit.leapfrog_forward(x, v, U, W, 0.1, 3, f=f, mu=mu, traj=traj))
    T = torch.empty(3, 2, *v.shape, dtype=tv.dtype)
    xo, vo, T2 = fusekit.leapfrog_forward(tx, tv, tU, tW, 0.1, 3, f=tf, traj=T)
    assert T2 is T
    xn, vn, Tn = fusekit.leapfrog_forward(x, v, U, W, 0.1, 3, f=f, traj=True)
    _same((xo, vo, T), (xn, vn, Tn))
    gx, gv = rng.uniform(-1, 1, v.shape).astype(dtype), rng.uniform(-1, 1, v.shape).astype(dtype)
    for want in (("x0", "v0", "f", "U", "W"), ("U", "W"), ("v0",)):
        _same(fusekit.leapfrog_backward(tv, tU, tW, 0.1, 3, torch.from_numpy(gx), torch.from_numpy(gv), f=tf, mu=tmu,
                                        traj=T, want=want),
              fusekit.leapfrog_backward(v, U, W, 0.1, 3, gx, gv, f=f, mu=mu, traj=Tn, want=want))
    # errors: the same status from both routes
    with pytest.raises(fusekit.ShapeMismatchError):
        fusekit.christoffel_forward(tv, tU[:-1], tW)
    with pytest.raises(fusekit.ShapeMismatchError):
        fusekit.christoffel_forward(v, U[:-1], W)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gaussian_plain_functions(dtype):
    rng = np.random.default_rng(2)
    p, m, c, w = tg.problem(rng, 7, 5, dtype=dtype)
    tp, tm, tc, tw = _t((p, m, c, w))
    _same(fusekit.mahalanobis_forward(tp, tm, tc), fusekit.mahalanobis_forward(p, m, c))
    _same(fusekit.gaussian_field_forward(tp, tm, tc, tw), fusekit.gaussian_field_forward(p, m, c, w))
    out = torch.full((7,), float("nan"), dtype=tp.dtype)
    assert fusekit.gaussian_field_forward(tp, tm, tc, tw, out=out) is out
    _same(out, fusekit.gaussian_field_forward(p, m, c, w))
    dout = rng.uniform(-1, 1, 7).astype(dtype)
    g = rng.uniform(-1, 1, (7, 5)).astype(dtype)
    for needs in ((True, True, True, True), (False, True, False, True)):
        _same(fusekit.gaussian_field_backward(tp, tm, tc, tw, torch.from_numpy(dout), needs=needs),
              fusekit.gaussian_field_backward(p, m, c, w, dout, needs=needs))
        _same(fusekit.mahalanobis_backward(tp, tm, tc, torch.from_numpy(g), needs=needs[:3]),
              fusekit.mahalanobis_backward(p, m, c, g, needs=needs[:3]))
    # a caller's workspace and outs
    ws = torch.empty(max(1, fusekit.gaussian_backward_workspace_size("cpu", dtype, 7, 5) // 4), dtype=torch.float32)
    outs = (torch.empty(7, 3, dtype=tp.dtype), None, torch.empty(5, 3, 3, dtype=tp.dtype), None)
    res = fusekit.gaussian_field_backward(tp, tm, tc, tw, torch.from_numpy(dout), needs=(True, False, True, False),
                                          out=outs, workspace=ws)
    assert res[0] is outs[0] and res[2] is outs[2]
    _same(res, fusekit.gaussian_field_backward(p, m, c, w, dout, needs=(True, False, True, False)))


@pytest.mark.parametrize("dtype", [np.float32])
def test_linear_plain_functions(dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 5)).astype(dtype)
    w = rng.standard_normal((4, 5)).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    tx, tw, tb = _t((x, w, b))
    for act in ("none", "relu", "gelu", "gelu_tanh"):
        _same(fusekit.linear_forward(tx, tw, tb, act=act, want_aux=act.startswith("gelu")),
              fusekit.linear_forward(x, w, b, act=act, want_aux=act.startswith("gelu")))
    y = torch.empty(6, 4)
    assert fusekit.linear_forward(tx, tw, tb, act="relu", y=y) is y
    dy = rng.standard_normal((6, 4)).astype(dtype)
    yn = fusekit.linear_forward(x, w, b, act="relu")
    for sel in ((True, True, True), (False, True, False)):
        _same(fusekit.linear_backward(torch.from_numpy(dy), tx, tw, act="relu", saved=torch.from_numpy(yn),
                                      dx=sel[0], dw=sel[1], db=sel[2]),
              fusekit.linear_backward(dy, x, w, act="relu", saved=yn, dx=sel[0], dw=sel[1], db=sel[2]))
    with pytest.raises(fusekit.UnsupportedDtypeError):
        fusekit.linear_forward(tx.double(), tw.double())


def test_linalg_and_optim_plain_functions():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((5, 3))
    b = rng.standard_normal((3, 4))
    _same(fusekit.gemm(torch.from_numpy(a), torch.from_numpy(b)), fusekit.gemm(a, b))
    _same(fusekit.gemm(torch.from_numpy(a), torch.from_numpy(a), op_b="T", alpha=0.5),
          fusekit.gemm(a, a, op_b="T", alpha=0.5))
    _same(fusekit.kron(torch.from_numpy(a), torch.from_numpy(b)), fusekit.kron(a, b))
    g = rng.standard_normal((6, 4))
    aa = rng.standard_normal((6, 3))
    _same(fusekit.per_sample_grads(torch.from_numpy(aa), torch.from_numpy(g)), fusekit.per_sample_grads(aa, g))
    _same(fusekit.per_sample_grad_norms(torch.from_numpy(aa), torch.from_numpy(g)),
          fusekit.per_sample_grad_norms(aa, g))
    _same(fusekit.dp_clipped_grad_sum(torch.from_numpy(aa), torch.from_numpy(g), 0.5, sq_norms=True),
          fusekit.dp_clipped_grad_sum(aa, g, 0.5, sq_norms=True))
