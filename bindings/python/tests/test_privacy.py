"""fusekit.privacy.DPSGD (docs/privacy.md): the clipped sums against per-sample
gradients materialised by torch.func (vmap of grad) in float64, the noise's
statistics, the errors, and the CUDA variants (skipped without a GPU)."""

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fusekit.privacy as privacy  # noqa: E402
from torch import nn  # noqa: E402
from torch.func import functional_call, grad, vmap  # noqa: E402
from torch.nn import functional as F  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="no CUDA device"))]


def reference_grads(model, loss_fn, x, y, max_grad_norm, divisor=None, per_layer=False):
    """The DP-SGD clipped mean from per-sample gradients materialised with
    torch.func: ``sum_i min(1, C/|G_i|) G_i / B`` (per_layer: each parameter's
    ``G_i^p`` clipped to ``max_grad_norm[name]``); returns (grads by name, norms)."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    frozen = {k: v.detach() for k, v in model.named_parameters() if not v.requires_grad}

    def sample_loss(p, xi, yi):
        out = functional_call(model, {**p, **frozen}, (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0), "sum")

    per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))(params, x, y)
    b = x.shape[0]
    sq = sum(g.reshape(b, -1).square().sum(1) for g in per_sample.values())
    norms = sq.sqrt()
    div = b if divisor is None else divisor
    out = {}
    for k, g in per_sample.items():
        if per_layer:
            factors = torch.clamp(max_grad_norm[k] / g.reshape(b, -1).norm(dim=1), max=1.0)
        else:
            factors = torch.clamp(max_grad_norm / norms, max=1.0)
        out[k] = (g * factors.reshape((b,) + (1,) * (g.dim() - 1))).sum(0) / div
    return out, norms


def xent(out, y, reduction):
    """Cross-entropy per sample summed over its positions; "mean" averages the
    samples (1/B sum_i loss_i, the loss DPSGD's loss_reduction="mean" expects)."""
    if out.dim() == 2:
        return F.cross_entropy(out, y, reduction=reduction)
    total = F.cross_entropy(out.transpose(1, -1), y, reduction="sum")
    return total / out.shape[0] if reduction == "mean" else total


def mlp(d_in=6, width=9, classes=4, dtype=torch.float64, device="cpu"):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(d_in, width), nn.Tanh(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, classes)).to(dtype=dtype, device=device)


def check_against_reference(model, x, y, c, loss_reduction="mean", expected_batch_size=None, loss_fn=xent,
                            tol=1e-12):
    dp = privacy.DPSGD(model, None, max_grad_norm=c, noise_multiplier=0.0, loss_reduction=loss_reduction,
                       expected_batch_size=expected_batch_size)
    loss = loss_fn(model(x), y, loss_reduction)
    dp.backward(loss)
    ref, norms = reference_grads(model, loss_fn, x, y, c, expected_batch_size)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            assert p.grad is None, name
            continue
        scale = ref[name].abs().max().item()
        assert scale > 0, name
        err = (p.grad - ref[name]).abs().max().item()
        assert err <= tol * max(scale, 1.0), f"{name}: max error {err:.3e} (scale {scale:.3e})"
    torch.testing.assert_close(dp.per_sample_norms, norms, rtol=1e-10, atol=0)
    torch.testing.assert_close(dp.clip_factors, torch.clamp(c / norms, max=1.0), rtol=1e-10, atol=0)
    dp.remove()
    return norms


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loss_reduction", ["mean", "sum"])
def test_clipped_sum_matches_per_sample_gradients(device, loss_reduction):
    model = mlp(device=device)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 6, generator=g, dtype=torch.float64).to(device)
    x[3] *= 30.0  # one sample far above any clip norm
    y = torch.randint(0, 4, (16,), generator=g).to(device)
    _, norms = reference_grads(model, xent, x, y, 1.0)
    c = norms.median().item()  # half the samples clipped, half not
    got = check_against_reference(model, x, y, c, loss_reduction)
    assert (got < c).sum() >= 4 and (got > c).sum() >= 4
    # a clip norm above every sample: the plain mean gradient
    model.zero_grad(set_to_none=True)
    check_against_reference(model, x, y, 10.0 * norms.max().item(), loss_reduction)


