"""fusekit ops as torch custom ops: gradcheck in float64 on the CPU, opcheck,
torch.compile(fullgraph=True)."""

import pytest

torch = pytest.importorskip("torch")
import fusekit.torch as fto  # noqa: E402

fto.load()  # every family's ops (fakes, autograd), as torch.ops.fusekit.* below need


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


def _grads(fn, args):
    args = [a.detach().clone().requires_grad_(True) for a in args]
    out = fn(*args)
    out = out if isinstance(out, (tuple, list)) else (out,)
    sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in out).backward()
    return [o.detach() for o in out], [a.grad for a in args]


def test_wrappers_and_registered_ops_agree():
    """The user-facing wrappers take eager_call's lean autograd Function; the
    registered ops (torch.ops.fusekit.*) take register_autograd's formula. Same
    kernels, same formulas: the same outputs and gradients, bit for bit."""
    from fusekit.torch.gaussian import gaussian_field
    from fusekit.torch.geodesic import christoffel, leapfrog
    import test_gaussian_torch as tg
    import test_geodesic_torch as tgeo

    ops = torch.ops.fusekit
    x, w, b = _inputs((5, 7), (4, 7), (4,), dtype=torch.float32, seed=3)
    for act, code in (("relu", 1), ("gelu_tanh", 2), ("gelu", 3), ("none", 0)):
        cases = [(lambda x, w, b, act=act: fto.linear(x, w, b, act), lambda x, w, b, c=code: ops.linear(x, w, b, c)[0],
                  (x, w, b))]
        for wrapped, registered, args in cases:
            assert all(torch.equal(p, q) for p, q in zip(*(_grads(wrapped, args)[1], _grads(registered, args)[1])))
    p = tg.tproblem(6, 5)
    for wrapped, registered in ((lambda *a: gaussian_field(*a, eps=1e-6), lambda *a: ops.gaussian_field(*a, 1e-6)),):
        (o1, g1), (o2, g2) = _grads(wrapped, p[:4]), _grads(registered, p[:4])
        assert all(torch.equal(a, c) for a, c in zip(o1 + g1, o2 + g2))
    xg, v, U, W, f, mu = tgeo.tproblem(4)
    (o1, g1), (o2, g2) = _grads(lambda v, U, W: christoffel(v, U, W, 5.0), (v, U, W)), \
        _grads(lambda v, U, W: ops.christoffel(v, U, W, 5.0), (v, U, W))
    assert all(torch.equal(a, c) for a, c in zip(o1 + g1, o2 + g2))
    lf_w = lambda x, v, U, W, f: leapfrog(x, v, U, W, 0.1, 3, f=f, mu=mu.detach(), save_traj=True)  # noqa: E731
    lf_r = lambda x, v, U, W, f: ops.leapfrog(x, v, U, W, f, mu.detach(), 0.1, 3, 5.0, True)[:2]  # noqa: E731
    (o1, g1), (o2, g2) = _grads(lf_w, (xg, v, U, W, f)), _grads(lf_r, (xg, v, U, W, f))
    assert all(torch.equal(a, c) for a, c in zip(o1 + g1, o2 + g2))


def test_plain_ops_opcheck():
    """The plain functions' compiled ops (what fusekit.add & co. call on tensors)."""
    import fusekit.torch.elementwise as tx

    ops = torch.ops.fusekit
    a, b = (t.detach() for t in _inputs((3, 4), (4,), seed=5))
    out = torch.empty(3, 4, dtype=torch.float64)
    z = torch.randn(5, dtype=torch.complex128)
    cases = [
        (ops.binary.default, (a, b, tx.BINARY["fk_mul"])),
        (ops.binary_out.default, (a, b, tx.BINARY["fk_add"], out)),
        (ops.unary.default, (a, tx.UNARY["fk_exp"])),
        (ops.unary.default, (z, tx.UNARY["fk_abs"])),
        (ops.unary_out.default, (a, tx.UNARY["fk_sin"], out)),
        (ops.scalar.default, (a, 2.0, 0.0, tx.SCALAR["fk_scalar_mul"])),
        (ops.axpby_c.default, (a, b, 2.0, 0.0, -1.0, 0.0)),
        (ops.kron_out.default, (a[:2, :2], a[:2, :2].clone(), torch.empty(4, 4, dtype=torch.float64))),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_plain_functions_under_torch_compile_fullgraph():
    import fusekit

    def f(a, b):
        return fusekit.exp(fusekit.add(a, b)) * 2

    a, b = (t.detach() for t in _inputs((3, 4), (4,), seed=6))
    cf = _compile_or_skip(f)
    torch.testing.assert_close(cf(a, b), torch.exp(a + b) * 2)
