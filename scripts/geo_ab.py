#!/usr/bin/env python3
"""A/B timing of fusekit libraries on the geodesic benchmark rows, on a GPU machine.

Runs `benches/bench_geodesic.py --only REGEX --no-compile --no-eager --no-warmup`
once per library and pass, alternating the libraries within each pass (so that a
drift of the machine's clocks over the run hits every variant alike), and prints,
per row, each library's median single-call time and b2b time (GPU time per call of
back-to-back calls) in every pass, and the ratio of each library's best b2b to the
first library's. Differences below the spread between a library's own passes are
noise. Every row is still checked against float64 by the benchmark; a WRONG row
makes the exit status non-zero.

    python3 scripts/geo_ab.py --only 'christoffel bwd|leapfrog bwd f32' \\
        [--passes 2] [--reps 30] [--log-dir DIR] base=path/to/a.so new=path/to/b.so
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROW = re.compile(r"^(?P<case>.+?)\s+fusekit\s+(?P<ms>[0-9.]+) ms \(b2b (?P<b2b>[0-9.]+)\).*err \S+ (?P<ok>ok|WRONG)$")


def run_one(lib, only, reps, log):
    env = dict(os.environ, FUSEKIT_LIBRARY=str(lib), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(ROOT / "benches" / "bench_geodesic.py"), "--only", only, "--no-compile",
           "--no-eager", "--no-warmup", "--reps", str(reps)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    log.write(f"$ FUSEKIT_LIBRARY={lib} {' '.join(cmd)}\n{p.stdout}{p.stderr}\n")
    rows = {}
    for line in p.stdout.splitlines():
        m = ROW.match(line.strip())
        if m:
            rows[m["case"].strip()] = (float(m["ms"]), float(m["b2b"]), m["ok"] == "ok")
    if p.returncode != 0 and not rows:
        print(p.stdout[-2000:], p.stderr[-2000:], file=sys.stderr)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", required=True, help="regular expression of the benchmark rows")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--log-dir", default=os.environ.get("OUT", "."))
    ap.add_argument("libs", nargs="+", help="LABEL=PATH of each library; the first is the reference")
    args = ap.parse_args()
    libs = [tuple(x.split("=", 1)) for x in args.libs]
    res = {}  # (label, case) -> [(ms, b2b, ok), ...]
    cases = []
    log_path = pathlib.Path(args.log_dir) / "geo_ab.log"
    with open(log_path, "a") as log:
        for p in range(args.passes):
            for label, lib in libs:
                for case, r in run_one(lib, args.only, args.reps, log).items():
                    if case not in cases:
                        cases.append(case)
                    res.setdefault((label, case), []).append(r)
    wrong = any(not r[2] for rs in res.values() for r in rs)
    ref = libs[0][0]
    print(f"\nA/B ({args.passes} passes, alternating; single-call median / b2b ms per pass; log {log_path})")
    for case in cases:
        print(case)
        base = min((r[1] for r in res.get((ref, case), [])), default=float("nan"))
        for label, _ in libs:
            rs = res.get((label, case), [])
            cells = "  ".join(f"{r[0]:.4f}/{r[1]:.4f}{'' if r[2] else ' WRONG'}" for r in rs)
            best = min((r[1] for r in rs), default=float("nan"))
            print(f"  {label:<12} {cells}   best b2b {best:.4f} ({best / base:.3f}x)")
    if not cases:
        print("no rows matched (or every run failed; see the log)")
    return 1 if wrong or not cases else 0


if __name__ == "__main__":
    sys.exit(main())