@pytest.mark.parametrize("device", DEVICES)
def test_sequences_shared_layers_and_frozen_parameters(device):
    """[B, T, in] inputs (the Gram form), [B, T1, T2, in], a layer called twice in one
    forward (its calls are one sequence), a layer without bias and a frozen bias."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(5, 8, bias=False)
            self.shared = nn.Linear(8, 8)
            self.head = nn.Linear(8, 3)
            self.head.bias.requires_grad_(False)

        def forward(self, x):  # x [B, T, 5]
            h = torch.tanh(self.embed(x))
            h = torch.tanh(self.shared(h))
            h = torch.tanh(self.shared(h.unsqueeze(2).expand(-1, -1, 2, -1) * 0.5).mean(2))
            return self.head(h)

    torch.manual_seed(2)
    model = Net().to(dtype=torch.float64, device=device)
    x = torch.randn(7, 4, 5, dtype=torch.float64, device=device)
    x[0] *= 20.0
    y = torch.randint(0, 3, (7, 4), device=device)
    _, norms = reference_grads(model, xent, x, y, 1.0)
    c = norms.median().item()
    got = check_against_reference(model, x, y, c)
    assert (got < c).sum() >= 2 and (got > c).sum() >= 2


def test_expected_batch_size_and_optimizer_step():
    model = mlp()
    x = torch.randn(10, 6, dtype=torch.float64)
    y = torch.randint(0, 4, (10,))
    check_against_reference(model, x, y, 0.3, expected_batch_size=12.5)

    ref, _ = reference_grads(model, xent, x, y, 0.3)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with privacy.DPSGD(model, opt, max_grad_norm=0.3, noise_multiplier=0.0) as dp:
        dp.step(xent(model(x), y, "mean"))
    for (name, p), b in zip(model.named_parameters(), before):
        torch.testing.assert_close(p.detach(), b - 0.5 * ref[name], rtol=0, atol=1e-12)


def test_layer_the_loss_does_not_reach_gets_noise_only():
    torch.manual_seed(0)
    model = nn.ModuleDict({"used": nn.Linear(4, 3), "unused": nn.Linear(4, 2)}).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    dp = privacy.DPSGD(model, None, max_grad_norm=1.0, noise_multiplier=0.0)
    dp.backward(model["used"](x).square().mean() + 0.0 * model["unused"](x).sum())
    assert torch.count_nonzero(model["used"].weight.grad) > 0
    assert torch.count_nonzero(model["unused"].weight.grad) == 0  # a zero per-sample gradient
    dp.backward(model["used"](x).square().mean())  # "unused" not called at all
    assert torch.count_nonzero(model["unused"].weight.grad) == 0
    assert model["unused"].bias.grad.shape == (2,)


@pytest.mark.parametrize("device", DEVICES)
def test_noise_statistics(device):
    """grad(noisy) - grad(noise_multiplier=0) over many draws: mean 0 and standard
    deviation sigma*C/B within a tolerance that a wrong scale cannot meet (the
    estimate's relative error is ~0.3%; sqrt(B), B or a missing C are off by >= 40%),
    Gaussian mass within one sigma, a seed reproduces its draws."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)
    x = torch.randn(32, 64, device=device)
    y = torch.randint(0, 8, (32,), device=device)
    sigma, c, expected_b = 1.3, 0.7, 40.0

    def grads(noise, seed=None, generator=None):
        dp = privacy.DPSGD(model, None, max_grad_norm=c, noise_multiplier=noise, seed=seed, generator=generator,
                           expected_batch_size=expected_b)
        dp.backward(F.cross_entropy(model(x), y))
        dp.remove()
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()

    clean = grads(0.0)
    gen = torch.Generator(device=device).manual_seed(11)
    draws = torch.stack([grads(sigma, generator=gen) - clean for _ in range(20)])  # 20 x 4680
    std = sigma * c / expected_b
    n = draws.numel()
    assert abs(draws.mean().item()) < 5 * std / math.sqrt(n)
    assert abs(draws.std().item() / std - 1.0) < 0.02
    assert abs((draws.abs() < std).double().mean().item() - 0.6827) < 0.01
    # independent draws across steps; one seed gives one sequence
    corr = torch.corrcoef(draws[:2])[0, 1].item()
    assert abs(corr) < 5 / math.sqrt(draws.shape[1])
    a, b = grads(sigma, seed=5), grads(sigma, seed=5)
    assert torch.equal(a, b)
    assert not torch.equal(a, grads(sigma, seed=6))


def test_unsupported_layers_are_named():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 2, 3)
            self.fc = nn.Linear(8, 2)

    with pytest.raises(ValueError) as e:
        privacy.DPSGD(Net(), None, max_grad_norm=1.0, noise_multiplier=1.0)
    assert str(e.value) == ("fusekit.privacy: layer 'conv1' (Conv2d) has trainable parameters and is not "
                            "supported; supported: Linear, FusedLinear")

    nested = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 2)))
    with pytest.raises(ValueError, match=r"layer '1\.0' \(LayerNorm\) has trainable parameters"):
        privacy.DPSGD(nested, None, max_grad_norm=1.0, noise_multiplier=1.0)
    nested[1][0].requires_grad_(False)  # frozen: allowed
    privacy.DPSGD(nested, None, max_grad_norm=1.0, noise_multiplier=1.0).remove()

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.scale = nn.Parameter(torch.ones(3))

    with pytest.raises(ValueError, match=r"layer '<model>' \(Scaled\) has trainable parameters"):
        privacy.DPSGD(Scaled(), None, max_grad_norm=1.0, noise_multiplier=1.0)

    lin = nn.Linear(3, 3)
    lin.extra = nn.Parameter(torch.ones(1))
    with pytest.raises(ValueError, match=r"layer '<model>' \(Linear\) has trainable parameters \['extra'\] "
                                         r"besides weight and bias"):
        privacy.DPSGD(lin, None, max_grad_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="fusekit.privacy: the model has no trainable parameters"):
        privacy.DPSGD(nn.Linear(2, 2).requires_grad_(False), None, max_grad_norm=1.0, noise_multiplier=1.0)


