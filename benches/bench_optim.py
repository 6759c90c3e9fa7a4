#!/usr/bin/env python3
"""GPU benchmark rows of the optimizer-math family (issue 7): inverse 4th roots
(fusekit Newton with TF32 tensor cores, fusekit eigendecomposition, PyTorch
`torch.linalg.eigh` eager and compiled), per-sample gradients materialised, ghost
norms (against eager, torch.compile and a functorch vmap), the DP-SGD clipped sum
(against one GEMM of the same size), Shampoo statistics and preconditioning.

Timing, checking and the table come from bench_linalg.py (median of CUDA-event
timings after warm-up, random inputs, every fusekit output checked against an f64
reference first). Floors: the GEMM FLOPs each method must do over the measured
unit rate (TF32 428 TFLOP/s, FP32 51 TFLOP/s: the H100's reference rates of BENCHMARKS.md), or bytes over the
copy bandwidth measured in this run.

    FUSEKIT_LIBRARY=target/release/libfusekit.so python3 benches/bench_optim.py [--json PATH] [--quick]
"""
import argparse
import ctypes as C
import json
import math
import sys

import torch

import bench_linalg as bl

TF32_RATE = 428e12
FP32_RATE = 51e12
FK_MATPOW_AUTO, FK_MATPOW_EIGH, FK_MATPOW_NEWTON = 0, 1, 2
FK_GEMM_ALLOW_TF32 = 1


class Report(C.Structure):
    _fields_ = [("method", C.c_int32), ("iterations", C.c_int32), ("converged", C.c_int32),
                ("reserved", C.c_int32), ("residual", C.c_double), ("min_eigenvalue", C.c_double)]


class Fk(bl.Fk):
    def __init__(self):
        super().__init__()
        V = C.c_void_p
        L = self.lib
        L.fk_matrix_power.argtypes = [V, C.c_double, C.c_double, C.c_int32, C.c_int32, C.c_double, C.c_uint32, V,
                                      C.POINTER(Report), V]
        L.fk_shampoo_stats.argtypes = [V, C.c_double, C.c_double, V, V, V]
        L.fk_shampoo_precondition.argtypes = [V, V, V, V, C.c_uint32, V]
        L.fk_per_sample_grads.argtypes = [V, V, V, C.c_uint32, V]
        L.fk_per_sample_grad_norms.argtypes = [V, V, V, V]
        L.fk_dp_clipped_grad_sum.argtypes = [V, V, C.c_double, V, V, C.c_uint32, V]

    def power(self, a, out, power, eps, method, max_iter, tol, flags):
        rep = Report()
        self.check(self.lib.fk_matrix_power(self.buf(a), power, eps, method, max_iter, tol, flags, self.buf(out),
                                            C.byref(rep), self.stream))
        return rep

    def stats(self, g, l, r, alpha=1.0, beta=1.0):
        self.check(self.lib.fk_shampoo_stats(self.buf(g), alpha, beta, self.buf(l), self.buf(r), self.stream))

    def precondition(self, l, g, r, out, flags=0):
        self.check(self.lib.fk_shampoo_precondition(self.buf(l), self.buf(g), self.buf(r), self.buf(out), flags,
                                                    self.stream))

    def per_sample(self, a, g, out, flags=0):
        self.check(self.lib.fk_per_sample_grads(self.buf(a), self.buf(g), self.buf(out), flags, self.stream))

    def norms(self, a, g, out):
        self.check(self.lib.fk_per_sample_grad_norms(self.buf(a), self.buf(g), self.buf(out), self.stream))

    def clipped(self, a, g, c, out, norms=None, flags=0):
        self.check(self.lib.fk_dp_clipped_grad_sum(self.buf(a), self.buf(g), c, self.buf(out), self.buf(norms),
                                                   flags, self.stream))


def wishart(batch, n, dtype=torch.float32):
    """SPD test matrices X X^T / (2n), X [n, 2n] standard normal: the spectrum of a
    Shampoo statistic after 2n gradient steps (condition number ~34)."""
    x = torch.randn(batch, n, 2 * n, device="cuda", dtype=torch.float64)
    return (x @ x.transpose(1, 2) / (2 * n)).to(dtype).contiguous()


def torch_inverse_root(a, p, eps):
    w, q = torch.linalg.eigh(a + eps * torch.eye(a.shape[-1], device=a.device, dtype=a.dtype))
    return (q * w.clamp_min(eps).pow(-1.0 / p).unsqueeze(-2)) @ q.transpose(-1, -2)


