#!/usr/bin/env python3
"""GPU benchmark rows for BENCHMARKS.md: fusekit vs PyTorch eager vs torch.compile,
with the floor (bytes over the copy bandwidth measured in the same run).

Every timing is the median of CUDA-event timings after warm-up, on random data
(never zeros), with the output poisoned before the timed runs. Correctness of each
fusekit output is checked against PyTorch in float64 before timing.

    python3 benches/bench_torch.py [--json PATH] [--reps N]
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch

import fusekit


def median_ms(fn, reps=50, warmup=5, inner=10):
    """Median over `reps` samples of the per-call GPU time of `inner` back-to-back
    calls between two CUDA events (so a call's host overhead overlaps the previous
    call's kernel, as in a real program, for fusekit and PyTorch alike)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(inner):
            fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / inner)
    return statistics.median(times)


def copy_bandwidth():
    n = 1 << 28
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=20, inner=1)
    return 2 * n * 4 / (ms * 1e-3)


def rel_err(out, ref):
    out = out.to(torch.complex128 if out.is_complex() else torch.float64)
    ref = ref.to(out.dtype)
    num = torch.linalg.vector_norm(out - ref).item()
    den = torch.linalg.vector_norm(ref).item()
    return num / den if den else num


def rand(shape, dtype):
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device="cuda") + 1.5
    return torch.rand(shape, device="cuda", dtype=torch.float32).add_(0.5).to(dtype)


def cases():
    n = 1 << 26
    rows = 1 << 13
    a_, b_ = 0.5, -1.5
    yield ("add f32", torch.float32, (n,), (n,), lambda a, b: a + b,
           lambda a, b, o: fusekit.add(a, b, out=o), 1e-6)
    yield ("add f64", torch.float64, (n,), (n,), lambda a, b: a + b,
           lambda a, b, o: fusekit.add(a, b, out=o), 1e-14)
    yield ("mul c128", torch.complex128, (n,), (n,), lambda a, b: a * b,
           lambda a, b, o: fusekit.mul(a, b, out=o), 1e-14)
    yield ("axpby f32", torch.float32, (n,), (n,), lambda a, b: torch.add(a * a_, b, alpha=b_),
           lambda a, b, o: fusekit.axpby(a_, a, b_, b, out=o), 1e-6)
    yield ("add f32 broadcast [8192,8192]+[8192]", torch.float32, (rows, n // rows), (n // rows,),
           lambda a, b: a + b, lambda a, b, o: fusekit.add(a, b, out=o), 1e-6)
    yield ("add bf16", torch.bfloat16, (n,), (n,), lambda a, b: a + b,
           lambda a, b, o: fusekit.add(a, b, out=o), 1e-2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 0
    torch.manual_seed(0)
    bw = copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; torch {torch.__version__}; copy bandwidth {bw/1e9:.0f} GB/s (read+write)")
    rows = []
    failures = 0
    for label, dtype, sa, sb, eager, fk, tol in cases():
        a, b = rand(sa, dtype), rand(sb, dtype)
        out = torch.full(torch.broadcast_shapes(sa, sb), float("nan"), dtype=dtype, device="cuda")
        fk(a, b, out)
        torch.cuda.synchronize()
        ref = eager(a.to(torch.complex128 if dtype.is_complex else torch.float64),
                    b.to(torch.complex128 if dtype.is_complex else torch.float64))
        err = rel_err(out, ref)
        ok = err <= tol and not math.isnan(err)
        failures += not ok
        nbytes = (a.numel() + b.numel() + out.numel()) * a.element_size()
        compiled = torch.compile(eager)
        out.fill_(float("nan"))
        t_fk = median_ms(lambda: fk(a, b, out), args.reps)
        t_eager = median_ms(lambda: eager(a, b), args.reps)
        t_comp = median_ms(lambda: compiled(a, b), args.reps)
        floor = nbytes / bw * 1e3
        row = dict(case=label, fusekit_ms=t_fk, eager_ms=t_eager, compile_ms=t_comp, floor_ms=floor,
                   fusekit_pct_of_copy=100 * floor / t_fk, rel_err=err, correct=ok)
        rows.append(row)
        print(f"{label:<40} fusekit {t_fk:.4f} ms  eager {t_eager:.4f}  compile {t_comp:.4f}  "
              f"floor {floor:.4f}  ({100*floor/t_fk:.1f}% of copy bw)  err {err:.1e} {'ok' if ok else 'WRONG'}")
    # host overhead of one small fusekit call from Python (torch tensors in, out given)
    a, b = rand((256,), torch.float32), rand((256,), torch.float32)
    o = torch.empty_like(a)
    for _ in range(100):
        fusekit.add(a, b, out=o)
    torch.cuda.synchronize()
    per = []
    for _ in range(30):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(100):
            fusekit.add(a, b, out=o)
        per.append((time.perf_counter() - t) / 100 * 1e6)
    py_us = statistics.median(per)
    per = []
    for _ in range(30):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(100):
            torch.add(a, b, out=o)
        per.append((time.perf_counter() - t) / 100 * 1e6)
    torch_us = statistics.median(per)
    print(f"host time of one small add from Python: fusekit {py_us:.2f} us, torch.add {torch_us:.2f} us")
    rows.append(dict(case="python host overhead small add", fusekit_us=py_us, torch_us=torch_us))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev, torch=torch.__version__, copy_gbps=bw / 1e9, rows=rows), f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