@pytest.mark.parametrize("kwargs, exc, message", [
    ({"max_grad_norm": 0.0}, ValueError, "max_grad_norm must be finite and > 0, got 0.0"),
    ({"max_grad_norm": -1}, ValueError, "max_grad_norm must be finite and > 0, got -1"),
    ({"max_grad_norm": float("inf")}, ValueError, "max_grad_norm must be finite and > 0, got inf"),
    ({"max_grad_norm": "1"}, TypeError, "max_grad_norm must be a real number, got str"),
    ({"noise_multiplier": -0.5}, ValueError, "noise_multiplier must be finite and >= 0, got -0.5"),
    ({"noise_multiplier": float("nan")}, ValueError, "noise_multiplier must be finite and >= 0, got nan"),
    ({"noise_multiplier": None}, TypeError, "noise_multiplier must be a real number, got NoneType"),
    ({"expected_batch_size": 0}, ValueError, "expected_batch_size must be a number > 0 or None, got 0"),
    ({"loss_reduction": "none"}, ValueError, "loss_reduction must be 'mean' or 'sum', got 'none'"),
    ({"seed": 1, "generator": torch.Generator()}, ValueError, "give generator or seed, not both"),
    ({"cuda_graph": True}, ValueError, "cuda_graph=True needs CUDA parameters; one is on cpu"),
    ({"cuda_graph": 1}, TypeError, "cuda_graph must be a bool, got int"),
])
def test_bad_arguments(kwargs, exc, message):
    args = {"max_grad_norm": 1.0, "noise_multiplier": 1.0, **kwargs}
    with pytest.raises(exc) as e:
        privacy.DPSGD(nn.Linear(2, 2), None, **args)
    assert str(e.value) == "fusekit.privacy: " + message
    with pytest.raises(TypeError, match="fusekit.privacy: model must be a torch.nn.Module, got list"):
        privacy.DPSGD([], None, max_grad_norm=1.0, noise_multiplier=1.0)


