#!/usr/bin/env python3
"""Where the host time of a torch call goes (CUDA only): torch.add against
fusekit.add and the compiled op it calls (with and without an output to allocate),
fk_buffer_wrap through ctypes on CUDA and CPU memory, and the fused linear layer at
two sizes: the C entry point on pre-wrapped buffers, the op through
register_autograd's kernel and below the autograd key, the wrapper with and
without a gradient wanted, forward + backward, the backward op alone, against
PyTorch's relu(F.linear) and its backward kernels. Each row: the minimum over 3
medians of many calls, synchronising every 100 calls.

    python3 benches/torch_host_breakdown.py
"""
import ctypes, pathlib, sys
import torch, torch.nn.functional as F
import fusekit, fusekit.torch.linalg as to
from fusekit import _lib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from host_overhead import host_us as _host_us  # the benches' timing loop
print("torch", torch.__version__, torch.cuda.get_device_name())
dev = "cuda"
def host_us(fn, n=3000):
    return min(_host_us(fn, torch.cuda.synchronize, n, sync_every=100) for _ in range(3))
rows = []
def row(name, fn, n=3000): rows.append((name, host_us(fn, n)))
a = torch.randn(256, device=dev); b = torch.randn(256, device=dev); o = torch.empty_like(a)
row("torch.add(a,b)", lambda: torch.add(a, b))
row("torch.add(a,b,out=o)", lambda: torch.add(a, b, out=o))
row("torch.empty(256)", lambda: torch.empty(256, device=dev))
row("fusekit.add(a,b)", lambda: fusekit.add(a, b))
bo = torch.ops.fusekit.binary_out.default; bi = torch.ops.fusekit.binary.default
row("binary.default", lambda: bi(a, b, 0))
row("binary_out.default", lambda: bo(a, b, 0, o))
L = _lib.lib()
ctx = fusekit.default_context("cuda"); cpu = fusekit.default_context("cpu")
shape = (ctypes.c_int64 * 1)(256); h = ctypes.POINTER(_lib.fk_buffer)()
def wrap_destroy(c, ptr):
    L.fk_buffer_wrap(c.handle, ptr, 3, 1, shape, None, ctypes.byref(h)); L.fk_buffer_destroy(h)
row("ctypes fk_buffer_wrap+destroy cuda", lambda: wrap_destroy(ctx, a.data_ptr()))
hc = torch.randn(256)
row("ctypes fk_buffer_wrap+destroy cpu", lambda: wrap_destroy(cpu, hc.data_ptr()))
row("ctypes fk_abi_version", lambda: L.fk_abi_version())
for M, K, N in ((64, 256, 256), (256, 1024, 1024)):
    x = torch.randn(M, K, device=dev); w = torch.randn(N, K, device=dev); bb = torch.randn(N, device=dev)
    op = torch.ops.fusekit.linear.default
    with torch.no_grad():
        row(f"[{M},{K},{N}] op linear no_grad (py autograd kernel)", lambda: op(x, w, bb, 1))
        def below():
            with torch._C._AutoDispatchBelowAutograd():
                return op(x, w, bb, 1)
        row(f"[{M},{K},{N}] op linear below-autograd", below)
        row(f"[{M},{K},{N}] wrapper linear no_grad", lambda: to.linear(x, w, bb, "relu"))
        row(f"[{M},{K},{N}] torch relu(F.linear) no_grad", lambda: torch.relu(F.linear(x, w, bb)))
        row(f"[{M},{K},{N}] torch F.linear no_grad", lambda: F.linear(x, w, bb))
        row(f"[{M},{K},{N}] torch addmm no_grad", lambda: torch.addmm(bb, x, w.t()))
        X = fusekit.Buffer.from_torch(x); Wb = fusekit.Buffer.from_torch(w); Bb = fusekit.Buffer.from_torch(bb)
        y = torch.empty(M, N, device=dev); Y = fusekit.Buffer.from_torch(y)
        st = fusekit.Stream.wrap(ctx, torch.cuda.current_stream().cuda_stream)
        row(f"[{M},{K},{N}] ctypes fk_linear_forward prewrapped", lambda: L.fk_linear_forward(X.handle, Wb.handle, Bb.handle, 1, Y.handle, None, st.handle))
    xr = x.clone().requires_grad_(); wr = w.clone().requires_grad_(); br = bb.clone().requires_grad_()
    row(f"[{M},{K},{N}] wrapper linear fwd (grad)", lambda: to.linear(xr, wr, br, "relu"))
    row(f"[{M},{K},{N}] op linear fwd (grad, register_autograd)", lambda: op(xr, wr, br, 1))
    row(f"[{M},{K},{N}] torch relu(F.linear) fwd (grad)", lambda: torch.relu(F.linear(xr, wr, br)))
    row(f"[{M},{K},{N}] wrapper fwd+bwd", lambda: to.linear(xr, wr, br, "relu").sum().backward(), 1000)
    row(f"[{M},{K},{N}] torch fwd+bwd", lambda: torch.relu(F.linear(xr, wr, br)).sum().backward(), 1000)
    gy = torch.randn(M, N, device=dev)
    yy, _ = op(x, w, bb, 1)
    bop = torch.ops.fusekit.linear_backward.default
    with torch.no_grad():
        row(f"[{M},{K},{N}] op linear_backward", lambda: bop(gy, x, w, yy, 1, 7))
        row(f"[{M},{K},{N}] torch mm+mm+sum+threshold_backward", lambda: (gy @ w, gy.t() @ x, gy.sum(0), torch.ops.aten.threshold_backward(gy, yy, 0)))
    xs = x.clone().requires_grad_()
    row(f"[{M},{K},{N}] (x*2).sum().backward() engine base", lambda: (xs * 2).sum().backward(), 1000)
    yw = to.linear(xr, wr, br, "relu")
    row(f"[{M},{K},{N}] wrapper bwd only (retain_graph)", lambda: yw.backward(gy, retain_graph=True), 1000)
    yt = torch.relu(F.linear(xr, wr, br))
    row(f"[{M},{K},{N}] torch bwd only (retain_graph)", lambda: yt.backward(gy, retain_graph=True), 1000)
for r in rows: print(f"{r[0]:60s} {r[1]:8.2f} us")
