"""CUDA graph capture of the torch path, for every op family with a torch op
(CUDA only; skipped without a GPU):

- ``torch.cuda.graph`` capture where the op's VERY FIRST use in the process happens
  inside the capture, on the graph's own capture stream: each case runs in a fresh
  Python process (``subprocess``) that imports fusekit but calls no fusekit op before
  the capture (torch alone is warmed up on a side stream: its allocator and cuBLAS).
  Then new random inputs are copied into the static input tensors and the graph is
  replayed three times, each replay compared with the plain torch formula in float64
  on the same inputs (forward outputs and gradients);
- ``torch.cuda.make_graphed_callables`` of a small module per family (forward and
  backward), compared with the same module run eagerly: outputs, input and parameter
  gradients, three iterations;
- ``torch.compile(mode="reduce-overhead", fullgraph=True)`` training steps of a small
  model per family (SGD), the losses compared with an eager run from the same
  initial parameters, and no cudagraph skipped.

Families: elementwise (``fusekit.add`` on torch tensors, ``torch.ops.fusekit.axpby``,
``relu``, ``scalar_mul``), the fused linear layer (relu, gelu, gelu_tanh), the Gaussian field
(``gaussian_field``, ``mahalanobis``), the geodesic flow (``christoffel``,
``leapfrog`` with and without a kept trajectory) and the optimizer math on torch
tensors (``matrix_power`` with the capture-safe Newton mode ``tol=0``,
``shampoo_stats``; plain functions, no backward).

``FK_GRAPH_TEST_DRY=1`` runs the subprocess cases without CUDA (on the CPU, the
capture replaced by calling the function again): a check of the cases' code and
references, not of graph capture.
"""

import copy
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from conftest import PKG_ROOT, sgd_losses  # noqa: E402  (PKG_ROOT: the folder holding the fusekit under test)

DRY = os.environ.get("FK_GRAPH_TEST_DRY") == "1"
HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="CUDA graph capture needs a CUDA device")

# ------------------------------------------------------------------ fresh-process capture

PRELUDE = r'''
import math, os, sys
import torch
import torch.nn.functional as F
import fusekit
import fusekit.torch
fusekit.torch.load()  # registers torch.ops.fusekit.* (no fusekit op runs here)
from fusekit.torch.gaussian import gaussian_field, mahalanobis
from fusekit.torch.geodesic import christoffel, leapfrog

DRY = os.environ.get("FK_GRAPH_TEST_DRY") == "1"
dev = "cpu" if DRY else "cuda"
GEN = torch.Generator(device=dev).manual_seed(1234)


def rn(*shape, scale=1.0, grad=False, dtype=torch.float32):
    t = (torch.randn(*shape, generator=GEN, device=dev, dtype=torch.float64) * scale).to(dtype)
    return t.requires_grad_(grad)


def ru(*shape, lo=0.0, hi=1.0, grad=False, dtype=torch.float32):
    t = (torch.rand(*shape, generator=GEN, device=dev, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    return t.requires_grad_(grad)


def rel(out, ref):
    out, ref = out.detach().double().flatten(), ref.detach().double().flatten()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if not torch.isfinite(out).all():
        return float("inf")
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(out - ref).item()
    return num / den if den else num


def sync():
    if not DRY:
        torch.cuda.synchronize()


def torch_warmup():
    """torch's own warm-up (allocator, cuBLAS, autograd) on a side stream; no fusekit op."""
    if DRY:
        return
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for dt in (torch.float32, torch.float64):
            a = torch.randn(64, 64, device=dev, dtype=dt, requires_grad=True)
            (a @ a).relu().sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def to64(ts):
    return [t.detach().double().requires_grad_(t.requires_grad) for t in ts]


def with_grads(f):
    """A graph_test fn (or ref) from y = f(*inputs) for inputs = s[:-1] and the output
    gradient gy = s[-1]: returns [y, dy/d each input]."""
    def run(s):
        *xs, gy = s
        y = f(*xs)
        return [y, *torch.autograd.grad(y, tuple(xs), gy)]
    return run


def graph_test(make, fn, ref, tol, replays=3, name=""):
    """make(): fresh random inputs (a list of tensors, same shapes every call);
    fn(inputs): the fusekit computation, a list of output tensors (results and
    gradients); ref(inputs64): the same in plain torch on float64 copies. Captures
    fn(static inputs) with no fusekit op run before, then replays with new inputs."""
    static = make()
    torch_warmup()
    if DRY:
        outs = None
    else:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # its own capture stream: the first fusekit call of this process
            outs = fn(static)
    for r in range(replays):
        new = make()
        with torch.no_grad():
            for s, n in zip(static, new):
                s.copy_(n)
        if DRY:
            outs = fn(static)
        else:
            g.replay()
        sync()
        refs = ref(to64(new))
        assert len(outs) == len(refs), (len(outs), len(refs))
        for i, (o, rf) in enumerate(zip(outs, refs)):
            e = rel(o, rf)
            print(f"{name} replay {r} output {i}: rel err {e:.2e}")
            assert e <= tol, f"{name} replay {r} output {i}: rel err {e:.3e} > {tol}"
    print("GRAPH TEST OK", name)
'''

