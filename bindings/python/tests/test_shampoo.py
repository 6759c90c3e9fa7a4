"""fusekit.optim.Shampoo against a float64 reference written here in plain torch
(eigh roots), its state_dict round trip, the float64 retry, the distributed root
split (threads standing in for ranks) and its argument errors. CUDA variants skip
without a GPU; the torchrun test on two GPUs is tests/dist/shampoo_torchrun.py."""

import copy
import io
import threading

import pytest

torch = pytest.importorskip("torch")

import fusekit  # noqa: E402
import fusekit.optim as fo  # noqa: E402
from fusekit.optim import Shampoo, assign_roots, block_ranges, root_batches  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


# ---------------------------------------------------------------------------
# The reference: DistributedShampoo's step order, float64, eigh roots
# ---------------------------------------------------------------------------


def ref_root(a, eps):
    s = a + eps * torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
    w, q = torch.linalg.eigh(s)
    lo = w.min()
    if lo < eps:
        w = w + (eps - lo)
    return (q * w.pow(-0.25)) @ q.T


class RefShampoo:
    def __init__(self, params, lr, betas, epsilon, precondition_frequency, start_preconditioning_step,
                 max_preconditioner_dim, grafting, grafting_beta2=0.999, grafting_epsilon=1e-8, weight_decay=0.0,
                 decoupled_weight_decay=True, bias_correction=True):
        self.params = list(params)
        self.h = dict(lr=lr, b1=betas[0], b2=betas[1], eps=epsilon, freq=precondition_frequency,
                      start=start_preconditioning_step, bs=max_preconditioner_dim, graft=grafting, gb2=grafting_beta2,
                      geps=grafting_epsilon, wd=weight_decay, dec=decoupled_weight_decay, bc=bias_correction)
        self.t = 0
        self.st = [dict() for _ in self.params]

    def blocks(self, p):
        if p.dim() < 2:
            return None
        m, n = p.shape[0], p.numel() // p.shape[0]
        b = self.h["bs"]
        return [(slice(i, min(i + b, m)), slice(j, min(j + b, n))) for i in range(0, m, b) for j in range(0, n, b)]

    @torch.no_grad()
    def step(self):
        h = self.h
        self.t += 1
        t = self.t
        for p, st in zip(self.params, self.st):
            g = p.grad.clone()
            if h["wd"] and not h["dec"]:
                g += h["wd"] * p
            blocks = self.blocks(p)
            if not st:
                st["m"] = torch.zeros_like(p)
                st["v"] = torch.zeros_like(p)
                if blocks:
                    g2 = g.reshape(p.shape[0], -1)
                    st["L"] = [torch.zeros(g2[r, c].shape[0], g2[r, c].shape[0], dtype=p.dtype) for r, c in blocks]
                    st["R"] = [torch.zeros(g2[r, c].shape[1], g2[r, c].shape[1], dtype=p.dtype) for r, c in blocks]
                    st["Li"] = [torch.eye(x.shape[0], dtype=p.dtype) for x in st["L"]]
                    st["Ri"] = [torch.eye(x.shape[0], dtype=p.dtype) for x in st["R"]]
            if blocks:
                g2 = g.reshape(p.shape[0], -1)
                a = 1.0 if h["b2"] == 1 else 1 - h["b2"]
                b = 1.0 if h["b2"] == 1 else h["b2"]
                for k, (r, c) in enumerate(blocks):
                    gb = g2[r, c]
                    st["L"][k] = b * st["L"][k] + a * gb @ gb.T
                    st["R"][k] = b * st["R"][k] + a * gb.T @ gb
                if (t % h["freq"] == 0 and t > h["start"]) or t == h["start"]:
                    c2 = 1 - h["b2"] ** t if (h["b2"] < 1 and h["bc"]) else 1.0
                    for k in range(len(blocks)):
                        st["Li"][k] = ref_root(st["L"][k] / c2, h["eps"])
                        st["Ri"][k] = ref_root(st["R"][k] / c2, h["eps"])
            if h["graft"] == "adam":
                st["v"] = h["gb2"] * st["v"] + (1 - h["gb2"]) * g * g
            if h["b1"] > 0:
                st["m"] = h["b1"] * st["m"] + (1 - h["b1"]) * g
                gbar = st["m"] / (1 - h["b1"] ** t) if h["bc"] else st["m"]
            else:
                gbar = g
            if h["graft"] == "adam":
                c = 1 - h["gb2"] ** t if h["bc"] else 1.0
                pg = gbar / ((st["v"] / c).sqrt() + h["geps"])
            else:
                pg = gbar
            if blocks is None or t < h["start"]:
                d = pg
            else:
                gb2, pg2 = gbar.reshape(p.shape[0], -1), pg.reshape(p.shape[0], -1)
                d2 = torch.empty_like(gb2)
                for k, (r, c) in enumerate(blocks):
                    x = st["Li"][k] @ gb2[r, c] @ st["Ri"][k]
                    if h["graft"] is not None:
                        x = x * (pg2[r, c].norm() / (x.norm() + 1e-16))
                    d2[r, c] = x
                d = d2.reshape(p.shape)
            if h["wd"] and h["dec"]:
                d = d + h["wd"] * p
            p -= h["lr"] * d


# ---------------------------------------------------------------------------
# A small model: two linear layers (one blocked), biases (1-D) and a 3-D tensor
# ---------------------------------------------------------------------------


def make_params(dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(30, 20), (30,), (5, 30), (5,), (3, 2, 5)]
    return [(0.3 * torch.randn(s, generator=gen, dtype=torch.float64)).to(dtype=dtype, device=device)
            .requires_grad_() for s in shapes]


def data(device, dtype, n=64, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=gen, dtype=torch.float64)
    y = torch.randn(n, 5, generator=gen, dtype=torch.float64)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


def loss_fn(ps, x, y):
    w1, b1, w2, b2, c = ps
    h = torch.tanh(x @ w1.T + b1)
    o = h @ w2.T + b2 + (x[:, :10].reshape(-1, 2, 5) * c.sum(0)).sum(1)
    return ((o - y) ** 2).mean()


