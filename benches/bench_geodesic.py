#!/usr/bin/env python3
"""Benchmark rows for the geodesic ops: fusekit vs PyTorch eager vs torch.compile of
the same formulas (docs/ops.md section 5), with each op's floor.

fusekit is called through ctypes directly on the torch tensors' memory
(`fk_buffer_wrap`) and on torch's current stream (`fk_stream_wrap`), so no copy
and no synchronisation is added. Every timing is the median of CUDA-event timings
after warm-up. Before timing, each case checks fusekit against the PyTorch
formulas: in float64 on a smaller problem, then the benchmark-size float32 output
against the float64 reference.

Floors: bytes over 2.95 TB/s (device-to-device copy, read + write) and FLOPs over
51 TFLOP/s (FP32 FFMA), both measured on the H100 test machine; the larger one is
the floor (for the TF32 rows too, so their "% of floor" can exceed 100). FLOPs count the two products of each Christoffel evaluation (4*D*R per
row), each backward product (12*D*R per row for a Christoffel backward, two of them
per leapfrog step plus two forwards).

    python3 benches/bench_geodesic.py [--json PATH] [--reps N] [--no-compile] [--quick]
                                      [--only REGEX] [--no-warmup] [--no-eager]

`--only REGEX` runs the rows whose name matches (e.g. `--only "christoffel fwd"`),
`--no-warmup` compiles only the kernels used (instead of fk_context_warmup). Besides
the median of single calls ("fusekit", what BENCHMARKS.md reports; it includes the
host's submit time of a call when that exceeds nothing queued before it), each row
prints "b2b": the median over 5 runs of 20 back-to-back calls between two events,
divided by 20 (GPU time per call with the launch latency hidden).

The library: $FUSEKIT_LIBRARY, else target/release/libfusekit.so.
"""
import argparse
import ctypes
import json
import math
import os
import pathlib
import re
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
COPY_BW = 2.95e12
FP32_RATE = 51e12
FK_DTYPE = {torch.float32: 3, torch.float64: 4}
FK_DEVICE_CUDA = 2
FK_ABI_VERSION = 1000


# ---------------------------------------------------------------- fusekit through ctypes
class FK:
    def __init__(self, path):
        lib = ctypes.CDLL(path)
        vp, i32, i64, f64, u32 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_double, ctypes.c_uint32
        pvp = ctypes.POINTER(ctypes.c_void_p)
        sig = {
            "fk_context_create": (i32, [ctypes.c_uint32, i32, i32, pvp]),
            "fk_context_warmup": (i32, [vp]),
            "fk_stream_wrap": (i32, [vp, vp, pvp]),
            "fk_buffer_wrap": (i32, [vp, vp, i32, i32, ctypes.POINTER(i64), ctypes.POINTER(i64), pvp]),
            "fk_buffer_destroy": (i32, [vp]),
            "fk_last_error_message": (ctypes.c_char_p, []),
            "fk_christoffel_forward": (i32, [vp, vp, vp, f64, u32, vp, vp]),
            "fk_christoffel_backward": (i32, [vp, vp, vp, vp, f64, u32, vp, vp, vp, vp]),
            "fk_leapfrog_forward": (i32, [vp, vp, vp, vp, vp, vp, f64, i64, f64, u32, vp, vp, vp, vp]),
            "fk_leapfrog_backward": (i32, [vp, vp, vp, vp, vp, f64, i64, f64, u32, vp, vp, vp, vp, vp, vp, vp, vp, vp]),
        }
        for name, (res, args) in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self.lib = lib
        ctx = ctypes.c_void_p()
        self.check(lib.fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, torch.cuda.current_device(), ctypes.byref(ctx)))
        self.ctx = ctx
        s = ctypes.c_void_p()
        self.check(lib.fk_stream_wrap(ctx, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.byref(s)))
        self.stream = s
        self.bufs = {}

    def check(self, status):
        if status != 0:
            raise RuntimeError(f"fusekit status {status}: {self.lib.fk_last_error_message().decode()}")

    def buf(self, t):
        """An fk_buffer over tensor `t` (cached by data pointer, shape and dtype); None -> NULL."""
        if t is None:
            return None
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        if key not in self.bufs:
            assert t.is_contiguous()
            shape = (ctypes.c_int64 * t.dim())(*t.shape)
            h = ctypes.c_void_p()
            self.check(self.lib.fk_buffer_wrap(self.ctx, ctypes.c_void_p(t.data_ptr()), FK_DTYPE[t.dtype], t.dim(),
                                               shape, None, ctypes.byref(h)))
            self.bufs[key] = (h, t)  # keep the tensor alive
        return self.bufs[key][0]

    def christoffel(self, v, U, W, c, out, flags=0):
        self.check(self.lib.fk_christoffel_forward(self.buf(v), self.buf(U), self.buf(W), c, flags, self.buf(out), self.stream))

    def christoffel_backward(self, v, U, W, g, c, dv, dU, dW, flags=0):
        b = self.buf
        self.check(self.lib.fk_christoffel_backward(b(v), b(U), b(W), b(g), c, flags, b(dv), b(dU), b(dW), self.stream))

    def leapfrog(self, x0, v0, f, U, W, mu, dt, T, c, x_out, v_out, traj=None, flags=0):
        b = self.buf
        self.check(self.lib.fk_leapfrog_forward(b(x0), b(v0), b(f), b(U), b(W), b(mu), dt, T, c, flags, b(x_out),
                                                b(v_out), b(traj), self.stream))

    def leapfrog_backward(self, v0, f, U, W, mu, dt, T, c, traj, gx, gv, dx0, dv0, df, dU, dW, flags=0):
        b = self.buf
        self.check(self.lib.fk_leapfrog_backward(b(v0), b(f), b(U), b(W), b(mu), dt, T, c, flags, b(traj), b(gx), b(gv),
                                                 b(dx0), b(dv0), b(df), b(dU), b(dW), self.stream))