# Each case: the body run after PRELUDE in a fresh process (make, fn, ref, graph_test).
CASES = {
    # ---- elementwise
    "add": r'''
def make():
    return [rn(1000), rn(1000)]
def fn(s):
    return [fusekit.add(s[0], s[1])]
def ref(s):
    return [s[0] + s[1]]
graph_test(make, fn, ref, 1e-6, name="fusekit.add")
''',
    "axpby": r'''
def make():
    return [rn(64, 33, grad=True), rn(33, grad=True), rn(64, 33)]
fn = with_grads(lambda a, b: torch.ops.fusekit.axpby(a, b, 2.0, -0.5))
ref = with_grads(lambda a, b: 2.0 * a - 0.5 * b)
graph_test(make, fn, ref, 1e-6, name="axpby")
''',
    "relu": r'''
def make():
    return [rn(1000, grad=True), rn(1000)]
fn = with_grads(torch.ops.fusekit.relu)
ref = with_grads(torch.relu)
graph_test(make, fn, ref, 1e-6, name="relu")
''',
    "scalar_mul": r'''
def make():
    return [rn(40, 25, grad=True), rn(40, 25)]
fn = with_grads(lambda a: torch.ops.fusekit.scalar_mul(a, -1.75))
ref = with_grads(lambda a: a * -1.75)
graph_test(make, fn, ref, 1e-6, name="scalar_mul")
''',
    # ---- fused linear (forward + backward)
    "linear_relu": r'''
ACT = "relu"
def make():
    return [rn(32, 64, grad=True), rn(48, 64, scale=0.125, grad=True), rn(48, scale=0.1, grad=True), rn(32, 48)]
def linear_ref(x, w, b):
    h = F.linear(x, w, b)
    return torch.relu(h) if ACT == "relu" else F.gelu(h, approximate="tanh" if ACT == "gelu_tanh" else "none")
fn = with_grads(lambda x, w, b: fusekit.torch.linalg.linear(x, w, b, ACT))
ref = with_grads(linear_ref)
graph_test(make, fn, ref, 2e-3, name="linear " + ACT)
''',
    # ---- Gaussian field (forward + backward)
    "gaussian_field": r'''
B, N = 256, 64
def chol_(n):
    c = ru(n, 3, 3, lo=-0.3, hi=0.3, dtype=torch.float64)
    for k in range(3):
        c[:, k, k] = ru(n, lo=0.3, hi=0.8, dtype=torch.float64)
    return c.float().requires_grad_(True)
def make():
    return [ru(B, 3, lo=-1, hi=1, grad=True), ru(N, 3, lo=-1, hi=1, grad=True), chol_(N),
            ru(N, lo=-1, hi=1.5, grad=True), rn(B)]
def L_of(c, eps=1e-6):
    return torch.tril(c) + eps * torch.eye(3, dtype=c.dtype, device=c.device)
def maha_ref(p, m, c, eps=1e-6):
    L = L_of(c, eps)
    d = p[:, None, :] - m[None, :, :]
    y0 = d[..., 0] / L[:, 0, 0]
    y1 = (d[..., 1] - L[:, 1, 0] * y0) / L[:, 1, 1]
    y2 = (d[..., 2] - L[:, 2, 0] * y0 - L[:, 2, 1] * y1) / L[:, 2, 2]
    return y0 ** 2 + y1 ** 2 + y2 ** 2
fn = with_grads(gaussian_field)
ref = with_grads(lambda p, m, c, w: (w * torch.exp(-0.5 * maha_ref(p, m, c))).sum(-1))
graph_test(make, fn, ref, 1e-4, name="gaussian_field")
''',
    "mahalanobis": None,  # filled below: gaussian_field's helpers, the mahalanobis op
    # ---- geodesic flow (forward + backward)
    "christoffel": r'''
B, D, R = 64, 96, 8
def make():
    return [rn(B, D, grad=True), rn(D, R, scale=D ** -0.5, grad=True), rn(D, R, scale=2.0 / R, grad=True), rn(B, D)]
def chr_ref(v, U, W, c=5.0):
    p = v @ U
    return torch.clamp((p * p) @ W.T, -c, c)
fn = with_grads(christoffel)
ref = with_grads(chr_ref)
graph_test(make, fn, ref, 1e-4, name="christoffel")
''',
    "leapfrog_keep": r'''
SAVE = True
B, D, R, T, DT = 64, 96, 8, 4, 0.1
def make():
    return [rn(B, D, grad=True), rn(B, D, grad=True), rn(D, R, scale=D ** -0.5, grad=True),
            rn(D, R, scale=2.0 / R, grad=True), rn(B, D, scale=0.5, grad=True), ru(D, hi=0.5), rn(B, D), rn(B, D)]
def chr_ref(v, U, W, c=5.0):
    p = v @ U
    return torch.clamp((p * p) @ W.T, -c, c)
def lf_ref(x, v, f, U, W, mu, dt, T, c=5.0):
    h = 0.5 * dt
    for _ in range(T):
        vh = v + h * (f - chr_ref(v, U, W, c) - mu * v)
        x = x + dt * vh
        v = vh + h * (f - chr_ref(vh, U, W, c) - mu * vh)
    return x, v
def fn(s):
    x0, v0, U, W, f, mu, gx, gv = s
    x, v = leapfrog(x0, v0, U, W, DT, T, f=f, mu=mu, save_traj=SAVE)
    return [x, v, *torch.autograd.grad((x, v), (x0, v0, U, W, f), (gx, gv))]
def ref(s):
    x0, v0, U, W, f, mu, gx, gv = s
    x, v = lf_ref(x0, v0, f, U, W, mu, DT, T)
    return [x, v, *torch.autograd.grad((x, v), (x0, v0, U, W, f), (gx, gv))]
graph_test(make, fn, ref, 1e-4, name=f"leapfrog save_traj={SAVE}")
''',
    "leapfrog_nokeep": None,  # leapfrog_keep with SAVE = False
    # ---- optimizer math on torch tensors (plain functions, no backward)
    "matrix_power": r'''
n, batch, EPS = 48, 3, 1e-3
def make():
    g = rn(batch, n, 2 * n, dtype=torch.float64)
    a = g @ g.transpose(1, 2) / (2 * n) + 0.5 * torch.eye(n, device=dev, dtype=torch.float64)
    return [a.float()]
def fn(s):
    # capture-safe: Newton with tol <= 0 runs exactly max_iter iterations, no host check
    return [fusekit.matrix_power(s[0], -0.25, EPS, method="newton", max_iter=40, tol=0.0)]
def ref(s):
    a = s[0] + EPS * torch.eye(n, device=s[0].device, dtype=s[0].dtype)
    lam, Q = torch.linalg.eigh(a)
    return [Q @ torch.diag_embed(lam ** -0.25) @ Q.transpose(1, 2)]
graph_test(make, fn, ref, 1e-3, name="matrix_power newton tol=0")
''',
    "shampoo_stats": r'''
m, n = 24, 40
def make():
    gl, gr = rn(m, m, dtype=torch.float64), rn(n, n, dtype=torch.float64)
    return [rn(m, n), (gl @ gl.T / m).float(), (gr @ gr.T / n).float()]
def fn(s):
    g, L, R = s
    fusekit.shampoo_stats(g, L, R, alpha=0.25, beta=0.75)  # in place, on the static L, R
    return [L, R]
def ref(s):
    g, L, R = s
    return [0.75 * L + 0.25 * g @ g.T, 0.75 * R + 0.25 * g.T @ g]
graph_test(make, fn, ref, 1e-5, name="shampoo_stats")
''',
}
CASES["linear_gelu"] = CASES["linear_relu"].replace('ACT = "relu"', 'ACT = "gelu"', 1)
CASES["linear_gelu_tanh"] = CASES["linear_relu"].replace('ACT = "relu"', 'ACT = "gelu_tanh"', 1)
CASES["leapfrog_nokeep"] = CASES["leapfrog_keep"].replace("SAVE = True", "SAVE = False", 1)
CASES["mahalanobis"] = (
    CASES["gaussian_field"]
    .split("fn = with_grads(")[0]
    .replace("ru(N, lo=-1, hi=1.5, grad=True), rn(B)]", "rn(B, N)]")
    + r'''
fn = with_grads(mahalanobis)
ref = with_grads(maha_ref)
graph_test(make, fn, ref, 1e-4, name="mahalanobis")
''')


