"""fusekit.nn: the drop-in modules against nn.Linear and plain-torch float64
references (values and gradients), finite differences, state_dict round trips,
bad arguments, torch.compile(fullgraph=True), and CUDA (eager, CUDA graph capture,
torch.compile reduce-overhead) when a GPU is usable."""

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import fusekit  # noqa: E402
import fusekit.nn as fnn  # noqa: E402
from conftest import sgd_losses  # noqa: E402

PKG_ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def rel(out, ref):
    """||out - ref|| / ||ref|| in float64 (inf when out is not finite)."""
    out, ref = out.detach().double().flatten().cpu(), ref.detach().double().flatten().cpu()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if not torch.isfinite(out).all():
        return math.inf
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(out - ref).item()
    return num / den if den else num


def assert_rel(out, ref, tol, what):
    e = rel(out, ref)
    assert e <= tol, f"{what}: relative error {e:.3e} > {tol:.1e}"


def test_import_fusekit_does_not_import_torch_or_nn():
    code = ("import sys; sys.modules['torch'] = None; import fusekit; "
            "assert 'fusekit.nn' not in sys.modules; print('ok')")
    env = dict(os.environ, PYTHONPATH=str(PKG_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


# ============================================================================ FusedLinear

TORCH_ACT = {
    "relu": torch.relu,
    "gelu": F.gelu,  # erf
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "none": lambda z: z,
}


@pytest.mark.parametrize("bias", [True, False])
def test_fused_linear_init_is_nn_linear_init(bias):
    torch.manual_seed(3)
    ref = nn.Linear(37, 11, bias=bias)
    torch.manual_seed(3)
    m = fnn.FusedLinear(37, 11, bias=bias)
    assert torch.equal(m.weight, ref.weight)
    assert (m.bias is None) == (not bias)
    if bias:
        assert torch.equal(m.bias, ref.bias)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in ref.named_parameters()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("act", fnn.ACTIVATIONS)
def test_fused_linear_against_torch_f64(act, bias, device):
    """float32 module against act(F.linear) in float64: output and the gradients of
    x, weight and bias. The erf and tanh GELUs differ by ~2e-4 relative, far above the
    1e-5 tolerance, so a swapped GELU fails here."""
    torch.manual_seed(0)
    m = fnn.FusedLinear(24, 20, bias=bias, activation=act, device=device)
    x = torch.randn(2, 9, 24, device=device, requires_grad=True)  # leading dims flattened by the op
    y = m(x)
    assert y.shape == (2, 9, 20) and y.dtype == torch.float32
    x64 = x.detach().double().requires_grad_(True)
    w64 = m.weight.detach().double().requires_grad_(True)
    b64 = m.bias.detach().double().requires_grad_(True) if bias else None
    ref = TORCH_ACT[act](F.linear(x64, w64, b64))
    assert_rel(y, ref, 1e-5, f"{act} forward")
    gy = torch.randn_like(y)
    y.backward(gy)
    ref.backward(gy.double())
    assert_rel(x.grad, x64.grad, 1e-5, f"{act} dx")
    assert_rel(m.weight.grad, w64.grad, 1e-5, f"{act} dweight")
    if bias:
        assert_rel(m.bias.grad, b64.grad, 1e-5, f"{act} dbias")


@pytest.mark.parametrize("act", ["none", "gelu", "gelu_tanh"])  # (relu: kinks; its backward is checked above)
@pytest.mark.filterwarnings("ignore:Input #")
def test_fused_linear_gradcheck_f32(act):
    """The backward against central finite differences (float32: no float64 kernel)."""
    torch.manual_seed(1)
    m = fnn.FusedLinear(6, 5, activation=act)
    x = torch.randn(4, 6, requires_grad=True)
    with torch.no_grad():
        m.weight.mul_(2.0)

    def fn(x, w, b):
        return torch.func.functional_call(m, {"weight": w, "bias": b}, (x,))

    assert torch.autograd.gradcheck(fn, (x, m.weight, m.bias), eps=1e-2, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_fused_linear_half_types(dtype, tol):
    torch.manual_seed(2)
    m = fnn.FusedLinear(32, 16, activation="gelu", dtype=dtype)
    x = torch.randn(8, 32, dtype=dtype)
    y = m(x)
    assert y.dtype == dtype
    ref = F.gelu(F.linear(x.double(), m.weight.double(), m.bias.double()))
    assert_rel(y, ref, tol, f"{dtype} forward")


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "none"])
def test_fused_linear_state_dict_both_ways(act):
    torch.manual_seed(4)
    lin = nn.Linear(10, 7)
    fl = fnn.FusedLinear(10, 7, activation=act)
    assert set(fl.state_dict()) == set(lin.state_dict()) == {"weight", "bias"}
    x = torch.randn(5, 10)
    fl.load_state_dict(lin.state_dict())  # nn.Linear -> FusedLinear
    torch.testing.assert_close(fl(x), TORCH_ACT[act](lin(x)), rtol=1e-5, atol=1e-6)
    fl2 = fnn.FusedLinear(10, 7, activation=act)
    lin2 = nn.Linear(10, 7)
    lin2.load_state_dict(fl2.state_dict())  # FusedLinear -> nn.Linear
    assert torch.equal(lin2.weight, fl2.weight) and torch.equal(lin2.bias, fl2.bias)
    torch.testing.assert_close(fl2(x), TORCH_ACT[act](lin2(x)), rtol=1e-5, atol=1e-6)
    # no bias: the same keys as nn.Linear(bias=False), and a biased state dict is refused
    fl3 = fnn.FusedLinear(10, 7, bias=False, activation=act)
    fl3.load_state_dict(nn.Linear(10, 7, bias=False).state_dict())
    with pytest.raises(RuntimeError, match="Unexpected key"):
        fl3.load_state_dict(lin.state_dict())


def test_fused_linear_from_linear():
    torch.manual_seed(5)
    lin = nn.Linear(12, 6)
    lin.bias.requires_grad_(False)
    m = fnn.FusedLinear.from_linear(lin, activation="gelu_tanh")
    assert isinstance(m, fnn.FusedLinear) and m.activation == "gelu_tanh"
    assert torch.equal(m.weight, lin.weight) and torch.equal(m.bias, lin.bias)
    assert m.weight.data_ptr() != lin.weight.data_ptr()  # a copy
    assert m.weight.requires_grad and not m.bias.requires_grad
    x = torch.randn(3, 12)
    torch.testing.assert_close(m(x), F.gelu(lin(x), approximate="tanh"), rtol=1e-5, atol=1e-6)
    nb = fnn.FusedLinear.from_linear(nn.Linear(12, 6, bias=False), activation="none")
    assert nb.bias is None
    assert repr(m) == "FusedLinear(in_features=12, out_features=6, bias=True, activation='gelu_tanh')"
    with pytest.raises(TypeError, match="from_linear: linear must be a torch.nn.Linear, not Conv1d"):
        fnn.FusedLinear.from_linear(nn.Conv1d(2, 2, 1))
    with pytest.raises(ValueError, match="activation must be one of relu, gelu, gelu_tanh, none, got 'tanh'"):
        fnn.FusedLinear.from_linear(lin, activation="tanh")


@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(in_features=0), ValueError, "FusedLinear: in_features must be >= 1, got 0"),
    (dict(in_features=2.0), TypeError, "FusedLinear: in_features must be an int, not float"),
    (dict(out_features=-3), ValueError, "FusedLinear: out_features must be >= 1, got -3"),
    (dict(out_features=True), TypeError, "FusedLinear: out_features must be an int, not bool"),
    (dict(bias="yes"), TypeError, "FusedLinear: bias must be a bool, not str"),
    (dict(activation="swish"), ValueError, "FusedLinear: activation must be one of relu, gelu, gelu_tanh, none, "
                                           "got 'swish'"),
    (dict(activation=None), TypeError, "FusedLinear: activation must be a str"),
    (dict(dtype=torch.float64), TypeError, "FusedLinear: dtype must be one of float16, bfloat16, float32, "
                                           "not torch.float64"),
])
def test_fused_linear_bad_arguments(kwargs, exc, msg):
    args = dict(in_features=4, out_features=3)
    args.update(kwargs)
    with pytest.raises(exc) as e:
        fnn.FusedLinear(**args)
    assert msg in str(e.value)


