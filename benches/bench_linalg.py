#!/usr/bin/env python3
"""GPU benchmark rows of the linear-algebra family: fusekit (through ctypes on torch
data pointers: fk_buffer_wrap + fk_stream_wrap of torch's current stream) against
PyTorch eager, torch.compile, torch._addmm_activation and cuBLAS via torch.matmul,
each with its floor (FLOPs over 765 TFLOP/s bf16 dense, or bytes over the copy
bandwidth measured in this run, or, for the chunked GEMM, the larger of its compute
time and the measured time of its host<->device bytes copied both directions at once
from pinned memory).

Every timing is the median over samples of CUDA-event timings after warm-up, each
sample timing `inner` back-to-back calls (so host call overhead overlaps GPU work,
the same for every contender), on random data. Every fusekit output is checked
against a float64 (or float32 for the large GEMMs) reference first.

    FUSEKIT_LIBRARY=target/release/libfusekit.so python3 benches/bench_linalg.py [--json PATH] [--quick]
"""
import argparse
import ctypes as C
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

BF16_PEAK = 765e12
FP64_PEAK = 67e12  # H100 SXM FP64 tensor-core peak (datasheet; not measured here)

# ---------------------------------------------------------------- the library
FK_DEVICE_CUDA = 2
FK_OP_N, FK_OP_T, FK_OP_C = 0, 1, 2
FK_ACT_NONE, FK_ACT_RELU, FK_ACT_GELU_TANH, FK_ACT_GELU_ERF = 0, 1, 2, 3
DTYPES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4,
          torch.complex64: 5, torch.complex128: 6}


class Scalar(C.Structure):
    _fields_ = [("re", C.c_double), ("im", C.c_double)]


def load():
    path = os.environ.get("FUSEKIT_LIBRARY")
    if not path:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.path.join(root, "target", "release", "libfusekit.so")
    lib = C.CDLL(path)
    lib.fk_last_error_message.restype = C.c_char_p
    lib.fk_abi_version.restype = C.c_uint32
    V = C.c_void_p
    lib.fk_gemm.argtypes = [C.c_int32, C.c_int32, Scalar, V, V, Scalar, V, C.c_uint32, V]
    lib.fk_gemm_chunked.argtypes = [C.c_int32, C.c_int32, Scalar, V, V, Scalar, V, C.c_uint64, C.c_uint32, V]
    lib.fk_linear_forward.argtypes = [V, V, V, C.c_int32, V, V, V]
    lib.fk_linear_backward.argtypes = [V, V, V, C.c_int32, V, V, V, V, V]
    lib.fk_kron.argtypes = [V, V, V, V]
    lib.fk_buffer_wrap.argtypes = [V, V, C.c_int32, C.c_int32, V, V, V]
    lib.fk_stream_wrap.argtypes = [V, V, V]
    return lib


class Fk:
    """A CUDA context, torch's current stream wrapped, and cached buffer wraps."""

    def __init__(self):
        self.lib = load()
        self.ctx = C.c_void_p()
        self.check(self.lib.fk_context_create(self.lib.fk_abi_version(), FK_DEVICE_CUDA, 0, C.byref(self.ctx)))
        self.stream = C.c_void_p()
        raw = torch.cuda.current_stream().cuda_stream
        self.check(self.lib.fk_stream_wrap(self.ctx, C.c_void_p(raw), C.byref(self.stream)))
        self.wraps = {}

    def check(self, s):
        if s != 0:
            raise RuntimeError(f"fusekit status {s}: {self.lib.fk_last_error_message().decode()}")

    def buf(self, t):
        if t is None:
            return None
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in self.wraps:
            nd = t.dim()
            shape = (C.c_int64 * max(nd, 1))(*t.shape)
            strides = (C.c_int64 * max(nd, 1))(*t.stride())
            h = C.c_void_p()
            self.check(self.lib.fk_buffer_wrap(self.ctx, C.c_void_p(t.data_ptr()), DTYPES[t.dtype], nd, shape,
                                               strides, C.byref(h)))
            self.wraps[key] = (h, t)  # keep the tensor alive with its wrap
        return self.wraps[key][0]

    def gemm(self, a, b, c, op_a=FK_OP_N, op_b=FK_OP_N, alpha=1.0, beta=0.0, flags=0):
        self.check(self.lib.fk_gemm(op_a, op_b, Scalar(alpha, 0), self.buf(a), self.buf(b), Scalar(beta, 0),
                                    self.buf(c), flags, self.stream))

    def gemm_chunked(self, a, b, c, budget):
        self.check(self.lib.fk_gemm_chunked(FK_OP_N, FK_OP_N, Scalar(1, 0), self.buf(a), self.buf(b), Scalar(0, 0),
                                            self.buf(c), budget, 0, self.stream))

    def linear(self, x, w, b, act, y, aux=None):
        self.check(self.lib.fk_linear_forward(self.buf(x), self.buf(w), self.buf(b), act, self.buf(y),
                                              self.buf(aux), self.stream))

    def linear_backward(self, dy, x, w, act, saved, dx, dw, db):
        self.check(self.lib.fk_linear_backward(self.buf(dy), self.buf(x), self.buf(w), act, self.buf(saved),
                                               self.buf(dx), self.buf(dw), self.buf(db), self.stream))

    def kron(self, a, b, out):
        self.check(self.lib.fk_kron(self.buf(a), self.buf(b), self.buf(out), self.stream))


