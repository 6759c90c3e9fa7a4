#!/usr/bin/env python3
"""fusekit.optim.Shampoo on the GPU, side by side in one run (issue 25's goals):

1. ``step``: one optimizer step preconditioning every step (statistics, every
   inverse 4th root, preconditioning, Adam grafting) of an MLP of 4 layers of
   1024x1024 (weights and biases): fusekit against a plain-PyTorch Shampoo of the
   same algorithm that takes each root with ``torch.linalg.eigh`` (goal <= 0.1x).
2. ``train``: a training step (forward, backward, optimizer step) of the same MLP,
   roots every 20 steps, against the same step with ``torch.optim.Adam(fused=True)``
   (goal <= 1.3x), fusekit with float32 and with TF32 roots and preconditioning;
   GPU time (CUDA events over windows of 20 steps, so each window holds one root
   computation) and host time (the Python call of a step). The forward and
   backward are torch's float32 GEMMs in both.
3. ``--dist`` under torchrun: the distributed step (roots split across the ranks)
   against the same optimizer on one GPU (goal: faster).

Every time is a median over many runs after warm-up; the optimizers' root counters
are printed so a float64 (or, after TF32, strict float32) retry shows, and so are
per-phase times of fusekit's steps (``Shampoo.profile``: CUDA events and host
perf_counter at the end of flags wait (the host's wait for the last root step's
acceptance flags), settle+stats, roots, grafting, precondition+update;
averaged per step over 5 steps, or over one 20-step window of the training step).

    python3 benches/bench_shampoo.py [--json PATH] [--batch 4096]
    python3 -m torch.distributed.run --nproc_per_node=2 benches/bench_shampoo.py --dist [--json PATH]
    python3 benches/bench_shampoo.py --smoke          # CPU, small sizes (scripts/test.sh)
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

import fusekit
import fusekit.optim as fo

ROWS = []


def row(name, value, unit, note=""):
    if not value > 0:
        raise SystemExit(f"bench_shampoo: {name} measured {value} {unit}; a time must be positive")
    ROWS.append(dict(name=name, value=value, unit=unit, note=note))
    print(f"Shampoo | {name:<58} {value:10.3f} {unit:<3} {note}", flush=True)


class Timer:
    """Median of CUDA-event (or, on the CPU, perf_counter) times of ``fn`` in ms."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn, reps, warmup=3, per=1):
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(reps):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) / per)
            else:
                t = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t) * 1e3 / per)
        return statistics.median(ts)


class TorchShampoo:
    """Shampoo in plain PyTorch, the same algorithm as fusekit.optim.Shampoo with
    Adam grafting, one ``torch.linalg.eigh`` per inverse root (the baseline)."""

    def __init__(self, params, lr, betas, epsilon, precondition_frequency, grafting_beta2=0.999,
                 grafting_epsilon=1e-8):
        self.params = list(params)
        self.lr, self.b1, self.b2, self.eps, self.freq = lr, betas[0], betas[1], epsilon, precondition_frequency
        self.gb2, self.geps = grafting_beta2, grafting_epsilon
        self.t = 0
        self.st = {}

    @staticmethod
    def root(a, eps):
        w, q = torch.linalg.eigh(a + eps * torch.eye(a.shape[0], dtype=a.dtype, device=a.device))
        w = w - torch.clamp(w.min() - eps, max=0)
        return (q * w.pow(-0.25)) @ q.T

    @torch.no_grad()
    def step(self):
        self.t += 1
        t = self.t
        for p in self.params:
            g = p.grad
            st = self.st.setdefault(p, {})
            if not st:
                st["m"], st["v"] = torch.zeros_like(p), torch.zeros_like(p)
                if p.dim() == 2:
                    m, n = p.shape
                    st["L"], st["R"] = p.new_zeros(m, m), p.new_zeros(n, n)
                    st["Li"], st["Ri"] = torch.eye(m, device=p.device), torch.eye(n, device=p.device)
            st["v"].mul_(self.gb2).addcmul_(g, g, value=1 - self.gb2)
            st["m"].lerp_(g, 1 - self.b1)
            gbar = st["m"] / (1 - self.b1 ** t)
            pg = gbar / ((st["v"] / (1 - self.gb2 ** t)).sqrt_().add_(self.geps))
            if p.dim() == 2:
                st["L"].mul_(self.b2).addmm_(g, g.T, alpha=1 - self.b2)
                st["R"].mul_(self.b2).addmm_(g.T, g, alpha=1 - self.b2)
                if t % self.freq == 0 or t == 1:
                    c = 1 - self.b2 ** t
                    st["Li"], st["Ri"] = self.root(st["L"] / c, self.eps), self.root(st["R"] / c, self.eps)
                d = st["Li"] @ gbar @ st["Ri"]
                d.mul_(pg.norm() / (d.norm() + 1e-16))
            else:
                d = pg
            p.add_(d, alpha=-self.lr)


