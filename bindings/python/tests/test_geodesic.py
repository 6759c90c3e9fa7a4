"""Geodesic flow ops from Python: the plain functions (numpy, CPU) against a numpy
float64 reference written from docs/ops.md section 5, and errors. The torch custom ops are
in test_geodesic_torch.py (a separate module, so that these run without torch)."""

import math

import numpy as np
import pytest

import fusekit


def problem(rng, b=3, d=5, r=2, dtype=np.float64, scale=0.5):
    x = rng.uniform(-1, 1, (b, d))
    v = rng.uniform(-1, 1, (b, d))
    U = rng.uniform(-scale, scale, (d, r))
    W = rng.uniform(-scale, scale, (d, r))
    f = rng.uniform(-1, 1, (b, d))
    mu = rng.uniform(0, 0.5, d)
    return [np.ascontiguousarray(a, dtype=dtype) for a in (x, v, U, W, f, mu)]


# ------------------------------------------------------------------ numpy reference (docs/ops.md section 5)


def ref_gamma(v, U, W, c=5.0):
    p = v.astype(np.float64) @ U
    return np.clip((p * p) @ W.T, -c, c)


def ref_gamma_backward(v, U, W, g, c=5.0):
    p = v @ U
    s = p * p
    raw = s @ W.T
    gp = g * ((raw >= -c) & (raw <= c))
    dW = gp.T @ s
    dp = 2 * p * (gp @ W)
    return dp @ U.T, v.T @ dp, dW


def ref_leapfrog(x, v, U, W, dt, steps, f=None, mu=None, c=5.0):
    x, v = x.astype(np.float64).copy(), v.astype(np.float64).copy()
    f = 0.0 if f is None else f
    mu = 0.0 if mu is None else mu
    traj = []
    for _ in range(steps):
        vh = v + 0.5 * dt * (f - ref_gamma(v, U, W, c) - mu * v)
        x = x + dt * vh
        v = vh + 0.5 * dt * (f - ref_gamma(vh, U, W, c) - mu * vh)
        traj.append(np.stack([x, v]))
    return x, v, np.stack(traj)


def rel(a, b):
    return np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-300)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("c", [5.0, 0.05, math.inf])
def test_christoffel_forward_numpy(rng, dtype, tol, c):
    _, v, U, W, _, _ = problem(rng, 7, 6, 3, dtype, scale=1.0)
    out = fusekit.christoffel_forward(v, U, W, c)
    assert isinstance(out, np.ndarray) and out.shape == (7, 6) and out.dtype == dtype
    assert rel(out, ref_gamma(v, U, W, c)) < tol


def test_christoffel_backward_numpy(rng):
    _, v, U, W, _, _ = problem(rng, 9, 5, 2, scale=1.5)
    g = rng.uniform(-1, 1, (9, 5))
    for c in (5.0, 0.5, math.inf):
        got = fusekit.christoffel_backward(v, U, W, g, c)
        for a, r in zip(got, ref_gamma_backward(v, U, W, g, c)):
            assert rel(a, r) < 1e-12
    dv, dU, dW = fusekit.christoffel_backward(v, U, W, g, want=("W",))
    assert dv is None and dU is None
    np.testing.assert_allclose(dW, ref_gamma_backward(v, U, W, g)[2], rtol=1e-12)


def test_christoffel_in_place(rng):
    _, v, U, W, _, _ = problem(rng)
    want = ref_gamma(v, U, W)
    out = fusekit.christoffel_forward(v, U, W, out=v)
    assert out is v
    assert rel(v, want) < 1e-12


