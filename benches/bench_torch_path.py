#!/usr/bin/env python3
"""PyTorch at native speed: fusekit's torch path (the custom ops `torch.ops.fusekit.*`
and the package functions on torch tensors) against PyTorch, side by side in one run.

a) Host time per call (us) of one op of each family on small CUDA tensors, against
   `torch.add(a, b)`: the median host time (perf_counter) of 300 calls, the minimum
   over 3 such medians; the GPU is synchronised every 50 calls so its queue never
   fills (the style of benches/host_overhead.py).
b) Training steps (forward, MSE loss, backward: the step the issue measured; with
   `--optimizer sgd` also torch.optim.SGD(momentum=0.9), the same optimizer for
   every variant) of three models: an MLP of fused linear layers,
   a Gaussian-field fit and a geodesic leapfrog layer. Variants: fusekit eager,
   PyTorch eager, torch.compile (default mode, fullgraph) of the PyTorch model and of
   the fusekit model, the whole step (forward, backward, optimizer) captured with
   torch.cuda.graph and replayed (fusekit and PyTorch), and
   torch.compile(mode="reduce-overhead") of both models where it works. Each variant
   is warmed up first (torch.compile's compilation and the graph capture happen in
   the warm-up, never in a timing); then N steps (about 0.15 s of work) run between
   two CUDA events ("gpu": GPU time per step) and two perf_counter reads with a
   synchronisation at the end ("wall": per step, host included); the median over 7
   such runs. "gpu-only": the sum of the kernel times of one eager step (torch
   profiler, CUPTI), the time the GPU would need if the host never made it wait;
   "replay / gpu-only" says how close a graph replay comes to it.
   Correctness guard: before any timing, each case compares the fusekit model's
   output, loss and gradients with the PyTorch formula in float64 on the same
   inputs, and every variant's loss (after its warm-up) with the float64 loss of
   its current parameters; a relative error above the tolerance (float32 1e-2,
   bfloat16 1e-1) stops the benchmark, so it never times a wrong result.
c) A compact table last: ms per step per variant, host us per call, and each goal.

Inputs are random (never zeros). Without CUDA (or with --smoke) a tiny version runs
on the CPU in well under a minute so CI can execute the script: no CUDA graphs, no
reduce-overhead, torch.compile with backend "aot_eager" (traces the fake
implementations and the autograd formulas without compiling kernels), and timings
that mean nothing.

    python3 benches/bench_torch_path.py [--json PATH] [--smoke] [--cases REGEX]
        [--no-compile] [--no-profile] [--budget-s 420]

--budget-s: after this many seconds the remaining torch.compile variants are skipped
(printed with the reason), so the whole run stays within a 10-minute window.
The library: $FUSEKIT_LIBRARY, else target/release/libfusekit.so.
"""
import argparse
import datetime
import gc
import json
import math
import os
import pathlib
import re
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("FUSEKIT_LIBRARY", str(ROOT / "target" / "release" / "libfusekit.so"))
sys.path.append(str(ROOT / "bindings" / "python"))  # last: an installed package or PYTHONPATH wins

import fusekit  # noqa: E402
import fusekit.torch  # noqa: E402
from bench_info import git_commit  # noqa: E402
from fusekit.torch.elementwise import axpby as fk_axpby  # noqa: E402
from fusekit.torch.gaussian import gaussian_field  # noqa: E402
from fusekit.torch.geodesic import christoffel, leapfrog  # noqa: E402
from fusekit.torch.linalg import linear as fk_linear  # noqa: E402

fusekit.torch.load()  # registers torch.ops.fusekit.*

sys.path.insert(0, str(ROOT / "benches"))
from bench_gaussian import field_torch  # noqa: E402  (the eager formulas the other benches use)
from bench_geodesic import chr_ref, lf_ref  # noqa: E402
from host_overhead import host_us as _host_us  # noqa: E402

EPS = 1e-6  # the Gaussian field's eps (the wrapper's default)
TOL = {torch.float32: 1e-2, torch.bfloat16: 1e-1}
DNAME = {torch.float32: "f32", torch.bfloat16: "bf16"}
PREFIX = "torch_path"  # the final table's lines start with this (scripts/gpu_suite.sh greps it)

