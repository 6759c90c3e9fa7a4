#!/usr/bin/env python3
"""A differentially private classifier with fusekit.privacy.DPSGD (docs/privacy.md).

Synthetic data: Gaussian clusters in 20 dimensions, 4 classes, split into a
training and a test set. An MLP is trained with DP-SGD (Poisson sampling of each
batch, per-sample clipping to --max-grad-norm through ghost norms, Gaussian noise
of --noise-multiplier times that norm) and, for comparison, with plain SGD from the
same initialisation. Prints both loss curves and the test accuracies, writes a PNG
of the curves (matplotlib), and fails if DP-SGD did not learn.

No privacy accounting is done here (fusekit has none): the (epsilon, delta) of a
run follows from the sampling rate, the noise multiplier and the number of steps
with an accountant such as Opacus's RDP accountant.

    python3 examples/dp_sgd_classifier.py [--device cpu|cuda] [--steps 200] [--out dp_sgd_classifier.png] [--fused]
"""
import argparse
import copy
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import fusekit.privacy  # noqa: E402

FEATURES, CLASSES = 20, 4


def make_data(n, centers, gen, device):
    """Samples of the clusters around ``centers`` [CLASSES, FEATURES] (unit noise)."""
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    x = centers[y] + torch.randn(n, FEATURES, generator=gen)
    return x.to(device), y.to(device)


def make_model(fused, device):
    if fused:
        from fusekit.nn import FusedLinear

        hidden = [FusedLinear(FEATURES, 64, activation="relu"), FusedLinear(64, 64, activation="relu")]
    else:
        hidden = [nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*hidden, nn.Linear(64, CLASSES)).to(device)


@torch.no_grad()
def evaluate(model, x, y):
    out = model(x)
    return F.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()


def train(model, x, y, args, private, gen):
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    q = args.batch / x.shape[0]  # Poisson sampling rate
    dp = fusekit.privacy.DPSGD(model, opt, max_grad_norm=args.max_grad_norm, noise_multiplier=args.noise_multiplier,
                               expected_batch_size=args.batch, seed=args.seed) if private else None
    curve = []
    for step in range(args.steps + 1):
        if step % args.log_every == 0:
            curve.append((step, evaluate(model, x, y)[0]))
        if step == args.steps:
            break
        mask = torch.rand(x.shape[0], generator=gen) < q
        idx = mask.nonzero().squeeze(1).to(x.device)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        if dp is not None:
            dp.step(loss)  # clipped per-sample gradients + noise, divided by the expected batch size
        else:
            loss.backward()
            opt.step()
    if dp is not None:
        dp.remove()
    return curve


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default="dp_sgd_classifier.png", help="the PNG to write ('none': no plot)")
    ap.add_argument("--fused", action="store_true", help="hidden layers as fusekit.nn.FusedLinear")
    ap.add_argument("--batch", type=int, default=256, help="expected batch size (Poisson sampling)")
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--noise-multiplier", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    gen = torch.Generator().manual_seed(args.seed)
    centers = torch.randn(CLASSES, FEATURES, generator=gen) * 0.5  # overlapping clusters
    x, y = make_data(4096, centers, gen, args.device)
    x_test, y_test = make_data(2048, centers, gen, args.device)
    torch.manual_seed(args.seed)
    init = make_model(args.fused, args.device)
    curves, acc = {}, {}
    for name, private in (("DP-SGD", True), ("SGD", False)):
        model = copy.deepcopy(init)
        curves[name] = train(model, x, y, args, private, torch.Generator().manual_seed(args.seed + 2))
        acc[name] = evaluate(model, x_test, y_test)[1]

    print(f"DP-SGD: max_grad_norm {args.max_grad_norm}, noise_multiplier {args.noise_multiplier}, "
          f"expected batch {args.batch} of {x.shape[0]}, {args.steps} steps, device {args.device}")
    print(f"{'step':>6} {'DP-SGD loss':>12} {'SGD loss':>10}")
    for (s, dl), (_, sl) in zip(curves["DP-SGD"], curves["SGD"]):
        print(f"{s:>6} {dl:>12.4f} {sl:>10.4f}")
    print(f"test accuracy: DP-SGD {acc['DP-SGD']:.3f}, SGD {acc['SGD']:.3f} (chance {1 / CLASSES:.2f})")

    if args.out.lower() != "none":
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, curve in curves.items():
            ax.plot([s for s, _ in curve], [v for _, v in curve], marker="o", ms=3,
                    label=f"{name} (test acc {acc[name]:.2f})")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.set_title(f"DP-SGD (C={args.max_grad_norm}, sigma={args.noise_multiplier}) vs SGD")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out, dpi=100)
        print(f"wrote {args.out}")

    first, last = curves["DP-SGD"][0][1], curves["DP-SGD"][-1][1]
    if args.steps >= 50 and not (last < 0.8 * first and acc["DP-SGD"] > 0.6):
        print(f"DP-SGD did not learn: loss {first:.4f} -> {last:.4f}, test accuracy {acc['DP-SGD']:.3f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