def test_bad_usage():
    model = nn.Linear(3, 2)
    dp = privacy.DPSGD(model, None, max_grad_norm=1.0, noise_multiplier=0.0)
    x = torch.randn(4, 3)
    with torch.no_grad():
        model(x)  # not recorded
    with pytest.raises(RuntimeError, match="fusekit.privacy: no forward pass recorded"):
        dp.backward(torch.zeros((), requires_grad=True))
    with pytest.raises(ValueError, match="fusekit.privacy: loss must be a scalar tensor"):
        dp.backward(model(x))
    with pytest.raises(RuntimeError, match="fusekit.privacy: no optimizer was given"):
        dp.step()
    model(x)  # recorded, not in the loss: ignored
    dp.backward(model(x).sum())
    with pytest.raises(ValueError, match="layer '<model>' got a batch of 5 samples, another layer 4"):
        dp.backward(model(x).sum() + model(torch.randn(5, 3)).sum())
    with pytest.raises(ValueError, match=r"layer '<model>' got an input of shape \(3,\); DP-SGD needs a batch"):
        dp.backward(model(torch.randn(3)).sum())
    dp.backward(model(input=x).sum())  # called by keyword: recorded too
    assert model.weight.grad is not None and torch.count_nonzero(model.weight.grad) > 0
    model(x)
    dp.clear()
    with pytest.raises(RuntimeError, match="no forward pass recorded"):
        dp.backward(torch.zeros((), requires_grad=True))
    dp.remove()
    model(x).sum().backward()  # the plain model again: nothing recorded, plain gradients
    with pytest.raises(RuntimeError, match="fusekit.privacy: this DPSGD was removed"):
        dp.backward(model(x).sum())


def _fused_linear():
    try:
        from fusekit.nn import FusedLinear
    except ImportError as e:
        pytest.skip(f"fusekit.nn.FusedLinear not available: {e}")
    return FusedLinear


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "none"])
def test_fused_linear(device, act):
    """FusedLinear (float32 only: the fused layer has no float64 kernel) against the
    same model built from nn.Linear and torch's activation, per-sample gradients
    materialised in float64."""
    fused_cls = _fused_linear()
    torch.manual_seed(4)
    fused = nn.Sequential(fused_cls(6, 16, activation=act, device=device), nn.Linear(16, 3, device=device))
    torch_act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_tanh": nn.GELU("tanh"), "none": nn.Identity()}[act]
    plain = nn.Sequential(nn.Linear(6, 16), torch_act, nn.Linear(16, 3)).to(device)
    with torch.no_grad():
        for i, j in ((0, 0), (1, 2)):
            plain[j].weight.copy_(fused[i].weight)
            plain[j].bias.copy_(fused[i].bias)
    x = torch.randn(12, 6, device=device)
    x[2] *= 25.0
    y = torch.randint(0, 3, (12,), device=device)
    plain.double()
    _, norms = reference_grads(plain, xent, x.double(), y, 1.0)
    c = norms.median().item()
    ref, _ = reference_grads(plain, xent, x.double(), y, c)
    dp = privacy.DPSGD(fused, None, max_grad_norm=c, noise_multiplier=0.0)
    dp.backward(xent(fused(x), y, "mean"))
    for name, p in fused.named_parameters():
        name = name.replace("1.", "2.", 1) if name.startswith("1.") else name
        torch.testing.assert_close(p.grad.double(), ref[name], rtol=2e-4, atol=2e-5 * ref[name].abs().max().item())
    torch.testing.assert_close(dp.per_sample_norms.double(), norms, rtol=2e-4, atol=0)


def _fused_mlp():
    try:
        from fusekit.nn import FusedMLP
    except ImportError as e:
        pytest.skip(f"fusekit.nn.FusedMLP not available: {e}")
    return FusedMLP