@pytest.mark.parametrize("steps", [1, 2, 3])
@pytest.mark.parametrize("with_f_mu", [True, False])
def test_leapfrog_forward_numpy(rng, steps, with_f_mu):
    x, v, U, W, f, mu = problem(rng, 4, 5, 2, scale=1.2)
    kw = dict(f=f, mu=mu) if with_f_mu else {}
    xr, vr, tr = ref_leapfrog(x, v, U, W, 0.1, steps, c=1.0, **kw)
    xt, vt = fusekit.leapfrog_forward(x, v, U, W, 0.1, steps, c=1.0, **kw)
    assert rel(xt, xr) < 1e-12 and rel(vt, vr) < 1e-12
    xt, vt, traj = fusekit.leapfrog_forward(x, v, U, W, 0.1, steps, c=1.0, traj=True, **kw)
    assert traj.shape == (steps, 2, 4, 5)
    assert rel(traj, tr) < 1e-12
    buf = np.zeros((steps, 2, 4, 5))
    res = fusekit.leapfrog_forward(x, v, U, W, 0.1, steps, c=1.0, traj=buf, **kw)
    assert res[2] is buf and rel(buf, tr) < 1e-12


def test_leapfrog_forward_float32(rng):
    x, v, U, W, f, mu = problem(rng, 6, 8, 3, np.float32)
    xr, vr, _ = ref_leapfrog(x, v, U, W, 0.05, 3, f, mu)
    xt, vt = fusekit.leapfrog_forward(x, v, U, W, 0.05, 3, f, mu)
    assert xt.dtype == np.float32
    assert rel(xt, xr) < 1e-5 and rel(vt, vr) < 1e-5


def test_leapfrog_backward_numpy_finite_differences(rng):
    x, v, U, W, f, mu = problem(rng, 3, 5, 2, scale=0.8)
    dt, steps, c = 0.1, 3, 5.0
    gx = rng.uniform(-1, 1, (3, 5))
    gv = rng.uniform(-1, 1, (3, 5))

    def loss(v=v, f=f, U=U, W=W):
        xT, vT, _ = ref_leapfrog(x, v, U, W, dt, steps, f, mu, c)
        return (gx * xT).sum() + (gv * vT).sum()

    def fd(name, arr):
        g = np.zeros_like(arr)
        h = 1e-6
        for i in np.ndindex(arr.shape):
            a, b = arr.copy(), arr.copy()
            a[i] += h
            b[i] -= h
            g[i] = (loss(**{name: a}) - loss(**{name: b})) / (2 * h)
        return g

    _, _, traj = fusekit.leapfrog_forward(x, v, U, W, dt, steps, f, mu, c, traj=True)
    for t in (None, traj):
        dx0, dv0, df, dU, dW = fusekit.leapfrog_backward(v, U, W, dt, steps, gx, gv, f, mu, t, c)
        np.testing.assert_allclose(dx0, gx, rtol=1e-14)
        for got, name, arr in ((dv0, "v", v), (df, "f", f), (dU, "U", U), (dW, "W", W)):
            assert rel(got, fd(name, arr)) < 1e-7, name
    only = fusekit.leapfrog_backward(v, U, W, dt, steps, gx, None, f, mu, want=("U",))
    assert only[0] is None and only[1] is None and only[2] is None and only[4] is None
    assert only[3].shape == (5, 2)


def test_errors(rng):
    x, v, U, W, f, mu = problem(rng)
    with pytest.raises(fusekit.ShapeMismatchError, match="U"):
        fusekit.christoffel_forward(v, U[:3], W)
    with pytest.raises(fusekit.InvalidArgumentError):
        fusekit.christoffel_forward(v, U, W, -1.0)
    with pytest.raises(fusekit.DtypeMismatchError):
        fusekit.christoffel_forward(v, U.astype(np.float32), W)
    with pytest.raises(fusekit.InvalidArgumentError):
        fusekit.leapfrog_forward(x, v, U, W, 0.1, 0)
    with pytest.raises(fusekit.InvalidArgumentError):
        fusekit.leapfrog_forward(x, v, U, W, math.nan, 2)
    with pytest.raises(ValueError, match="want"):
        fusekit.christoffel_backward(v, U, W, v, want=("q",))


def test_constants_and_entry_points():
    assert fusekit.GEO_ALLOW_TF32 == 1 and fusekit.GEO_FORCE_GENERIC == 2 and fusekit.GEO_ALLOW_TF32X3 == 4
    for name in ("fk_christoffel_forward", "fk_christoffel_backward", "fk_leapfrog_forward", "fk_leapfrog_backward"):
        assert fusekit.ENTRY_POINTS[name] is getattr(fusekit, name[3:])