def train(opt, ps, steps, device, dtype, seed=1):
    losses = []
    for i in range(steps):
        x, y = data(device, dtype, seed=seed + i)
        for p in ps:
            p.grad = None
        loss = loss_fn(ps, x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


CASES = {
    "adam_blocked": dict(lr=0.05, betas=(0.9, 1.0), epsilon=1e-4, precondition_frequency=1,
                         start_preconditioning_step=1, max_preconditioner_dim=16, grafting="adam"),
    "sgd_ema_start_freq_wd": dict(lr=0.05, betas=(0.0, 0.95), epsilon=1e-4, precondition_frequency=2,
                                  start_preconditioning_step=3, max_preconditioner_dim=12, grafting="sgd",
                                  weight_decay=0.01),
    "no_grafting_l2": dict(lr=0.01, betas=(0.5, 0.99), epsilon=1e-3, precondition_frequency=3,
                           start_preconditioning_step=2, max_preconditioner_dim=64, grafting=None,
                           weight_decay=0.02, decoupled_weight_decay=False),
    "adam_no_bias_correction": dict(lr=0.02, betas=(0.9, 0.99), epsilon=1e-4, precondition_frequency=2,
                                    start_preconditioning_step=4, max_preconditioner_dim=7, grafting="adam",
                                    bias_correction=False, grafting_beta2=0.9, grafting_epsilon=1e-6),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_against_float64_reference(case, device):
    """float64 parameters: fusekit's statistics, roots and preconditioning against
    the reference, 8 steps. Differences are rounding only (measured 5e-15 relative on
    the CPU), so 1e-10 relative leaves room for the GPU's eigensolvers."""
    kw = CASES[case]
    ps = make_params(torch.float64, device)
    ref_ps = [p.detach().cpu().clone().requires_grad_() for p in ps]
    opt = Shampoo(ps, **kw)
    ref = RefShampoo(ref_ps, **kw)
    train(opt, ps, 8, device, torch.float64)
    train(ref, ref_ps, 8, "cpu", torch.float64)
    for p, q, p0 in zip(ps, ref_ps, make_params(torch.float64, "cpu")):
        assert not torch.equal(p.detach().cpu(), p0.detach())  # it moved
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-10, atol=1e-12)
    assert opt.root_stats["computed"] > 0 and opt.root_stats["float64_retries"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_float32_against_float64_reference(device):
    """float32 parameters (float32 statistics and roots) against the float64
    reference over 6 steps: float32 rounding (6e-8) grows through the roots and six
    updates to 5e-7 of the largest entry (measured on the CPU); 2e-5 leaves room for
    the GPU's float32 eigensolvers."""
    kw = CASES["adam_blocked"]
    ps = make_params(torch.float32, device)
    ref_ps = [p.detach().cpu().double().clone().requires_grad_() for p in ps]
    opt = Shampoo(ps, **kw)
    ref = RefShampoo(ref_ps, **kw)
    train(opt, ps, 6, device, torch.float32)
    train(ref, ref_ps, 6, "cpu", torch.float64)
    for p, q in zip(ps, ref_ps):
        torch.testing.assert_close(p.detach().cpu().double(), q.detach(), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_float64_retry(device):
    """max_condition_f32=0 sends every float32 root to float64 (counted); a float32
    root that raises is retried too; when float64 fails as well the previous root is
    kept, with a warning."""
    kw = CASES["adam_blocked"]
    ps = make_params(torch.float32, device)
    opt = Shampoo(ps, max_condition_f32=0, **kw)
    train(opt, ps, 2, device, torch.float32)
    st = opt.root_stats
    assert st["computed"] > 0 and st["float64_retries"] == st["computed"] and st["kept"] == 0
    # the retried roots are the float64 reference's roots, rounded to float32
    w1 = ps[0]
    L0 = opt.state[w1]["L"][0].double()
    torch.testing.assert_close(opt.state[w1]["L_root"][0].double(), ref_root(L0, kw["epsilon"]), rtol=1e-5, atol=1e-6)


def test_float64_retry_after_an_error_and_kept_root(monkeypatch):
    kw = CASES["adam_blocked"]
    real = fusekit.ops.optim.matrix_power
    calls = []

    def f32_fails(a, *args, **kwargs):
        calls.append(a.dtype)
        if a.dtype == torch.float32:
            raise fusekit.NotConvergedError("matrix_power: injected failure")
        return real(a, *args, **kwargs)

    monkeypatch.setattr(fusekit.ops.optim, "matrix_power", f32_fails)
    ps = make_params(torch.float32, "cpu")
    opt = Shampoo(ps, **kw)
    train(opt, ps, 1, "cpu", torch.float32)
    assert torch.float32 in calls and torch.float64 in calls
    assert opt.root_stats["float64_retries"] == opt.root_stats["computed"] > 0
    assert not torch.equal(opt.state[ps[0]]["L_root"][0], torch.eye(16))

    def all_fail(a, *args, **kwargs):
        raise fusekit.NotConvergedError("matrix_power: injected failure")

    monkeypatch.setattr(fusekit.ops.optim, "matrix_power", all_fail)
    before = [r.clone() for r in opt.state[ps[0]]["L_root"]]
    with pytest.warns(RuntimeWarning, match=r"failed in torch.float64 \(matrix_power: injected failure.*keeping "
                                            r"their previous roots"):
        train(opt, ps, 1, "cpu", torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(before, opt.state[ps[0]]["L_root"]))
    kept = opt.root_stats["kept"]
    assert kept > 0

    def nan_roots(a, *args, return_report=False, **kwargs):
        out, rep = real(a, *args, return_report=True, **kwargs)
        out.fill_(float("nan"))
        return (out, rep) if return_report else out

    monkeypatch.setattr(fusekit.ops.optim, "matrix_power", nan_roots)
    with pytest.warns(RuntimeWarning, match="failed in torch.float64 \\(a non-finite result\\)"):
        train(opt, ps, 1, "cpu", torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(before, opt.state[ps[0]]["L_root"]))
    assert opt.root_stats["kept"] > kept


# ---------------------------------------------------------------------------
# The fast root path: fixed Newton iterations, acceptance on the device, lazy retry
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("iterations", [None, 12])
def test_fast_path_against_float64_reference(device, iterations):
    """root_method="newton" (the CUDA default for float32) against the float64 eigh
    reference, 6 steps: the statistics here (condition numbers 1e2 to 1e3) converge
    well inside 12 iterations, so the result is the float32 one (measured 1.9e-6 of
    the largest entry on the CPU, as with the eigendecomposition); roots within 1e-5."""
    kw = CASES["adam_blocked"]
    ps = make_params(torch.float32, device)
    ref_ps = [p.detach().cpu().double().clone().requires_grad_() for p in ps]
    opt = Shampoo(ps, root_method="newton", newton_iterations=iterations, **kw)
    ref = RefShampoo(ref_ps, **kw)
    train(opt, ps, 6, device, torch.float32)
    train(ref, ref_ps, 6, "cpu", torch.float64)
    opt._settle()
    for p, q in zip(ps, ref_ps):
        torch.testing.assert_close(p.detach().cpu().double(), q.detach(), rtol=2e-5, atol=2e-6)
    st = opt.state[ps[0]]
    for L, X in zip(st["L"], st["L_root"]):
        torch.testing.assert_close(X.cpu().double(), ref_root(L.cpu().double(), kw["epsilon"]), rtol=1e-5, atol=1e-5)
    assert opt.root_stats == {"computed": 84, "float64_retries": 0, "kept": 0, "strict_retries": 0}


def gaussian_product_stats(n, batch, seed):
    """``S = G G^T`` for ``G = A B / batch`` (A ``[n, batch]``, B ``[batch, n]``
    Gaussian, as benches/bench_shampoo.py's step): condition numbers ~1e6 with
    eps = 1e-6 at n = 256, 1e6 at n = 1024, ``|S|_F / eps ~ 1e7``."""
    gen = torch.Generator().manual_seed(seed)
    G = torch.randn(n, batch, generator=gen, dtype=torch.float64) @ torch.randn(batch, n, generator=gen,
                                                                                  dtype=torch.float64) / batch
    return G, G @ G.T


def fast_root_errors(G, S, eps, iterations, allow_tf32, device):
    """(accepted?, relative Frobenius error of X G, relative 2-norm error of X) of the
    fast path's root against the float64 eigh root."""
    opt = Shampoo([torch.zeros(2, 2, requires_grad=True, device=device)], root_method="newton",
                  newton_iterations=iterations, allow_tf32=allow_tf32)
    Sf = S.float().to(device)
    X = fusekit.matrix_power(Sf, -0.25, eps, method="newton", max_iter=iterations, tol=0.0, allow_tf32=allow_tf32)
    ok = bool(opt._accept(Sf[None], X[None], eps)[0])
    Xe = ref_root(S, eps)
    X = X.cpu().double()
    pe = float(torch.linalg.matrix_norm((X - Xe) @ G) / torch.linalg.matrix_norm(Xe @ G))
    xe = float(torch.linalg.matrix_norm(X - Xe, 2) / torch.linalg.matrix_norm(Xe, 2))
    return ok, pe, xe


@pytest.mark.parametrize("seed", [0, 1])
def test_fast_path_on_ill_conditioned_statistics(seed):
    """Statistics like the bench's (condition ~1e6, eps = 1e-6), n = 256, CPU float32:
    20 iterations converge (X G within 1e-4 of float64; measured 1e-5, X itself 2e-3
    in the 2-norm); 12 iterations are accepted with the smallest directions not yet
    finished (X's 2-norm error 0.6: they are damped), which moves the preconditioned
    gradient X G by at most 1e-2 (measured 2.8e-3)."""
    G, S = gaussian_product_stats(256, 1024, seed)
    ok, pe, xe = fast_root_errors(G, S, 1e-6, 20, False, "cpu")
    assert ok and pe < 1e-4 and xe < 1e-2
    ok, pe, xe = fast_root_errors(G, S, 1e-6, 12, False, "cpu")
    assert ok and pe < 1e-2 and xe > 0.1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("allow_tf32,iterations,bound", [(False, 20, 1e-4), (True, 12, 2e-2)])
def test_fast_path_bench_statistics_cuda(allow_tf32, iterations, bound):
    """The bench's statistics at n = 1024 on CUDA: strict float32 with 20 iterations
    and TF32 with 12 (the defaults) are accepted, X G within ``bound`` of float64
    (TF32: 6.6e-3 in a CPU emulation of TF32 rounding; TF32 Newton diverges from
    iteration ~15 on these matrices, which is why its default is 12)."""
    G, S = gaussian_product_stats(1024, 4096, 0)
    ok, pe, _ = fast_root_errors(G, S, 1e-6, iterations, allow_tf32, "cuda")
    assert ok and pe < bound, (ok, pe)


def spike_stats(n, eps, seed=0):
    """Statistics shaped like the training bench's hidden layers after ~60 steps (as
    measured on the CPU): one direction at 2e4 eps, the other n - 1 eigenvalues
    log-spaced from 6e-3 eps to 1.4 eps, random eigenvectors; float64."""
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    lam = eps * 10 ** torch.linspace(-2.2, 0.15, n, dtype=torch.float64)
    lam[-1] = 2e4 * eps
    return (q * lam) @ q.T


def y_eigs(S, X, eps):
    """The eigenvalues of X^2 (S + eps I) X^2 in float64 (all 1 for the exact root)."""
    X = X.cpu().double()
    Y = X @ X @ (S + eps * torch.eye(S.shape[0], dtype=torch.float64)) @ X @ X
    return torch.linalg.eigvalsh((Y + Y.T) / 2)


def y_max(S, X, eps):
    """The largest eigenvalue of X^2 (S + eps I) X^2 in float64 (1 for the exact root)."""
    return float(y_eigs(S, X, eps).max())


def test_damped_newton_leaves_the_small_directions_short():
    """What TF32_DAMPED_ITERATIONS gives up, in strict arithmetic (the CPU): on
    spike_stats (hint 15 > TF32_FINISH_HINT) the spike direction is finished
    (largest eigenvalue of X^2 (S + eps I) X^2 within 1e-4 of 1) and the bulk is
    damped: its eigenvalues there are about 0.15 (X about 0.62 of the exact root),
    never above 1."""
    eps = 1e-6
    S = spike_stats(1024, eps)
    ratio = (float(torch.linalg.matrix_norm(S)) + eps * 1024 ** 0.5) / eps
    assert fo.newton_iterations_for(ratio) > fo.TF32_FINISH_HINT
    X = fusekit.matrix_power(S.float(), -0.25, eps, method="newton", max_iter=fo.TF32_DAMPED_ITERATIONS, tol=0.0)
    ev = y_eigs(S, X, eps)
    assert abs(float(ev.max()) - 1.0) < 1e-4 and 0.1 < float(ev.min()) and float(ev.median()) < 0.3, ev


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_tf32_damps_where_finishing_would_overshoot_cuda():
    """Why TF32_DAMPED_ITERATIONS exists: on spike_stats (|S + eps I|_F / eps = 2e4,
    hint 15) 12 TF32 Newton iterations finish every direction and TF32 rounding
    overshoots the root (max eigenvalue of X^2 (S + eps I) X^2 1.76 in a CPU emulation
    of TF32; the bench's trained statistics gave 1.15 to 1.79). Stopping at
    TF32_DAMPED_ITERATIONS keeps the largest within 5e-2 of 1 (emulated 1.005, 1.0255
    on the H100) and the acceptance check passes it."""
    eps = 1e-6
    S = spike_stats(1024, eps)
    Sf = S.float().cuda()
    tf32 = fusekit.matrix_power(Sf, -0.25, eps, method="newton", max_iter=12, tol=0.0, allow_tf32=True)
    damped = fusekit.matrix_power(Sf, -0.25, eps, method="newton", max_iter=fo.TF32_DAMPED_ITERATIONS, tol=0.0,
                                  allow_tf32=True)
    y_tf32, ev = y_max(S, tf32, eps), y_eigs(S, damped, eps)
    assert y_tf32 > 1.0 + fo.ROOT_ACCEPT_TOL and abs(float(ev.max()) - 1.0) < 5e-2 and float(ev.min()) > 0.1, \
        (y_tf32, float(ev.max()), float(ev.min()))
    ok = Shampoo([torch.zeros(2, 2, requires_grad=True, device="cuda")])._accept(Sf[None], damped[None], eps)
    assert ok.tolist() == [True]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("allow_tf32", [False, True])
def test_fast_path_roots_do_not_depend_on_the_batch(device, allow_tf32):
    """A root comes out of the fast path (fixed Newton iterations, tol = 0) and its
    acceptance check the same whatever else shares its batch. On the CPU bit for
    bit; on CUDA cuBLAS picks its batched-GEMM kernel by batch count, so the roots
    agree to rounding (measured on the H100 and H200: about 2e-6 of the root's
    scale in float32; the bounds below are 1e-5, and 1e-2 with TF32, whose products
    carry 10-bit mantissas) and the acceptance flags agree. That rounding is why
    roots are computed in canonical batches, which the distributed split hands to
    ranks whole (fusekit.optim.root_batches). Five
    statistics of side 48 and 96: the batch of five against each alone and
    against a batch of two."""
    exact = device == "cpu"
    rtol = 1e-2 if allow_tf32 else 1e-5

    def same(a, b):
        if exact:
            return torch.equal(a, b)
        return float((a - b).abs().max()) <= rtol * float(b.abs().max())

    for n in (48, 96):
        S = torch.stack([gaussian_product_stats(n, 2 * n, seed)[1] for seed in range(5)]).float().to(device)
        eps = 1e-3

        def roots(A):
            X = fusekit.matrix_power(A, -0.25, eps, method="newton", max_iter=16, tol=0.0, allow_tf32=allow_tf32)
            ok = Shampoo([torch.zeros(2, 2, requires_grad=True, device=device)])._accept(A, X, eps)
            return X, ok

        X, ok = roots(S)
        for i in range(5):
            Xi, oki = roots(S[i:i + 1].clone())
            d = float((Xi[0] - X[i]).abs().max()) / float(X[i].abs().max())
            assert same(Xi[0], X[i]) and torch.equal(oki[0], ok[i]), (n, i, d)
        X2, ok2 = roots(S[1:3].clone())
        assert same(X2, X[1:3]) and torch.equal(ok2, ok[1:3]), n


@pytest.mark.parametrize("device", DEVICES)
def test_accept_check(device):
    """The acceptance check: the exact root and an unfinished one (0.9 x) pass; an
    over-amplified (1.05 x: 1.2 in the 4th power) and a non-finite root fail."""
    G, S = gaussian_product_stats(64, 256, 3)
    eps = 1e-3
    X = ref_root(S, eps)
    opt = Shampoo([torch.zeros(2, 2, requires_grad=True, device=device)], root_method="newton")
    Xs = torch.stack([X, 0.9 * X, 1.05 * X, X.clone().fill_(float("nan")), X.clone().fill_(float("inf"))])
    Ss = S.expand(5, -1, -1).contiguous()
    for dt in (torch.float32, torch.float64):
        ok = opt._accept(Ss.to(device, dt), Xs.to(device, dt), eps)
        assert ok.device.type == device and ok.tolist() == [True, True, False, False, False]


def test_newton_iterations_from_the_last_statistics(monkeypatch):
    """The iteration count follows ``|A + eps I|_F / eps`` read with the last flags:
    20 + 2 for the bench's 1.2e7 (capped by the default), 8 for 30, none known for
    eps = 0; the first computation and an explicit ``newton_iterations`` use the cap."""
    assert fo.newton_iterations_for(1.2e7) == 22
    assert fo.newton_iterations_for(30.0) == 8
    assert fo.newton_iterations_for(0.5) == 6
    assert fo.newton_iterations_for(float("inf")) is None and fo.newton_iterations_for(float("nan")) is None
    real = fusekit.ops.optim.matrix_power
    iters = []

    def record(a, *args, max_iter=100, **kwargs):
        iters.append(max_iter)
        return real(a, *args, max_iter=max_iter, **kwargs)

    monkeypatch.setattr(fusekit.ops.optim, "matrix_power", record)
    kw = dict(CASES["adam_blocked"], epsilon=1e-2)
    ps = make_params(torch.float32, "cpu")
    opt = Shampoo(ps, root_method="newton", **kw)
    train(opt, ps, 1, "cpu", torch.float32)
    assert iters == [20] * 6  # nothing known yet: the cap, one batch per size (16, 14, 4, 5, 3, 10)
    iters.clear()
    train(opt, ps, 2, "cpu", torch.float32, seed=2)
    # from the statistics' ratios, one batch per size and iteration count
    assert iters and all(4 <= k < 20 for k in iters), iters
    opt._settle()  # learns from step 3's roots, whose statistics (beta2 = 1: scale 1) are the current L
    w1 = ps[0]
    L = opt.state[w1]["L"][0].double()
    ratio = (torch.linalg.matrix_norm(L) + 1e-2 * L.shape[0] ** 0.5) / 1e-2
    assert opt.state[w1]["newton_hints"]["L"][0] == fo.newton_iterations_for(float(ratio))
    opt = Shampoo(make_params(torch.float32, "cpu"), root_method="newton", newton_iterations=9, **kw)
    iters.clear()
    train(opt, opt.param_groups[0]["params"], 3, "cpu", torch.float32)
    assert set(iters) == {9}


def test_fast_path_rejects_keeps_then_retries_in_float64(monkeypatch):
    """A rejected fast-path root leaves the previous root in place (on the device, no
    host read) and is recomputed in float64 from the same statistics at the start of
    the next step; a failing Newton call is retried at once."""
    kw = CASES["adam_blocked"]
    real = fusekit.ops.optim.matrix_power

    def overshoot(a, *args, **kwargs):
        out = real(a, *args, **kwargs)
        return out * 2 if a.dtype == torch.float32 else out

    monkeypatch.setattr(fusekit.ops.optim, "matrix_power", overshoot)
    ps = make_params(torch.float32, "cpu")
    opt = Shampoo(ps, root_method="newton", **kw)
    train(opt, ps, 1, "cpu", torch.float32)
    st = opt.state[ps[0]]
    assert all(torch.equal(r, torch.eye(r.shape[0])) for r in st["L_root"])  # previous (identity) kept
    assert opt.root_stats == {"computed": 14, "float64_retries": 0, "kept": 0, "strict_retries": 0}
    opt._settle()
    assert opt.root_stats == {"computed": 14, "float64_retries": 14, "kept": 0, "strict_retries": 0}
    for L, X in zip(st["L"], st["L_root"]):
        torch.testing.assert_close(X.double(), ref_root(L.double(), kw["epsilon"]), rtol=1e-5, atol=1e-6)
    train(opt, ps, 1, "cpu", torch.float32)  # settles nothing new, queues 14 more rejections
    assert opt.root_stats["float64_retries"] == 14 and sum(len(j) for _, _, j in opt._pending) == 14

    def raises(a, *args, **kwargs):
        if a.dtype == torch.float32:
            raise fusekit.NotConvergedError("matrix_power: injected failure")
        return real(a, *args, **kwargs)

    monkeypatch.setattr(fusekit.ops.optim, "matrix_power", raises)
    train(opt, ps, 1, "cpu", torch.float32)  # settles the 14 above, then 14 immediate retries
    assert opt.root_stats == {"computed": 42, "float64_retries": 42, "kept": 0, "strict_retries": 0}
    assert not opt._pending


def test_rejected_tf32_root_is_retried_in_strict_float32_first(monkeypatch):
    """After a rejected TF32 root the strict float32 fast path comes first (its check
    read at once); only what it fails goes to float64. (TF32 is ignored on the CPU:
    the injected overshoot stands for a TF32 Newton run that diverged.)"""
    kw = CASES["adam_blocked"]
    real = fusekit.ops.optim.matrix_power

    def tf32_overshoots(a, *args, allow_tf32=False, **kwargs):
        out = real(a, *args, allow_tf32=allow_tf32, **kwargs)
        return out * 2 if allow_tf32 else out

    monkeypatch.setattr(fusekit.ops.optim, "matrix_power", tf32_overshoots)
    ps = make_params(torch.float32, "cpu")
    opt = Shampoo(ps, root_method="newton", allow_tf32=True, **kw)
    train(opt, ps, 1, "cpu", torch.float32)
    opt._settle()
    assert opt.root_stats == {"computed": 14, "float64_retries": 0, "kept": 0, "strict_retries": 14}
    st = opt.state[ps[0]]
    for L, X in zip(st["L"], st["L_root"]):  # entries up to epsilon^(-1/4) = 10: 1e-5 of that
        torch.testing.assert_close(X.double(), ref_root(L.double(), kw["epsilon"]), rtol=1e-5, atol=1e-4)

    def strict_overshoots_too(a, *args, **kwargs):
        out = real(a, *args, **kwargs)
        return out * 2 if a.dtype == torch.float32 else out

    monkeypatch.setattr(fusekit.ops.optim, "matrix_power", strict_overshoots_too)
    train(opt, ps, 1, "cpu", torch.float32)
    opt._settle()
    assert opt.root_stats == {"computed": 28, "float64_retries": 14, "kept": 0, "strict_retries": 28}


def test_tf32_roots_of_ill_conditioned_statistics_are_damped(monkeypatch):
    """With allow_tf32 every fast-path batch runs TF32: an unknown hint (the first
    computation) with up to 12 iterations, a hint of at most TF32_FINISH_HINT with the
    hint's iterations, a larger hint (|A + eps I|_F / eps above ~7e2) with
    TF32_DAMPED_ITERATIONS; a rejected TF32 root gets the strict float32 retry, then
    float64. The ratio is set by epsilon: |L|_F = 2 sqrt(n) t for G = I, L = t I."""
    real = fusekit.ops.optim.matrix_power
    calls, overshoot = [], set()

    def record(a, power, eps, *args, allow_tf32=False, **kwargs):
        if kwargs.get("method") == "newton":
            calls.append((a.shape[-1], a.shape[0], kwargs["max_iter"], allow_tf32))
        out = real(a, power, eps, *args, allow_tf32=allow_tf32, **kwargs)
        return out * 2 if kwargs.get("method") == "newton" and a.shape[-1] in overshoot else out

    monkeypatch.setattr(fusekit.ops.optim, "matrix_power", record)
    sides = {4: 1.0, 6: 1e-3, 8: 1e-7}  # side: epsilon; ratios ~1.6e1, ~9.8e3, ~1.1e8 at step 1
    ps = [torch.zeros(n, n, requires_grad=True) for n in sides]
    opt = Shampoo([dict(params=[p], epsilon=e) for p, e in zip(ps, sides.values())], lr=0.0,
                  root_method="newton", allow_tf32=True)
    expect_hints = {}
    for n, e in sides.items():
        r = (2 * n ** 0.5 + e * n ** 0.5) / e  # step 1: L = G G^T = I, scale 1 (beta2 = 1)
        expect_hints[n] = fo.newton_iterations_for(r)
    assert expect_hints[4] <= fo.TF32_FINISH_HINT < expect_hints[6] < expect_hints[8]
    damped = fo.TF32_DAMPED_ITERATIONS

    def step():
        for p in ps:
            p.grad = torch.eye(p.shape[0]) * 2 ** 0.5  # L = R = 2 I per step
        opt.step()

    step()
    assert sorted(calls) == [(4, 2, 12, True), (6, 2, 12, True), (8, 2, 12, True)]
    calls.clear()
    step()
    assert sorted(calls) == [(4, 2, min(12, expect_hints[4]), True), (6, 2, damped, True), (8, 2, damped, True)]
    assert sorted(opt.newton_log[-3:]) == [(4, 2, min(12, expect_hints[4]), "tf32"), (6, 2, damped, "tf32"),
                                           (8, 2, damped, "tf32")]
    assert opt.root_stats == {"computed": 12, "float64_retries": 0, "kept": 0, "strict_retries": 0}
    overshoot.add(6)  # rejected in TF32, and again in the strict retry: float64
    step()
    opt._settle()
    assert opt.root_stats == {"computed": 18, "float64_retries": 2, "kept": 0, "strict_retries": 2}
    for M, X in zip(opt.state[ps[1]]["L"], opt.state[ps[1]]["L_root"]):
        torch.testing.assert_close(X.double(), ref_root(M.double(), 1e-3), rtol=1e-5, atol=1e-5)
    overshoot.clear()
    overshoot.add(4)  # a rejected TF32 root still gets the strict retry first
    step()
    opt._settle()
    assert opt.root_stats == {"computed": 24, "float64_retries": 4, "kept": 0, "strict_retries": 4}


@pytest.mark.parametrize("device", DEVICES)
def test_fused_grafting_matches_the_foreach_path(device, monkeypatch):
    """Adam grafting of float32 parameters runs in torch's fused Adam kernel
    (Shampoo._grafted_fused, one call per group and step); the steps match the
    foreach path (FUSED_GRAFTING = False) to float32 rounding, with G_bar's bias
    correction left to the grafting's rescaling."""
    real = torch._fused_adam_
    runs = []
    for fused in (False, True):
        calls = []

        def counted(*a, **k):
            calls.append(1)
            return real(*a, **k)

        monkeypatch.setattr(torch, "_fused_adam_", counted)
        monkeypatch.setattr(fo, "FUSED_GRAFTING", fused)
        ps = make_params(torch.float32, device)
        opt = Shampoo(ps, **CASES["adam_blocked"])
        losses = train(opt, ps, 6, device, torch.float32)
        runs.append(([p.detach().clone() for p in ps], losses, len(calls)))
    (p0, l0, n0), (p1, l1, n1) = runs
    assert n0 == 0 and n1 == 6
    for a, b in zip(p0, p1):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert max(abs(x - y) / abs(x) for x, y in zip(l0, l1)) < 1e-4


def test_profile_marks_the_flags_wait_apart():
    """Shampoo.profile: a step that reads last step's fast-path flags marks the wait
    for them ("flags wait") before the statistics; the first step has none."""
    ps = make_params(torch.float32, "cpu")
    opt = Shampoo(ps, root_method="newton", **CASES["adam_blocked"])
    opt.profile = []
    train(opt, ps, 2, "cpu", torch.float32)
    names = [m[0] for m in opt.profile]
    phases = ["settle+stats", "roots", "grafting", "precondition+update"]
    assert names == ["start"] + phases + ["start", "flags wait"] + phases
    assert all(isinstance(m[2], float) for m in opt.profile)


def test_blocking_and_one_dimensional_params():
    """The 30x20 weight with max_preconditioner_dim=16 has blocks 16+14 by 16+4;
    biases get no statistics (grafted method); a 3-D tensor is viewed as 3 x 10."""
    assert block_ranges(30, 16) == [(0, 16), (16, 30)]
    assert block_ranges(16, 16) == [(0, 16)]
    ps = make_params(torch.float64, "cpu")
    opt = Shampoo(ps, lr=0.1, max_preconditioner_dim=16)
    train(opt, ps, 1, "cpu", torch.float64)
    st = opt.state[ps[0]]
    assert [tuple(x.shape) for x in st["L"]] == [(16, 16), (16, 16), (14, 14), (14, 14)]
    assert [tuple(x.shape) for x in st["R"]] == [(16, 16), (4, 4), (16, 16), (4, 4)]
    assert "L" not in opt.state[ps[1]] and "graft_sq" in opt.state[ps[1]]
    assert [tuple(x.shape) for x in opt.state[ps[4]]["L"]] == [(3, 3)]
    assert [tuple(x.shape) for x in opt.state[ps[4]]["R"]] == [(10, 10)]
    # the statistics are the sums of the blocks' G G^T (beta2 = 1)
    x, y = data("cpu", torch.float64, seed=1)
    q = [p.detach().clone().requires_grad_() for p in make_params(torch.float64, "cpu")]
    loss_fn(q, x, y).backward()
    g = q[0].grad
    torch.testing.assert_close(st["L"][1], g[:16, 16:] @ g[:16, 16:].T, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(st["R"][3], g[16:, 16:].T @ g[16:, 16:], rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------
# fusekit.nn.FusedMLP: the whole network is one op, its parameters nn.Linear's
# ---------------------------------------------------------------------------


GRAD_RTOL, PARAM_ATOL = 2e-5, 1e-5  # 10x and 60x the CPU's measured differences: room for CUDA's GEMMs


def _fused_mlp():
    fnn = pytest.importorskip("fusekit.nn")  # needs the compiled torch ops
    return fnn.FusedMLP


@pytest.mark.parametrize("device", DEVICES)
def test_trains_a_fused_mlp_as_its_sequential(device):
    """A FusedMLP's parameters are its nn.Linear children's weights and biases, under
    the equivalent nn.Sequential's names: Shampoo trains it as it trains that
    Sequential, step for step (blocked 24 x 24 weights, 1-D biases, Adam grafting,
    roots every 2 steps from step 2): the same losses, gradients and parameters up
    to float32 rounding (the op's products accumulate in another order than
    torch's; measured on the CPU over the 12 steps: losses 2e-7 apart relative,
    gradients 2e-6 of their largest entry, parameters 1.5e-7), and the loss falls
    (measured 11x). GELU, not ReLU: a rounding difference at ReLU's kink flips a
    unit, a discontinuity of training rather than a difference of the optimizers
    (docs/optim.md, "Distributed")."""
    fused_mlp = _fused_mlp()
    torch.manual_seed(0)
    fused = fused_mlp([10, 24, 24, 3], hidden_activation="gelu", device=device)
    seq = fused.to_sequential()
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in seq.named_parameters()]
    kw = dict(lr=0.02, betas=(0.9, 0.999), epsilon=1e-4, precondition_frequency=2, start_preconditioning_step=2,
              max_preconditioner_dim=16, grafting="adam", weight_decay=1e-3)
    opts = [Shampoo(m.parameters(), **kw) for m in (fused, seq)]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(64, 10, generator=gen, dtype=torch.float64)
    y = torch.sin(x @ torch.randn(10, 3, generator=gen, dtype=torch.float64) / 10 ** 0.5)
    x, y = x.float().to(device), y.float().to(device)
    losses = []
    for step in range(12):
        got = []
        for m, opt in zip((fused, seq), opts):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            got.append((loss.item(), [p.grad.clone() for p in m.parameters()]))
            opt.step()
        (lf, gf), (ls, gs) = got
        assert lf == pytest.approx(ls, rel=GRAD_RTOL), step
        for (name, p), q, a, b in zip(fused.named_parameters(), seq.parameters(), gf, gs):
            torch.testing.assert_close(a, b, rtol=GRAD_RTOL, atol=GRAD_RTOL * b.abs().max().item(),
                                       msg=lambda e: f"step {step}, {name}.grad: {e}")
            torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=PARAM_ATOL,
                                       msg=lambda e: f"step {step}, {name}: {e}")
        losses.append(lf)
    assert losses[-1] < 0.2 * losses[0], losses
    assert opts[0].root_stats["computed"] == opts[1].root_stats["computed"] > 0
    assert [tuple(x.shape) for x in opts[0].state[fused.layers[1].weight]["L"]] == [(16, 16), (16, 16), (8, 8), (8, 8)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("root_method", ["auto", "newton"])
def test_state_dict_round_trip_continues_bit_identically(device, root_method):
    """Also on the fast path (the CUDA default): state_dict() settles the last flags
    and the Newton iteration hints travel in the state."""
    kw = dict(CASES["sgd_ema_start_freq_wd"], grafting="adam", betas=(0.9, 0.95), root_method=root_method)
    ps = make_params(torch.float32, device)
    opt = Shampoo(ps, **kw)
    train(opt, ps, 4, device, torch.float32)
    buf = io.BytesIO()
    torch.save({"params": [p.detach() for p in ps], "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    ps2 = [p.clone().requires_grad_() for p in saved["params"]]
    opt2 = Shampoo(ps2, **kw)
    opt2.load_state_dict(saved["opt"])
    st2 = opt2.state[ps2[0]]
    assert int(st2["step"]) == 4 and isinstance(st2["L_root"][0], torch.Tensor)
    assert st2["L_root"][0].device.type == device
    train(opt, ps, 5, device, torch.float32, seed=10)  # steps 5..9: roots at 5, 6, 8
    train(opt2, ps2, 5, device, torch.float32, seed=10)
    for a, b in zip(ps, ps2):
        assert torch.equal(a.detach(), b.detach())


# ---------------------------------------------------------------------------
# Distributed roots: threads as ranks, a comm with the all_gather Shampoo uses
# ---------------------------------------------------------------------------


class ThreadComm:
    """Ranks of one process (threads): all_gather through shared slots."""

    def __init__(self, rank, shared):
        self.rank, self.size, self.shared = rank, shared["size"], shared
        self.calls = 0

    def all_gather(self, send, recv):
        sh = self.shared
        sh["slots"][self.rank] = send.clone()
        sh["barrier"].wait()
        torch.cat(sh["slots"], out=recv)
        sh["barrier"].wait()
        self.calls += 1


def test_assign_roots_balances_cost():
    costs = [8.0, 1.0, 1.0, 8.0, 27.0, 1.0]
    owner = assign_roots(costs, 2)
    loads = [sum(c for c, o in zip(costs, owner) if o == r) for r in range(2)]
    assert owner[4] == 0 and max(loads) == 27.0 and sorted(loads) == [19.0, 27.0]
    assert assign_roots(costs, 1) == [0] * 6
    assert assign_roots([], 3) == []
    assert sorted(set(assign_roots([1.0] * 7, 3))) == [0, 1, 2]


def run_ranks(world, kw, steps):
    """``steps`` of ``train`` with ``Shampoo(distributed=ThreadComm)`` on ``world``
    threads; [(params, optimizer, comm)] per rank."""
    shared = {"size": world, "slots": [None] * world, "barrier": threading.Barrier(world)}
    results, errors = [None] * world, []

    def rank_main(r):
        try:
            q = make_params(torch.float32, "cpu")
            comm = ThreadComm(r, shared)
            opt = Shampoo(q, distributed=comm, **kw)
            train(opt, q, steps, "cpu", torch.float32)
            results[r] = (q, opt, comm)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            shared["barrier"].abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


def test_root_batches_are_canonical(monkeypatch):
    """Jobs grouped by key in first-appearance order, each group cut in order into
    runs of at most ROOT_BATCH_COST // side**3 (at least one), whatever the ranks."""
    monkeypatch.setattr(fo, "ROOT_BATCH_COST", 2 * 10 ** 3)
    keys = ["a", "b", "a", "a", "c", "a", "b", "a"]
    sides = [10, 4, 10, 10, 30, 10, 4, 10]
    assert root_batches(keys, sides) == [[0, 2], [3, 5], [7], [1, 6], [4]]
    monkeypatch.setattr(fo, "ROOT_BATCH_COST", 1)
    assert root_batches(keys, sides) == [[0], [2], [3], [5], [7], [1], [6], [4]]
    assert root_batches([], []) == []
    assert root_batches(keys, sides, 4 * 10 ** 3) == [[0, 2, 3, 5], [7], [1, 6], [4]]  # the TF32 cap's form


@pytest.mark.parametrize("batch_cost", [None, 2 * 16 ** 3])
@pytest.mark.parametrize("root_method", ["auto", "newton"])
@pytest.mark.parametrize("world", [2, 3])
def test_distributed_split_matches_one_process(world, root_method, batch_cost, monkeypatch):
    """Each rank computes whole canonical batches of the roots (the counters add up
    to the single-process count; on the fast path every rank's batches, as
    newton_log records them, are batches of the single process) and after the
    all-gather every rank's parameters equal the single-process run's bit for bit.
    ``batch_cost`` 2 * 16**3 cuts the side-16 and side-14 groups into pairs."""
    if batch_cost is not None:
        monkeypatch.setattr(fo, "ROOT_BATCH_COST", batch_cost)
    kw = dict(CASES["adam_blocked"], precondition_frequency=2, root_method=root_method)
    ps = make_params(torch.float32, "cpu")
    single = Shampoo(ps, **kw)
    train(single, ps, 5, "cpu", torch.float32)
    results = run_ranks(world, kw, 5)
    counts = [res[1].root_stats["computed"] for res in results]
    assert sum(counts) == single.root_stats["computed"] and all(c > 0 for c in counts)
    assert all(res[2].calls == 3 for res in results)  # root steps 1, 2, 4
    for q, _, _ in results:
        for a, b in zip(ps, q):
            assert torch.equal(a.detach(), b.detach())
    if root_method == "newton":
        def batches(opt):
            return sorted(opt.newton_log)

        union = sorted(b for res in results for b in batches(res[1]))
        assert union == batches(single) and len(union) < 64  # newton_log keeps 64
        if batch_cost is not None:
            assert max(b[1] for b in union if b[0] in (14, 16)) == 2


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_fast_path_rejections_settle_as_one_process(world, monkeypatch):
    """Issue 25: fast-path roots rejected by the acceptance check (an injected
    overshoot for the side-16 blocks, whose roots the ranks share) keep the previous
    root for one step and are redone in float64 at the next step, distributed as on
    one process (the owners' flags travel with the roots; every rank redoes every
    rejected root); a failed Newton call (side 10) is computed exactly at once on
    both, its iteration hint unchanged. Parameters, roots and hints equal the
    single-process run's bit for bit, before and after the last settle."""
    kw = dict(CASES["adam_blocked"], precondition_frequency=2, root_method="newton")
    real = fusekit.ops.optim.matrix_power

    def faulty(a, *args, **kwargs):
        if a.dtype == torch.float32 and kwargs.get("method") == "newton":
            if a.shape[-1] == 10:
                raise fusekit.NotConvergedError("matrix_power: injected failure")
            if a.shape[-1] == 16:
                return real(a, *args, **kwargs) * 2
        return real(a, *args, **kwargs)

    monkeypatch.setattr(fusekit.ops.optim, "matrix_power", faulty)
    ps = make_params(torch.float32, "cpu")
    single = Shampoo(ps, **kw)
    train(single, ps, 4, "cpu", torch.float32)  # roots at steps 1, 2, 4: the last unsettled
    results = run_ranks(world, kw, 4)
    def side16(opt):
        return sum(1 for _, _, jobs in opt._pending for j in jobs if j[0].shape[0] == 16)

    # every rank holds the flags of all side-16 roots, its own and the others'
    assert [side16(res[1]) for res in results] == [side16(single)] * world and side16(single) >= world
    assert single.root_stats["float64_retries"] > 0
    for q, opt, _ in results:
        for a, b in zip(ps, q):
            assert torch.equal(a.detach(), b.detach())
    single._settle()
    for q, opt, _ in results:
        opt._settle()
        # each rank retries every rejected root itself (plus the side-10 roots it owns)
        assert opt.root_stats["float64_retries"] >= 9
        for a, b in zip(ps, q):
            sa, sb = single.state[a], opt.state[b]
            assert sa.keys() == sb.keys()
            for key in ("L_root", "R_root"):
                for x, y in zip(sa.get(key, []), sb.get(key, [])):
                    assert torch.equal(x, y)
            assert sa.get("newton_hints") == sb.get("newton_hints")


def test_distributed_needs_one_dtype_and_device():
    class OneOfTwo:
        rank, size = 0, 2

        def all_gather(self, send, recv):
            raise AssertionError("not reached")

    ps = make_params(torch.float32, "cpu")
    q = torch.zeros(4, 4, dtype=torch.float64, requires_grad=True)
    opt = Shampoo(ps + [q], distributed=OneOfTwo())
    x, y = data("cpu", torch.float32)
    loss_fn(ps, x, y).backward()
    q.grad = torch.ones_like(q)
    with pytest.raises(fusekit.InvalidArgumentError, match="params must share one dtype and device when the roots"):
        opt.step()


# ---------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------

BAD = [
    (dict(lr=-1.0), "lr"),
    (dict(lr=float("nan")), "lr"),
    (dict(betas=(1.0, 0.9)), r"betas\[0\]"),
    (dict(betas=(0.9, 0.0)), r"betas\[1\]"),
    (dict(betas=0.9), "betas"),
    (dict(epsilon=-1e-3), "epsilon"),
    (dict(precondition_frequency=0), "precondition_frequency"),
    (dict(precondition_frequency=1.5), "precondition_frequency"),
    (dict(start_preconditioning_step=0), "start_preconditioning_step"),
    (dict(max_preconditioner_dim=0), "max_preconditioner_dim"),
    (dict(grafting="adagrad"), "grafting"),
    (dict(grafting_beta2=1.5), "grafting_beta2"),
    (dict(grafting_epsilon=0.0), "grafting_epsilon"),
    (dict(weight_decay=-0.1), "weight_decay"),
    (dict(max_condition_f32=-1.0), "max_condition_f32"),
    (dict(distributed="nccl"), "distributed"),
    (dict(root_method="eigh"), "root_method"),
    (dict(newton_iterations=0), "newton_iterations"),
]


@pytest.mark.parametrize("kw,msg", [
    (dict(root_method="eigh"), "root_method = 'eigh'; choose 'auto', 'newton' or 'checked'"),
    (dict(newton_iterations=0), "newton_iterations must be None or an int in [1, 100], got 0"),
    (dict(newton_iterations=101), "newton_iterations must be None or an int in [1, 100], got 101"),
    (dict(newton_iterations=True), "newton_iterations must be None or an int in [1, 100], got True"),
    (dict(newton_iterations=12.0), "newton_iterations must be None or an int in [1, 100], got 12.0"),
])
def test_root_policy_arguments(kw, msg):
    with pytest.raises(fusekit.InvalidArgumentError) as e:
        Shampoo(make_params(torch.float32, "cpu"), **kw)
    assert str(e.value) == f"fusekit.optim.Shampoo: {msg} [FK_ERROR_INVALID_ARGUMENT]"


@pytest.mark.parametrize("kw,name", BAD, ids=[b[1].replace("\\", "") + str(i) for i, b in enumerate(BAD)])
def test_bad_arguments_name_the_argument(kw, name):
    ps = make_params(torch.float32, "cpu")
    with pytest.raises(fusekit.InvalidArgumentError, match=f"fusekit.optim.Shampoo: {name} "):
        Shampoo(ps, **kw)


def test_bad_params_and_groups():
    with pytest.raises(fusekit.InvalidArgumentError, match="params must be float32 or float64, got a torch.float16"):
        Shampoo([torch.zeros(3, 3, dtype=torch.float16, requires_grad=True)])
    opt = Shampoo(make_params(torch.float32, "cpu"))
    with pytest.raises(fusekit.InvalidArgumentError, match="Shampoo: lr = -2.0 must be >= 0"):
        opt.add_param_group({"params": [torch.zeros(2, 2, requires_grad=True)], "lr": -2.0})
    with pytest.raises(fusekit.InvalidArgumentError, match="distributed needs torch.distributed initialised"):
        fo.init_distributed()


def test_optim_module_imports_without_torch():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; import fusekit.optim as o; "
            "print(o.block_ranges(5, 2), o.assign_roots([1.0, 2.0], 2))")
    env = dict(__import__("os").environ, PYTHONPATH=str(fo.__file__).rsplit("/fusekit/", 1)[0])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(0, 2), (2, 4), (4, 5)] [1, 0]"


def test_deepcopy_of_optimizer_state_is_independent():
    ps = make_params(torch.float64, "cpu")
    opt = Shampoo(ps, lr=0.1, max_preconditioner_dim=16)
    train(opt, ps, 2, "cpu", torch.float64)
    sd = copy.deepcopy(opt.state_dict())
    train(opt, ps, 1, "cpu", torch.float64)
    assert int(sd["state"][0]["step"]) == 2 and int(opt.state[ps[0]]["step"]) == 3


def _uid_worker(rank, world, init_file, out_dir):
    import os

    import torch.distributed as dist

    import fusekit.optim as fo

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    made = []

    def make():
        made.append(1)
        return os.urandom(fusekit.COMM_ID_BYTES)

    a = fo._share_from_rank0(make)
    b = fo._share_from_rank0(make)
    with open(os.path.join(out_dir, f"{rank}.bin"), "wb") as f:
        f.write(bytes([len(made)]) + a + b)
    dist.destroy_process_group()


def test_unique_id_exchange_through_the_store(tmp_path):
    """The NCCL unique id's path (init_distributed): rank 0 makes the bytes, every
    process of a real two-process gloo group reads the same bytes from the store;
    a second call uses a new key."""
    import torch.multiprocessing as mp

    mp.spawn(_uid_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (tmp_path / "0.bin").read_bytes(), (tmp_path / "1.bin").read_bytes()
    n = fusekit.COMM_ID_BYTES
    assert r0[0] == 2 and r1[0] == 0  # only rank 0 made ids
    assert len(r0) == 1 + 2 * n and r0[1:] == r1[1:]
    assert r0[1:1 + n] != r0[1 + n:]
