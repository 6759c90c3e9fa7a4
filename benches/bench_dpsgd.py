#!/usr/bin/env python3
"""DP-SGD training step (issue 25 item 3): side by side in one run on the same MLP,
batch and clipping,

- the non-private step (``loss.backward()``, ``optimizer.step()``);
- fusekit's DP-SGD step (``fusekit.privacy.DPSGD``: ghost norms from fusekit's
  per-sample norm op, one backward to the layer outputs, one GEMM per clipped
  weight gradient, Gaussian noise); goal <= 1.25x the non-private step;
- Opacus 1.6's ghost clipping (``PrivacyEngine.make_private(...,
  grad_sample_mode="ghost")``: its DPLossFastGradientClipping runs two backward
  passes); goal: fusekit faster;
- fusekit's DP-SGD step with ``cuda_graph=True`` (the clipping, GEMMs and noise
  replayed from a CUDA graph: for small models, where the step is bound by the
  host);
- for information, fusekit with per-layer clipping (``clipping="per_layer"``: the
  fused ``dp_clipped_grad_sum`` op per weight). Skipped, with a note, when opacus is not importable
  (the GPU machine reaches no registry: put the wheel on PYTHONPATH, see
  scripts/gpu_suite.sh step bench_dpsgd).

Every row: the whole step (zero_grad, forward, loss, backward/clipping/noise,
SGD update), random data, median over samples of CUDA-event timings after
warm-up (wall-clock medians on the CPU). Before timing, the clipped gradients of
fusekit and Opacus (noise 0) are compared with each other.

    FUSEKIT_LIBRARY=target/release/libfusekit.so python3 benches/bench_dpsgd.py [--json PATH]
    python3 benches/bench_dpsgd.py --smoke      # tiny, on the CPU (scripts/test.sh)
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time
import warnings

import torch
from torch import nn
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))
sys.path.insert(0, HERE)
import bench_linalg  # noqa: E402  (its CUDA-event median)
import fusekit.privacy  # noqa: E402

try:
    from opacus import PrivacyEngine
    OPACUS = None
except ImportError as e:  # noqa: F841
    PrivacyEngine = None
    OPACUS = f"opacus not importable ({e})"

# Opacus warns on every make_private (secure RNG off) and every backward (full backward
# hooks with inputs that need no gradient): neither is about the comparison
warnings.filterwarnings("ignore", message="Secure RNG turned off")
warnings.filterwarnings("ignore", message="Full backward hook is firing")

CLASSES = 10
LR = 1e-3


def mlp(width, depth, device):
    layers = []
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*layers).to(device)


def median_ms(fn, device, samples, warmup, inner):
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        return bench_linalg.median_ms(fn, samples=samples, inner=inner, warmup=0)
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) * 1e3 / inner)
    return statistics.median(times)


def host_ms(fn, device, samples, warmup):
    """Median host time of one ``fn()`` started on an idle GPU (synchronised before,
    not after): the Python and launch cost of a step. Above the GPU time, the step
    is bound by the host."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(samples):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def non_private(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def fusekit_dp(model, x, y, c, sigma, seed=0, clipping="flat", cuda_graph=False):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    dp = fusekit.privacy.DPSGD(model, opt, max_grad_norm=c, noise_multiplier=sigma, seed=seed, clipping=clipping,
                               cuda_graph=cuda_graph)

    def step():
        opt.zero_grad(set_to_none=True)
        dp.step(F.cross_entropy(model(x), y))

    return step, dp