def phases(opt, run, steps):
    """Per-phase times of ``steps`` optimizer steps made by ``run()``, averaged per
    step: GPU (CUDA events at the end of each phase; on the CPU none) and host
    (perf_counter), from the optimizer's ``profile`` marks (fusekit.optim.Shampoo)."""
    opt.profile = []
    run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    log, opt.profile = opt.profile, None
    gpu, host = {}, {}
    for prev, cur in zip(log, log[1:]):
        if cur[0] == "start":
            continue
        host[cur[0]] = host.get(cur[0], 0.0) + (cur[2] - prev[2]) * 1e3 / steps
        if cur[1] is not None and prev[1] is not None:
            gpu[cur[0]] = gpu.get(cur[0], 0.0) + prev[1].elapsed_time(cur[1]) / steps
    fmt = lambda d: ", ".join(f"{k} {v:.3f}" for k, v in d.items())  # noqa: E731
    return (f"GPU ms/step: {fmt(gpu)}; " if gpu else "") + f"host ms/step: {fmt(host)}"


def mlp(width, layers, device):
    mods = []
    for k in range(layers):
        mods.append(torch.nn.Linear(width, width, device=device))
        if k + 1 < layers:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def set_grads(model, batch, seed=0):
    """Weight gradients of a batch (sums of ``batch`` outer products, as in
    training), fixed for every timed step."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for p in model.parameters():
        if p.dim() == 2:
            a = torch.randn(p.shape[0], batch, device=p.device, generator=g)
            b = torch.randn(batch, p.shape[1], device=p.device, generator=g)
            p.grad = (a @ b) / batch
        else:
            p.grad = torch.randn(p.shape, device=p.device, generator=g) / batch ** 0.5


HP = dict(lr=1e-3, betas=(0.9, 0.999), epsilon=1e-6)


def bench_step(args, dev, timer, width, layers, reps):
    model = mlp(width, layers, dev)
    set_grads(model, args.batch)
    res = {}
    for name, make in (
        ("plain PyTorch (eigh per root)", lambda ps: TorchShampoo(ps, precondition_frequency=1, **HP)),
        ("fusekit", lambda ps: fo.Shampoo(ps, precondition_frequency=1, **HP)),
        ("fusekit, TF32", lambda ps: fo.Shampoo(ps, precondition_frequency=1, allow_tf32=True, **HP)),
    ):
        opt = make(list(model.parameters()))
        with torch.no_grad():
            saved = [p.detach().clone() for p in model.parameters()]
        ms = timer(opt.step, reps if "plain" not in name else max(3, reps // 3))
        stats = dict(getattr(opt, "root_stats", None) or {})
        if getattr(opt, "newton_log", None):
            stats["last Newton batches (side, batch, iterations, precision)"] = sorted(set(opt.newton_log[-8:]))
        prof = ""
        if "plain" not in name:
            def run():
                for _ in range(5):
                    opt.step()
            prof = "; phases (5 steps): " + phases(opt, run, 5)
        with torch.no_grad():
            for p, s in zip(model.parameters(), saved):
                p.copy_(s)
        res[name] = ms
        row(f"step, roots every step, {layers}x{width}x{width}: {name}", ms, "ms",
            (f"roots {stats}" if stats else "") + prof)
    base = res["plain PyTorch (eigh per root)"]
    for name in ("fusekit", "fusekit, TF32"):
        row(f"step ratio {name} / plain PyTorch (goal <= 0.1)", res[name] / base, "x")
    return res


def train_runs(dev, width, layers, freq):
    """The training comparison's three runs, one initialisation (torch seed 0):
    Adam's name and [(name, model, optimizer)] for Adam (fused on CUDA), fusekit
    Shampoo and fusekit Shampoo with TF32 (roots every ``freq`` steps), each created
    as its turn comes."""
    torch.manual_seed(0)
    base_model = mlp(width, layers, dev)
    adam = "torch.optim.Adam(fused=True)" if dev.type == "cuda" else "torch.optim.Adam"

    def runs():
        for name in (adam, "fusekit Shampoo", "fusekit Shampoo, TF32"):
            model = mlp(width, layers, dev)
            model.load_state_dict(base_model.state_dict())
            if "Adam" in name:
                opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=dev.type == "cuda")
            else:
                opt = fo.Shampoo(model.parameters(), precondition_frequency=freq, allow_tf32="TF32" in name, **HP)
            yield name, model, opt

    return adam, runs()


def bench_train(args, dev, timer, width, layers, windows, freq=20):
    x = torch.randn(args.batch, width, device=dev)
    y = torch.randn(args.batch, width, device=dev)
    res = {}
    adam, runs = train_runs(dev, width, layers, freq)
    for name, model, opt in runs:
        host = []

        def one():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            t = time.perf_counter()
            opt.step()
            host.append((time.perf_counter() - t) * 1e3)

        def window():
            for _ in range(freq):
                one()

        ms = timer(window, windows, warmup=2, per=freq)
        res[name] = ms
        hs = statistics.median(host)
        stats = dict(getattr(opt, "root_stats", None) or {})
        if getattr(opt, "newton_log", None):
            stats["last Newton batches (side, batch, iterations, precision)"] = sorted(set(opt.newton_log[-8:]))
        prof = ("; optimizer phases (one window): " + phases(opt, window, freq)) if stats else ""
        row(f"train step (fwd+bwd+step), batch {args.batch}, roots/{freq}: {name}", ms, "ms",
            f"{'GPU' if timer.cuda else 'wall'}; optimizer host {hs:.3f} ms" + (f"; roots {stats}" if stats else "")
            + prof)
        row(f"train step host time of opt.step(): {name}", hs, "ms")
    for name in ("fusekit Shampoo", "fusekit Shampoo, TF32"):
        row(f"train step ratio {name} / {adam} (goal <= 1.3)", res[name] / res[adam], "x")
    return res


def y_eigs(S, X, eps):
    """Eigenvalues of ``X^2 (S + eps I) X^2`` in float64: all 1 for the exact inverse
    4th root, below 1 where a direction is damped (unfinished), above 1 where it is
    over-amplified."""
    S, X = S.double(), X.double()
    X2 = X @ X
    Y = X2 @ (S + eps * torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)) @ X2
    return torch.linalg.eigvalsh((Y + Y.transpose(-1, -2)) / 2)


def bench_quality(args, dev, width, layers, steps, freq=20):
    """What the TF32 policy costs in training: the same MLP and data as ``train``
    trained ``steps`` steps from one initialisation with Adam (fused), Shampoo strict
    float32 and Shampoo with ``allow_tf32`` (roots every ``freq`` steps); the loss at
    the end and along the way, and at every root step the eigenvalues of
    ``X^2 (S + eps I) X^2`` of every accepted root (float64). On the strict run's
    statistics at every other root step, TF32 Newton with 8 to 12 iterations (the
    study behind TF32_DAMPED_ITERATIONS)."""
    gen = torch.Generator(device=dev).manual_seed(5)
    x = torch.randn(args.batch, width, device=dev, generator=gen)
    y = torch.randn(args.batch, width, device=dev, generator=gen)
    eps = HP["epsilon"]
    study = {}
    for name, model, opt in train_runs(dev, width, layers, freq)[1]:
        losses, ys = [], []
        for t in range(1, steps + 1):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if "Adam" in name or not (t % freq == 0 or t == 1):
                continue
            opt._settle()  # the accepted (or retried) roots of this step
            c2 = 1.0 - HP["betas"][1] ** t
            mats = [(M / c2, X) for p in model.parameters() if p.dim() == 2
                    for M, X in ((opt.state[p]["L"][0], opt.state[p]["L_root"][0]),
                                 (opt.state[p]["R"][0], opt.state[p]["R_root"][0]))]
            S = torch.stack([m for m, _ in mats])
            ev = y_eigs(S, torch.stack([x_ for _, x_ in mats]), eps)
            ys.append((t, float(ev.max()), float(ev.min()), float(ev.median())))
            if "TF32" not in name and (t // freq) % 2 == 1:
                ratio = (torch.linalg.matrix_norm(S.double()) + eps * width ** 0.5) / eps
                hints = sorted({fo.newton_iterations_for(float(r)) for r in ratio})
                for k in range(8, 13):
                    Xk = fusekit.matrix_power(S.float(), -0.25, eps, method="newton", max_iter=k, tol=0.0,
                                              allow_tf32=True)
                    e = y_eigs(S, Xk, eps)
                    hi, lo = study.get(k, (0.0, math.inf, []))[:2]
                    study[k] = (max(hi, float(e.max())), min(lo, float(e.min())),
                                study.get(k, (0, 0, []))[2] + [(t, hints, round(float(e.max()), 4))])
        marks = [losses[i] for i in (0, steps // 4, steps // 2, 3 * steps // 4)]
        note = "loss at steps 1, 25%, 50%, 75%: " + ", ".join(f"{v:.4f}" for v in marks)
        if ys:
            note += (f"; roots at {len(ys)} root steps: eigenvalues of X^2 (S + eps I) X^2 in "
                     f"[{min(v[2] for v in ys):.3f}, {max(v[1] for v in ys):.4f}], median of medians "
                     f"{statistics.median(v[3] for v in ys):.3f}; {dict(opt.root_stats)}")
        row(f"loss after {steps} steps (roots every {freq}), MSE: {name}", losses[-1], "", note)
    for k, (hi, lo, per) in sorted(study.items()):
        row(f"TF32 Newton, {k} iterations, on the strict run's statistics: max eigenvalue of X^2 S X^2", hi, "",
            f"min {lo:.3f}; per root step (step, hints, max): {per}")


def bench_dist(args, reps):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    comm = fo.init_distributed(dev)
    timer = Timer(dev)
    torch.manual_seed(0)
    model = mlp(1024, 4, dev)
    set_grads(model, args.batch)
    res = {}
    for name, kw in (("one GPU", {}), (f"{world} GPUs, roots split", dict(distributed=comm))):
        opt = fo.Shampoo(list(model.parameters()), precondition_frequency=1, **HP, **kw)
        dist.barrier()
        ms = timer(opt.step, reps)
        res[name] = ms
        if rank == 0:
            row(f"distributed step, roots every step, 4x1024x1024: {name}", ms, "ms",
                f"roots here {opt.root_stats}")
    if rank == 0:
        a, b = res["one GPU"], res[f"{world} GPUs, roots split"]
        row(f"distributed / one GPU (goal < 1), {world} ranks", b / a, "x")
    comm.comm.close()
    dist.barrier()
    dist.destroy_process_group()
    return rank


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--smoke", action="store_true", help="CPU, small sizes, few runs")
    ap.add_argument("--dist", action="store_true", help="under torchrun: distributed against one GPU")
    args = ap.parse_args()
    if args.dist:
        rank = bench_dist(args, reps=20)
        if rank != 0:
            return
        device_name = torch.cuda.get_device_name()
    elif args.smoke:
        args.batch = min(args.batch, 512)
        dev = torch.device("cpu")
        timer = Timer(dev)
        bench_step(args, dev, timer, width=64, layers=4, reps=3)
        bench_train(args, dev, timer, width=64, layers=4, windows=2, freq=5)
        bench_quality(args, dev, width=64, layers=4, steps=20, freq=5)
        device_name = "cpu (smoke)"
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_shampoo: no CUDA device (use --smoke on the CPU)")
        dev = torch.device("cuda")
        timer = Timer(dev)
        device_name = torch.cuda.get_device_name()
        print(f"device {device_name}; batch {args.batch}", flush=True)
        bench_step(args, dev, timer, width=1024, layers=4, reps=20)
        bench_train(args, dev, timer, width=1024, layers=4, windows=10)
        bench_quality(args, dev, width=1024, layers=4, steps=400)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device_name, batch=args.batch, rows=ROWS), f, indent=1)


if __name__ == "__main__":
    main()
