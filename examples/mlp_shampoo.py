#!/usr/bin/env python3
"""An MLP of fusekit.nn.FusedLinear layers trained with fusekit.optim.Shampoo on
synthetic data (labels from a random teacher network), next to the same MLP
trained with torch.optim.Adam from the same start. Prints both loss curves and
writes them as a PNG.

    python3 examples/mlp_shampoo.py [--device cpu|cuda] [--steps 120] [--out mlp_shampoo.png]

Exits with status 1 if Shampoo's loss does not fall below half its start.
"""
import argparse
import copy
import sys

import torch

import fusekit.optim
from fusekit.nn import FusedLinear


def mlp(dims, device):
    layers = [FusedLinear(i, o, activation="relu" if k < len(dims) - 2 else "none", device=device)
              for k, (i, o) in enumerate(zip(dims[:-1], dims[1:]))]
    return torch.nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", default="mlp_shampoo.png")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)

    dims = [32, 128, 128, 10]
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10)).to(dev)
    model = mlp(dims, dev)
    baseline = copy.deepcopy(model)
    # 128-wide layers, blocks of at most 64: each hidden weight is preconditioned as 2x2 blocks
    opt = fusekit.optim.Shampoo(model.parameters(), lr=3e-3, betas=(0.9, 0.999), epsilon=1e-8,
                                precondition_frequency=10, start_preconditioning_step=5,
                                max_preconditioner_dim=64, grafting="adam", weight_decay=1e-4)
    adam = torch.optim.AdamW(baseline.parameters(), lr=3e-3, weight_decay=1e-4)

    gen = torch.Generator().manual_seed(1)
    curves = {"fusekit Shampoo": [], "torch AdamW": []}
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=gen).to(dev)
        with torch.no_grad():
            y = teacher(x).argmax(1)
        for name, m, o in (("fusekit Shampoo", model, opt), ("torch AdamW", baseline, adam)):
            o.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            o.step()
            curves[name].append(float(loss.detach()))
        if step % max(1, args.steps // 15) == 0 or step == args.steps - 1:
            print(f"step {step:4d}  Shampoo {curves['fusekit Shampoo'][-1]:.4f}  AdamW {curves['torch AdamW'][-1]:.4f}")
    print(f"roots: {opt.root_stats}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, c in curves.items():
        ax.plot(c, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_yscale("log")
    ax.set_title(f"MLP {'-'.join(map(str, dims))} of FusedLinear ({args.device})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")
    s = curves["fusekit Shampoo"]
    if not s[-1] < 0.5 * s[0]:
        print(f"FAIL: Shampoo's loss went from {s[0]:.4f} to {s[-1]:.4f}, not below half", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