def test_fused_linear_bad_inputs_name_the_argument():
    m = fnn.FusedLinear(4, 3)
    with pytest.raises(fusekit.ShapeMismatchError, match="x .* has 5 features"):
        m(torch.randn(2, 5))
    with pytest.raises(fusekit.UnsupportedDtypeError, match="x has dtype f64"):
        m(torch.randn(2, 4, dtype=torch.float64))


# ============================================================================ GaussianField


def ref_cholesky(raw_diag, offdiag):
    """L from the parametrisation, written independently of the module."""
    n, dev = raw_diag.shape[0], raw_diag.device
    L = torch.diag_embed(torch.log1p(torch.exp(raw_diag)))
    if offdiag is not None:  # offdiag[:, k] is L[rows[k], cols[k]]
        rows, cols = torch.tensor([1, 2, 2], device=dev), torch.tensor([0, 0, 1], device=dev)
        idx = (torch.arange(n, device=dev).repeat_interleave(3), rows.repeat(n), cols.repeat(n))
        L = L + torch.zeros_like(L).index_put(idx, offdiag.reshape(-1))
    return L


def ref_density(points, means, raw_diag, offdiag, weights, eps):
    """sum_n w_n exp(-0.5 d^T Sigma_n^-1 d), Sigma_n = M M^T, M = L + eps I, float64."""
    M = ref_cholesky(raw_diag, offdiag) + eps * torch.eye(3, dtype=points.dtype, device=points.device)
    sigma = M @ M.transpose(-1, -2)
    d = points[:, None, :] - means[None, :, :]  # [B,N,3]
    sol = torch.linalg.solve(sigma[None].expand(d.shape[0], -1, -1, -1), d.unsqueeze(-1)).squeeze(-1)
    m = (d * sol).sum(-1)
    return (weights * torch.exp(-0.5 * m)).sum(-1)