# ---------------------------------------------------------------- timing
def median_ms(fn, samples=15, inner=1, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(inner):
            fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / inner)
    return statistics.median(times)


def copy_bandwidth():
    n = 1 << 28
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    return 2 * n * 4 / (median_ms(lambda: dst.copy_(src), samples=10) * 1e-3)


def h2d_bandwidth():
    n = 1 << 28
    src = torch.rand(n, pin_memory=True)
    dst = torch.empty(n, device="cuda")
    return n * 4 / (median_ms(lambda: dst.copy_(src, non_blocking=True), samples=5) * 1e-3)


def copy_times(h_src, d_dst, d_src, h_dst, samples=5):
    """Median times (ms, CUDA events) of the copies host->device (pinned h_src into
    d_dst) alone, device->host (d_src into pinned h_dst) alone, and both at once on
    two streams (from an event both streams wait for to the later of the two streams'
    end events): what the host link gives to each direction when both are busy."""
    cur = torch.cuda.current_stream()
    s_up, s_down = torch.cuda.Stream(), torch.cuda.Stream()

    def once(up, down):
        e0 = torch.cuda.Event(enable_timing=True)
        ends = []
        e0.record(cur)
        for on, stream, dst, src in ((up, s_up, d_dst, h_src), (down, s_down, h_dst, d_src)):
            if not on:
                continue
            stream.wait_event(e0)
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
                e = torch.cuda.Event(enable_timing=True)
                e.record(stream)
            ends.append(e)
        for e in ends:
            cur.wait_event(e)
        torch.cuda.synchronize()
        return max(e0.elapsed_time(e) for e in ends)

    out = []
    for up, down in ((True, False), (False, True), (True, True)):
        once(up, down)  # warm-up
        out.append(statistics.median(once(up, down) for _ in range(samples)))
    return out


def rel_err(out, ref):
    out = out.to(torch.complex128 if out.is_complex() else torch.float64)
    ref = ref.to(out.dtype)
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(out - ref).item()
    return num / den if den else num


def rand(shape, dtype, scale=1.0, **kw):
    return (torch.randn(shape, device=kw.pop("device", "cuda"), **kw) * scale).to(dtype)


ROWS = []
FAILURES = [0]


def row(case, ms, floor_ms, contenders, err, tol, goal_ms=None, note="", extras=None):
    """One benchmark row: printed, and kept for the JSON. `contenders` are the other
    implementations (best_torch_ms is the fastest of them); `extras` are further
    reference times printed and kept the same way (`<name>_ms`) but not contenders."""
    ok = err <= tol and not math.isnan(err)
    FAILURES[0] += not ok
    best = min((v for v in contenders.values() if v is not None), default=None)
    extras = extras or {}
    r = dict(case=case, fusekit_ms=ms, floor_ms=floor_ms, pct_of_floor=100 * floor_ms / ms,
             rel_err=err, correct=ok, goal_ms=goal_ms, best_torch_ms=best, **{k + "_ms": v for k, v in contenders.items()},
             **{k + "_ms": v for k, v in extras.items()})
    if goal_ms is not None:
        r["meets_goal"] = ms <= goal_ms
    ROWS.append(r)
    parts = "  ".join(f"{k} {v:.4f}" for k, v in {**contenders, **extras}.items() if v is not None)
    goal = f"  goal {goal_ms:.3f} {'MET' if ms <= goal_ms else 'MISSED'}" if goal_ms is not None else ""
    print(f"{case:<44} fusekit {ms:.4f} ms  {parts}  floor {floor_ms:.4f} ({100*floor_ms/ms:.0f}%)"
          f"{goal}  err {err:.1e} {'ok' if ok else 'WRONG'} {note}", flush=True)


def maybe_compile(fn):
    try:
        c = torch.compile(fn)
        return c
    except Exception as e:  # noqa: BLE001
        print(f"torch.compile unavailable: {e}")
        return None