def opacus_dp(model, x, y, c, sigma):
    """Opacus's ghost clipping as its tutorial sets it up: make_private with
    grad_sample_mode="ghost" returns the wrapped model, a DPOptimizer, the
    DPLossFastGradientClipping criterion and the data loader (fixed batch: no Poisson
    sampling, so both sides see the same batch)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=x.shape[0])
    engine = PrivacyEngine()
    gsm, dp_opt, criterion, _ = engine.make_private(
        module=model, optimizer=opt, criterion=nn.CrossEntropyLoss(), data_loader=loader,
        noise_multiplier=sigma, max_grad_norm=c, grad_sample_mode="ghost", poisson_sampling=False)

    def step():
        dp_opt.zero_grad(set_to_none=True)
        loss = criterion(gsm(x), y)
        loss.backward()
        dp_opt.step()

    return step, gsm, dp_opt, criterion


def check_against_opacus(base, x, y, c):
    """fusekit's and Opacus's clipped mean gradients (noise 0) on the same model and
    batch; returns the largest relative difference over the parameters."""
    m1 = copy.deepcopy(base)
    dp = fusekit.privacy.DPSGD(m1, None, max_grad_norm=c, noise_multiplier=0.0)
    dp.backward(F.cross_entropy(m1(x), y))
    m2 = copy.deepcopy(base)
    _, gsm, dp_opt, criterion = opacus_dp(m2, x, y, c, 0.0)
    dp_opt.zero_grad(set_to_none=True)
    criterion(gsm(x), y).backward()
    dp_opt.pre_step()  # clip (already done by the two backward passes), add the (zero) noise, scale
    worst = 0.0
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        worst = max(worst, ((p1.grad - p2.grad).norm() / p2.grad.norm()).item())
    return worst, dp.clip_factors


def bench(device, batch, width, depth, samples, warmup, inner, c, sigma):
    torch.manual_seed(0)
    base = mlp(width, depth, device)
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, CLASSES, (batch,), device=device)
    cfg = f"B={batch} MLP {depth}x{width} f32"
    rows = {}

    # clip where some samples are clipped and some not (the median per-sample norm)
    probe = copy.deepcopy(base)
    dp = fusekit.privacy.DPSGD(probe, None, max_grad_norm=1.0, noise_multiplier=0.0)
    dp.backward(F.cross_entropy(probe(x), y))
    if c is None:
        c = dp.per_sample_norms.median().item()
    clipped = (dp.per_sample_norms > c).float().mean().item()
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; {cfg}; "
          f"max_grad_norm {c:.4g} ({clipped:.0%} of the samples clipped), noise_multiplier {sigma}")

    if PrivacyEngine is not None:
        diff, _ = check_against_opacus(base, x, y, c)
        print(f"  check: fusekit vs Opacus clipped gradients (noise 0): max relative difference {diff:.2e}")
        if diff > 1e-3:
            raise SystemExit(f"fusekit and Opacus disagree on the clipped gradient ({diff:.2e}): not the same job")

    host = {}
    fn = non_private(copy.deepcopy(base), x, y)
    rows["non_private"] = median_ms(fn, device, samples, warmup, inner)
    host["non_private"] = host_ms(fn, device, samples, warmup)
    fn = fusekit_dp(copy.deepcopy(base), x, y, c, sigma)[0]
    rows["fusekit"] = median_ms(fn, device, samples, warmup, inner)
    host["fusekit"] = host_ms(fn, device, samples, warmup)
    if device.type == "cuda":  # the clipping, GEMMs and noise replayed from a CUDA graph
        fn = fusekit_dp(copy.deepcopy(base), x, y, c, sigma, cuda_graph=True)[0]
        rows["fusekit_graph"] = median_ms(fn, device, samples, warmup, inner)
        host["fusekit_graph"] = host_ms(fn, device, samples, warmup)
    # per-layer clipping (fusekit's fused clipped-sum op per weight), each parameter at c / sqrt(#parameters)
    n_params = len(list(base.parameters()))
    rows["fusekit_per_layer"] = median_ms(
        fusekit_dp(copy.deepcopy(base), x, y, c / n_params ** 0.5, sigma, clipping="per_layer")[0], device, samples,
        warmup, inner)
    if PrivacyEngine is not None:
        fn = opacus_dp(copy.deepcopy(base), x, y, c, sigma)[0]
        rows["opacus_ghost"] = median_ms(fn, device, samples, warmup, inner)
        host["opacus_ghost"] = host_ms(fn, device, samples, warmup)
    np_ms = rows["non_private"]
    print(f"DP-SGD step {cfg}: non-private {np_ms:.3f} ms (host {host['non_private']:.3f} ms)")
    f_ms = rows["fusekit"]
    ok = "meets" if f_ms <= 1.25 * np_ms else "misses"
    print(f"DP-SGD step {cfg}: fusekit ghost {f_ms:.3f} ms = {f_ms / np_ms:.2f}x non-private "
          f"({ok} goal <= 1.25x; host {host['fusekit']:.3f} ms)")
    if "fusekit_graph" in rows:
        g_ms = rows["fusekit_graph"]
        ok = "meets" if g_ms <= 1.25 * np_ms else "misses"
        print(f"DP-SGD step {cfg}: fusekit ghost, cuda_graph=True {g_ms:.3f} ms = {g_ms / np_ms:.2f}x non-private "
              f"({ok} goal <= 1.25x; host {host['fusekit_graph']:.3f} ms)")
    p_ms = rows["fusekit_per_layer"]
    print(f"DP-SGD step {cfg}: fusekit per-layer clipping {p_ms:.3f} ms = {p_ms / np_ms:.2f}x non-private "
          f"(dp_clipped_grad_sum per weight)")
    if "opacus_ghost" in rows:
        o_ms = rows["opacus_ghost"]
        ok = "meets" if f_ms < o_ms else "misses"
        print(f"DP-SGD step {cfg}: Opacus ghost {o_ms:.3f} ms = {o_ms / np_ms:.2f}x non-private "
              f"(host {host['opacus_ghost']:.3f} ms); "
              f"fusekit {o_ms / f_ms:.2f}x faster ({ok} goal: faster)")
    else:
        print(f"DP-SGD step {cfg}: Opacus ghost skipped: {OPACUS}")
    return dict(config=cfg, batch=batch, width=width, depth=depth, max_grad_norm=c, noise_multiplier=sigma,
                clipped_fraction=clipped, ms=rows, host_ms=host)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (a check that it runs)")
    ap.add_argument("--configs", default="1024x2048x4,512x1024x4",
                    help="comma-separated BATCHxWIDTHxDEPTH (depth Linear layers, the last to 10 classes)")
    ap.add_argument("--max-grad-norm", type=float, default=None, help="default: the median per-sample norm")
    ap.add_argument("--noise-multiplier", type=float, default=1.0)
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.smoke:
        device, configs, samples, warmup, inner = torch.device("cpu"), [(32, 64, 3)], 3, 1, 1
    else:
        device = torch.device(args.device)
        configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
        samples, warmup, inner = args.samples, 5, 5
    results = [bench(device, b, w, d, samples, warmup, inner, args.max_grad_norm, args.noise_multiplier)
               for b, w, d in configs]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=str(device), opacus=OPACUS or "present", results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