def _randomise_field(field, gen):
    with torch.no_grad():
        for p in field.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-11), (torch.float32, 2e-5)])
def test_gaussian_field_against_f64_reference(full, dtype, tol, device):
    gen = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    field = fnn.GaussianField(17, volume_size=(2.0, 1.5, 1.0), full_covariance=full, eps=1e-3, device=device,
                              dtype=dtype)
    _randomise_field(field, gen)
    pts = ((torch.rand(33, 3, generator=gen, dtype=torch.float64) - 0.5) * 2.2).to(device, dtype)
    pts.requires_grad_(True)
    out = field(pts)
    assert out.shape == (33,) and out.dtype == dtype
    params = {n: p.detach().double().requires_grad_(True) for n, p in field.named_parameters()}
    p64 = pts.detach().double().requires_grad_(True)
    ref = ref_density(p64, params["means"], params["raw_diag"], params.get("offdiag"), params["weights"], 1e-3)
    assert_rel(out, ref, tol, "density")
    g = torch.randn(33, generator=gen, dtype=torch.float64)
    out.backward(g.to(device, dtype))
    ref.backward(g.to(device))
    assert_rel(pts.grad, p64.grad, tol * 5, "dpoints")
    for n, p in field.named_parameters():
        assert_rel(p.grad, params[n].grad, tol * 5, f"d{n}")
    # covariances() is what the field evaluates
    M = ref_cholesky(params["raw_diag"], params.get("offdiag")).detach() + 1e-3 * torch.eye(3, dtype=torch.float64,
                                                                                              device=device)
    assert_rel(field.covariances(), M @ M.transpose(-1, -2), tol, "covariances")


def test_gaussian_field_gradcheck_f64():
    gen = torch.Generator().manual_seed(8)
    torch.manual_seed(8)
    field = fnn.GaussianField(4, volume_size=1.0, dtype=torch.float64)
    _randomise_field(field, gen)
    pts = (torch.rand(6, 3, generator=gen, dtype=torch.float64) - 0.5).requires_grad_(True)
    names = [n for n, _ in field.named_parameters()]

    def fn(p, *ps):
        return torch.func.functional_call(field, dict(zip(names, ps)), (p,))

    assert torch.autograd.gradcheck(fn, (pts, *field.parameters()))


