#!/usr/bin/env python3
"""Distributed fusekit.optim.Shampoo under torchrun, against the same optimizer on
one GPU. Run on a machine with two or more GPUs (scripts/gpu_suite.sh step
``shampoo_torchrun``):

    python3 -m torch.distributed.run --nproc_per_node=2 tests/dist/shampoo_torchrun.py \
        [--steps N] [--root-method all|auto|newton|checked]

Every rank (one process per GPU) builds the same MLP and the same data, so every
rank holds the same gradients, as after DDP's all-reduce. The distributed optimizer
(``distributed=fusekit.optim.init_distributed()``: the NCCL unique id goes through
torch.distributed's store, each process creates its rank of a fusekit communicator)
computes each rank's share of the inverse roots and all-gathers them; the same
optimizer on one GPU trains beside it in lockstep. ``all`` (the default) runs the
checked root path, then the fast (Newton) path. Checks, each failing the run with a
non-zero exit code:

1. at the first root step (settled): the statistics and every root equal one GPU's
   bit for bit;
2. every rank computed some roots and the shares add up to the single-GPU count;
3. all ranks end with the same parameters, bit for bit (fusekit all_reduce max and
   min of the parameter vector agree);
4. each rank's parameters equal the single-GPU training's bit for bit.

Bit for bit, on both root paths, because roots are computed in canonical batches
(``fusekit.optim.root_batches``, independent of the number of ranks) and each rank
computes whole batches: every root comes out of the same batch, and so the same
cuBLAS and cuSOLVER calls, as on one GPU. A tolerance would not do: until
2026-11-26 ranks computed single roots of one process's batches in batches of their
own, and cuBLAS picks its batched-GEMM kernel by batch count, so roots differed at
rounding level (2e-6); on two H200s that was enough to flip one ReLU unit of this
MLP whose pre-activation sat at the kink at step 5, which changed that step's
gradients of the first two layers by 1e-2 and the parameters by 8e-4 (a
discontinuity of ReLU training, not an error of either optimizer).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import fusekit
import fusekit.optim as fo


def build(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    sizes = [(96, 64), (192, 96), (10, 192)]  # 192 > max_preconditioner_dim=128: blocked
    ps = []
    for o, i in sizes:
        ps.append((torch.randn(o, i, generator=g) / i ** 0.5).to(device).requires_grad_())
        ps.append(torch.zeros(o, device=device).requires_grad_())
    return ps


def forward(ps, x):
    h = x
    for k in range(0, len(ps), 2):
        h = h @ ps[k].T + ps[k + 1]
        if k + 2 < len(ps):
            h = torch.relu(h)
    return h


def batches(steps, device):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(256, 64, generator=g).to(device)
        yield x, torch.randint(0, 10, (256,), generator=g).to(device)


def train_step(ps, opt, x, y):
    for p in ps:
        p.grad = None
    loss = torch.nn.functional.cross_entropy(forward(ps, x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def check_roots(opt, ref, ps, ref_ps):
    """The statistics and roots of the first root step, settled (state_dict() reads
    the deferred flags and redoes rejected roots, as the next step would), against
    one GPU's: a list of failures and max |d - s| / max |s| over the roots."""
    opt.state_dict()
    ref.state_dict()
    fails, worst = [], 0.0
    for p, q in zip(ps, ref_ps):
        a, b = opt.state[p], ref.state[q]
        for side in ("L", "R"):
            for k, (sd, ss, d, s) in enumerate(zip(a.get(side, []), b.get(side, []), a.get(side + "_root", []),
                                                   b.get(side + "_root", []))):
                name = f"{side}[{k}] of a {tuple(p.shape)} parameter"
                if not torch.equal(sd, ss):
                    fails.append(f"statistics {name} differ from one GPU")
                elif not torch.equal(d, s):
                    diff = float((d - s).abs().max()) / float(s.abs().max())
                    worst = max(worst, diff)
                    fails.append(f"root {name} differs from one GPU by {diff:.3e} of its largest entry")
    return fails, worst


