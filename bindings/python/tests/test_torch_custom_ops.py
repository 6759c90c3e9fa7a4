"""fusekit ops as torch custom ops: gradcheck in float64 on the CPU, opcheck,
torch.compile(fullgraph=True)."""

import pytest

torch = pytest.importorskip("torch")
import fusekit.torch_ops as fto  # noqa: E402


def _inputs(*shapes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in shapes:
        x = torch.randn(s, generator=g, dtype=torch.float64).to(dtype)
        out.append(x.requires_grad_(True))
    return out


def test_ops_are_registered():
    for name in ("axpby", "scalar_mul", "relu"):
        assert hasattr(torch.ops.fusekit, name)


def test_axpby_forward_matches_torch():
    a, b = _inputs((4, 5), (4, 5))
    y = torch.ops.fusekit.axpby(a, b, 2.0, -0.5)
    torch.testing.assert_close(y, 2 * a - 0.5 * b)
    assert y.requires_grad


def test_gradcheck_axpby_f64():
    a, b = _inputs((3, 4), (4,), seed=1)  # broadcasting: b's grad is summed
    assert torch.autograd.gradcheck(lambda a, b: fto.axpby(1.5, a, -2.0, b), (a, b))
    assert torch.autograd.gradgradcheck(lambda a, b: fto.axpby(1.5, a, -2.0, b), (a, b))


def test_gradcheck_axpby_complex128():
    a, b = _inputs((3,), (3,), dtype=torch.complex128, seed=2)
    assert torch.autograd.gradcheck(lambda a, b: fto.axpby(0.5, a, 3.0, b), (a, b))


def test_gradcheck_scalar_mul_f64():
    (a,) = _inputs((2, 3), seed=3)
    assert torch.autograd.gradcheck(lambda a: fto.scalar_mul(a, -1.25), (a,))
    assert torch.autograd.gradgradcheck(lambda a: fto.scalar_mul(a, -1.25), (a,))


def test_gradcheck_relu_f64():
    (a,) = _inputs((5, 6), seed=4)
    with torch.no_grad():
        a[a.abs() < 1e-3] = 0.5  # keep away from the kink for finite differences
    assert torch.autograd.gradcheck(fto.relu, (a,))


def test_only_requested_grads():
    a, b = _inputs((3,), (3,))
    b = b.detach()
    y = fto.axpby(2.0, a, 1.0, b)
    y.sum().backward()
    torch.testing.assert_close(a.grad, torch.full((3,), 2.0, dtype=torch.float64))
    assert b.grad is None


@pytest.mark.parametrize("name", ["axpby", "scalar_mul", "relu"])
def test_opcheck(name):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    a, b = _inputs((3, 4), (4,), seed=5)
    args = {
        "axpby": (a, b, 2.0, -1.0),
        "scalar_mul": (a, 3.0),
        "relu": (a,),
    }[name]
    torch.library.opcheck(getattr(torch.ops.fusekit, name).default, args)


def _compile_or_skip(fn, **kw):
    try:
        return torch.compile(fn, fullgraph=True, **kw)
    except RuntimeError as e:  # e.g. torch.compile unsupported on this Python
        pytest.skip(f"torch.compile unavailable: {e}")


def test_torch_compile_fullgraph_cpu_inductor():
    def f(a, b):
        return fto.relu(fto.axpby(2.0, a, -1.0, b)).sin() + 1

    a, b = _inputs((8, 16), (16,), seed=6)
    a, b = a.detach(), b.detach()
    cf = _compile_or_skip(f)
    torch.testing.assert_close(cf(a, b), torch.relu(2 * a - b).sin() + 1)


def test_torch_compile_fullgraph_backward_cpu():
    def loss(a, b):
        return (fto.axpby(0.5, a, 3.0, b) * fto.scalar_mul(a, 2.0)).sum()

    a, b = _inputs((4, 4), (4, 4), seed=7)
    ref_a, ref_b = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ((0.5 * ref_a + 3.0 * ref_b) * (2.0 * ref_a)).sum().backward()
    for backend in ("aot_eager", "inductor"):
        a.grad = b.grad = None
        cf = _compile_or_skip(loss, backend=backend)
        cf(a, b).backward()
        torch.testing.assert_close(a.grad, ref_a.grad)
        torch.testing.assert_close(b.grad, ref_b.grad)