def test_gaussian_field_init_and_parametrisation():
    torch.manual_seed(9)
    size = (4.0, 2.0, 1.0)
    field = fnn.GaussianField(200, volume_size=size)
    half = torch.tensor(size) / 2
    assert (field.means.abs() <= half).all()
    assert (field.means.max(0).values > 0.8 * half).all() and (field.means.min(0).values < -0.8 * half).all()
    L = field.cholesky()
    assert L.shape == (200, 3, 3) and torch.equal(L, torch.tril(L))
    sigma = 0.5 * (4.0 * 2.0 * 1.0 / 200) ** (1 / 3)
    torch.testing.assert_close(torch.diagonal(L, dim1=-2, dim2=-1), torch.full((200, 3), sigma))
    torch.testing.assert_close(field.covariances(), torch.eye(3).expand(200, 3, 3) * (sigma + 1e-6) ** 2)
    assert torch.equal(field.weights, torch.ones(200))
    # any raw values give a valid factor (positive diagonal)
    with torch.no_grad():
        field.raw_diag.uniform_(-30, 30)
        field.offdiag.normal_()
    d = torch.diagonal(field.cholesky(), dim1=-2, dim2=-1)
    assert (d > 0).all()
    diag = fnn.GaussianField(5, full_covariance=False)
    assert diag.offdiag is None and set(diag.state_dict()) == {"means", "raw_diag", "weights"}
    assert set(field.state_dict()) == {"means", "raw_diag", "offdiag", "weights"}
    c = diag.covariances()
    assert torch.equal(c, torch.diag_embed(torch.diagonal(c, dim1=-2, dim2=-1)))
    assert repr(diag) == "GaussianField(num_gaussians=5, volume_size=2.0, full_covariance=False, eps=1e-06)"


def test_gaussian_field_state_dict_round_trip():
    torch.manual_seed(10)
    a = fnn.GaussianField(9, dtype=torch.float64)
    _randomise_field(a, torch.Generator().manual_seed(10))
    b = fnn.GaussianField(9, dtype=torch.float64)
    pts = torch.rand(12, 3, dtype=torch.float64)
    assert not torch.equal(a(pts), b(pts))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(pts), b(pts))
    with pytest.raises(RuntimeError, match="offdiag"):
        fnn.GaussianField(9, full_covariance=False, dtype=torch.float64).load_state_dict(a.state_dict())


@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(num_gaussians=0), ValueError, "GaussianField: num_gaussians must be >= 1, got 0"),
    (dict(num_gaussians="8"), TypeError, "GaussianField: num_gaussians must be an int, not str"),
    (dict(volume_size=-1.0), ValueError, "GaussianField: volume_size must be > 0, got -1.0"),
    (dict(volume_size=(1.0, 2.0)), TypeError, "GaussianField: volume_size must be a float or three floats"),
    (dict(volume_size=(1.0, math.inf, 1.0)), ValueError, "GaussianField: volume_size must be finite, got inf"),
    (dict(full_covariance=1), TypeError, "GaussianField: full_covariance must be a bool, not int"),
    (dict(eps=-1e-3), ValueError, "GaussianField: eps must be >= 0, got -0.001"),
    (dict(dtype=torch.float16), TypeError, "GaussianField: dtype must be one of float32, float64, not torch.float16"),
])
def test_gaussian_field_bad_arguments(kwargs, exc, msg):
    args = dict(num_gaussians=4)
    args.update(kwargs)
    with pytest.raises(exc) as e:
        fnn.GaussianField(**args)
    assert msg in str(e.value)


