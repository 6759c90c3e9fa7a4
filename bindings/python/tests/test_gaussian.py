"""Gaussian field ops from Python: the plain functions (numpy, CPU) against a
numpy float64 reference, errors, and the torch custom ops (gradcheck in float64 on
the CPU, loss.backward(), opcheck, torch.compile). CUDA cases run when a GPU is
usable."""

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


# ------------------------------------------------------------------ torch custom ops

torch = pytest.importorskip("torch")
import fusekit.torch_ops  # noqa: E402,F401
from fusekit.torch_gaussian import gaussian_field, mahalanobis  # noqa: E402


def tproblem(b, n, seed=0, device="cpu", dtype=torch.float64):
    rng = np.random.default_rng(seed)
    return [torch.tensor(a, device=device, dtype=dtype).requires_grad_(True) for a in problem(rng, b, n)]


def torch_field(p, m, c, w, eps=1e-6):
    L = torch.tril(c) + eps * torch.eye(3, dtype=c.dtype, device=c.device)
    d = p[:, None, :] - m[None, :, :]
    y0 = d[..., 0] / L[:, 0, 0]
    y1 = (d[..., 1] - L[:, 1, 0] * y0) / L[:, 1, 1]
    y2 = (d[..., 2] - L[:, 2, 0] * y0 - L[:, 2, 1] * y1) / L[:, 2, 2]
    return (w * torch.exp(-0.5 * (y0 ** 2 + y1 ** 2 + y2 ** 2))).sum(-1)


def test_torch_ops_registered():
    for name in ("gaussian_field", "gaussian_field_backward", "mahalanobis", "mahalanobis_backward"):
        assert hasattr(torch.ops.fusekit, name)


def test_gradcheck_field_f64():
    args = tproblem(6, 4, seed=1)
    assert torch.autograd.gradcheck(lambda *a: gaussian_field(*a, 1e-3), args)


def test_gradcheck_mahalanobis_f64():
    args = tproblem(5, 3, seed=2)[:3]
    assert torch.autograd.gradcheck(lambda *a: mahalanobis(*a, 1e-3), args)


def test_loss_backward_matches_torch():
    args = tproblem(30, 9, seed=3)
    ref = [a.detach().clone().requires_grad_(True) for a in args]
    target = torch.linspace(0, 1, 30, dtype=torch.float64)
    ((gaussian_field(*args) - target) ** 2).mean().backward()
    ((torch_field(*ref) - target) ** 2).mean().backward()
    for a, r in zip(args, ref):
        torch.testing.assert_close(a.grad, r.grad, rtol=1e-10, atol=1e-12)


def test_only_some_inputs_require_grad():
    p, m, c, w = tproblem(8, 3, seed=4)
    p = p.detach()
    gaussian_field(p, m, c, w).sum().backward()
    assert p.grad is None and m.grad is not None and w.grad is not None


@pytest.mark.parametrize("name", ["gaussian_field", "mahalanobis"])
def test_opcheck(name):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    p, m, c, w = tproblem(7, 5, seed=5)
    args = (p, m, c, w, 1e-6) if name == "gaussian_field" else (p, m, c, 1e-6)
    torch.library.opcheck(getattr(torch.ops.fusekit, name).default, args)


def test_torch_compile_fullgraph():
    p, m, c, w = [a.detach() for a in tproblem(16, 5, seed=6)]
    try:
        cf = torch.compile(lambda p, m, c, w: gaussian_field(p, m, c, w) * 2, fullgraph=True, backend="aot_eager")
        out = cf(p, m, c, w)
    except RuntimeError as e:  # torch.compile unsupported here
        pytest.skip(f"torch.compile unavailable: {e}")
    torch.testing.assert_close(out, torch_field(p, m, c, w) * 2)


@pytest.mark.skipif(fusekit.device_count() == 0 or not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    cpu = tproblem(300, 70, seed=7, dtype=torch.float32)
    gpu = [a.detach().cuda().requires_grad_(True) for a in cpu]
    f_cpu, f_gpu = gaussian_field(*cpu), gaussian_field(*gpu)
    torch.testing.assert_close(f_gpu.cpu(), f_cpu, rtol=1e-4, atol=1e-5)
    dout = torch.linspace(-1, 1, 300)
    f_cpu.backward(dout)
    f_gpu.backward(dout.cuda())
    for a, b in zip(gpu, cpu):
        assert (a.grad.cpu() - b.grad).norm() <= 1e-4 * b.grad.norm()