def test_fused_mlp_is_refused_by_name_before_training():
    """A trainable FusedMLP runs all its layers in one op: the per-layer inputs and
    output gradients of ghost clipping do not exist, and the hooks on its nn.Linear
    children would never fire. DPSGD refuses it when made, naming it, with nothing
    hooked; a frozen one is fine, and to_sequential() is the way to train it."""
    fused_mlp = _fused_mlp()
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), fused_mlp([8, 16, 16, 3]))
    with pytest.raises(ValueError) as e:
        privacy.DPSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), max_grad_norm=1.0, noise_multiplier=1.0)
    assert str(e.value) == (
        "fusekit.privacy: layer '2' (FusedMLP) runs its 3 layers as one fused op, which keeps no per-layer "
        "inputs and output gradients for ghost clipping; use an nn.Sequential of nn.Linear or FusedLinear layers "
        "instead (FusedMLP.to_sequential() makes one with the same parameters), or freeze it")
    assert all(not m._forward_hooks for m in model.modules())  # refused before any hook was registered
    alone = fused_mlp([4, 6, 2], hidden_activation="gelu")
    alone.layers[0].requires_grad_(False)  # one trainable layer is enough to refuse
    with pytest.raises(ValueError, match=r"^fusekit.privacy: layer '<model>' \(FusedMLP\) runs its 2 layers as one "
                                         r"fused op"):
        privacy.DPSGD(alone, None, max_grad_norm=1.0, noise_multiplier=1.0)

    # the suggested alternative: the same network as nn.Linear layers, against per-sample gradients
    seq = model[2].to_sequential().double()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(10, 8, generator=g, dtype=torch.float64)
    x[1] *= 20.0
    y = torch.randint(0, 3, (10,), generator=g)
    _, norms = reference_grads(seq, xent, x, y, 1.0)
    check_against_reference(seq, x, y, norms.median().item())

    # frozen: no parameter of its own to clip; the gradient reaches the layer below through the fused backward
    model[2].requires_grad_(False)
    plain = nn.Sequential(copy.deepcopy(model[0]), nn.ReLU(), model[2].to_sequential().requires_grad_(False))
    x = torch.randn(12, 5, generator=g)
    x[4] *= 20.0
    y = torch.randint(0, 3, (12,), generator=g)
    grads = []
    for m in (model, plain):
        dp = privacy.DPSGD(m, None, max_grad_norm=0.5, noise_multiplier=0.0)
        dp.backward(xent(m(x), y, "mean"))
        assert dp.clip_factors.min() < 1.0  # some samples clipped
        grads.append((m[0].weight.grad.clone(), m[0].bias.grad.clone(), dp.per_sample_norms.clone()))
        dp.remove()
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in model[2].parameters())


def test_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import fusekit, fusekit.privacy; "
            "print(fusekit.privacy.SUPPORTED_LAYERS)")
    env = {**os.environ, "PYTHONPATH": str(Path(privacy.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "Linear" in out.stdout


def test_empty_batch_gives_noise_only():
    """A Poisson-sampled batch can be empty: the clipped sum is zero, the gradient
    is the noise over the expected batch size."""
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    empty_x, empty_y = torch.randn(0, 4), torch.zeros(0, dtype=torch.long)
    with privacy.DPSGD(model, None, max_grad_norm=1.0, noise_multiplier=0.0, expected_batch_size=4,
                       loss_reduction="sum") as dp:
        dp.backward(F.cross_entropy(model(empty_x), empty_y, reduction="sum"))
        assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())
        assert dp.per_sample_norms.shape == (0,)
    with privacy.DPSGD(model, None, max_grad_norm=1.0, noise_multiplier=2.0, expected_batch_size=4, seed=0,
                       loss_reduction="sum") as dp:
        dp.backward(F.cross_entropy(model(empty_x), empty_y, reduction="sum"))
        noise = torch.randn(sum(p.numel() for p in model.parameters()), generator=torch.Generator().manual_seed(0))
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # one draw, in parameter order
        torch.testing.assert_close(flat, noise * (2.0 * 1.0 / 4), rtol=0, atol=1e-7)


def test_gradient_buffers_across_steps_and_a_dtype_change():
    """p.grad is a view of DPSGD's buffer, rewritten each step (also after the
    optimizer set it to None or zeroed it); converting the model rebuilds it."""
    model = mlp(dtype=torch.float32)
    plain = mlp(dtype=torch.float64)  # the reference's copy, without hooks
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    dp = privacy.DPSGD(model, opt, max_grad_norm=0.5, noise_multiplier=0.0)
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.randint(0, 4, (8,))
    views = None
    for set_to_none in (True, False, True):
        plain.load_state_dict(model.state_dict())
        ref, _ = reference_grads(plain, xent, x, y, 0.5)
        opt.zero_grad(set_to_none=set_to_none)
        dp.step(xent(model(x.float()), y, "mean"))
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad.double(), ref[name], rtol=1e-5, atol=1e-7)
        if views is not None:
            assert all(p.grad is v for p, v in zip(model.parameters(), views))
        views = [p.grad for p in model.parameters()]
    model.double()
    plain.load_state_dict(model.state_dict())
    ref, _ = reference_grads(plain, xent, x, y, 0.5)
    opt.zero_grad(set_to_none=False)
    dp.backward(xent(model(x), y, "mean"))
    for name, p in model.named_parameters():
        assert p.grad.dtype == torch.float64
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-10, atol=1e-14)
    dp.remove()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sequence", [False, True])