def bench_root(fk, batch, n, goal, samples):
    p, eps = 4, 1e-6
    a = wishart(batch, n)
    ref = torch_inverse_root(a.double(), p, eps)
    out = torch.full_like(a, float("nan"))
    rep = fk.power(a, out, -1.0 / p, eps, FK_MATPOW_NEWTON, 100, 3e-2, FK_GEMM_ALLOW_TF32)
    err = bl.rel_err(out, ref)
    ms = bl.timed(lambda: fk.power(a, out, -1.0 / p, eps, FK_MATPOW_NEWTON, 100, 3e-2, FK_GEMM_ALLOW_TF32),
                  samples=samples, warmup=1)
    # GEMMs per iteration for p = 4: X T, T^2, T^4, T^4 M
    flops = rep.iterations * 4 * 2 * n ** 3 * batch
    out_e = torch.full_like(a, float("nan"))
    rep_e = fk.power(a, out_e, -1.0 / p, eps, FK_MATPOW_EIGH, 1, 0.0, 0)
    err_e = bl.rel_err(out_e, ref)
    eigh_ms = bl.timed(lambda: fk.power(a, out_e, -1.0 / p, eps, FK_MATPOW_EIGH, 1, 0.0, 0), samples=samples,
                       warmup=1)
    eager = bl.timed(lambda: torch_inverse_root(a, p, eps), samples=samples, warmup=1)
    comp = bl.maybe_compile(lambda x: torch_inverse_root(x, p, eps))
    compiled = bl.timed(None if comp is None else (lambda: comp(a)), samples=samples, warmup=2)
    bl.row(f"inverse 4th root f32 {batch} x {n}^2 (Newton TF32)", ms, flops / TF32_RATE * 1e3,
           {"fusekit_eigh": eigh_ms, "eager": eager, "compile": compiled}, err, 2e-2, goal,
           note=f"iters {rep.iterations} residual {rep.residual:.1e}; eigh err {err_e:.1e} (converged {rep_e.converged})")


def bench_root_f64_strict(fk, batch, n, samples):
    """The error/cost of strict f32 Newton against TF32 for the record."""
    p, eps = 4, 1e-6
    a = wishart(batch, n)
    ref = torch_inverse_root(a.double(), p, eps)
    out = torch.full_like(a, float("nan"))
    rep = fk.power(a, out, -0.25, eps, FK_MATPOW_NEWTON, 100, 5e-5, 0)
    err = bl.rel_err(out, ref)
    ms = bl.timed(lambda: fk.power(a, out, -0.25, eps, FK_MATPOW_NEWTON, 100, 5e-5, 0), samples=samples, warmup=1)
    flops = rep.iterations * 4 * 2 * n ** 3 * batch
    bl.row(f"inverse 4th root f32 {batch} x {n}^2 (Newton strict)", ms, flops / FP32_RATE * 1e3, {}, err, 1e-3,
           note=f"iters {rep.iterations} residual {rep.residual:.1e}")


def bench_per_sample(fk, b, din, dout, bw, inner):
    a = bl.rand((b, din), torch.float32)
    g = bl.rand((b, dout), torch.float32)
    out = torch.full((b, dout, din), float("nan"), device="cuda")
    fk.per_sample(a, g, out)
    err = bl.rel_err(out, g.double()[:, :, None] * a.double()[:, None, :])
    ms = bl.timed(lambda: fk.per_sample(a, g, out), inner=inner)
    eager_fn = lambda x, y: y[:, :, None] * x[:, None, :]  # noqa: E731
    eager = bl.timed(lambda: eager_fn(a, g), inner=inner)
    comp = bl.maybe_compile(eager_fn)
    compiled = bl.timed(None if comp is None else (lambda: comp(a, g)), inner=inner)
    floor = (b * din * dout * 4) / bw * 1e3  # bytes written over the copy's (read + write) rate
    bl.row(f"per-sample grads f32 B={b} {dout}x{din}", ms, floor, {"eager": eager, "compile": compiled}, err, 1e-6,
           0.43)