def test_gaussian_field_bad_inputs():
    field = fnn.GaussianField(4)
    with pytest.raises(ValueError, match=r"GaussianField: points must be \[B, 3\], got shape \(5, 2\)"):
        field(torch.rand(5, 2))
    with pytest.raises(ValueError, match=r"points must be \[B, 3\], got shape \(3,\)"):
        field(torch.rand(3))
    with pytest.raises(TypeError, match="GaussianField: points is torch.float64 but the module's parameters are "
                                        "torch.float32"):
        field(torch.rand(5, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="GaussianField: points must be a torch.Tensor, not list"):
        field([[0.0, 0.0, 0.0]])


# ============================================================================ geodesic flow


def ref_gamma(v, U, W, c):
    p = v @ U
    return torch.clamp((p * p) @ W.T, -c, c)


def ref_leapfrog(x, v, U, W, dt, steps, f, mu, c):
    h = dt / 2
    f = torch.zeros_like(v) if f is None else f
    mu = torch.zeros(v.shape[-1], dtype=v.dtype, device=v.device) if mu is None else mu
    for _ in range(steps):
        vh = v + h * (f - ref_gamma(v, U, W, c) - mu * v)
        x = x + dt * vh
        v = vh + h * (f - ref_gamma(vh, U, W, c) - mu * vh)
    return x, v


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("clamp", [0.3, math.inf])
def test_christoffel_against_f64_reference(clamp, dtype, tol, device):
    torch.manual_seed(11)
    m = fnn.LowRankChristoffel(13, 4, clamp=clamp, device=device, dtype=dtype)
    with torch.no_grad():
        m.W.mul_(3.0)  # |Gamma| about 0.5: the clamp at 0.3 is active on part of the entries
    v = torch.randn(9, 13, device=device, dtype=dtype, requires_grad=True)
    out = m(v)
    U64, W64 = (p.detach().double().requires_grad_(True) for p in (m.U, m.W))
    v64 = v.detach().double().requires_grad_(True)
    ref = ref_gamma(v64, U64, W64, clamp)
    if clamp < 1:
        frac = (ref.abs() >= clamp).double().mean().item()
        assert 0.1 < frac < 0.9, f"clamped fraction {frac}"
    assert_rel(out, ref, tol, "gamma")
    g = torch.randn_like(ref)
    out.backward(g.to(dtype))
    ref.backward(g)
    for a, b, n in ((v.grad, v64.grad, "dv"), (m.U.grad, U64.grad, "dU"), (m.W.grad, W64.grad, "dW")):
        assert_rel(a, b, tol * 10, n)


def test_christoffel_init_scale():
    torch.manual_seed(12)
    m = fnn.LowRankChristoffel(256, 16, dtype=torch.float64)
    assert abs(m.U.std().item() - 256 ** -0.5) < 0.1 * 256 ** -0.5
    assert abs(m.W.std().item() - 0.1 / 4) < 0.1 * 0.1 / 4
    g = m(torch.randn(512, 256, dtype=torch.float64))
    assert 0.05 < g.std().item() < 0.5  # gently curved at the start, far from the clamp
    assert repr(m) == "LowRankChristoffel(dim=256, rank=16, clamp=5.0)"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-11), (torch.float32, 2e-5)])
