"""PyTorch's reference for fusekit's all-reduce benchmark (benches/runtime.rs).

torch.distributed with the NCCL backend, one process per GPU (torch.multiprocessing
spawn, a TCP rendezvous on localhost), all-reduce (sum, in place) of 1 GiB of
float32 per GPU: 5 warm-up iterations, then 20 timed ones (CUDA events around each,
the maximum over ranks, the median over iterations). Prints the time, the algorithm
bandwidth (bytes / time) and the bus bandwidth (2 (n - 1) / n * bytes / time, as
nccl-tests report it), the number fusekit's `all-reduce ... bus bandwidth` row is
compared with (goal: fusekit >= 90% of this).

    python3 benches/allreduce_torch.py [--gpus N] [--gib 1] [--json out.json]
        [--fusekit-json bench_runtime.json]   # also print fusekit / torch

NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as on the shared test machines.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ["NCCL_NVLS_ENABLE"] = "0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, nbytes: int, warmup: int, iters: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        device_id=torch.device("cuda", rank),
    )
    x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(warmup + iters):
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    # the maximum over ranks of each iteration's time
    t = torch.tensor(times, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    # the values: (warmup + iters) in-place sums of ones over `world` ranks
    want = float(world) ** (warmup + iters)
    got = x[0].item()
    ok = abs(got - want) <= want * 1e-6
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"times_ms": t.tolist(), "check": ok, "got": got, "want": want}, f)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=2, help="processes (one GPU each); default 2")
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of float32 per GPU; default 1")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", help="write the result row here")
    ap.add_argument("--fusekit-json", help="benches/runtime.rs --json output to compare with")
    args = ap.parse_args()

    import torch
    import torch.multiprocessing as mp

    n = torch.cuda.device_count()
    if n < args.gpus or args.gpus < 2:
        print(f"SKIPPED: needs {max(args.gpus, 2)} GPUs, found {n}")
        return 0
    nbytes = int(args.gib * (1 << 30)) // 4 * 4
    out = f"/tmp/allreduce_torch_{os.getpid()}.json"
    mp.spawn(_worker, args=(args.gpus, _free_port(), nbytes, args.warmup, args.iters, out), nprocs=args.gpus, join=True)
    with open(out) as f:
        res = json.load(f)
    os.remove(out)
    t = statistics.median(res["times_ms"])
    algbw = nbytes / (t * 1e-3) / 1e9
    busbw = algbw * 2 * (args.gpus - 1) / args.gpus
    print(
        f"torch.distributed all-reduce {nbytes / (1 << 30):.2f} GiB f32 over {args.gpus} GPUs "
        f"(NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, in place, sum): {t:.3f} ms, "
        f"algbw {algbw:.1f} GB/s, busbw {busbw:.1f} GB/s; values {'ok' if res['check'] else 'WRONG'}"
    )
    row = {"name": f"torch all-reduce {args.gib:g} GiB f32, {args.gpus} GPUs, bus bandwidth", "value": busbw, "unit": "GB/s"}
    if args.json:
        with open(args.json, "w") as f:
            json.dump([row], f, indent=1)
    if args.fusekit_json:
        with open(args.fusekit_json) as f:
            rows = json.load(f)
        fk = [r for r in rows if r["name"].startswith("all-reduce 1 GiB f32")]
        if fk:
            ratio = fk[0]["value"] / busbw
            print(f"fusekit busbw {fk[0]['value']:.1f} GB/s ({fk[0]['name']}) = {ratio * 100:.1f}% of torch's (goal >= 90%)")
        else:
            print(f"no all-reduce row in {args.fusekit_json}")
    return 0 if res["check"] else 1


if __name__ == "__main__":
    sys.exit(main())