def bench_norms(fk, b, din, dout, bw, inner):
    a = bl.rand((b, din), torch.float32)
    g = bl.rand((b, dout), torch.float32)
    out = torch.full((b,), float("nan"), device="cuda")
    fk.norms(a, g, out)
    ref = g.double().pow(2).sum(1) * a.double().pow(2).sum(1)
    err = bl.rel_err(out, ref)
    ms = bl.timed(lambda: fk.norms(a, g, out), inner=inner)
    eager_fn = lambda x, y: y.pow(2).sum(1) * x.pow(2).sum(1)  # noqa: E731
    eager = bl.timed(lambda: eager_fn(a, g), inner=inner)
    comp = bl.maybe_compile(eager_fn)
    compiled = bl.timed(None if comp is None else (lambda: comp(a, g)), inner=inner)
    vm = torch.func.vmap(lambda x, y: torch.outer(y, x).pow(2).sum())
    vmapped = bl.timed(lambda: vm(a, g), inner=max(1, inner // 10))
    floor = b * (din + dout) * 4 / bw * 1e3
    graph = bl.graph_ms(fk, lambda: fk.norms(a, g, out), inner)
    bl.row(f"ghost norms f32 B={b} {dout}x{din}", ms, floor,
           {"eager": eager, "compile": compiled, "functorch_vmap": vmapped}, err, 1e-6, 0.02,
           note=f"host submit {bl.host_us(lambda: fk.norms(a, g, out)):.1f} us/call", extras={"graph": graph})


def bench_seq_norms(fk, b, t, din, dout, inner):
    a = bl.rand((b, t, din), torch.float32)
    g = bl.rand((b, t, dout), torch.float32)
    out = torch.full((b,), float("nan"), device="cuda")
    fk.norms(a, g, out)
    ga = a.double() @ a.double().transpose(1, 2)
    gg = g.double() @ g.double().transpose(1, 2)
    err = bl.rel_err(out, (ga * gg).sum((1, 2)))
    ms = bl.timed(lambda: fk.norms(a, g, out), inner=inner)
    eager_fn = lambda x, y: ((x @ x.transpose(1, 2)) * (y @ y.transpose(1, 2))).sum((1, 2))  # noqa: E731
    eager = bl.timed(lambda: eager_fn(a, g), inner=inner)
    comp = bl.maybe_compile(eager_fn)
    compiled = bl.timed(None if comp is None else (lambda: comp(a, g)), inner=inner)
    flops = 2 * b * t * t * (din + dout)
    bl.row(f"ghost norms f32 B={b} T={t} {dout}x{din} (Gram)", ms, flops / FP32_RATE * 1e3,
           {"eager": eager, "compile": compiled}, err, 1e-5)


def bench_clipped(fk, b, din, dout, inner):
    a = bl.rand((b, din), torch.float32)
    g = bl.rand((b, dout), torch.float32)
    sq = (g.double().pow(2).sum(1) * a.double().pow(2).sum(1))
    c = sq.sqrt().median().item()
    out = torch.full((dout, din), float("nan"), device="cuda")
    fk.clipped(a, g, c, out)
    s = (c / sq.sqrt()).clamp(max=1.0)
    err = bl.rel_err(out, (g.double() * s[:, None]).T @ a.double())
    ms = bl.timed(lambda: fk.clipped(a, g, c, out), inner=inner)
    gemm_out = torch.empty(dout, din, device="cuda")
    one_gemm = bl.timed(lambda: fk.gemm(g, a, gemm_out, op_a=bl.FK_OP_T), inner=inner)
    torch_gemm = bl.timed(lambda: torch.matmul(g.T, a), inner=inner)

    def eager_fn(x, y):
        n = (y.pow(2).sum(1) * x.pow(2).sum(1)).sqrt()
        return (y * (c / n).clamp(max=1.0)[:, None]).T @ x

    eager = bl.timed(lambda: eager_fn(a, g), inner=inner)
    comp = bl.maybe_compile(eager_fn)
    compiled = bl.timed(None if comp is None else (lambda: comp(a, g)), inner=inner)
    # GPU time alone (CUDA-graph replays) and the host's submission time per call
    clip_fn = lambda: fk.clipped(a, g, c, out)  # noqa: E731
    gemm_fn = lambda: fk.gemm(g, a, gemm_out, op_a=bl.FK_OP_T)  # noqa: E731
    ms_graph, gemm_graph = bl.graph_ms(fk, clip_fn, inner), bl.graph_ms(fk, gemm_fn, inner)
    host_clip, host_gemm = bl.host_us(clip_fn), bl.host_us(gemm_fn)
    graph_note = (f"; CUDA-graph replay {ms_graph:.4f} vs one GEMM {gemm_graph:.4f} (ratio {ms_graph / gemm_graph:.2f})"
                  if ms_graph and gemm_graph else "")
    bl.row(f"DP clipped sum f32 B={b} {dout}x{din}", ms, 2 * b * din * dout / FP32_RATE * 1e3,
           {"fusekit_one_gemm": one_gemm, "torch_matmul": torch_gemm, "eager": eager, "compile": compiled},
           err, 1e-5, 1.2 * one_gemm if one_gemm else None,
           note=f"ratio to one GEMM {ms / one_gemm:.2f}{graph_note}; host submit {host_clip:.1f} us/call "
                f"(one GEMM {host_gemm:.1f})",
           extras={"graph": ms_graph, "one_gemm_graph": gemm_graph})


def bench_stats(fk, m, n, inner):
    g = bl.rand((m, n), torch.float32)
    l0 = wishart(1, m)[0]
    r0 = wishart(1, n)[0]
    l, r = l0.clone(), r0.clone()
    fk.stats(g, l, r, 0.05, 0.95)
    gd = g.double()
    err = max(bl.rel_err(l, 0.95 * l0.double() + 0.05 * gd @ gd.T),
              bl.rel_err(r, 0.95 * r0.double() + 0.05 * gd.T @ gd))
    ms = bl.timed(lambda: fk.stats(g, l, r, 0.05, 0.95), inner=inner)

    def eager_fn(g, l, r):
        l.mul_(0.95).addmm_(g, g.T, alpha=0.05)
        r.mul_(0.95).addmm_(g.T, g, alpha=0.05)

    eager = bl.timed(lambda: eager_fn(g, l, r), inner=inner)
    comp = bl.maybe_compile(eager_fn)
    compiled = bl.timed(None if comp is None else (lambda: comp(g, l, r)), inner=inner)
    flops = m * m * n + n * n * m  # SYRK: half of the GEMMs' 2 m^2 n + 2 n^2 m
    bl.row(f"Shampoo stats f32 G {m}x{n} (L and R)", ms, flops / FP32_RATE * 1e3,
           {"eager": eager, "compile": compiled}, err, 1e-5)


def bench_precondition(fk, m, n, inner):
    g = bl.rand((m, n), torch.float32)
    l = wishart(1, m)[0]
    r = wishart(1, n)[0]
    out = torch.full_like(g, float("nan"))
    fk.precondition(l, g, r, out)
    err = bl.rel_err(out, l.double() @ g.double() @ r.double())
    ms = bl.timed(lambda: fk.precondition(l, g, r, out), inner=inner)
    eager_fn = lambda l, g, r: l @ g @ r  # noqa: E731
    eager = bl.timed(lambda: eager_fn(l, g, r), inner=inner)
    comp = bl.maybe_compile(eager_fn)
    compiled = bl.timed(None if comp is None else (lambda: comp(l, g, r)), inner=inner)
    flops = 2 * m * n * n + 2 * m * m * n
    bl.row(f"Shampoo precondition f32 {m}x{m} . {m}x{n} . {n}x{n}", ms, flops / FP32_RATE * 1e3,
           {"eager": eager, "compile": compiled}, err, 1e-5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    fk = Fk()
    bw = bl.copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}  copy bandwidth {bw / 1e12:.3f} TB/s (read + write)")
    q = args.quick
    want = lambda k: not args.only or k in args.only.split(",")  # noqa: E731
    if want("persample"):
        bench_per_sample(fk, 256, 1024, 1024, bw, 20)
        bench_norms(fk, 256, 1024, 1024, bw, 50)
        bench_seq_norms(fk, 32, 128, 1024, 1024, 10)
        bench_clipped(fk, 256, 1024, 1024, 50)
    if want("shampoo"):
        bench_stats(fk, 1024, 4096, 5)
        bench_precondition(fk, 1024, 4096, 5)
    if want("root"):
        bench_root(fk, 64, 256, 10.0, 3 if q else 5)
        bench_root(fk, 8, 1024, 15.0, 3 if q else 5)
        bench_root(fk, 1, 4096, 50.0, 3)
        bench_root_f64_strict(fk, 8, 1024, 3)
    print(f"\n{len(bl.ROWS)} rows, {bl.FAILURES[0]} wrong")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_bw=bw, rows=bl.ROWS), f, indent=1)
    sys.exit(1 if bl.FAILURES[0] else 0)


if __name__ == "__main__":
    main()
