"""Geodesic flow ops as torch custom ops (fusekit.torch.geodesic): gradcheck in float64
on the CPU, with and without clamping, and CUDA cases when a GPU is usable. Skipped
without torch; the plain functions are tested in test_geodesic.py."""

import math

import numpy as np
import pytest

import fusekit
from test_geodesic import problem, ref_leapfrog, rel

# ------------------------------------------------------------------ torch custom ops

torch = pytest.importorskip("torch")
from fusekit.torch.geodesic import christoffel, leapfrog  # noqa: E402


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


def test_leapfrog_keep_traj_decision():
    from fusekit.torch.geodesic import _keep_traj

    x, v, U, W, f, mu = tproblem(8)
    plain = [a.detach() for a in (x, v, U, W, f)]
    assert _keep_traj(None, False, (x, v, U, W, f))  # grads possible
    assert _keep_traj(None, False, plain[:4] + [None, ]) is False  # nothing requires grad
    with torch.no_grad():
        assert _keep_traj(None, False, (x, v, U, W, f)) is False  # inference
        assert _keep_traj(True, False, plain) and _keep_traj(None, True, plain)
    assert _keep_traj(False, False, (x, v, U, W, f)) is False  # asked: recompute
    assert _keep_traj(False, True, plain)  # the trajectory returned needs it


def test_leapfrog_without_traj_same_values_and_empty_traj():
    x, v, U, W, f, mu = [a.detach() for a in tproblem(9)]
    x1, v1, t1 = torch.ops.fusekit.leapfrog(x, v, U, W, f, mu, 0.1, 3, 5.0, True)
    x0_, v0_, t0 = torch.ops.fusekit.leapfrog(x, v, U, W, f, mu, 0.1, 3, 5.0, False)
    assert t1.shape == (3, 2, 3, 5) and t0.shape == (0, 2, 3, 5)
    assert torch.equal(x0_, x1) and torch.equal(v0_, v1)
    with torch.no_grad():
        xn, vn = leapfrog(x, v, U, W, 0.1, 3, f=f, mu=mu)
    assert torch.equal(xn, x1) and torch.equal(vn, v1)


@pytest.mark.parametrize("save_traj", [True, False])
def test_gradcheck_leapfrog_saved_or_recomputed_traj(save_traj):
    x, v, U, W, f, mu = tproblem(10)
    mu = mu.detach()

    def fn(x, v, U, W, f):
        return leapfrog(x, v, U, W, 0.1, 3, f=f, mu=mu, save_traj=save_traj)

    assert torch.autograd.gradcheck(fn, (x, v, U, W, f))


def test_leapfrog_recomputed_traj_same_gradients():
    grads = []
    for save in (True, False):
        x, v, U, W, f, mu = tproblem(11)
        xT, vT = leapfrog(x, v, U, W, 0.1, 4, f=f, mu=mu.detach(), save_traj=save)
        (xT.square().sum() + (vT * xT).sum()).backward()
        grads.append([a.grad for a in (x, v, U, W, f)])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_opcheck_leapfrog_without_traj():
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    x, v, U, W, f, mu = tproblem(12)
    torch.library.opcheck(torch.ops.fusekit.leapfrog.default, (x, v, U, W, f, mu.detach(), 0.1, 2, 5.0, False))