def test_per_layer_clipping(device, sequence):
    """clipping="per_layer": each parameter's per-sample gradient clipped to its own
    norm (weights through fusekit's dp_clipped_grad_sum), against torch.func; norms
    given per parameter, with some samples clipped and some not in every parameter."""
    model = mlp(device=device)
    g = torch.Generator().manual_seed(8)
    shape = (12, 3, 6) if sequence else (12, 6)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(device)
    x[5] *= 30.0
    y = torch.randint(0, 4, shape[:-1], generator=g).to(device)
    names = [n for n, _ in model.named_parameters()]
    params = {k: v.detach() for k, v in model.named_parameters()}

    def sample_loss(p, xi, yi):
        return xent(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0), "sum")

    per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))(params, x, y)
    clip = {k: v.reshape(12, -1).norm(dim=1).median().item() for k, v in per_sample.items()}
    ref, norms = reference_grads(model, xent, x, y, clip, per_layer=True)
    dp = privacy.DPSGD(model, None, max_grad_norm=[clip[n] for n in names], noise_multiplier=0.0,
                       clipping="per_layer")
    dp.backward(xent(model(x), y, "mean"))
    for name, p in model.named_parameters():
        scale = ref[name].abs().max().item()
        assert (p.grad - ref[name]).abs().max().item() <= 1e-12 * max(scale, 1.0), name
    torch.testing.assert_close(dp.per_sample_norms, norms, rtol=1e-10, atol=0)
    assert dp.clip_factors is None
    assert dp.max_grad_norm == pytest.approx(math.sqrt(sum(c * c for c in clip.values())))
    dp.remove()


