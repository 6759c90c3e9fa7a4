"""Gaussian field ops as torch custom ops (fusekit.torch.gaussian): gradcheck in float64
on the CPU, loss.backward(), opcheck, torch.compile, and CUDA cases when a GPU is
usable. Skipped without torch; the plain functions are tested in test_gaussian.py."""

import numpy as np
import pytest

import fusekit
from test_gaussian import problem

# ------------------------------------------------------------------ torch custom ops

torch = pytest.importorskip("torch")
from fusekit.torch.gaussian import gaussian_field, mahalanobis  # noqa: E402


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
