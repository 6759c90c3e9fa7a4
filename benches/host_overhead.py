#!/usr/bin/env python3
"""Host time of one fusekit call from Python: what a loop of small op calls pays on
the CPU before the GPU sees any work (the calls are asynchronous, so this is the
rate at which a host-bound program can issue them).

Each row: the median host time (perf_counter) of 300 calls on small inputs, the
minimum over 3 such medians; the GPU is synchronised every 50 calls so its queue
never fills. Rows: torch.add (the baseline), fusekit.add through the package,
the Christoffel forward through ctypes on pre-wrapped buffers (the floor of a
Python call: the C entry point and one launch), through the package
(`fusekit.ops.geodesic`), through the torch custom op
(`torch.ops.fusekit.christoffel`), and PyTorch eager's four kernels of the same
formula. Without CUDA the package rows run on numpy arrays on the CPU backend.

    python3 benches/host_overhead.py [--json PATH]

The library: $FUSEKIT_LIBRARY, else target/release/libfusekit.so.
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches"))

try:
    import torch
except ImportError:
    torch = None


def host_us(fn, sync, n=300, sync_every=50):
    """The median perf_counter time (us) of one call of `fn` over `n` calls, after 20
    warm-up calls, with `sync()` every `sync_every` calls (the benches' one timing
    loop of host time: bench_torch_path.py and torch_host_breakdown.py use it too)."""
    for _ in range(20):
        fn()
    sync()
    ts = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
        if i % sync_every == sync_every - 1:
            sync()
    sync()
    return statistics.median(ts) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ.setdefault("FUSEKIT_LIBRARY", str(ROOT / "target" / "release" / "libfusekit.so"))
    import fusekit
    from fusekit.ops import geodesic as G

    cuda = torch is not None and torch.cuda.is_available()
    B, D, R = 64, 512, 32
    rows = []
    if cuda:
        import bench_geodesic as bg
        from fusekit.torch.geodesic import christoffel  # (registers torch.ops.fusekit.christoffel)

        sync = torch.cuda.synchronize
        P = bg.problem(B, D, R, torch.float32)
        v, U, W = P["v"], P["U"], P["W"]
        out = torch.empty_like(v)
        fk = bg.FK(os.environ["FUSEKIT_LIBRARY"])
        a, b = torch.rand(256, device="cuda"), torch.rand(256, device="cuda")
        o = torch.empty_like(a)
        device = torch.cuda.get_device_name()
        cases = [
            ("torch.add(a, b, out=o), 256 f32", lambda: torch.add(a, b, out=o)),
            ("fusekit.add(a, b, out=o), torch, 256 f32", lambda: fusekit.add(a, b, out=o)),
            (f"christoffel fwd [{B},{D}] R={R}: ctypes, pre-wrapped", lambda: fk.christoffel(v, U, W, 5.0, out)),
            ("  fusekit.ops.geodesic.christoffel_forward", lambda: G.christoffel_forward(v, U, W, 5.0)),
            ("  torch.ops.fusekit.christoffel", lambda: christoffel(v, U, W, 5.0)),
            ("  PyTorch eager (4 kernels)", lambda: bg.chr_ref(v, U, W, 5.0)),
        ]
    else:
        sync = lambda: None  # noqa: E731
        B, D, R = 4, 16, 4  # (the CPU computes within the call: keep that small)
        rng = np.random.default_rng(0)
        a, b = rng.random(256, dtype=np.float32), rng.random(256, dtype=np.float32)
        o = np.empty_like(a)
        v = rng.standard_normal((B, D), dtype=np.float32)
        U = (rng.standard_normal((D, R)) / np.sqrt(D)).astype(np.float32)
        W = (rng.standard_normal((D, R)) * 2 / R).astype(np.float32)
        device = "CPU backend (no CUDA)"
        cases = [
            ("fusekit.add(a, b, out=o), numpy, 256 f32", lambda: fusekit.add(a, b, out=o)),
            (f"fusekit.ops.geodesic.christoffel_forward [{B},{D}] R={R}", lambda: G.christoffel_forward(v, U, W, 5.0)),
        ]
    print(f"device: {device}; host time per call (min over 3 of the median of 300 calls)")
    for name, fn in cases:
        us = min(host_us(fn, sync) for _ in range(3))
        rows.append(dict(case=name.strip(), host_us=us))
        print(f"{name:<52} {us:8.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
