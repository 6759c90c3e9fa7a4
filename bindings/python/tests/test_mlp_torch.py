"""fusekit.nn.FusedMLP and its ops torch.ops.fusekit.mlp / mlp_backward (CPU):
values and gradients against the equivalent nn.Sequential (float32, and torch's
float64 autograd), gradcheck, opcheck, torch.compile(fullgraph=True), state_dict
round trips with the Sequential, one autograd node per direction."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

fnn = pytest.importorskip("fusekit.nn")  # needs the compiled extension
from fusekit.torch import mlp as fmlp  # noqa: E402

import fusekit  # noqa: E402

ACT_MODULES = {"relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh")}


def _seq(widths, hidden="relu", out="none", bias=True, dtype=torch.float32):
    mods = []
    for i, (k, n) in enumerate(zip(widths[:-1], widths[1:])):
        mods.append(nn.Linear(k, n, bias=bias, dtype=dtype))
        act = out if i == len(widths) - 2 else hidden
        if act != "none":
            mods.append(ACT_MODULES[act]())
    return nn.Sequential(*mods)


def _grads(model, x, g):
    y = model(x)
    return [y] + list(torch.autograd.grad(y, [x] + list(model.parameters()), g))


@pytest.mark.parametrize("hidden,out", [("relu", "none"), ("gelu", "none"), ("gelu_tanh", "relu"),
                                        ("none", "gelu")])
def test_matches_sequential(hidden, out):
    torch.manual_seed(0)
    seq = _seq([5, 16, 9, 3], hidden, out)
    m = fnn.FusedMLP.from_sequential(seq)
    assert (m.hidden_activation, m.out_activation) == (hidden, out)
    x = torch.randn(2, 7, 5, requires_grad=True)
    g = torch.randn(2, 7, 3)
    got = _grads(m, x, g)
    # the reference in float64 (torch's autograd), from the same parameters
    seq64 = _seq([5, 16, 9, 3], hidden, out, dtype=torch.float64)
    seq64.load_state_dict({k: v.double() for k, v in seq.state_dict().items()})
    x64 = x.detach().double().requires_grad_()
    want = _grads(seq64, x64, g.double())
    for a, b in zip(got, want):
        assert a.dtype == torch.float32 and a.shape == b.shape
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_same_init_and_state_dict_round_trip():
    torch.manual_seed(1)
    seq = _seq([4, 8, 8, 2])
    torch.manual_seed(1)
    m = fnn.FusedMLP([4, 8, 8, 2])
    assert list(m.state_dict()) == list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias",
                                                             "4.weight", "4.bias"]
    for (k1, v1), (k2, v2) in zip(m.state_dict().items(), seq.state_dict().items()):
        assert torch.equal(v1, v2), k1
    # other parameters through load_state_dict, both ways
    other = _seq([4, 8, 8, 2])
    m.load_state_dict(other.state_dict())
    x = torch.randn(5, 4)
    torch.testing.assert_close(m(x), other(x), rtol=1e-5, atol=1e-5)
    back = _seq([4, 8, 8, 2])
    back.load_state_dict(m.state_dict())
    torch.testing.assert_close(back(x), other(x))
    torch.testing.assert_close(m.to_sequential()(x), other(x))
    # no activation between the layers: Sequential(Linear, Linear) names them 0, 1
    lin = _seq([4, 6, 2], hidden="none", bias=False)
    m2 = fnn.FusedMLP.from_sequential(lin)
    assert list(m2.state_dict()) == ["0.weight", "1.weight"] and m2.hidden_activation == "none"
    torch.testing.assert_close(m2(x), lin(x), rtol=1e-5, atol=1e-5)


def test_one_autograd_node_per_direction():
    m = fnn.FusedMLP([4, 8, 8, 8, 2])
    x = torch.randn(3, 4, requires_grad=True)
    y = m(x)
    fn = y.grad_fn
    # y comes straight out of the one node; its inputs are x and the leaves
    assert "MLP" in type(fn).__name__, type(fn).__name__
    nexts = [f for f, _ in fn.next_functions if f is not None]
    assert all(type(f).__name__ == "AccumulateGrad" for f in nexts) and len(nexts) == 1 + 2 * 4
    with torch.no_grad():
        assert m(x).grad_fn is None


def test_partial_gradients():
    m = fnn.FusedMLP([4, 8, 2], bias=[True, False])
    m.layers[0].weight.requires_grad_(False)
    x = torch.randn(3, 4)  # no gradient for x
    m(x).sum().backward()
    assert m.layers[0].weight.grad is None and x.grad is None
    assert m.layers[0].bias.grad is not None and m.layers[1].weight.grad is not None
    seq = m.to_sequential()
    # the frozen weight stays frozen in the copy (and only it)
    assert [p.requires_grad for p in seq.parameters()] == [p.requires_grad for p in m.parameters()] \
        == [False, True, True]
    seq(x).sum().backward()
    assert seq[0].weight.grad is None
    torch.testing.assert_close(m.layers[0].bias.grad, seq[0].bias.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.layers[1].weight.grad, seq[2].weight.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
@pytest.mark.parametrize("hidden,out", [("gelu", "none"), ("gelu_tanh", "gelu")])
def test_gradcheck_f32(hidden, out):
    # The op has no float64 kernel (fk_mlp_forward: f16, bf16, f32): gradcheck in
    # float32 with float32 finite-difference tolerances (smooth activations); the
    # float64 comparison is test_matches_sequential.
    torch.manual_seed(2)
    x = torch.randn(3, 4, requires_grad=True)
    ws = [(torch.randn(6, 4) / 2).requires_grad_(), (torch.randn(2, 6) / 2).requires_grad_()]
    bs = [torch.randn(6).requires_grad_(), torch.randn(2).requires_grad_()]
    f = lambda x, w0, w1, b0, b1: fmlp.mlp(x, [w0, w1], [b0, b1], hidden, out)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, *ws, *bs), eps=1e-2, atol=2e-2, rtol=2e-2)


def test_opcheck():
    torch.manual_seed(3)
    x = torch.randn(3, 4, requires_grad=True)
    ws = [torch.randn(6, 4, requires_grad=True), torch.randn(2, 6, requires_grad=True)]
    bs = [torch.randn(6, requires_grad=True), torch.empty(0)]  # no elements: layer 1 has no bias
    relu, none, gelu = 1, 0, 3
    for args in [(x, ws, bs, relu, none, 0), (x, ws, [], gelu, relu, 0)]:
        torch.library.opcheck(torch.ops.fusekit.mlp.default, args,
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    y, saved = torch.ops.fusekit.mlp(x.detach(), [w.detach() for w in ws], [bs[0].detach(), bs[1]], relu, none, 0)
    dy = torch.randn_like(y)
    torch.library.opcheck(torch.ops.fusekit.mlp_backward.default,
                          (dy, x.detach(), [w.detach() for w in ws], saved, relu, none, 0, [1, 3, 1]),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.fusekit.mlp_infer.default,
                          (x.detach(), [w.detach() for w in ws], [bs[0].detach(), bs[1]], relu, none, 0),
                          test_utils=("test_schema", "test_faketensor"))


def test_inference_keeps_nothing():
    # no gradient wanted: fusekit::mlp_infer (the forward without saved), the same y
    torch.manual_seed(5)
    m = fnn.FusedMLP([5, 9, 7, 3], bias=[True, False, True], hidden_activation="gelu_tanh", out_activation="relu")
    x = torch.randn(4, 2, 5)
    y_train = m(x)
    assert y_train.requires_grad
    with torch.no_grad():
        y = m(x)
    assert not y.requires_grad
    torch.testing.assert_close(y, y_train.detach(), rtol=0, atol=0)
    seq = m.to_sequential()
    torch.testing.assert_close(y.double(), seq.double()(x.double()), rtol=1e-5, atol=1e-5)
    calls = []
    real = torch.ops.fusekit.mlp_infer.default

    def spy(*a):
        calls.append(a)
        return real(*a)
    import fusekit.torch.mlp as fm
    saved, fm._mlp_infer = fm._mlp_infer, spy
    try:
        with torch.no_grad():
            m(x)
    finally:
        fm._mlp_infer = saved
    assert len(calls) == 1


def test_torch_compile_fullgraph():
    torch.manual_seed(4)
    # a layer without bias: its entry has no elements (a None in a list would hide
    # the other biases from register_autograd)
    m = fnn.FusedMLP([4, 8, 8, 3], bias=[True, False, True], hidden_activation="gelu")
    x = torch.randn(5, 4, requires_grad=True)

    def step(x):
        return (m(x) ** 2).mean()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(x)
    got = torch.autograd.grad(loss, [x] + list(m.parameters()))
    want = torch.autograd.grad(step(x), [x] + list(m.parameters()))
    assert len(got) == len(want) == 6
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # training under compile matches eager, step by step
    m2 = fnn.FusedMLP([4, 8, 8, 3], bias=[True, False, True])
    m3 = fnn.FusedMLP([4, 8, 8, 3], bias=[True, False, True])
    m3.load_state_dict(m2.state_dict())
    cm = torch.compile(m3, fullgraph=True, backend="aot_eager")
    x, t = torch.randn(6, 4), torch.randn(6, 3)
    for mod, fwd in ((m2, m2), (m3, cm)):
        opt = torch.optim.SGD(mod.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            opt.zero_grad()
            ((fwd(x) - t) ** 2).mean().backward()
            opt.step()
    for (k, a), (_, b) in zip(m2.state_dict().items(), m3.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=k)


def test_bfloat16_and_errors():
    torch.manual_seed(5)
    seq = _seq([8, 16, 4])
    m = fnn.FusedMLP.from_sequential(seq).to(torch.bfloat16)
    x = torch.randn(6, 8)
    torch.testing.assert_close(m(x.bfloat16()).float(), seq(x), rtol=5e-2, atol=5e-2)
    with pytest.raises(TypeError, match="dtype must be one of float16, bfloat16, float32"):
        fnn.FusedMLP([4, 2], dtype=torch.float64)
    with pytest.raises(ValueError, match="2 to 65 entries"):
        fnn.FusedMLP([4])
    with pytest.raises(ValueError, match="module 1 is a Tanh"):
        fnn.FusedMLP.from_sequential(nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1)))
    with pytest.raises(ValueError, match="activations differ"):
        fnn.FusedMLP.from_sequential(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 3), nn.GELU(),
                                                   nn.Linear(3, 1)))
    m32 = fnn.FusedMLP([4, 3, 2])
    with pytest.raises(fusekit.ShapeMismatchError, match=r"weights\[0\] has shape \[3, 4\] but layer 0 takes 5"):
        m32(torch.randn(2, 5))
    with pytest.raises(fusekit.DtypeMismatchError, match=r"weights\[0\] has dtype f32 but x has dtype bf16"):
        m32(torch.randn(2, 4, dtype=torch.bfloat16))