def run(method, steps, comm, dev):
    """Distributed and single-GPU training in lockstep with ``root_method=method``;
    the list of failures and a summary line."""
    kw = dict(lr=0.01, betas=(0.9, 0.999), epsilon=1e-4, precondition_frequency=3, start_preconditioning_step=2,
              max_preconditioner_dim=128, grafting="adam", weight_decay=1e-3, root_method=method)
    ps, ref_ps = build(dev), build(dev)
    opt = fo.Shampoo(ps, distributed=comm, **kw)
    ref = fo.Shampoo(ref_ps, **kw)
    failures, losses, ref_losses, root_diff = [], [], [], None
    for t, (x, y) in enumerate(batches(steps, dev), start=1):
        losses.append(train_step(ps, opt, x, y))
        ref_losses.append(train_step(ref_ps, ref, x, y))
        if t == kw["start_preconditioning_step"]:
            f, root_diff = check_roots(opt, ref, ps, ref_ps)
            failures += f
    torch.cuda.synchronize()

    mine = torch.tensor([float(opt.root_stats["computed"])], device=dev)
    total = fusekit.all_reduce(mine, comm=comm.comm)
    if not (mine.item() > 0 and total.item() == ref.root_stats["computed"]):
        failures.append(f"root shares: this rank {mine.item()}, all ranks {total.item()}, "
                        f"single GPU {ref.root_stats['computed']}")
    flat = torch.cat([p.detach().reshape(-1) for p in ps])
    hi = fusekit.all_reduce(flat, op="max", comm=comm.comm)
    lo = fusekit.all_reduce(flat, op="min", comm=comm.comm)
    torch.cuda.synchronize()
    if not torch.equal(hi, lo):
        failures.append(f"ranks disagree: max |difference| {float((hi - lo).abs().max()):.3e}")
    ref_flat = torch.cat([p.detach().reshape(-1) for p in ref_ps])
    diff = float((flat - ref_flat).abs().max())
    if not torch.equal(flat, ref_flat):
        failures.append(f"distributed vs single GPU: max |difference| {diff:.3e} "
                        f"(of {float(ref_flat.abs().max()):.3e}); must be bit for bit")
    moved = float((ref_flat - torch.cat([p.detach().reshape(-1) for p in build(dev)])).abs().max())
    if not moved > 0:
        failures.append("the parameters did not move")
    line = (f"{method}: loss {losses[0]:.4f} -> {losses[-1]:.4f} (single GPU {ref_losses[-1]:.4f}); roots "
            f"computed here {int(mine.item())} of {ref.root_stats['computed']}; first root step max "
            f"|d - s| / max |s| = {root_diff if root_diff is None else f'{root_diff:.3e}'}; max |distributed - "
            f"single GPU| = {diff:.3e} "
            f"({'bit-identical' if diff == 0 else 'MISMATCH'})")
    return failures, line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--root-method", default="all", choices=["all", "auto", "newton", "checked"])
    args = ap.parse_args()
    dist.init_process_group("gloo")  # the store and the rank bookkeeping; fusekit's NCCL does the work
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    comm = fo.init_distributed(dev)
    failures = []
    for method in (["checked", "newton"] if args.root_method == "all" else [args.root_method]):
        f, line = run(method, args.steps, comm, dev)
        print(f"rank {rank}/{world} on {torch.cuda.get_device_name(dev)}: {line}", flush=True)
        failures += [f"{method}: {x}" for x in f]
    for f in failures:
        print(f"rank {rank}: FAIL {f}", flush=True)
    comm.comm.close()
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        sys.exit(1)
    if rank == 0:
        print(f"shampoo_torchrun: passed ({world} ranks, {args.steps} steps)")


if __name__ == "__main__":
    main()
