"""Gaussian field ops from Python: the plain functions (numpy, CPU) against a
numpy float64 reference, and errors. The torch custom ops are in
test_gaussian_torch.py (a separate module, so that these run without torch)."""

import numpy as np
import pytest

import fusekit


def problem(rng, b, n, dtype=np.float64):
    points = rng.uniform(-1, 1, (b, 3))
    means = rng.uniform(-1, 1, (n, 3))
    chol = rng.uniform(-0.3, 0.3, (n, 3, 3))
    for k in range(3):
        chol[:, k, k] = rng.uniform(0.3, 0.8, n)
    chol[:, 0, 1] = 7.0  # the upper part is ignored
    weights = rng.uniform(-1, 1.5, n)
    return [np.ascontiguousarray(a, dtype=dtype) for a in (points, means, chol, weights)]


def ref_maha(points, means, chol, eps=1e-6):
    L = np.tril(chol.astype(np.float64)) + eps * np.eye(3)
    d = points[:, None, :].astype(np.float64) - means[None, :, :]
    y0 = d[..., 0] / L[:, 0, 0]
    y1 = (d[..., 1] - L[:, 1, 0] * y0) / L[:, 1, 1]
    y2 = (d[..., 2] - L[:, 2, 0] * y0 - L[:, 2, 1] * y1) / L[:, 2, 2]
    return y0 ** 2 + y1 ** 2 + y2 ** 2


def ref_field(points, means, chol, weights, eps=1e-6):
    return (weights * np.exp(-0.5 * ref_maha(points, means, chol, eps))).sum(-1)


def rel(a, b):
    return np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_forwards_numpy(rng, dtype, tol):
    p, m, c, w = problem(rng, 37, 11, dtype)
    out = fusekit.gaussian_field_forward(p, m, c, w)
    assert isinstance(out, np.ndarray) and out.shape == (37,) and out.dtype == dtype
    assert rel(out, ref_field(p, m, c, w)) < tol
    d = fusekit.mahalanobis_forward(p, m, c, 1e-3)
    assert d.shape == (37, 11)
    assert rel(d, ref_maha(p, m, c, 1e-3)) < tol


def test_backward_tuple_and_needs(rng):
    p, m, c, w = problem(rng, 20, 6)
    dout = rng.uniform(-1, 1, 20)
    dp, dm, dc, dw = fusekit.gaussian_field_backward(p, m, c, w, dout)
    assert dp.shape == (20, 3) and dm.shape == (6, 3) and dc.shape == (6, 3, 3) and dw.shape == (6,)
    assert np.all(dc[:, 0, 1] == 0) and np.all(dc[:, 0, 2] == 0) and np.all(dc[:, 1, 2] == 0)
    # dweights = sum_b dout_b exp(-0.5 m)
    e = np.exp(-0.5 * ref_maha(p, m, c))
    assert rel(dw, dout @ e) < 1e-12
    only = fusekit.gaussian_field_backward(p, m, c, w, dout, needs=(False, False, False, True))
    assert only[:3] == (None, None, None)
    np.testing.assert_array_equal(only[3], dw)
    g = rng.uniform(-1, 1, (20, 6))
    dp2, dm2, dc2 = fusekit.mahalanobis_backward(p, m, c, g)
    # dmeans = -sum over points of z and dpoints = sum over Gaussians: totals agree
    assert abs(dp2.sum() + dm2.sum()) < 1e-9 * np.abs(dp2).sum()


def test_errors(rng):
    p, m, c, w = problem(rng, 5, 3)
    with pytest.raises(fusekit.ShapeMismatchError, match="chol has shape"):
        fusekit.gaussian_field_forward(p, m, c[:2], w)
    with pytest.raises(fusekit.InvalidArgumentError, match="eps"):
        fusekit.gaussian_field_forward(p, m, c, w, -1.0)
    with pytest.raises(fusekit.DtypeMismatchError, match="weights has dtype float32|weights has dtype f32"):
        fusekit.gaussian_field_forward(p, m, c, w.astype(np.float32))
    assert fusekit.gaussian_backward_workspace_size("cpu", "float32", 1000, 100) == 0