def run_fresh(body: str, timeout: int = 600) -> str:
    """Runs PRELUDE + body in a new Python process (the package of this tree first on
    its path, the environment's FUSEKIT_LIBRARY etc. kept); fails with its output
    unless it exits 0."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PKG_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    code = PRELUDE + "\n" + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"child process exited {proc.returncode}; its output:\n{out[-8000:]}", pytrace=False)
    assert "GRAPH TEST OK" in proc.stdout, out[-8000:]
    print(out)  # (pytest shows it with -s)
    return out


@pytest.mark.skipif(not (HAS_CUDA or DRY), reason="CUDA graph capture needs a CUDA device")
@pytest.mark.parametrize("case", sorted(CASES))
def test_first_use_inside_capture(case):
    run_fresh(CASES[case])


# ------------------------------------------------------------------ small modules per family


def _modules():
    """name -> (module factory(device), sample-input factory(device, gen))."""
    import torch.nn as nn

    import fusekit
    import fusekit.torch

    fusekit.torch.load()
    from fusekit.torch.gaussian import gaussian_field, mahalanobis
    from fusekit.torch.geodesic import christoffel, leapfrog

    def P(t):
        return nn.Parameter(t)

    class Elementwise(nn.Module):
        def __init__(self, dev, g):
            super().__init__()
            self.p = P(torch.randn(33, generator=g, device=dev))

        def forward(self, x):
            h = torch.ops.fusekit.axpby(x, self.p, 1.5, -0.5)
            return torch.ops.fusekit.scalar_mul(torch.ops.fusekit.relu(h), 0.75)

    class Linear(nn.Module):
        def __init__(self, dev, g):
            super().__init__()
            r = lambda *s, sc=1.0: torch.randn(*s, generator=g, device=dev) * sc  # noqa: E731
            self.w1, self.b1 = P(r(64, 33, sc=33 ** -0.5)), P(r(64, sc=0.1))
            self.w2, self.b2 = P(r(48, 64, sc=0.125)), P(r(48, sc=0.1))
            self.w3, self.b3 = P(r(16, 48, sc=48 ** -0.5)), P(r(16, sc=0.1))

        def forward(self, x):
            h = fusekit.torch.linalg.linear(x, self.w1, self.b1, "relu")
            h = fusekit.torch.linalg.linear(h, self.w2, self.b2, "gelu")
            return fusekit.torch.linalg.linear(h, self.w3, self.b3, "none")

    class MLP(nn.Module):  # fusekit.torch.mlp.mlp: the network FusedMLP runs, one op each way
        def __init__(self, dev, g):
            super().__init__()
            r = lambda *s, sc=1.0: torch.randn(*s, generator=g, device=dev) * sc  # noqa: E731
            self.w1, self.b1 = P(r(64, 33, sc=33 ** -0.5)), P(r(64, sc=0.1))
            self.w2 = P(r(48, 64, sc=0.125))
            self.w3, self.b3 = P(r(16, 48, sc=48 ** -0.5)), P(r(16, sc=0.1))

        def forward(self, x):
            return fusekit.torch.mlp.mlp(x, [self.w1, self.w2, self.w3], [self.b1, None, self.b3], "relu", "none")

    class Gaussian(nn.Module):
        def __init__(self, dev, g, n=40):
            super().__init__()
            u = lambda *s, lo, hi: torch.rand(*s, generator=g, device=dev) * (hi - lo) + lo  # noqa: E731
            c = u(n, 3, 3, lo=-0.3, hi=0.3)
            for k in range(3):
                c[:, k, k] = u(n, lo=0.3, hi=0.8)
            self.means, self.chol, self.weights = P(u(n, 3, lo=-1, hi=1)), P(c), P(u(n, lo=-1, hi=1.5))

        def forward(self, pts):
            f = gaussian_field(pts, self.means, self.chol, self.weights)
            return f + 0.01 * mahalanobis(pts, self.means, self.chol).mean(-1)

    class Geodesic(nn.Module):
        def __init__(self, dev, g, d=33, r=8):
            super().__init__()
            self.U = P(torch.randn(d, r, generator=g, device=dev) * d ** -0.5)
            self.W = P(torch.randn(d, r, generator=g, device=dev) * 2.0 / r)
            self.register_buffer("mu", torch.rand(d, generator=g, device=dev) * 0.5)

        def forward(self, x):
            xT, vT = leapfrog(x, 0.5 * x, self.U, self.W, 0.1, 3, mu=self.mu)
            return xT + vT + christoffel(x, self.U, self.W)

    def inputs_ew(dev, g):
        return torch.randn(64, 33, generator=g, device=dev)

    def inputs_pts(dev, g):
        return torch.rand(96, 3, generator=g, device=dev) * 2 - 1

    return {
        "elementwise": (Elementwise, inputs_ew),
        "linear": (Linear, inputs_ew),
        "mlp": (MLP, inputs_ew),
        "gaussian": (Gaussian, inputs_pts),
        "geodesic": (Geodesic, inputs_ew),
    }


FAMILIES = ["elementwise", "linear", "mlp", "gaussian", "geodesic"]


def _rel(a, b):
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    den = torch.linalg.vector_norm(b).item()
    num = torch.linalg.vector_norm(a - b).item()
    return num / den if den else num


def _graphed_vs_eager(family, dev, graphed_fn):
    """Builds the family's module and an eager copy, wraps the first with
    graphed_fn(module, sample_args) and compares outputs, input and parameter
    gradients over three iterations of new inputs."""
    cls, make_in = _modules()[family]
    g = torch.Generator(device=dev).manual_seed(7)
    mod = cls(dev, g)
    eager = copy.deepcopy(mod)
    sample = make_in(dev, g).requires_grad_(True)
    graphed = graphed_fn(mod, (sample,))
    for it in range(3):
        x = make_in(dev, g)
        with torch.no_grad():
            gy = torch.randn(eager(x).shape, generator=g, device=dev)
        res = []
        for m, fwd in ((mod, graphed), (eager, eager)):
            xi = x.clone().requires_grad_(True)
            for p in m.parameters():
                p.grad = None
            y = fwd(xi)
            y.backward(gy)
            res.append([y.detach().clone(), xi.grad.clone()] + [p.grad.clone() for p in m.parameters()])
        for i, (a, b) in enumerate(zip(*res)):
            e = _rel(a, b)
            assert e <= 1e-4, f"{family} iteration {it} tensor {i}: graphed vs eager rel err {e:.3e}"


@cuda_only
@pytest.mark.parametrize("family", FAMILIES)
def test_make_graphed_callables(family):
    _graphed_vs_eager(family, "cuda", lambda m, args: torch.cuda.make_graphed_callables(m, args))


# ------------------------------------------------------------------ torch.compile reduce-overhead


def _train_losses(family, dev, compile_mode, steps=5):
    cls, make_in = _modules()[family]
    g = torch.Generator(device=dev).manual_seed(11)
    mod = cls(dev, g)
    x = make_in(dev, g)
    with torch.no_grad():
        target = torch.randn(mod(x).shape, generator=g, device=dev)
    fwd = mod
    if compile_mode is not None:
        torch._dynamo.reset()
        kw = dict(fullgraph=True)
        if compile_mode == "aot_eager":  # (a CPU check of the code path)
            kw["backend"] = "aot_eager"
        else:
            kw["mode"] = compile_mode
        fwd = torch.compile(mod, **kw)
    return sgd_losses(mod, fwd, x, target, steps, mark_step=compile_mode == "reduce-overhead")


@cuda_only
@pytest.mark.parametrize("family", FAMILIES)
def test_compile_reduce_overhead_training(family):
    from torch._dynamo.utils import counters

    eager = _train_losses(family, "cuda", None)
    counters.clear()
    ro = _train_losses(family, "cuda", "reduce-overhead")
    skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
    assert skips == 0, f"{family}: inductor skipped cudagraphs {skips} time(s) (see the log for the reason)"
    for i, (a, b) in enumerate(zip(ro, eager)):
        assert abs(a - b) <= 1e-4 * max(abs(b), 1e-6), f"{family} step {i}: loss {a} (reduce-overhead) vs {b} (eager)"
    assert eager[-1] < eager[0], f"{family}: the eager losses do not decrease: {eager}"
