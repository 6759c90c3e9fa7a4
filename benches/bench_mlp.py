#!/usr/bin/env python3
"""fusekit.nn.FusedMLP (the whole network as one op each way: fk_mlp_forward /
fk_mlp_backward) against PyTorch's nn.Sequential(Linear, ReLU, ..., Linear).

For each case (hidden width, layers, batch, dtype) and each model:

- torch eager: ``nn.Sequential(Linear, ReLU, ..., Linear)``;
- torch compile: ``torch.compile`` of it (``fullgraph=True``; ``--no-compile`` skips it);
- fk linear: the same network of ``fusekit.nn.FusedLinear`` layers (one op per layer);
- fk mlp: ``fusekit.nn.FusedMLP.from_sequential`` of it (one op per direction);
- "... graph": the eager models above with the whole step (or the forward) captured
  by ``torch.cuda.graph`` and replayed (the PyTorch docs' whole-network capture:
  warm-up on a side stream, static inputs, grads set to None, capture, replay; as
  benches/bench_torch_path.py's build_graph); CUDA only.

two things are timed: a training step (zero_grad, forward, MSE loss against a random
target, backward, ``torch.optim.SGD(momentum=0.9)`` step) and the forward alone
(under ``torch.no_grad``). Every model starts from the same parameters (copies of
the Sequential's), the inputs and targets are random (never zeros). Each variant is
warmed up first (compilation and capture happen there), then:

- gpu: GPU ms per step, N steps between two CUDA events, median over 7 runs
  (benches/bench_torch_path.py's ``time_steps``; "wall" the same with perf_counter);
- host: the host time of one call (us) with the GPU never the bottleneck:
  benches/host_overhead.py's ``host_us`` with a synchronisation after every call, so
  the launch queue is empty at each call's start and the time is the Python call's;
- peak: ``torch.cuda.max_memory_allocated`` over the variant's build, warm-up and
  timing (MiB; parameters, inputs and a graph's pool included);
- ratio: gpu time over the best of torch eager / torch compile for the same
  case and kind (step or forward); < 1 is faster;
- floor: the larger of the FLOPs at the tensor-core rate (the dtype's matrix
  product measured at the start: 8192^3, f32 as TF32's ceiling) and the bytes at
  the measured copy bandwidth (a 1 GiB device-to-device copy, bytes read plus
  written). Forward: 2 B sum(k_i n_i) FLOPs; x read, y written. Training step: three
  times the forward's FLOPs (forward, data and weight gradients); x read twice, y
  written and dy read, every hidden activation written by the forward and read by
  the backward.

Correctness guard: before timing, each fusekit model's forward output and one step's
gradients are compared with the Sequential's (relative error above 1e-2 for float32,
1e-1 for bfloat16 stops the benchmark), so a wrong result is never timed.

Without CUDA (or with ``--smoke``) tiny cases run on the CPU in seconds (CI runs it
so: torch.compile with backend "aot_eager", no CUDA graphs; timings meaningless).

    python3 benches/bench_mlp.py [--json OUT] [--smoke] [--no-compile] [--cases REGEX]
                                 [--variants REGEX] [--tag NAME] [--budget-s 480]

--variants: a regex on the variant keys (torch_eager, fk_mlp_graph, ...) to time only
those. --tag: appended to the fusekit variants' keys in the rows and the summary, e.g.
``FK_MLP_FUSED=1 python3 benches/bench_mlp.py --variants fk_mlp --tag fused`` times
FusedMLP on the fully fused kernels (f16 / bf16, widths up to 128) where the default
run takes the general path (per-layer cuBLASLt calls; FK_MLP_FUSED is read when
fusekit's CUDA context is made, so one process times one path).

--budget-s: after this many seconds the remaining torch.compile variants are skipped
(printed with the reason), so that the run fits scripts/gpu_suite.sh's 900 s step.

The library: $FUSEKIT_LIBRARY, else target/release/libfusekit.so.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import pathlib
import re
import sys
import time
import traceback

import torch
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches"))
import bench_torch_path as btp  # noqa: E402  (the shared timing: time_steps; header; sets up fusekit)
from host_overhead import host_us as _host_us  # noqa: E402

import fusekit.nn as fnn  # noqa: E402

PREFIX = "bench_mlp"  # the summary lines start with this
TOL = {torch.float32: 1e-2, torch.float16: 5e-2, torch.bfloat16: 1e-1}
DNAME = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
ROWS = []


def log(*a):
    print(*a, flush=True)


def sync():
    if btp.CUDA:
        torch.cuda.synchronize()


# ---------------------------------------------------------------- cases
class Case:
    def __init__(self, widths, batch, dtype, seed=0):
        self.widths, self.batch, self.dtype = list(widths), batch, dtype
        hidden = widths[1:-1]
        shape = f"h{hidden[0]} L{len(widths) - 1}" if len(set(widths)) == 1 else \
            f"in{widths[0]} w{hidden[0] if hidden else '-'} x{len(hidden)} out{widths[-1]}"
        self.name = f"mlp {shape} b{batch} {DNAME[dtype]}"
        g = torch.Generator(device=btp.DEV).manual_seed(seed)
        self.x = torch.randn(batch, widths[0], generator=g, device=btp.DEV).to(dtype)
        self.target = (0.5 * torch.randn(batch, widths[-1], generator=g, device=btp.DEV)).to(dtype)
        torch.manual_seed(seed)
        self.seq = self.sequential()

    def sequential(self):
        mods = []
        for i, (k, n) in enumerate(zip(self.widths[:-1], self.widths[1:])):
            mods.append(nn.Linear(k, n, device=btp.DEV, dtype=self.dtype))
            if i < len(self.widths) - 2:
                mods.append(nn.ReLU())
        return nn.Sequential(*mods)

    def model(self, which):
        """A fresh model of kind `which` with the case's parameters."""
        seq = self.sequential()
        seq.load_state_dict(self.seq.state_dict())
        if which == "torch":
            return seq
        if which == "fk_linear":
            lins = [m for m in seq if isinstance(m, nn.Linear)]
            return nn.Sequential(*[fnn.FusedLinear.from_linear(lin, "relu" if i < len(lins) - 1 else "none")
                                   for i, lin in enumerate(lins)])
        if which == "fk_mlp":
            return fnn.FusedMLP.from_sequential(seq)
        raise ValueError(which)


