#!/usr/bin/env python3
"""Distributed fusekit.optim.Shampoo under torchrun, against the same optimizer on
one GPU. Run on a machine with two or more GPUs (scripts/gpu_suite.sh step
``shampoo_torchrun``):

    python3 -m torch.distributed.run --nproc_per_node=2 tests/dist/shampoo_torchrun.py [--steps N]

Every rank (one process per GPU) builds the same MLP and the same data, so every
rank holds the same gradients, as after DDP's all-reduce. The distributed optimizer
(``distributed=fusekit.optim.init_distributed()``: the NCCL unique id goes through
torch.distributed's store, each process creates its rank of a fusekit communicator)
computes each rank's share of the inverse roots and all-gathers them. Checks, each
failing the run with a non-zero exit code:

1. every rank computed some roots and the shares add up to the single-GPU count;
2. all ranks end with the same parameters, bit for bit (fusekit all_reduce max and
   min of the parameter vector agree);
3. each rank's parameters equal those of the same training with the single-GPU
   optimizer on its own GPU, within rtol 1e-6 of the largest entry. Expected: bit
   for bit, as the same kernels run on the same GPU model and the roots are only
   moved; the tolerance leaves room for cuBLAS/cuSOLVER choosing another algorithm
   on another device, a rounding-level (~1e-7) change in a root that ten steps of a
   norm-grafted update do not amplify beyond 1e-6 of the parameters' scale.
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


def train(ps, opt, steps, device):
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(256, 64, generator=g).to(device)
        y = torch.randint(0, 10, (256,), generator=g).to(device)
        for p in ps:
            p.grad = None
        loss = torch.nn.functional.cross_entropy(forward(ps, x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    dist.init_process_group("gloo")  # the store and the rank bookkeeping; fusekit's NCCL does the work
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    comm = fo.init_distributed(dev)
    kw = dict(lr=0.05, betas=(0.9, 0.999), epsilon=1e-6, precondition_frequency=3, start_preconditioning_step=2,
              max_preconditioner_dim=128, grafting="adam", weight_decay=1e-3)

    ps = build(dev)
    opt = fo.Shampoo(ps, distributed=comm, **kw)
    losses = train(ps, opt, args.steps, dev)
    ref_ps = build(dev)
    ref = fo.Shampoo(ref_ps, **kw)
    ref_losses = train(ref_ps, ref, args.steps, dev)
    torch.cuda.synchronize()

    failures = []
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
    scale = float(ref_flat.abs().max())
    if not diff <= 1e-6 * scale:
        failures.append(f"distributed vs single GPU: max |difference| {diff:.3e} > 1e-6 * {scale:.3e}")
    moved = float((ref_flat - torch.cat([p.detach().reshape(-1) for p in build(dev)])).abs().max())
    if not moved > 0:
        failures.append("the parameters did not move")
    print(f"rank {rank}/{world} on {torch.cuda.get_device_name(dev)}: loss {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"(single GPU {ref_losses[-1]:.4f}); roots computed here {int(mine.item())} of "
          f"{ref.root_stats['computed']}; max |distributed - single GPU| = {diff:.3e} "
          f"({'bit-identical' if diff == 0 else 'within tolerance' if not failures else 'MISMATCH'})", flush=True)
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