@pytest.mark.parametrize("friction,force,save_traj", [
    (False, False, None), (True, True, None), (0.3, True, False), (False, True, True),
])
def test_leapfrog_against_f64_reference(friction, force, save_traj, dtype, tol, device):
    torch.manual_seed(13)
    m = fnn.LeapfrogIntegrator(11, 3, dt=0.15, steps=5, friction=friction, clamp=0.8, save_traj=save_traj,
                               device=device, dtype=dtype)
    with torch.no_grad():
        m.christoffel.W.mul_(10.0)
        if m.mu is not None:
            m.mu.add_(torch.rand(11, dtype=dtype, device=device) * 0.2)  # per feature
    x, v = (torch.randn(7, 11, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    f = torch.randn(7, 11, device=device, dtype=dtype, requires_grad=True) if force else None
    xT, vT = m(x, v, f)
    d = lambda t: None if t is None else t.detach().double().requires_grad_(True)  # noqa: E731
    x64, v64, f64, U64, W64 = d(x), d(v), d(f), d(m.christoffel.U), d(m.christoffel.W)
    mu64 = None if m.mu is None else m.mu.double()
    rx, rv = ref_leapfrog(x64, v64, U64, W64, 0.15, 5, f64, mu64, 0.8)
    assert_rel(xT, rx, tol, "x_T")
    assert_rel(vT, rv, tol, "v_T")
    gx, gv = torch.randn_like(rx), torch.randn_like(rv)
    torch.autograd.backward((xT, vT), (gx.to(dtype), gv.to(dtype)))
    torch.autograd.backward((rx, rv), (gx, gv))
    pairs = [(x.grad, x64.grad, "dx"), (v.grad, v64.grad, "dv"), (m.christoffel.U.grad, U64.grad, "dU"),
             (m.christoffel.W.grad, W64.grad, "dW")]
    if force:
        pairs.append((f.grad, f64.grad, "dforce"))
    for a, b, n in pairs:
        assert_rel(a, b, tol * 10, n)
    with torch.no_grad():  # inference: no trajectory written, same values
        xi, vi = m(x, v, f)
    assert_rel(xi, rx, tol, "x_T (no_grad)")
    assert_rel(vi, rv, tol, "v_T (no_grad)")


def test_leapfrog_gradcheck_f64():
    torch.manual_seed(14)
    m = fnn.LeapfrogIntegrator(5, 2, dt=0.2, steps=3, friction=True, dtype=torch.float64)
    x, v, f = (torch.randn(3, 5, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def fn(x, v, f, U, W):
        return torch.func.functional_call(m, {"christoffel.U": U, "christoffel.W": W}, (x, v, f))

    assert torch.autograd.gradcheck(fn, (x, v, f, m.christoffel.U, m.christoffel.W))


def test_leapfrog_state_dict_and_repr():
    torch.manual_seed(15)
    a = fnn.LeapfrogIntegrator(6, 2, dt=0.1, steps=2, friction=0.25, dtype=torch.float64)
    assert set(a.state_dict()) == {"christoffel.U", "christoffel.W", "mu"}
    assert [n for n, _ in a.named_parameters()] == ["christoffel.U", "christoffel.W"]  # mu: a buffer
    assert torch.equal(a.mu, torch.full((6,), 0.25, dtype=torch.float64))
    assert a.dim == 6 and a.rank == 2
    b = fnn.LeapfrogIntegrator(6, 2, dt=0.1, steps=2, friction=True, dtype=torch.float64)
    assert torch.equal(b.mu, torch.full((6,), fnn.DEFAULT_FRICTION, dtype=torch.float64))
    b.load_state_dict(a.state_dict())
    x, v = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    for s, t in zip(a(x, v), b(x, v)):
        assert torch.equal(s, t)
    nf = fnn.LeapfrogIntegrator(6, 2, dt=0.1, steps=2)
    assert nf.mu is None and set(nf.state_dict()) == {"christoffel.U", "christoffel.W"}
    assert "dt=0.1, steps=2, friction=True, save_traj=None" in repr(a)
    assert "(christoffel): LowRankChristoffel(dim=6, rank=2, clamp=5.0)" in repr(a)


@pytest.mark.parametrize("cls,kwargs,exc,msg", [
    ("chr", dict(dim=0), ValueError, "LowRankChristoffel: dim must be >= 1, got 0"),
    ("chr", dict(rank=1.5), TypeError, "LowRankChristoffel: rank must be an int, not float"),
    ("chr", dict(clamp=-1.0), ValueError, "LowRankChristoffel: clamp must be >= 0, got -1.0"),
    ("chr", dict(clamp=math.nan), ValueError, "LowRankChristoffel: clamp must be finite, got nan"),
    ("chr", dict(dtype=torch.bfloat16), TypeError, "LowRankChristoffel: dtype must be one of float32, float64"),
    ("lf", dict(steps=0), ValueError, "LeapfrogIntegrator: steps must be >= 1, got 0"),
    ("lf", dict(dt=math.inf), ValueError, "LeapfrogIntegrator: dt must be finite, got inf"),
    ("lf", dict(dt="0.1"), TypeError, "LeapfrogIntegrator: dt must be a float, not str"),
    ("lf", dict(friction=-0.1), ValueError, "LeapfrogIntegrator: friction must be >= 0, got -0.1"),
    ("lf", dict(friction="yes"), TypeError, "LeapfrogIntegrator: friction must be a float, not str"),
    ("lf", dict(save_traj=1), TypeError, "LeapfrogIntegrator: save_traj must be a bool, not int"),
    ("lf", dict(rank=0), ValueError, "LowRankChristoffel: rank must be >= 1, got 0"),
])
def test_geodesic_bad_arguments(cls, kwargs, exc, msg):
    if cls == "chr":
        args = dict(dim=4, rank=2)
        args.update(kwargs)
        make = lambda: fnn.LowRankChristoffel(**args)  # noqa: E731
    else:
        args = dict(dim=4, rank=2, dt=0.1, steps=2)
        args.update(kwargs)
        make = lambda: fnn.LeapfrogIntegrator(**args)  # noqa: E731
    with pytest.raises(exc) as e:
        make()
    assert msg in str(e.value)


def test_geodesic_bad_inputs():
    m = fnn.LeapfrogIntegrator(4, 2, dt=0.1, steps=2)
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"LeapfrogIntegrator: v must be \[B, 4\], got shape \(3, 5\)"):
        m(x, torch.randn(3, 5))
    with pytest.raises(ValueError, match=r"LeapfrogIntegrator: x must be \(3, 4\) \(v's shape\), got shape \(2, 4\)"):
        m(torch.randn(2, 4), x)
    with pytest.raises(ValueError, match=r"LeapfrogIntegrator: force must be \(3, 4\) \(v's shape\), got shape \(4,\)"):
        m(x, x, torch.randn(4))
    with pytest.raises(TypeError, match="LeapfrogIntegrator: force is torch.float64 but the module's parameters"):
        m(x, x, torch.randn(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"LowRankChristoffel: v must be \[B, 4\], got shape \(4,\)"):
        m.christoffel(torch.randn(4))


# ============================================================================ torch.compile, CUDA graphs


class _Model(nn.Module):
    """A small model using every module: points -> FusedLinear(relu) -> leapfrog flow
    -> FusedLinear(gelu) -> FusedLinear(none) -> 3-D -> GaussianField density."""

    def __init__(self, device):
        super().__init__()
        self.inp = fnn.FusedLinear(3, 16, activation="relu", device=device)
        self.flow = fnn.LeapfrogIntegrator(16, 4, dt=0.1, steps=3, friction=True, device=device)
        self.mid = fnn.FusedLinear(16, 16, activation="gelu", device=device)
        self.out = fnn.FusedLinear(16, 3, activation="none", device=device)
        self.field = fnn.GaussianField(12, device=device)

    def forward(self, p):
        h = self.inp(p)
        x, v = self.flow(h, 0.5 * h)
        q = self.out(self.mid(x + v))
        return self.field(q + p) + self.flow.christoffel(v).sum(-1)


def _model_and_data(device):
    torch.manual_seed(16)
    model = _Model(device)
    pts = torch.rand(64, 3, device=device) * 2 - 1
    target = torch.rand(64, device=device)
    return model, pts, target


def test_torch_compile_fullgraph_training_cpu():
    """Every module under torch.compile(fullgraph=True) (AOT autograd: the custom ops'
    fake implementations and registered autograd) against eager: losses and
    gradients."""
    model, pts, target = _model_and_data("cpu")
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = sgd_losses(model, compiled, pts, target, 3)
    want = sgd_losses(eager, eager, pts, target, 3)
    for a, b in zip(got, want):
        assert abs(a - b) <= 1e-6 * abs(b), (got, want)
    for (n, a), b in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)
    assert want[-1] < want[0]


@cuda_only
def test_cuda_matches_cpu():
    model, pts, target = _model_and_data("cpu")
    gpu = copy.deepcopy(model).cuda()
    a = model(pts)
    b = gpu(pts.cuda())
    assert_rel(b, a, 1e-4, "cuda vs cpu output")
    (a - target).square().mean().backward()
    (b - target.cuda()).square().mean().backward()
    for (n, p), q in zip(model.named_parameters(), gpu.parameters()):
        assert_rel(q.grad, p.grad, 1e-3, f"cuda vs cpu d{n}")


@cuda_only
def test_cuda_graph_capture_training_step():
    """torch.cuda.graph captures forward + backward of the model; replays with new
    points match eager (output and every parameter gradient)."""
    model, pts, target = _model_and_data("cuda")
    eager = copy.deepcopy(model)
    static_pts = pts.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream (allocator, kernels compiled)
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            (model(static_pts) - target).square().mean().backward()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=True)  # the captured backward allocates the grads (static)
    with torch.cuda.graph(graph):
        static_loss = (model(static_pts) - target).square().mean()
        static_loss.backward()
    for it in range(3):
        new = torch.rand(64, 3, device="cuda") * 2 - 1
        static_pts.copy_(new)
        graph.replay()
        eager.zero_grad(set_to_none=True)
        loss = (eager(new) - target).square().mean()
        loss.backward()
        assert_rel(static_loss, loss, 1e-5, f"replay {it} loss")
        for (n, p), q in zip(model.named_parameters(), eager.parameters()):
            assert_rel(p.grad, q.grad, 1e-4, f"replay {it} d{n}")


@cuda_only
def test_cuda_compile_reduce_overhead_training():
    """torch.compile(mode="reduce-overhead", fullgraph=True): inductor with CUDA graphs,
    no cudagraph skipped, the losses those of eager."""
    from torch._dynamo.utils import counters

    model, pts, target = _model_and_data("cuda")
    eager = copy.deepcopy(model)
    want = sgd_losses(eager, eager, pts, target, 5)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead")
    got = sgd_losses(model, compiled, pts, target, 5, mark_step=True)
    skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
    assert skips == 0, f"inductor skipped cudagraphs {skips} time(s)"
    for i, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= 1e-4 * max(abs(b), 1e-6), f"step {i}: {a} (reduce-overhead) vs {b} (eager)"
    assert want[-1] < want[0]