def test_leapfrog_torch_compile_fullgraph_grad_and_no_grad():
    """Under torch.compile the trajectory decision is traced too: the graph with grads
    saves it and matches eager; under no_grad the recompiled graph skips it."""
    x, v, U, W, f, mu = tproblem(13)

    def loss(x, v, U, W, f):
        xT, vT = leapfrog(x, v, U, W, 0.1, 3, f=f, mu=mu.detach())
        return (xT * xT).sum() + (vT * xT).sum()

    try:
        cf = torch.compile(loss, fullgraph=True)
        got = cf(x, v, U, W, f)
    except RuntimeError as e:  # e.g. torch.compile unsupported on this Python
        pytest.skip(f"torch.compile unavailable: {e}")
    want = loss(x, v, U, W, f)
    args = (x, v, U, W, f)
    for a, b in zip(torch.autograd.grad(got, args), torch.autograd.grad(want, args)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(cf(*args), want.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("want", [1, 2, 4, 3, 6, 7])
def test_christoffel_backward_op_want(want):
    _, v, U, W, _, _ = [a.detach() for a in tproblem(14)]
    g = torch.randn_like(v)
    full = torch.ops.fusekit.christoffel_backward(v, U, W, g, 5.0)
    part = torch.ops.fusekit.christoffel_backward(v, U, W, g, 5.0, want)
    for i, (a, b) in enumerate(zip(part, full)):
        if want >> i & 1:
            assert torch.equal(a, b)
        else:
            assert a.numel() == 0


@pytest.mark.parametrize("want", [1, 2, 4, 8, 16, 3, 24, 7, 31])
def test_leapfrog_backward_op_want(want):
    x, v, U, W, f, mu = [a.detach() for a in tproblem(15)]
    _, _, traj = torch.ops.fusekit.leapfrog(x, v, U, W, f, mu, 0.1, 3, 5.0)
    gx, gv = torch.randn_like(x), torch.randn_like(v)
    args = (v, U, W, f, mu, traj, gx, gv, 0.1, 3, 5.0)
    full = torch.ops.fusekit.leapfrog_backward(*args)
    part = torch.ops.fusekit.leapfrog_backward(*args, want)
    for i, (a, b) in enumerate(zip(part, full)):
        if want >> i & 1:
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
        else:
            assert a.numel() == 0


def test_opcheck_backward_ops_partial_want():
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    x, v, U, W, f, mu = [a.detach() for a in tproblem(16)]
    g = torch.randn_like(v)
    torch.library.opcheck(torch.ops.fusekit.christoffel_backward.default, (v, U, W, g, 5.0, 1))
    _, _, traj = torch.ops.fusekit.leapfrog(x, v, U, W, f, mu, 0.1, 2, 5.0)
    torch.library.opcheck(torch.ops.fusekit.leapfrog_backward.default,
                          (v, U, W, f, mu, traj, g, g, 0.1, 2, 5.0, 3))


def test_frozen_parameters_same_gradients(monkeypatch):
    """U and W frozen: the backwards are asked for the other gradients only (so the
    kernels skip the dU, dW products), and those are the full backward's."""
    from fusekit.torch.geodesic import CHR_GRADS, LF_GRADS

    asked = []
    for name, names in (("christoffel_backward", CHR_GRADS), ("leapfrog_backward", LF_GRADS)):
        real = getattr(torch.ops.fusekit, name)

        def spy(*a, _real=real, _name=name, _names=names):
            want = a[-1]  # the formulas pass want positionally, last
            asked.append((_name, tuple(n for i, n in enumerate(_names) if want >> i & 1)))
            return _real(*a)

        monkeypatch.setattr(torch.ops.fusekit, name, spy)
    grads = []
    for frozen in (False, True):
        asked.clear()
        x, v, U, W, f, mu = tproblem(17)
        if frozen:
            U, W = U.detach(), W.detach()
        xT, vT = leapfrog(x, v, U, W, 0.1, 3, f=f, mu=mu.detach())
        g = christoffel(vT, U, W)
        (xT.square().sum() + (g * vT).sum()).backward()
        grads.append([a.grad for a in (x, v, f)])
        if frozen:
            assert U.grad is None and W.grad is None
            assert sorted(asked) == [("christoffel_backward", ("v",)), ("leapfrog_backward", ("x0", "v0", "f"))]
        else:
            assert sorted(asked) == [("christoffel_backward", ("v", "U", "W")),
                                     ("leapfrog_backward", ("x0", "v0", "f", "U", "W"))]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_only_mu_requires_grad():
    x, v, U, W, f, mu = [a.detach() for a in tproblem(18)]
    mu.requires_grad_(True)
    xT, vT = leapfrog(x, v, U, W, 0.1, 2, f=f, mu=mu)
    assert xT.requires_grad
    (xT.sum() + vT.sum()).backward()  # mu gets no gradient, and nothing fails
    assert mu.grad is None
