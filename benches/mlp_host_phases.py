#!/usr/bin/env python3
"""Where the host time of an eager MLP training step goes: nn.Sequential(Linear,
ReLU, ..., Linear) against fusekit.nn.FusedMLP, cumulative phases of the step
(zero_grad; + forward; + MSE loss; + backward; + SGD(momentum=0.9) step), each
timed as the mean host time of one call over many calls with the GPU never the
bottleneck (a synchronisation every call, outside the timed region: the launch
queue is empty at each call's start). The differences between rows are each
phase's host cost.

    python3 benches/mlp_host_phases.py [--widths 256,256,256] [--batch 64] [--dtype f32] [--torch-one-layer]

--profile: also torch.profiler's table of each model's whole step (CPU self time per
op over 50 steps, the 15 costliest), to see which calls the time goes to.
--torch-one-layer: the torch column is a single nn.Linear + nn.ReLU layer (widths[0] ->
widths[1]) instead of the whole Sequential: the issue's host-cost goal compares one
FusedMLP forward + backward of the whole network with that one PyTorch layer's.

Without CUDA it runs on the CPU (the fusekit CPU backend does the arithmetic there,
so only the Python and dispatch differences mean anything).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import fusekit.nn as fnn

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def sequential(widths, dev, dtype):
    mods = []
    for i, (k, n) in enumerate(zip(widths[:-1], widths[1:])):
        mods.append(nn.Linear(k, n, device=dev, dtype=dtype))
        if i < len(widths) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def phases(model, x, target):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def upto(k):
        def step():
            opt.zero_grad(set_to_none=True)
            if k < 1:
                return
            y = model(x)
            if k < 2:
                return
            loss = (y.float() - target.float()).square().mean()
            if k < 3:
                return
            loss.backward()
            if k < 4:
                return
            opt.step()
        return step
    names = ["zero_grad", "+ forward", "+ loss", "+ backward", "+ optimizer step"]
    return [(names[k], upto(k)) for k in range(5)]


def host_us(step, sync, n):
    ts = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    sync()
    return statistics.median(ts) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", default="256,256,256")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--torch-one-layer", action="store_true")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = DTYPES[args.dtype]
    widths = [int(w) for w in args.widths.split(",")]
    torch.manual_seed(0)
    x = torch.randn(args.batch, widths[0], device=dev).to(dtype)
    target = torch.randn(args.batch, widths[-1], device=dev).to(dtype)
    seq = sequential(widths, dev, dtype)
    if args.torch_one_layer:
        seq = nn.Sequential(nn.Linear(widths[0], widths[1], device=dev, dtype=dtype), nn.ReLU())
    models = {"torch": seq, "fk_mlp": fnn.FusedMLP.from_sequential(sequential(widths, dev, dtype))}
    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu'}; torch {torch.__version__}; "
          f"widths {widths}, batch {args.batch}, {args.dtype}; median host us per call of {args.n}")
    table = {}
    for name, m in models.items():
        tgt = target if not (args.torch_one_layer and name == "torch") else \
            torch.randn(args.batch, widths[1], device=dev).to(dtype)
        for phase, step in phases(m, x, tgt):
            for _ in range(20):
                step()
            table.setdefault(phase, {})[name] = host_us(step, sync, args.n)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name, m in models.items():
            step = phases(m, x, target)[-1][1] if not (args.torch_one_layer and name == "torch") else None
            if step is None:
                continue
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts) as prof:
                for _ in range(50):
                    step()
                sync()
            print(f"mlp_host_phases profile of {name}'s step (50 steps)")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    tname = "torch (1 layer)" if args.torch_one_layer else "torch"
    print(f"mlp_host_phases {'phase':<18} {tname:>15} {'fk_mlp':>9}")
    for phase, row in table.items():
        print(f"mlp_host_phases {phase:<18} {row['torch']:15.1f} {row['fk_mlp']:9.1f}")


if __name__ == "__main__":
    main()
