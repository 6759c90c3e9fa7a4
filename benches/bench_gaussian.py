#!/usr/bin/env python3
"""GPU benchmark rows of the Gaussian field family: fusekit vs PyTorch eager vs
torch.compile, with each op's floor (docs/gaussian.md derives them).

fusekit is called through ctypes on torch's data pointers (fk_buffer_wrap, no copy)
and torch's current stream (fk_stream_wrap), so no Python package is needed:
FUSEKIT_LIBRARY (default target/release/libfusekit.so) names the library.

Correctness first: every fusekit output, and the torch references, against torch
float64 on the same inputs (relative error ||out - ref|| / ||ref||). Timings: the
median of per-call CUDA-event timings after warm-up.

    python3 benches/bench_gaussian.py [--B 16384] [--N 4096] [--reps 50] [--json PATH]
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys

import torch

FK_ABI_VERSION = 1000
FK_DEVICE_CUDA = 2
FK_DTYPE = {torch.float32: 3, torch.float64: 4}
EPS = 1e-6
# Reference FP32 FFMA rate of the H100 test machine (BENCHMARKS.md's floors use it too).
FP32_TFLOPS = 51.0
# FP32 instructions per (point, Gaussian) pair (docs/gaussian.md).
INSTR_FIELD_FWD = 13
INSTR_FIELD_BWD = 40


# ---------------------------------------------------------------- fusekit via ctypes
def load_fusekit():
    path = os.environ.get("FUSEKIT_LIBRARY") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "libfusekit.so")
    lib = ctypes.CDLL(path)
    P = ctypes.c_void_p
    lib.fk_last_error_message.restype = ctypes.c_char_p
    lib.fk_status_string.restype = ctypes.c_char_p
    lib.fk_context_create.argtypes = [ctypes.c_uint32, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(P)]
    lib.fk_stream_wrap.argtypes = [P, P, ctypes.POINTER(P)]
    lib.fk_buffer_wrap.argtypes = [P, P, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64),
                                   ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(P)]
    lib.fk_buffer_destroy.argtypes = [P]
    lib.fk_mahalanobis_forward.argtypes = [P, P, P, ctypes.c_double, P, P]
    lib.fk_mahalanobis_backward.argtypes = [P, P, P, ctypes.c_double, P, P, P, P, P, P]
    lib.fk_gaussian_field_forward.argtypes = [P, P, P, P, ctypes.c_double, P, P]
    lib.fk_gaussian_field_backward.argtypes = [P, P, P, P, ctypes.c_double, P, P, P, P, P, P, P]
    lib.fk_gaussian_backward_workspace_size.argtypes = [P, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64,
                                                        ctypes.POINTER(ctypes.c_size_t)]
    return lib


class Fusekit:
    def __init__(self):
        self.lib = load_fusekit()
        self.ctx = ctypes.c_void_p()
        self.check(self.lib.fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, torch.cuda.current_device(),
                                              ctypes.byref(self.ctx)))
        self.stream = ctypes.c_void_p()
        self.check(self.lib.fk_stream_wrap(self.ctx, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                                           ctypes.byref(self.stream)))
        self.keep = []

    def check(self, status):
        if status != 0:
            raise RuntimeError("fusekit: %s: %s" % (self.lib.fk_status_string(status).decode(),
                                                    self.lib.fk_last_error_message().decode()))

    def wrap(self, t):
        """An fk_buffer over a contiguous torch tensor (no copy), kept alive with it."""
        if t is None:
            return None
        assert t.is_contiguous()
        shape = (ctypes.c_int64 * max(t.dim(), 1))(*t.shape)
        h = ctypes.c_void_p()
        self.check(self.lib.fk_buffer_wrap(self.ctx, ctypes.c_void_p(t.data_ptr()), FK_DTYPE[t.dtype], t.dim(),
                                           shape, None, ctypes.byref(h)))
        self.keep.append((h, t))
        return h

    def workspace(self, dtype, B, N, device="cuda"):
        n = ctypes.c_size_t()
        self.check(self.lib.fk_gaussian_backward_workspace_size(self.ctx, FK_DTYPE[dtype], B, N, ctypes.byref(n)))
        return torch.empty(max(1, (n.value + 7) // 8), dtype=torch.float64, device=device)


# ---------------------------------------------------------------- PyTorch references
def maha_torch(points, means, chol, eps):
    """Forward substitution, broadcast over [B,N] (the source model's formulation)."""
    L = torch.tril(chol)
    d = points[:, None, :] - means[None, :, :]
    l00 = L[:, 0, 0] + eps
    l11 = L[:, 1, 1] + eps
    l22 = L[:, 2, 2] + eps
    y0 = d[..., 0] / l00
    y1 = (d[..., 1] - L[:, 1, 0] * y0) / l11
    y2 = (d[..., 2] - L[:, 2, 0] * y0 - L[:, 2, 1] * y1) / l22
    return y0 * y0 + y1 * y1 + y2 * y2


def field_torch(points, means, chol, weights, eps):
    return (weights * torch.exp(-0.5 * maha_torch(points, means, chol, eps))).sum(-1)


def field_grads(fn, points, means, chol, weights, dout):
    ins = [t.detach().requires_grad_(True) for t in (points, means, chol, weights)]
    out = fn(*ins, EPS)
    return torch.autograd.grad(out, ins, dout)


def maha_grads(fn, points, means, chol, g):
    ins = [t.detach().requires_grad_(True) for t in (points, means, chol)]
    out = fn(*ins, EPS)
    return torch.autograd.grad(out, ins, g)


# ---------------------------------------------------------------- helpers
def median_ms(fn, reps, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for e0, e1 in ev:
        e0.record()
        fn()
        e1.record()
    torch.cuda.synchronize()
    return statistics.median(e0.elapsed_time(e1) for e0, e1 in ev)


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    num = torch.linalg.vector_norm(out - ref).item()
    den = torch.linalg.vector_norm(ref).item()
    return num / den if den else num


def problem(B, N, dtype, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    u = lambda *s, lo=-1.0, hi=1.0: torch.rand(*s, generator=g, device=device, dtype=torch.float64) * (hi - lo) + lo
    points = u(B, 3)
    means = u(N, 3)
    chol = u(N, 3, 3, lo=-0.05, hi=0.05)  # small Gaussians in the unit cube
    idx = torch.arange(3, device=device)
    chol[:, idx, idx] = u(N, 3, lo=0.05, hi=0.15)
    weights = u(N, lo=-0.5, hi=1.0)
    return [t.to(dtype).contiguous() for t in (points, means, chol, weights)]


def write_bandwidth(nbytes):
    x = torch.empty(nbytes // 4, device="cuda", dtype=torch.float32)
    ms = median_ms(lambda: x.fill_(1.0), reps=20)
    return nbytes / (ms * 1e-3)


def read_bandwidth(nbytes):
    x = torch.rand(nbytes // 4, device="cuda", dtype=torch.float32)
    out = torch.empty((), device="cuda")
    ms = median_ms(lambda: torch.sum(x.view(-1), dim=0, out=out), reps=20)
    return nbytes / (ms * 1e-3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=16384)
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--dtypes", default="f32,f64")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    B, N = args.B, args.N
    fk = Fusekit()
    dev = torch.cuda.get_device_name()
    print(f"device {dev}; B = {B} points, N = {N} Gaussians, eps = {EPS}")
    rows = []
    pairs = B * N
    field_c = torch.compile(field_torch) if not args.no_compile else None
    maha_c = torch.compile(maha_torch) if not args.no_compile else None
    for dname in args.dtypes.split(","):
        dtype = {"f32": torch.float32, "f64": torch.float64}[dname]
        points, means, chol, weights = problem(B, N, dtype)
        p64 = [t.double() for t in (points, means, chol, weights)]
        dout = torch.rand(B, device="cuda", dtype=torch.float64).sub_(0.5)
        gmat = torch.rand(B, N, device="cuda", dtype=torch.float64).sub_(0.5)
        dout_t, gmat_t = dout.to(dtype), gmat.to(dtype)
        ref_field = field_torch(*p64, EPS)
        ref_fgrads = field_grads(field_torch, *p64, dout_t.double())
        ws = fk.workspace(dtype, B, N)
        # fusekit buffers (wrapped once)
        hp, hm, hc, hw = (fk.wrap(t) for t in (points, means, chol, weights))
        out_f = torch.full((B,), float("nan"), device="cuda", dtype=dtype)
        out_m = torch.full((B, N), float("nan"), device="cuda", dtype=dtype)
        grads = [torch.full(s, float("nan"), device="cuda", dtype=dtype) for s in ((B, 3), (N, 3), (N, 3, 3), (N,))]
        h_of, h_om, h_dout, h_g, h_ws = (fk.wrap(t) for t in (out_f, out_m, dout_t, gmat_t, ws))
        hg = [fk.wrap(t) for t in grads]
        lib, st = fk.lib, fk.stream
        run = {
            "field_forward": lambda: fk.check(lib.fk_gaussian_field_forward(hp, hm, hc, hw, EPS, h_of, st)),
            "field_backward": lambda: fk.check(lib.fk_gaussian_field_backward(
                hp, hm, hc, hw, EPS, h_dout, hg[0], hg[1], hg[2], hg[3], h_ws, st)),
            "mahalanobis_forward": lambda: fk.check(lib.fk_mahalanobis_forward(hp, hm, hc, EPS, h_om, st)),
            "mahalanobis_backward": lambda: fk.check(lib.fk_mahalanobis_backward(
                hp, hm, hc, EPS, h_g, hg[0], hg[1], hg[2], h_ws, st)),
        }
        # ---- correctness vs float64
        run["field_forward"]()
        run["field_backward"]()
        torch.cuda.synchronize()
        errs = {"field_forward": rel_err(out_f, ref_field)}
        errs["field_backward"] = max(rel_err(a, b) for a, b in zip(grads, ref_fgrads))
        names = ["dpoints", "dmeans", "dchol", "dweights"]
        for nm, a, b in zip(names, grads, ref_fgrads):
            print(f"  {dname} field_backward {nm}: rel err vs f64 {rel_err(a, b):.2e}")
        del ref_fgrads
        run["mahalanobis_forward"]()
        torch.cuda.synchronize()
        ref_m = maha_torch(*p64[:3], EPS)
        errs["mahalanobis_forward"] = rel_err(out_m, ref_m)
        del ref_m
        run["mahalanobis_backward"]()
        torch.cuda.synchronize()
        ref_mg = maha_grads(maha_torch, *p64[:3], gmat_t.double())
        errs["mahalanobis_backward"] = max(rel_err(a, b) for a, b in zip(grads[:3], ref_mg))
        del ref_mg
        torch.cuda.empty_cache()
        # ---- timings
        esize = torch.finfo(dtype).bits // 8
        wbw, rbw = write_bandwidth(pairs * esize), read_bandwidth(pairs * esize)
        floors = {
            "field_forward": (pairs * INSTR_FIELD_FWD * 2 / (FP32_TFLOPS * 1e12) * 1e3 if dtype == torch.float32
                              else None, f"{INSTR_FIELD_FWD} FP32 instr/pair at {FP32_TFLOPS} TFLOP/s"),
            "field_backward": (pairs * INSTR_FIELD_BWD * 2 / (FP32_TFLOPS * 1e12) * 1e3 if dtype == torch.float32
                               else None, f"{INSTR_FIELD_BWD} FP32 instr/pair at {FP32_TFLOPS} TFLOP/s"),
            "mahalanobis_forward": (pairs * esize / wbw * 1e3, f"write [B,N] at {wbw / 1e12:.2f} TB/s (fill_)"),
            "mahalanobis_backward": (pairs * esize / rbw * 1e3, f"read [B,N] at {rbw / 1e12:.2f} TB/s (sum)"),
        }
        torch_eager = {
            "field_forward": lambda: field_torch(points, means, chol, weights, EPS),
            "field_backward": lambda: field_grads(field_torch, points, means, chol, weights, dout_t),
            "mahalanobis_forward": lambda: maha_torch(points, means, chol, EPS),
            "mahalanobis_backward": lambda: maha_grads(maha_torch, points, means, chol, gmat_t),
        }
        torch_comp = {} if field_c is None else {
            "field_forward": lambda: field_c(points, means, chol, weights, EPS),
            "field_backward": lambda: field_grads(field_c, points, means, chol, weights, dout_t),
            "mahalanobis_forward": lambda: maha_c(points, means, chol, EPS),
            "mahalanobis_backward": lambda: maha_grads(maha_c, points, means, chol, gmat_t),
        }
        for op in ["field_forward", "field_backward", "mahalanobis_forward", "mahalanobis_backward"]:
            t_fk = median_ms(run[op], args.reps)
            try:
                t_eager = median_ms(torch_eager[op], max(5, args.reps // 5))
            except torch.cuda.OutOfMemoryError:
                t_eager = None
            torch.cuda.empty_cache()
            t_comp = None
            if op in torch_comp:
                try:
                    t_comp = median_ms(torch_comp[op], max(5, args.reps // 5))
                except Exception as e:  # noqa: BLE001 - report, keep going
                    print(f"  torch.compile {op}: {type(e).__name__}: {str(e)[:200]}")
            torch.cuda.empty_cache()
            floor, basis = floors[op]
            row = {"op": op, "dtype": dname, "B": B, "N": N, "fusekit_ms": t_fk, "eager_ms": t_eager,
                   "compile_ms": t_comp, "floor_ms": floor, "floor_basis": basis, "rel_err_vs_f64": errs[op]}
            if op.startswith("mahalanobis"):
                row["fusekit_GBps"] = pairs * esize / (t_fk * 1e-3) / 1e9
                row["fraction_of_bandwidth"] = floor / t_fk
            rows.append(row)
            f = lambda v: "   -    " if v is None else f"{v:8.3f}"
            extra = f"  {row['fraction_of_bandwidth'] * 100:5.1f}% of bandwidth" if "fraction_of_bandwidth" in row \
                else ("" if floor is None else f"  {floor / t_fk * 100:5.1f}% of floor")
            print(f"{op:22s} {dname}  fusekit {f(t_fk)} ms  eager {f(t_eager)} ms  compile {f(t_comp)} ms  "
                  f"floor {f(floor)} ms  err {errs[op]:.1e}{extra}")
        for h in [hp, hm, hc, hw, h_of, h_om, h_dout, h_g, h_ws] + hg:
            lib.fk_buffer_destroy(h)
        fk.keep.clear()
        del out_m, gmat, gmat_t
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": dev, "rows": rows}, fh, indent=1)
    bad = [r for r in rows if not r["rel_err_vs_f64"] <= (1e-4 if r["dtype"] == "f32" else 1e-10)]
    if bad:
        print("ACCURACY FAILURE:", bad)
        sys.exit(1)


if __name__ == "__main__":
    main()