CUDA = False
DEV = "cpu"
ROWS = []  # everything measured, for --json


def log(*a):
    print(*a, flush=True)


def sync():
    if CUDA:
        torch.cuda.synchronize()


def rel_err(out, ref):
    out, ref = out.detach().double().flatten(), ref.detach().double().flatten()
    if not torch.isfinite(out).all():
        return float("inf")
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(out - ref).item()
    return num / den if den else num


# ---------------------------------------------------------------- timing
def host_us(fn, n=300, medians=3):
    """Min over `medians` of benches/host_overhead.py's median host time of one call."""
    return min(_host_us(fn, sync, n) for _ in range(medians))


def time_steps(step, n, repeats):
    """(gpu ms, wall ms) per step: N steps between CUDA events / perf_counter reads
    (synchronised before and after), median over `repeats`. Without CUDA, gpu is None."""
    gpu, wall = [], []
    for _ in range(repeats):
        sync()
        if CUDA:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            e0.record()
            for _ in range(n):
                step()
            e1.record()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            gpu.append(e0.elapsed_time(e1) / n)
        else:
            t0 = time.perf_counter()
            for _ in range(n):
                step()
            t1 = time.perf_counter()
        wall.append((t1 - t0) * 1e3 / n)
    return (statistics.median(gpu) if gpu else None), statistics.median(wall)


def gpu_only_ms(step, k=5):
    """Sum of the kernel (and memcpy/memset) times of one step, from torch.profiler
    (CUPTI), averaged over k steps."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(k):
            step()
        torch.cuda.synchronize()
    total_us = 0.0
    nk = 0
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            total_us += e.time_range.elapsed_us()
            nk += 1
    if nk == 0:
        raise RuntimeError("the profiler recorded no GPU activity")
    return total_us / k / 1e3


# ---------------------------------------------------------------- models (cases)
class LossModule(nn.Module):
    """Holds a case's parameters; forward(*inputs) -> scalar loss."""

    def __init__(self, init, fwd, loss_fn):
        super().__init__()
        self.params = nn.ParameterList([nn.Parameter(t.detach().clone()) for t in init])
        self.fwd = fwd
        self.loss_fn = loss_fn

    def forward(self, *inputs):
        return self.loss_fn(self.fwd(list(self.params), inputs), inputs)


def mse(a, b):
    return (a.float() - b.float()).square().mean()


class Case:
    def __init__(self, name, dtype, init, inputs, fk_fwd, ref_fwd, loss_fn, lr, goal=None):
        self.name, self.dtype, self.init, self.inputs = name, dtype, init, inputs
        self.fk_fwd, self.ref_fwd, self.loss_fn, self.lr, self.goal = fk_fwd, ref_fwd, loss_fn, lr, goal
        self.tol = TOL[dtype]

    def module(self, which):
        return LossModule(self.init, self.fk_fwd if which == "fusekit" else self.ref_fwd, self.loss_fn)

    def inputs64(self):
        return tuple(t.double() if t.is_floating_point() else t for t in self.inputs)

    def ref_loss64(self, params):
        """The loss of the PyTorch formula in float64 at `params` (their current values)."""
        with torch.no_grad():
            p64 = [p.detach().double() for p in params]
            inp = self.inputs64()
            return self.loss_fn(self.ref_fwd(p64, inp), inp)


def _flat(out):
    if isinstance(out, (tuple, list)):
        return torch.cat([o.reshape(-1).double() for o in out])
    return out.reshape(-1).double()


# MLP of fused linear layers
def mlp_fk(params, inputs):
    h = inputs[0]
    n = len(params) // 2
    for i in range(n):
        h = fk_linear(h, params[2 * i], params[2 * i + 1], "relu" if i < n - 1 else "none")
    return h


def mlp_ref(params, inputs):
    h = inputs[0]
    n = len(params) // 2
    for i in range(n):
        h = F.linear(h, params[2 * i], params[2 * i + 1])
        if i < n - 1:
            h = torch.relu(h)
    return h


