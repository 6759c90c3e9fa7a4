#!/usr/bin/env python3
"""Whether two fusekit libraries give bit-identical geodesic backwards, on a GPU machine.

For a change that claims to keep every result bit for bit (a new way to compute the
same values), this runs the Christoffel backward, the leapfrog backward (from the
trajectory and recomputing) and the leapfrog forward (strict and TF32, T = 1 and T, with
and without the trajectory, also at an odd shape) through both libraries on the same
tensors, at the benchmark shape and at clamp bounds `c` that put many elements at or
near the clamp (so that a mask decided differently would show), and compares the
outputs with `torch.equal`. It also prints each library's b2b time per case (`bench_geodesic.b2b_ms`:
median of 5 runs of 10 back-to-back calls). Exit status 1 when any output differs.

    python3 scripts/geo_same.py base=path/to/a.so new=path/to/b.so [--ops chr,lf,lffwd] [--B 65536]
"""
import argparse
import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benches"))
import bench_geodesic as bg  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=65536)
    ap.add_argument("--D", type=int, default=512)
    ap.add_argument("--R", type=int, default=32)
    ap.add_argument("--T", type=int, default=8)
    ap.add_argument("--ops", default="chr,lf", help="which ops: chr (backward), lf (backward), lffwd (forward), comma-separated")
    ap.add_argument("libs", nargs=2, help="LABEL=PATH of the two libraries")
    args = ap.parse_args()
    labels = [s.split("=", 1)[0] for s in args.libs]
    fks = [bg.FK(s.split("=", 1)[1]) for s in args.libs]
    B, D, R, T = args.B, args.D, args.R, args.T
    p = bg.problem(B, D, R, torch.float32)
    x, v, f, U, W, mu, g, gx, gv = (p[k] for k in ("x", "v", "f", "U", "W", "mu", "g", "gx", "gv"))
    dt = 0.05
    bad = 0

    def compare(name, outs_fn):
        nonlocal bad
        outs, times = [], []
        for fk in fks:
            o, run = outs_fn(fk)
            run()
            torch.cuda.synchronize()
            outs.append([t.clone() for t in o])
            times.append(bg.b2b_ms(run, n=10))
        same = all(torch.equal(a, b) for a, b in zip(*outs))
        diff = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in zip(*outs))
        bad += not same
        t = "  ".join(f"{lab} {ms:.4f} ms" for lab, ms in zip(labels, times))
        print(f"{name:<44} {'identical' if same else f'DIFFERENT (max rel {diff:.2e})':<28} {t}", flush=True)

    ops = args.ops.split(",")
    for c in (5.0, 1.0, 0.6, math.inf) if "chr" in ops else ():
        def chr_case(fk, c=c):
            dv, dU, dW = (torch.full_like(t, float("nan")) for t in (v, U, W))
            return (dv, dU, dW), lambda: fk.christoffel_backward(v, U, W, g, c, dv, dU, dW)
        compare(f"christoffel bwd c={c}", chr_case)

    for c in (5.0, 0.6) if "lf" in ops else ():
        traj = torch.empty(T, 2, B, D, device="cuda")
        xo, vo = torch.empty_like(x), torch.empty_like(v)
        fks[0].leapfrog(x, v, f, U, W, mu, dt, T, c, xo, vo, traj)
        for use_traj in (True, False):
            def lf_case(fk, c=c, use_traj=use_traj):
                dx, dv, df, dU, dW = (torch.full_like(t, float("nan")) for t in (x, v, f, U, W))
                tr = traj if use_traj else None
                return (dx, dv, df, dU, dW), lambda: fk.leapfrog_backward(v, f, U, W, mu, dt, T, c, tr, gx, gv, dx, dv,
                                                                          df, dU, dW)
            compare(f"leapfrog bwd T={T} c={c} {'traj' if use_traj else 'recompute'}", lf_case)
    if "lffwd" in ops:
        # the benchmark shape, and an odd one (partial tiles and feature groups, R < RP)
        # (8-byte rows) and one whose rows are 4-byte aligned only
        shapes = [("", (x, v, f, U, W, mu))]
        for B2, D2, R2 in ((4099, 500, 29), (1001, 499, 32)):
            p2 = bg.problem(B2, D2, R2, torch.float32, seed=1)
            shapes.append((f" B={B2} D={D2} R={R2}", tuple(p2[k] for k in ("x", "v", "f", "U", "W", "mu"))))
        for sname, (x_, v_, f_, U_, W_, mu_) in shapes:
            for flags, fname in ((0, "strict"), (1, "TF32")):
                for c in (5.0, 0.6):
                    for TT, with_traj in ((1, False), (T, False), (T, True)):
                        def fwd_case(fk, c=c, TT=TT, with_traj=with_traj, flags=flags, a=(x_, v_, f_, U_, W_, mu_)):
                            xo, vo = (torch.full_like(a[0], float("nan")) for _ in range(2))
                            tr = torch.full((TT, 2) + tuple(a[0].shape), float("nan"), device="cuda") if with_traj else None
                            outs = (xo, vo) + ((tr,) if with_traj else ())
                            return outs, lambda: fk.leapfrog(*a, dt, TT, c, xo, vo, tr, flags)
                        compare(f"leapfrog fwd {fname} T={TT}{' traj' if with_traj else ''} c={c}{sname}", fwd_case)
    print("all identical" if bad == 0 else f"{bad} case(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