def graph_ms(fk, fn, inner=20, samples=15):
    """GPU time per call of `fn` (which issues fusekit calls on `fk.stream`, or torch
    work on the current stream) with host overhead removed: `inner` calls captured
    into one CUDA graph on a side stream, then the graph's replays timed. None when
    capture fails (the reason is printed)."""
    s = torch.cuda.Stream()
    h = C.c_void_p()
    fk.check(fk.lib.fk_stream_wrap(fk.ctx, C.c_void_p(s.cuda_stream), C.byref(h)))
    saved = fk.stream
    fk.stream = h
    try:
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # first use on this stream: cuBLAS handles and scratch
            fn()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(inner):
                fn()
        return median_ms(g.replay, samples=samples) / inner
    except Exception as e:  # noqa: BLE001
        print(f"  (graph capture failed: {type(e).__name__}: {str(e)[:160]})")
        return None
    finally:
        fk.stream = saved
        torch.cuda.synchronize()
        fk.lib.fk_stream_destroy(h)


def host_us(fn, calls=200):
    """Host time per call (microseconds) to submit `fn`, without waiting for the GPU
    (the queue absorbs `calls` submissions): when it exceeds the GPU time, a loop of
    calls is bound by the host, not the GPU."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / calls * 1e6


def timed(fn, **kw):
    if fn is None:
        return None
    try:
        return median_ms(fn, **kw)
    except Exception as e:  # noqa: BLE001
        print(f"  (contender failed: {type(e).__name__}: {str(e)[:120]})")
        return None


# ---------------------------------------------------------------- rows
def bench_linear(fk, m, k, n, act, goal, inner):
    dt = torch.bfloat16
    x = rand((m, k), dt)
    w = rand((n, k), dt, 1 / math.sqrt(k))
    b = rand((n,), dt)
    y = torch.full((m, n), float("nan"), dtype=dt, device="cuda")
    aux = torch.empty_like(y) if act in (FK_ACT_GELU_TANH, FK_ACT_GELU_ERF) else None
    fk.linear(x, w, b, act, y, aux)
    torch.cuda.synchronize()
    z = F.linear(x.float(), w.float(), b.float())
    # torch's names: "gelu" is the exact (erf) GELU, "gelu_tanh" the approximation
    name, approx = {FK_ACT_RELU: ("relu", None), FK_ACT_GELU_TANH: ("gelu_tanh", "tanh"),
                    FK_ACT_GELU_ERF: ("gelu", "none")}[act]
    ref = torch.relu(z) if act == FK_ACT_RELU else F.gelu(z, approximate=approx)
    err = rel_err(y, ref)
    addmm = None  # torch._addmm_activation has relu and the tanh GELU (cuBLASLt's epilogues) only
    if act == FK_ACT_RELU:
        eager = lambda: torch.relu(F.linear(x, w, b))  # noqa: E731
        addmm = lambda: torch._addmm_activation(b, x, w.t(), use_gelu=False)  # noqa: E731
    else:
        eager = lambda: F.gelu(F.linear(x, w, b), approximate=approx)  # noqa: E731
        if act == FK_ACT_GELU_TANH:
            addmm = lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)  # noqa: E731
    compiled = maybe_compile(eager)
    ms = median_ms(lambda: fk.linear(x, w, b, act, y, aux), inner=inner)
    contenders = dict(eager=timed(eager, inner=inner), compile=timed(compiled, inner=inner))
    if addmm is not None:
        contenders["addmm_activation"] = timed(addmm, inner=inner)
    contenders["matmul_only"] = timed(lambda: torch.matmul(x, w.t()), inner=inner)
    row(f"{name}(linear) bf16 M={m} K={k} N={n}" + (" +aux" if aux is not None else ""), ms,
        2 * m * n * k / BF16_PEAK * 1e3, contenders, err, 1e-2, goal)


def bench_linear_backward(fk, m, k, n, inner):
    dt = torch.bfloat16
    x = rand((m, k), dt)
    w = rand((n, k), dt, 1 / math.sqrt(k))
    b = rand((n,), dt)
    y = torch.relu(F.linear(x, w, b))
    dy = rand((m, n), dt)
    dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
    fk.linear_backward(dy, x, w, FK_ACT_RELU, y, dx, dw, db)
    torch.cuda.synchronize()
    dz = dy.float() * (y.float() > 0)
    err = max(rel_err(dx, dz @ w.float()), rel_err(dw, dz.t() @ x.float()), rel_err(db, dz.sum(0)))

    def manual():
        g = torch.ops.aten.threshold_backward(dy, y, 0)
        return g @ w, g.t() @ x, g.sum(0)

    xr, wr, br = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
    out = torch.relu(F.linear(xr, wr, br))

    def autograd():
        return torch.autograd.grad(out, (xr, wr, br), dy, retain_graph=True)

    ms = median_ms(lambda: fk.linear_backward(dy, x, w, FK_ACT_RELU, y, dx, dw, db), inner=inner)
    contenders = dict(manual=timed(manual, inner=inner), compile=timed(maybe_compile(manual), inner=inner),
                      autograd=timed(autograd, inner=inner))
    row(f"relu(linear) backward bf16 M={m} K={k} N={n}", ms, 4 * m * n * k / BF16_PEAK * 1e3, contenders, err,
        1e-2, note="(dx, dW, db)")


def bench_gemm(fk, nn, inner):
    dt = torch.bfloat16
    a, b = rand((nn, nn), dt), rand((nn, nn), dt, 1 / math.sqrt(nn))
    c = torch.full((nn, nn), float("nan"), dtype=dt, device="cuda")
    fk.gemm(a, b, c)
    torch.cuda.synchronize()
    err = rel_err(c, a.float() @ b.float())
    ms = median_ms(lambda: fk.gemm(a, b, c), inner=inner)
    t_mm = median_ms(lambda: torch.matmul(a, b, out=c), inner=inner)
    row(f"gemm bf16 {nn}^3", ms, 2 * nn ** 3 / BF16_PEAK * 1e3, dict(matmul=t_mm), err, 1e-2, goal_ms=t_mm * 1.05,
        note="(goal: within 5% of torch.matmul)")


def bench_gemm_c128(fk, nn, inner):
    """complex128 through cuBLAS's ZGEMM (docs/linalg.md), against torch.matmul (also
    cuBLAS ZGEMM): the goal is parity."""
    dt = torch.complex128
    a, b = rand((nn, nn), dt), rand((nn, nn), dt)
    c = torch.full((nn, nn), float("nan"), dtype=dt, device="cuda")
    fk.gemm(a, b, c)
    torch.cuda.synchronize()
    err = rel_err(c, a @ b)
    ms = median_ms(lambda: fk.gemm(a, b, c), samples=5, inner=inner)
    t_mm = median_ms(lambda: torch.matmul(a, b, out=c), samples=5, inner=inner)
    row(f"gemm complex128 {nn}^3 (cuBLAS ZGEMM)", ms, 8 * nn ** 3 / FP64_PEAK * 1e3, dict(matmul=t_mm), err, 1e-12,
        goal_ms=t_mm * 1.05, note=f"{8 * nn ** 3 / ms / 1e9:.1f} TFLOP/s; floor at {FP64_PEAK / 1e12:.0f} TFLOP/s FP64 tensor")


def bench_chunked(fk, m, k, n):
    dt = torch.bfloat16
    a = rand((m, k), dt, device="cpu").pin_memory()
    b = rand((k, n), dt, 1 / math.sqrt(k))
    c = torch.empty((m, n), dtype=dt).pin_memory()
    budget = 2 << 30
    fk.gemm_chunked(a, b, c, budget)
    torch.cuda.synchronize()
    rows_chk = torch.arange(0, m, max(1, m // 64))
    err = rel_err(c[rows_chk].cuda(), a[rows_chk].cuda().float() @ b.float())
    ms = median_ms(lambda: fk.gemm_chunked(a, b, c, budget), samples=5, warmup=1)
    h2d = h2d_bandwidth()
    # the old floor: every byte (A up, C down) over the host-to-device rate, one after another
    t_serial = (a.numel() + c.numel()) * 2 / h2d * 1e3
    ad = a.cuda()
    cd = torch.empty((m, n), dtype=dt, device="cuda")
    t_comp = median_ms(lambda: torch.matmul(ad, b, out=cd), samples=5)
    # the same bytes as the op moves: A host->device, C device->host; alone and at once
    h_dst = torch.empty_like(c).pin_memory()
    t_up, t_down, t_both = copy_times(a, ad, cd, h_dst)
    del ad, cd, h_dst
    floor = max(t_comp, t_both)

    def torch_chunks(rows=8192):
        for i in range(0, m, rows):
            blk = a[i:i + rows].to("cuda", non_blocking=True)
            c[i:i + rows].copy_(blk @ b, non_blocking=True)

    t_torch = median_ms(torch_chunks, samples=5, warmup=1)
    gb = lambda nbytes, t: nbytes / (t * 1e-3) / 1e9  # noqa: E731
    row(f"chunked gemm bf16 A,C pinned host M={m} K={k} N={n}", ms, floor,
        dict(torch_chunk_loop=t_torch), err, 1e-2, goal_ms=1.2 * floor,
        extras=dict(transfer_only=t_serial, compute_only=t_comp, h2d_alone=t_up, d2h_alone=t_down,
                    bidir_concurrent=t_both),
        note=f"(floor = max(A up + C down at once: {gb(a.numel() * 2, t_both):.0f}+{gb(c.numel() * 2, t_both):.0f} GB/s, "
             f"compute); alone: up {gb(a.numel() * 2, t_up):.0f} GB/s, down {gb(c.numel() * 2, t_down):.0f} GB/s; "
             f"transfer_only = old floor, all bytes one after another at {h2d/1e9:.0f} GB/s; goal: within 20% of the floor; "
             f"budget 2 GiB)")


def bench_kron(fk, bw, inner):
    dt = torch.float32
    a, b = rand((64, 64), dt), rand((64, 64), dt)
    out = torch.full((4096, 4096), float("nan"), dtype=dt, device="cuda")
    fk.kron(a, b, out)
    torch.cuda.synchronize()
    err = rel_err(out, torch.kron(a.double(), b.double()))
    ms = median_ms(lambda: fk.kron(a, b, out), inner=inner)
    eager = lambda: torch.kron(a, b)  # noqa: E731
    contenders = dict(eager=timed(eager, inner=inner), compile=timed(maybe_compile(eager), inner=inner))
    floor = (out.numel() + a.numel() + b.numel()) * 4 / bw * 1e3
    row("kron f32 64x64 (x) 64x64", ms, floor, contenders, err, 1e-6, goal_ms=0.03)
    # batched
    a3, b3 = rand((32, 16, 16), dt), rand((32, 16, 16), dt)
    o3 = torch.empty((32, 256, 256), dtype=dt, device="cuda")
    fk.kron(a3, b3, o3)
    torch.cuda.synchronize()
    ref = torch.einsum("bij,bkl->bikjl", a3.double(), b3.double()).reshape(32, 256, 256)
    err = rel_err(o3, ref)
    ms = median_ms(lambda: fk.kron(a3, b3, o3), inner=inner)
    eager3 = lambda: torch.einsum("bij,bkl->bikjl", a3, b3).reshape(32, 256, 256)  # noqa: E731
    row("kron f32 batched 32 x (16x16 (x) 16x16)", ms, (o3.numel() + a3.numel() + b3.numel()) * 4 / bw * 1e3,
        dict(einsum=timed(eager3, inner=inner), compile=timed(maybe_compile(eager3), inner=inner)), err, 1e-6)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--c128", action="store_true", help="only the complex128 GEMM rows")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 0
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    fk = Fk()
    bw = copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; torch {torch.__version__}; copy bandwidth {bw/1e9:.0f} GB/s (read+write); "
          f"floors: FLOPs / {BF16_PEAK/1e12:.0f} TFLOP/s bf16, bytes / measured bandwidth")
    q = args.quick
    if args.c128:
        for nn in (256, 1024, 2048, 4096):
            bench_gemm_c128(fk, nn, 2 if nn >= 2048 else 20)
        print(f"{len(ROWS)} rows, {FAILURES[0]} incorrect")
        return 1 if FAILURES[0] else 0
    bench_linear(fk, 2048 if q else 16384, 4096, 4096, FK_ACT_RELU, None if q else 0.74, 3)
    bench_linear(fk, 4096 if q else 32768, 768, 768, FK_ACT_RELU, None if q else 0.08, 20)
    bench_linear(fk, 2048 if q else 16384, 4096, 4096, FK_ACT_GELU_TANH, None, 3)
    bench_linear(fk, 2048 if q else 16384, 4096, 4096, FK_ACT_GELU_ERF, None, 3)
    bench_linear_backward(fk, 2048 if q else 16384, 4096, 4096, 3)
    bench_linear_backward(fk, 4096 if q else 32768, 768, 768, 10)
    bench_gemm(fk, 2048 if q else 8192, 2)
    bench_gemm_c128(fk, 1024 if q else 2048, 2)
    bench_gemm_c128(fk, 1024 if q else 4096, 2)
    bench_chunked(fk, 8192 if q else 65536, 8192, 8192)
    bench_kron(fk, bw, 50)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev, torch=torch.__version__, copy_gbps=bw / 1e9, rows=ROWS), f, indent=1)
    print(f"{len(ROWS)} rows, {FAILURES[0]} incorrect")
    return 1 if FAILURES[0] else 0


if __name__ == "__main__":
    sys.exit(main())