def test_per_layer_noise_and_arguments():
    """Per-layer noise: sigma * sqrt(sum_p C_p^2) / B (one C for 4 parameters: 2 C);
    a list of norms of the wrong length or for flat clipping, a bad clipping name."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    x = torch.randn(16, 64)
    y = torch.randint(0, 8, (16,))
    sigma, c = 0.8, 0.5

    def grads(noise, seed=None):
        with privacy.DPSGD(model, None, max_grad_norm=c, noise_multiplier=noise, clipping="per_layer",
                           seed=seed) as dp:
            dp.backward(F.cross_entropy(model(x), y))
            assert dp.max_grad_norm == pytest.approx(2 * c)
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()

    clean = grads(0.0)
    draws = torch.stack([grads(sigma, seed=s) - clean for s in range(10)])
    assert abs(draws.std().item() / (sigma * 2 * c / 16) - 1.0) < 0.03

    with pytest.raises(ValueError, match=r"^fusekit.privacy: max_grad_norm has 3 norms for 4 trainable parameters$"):
        privacy.DPSGD(model, None, max_grad_norm=[1.0, 1.0, 1.0], noise_multiplier=1.0, clipping="per_layer")
    with pytest.raises(ValueError, match=r"^fusekit.privacy: max_grad_norm\[1\] must be finite and > 0, got 0$"):
        privacy.DPSGD(model, None, max_grad_norm=[1.0, 0, 1.0, 1.0], noise_multiplier=1.0, clipping="per_layer")
    with pytest.raises(TypeError, match=r"^fusekit.privacy: max_grad_norm must be a real number, got list$"):
        privacy.DPSGD(model, None, max_grad_norm=[1.0] * 4, noise_multiplier=1.0)
    with pytest.raises(ValueError, match=r"^fusekit.privacy: clipping must be 'flat' or 'per_layer', got 'layer'$"):
        privacy.DPSGD(model, None, max_grad_norm=1.0, noise_multiplier=1.0, clipping="layer")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
def test_cuda_graph_matches_eager(clipping):
    """cuda_graph=True: the clipping, GEMMs and noise replayed from a CUDA graph give
    the eager result on every step (new data, same shapes), a new batch size captures
    a second graph, sequences work, and p.grad is reattached after zero_grad."""
    torch.manual_seed(0)
    dev = "cuda"

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(12, 16)
            self.b = nn.Linear(16, 5)

        def forward(self, x):
            out = self.b(torch.relu(self.a(x)))
            return out.mean(1) if x.dim() == 3 else out

    eager, graphed = Net().to(dev), Net().to(dev)
    graphed.load_state_dict(eager.state_dict())
    kw = dict(max_grad_norm=0.5, noise_multiplier=0.0, clipping=clipping)
    de = privacy.DPSGD(eager, None, **kw)
    dg = privacy.DPSGD(graphed, None, cuda_graph=True, **kw)
    gen = torch.Generator(device=dev).manual_seed(4)
    for step, shape in enumerate([(32, 12), (32, 12), (32, 12), (20, 12), (32, 12), (8, 3, 12), (8, 3, 12)]):
        x = torch.randn(*shape, device=dev, generator=gen)
        y = torch.randint(0, 5, (shape[0],), device=dev, generator=gen)
        for m, d in ((eager, de), (graphed, dg)):
            m.zero_grad(set_to_none=True)
            d.backward(F.cross_entropy(m(x), y))
        for (n, pe), pg in zip(eager.named_parameters(), graphed.parameters()):
            assert pg.grad is not None, (step, n)
            torch.testing.assert_close(pg.grad, pe.grad, rtol=1e-5, atol=1e-7, msg=f"step {step} {n}")
        torch.testing.assert_close(dg.per_sample_norms, de.per_sample_norms, rtol=1e-5, atol=0)
        if clipping == "flat":
            torch.testing.assert_close(dg.clip_factors, de.clip_factors, rtol=1e-5, atol=0)
    assert len(dg._graphs) == 3  # (32, 12), (20, 12), (8, 3, 12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_cuda_graph_draws_fresh_noise():
    """Each replay draws new noise of standard deviation sigma*C/B, from a seeded
    generator too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()
    x = torch.randn(32, 64, device="cuda")
    y = torch.randint(0, 8, (32,), device="cuda")
    sigma, c = 1.3, 0.7
    clean = privacy.DPSGD(copy.deepcopy(model), None, max_grad_norm=c, noise_multiplier=0.0)
    m0 = clean.model
    clean.backward(F.cross_entropy(m0(x), y))
    ref = torch.cat([p.grad.reshape(-1) for p in m0.parameters()]).double()
    for seed in (None, 3):
        dp = privacy.DPSGD(model, None, max_grad_norm=c, noise_multiplier=sigma, seed=seed, cuda_graph=True)
        draws = []
        for _ in range(6):
            dp.backward(F.cross_entropy(model(x), y))
            draws.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double() - ref)
        dp.remove()
        draws = torch.stack(draws)
        std = sigma * c / 32
        assert abs(draws.std().item() / std - 1.0) < 0.03, (seed, draws.std().item(), std)
        for i in range(1, 6):  # independent draws from step to step
            assert abs(torch.corrcoef(draws[i - 1:i + 1])[0, 1].item()) < 5 / math.sqrt(draws.shape[1]), (seed, i)