CEIL = {}  # "bw": bytes/s, dtype: FLOP/s


def ceilings():
    """The copy bandwidth and each dtype's matrix-product rate, measured here."""
    if not btp.CUDA:
        return
    a = torch.empty(2**28, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    b.copy_(a)
    t = btp.time_steps(lambda: b.copy_(a), 10, 5)[0]
    CEIL["bw"] = 2 * a.numel() * 4 / (t * 1e-3)
    del a, b
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        n = 8192
        x = torch.randn(n, n, device="cuda", dtype=dt)
        y = torch.randn(n, n, device="cuda", dtype=dt)
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        t = btp.time_steps(lambda: x @ y, 5, 5)[0]
        torch.backends.cuda.matmul.allow_tf32 = prev
        CEIL[dt] = 2 * n**3 / (t * 1e-3)
        del x, y
    torch.cuda.empty_cache()
    log(f"ceilings: copy {CEIL['bw'] / 1e12:.2f} TB/s; matmul f16 {CEIL[torch.float16] / 1e12:.0f}, "
        f"bf16 {CEIL[torch.bfloat16] / 1e12:.0f}, f32 (TF32) {CEIL[torch.float32] / 1e12:.0f} TFLOP/s")


def floor_ms(case, kind):
    """The case's floor (ms) for `kind`, from the measured ceilings (None without CUDA)."""
    if not CEIL:
        return None
    w, b, es = case.widths, case.batch, torch.finfo(case.dtype).bits // 8
    flops = 2 * b * sum(k * n for k, n in zip(w[:-1], w[1:]))
    if kind == "fwd":
        nbytes = es * b * (w[0] + w[-1])
    else:
        flops *= 3
        nbytes = es * b * (2 * w[0] + 2 * w[-1] + 2 * sum(w[1:-1]))
    return 1e3 * max(flops / CEIL[case.dtype], nbytes / CEIL["bw"])


def mse(a, b):
    return (a.float() - b.float()).square().mean()


def rel_err(out, ref):
    out, ref = out.detach().double().flatten(), ref.detach().double().flatten()
    if not torch.isfinite(out).all():
        return float("inf")
    den = torch.linalg.vector_norm(ref).item()
    return torch.linalg.vector_norm(out - ref).item() / (den or 1.0)


def check(case):
    """The fusekit models' output and gradients against the Sequential's."""
    ref = case.model("torch")
    y_ref = ref(case.x)
    mse(y_ref, case.target).backward()
    g_ref = [p.grad for p in ref.parameters()]
    for which in ("fk_linear", "fk_mlp"):
        m = case.model(which)
        y = m(case.x)
        mse(y, case.target).backward()
        errs = [rel_err(y, y_ref)] + [rel_err(p.grad, g) for p, g in zip(m.parameters(), g_ref)]
        worst = max(errs)
        log(f"  check {which:<10} output and gradients vs the Sequential: max rel err {worst:.1e}")
        assert worst <= TOL[case.dtype], f"{case.name}: {which} differs from the Sequential ({worst:.2e})"


# ---------------------------------------------------------------- steps
def make_step(model, case, kind):
    """kind "step": zero_grad, forward, MSE, backward, SGD(momentum) step; "fwd": forward only."""
    x, target = case.x, case.target
    if kind == "fwd":
        def fwd():
            with torch.no_grad():
                return model(x)
        return fwd
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = mse(model(x), target)
        loss.backward()
        opt.step()
        return loss
    return step


def build(case, variant, kind):
    which, mode = variant
    model = case.model(which)
    if mode == "compile":
        torch._dynamo.reset()
        kw = dict(fullgraph=True)
        if not btp.CUDA:
            kw["backend"] = "aot_eager"
        model = torch.compile(model, **kw)
    step = make_step(model, case, kind)
    if mode != "graph":
        return step
    # whole-step capture with static inputs (case.x / case.target stay the same tensors)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    if kind == "step":
        for p in model.parameters():
            p.grad = None
    with torch.cuda.graph(g):
        out = step()

    def replay():
        g.replay()
        return out
    replay.graph = g
    return replay


VARIANTS = [  # key, (model, mode)
    ("torch_eager", ("torch", "eager")),
    ("torch_compile", ("torch", "compile")),
    ("fk_linear", ("fk_linear", "eager")),
    ("fk_mlp", ("fk_mlp", "eager")),
    ("torch_graph", ("torch", "graph")),
    ("fk_linear_graph", ("fk_linear", "graph")),
    ("fk_mlp_graph", ("fk_mlp", "graph")),
]


def run_case(case, args, t_start):
    log(f"\n== {case.name} (widths {case.widths})")
    check(case)
    res = {("floor", k): floor_ms(case, k) for k in ("step", "fwd")}
    log(f"  floor: step {fmt(res[('floor', 'step')], 8, 4)} ms, forward {fmt(res[('floor', 'fwd')], 8, 4)} ms")
    ROWS.append(dict(case=case.name, floor_step_ms=res[("floor", "step")], floor_fwd_ms=res[("floor", "fwd")]))
    for kind in ("step", "fwd"):
        for key, variant in VARIANTS:
            if not re.search(args.variants, key):
                continue
            if args.tag and key.startswith("fk_"):
                key = f"{key}_{args.tag}"
            label = f"{key} {kind}"
            if variant[1] == "graph" and not btp.CUDA:
                continue
            if variant[1] == "compile" and args.no_compile:
                log(f"  {label:<22} skipped: --no-compile")
                continue
            if variant[1] == "compile" and time.time() - t_start > args.budget_s:
                log(f"  {label:<22} skipped: past --budget-s {args.budget_s:g} s")
                continue
            try:
                if btp.CUDA:
                    gc.collect()
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.time()
                step = build(case, variant, kind)
                for _ in range(2 if args.smoke else 10):  # warm-up: compilation happens here
                    step()
                sync()
                warm = time.time() - t0
                if args.smoke:
                    n, reps = 2, 2
                else:
                    t1 = time.perf_counter()
                    for _ in range(3):
                        step()
                    sync()
                    per = max((time.perf_counter() - t1) / 3, 1e-6)
                    n, reps = max(5, min(500, int(0.2 / per))), 7
                gpu, wall = btp.time_steps(step, n, reps)
                host = _host_us(step, sync, 10 if args.smoke else 200, sync_every=1)
                peak = torch.cuda.max_memory_allocated() / 2**20 if btp.CUDA else None
            except AssertionError:
                raise
            except Exception as e:  # noqa: BLE001  (a variant that does not work here: say why)
                reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
                log(f"  {label:<22} FAILED, not timed: {reason}")
                if os.environ.get("FK_BENCH_TRACE"):
                    traceback.print_exc()
                res[(kind, key)] = dict(error=reason)
                ROWS.append(dict(case=case.name, kind=kind, variant=key, error=reason))
                continue
            finally:
                step = None
            row = dict(gpu_ms=gpu, wall_ms=wall, host_us=host, peak_mib=peak, n=n, repeats=reps, warmup_s=warm)
            res[(kind, key)] = row
            log(f"  {label:<22} gpu {fmt(gpu)} ms  wall {fmt(wall)} ms  host {fmt(host, 8, 1)} us  "
                f"peak {fmt(peak, 8, 1)} MiB  (N={n} x {reps}; warm-up {warm:.1f} s)")
        # ratios against the best of torch eager / compile, per kind
        basis = "gpu_ms" if btp.CUDA else "wall_ms"
        best = [res.get((kind, k), {}).get(basis) for k in ("torch_eager", "torch_compile")]
        best = min((b for b in best if b is not None), default=None)
        for key in [k for k, _ in VARIANTS] + [f"{k}_{args.tag}" for k, _ in VARIANTS if args.tag]:
            row = res.get((kind, key))
            if row is None or "error" in row:
                continue
            row["ratio_vs_best_torch"] = row[basis] / best if best else None
            ROWS.append(dict(case=case.name, widths=case.widths, batch=case.batch, dtype=DNAME[case.dtype],
                             kind=kind, variant=key, **row))
    return res


def fmt(v, w=8, p=3):
    return f"{v:{w}.{p}f}" if isinstance(v, (int, float)) and v is not None and math.isfinite(v) else f"{'-':>{w}}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on whatever device (automatic without CUDA)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--cases", default=".", help="regex on case names")
    ap.add_argument("--variants", default=".", help="regex on variant keys")
    ap.add_argument("--tag", default="", help="suffix for the fusekit variants' keys")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip torch.compile variants after this")
    args = ap.parse_args()
    t_start = time.time()
    btp.CUDA = torch.cuda.is_available()
    btp.DEV = "cuda" if btp.CUDA else "cpu"
    if not btp.CUDA:
        args.smoke = True
    btp.OPTIMIZER = "sgd"
    info = btp.header()
    ceilings()
    info["ceilings"] = {str(k): v for k, v in CEIL.items()}
    if hasattr(torch._dynamo.config, "cache_size_limit"):
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    field = [32, 64, 64, 64, 64, 16]  # width 64, 4 hidden layers, in 32, out 16
    if args.smoke:
        specs = [([16, 32, 32, 16], 8, f32), ([8, 16, 16, 16, 16, 4], 16, bf16)]
    else:
        specs = [([256] * 3, 64, f32),              # hidden 256, 2 layers, batch 64
                 ([1024] * 5, 256, f32),            # hidden 1024, 4 layers, batch 256
                 ([2048] * 5, 256, bf16),           # hidden 2048, 4 layers, batch 256
                 (field, 2**18, bf16),               # the narrow-network goal case
                 (field, 2**14, f16),
                 (field, 2**21, bf16),
                 ([32, 128, 128, 128, 128, 16], 2**18, bf16),
                 ([4096] * 4, 8192, bf16)]          # hidden 4096, 3 layers, batch 8192
    results = []
    for widths, batch, dtype in specs:
        case = Case(widths, batch, dtype)
        if not re.search(args.cases, case.name):
            continue
        results.append((case.name, run_case(case, args, t_start)))
        del case
        gc.collect()
        if btp.CUDA:
            torch.cuda.empty_cache()

    basis = "gpu" if btp.CUDA else "wall"
    keys = [k for k, _ in VARIANTS if re.search(args.variants, k)]
    if args.tag:
        keys = [f"{k}_{args.tag}" if k.startswith("fk_") else k for k in keys]
    log(f"\n{PREFIX} ---- summary on {info['device']} (torch {info['torch']}, {info['commit']})")
    for kind in ("step", "fwd"):
        log(f"{PREFIX} {kind} {basis} ms (ratio vs best of torch eager/compile)")
        log(f"{PREFIX} {'case':<36} {'floor':>8} | " + " | ".join(f"{k:>17}" for k in keys))
        for name, res in results:
            cells = [fmt(res.get(("floor", kind)), 8, 4)]
            for k in keys:
                row = res.get((kind, k), {})
                v, r = row.get(f"{basis}_ms"), row.get("ratio_vs_best_torch")
                cells.append(f"{fmt(v, 8, 3)} ({fmt(r, 5, 2)})" if v is not None else f"{'-':>17}")
            log(f"{PREFIX} {name:<36} " + " | ".join(cells))
        log(f"{PREFIX} {kind} host us per call / peak MiB")
        for name, res in results:
            cells = [f"{fmt(res.get((kind, k), {}).get('host_us'), 7, 1)} / {fmt(res.get((kind, k), {}).get('peak_mib'), 7, 0)}"
                     for k in keys]
            log(f"{PREFIX} {name:<36} " + " | ".join(cells))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(info=info, smoke=args.smoke, rows=ROWS), fh, indent=1)
    log(f"{PREFIX} total {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