# ---------------------------------------------------------------- PyTorch reference (the formulas)
def chr_ref(v, U, W, c):
    p = v @ U
    return torch.clamp((p * p) @ W.T, -c, c)


def chr_bwd_ref(v, U, W, g, c):
    p = v @ U
    s = p * p
    raw = s @ W.T
    gp = g * ((raw >= -c) & (raw <= c))
    dW = gp.T @ s
    dp = 2 * p * (gp @ W)
    return dp @ U.T, v.T @ dp, dW


def lf_ref(x, v, f, U, W, mu, dt, T, c):
    h = 0.5 * dt
    for _ in range(T):
        vh = v + h * (f - chr_ref(v, U, W, c) - mu * v)
        x = x + dt * vh
        v = vh + h * (f - chr_ref(vh, U, W, c) - mu * vh)
    return x, v


def lf_grads_ref(x, v, f, U, W, mu, dt, T, c, gx, gv):
    """Autograd of the reference forward: (dx0, dv0, df, dU, dW)."""
    ins = [t.detach().clone().requires_grad_(True) for t in (x, v, f, U, W)]
    xT, vT = lf_ref(*ins[:5], mu, dt, T, c)
    return torch.autograd.grad((xT, vT), ins, (gx, gv))


# ---------------------------------------------------------------- timing helpers
def median_ms(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def b2b_ms(fn, n=20, runs=5):
    """GPU time per call of `n` back-to-back calls (median of `runs`)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n):
            fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / n)
    return statistics.median(times)


def rel_err(out, ref):
    out = out.double()
    ref = ref.double()
    if not torch.isfinite(out).all():
        return float("nan")
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(out - ref).item()
    return num / den if den else num


def problem(B, D, R, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, device="cuda", generator=g, dtype=torch.float64) * scale).to(dtype)
    return dict(
        x=r(B, D), v=r(B, D), f=r(B, D, scale=0.5),
        U=r(D, R, scale=1.0 / math.sqrt(D)), W=r(D, R, scale=2.0 / R),
        mu=(torch.rand(D, device="cuda", generator=g, dtype=torch.float64) * 0.5).to(dtype),
        g=r(B, D), gx=r(B, D), gv=r(B, D),
    )


# ---------------------------------------------------------------- cases
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    ap.add_argument("--quick", action="store_true", help="fewer cases")
    ap.add_argument("--B", type=int, default=65536)
    ap.add_argument("--D", type=int, default=512)
    ap.add_argument("--R", type=int, default=32)
    ap.add_argument("--only", help="run only the rows whose name matches this regular expression")
    ap.add_argument("--no-warmup", action="store_true", help="skip fk_context_warmup (compile on first use)")
    ap.add_argument("--no-eager", action="store_true", help="skip the eager column (fusekit only, for A/B runs)")
    args = ap.parse_args()
    want = lambda name: not args.only or re.search(args.only, name) is not None
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 0
    lib = os.environ.get("FUSEKIT_LIBRARY", str(ROOT / "target" / "release" / "libfusekit.so"))
    fk = FK(lib)
    t0 = time.time()
    if not args.no_warmup:
        fk.check(fk.lib.fk_context_warmup(fk.ctx))
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; fusekit warm-up {time.time() - t0:.1f}s")
    c, dt = 5.0, 0.1
    failures = 0
    rows = []

    # ---- correctness in float64 (smaller problem), fast and generic kernels
    P = problem(2048, args.D, args.R, torch.float64, seed=1)
    for flags in ((0, 2) if want("f64 check") else ()):
        out = torch.full_like(P["v"], float("nan"))
        fk.christoffel(P["v"], P["U"], P["W"], c, out, flags)
        e1 = rel_err(out, chr_ref(P["v"], P["U"], P["W"], c))
        outs = [torch.full_like(P["v"], float("nan")), torch.full_like(P["U"], float("nan")), torch.full_like(P["U"], float("nan"))]
        fk.christoffel_backward(P["v"], P["U"], P["W"], P["g"], c, *outs, flags=flags)
        refs = chr_bwd_ref(P["v"], P["U"], P["W"], P["g"], c)
        e2 = max(rel_err(o, r) for o, r in zip(outs, refs))
        T = 3
        xo, vo = torch.full_like(P["v"], float("nan")), torch.full_like(P["v"], float("nan"))
        traj = torch.full((T, 2) + tuple(P["v"].shape), float("nan"), device="cuda", dtype=torch.float64)
        fk.leapfrog(P["x"], P["v"], P["f"], P["U"], P["W"], P["mu"], dt, T, c, xo, vo, traj, flags)
        xr, vr = lf_ref(P["x"], P["v"], P["f"], P["U"], P["W"], P["mu"], dt, T, c)
        e3 = max(rel_err(xo, xr), rel_err(vo, vr))
        grads = [torch.full_like(P["v"], float("nan")) for _ in range(3)] + [torch.full_like(P["U"], float("nan")) for _ in range(2)]
        fk.leapfrog_backward(P["v"], P["f"], P["U"], P["W"], P["mu"], dt, T, c, traj, P["gx"], P["gv"], *grads, flags=flags)
        gref = lf_grads_ref(P["x"], P["v"], P["f"], P["U"], P["W"], P["mu"], dt, T, c, P["gx"], P["gv"])
        e4 = max(rel_err(o, r) for o, r in zip(grads, gref))
        torch.cuda.synchronize()
        ok = all(e <= 1e-10 for e in (e1, e2, e3, e4))
        failures += not ok
        print(f"float64 check ({'generic' if flags else 'fast/auto'} kernels): christoffel {e1:.1e}, backward {e2:.1e}, "
              f"leapfrog T=3 {e3:.1e}, leapfrog backward {e4:.1e} {'ok' if ok else 'WRONG'}")
        rows.append(dict(case=f"f64 check flags={flags}", errors=[e1, e2, e3, e4], correct=ok))

    # ---- benchmark size, float32
    B, D, R = args.B, args.D, args.R
    P = problem(B, D, R, torch.float32, seed=2)
    P64 = {k: v.double() for k, v in P.items()}
    v, U, W, x, f, mu, g = P["v"], P["U"], P["W"], P["x"], P["f"], P["mu"], P["g"]
    nbd, ndr = B * D, D * R

    def row(case, fk_fn, eager_fn, err, floor_bytes, flops, extra=None, compile_fn=None):
        nonlocal failures
        tol = 5e-3 if extra and extra.get("tolerance") == "TF32" else 1e-4
        ok = err <= tol and not math.isnan(err)
        failures += not ok
        t_fk = median_ms(fk_fn, args.reps)
        t_b2b = b2b_ms(fk_fn)
        t_eager = median_ms(eager_fn, args.reps) if eager_fn and not args.no_eager else float("nan")
        t_comp = float("nan")
        if compile_fn is not None and not args.no_compile:
            try:
                t_comp = median_ms(compile_fn, args.reps, warmup=3)
            except Exception as e:  # a compile failure is reported, not fatal
                print(f"  torch.compile failed for {case}: {type(e).__name__}: {e}")
        t_bytes = floor_bytes / COPY_BW * 1e3
        t_flops = flops / FP32_RATE * 1e3
        floor = max(t_bytes, t_flops)
        r = dict(case=case, fusekit_ms=t_fk, eager_ms=t_eager, compile_ms=t_comp, floor_ms=floor,
                 fusekit_b2b_ms=t_b2b, floor_bytes_ms=t_bytes, floor_flops_ms=t_flops, pct_of_floor=100 * floor / t_fk, rel_err=err, correct=ok)
        if extra:
            r.update(extra)
        rows.append(r)
        print(f"{case:<44} fusekit {t_fk:8.4f} ms (b2b {t_b2b:.4f})  eager {t_eager:8.4f}  compile {t_comp:8.4f}  floor {floor:.4f} "
              f"(bytes {t_bytes:.4f}, flops {t_flops:.4f}; {100 * floor / t_fk:5.1f}%)  err {err:.1e} {'ok' if ok else 'WRONG'}")
        return r

    out = torch.full_like(v, float("nan"))
    xo, vo = torch.full_like(v, float("nan")), torch.full_like(v, float("nan"))
    fwd_ms = {}
    # Christoffel forward
    if want(f"christoffel fwd f32 B={B} D={D} R={R}"):
        fk.christoffel(v, U, W, c, out)
        err = rel_err(out, chr_ref(P64["v"], P64["U"], P64["W"], c))
        comp = torch.compile(chr_ref) if not args.no_compile else None
        row(f"christoffel fwd f32 B={B} D={D} R={R}", lambda: fk.christoffel(v, U, W, c, out), lambda: chr_ref(v, U, W, c), err,
            (2 * nbd + 2 * ndr) * 4, 4 * nbd * R, compile_fn=(lambda: comp(v, U, W, c)) if comp else None)
    # Christoffel backward
    if want("christoffel bwd f32 (dv, dU, dW)"):
        dv, dU, dW = torch.full_like(v, float("nan")), torch.full_like(U, float("nan")), torch.full_like(U, float("nan"))
        fk.christoffel_backward(v, U, W, g, c, dv, dU, dW)
        refs = chr_bwd_ref(P64["v"], P64["U"], P64["W"], P64["g"], c)
        err = max(rel_err(o, r) for o, r in zip((dv, dU, dW), refs))
        compb = torch.compile(chr_bwd_ref) if not args.no_compile else None
        row(f"christoffel bwd f32 (dv, dU, dW)", lambda: fk.christoffel_backward(v, U, W, g, c, dv, dU, dW),
            lambda: chr_bwd_ref(v, U, W, g, c), err, (3 * nbd + 4 * ndr) * 4, 12 * nbd * R,
            compile_fn=(lambda: compb(v, U, W, g, c)) if compb else None)
    # Leapfrog forward
    if want("leapfrog fwd f32 T=1 (f, mu)") or want("leapfrog fwd f32 T=8 (f, mu)"):
        for T in ([1, 8] if not args.quick else [8]):
            fk.leapfrog(x, v, f, U, W, mu, dt, T, c, xo, vo)
            xr, vr = lf_ref(P64["x"], P64["v"], P64["f"], P64["U"], P64["W"], P64["mu"], dt, T, c)
            err = max(rel_err(xo, xr), rel_err(vo, vr))
            compf = torch.compile(lf_ref) if not args.no_compile else None
            r = row(f"leapfrog fwd f32 T={T} (f, mu)", lambda: fk.leapfrog(x, v, f, U, W, mu, dt, T, c, xo, vo),
                    lambda: lf_ref(x, v, f, U, W, mu, dt, T, c), err, 5 * nbd * 4 + 2 * ndr * 4, 8 * T * nbd * R,
                    compile_fn=(lambda: compf(x, v, f, U, W, mu, dt, T, c)) if compf else None)
            fwd_ms[T] = r["fusekit_ms"]
    # Leapfrog backward, T = 8, with and without trajectory
    if want("leapfrog bwd f32") or want("writing traj"):
        T = 8
        traj = torch.empty((T, 2, B, D), device="cuda", dtype=torch.float32)
        fk.leapfrog(x, v, f, U, W, mu, dt, T, c, xo, vo, traj)
        r = row(f"leapfrog fwd f32 T={T} writing traj", lambda: fk.leapfrog(x, v, f, U, W, mu, dt, T, c, xo, vo, traj), None, 0.0,
                (5 + 2 * T) * nbd * 4, 8 * T * nbd * R)
        gx, gv = P["gx"], P["gv"]
        grads = [torch.full_like(v, float("nan")) for _ in range(3)] + [torch.full_like(U, float("nan")) for _ in range(2)]
        Bs = min(B, 8192)  # the autograd reference in float64 on a slice of the rows (memory)
        gref = lf_grads_ref(P64["x"][:Bs], P64["v"][:Bs], P64["f"][:Bs], P64["U"], P64["W"], P64["mu"], dt, T, c, P64["gx"][:Bs], P64["gv"][:Bs])
        # the fusekit gradients for the same rows: a separate call on the slice
        sl = [t[:Bs].contiguous() for t in (v, f, gx, gv)]
        trs = torch.empty((T, 2, Bs, D), device="cuda", dtype=torch.float32)
        x_s, v_s = torch.empty_like(sl[0]), torch.empty_like(sl[0])
        fk.leapfrog(x[:Bs].contiguous(), sl[0], sl[1], U, W, mu, dt, T, c, x_s, v_s, trs)
        gs = [torch.full_like(sl[0], float("nan")) for _ in range(3)] + [torch.full_like(U, float("nan")) for _ in range(2)]
        fk.leapfrog_backward(sl[0], sl[1], U, W, mu, dt, T, c, trs, sl[2], sl[3], *gs)
        err = max(rel_err(o, rr) for o, rr in zip(gs, gref))

        def torch_bwd():
            ins = [t.detach().requires_grad_(True) for t in (x, v, f, U, W)]
            xT, vT = lf_ref(*ins, mu, dt, T, c)
            return torch.autograd.grad((xT, vT), ins, (gx, gv))

        bwd_bytes_traj = ((T - 1) * nbd + 4 * nbd + 3 * nbd) * 4 + 4 * ndr * 4
        r1 = row(f"leapfrog bwd f32 T={T} from traj (all grads)",
                 lambda: fk.leapfrog_backward(v, f, U, W, mu, dt, T, c, traj, gx, gv, *grads), torch_bwd, err,
                 bwd_bytes_traj, 24 * T * nbd * R, extra=dict(note="eager column: forward + autograd backward"))
        r2 = row(f"leapfrog bwd f32 T={T} recompute (all grads)",
                 lambda: fk.leapfrog_backward(v, f, U, W, mu, dt, T, c, None, gx, gv, *grads), None, err,
                 (7 * nbd) * 4 + 4 * ndr * 4, 32 * T * nbd * R)
        print(f"leapfrog T={T}: backward/forward = {r1['fusekit_ms'] / fwd_ms.get(T, r1['fusekit_ms']):.2f} (traj), "
              f"{r2['fusekit_ms'] / fwd_ms.get(T, r2['fusekit_ms']):.2f} (recompute)")
    # the opt-in TF32 tensor-core forwards (FK_GEO_ALLOW_TF32 = 1)
    if want("christoffel fwd f32, TF32"):
        fk.christoffel(v, U, W, c, out, 1)
        err = rel_err(out, chr_ref(P64["v"], P64["U"], P64["W"], c))
        row("christoffel fwd f32, TF32 (flags=1)", lambda: fk.christoffel(v, U, W, c, out, 1), None, err,
            (2 * nbd + 2 * ndr) * 4, 4 * nbd * R, extra=dict(tolerance="TF32"))
    if want("leapfrog fwd f32 T=.*TF32") or want("leapfrog fwd f32 T=1, TF32"):
        for T in ([1, 8] if not args.quick else [8]):
            fk.leapfrog(x, v, f, U, W, mu, dt, T, c, xo, vo, None, 1)
            xr, vr = lf_ref(P64["x"], P64["v"], P64["f"], P64["U"], P64["W"], P64["mu"], dt, T, c)
            err = max(rel_err(xo, xr), rel_err(vo, vr))
            row(f"leapfrog fwd f32 T={T}, TF32 (flags=1)", lambda: fk.leapfrog(x, v, f, U, W, mu, dt, T, c, xo, vo, None, 1),
                None, err, 5 * nbd * 4 + 2 * ndr * 4, 8 * T * nbd * R, extra=dict(tolerance="TF32"))
    # the opt-in 3xTF32 leapfrog forward (FK_GEO_ALLOW_TF32X3 = 4): f32-level accuracy,
    # checked at the strict tolerance
    if want("leapfrog fwd f32 T=.*TF32x3"):
        for T in ([1, 8] if not args.quick else [8]):
            fk.leapfrog(x, v, f, U, W, mu, dt, T, c, xo, vo, None, 4)
            xr, vr = lf_ref(P64["x"], P64["v"], P64["f"], P64["U"], P64["W"], P64["mu"], dt, T, c)
            err = max(rel_err(xo, xr), rel_err(vo, vr))
            row(f"leapfrog fwd f32 T={T}, TF32x3 (flags=4)",
                lambda: fk.leapfrog(x, v, f, U, W, mu, dt, T, c, xo, vo, None, 4),
                None, err, 5 * nbd * 4 + 2 * ndr * 4, 8 * T * nbd * R)
    # R = 64 (no fast kernel): the "generic" rows below, and the leapfrog backward's rows
    # (named "leapfrog bwd R=64 ..." so that --only "leapfrog bwd f32" leaves them out)
    T = 8
    lfb64 = [(f"leapfrog bwd R=64 f32 T={T} {tn} (all grads), {name}", tr, fl)
             for tn, tr in (("from traj", True), ("recompute", False))
             for name, fl in (("cuBLAS route", 0), ("generic kernel (flags=2)", 2))]
    lfb64 = [x for x in lfb64 if want(x[0])]
    if not args.quick and (want("generic") or lfb64):
        P2 = problem(B, D, 64, torch.float32, seed=3)
        r64 = {k: t.double() for k, t in P2.items()}
    if not args.quick and want("generic"):
        # the generic kernels on the same problem (R > 32 or large D take this path)
        row("christoffel fwd f32, generic kernel (flags=2)", lambda: fk.christoffel(v, U, W, c, out, 2), None, 0.0,
            (2 * nbd + 2 * ndr) * 4, 4 * nbd * R)
        out2 = torch.empty_like(P2["v"])
        fk.christoffel(P2["v"], P2["U"], P2["W"], c, out2)
        e = rel_err(out2, chr_ref(P2["v"].double(), P2["U"].double(), P2["W"].double(), c))
        # R = 64 has no fast kernel: two cuBLAS GEMMs with a square and a clamp between
        comp2 = torch.compile(chr_ref) if not args.no_compile else None
        row(f"christoffel fwd f32 R=64 (cuBLAS route)", lambda: fk.christoffel(P2["v"], P2["U"], P2["W"], c, out2),
            lambda: chr_ref(P2["v"], P2["U"], P2["W"], c), e, (2 * nbd + 2 * D * 64) * 4, 4 * nbd * 64,
            compile_fn=(lambda: comp2(P2["v"], P2["U"], P2["W"], c)) if comp2 else None)
        fk.christoffel(P2["v"], P2["U"], P2["W"], c, out2, 2)
        e = rel_err(out2, chr_ref(P2["v"].double(), P2["U"].double(), P2["W"].double(), c))
        row(f"christoffel fwd f32 R=64, generic kernel (flags=2)",
            lambda: fk.christoffel(P2["v"], P2["U"], P2["W"], c, out2, 2), None, e, (2 * nbd + 2 * D * 64) * 4,
            4 * nbd * 64)
        # the Christoffel backward at R = 64 (all gradients)
        g2 = P2["g"]
        b2 = [torch.full_like(g2, float("nan"))] + [torch.full_like(P2["U"], float("nan")) for _ in range(2)]
        refs = chr_bwd_ref(r64["v"], r64["U"], r64["W"], r64["g"], c)
        for name, fl in (("cuBLAS route", 0), ("generic kernel (flags=2)", 2)):
            fk.christoffel_backward(P2["v"], P2["U"], P2["W"], g2, c, *b2, flags=fl)
            e = max(rel_err(o, r) for o, r in zip(b2, refs))
            compb2 = torch.compile(chr_bwd_ref) if not args.no_compile and fl == 0 else None
            row(f"christoffel bwd f32 R=64, {name}",
                lambda: fk.christoffel_backward(P2["v"], P2["U"], P2["W"], g2, c, *b2, flags=fl),
                (lambda: chr_bwd_ref(P2["v"], P2["U"], P2["W"], g2, c)) if fl == 0 else None, e,
                (3 * nbd + 4 * D * 64) * 4, 12 * nbd * 64,
                compile_fn=(lambda: compb2(P2["v"], P2["U"], P2["W"], g2, c)) if compb2 else None)
        # the leapfrog at R = 64, T = 8: the same route per Christoffel evaluation
        T = 8
        x2o, v2o = torch.full_like(P2["v"], float("nan")), torch.full_like(P2["v"], float("nan"))
        a2 = (P2["x"], P2["v"], P2["f"], P2["U"], P2["W"], P2["mu"])
        xr, vr = lf_ref(r64["x"], r64["v"], r64["f"], r64["U"], r64["W"], r64["mu"], dt, T, c)
        for name, fl in (("cuBLAS route", 0), ("generic kernel (flags=2)", 2)):
            fk.leapfrog(*a2, dt, T, c, x2o, v2o, None, fl)
            e = max(rel_err(x2o, xr), rel_err(v2o, vr))
            compf2 = torch.compile(lf_ref) if not args.no_compile and fl == 0 else None
            row(f"leapfrog fwd f32 T={T} R=64, {name}", lambda: fk.leapfrog(*a2, dt, T, c, x2o, v2o, None, fl),
                (lambda: lf_ref(*a2, dt, T, c)) if fl == 0 else None, e, 5 * nbd * 4 + 2 * D * 64 * 4,
                8 * T * nbd * 64, compile_fn=(lambda: compf2(*a2, dt, T, c)) if compf2 else None)
    if not args.quick and lfb64:
        # the leapfrog backward at R = 64, T = 8, all gradients: the cuBLAS route (per step
        # two Christoffel forwards and two vjps in cuBLAS) and the generic kernel, from the
        # trajectory and recomputing; checked on a slice of the rows against float64 autograd
        a2 = (P2["x"], P2["v"], P2["f"], P2["U"], P2["W"], P2["mu"])
        x2o, v2o = torch.empty_like(P2["v"]), torch.empty_like(P2["v"])
        traj2 = torch.empty((T, 2, B, D), device="cuda", dtype=torch.float32)
        fk.leapfrog(*a2, dt, T, c, x2o, v2o, traj2)
        gx2, gv2 = P2["gx"], P2["gv"]
        grads2 = [torch.full_like(P2["v"], float("nan")) for _ in range(3)] + \
            [torch.full_like(P2["U"], float("nan")) for _ in range(2)]
        Bs = min(B, 8192)
        gref2 = lf_grads_ref(r64["x"][:Bs], r64["v"][:Bs], r64["f"][:Bs], r64["U"], r64["W"], r64["mu"], dt, T, c,
                             r64["gx"][:Bs], r64["gv"][:Bs])
        sl2 = [t[:Bs].contiguous() for t in (P2["x"], P2["v"], P2["f"], gx2, gv2)]
        trs2 = torch.empty((T, 2, Bs, D), device="cuda", dtype=torch.float32)
        fk.leapfrog(sl2[0], sl2[1], sl2[2], P2["U"], P2["W"], P2["mu"], dt, T, c, torch.empty_like(sl2[0]),
                    torch.empty_like(sl2[0]), trs2)

        def torch_bwd2():
            ins = [t.detach().requires_grad_(True) for t in a2[:5]]
            xT, vT = lf_ref(*ins, P2["mu"], dt, T, c)
            return torch.autograd.grad((xT, vT), ins, (gx2, gv2))

        for name, with_traj, fl in lfb64:
            gs = [torch.full_like(sl2[1], float("nan")) for _ in range(3)] + \
                [torch.full_like(P2["U"], float("nan")) for _ in range(2)]
            fk.leapfrog_backward(sl2[1], sl2[2], P2["U"], P2["W"], P2["mu"], dt, T, c, trs2 if with_traj else None,
                                 sl2[3], sl2[4], *gs, flags=fl)
            e = max(rel_err(o, rr) for o, rr in zip(gs, gref2))
            tr2 = traj2 if with_traj else None
            eager = torch_bwd2 if fl == 0 and with_traj else None
            row(name, lambda: fk.leapfrog_backward(P2["v"], P2["f"], P2["U"], P2["W"], P2["mu"], dt, T, c, tr2, gx2, gv2,
                                                   *grads2, flags=fl),
                eager, e, ((T - 1) * nbd + 7 * nbd) * 4 + 4 * D * 64 * 4 if with_traj else 7 * nbd * 4 + 4 * D * 64 * 4,
                (24 if with_traj else 32) * T * nbd * 64,
                extra=dict(note="eager column: forward + autograd backward") if eager else None)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), fh, indent=1)
    print(f"bench_geodesic: {len(rows)} rows, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