def mlp_loss(out, inputs):
    return mse(out, inputs[1])


def mlp_case(hidden, layers, batch, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    rn = lambda *s, scale=1.0: (torch.randn(*s, generator=g, device=DEV) * scale).to(dtype)  # noqa: E731
    init = []
    for _ in range(layers):
        init += [rn(hidden, hidden, scale=math.sqrt(2.0 / hidden)), rn(hidden, scale=0.1)]
    inputs = (rn(batch, hidden), rn(batch, hidden, scale=0.5))
    name = f"mlp h{hidden} L{layers} b{batch} {DNAME[dtype]}"
    return Case(name, dtype, init, inputs, mlp_fk, mlp_ref, mlp_loss, lr=1e-3, goal="mlp")


# Gaussian field fit: the eager reference is benches/bench_gaussian.py's field_torch
def field_ref_formula(p, m, c, w, eps=EPS):
    return field_torch(p, m, c, w, eps)


def gauss_fk(params, inputs):
    means, chol, weights = params
    return gaussian_field(inputs[0], means, chol, weights, EPS)


def gauss_ref(params, inputs):
    means, chol, weights = params
    return field_ref_formula(inputs[0], means, chol, weights, EPS)


def gauss_loss(out, inputs):
    return mse(out, inputs[1])


def gauss_case(N, B, seed=0):
    """Inputs as benches/bench_gaussian.py's problem(): small Gaussians in the unit cube,
    lower-triangular chol with a positive diagonal (its upper part is ignored)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    u = lambda *s, lo=-1.0, hi=1.0: torch.rand(*s, generator=g, device=DEV, dtype=torch.float64) * (hi - lo) + lo  # noqa
    points = u(B, 3)
    means = u(N, 3)
    chol = u(N, 3, 3, lo=-0.05, hi=0.05)
    idx = torch.arange(3, device=DEV)
    chol[:, idx, idx] = u(N, 3, lo=0.05, hi=0.15)
    weights = u(N, lo=-0.5, hi=1.0)
    target = u(B, lo=0.0, hi=1.0)
    f = lambda t: t.float().contiguous()  # noqa: E731
    return Case(f"gaussian N{N} B{B} f32", torch.float32, [f(means), f(chol), f(weights)],
                (f(points), f(target)), gauss_fk, gauss_ref, gauss_loss, lr=1e-4,
                goal="gauss" if (N, B) == (1000, 500) else None)


# Geodesic leapfrog layer: the eager references are benches/bench_geodesic.py's chr_ref / lf_ref
GEO_DT, GEO_C = 0.1, 5.0


def make_geo_fns(T):
    def geo_fk(params, inputs):
        U, W = params
        x0, v0, f, mu = inputs[:4]
        return leapfrog(x0, v0, U, W, GEO_DT, T, f=f, mu=mu, c=GEO_C)

    def geo_ref(params, inputs):
        U, W = params
        x0, v0, f, mu = inputs[:4]
        return lf_ref(x0, v0, f, U, W, mu, GEO_DT, T, GEO_C)

    return geo_fk, geo_ref


def geo_loss(out, inputs):
    x, v = out
    return mse(x, inputs[4]) + mse(v, inputs[5])


def geo_case(B, D, R, T, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g, device=DEV, dtype=torch.float64) * scale).float()  # noqa
    U, W = r(D, R, scale=1.0 / math.sqrt(D)), r(D, R, scale=2.0 / R)
    mu = (torch.rand(D, generator=g, device=DEV, dtype=torch.float64) * 0.5).float()
    inputs = (r(B, D), r(B, D), r(B, D, scale=0.5), mu, r(B, D), r(B, D))
    fk, ref = make_geo_fns(T)
    return Case(f"leapfrog B{B} D{D} R{R} T{T} f32", torch.float32, [U, W], inputs, fk, ref, geo_loss, lr=1e-4)


# ---------------------------------------------------------------- correctness guard
def check_case(case):
    """fusekit (and PyTorch in the case's dtype) against the float64 formula: output,
    loss and every gradient. Raises if fusekit is off by more than the tolerance."""
    inp64 = case.inputs64()
    p64 = [p.detach().double().requires_grad_(True) for p in case.init]
    out64 = case.ref_fwd(p64, inp64)
    loss64 = case.loss_fn(out64, inp64)
    g64 = torch.autograd.grad(loss64, p64)
    res = {}
    for which, fwd in (("fusekit", case.fk_fwd), ("torch", case.ref_fwd)):
        ps = [p.detach().clone().requires_grad_(True) for p in case.init]
        out = fwd(ps, case.inputs)
        loss = case.loss_fn(out, case.inputs)
        gs = torch.autograd.grad(loss, ps)
        res[which] = dict(out=rel_err(_flat(out), _flat(out64)), loss=rel_err(loss, loss64),
                          grad=max(rel_err(a, b) for a, b in zip(gs, g64)))
    log(f"  check vs float64: fusekit out {res['fusekit']['out']:.2e} loss {res['fusekit']['loss']:.2e} "
        f"grads {res['fusekit']['grad']:.2e} | torch {DNAME[case.dtype]} out {res['torch']['out']:.2e} "
        f"loss {res['torch']['loss']:.2e} grads {res['torch']['grad']:.2e} (tol {case.tol:g})")
    ROWS.append(dict(section="check", case=case.name, **{f"{w}_{k}": v for w in res for k, v in res[w].items()}))
    bad = {k: v for k, v in res["fusekit"].items() if not v <= case.tol}
    if bad:
        raise AssertionError(f"{case.name}: fusekit differs from the float64 formula: {bad} > {case.tol}")


def check_variant(case, name, step, module):
    """One step of a warmed-up variant: its loss (computed from the parameters before
    the update) against the float64 loss of those parameters."""
    ref = case.ref_loss64(module.params)
    loss = step()
    sync()
    err = rel_err(loss, ref)
    if not err <= case.tol:
        raise AssertionError(f"{case.name} / {name}: loss {loss.item():.6g} vs float64 {ref.item():.6g}: "
                             f"rel err {err:.2e} > {case.tol}")
    return err


# ---------------------------------------------------------------- variants
OPTIMIZER = "none"  # --optimizer


class _NoOptimizer:
    """The step without an optimizer: gradients set to None before each step."""

    def __init__(self, params):
        self.params = list(params)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        pass


def make_opt(module, case):
    if OPTIMIZER == "sgd":
        return torch.optim.SGD(module.parameters(), lr=case.lr, momentum=0.9)
    return _NoOptimizer(module.parameters())


def eager_step(module, opt, inputs, mark=False):
    def step():
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = module(*inputs)
        loss.backward()
        opt.step()
        return loss
    return step


def build_eager(case, which):
    m = case.module(which)
    return eager_step(m, make_opt(m, case), case.inputs), m


def build_compile(case, which, mode=None):
    torch._dynamo.reset()  # one LossModule.forward code object serves every case: start clean
    m = case.module(which)
    opt = make_opt(m, case)
    kw = dict(fullgraph=True)
    if mode is not None:
        kw["mode"] = mode
    if not CUDA:
        kw["backend"] = "aot_eager"
    cm = torch.compile(m, **kw)
    return eager_step(cm, opt, case.inputs, mark=mode == "reduce-overhead"), m


def build_graph(case, which):
    """The whole step captured with torch.cuda.graph (the PyTorch docs' whole-network
    capture: warm-up on a side stream, grads set to None, capture, replay)."""
    m = case.module(which)
    opt = make_opt(m, case)
    inputs = case.inputs
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = m(*inputs)
            loss.backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = m(*inputs)
        static_loss.backward()
        opt.step()

    def step():
        g.replay()
        return static_loss
    step.graph = g  # keep it alive with the step
    return step, m


VARIANTS = [  # (key, label, builder, needs CUDA, is a compile)
    ("fk_eager", "fusekit eager", lambda c: build_eager(c, "fusekit"), False, False),
    ("torch_eager", "torch eager", lambda c: build_eager(c, "torch"), False, False),
    ("torch_compile", "torch compile", lambda c: build_compile(c, "torch"), False, True),
    ("fk_compile", "fusekit compile", lambda c: build_compile(c, "fusekit"), False, True),
    ("fk_graph", "fusekit graph", lambda c: build_graph(c, "fusekit"), True, False),
    ("torch_graph", "torch graph", lambda c: build_graph(c, "torch"), True, False),
    ("torch_ro", "torch compile-ro", lambda c: build_compile(c, "torch", "reduce-overhead"), True, True),
    ("fk_ro", "fusekit compile-ro", lambda c: build_compile(c, "fusekit", "reduce-overhead"), True, True),
]


def run_case(case, args, t_start):
    log(f"\n== {case.name}")
    check_case(case)
    res = {}
    for key, label, build, needs_cuda, is_compile in VARIANTS:
        if needs_cuda and not CUDA:
            log(f"  {label:<20} skipped: needs CUDA")
            continue
        if is_compile and args.no_compile:
            log(f"  {label:<20} skipped: --no-compile")
            continue
        if is_compile and time.time() - t_start > args.budget_s:
            log(f"  {label:<20} skipped: past --budget-s {args.budget_s:g} s")
            continue
        try:
            t0 = time.time()
            step, module = build(case)
            for _ in range(3 if args.smoke else 10):  # warm-up: compilation happens here
                step()
            sync()
            t_warm = time.time() - t0
            err = check_variant(case, label, step, module)
            if args.smoke:
                n, reps = 2, 2
            else:
                t1 = time.perf_counter()
                for _ in range(3):
                    step()
                sync()
                per = max((time.perf_counter() - t1) / 3, 1e-6)
                n, reps = max(5, min(200, int(0.15 / per))), 7
            gpu, wall = time_steps(step, n, reps)
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001  (a variant that does not work here: say why)
            reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
            log(f"  {label:<20} FAILED, not timed: {reason}")
            if os.environ.get("FK_BENCH_TRACE"):
                traceback.print_exc()
            ROWS.append(dict(section="step", case=case.name, variant=key, error=reason))
            res[key] = dict(error=reason)
            continue
        finally:
            step = module = None
            gc.collect()
            if CUDA:
                torch.cuda.empty_cache()
        gpu_s = f"{gpu:8.3f}" if gpu is not None else "     n/a"
        log(f"  {label:<20} gpu {gpu_s} ms/step  wall {wall:8.3f} ms/step  (N={n} x {reps}; "
            f"warm-up {t_warm:.1f} s; loss rel err {err:.1e})")
        res[key] = dict(gpu_ms=gpu, wall_ms=wall, n=n, repeats=reps, warmup_s=t_warm, loss_rel_err=err)
        ROWS.append(dict(section="step", case=case.name, variant=key, **res[key]))
    return res


def profile_case(case, res):
    """GPU-only time of the eager steps; the graph replays' ratio to it."""
    for which, key, gkey in (("fusekit", "fk_eager", "fk_graph"), ("torch", "torch_eager", "torch_graph")):
        try:
            step, _ = build_eager(case, which)
            for _ in range(3):
                step()
            ms = gpu_only_ms(step)
        except Exception as e:  # noqa: BLE001
            log(f"  {case.name}: {which} gpu-only time unavailable: {type(e).__name__}: {e}")
            continue
        finally:
            step = None
            gc.collect()
        res.setdefault(key, {})["gpu_only_ms"] = ms
        rep = res.get(gkey, {}).get("gpu_ms")
        ratio = rep / ms if rep else None
        res.setdefault(gkey, {})["replay_over_gpu_only"] = ratio
        ROWS.append(dict(section="gpu_only", case=case.name, variant=key, gpu_only_ms=ms,
                         graph_replay_ms=rep, replay_over_gpu_only=ratio))
        log(f"  {case.name}: {which} eager gpu-only {ms:.3f} ms/step; graph replay "
            + (f"{rep:.3f} ms = {ratio:.2f}x gpu-only" if rep else "n/a"))


# ---------------------------------------------------------------- host time rows
def host_rows(args):
    n, med = (20, 1) if args.smoke else (300, 3)
    H = lambda fn: host_us(fn, n=n, medians=med)  # noqa: E731
    r = lambda *s, scale=1.0: torch.randn(*s, device=DEV) * scale  # noqa: E731
    a, b = r(1024), r(1024)
    x, w, bias = r(64, 256), r(256, 256, scale=1 / 16), r(256, scale=0.1)
    wg, bg = w.clone().requires_grad_(True), bias.clone().requires_grad_(True)
    gp = gauss_case(64, 128)
    pts, (means, chol, weights) = gp.inputs[0], gp.init
    B, D, R = 64, 256, 16
    v, U, W = r(B, D), r(D, R, scale=1 / 16), r(D, R, scale=2.0 / R)
    x0, f, mu = r(B, D), r(B, D, scale=0.5), torch.rand(D, device=DEV) * 0.5
    gm = r(64, 64)
    Ls, Rs = gm @ gm.T / 64 + torch.eye(64, device=DEV), gm.T @ gm / 64 + torch.eye(64, device=DEV)
    A = Ls.clone()

    def fk_fb():
        fk_linear(x, wg, bg, "relu").sum().backward()

    def torch_fb():
        torch.relu(F.linear(x, wg, bg)).sum().backward()

    cases = [  # (key, label, fn, baseline key)
        ("torch.add", "torch.add(a, b), 1024 f32 (baseline)", lambda: torch.add(a, b), None),
        ("fusekit.add", "fusekit.add(a, b), 1024 f32", lambda: fusekit.add(a, b), "torch.add"),
        ("fusekit.axpby", "fusekit.torch_ops.axpby(2, a, -1, b) (differentiable)",
         lambda: fk_axpby(2.0, a, -1.0, b), "torch.add"),
        ("op.axpby", "torch.ops.fusekit.axpby(a, b, 2, -1) (registered autograd)",
         lambda: torch.ops.fusekit.axpby(a, b, 2.0, -1.0), "torch.add"),
        ("torch.linear", "torch.relu(F.linear(x, w, b)) [64,256]x[256,256]", lambda: torch.relu(F.linear(x, w, bias)),
         None),
        ("fusekit.linear", "fusekit.torch_ops.linear(x, w, b, relu)", lambda: fk_linear(x, w, bias, "relu"),
         "torch.linear"),
        ("torch.linear_fb", "torch relu(F.linear) fwd+bwd (.sum().backward())", torch_fb, None),
        ("fusekit.linear_fb", "fusekit linear fwd+bwd (.sum().backward())", fk_fb, "torch.linear_fb"),
        ("torch.gaussian", "PyTorch eager Gaussian field N=64 B=128",
         lambda: field_ref_formula(pts, means, chol, weights), None),
        ("fusekit.gaussian", "torch_gaussian.gaussian_field N=64 B=128",
         lambda: gaussian_field(pts, means, chol, weights), "torch.gaussian"),
        ("torch.christoffel", f"PyTorch eager Christoffel [{B},{D}] R={R}", lambda: chr_ref(v, U, W, 5.0), None),
        ("fusekit.christoffel", "torch_geodesic.christoffel", lambda: christoffel(v, U, W, 5.0), "torch.christoffel"),
        ("torch.leapfrog", f"PyTorch eager leapfrog [{B},{D}] R={R} T=4",
         lambda: lf_ref(x0, v, f, U, W, mu, GEO_DT, 4, GEO_C), None),
        ("fusekit.leapfrog", "torch_geodesic.leapfrog T=4",
         lambda: leapfrog(x0, v, U, W, GEO_DT, 4, f=f, mu=mu, c=GEO_C), "torch.leapfrog"),
        ("torch.shampoo_stats", "torch L,R += g g^T, g^T g (2 addmm_) [64,64]",
         lambda: (Ls.addmm_(gm, gm.T, beta=0.9, alpha=0.1), Rs.addmm_(gm.T, gm, beta=0.9, alpha=0.1)), None),
        ("fusekit.shampoo_stats", "fusekit.shampoo_stats(g, L, R) [64,64]",
         lambda: fusekit.shampoo_stats(gm, Ls, Rs, alpha=0.1, beta=0.9), "torch.shampoo_stats"),
        ("fusekit.matrix_power", "fusekit.matrix_power(A, -1/4) newton, tol=0, 10 it",
         lambda: fusekit.matrix_power(A, -0.25, 1e-6, method="newton", max_iter=10, tol=0.0), None),
    ]
    log(f"\n== host time per call (us; min over {med} medians of {n} calls; sync every 50)")
    out = {}
    for key, label, fn, base in cases:
        try:
            us = H(fn)
        except Exception as e:  # noqa: BLE001
            log(f"  {label:<52} skipped: {type(e).__name__}: {str(e).strip()[:200]}")
            ROWS.append(dict(section="host", key=key, case=label, error=f"{type(e).__name__}: {e}"))
            continue
        out[key] = us
        ratio = us / out[base] if base in out else None
        log(f"  {label:<52} {us:8.1f} us" + (f"  ({ratio:.2f}x {base})" if ratio else ""))
        ROWS.append(dict(section="host", key=key, case=label, host_us=us, baseline=base, ratio=ratio))
    return out


# ---------------------------------------------------------------- main
def header():
    commit = git_commit(ROOT)
    device = torch.cuda.get_device_name() if CUDA else "CPU (no CUDA: smoke run, timings meaningless)"
    info = dict(device=device, torch=torch.__version__, date=datetime.datetime.now().isoformat(timespec="seconds"),
                commit=commit, fusekit_library=os.environ.get("FUSEKIT_LIBRARY"))
    log(f"device: {info['device']}")
    log(f"torch {info['torch']}; date {info['date']}; git commit {info['commit']}")
    log(f"step: forward, MSE loss, backward{' and SGD(momentum=0.9)' if OPTIMIZER == 'sgd' else ''}")
    log(f"library: {info['fusekit_library']}")
    return info


def fmt(v, w=8, p=3):
    return f"{v:{w}.{p}f}" if isinstance(v, (int, float)) and v is not None and math.isfinite(v) else f"{'-':>{w}}"


def main():
    global CUDA, DEV, OPTIMIZER
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (automatic without CUDA)")
    ap.add_argument("--cases", default=".", help="regex on case names (e.g. 'mlp|gaussian')")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-profile", action="store_true", help="skip the gpu-only (profiler) times")
    ap.add_argument("--no-host", action="store_true", help="skip the host time rows")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--optimizer", choices=("none", "sgd"), default="none",
                    help="the step's optimizer (none: forward, loss, backward)")
    args = ap.parse_args()
    OPTIMIZER = args.optimizer
    t_start = time.time()
    CUDA = torch.cuda.is_available()
    DEV = "cuda" if CUDA else "cpu"
    if not CUDA:
        args.smoke = True
    info = header()
    torch.manual_seed(0)
    if hasattr(torch._dynamo.config, "cache_size_limit"):
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)

    host = {} if args.no_host else host_rows(args)

    if args.smoke:
        specs = [lambda: mlp_case(32, 2, 8, torch.float32), lambda: mlp_case(32, 2, 8, torch.bfloat16),
                 lambda: gauss_case(16, 32), lambda: geo_case(16, 32, 4, 2)]
    else:
        # each family early (the compile variants of the cases past --budget-s are skipped)
        f32, bf16 = torch.float32, torch.bfloat16
        specs = [lambda: mlp_case(256, 2, 64, f32), lambda: gauss_case(1000, 500), lambda: geo_case(2000, 256, 16, 4),
                 lambda: mlp_case(1024, 4, 256, f32), lambda: mlp_case(2048, 4, 256, f32),
                 lambda: mlp_case(256, 2, 64, bf16), lambda: mlp_case(1024, 4, 256, bf16),
                 lambda: mlp_case(2048, 4, 256, bf16), lambda: gauss_case(4096, 16384)]
    results = []
    for spec in specs:
        case = spec()
        if not re.search(args.cases, case.name):
            continue
        res = run_case(case, args, t_start)
        results.append((spec, case.name, case.goal, res))
        del case
        gc.collect()
        if CUDA:
            torch.cuda.empty_cache()
    # the profiler last, after every CUDA graph capture of the run
    if CUDA and not args.no_profile:
        log("\n== gpu-only time of the eager steps (torch.profiler)")
        for spec, _, _, res in results:
            case = spec()
            profile_case(case, res)
            del case
            gc.collect()
            torch.cuda.empty_cache()

    # ---- goals
    goals = []

    def goal(text, value, limit, unit):
        met = value is not None and value <= limit
        goals.append(dict(goal=text, value=value, limit=limit, unit=unit, met=met))

    if "torch.add" in host:
        for k in ("fusekit.add",):
            if k in host:
                goal(f"host {k} <= 1.5x torch.add", host[k] / host["torch.add"], 1.5, "x")
    if "torch.linear_fb" in host and "fusekit.linear_fb" in host:
        goal("host linear fwd+bwd <= torch's", host["fusekit.linear_fb"] / host["torch.linear_fb"], 1.0, "x")
    for _, name, kind, res in results:
        w = lambda k: res.get(k, {}).get("wall_ms")  # noqa: E731
        if kind == "mlp":
            best = [v for v in (w("torch_eager"), w("torch_compile")) if v is not None]
            if best and w("fk_eager") is not None:
                goal(f"{name}: fusekit eager step <= 0.8x best(eager, compile) (wall)",
                     w("fk_eager") / min(best), 0.8, "x")
        elif kind == "gauss":
            goal(f"{name}: fusekit eager step <= 0.15 ms (wall)", w("fk_eager"), 0.15, "ms")
            if w("fk_graph") is not None:
                goal(f"{name}: fusekit graph replay <= 0.15 ms (wall)", w("fk_graph"), 0.15, "ms")
    ROWS.extend(dict(section="goal", **g) for g in goals)

    # ---- the table, last
    basis = "gpu" if CUDA else "wall"
    log(f"\n{PREFIX} ---- summary on {info['device']} (torch {info['torch']}, {info['commit']})")
    log(f"{PREFIX} step ms ({basis} per step; wall in the JSON)  fk eager |   eager  | compile  | fk comp. "
        f"| fk graph | tc graph | fk ro    | tc ro    | fk graph/gpu-only")
    for _, name, _, res in results:
        g = lambda k: res.get(k, {}).get("gpu_ms" if CUDA else "wall_ms")  # noqa: E731
        ratio = res.get("fk_graph", {}).get("replay_over_gpu_only")
        log(f"{PREFIX} {name:<30} " + " | ".join(fmt(g(k)) for k in (
            "fk_eager", "torch_eager", "torch_compile", "fk_compile", "fk_graph", "torch_graph", "fk_ro", "torch_ro"))
            + f" | {fmt(ratio, 6, 2)}")
    log(f"{PREFIX} wall ms/step (host included)      fk eager |   eager  | compile  | fk comp. | fk graph | tc graph")
    for _, name, _, res in results:
        ww = lambda k: res.get(k, {}).get("wall_ms")  # noqa: E731
        log(f"{PREFIX} {name:<30} " + " | ".join(fmt(ww(k)) for k in (
            "fk_eager", "torch_eager", "torch_compile", "fk_compile", "fk_graph", "torch_graph")))
    for key, us in host.items():
        log(f"{PREFIX} host {key:<26} {us:8.1f} us/call")
    for gl in goals:
        v = fmt(gl["value"], 6, 3 if gl["unit"] == "ms" else 2)
        log(f"{PREFIX} goal {gl['goal']}: {v.strip()} {gl['unit']} -> {'met' if gl['met'] else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(info=info, smoke=args.smoke, rows=ROWS), fh, indent=1)
    log(f"{PREFIX} total {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
