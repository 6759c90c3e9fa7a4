"""Geodesic flow ops from Python: the plain functions (numpy, CPU) against a numpy
float64 reference written from OPS.md section 2, errors, and the torch custom ops
(gradcheck in float64 on the CPU, with and without clamping). CUDA cases run when a
GPU is usable."""

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


# ------------------------------------------------------------------ numpy reference (OPS.md)


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


# ------------------------------------------------------------------ torch custom ops

torch = pytest.importorskip("torch")
import fusekit.torch_ops  # noqa: E402,F401
from fusekit.torch_geodesic import christoffel, leapfrog  # noqa: E402


def tproblem(seed=0, b=3, d=5, r=2, device="cpu", dtype=torch.float64, scale=0.5):
    rng = np.random.default_rng(seed)
    return [torch.tensor(a, device=device, dtype=dtype).requires_grad_(True)
            for a in problem(rng, b, d, r, scale=scale)]


def test_torch_ops_registered():
    for name in ("christoffel", "christoffel_backward", "leapfrog", "leapfrog_backward"):
        assert hasattr(torch.ops.fusekit, name)


@pytest.mark.parametrize("c", [5.0, math.inf])
def test_gradcheck_christoffel_f64(c):
    _, v, U, W, _, _ = tproblem(1)  # |gamma_raw| < 0.2: clamping inactive near the point for c = 5
    assert torch.autograd.gradcheck(lambda v, U, W: christoffel(v, U, W, c), (v, U, W))


def test_gradcheck_christoffel_clamped_f64():
    # large inputs, small c: some entries clamped (gradient 0 there), none near +-c
    _, v, U, W, _, _ = tproblem(2, scale=1.5)
    with torch.no_grad():
        raw = (v @ U) ** 2 @ W.T
    a = raw.abs().flatten().sort().values
    c = float(0.5 * (a[7] + a[8]))  # between two entries: about half clamped
    assert ((raw.abs() - c).abs() > 1e-3).all()
    assert torch.autograd.gradcheck(lambda v, U, W: christoffel(v, U, W, c), (v, U, W))


@pytest.mark.parametrize("c", [5.0, math.inf])
@pytest.mark.parametrize("with_f", [True, False])
def test_gradcheck_leapfrog_f64(c, with_f):
    x, v, U, W, f, mu = tproblem(3)
    mu = mu.detach()

    def fn(x, v, U, W, f):
        xT, vT = leapfrog(x, v, U, W, 0.1, 3, f=f, mu=mu, c=c)
        return xT, vT

    if with_f:
        args = (x, v, U, W, f)
        assert torch.autograd.gradcheck(fn, args)
    else:
        assert torch.autograd.gradcheck(lambda x, v, U, W: fn(x, v, U, W, None), (x, v, U, W))


def test_leapfrog_matches_reference_and_traj():
    x, v, U, W, f, mu = [a.detach() for a in tproblem(4)]
    xT, vT, traj = leapfrog(x, v, U, W, 0.2, 2, f=f, mu=mu, return_traj=True)
    xr, vr, tr = ref_leapfrog(*(a.numpy() for a in (x, v, U, W)), 0.2, 2, f.numpy(), mu.numpy())
    assert rel(xT.numpy(), xr) < 1e-12 and rel(vT.numpy(), vr) < 1e-12 and rel(traj.numpy(), tr) < 1e-12


def test_only_some_inputs_require_grad():
    x, v, U, W, f, mu = tproblem(5)
    x, U = x.detach(), U.detach()
    xT, vT = leapfrog(x, v, U, W, 0.1, 2, f=f)
    (xT.sum() + vT.square().sum()).backward()
    assert x.grad is None and U.grad is None
    assert v.grad is not None and W.grad is not None and f.grad is not None


@pytest.mark.parametrize("name", ["christoffel", "leapfrog"])
def test_opcheck(name):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    x, v, U, W, f, mu = tproblem(6)
    args = (v, U, W, 5.0) if name == "christoffel" else (x, v, U, W, f, mu.detach(), 0.1, 2, 5.0)
    torch.library.opcheck(getattr(torch.ops.fusekit, name).default, args)


@pytest.mark.skipif(fusekit.device_count() == 0 or not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_cuda_matches_cpu(dtype, tol):
    cpu = tproblem(7, b=300, d=64, r=8, dtype=dtype, scale=0.3)
    cpu[5] = cpu[5].detach()
    gpu = [a.detach().cuda().requires_grad_(a.requires_grad) for a in cpu]
    g_cpu, g_gpu = christoffel(*cpu[1:4]), christoffel(*gpu[1:4])
    torch.testing.assert_close(g_gpu.cpu(), g_cpu, rtol=tol, atol=tol)
    out_cpu = leapfrog(*cpu[:4], 0.05, 4, f=cpu[4], mu=cpu[5])
    out_gpu = leapfrog(*gpu[:4], 0.05, 4, f=gpu[4], mu=gpu[5])
    for a, b in zip(out_gpu, out_cpu):
        assert (a.detach().cpu() - b.detach()).norm() <= tol * b.detach().norm()
    w = torch.linspace(-1, 1, 300 * 64, dtype=dtype).reshape(300, 64)
    ((out_cpu[0] * w).sum() + (out_cpu[1] ** 2).sum() + (g_cpu * w).sum()).backward()
    wg = w.cuda()
    ((out_gpu[0] * wg).sum() + (out_gpu[1] ** 2).sum() + (g_gpu * wg).sum()).backward()
    for a, b in zip(gpu[:5], cpu[:5]):
        assert (a.grad.cpu() - b.grad).norm() <= tol * b.grad.norm()
