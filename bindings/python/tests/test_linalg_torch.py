"""The fused linear layer as a torch custom op (opcheck, gradcheck, torch.compile) and
GEMM on torch CUDA tensors. Skipped without torch; the plain functions are tested in
test_linalg.py."""

import pytest

import fusekit

# ---------------------------------------------------------------- torch custom op

torch = pytest.importorskip("torch")


def _tinputs(dtype=torch.float32, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, 6, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
    w = (torch.randn(5, 6, generator=g, dtype=torch.float64) * 0.4).to(dtype).requires_grad_(True)
    b = torch.randn(5, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True) if bias else None
    return x, w, b


def _torch_ref(x, w, b, act):
    z = torch.nn.functional.linear(x, w, b)
    F = torch.nn.functional
    return {"none": z, "relu": torch.relu(z), "gelu": F.gelu(z), "gelu_tanh": F.gelu(z, approximate="tanh")}[act]


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [True, False])
def test_torch_linear_matches_torch_autograd_in_f64(act, bias):
    import fusekit.torch.linalg as fto

    x, w, b = _tinputs(seed=1, bias=bias)
    y = fto.linear(x, w, b, act)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if b is not None else None
    y64 = _torch_ref(x64, w64, b64, act)
    ref = torch.autograd.grad(y64, [t for t in (x64, w64, b64) if t is not None], dy.double())
    torch.testing.assert_close(y.double(), y64, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
@pytest.mark.parametrize("act", ["none", "gelu", "gelu_tanh"])
def test_torch_linear_gradcheck_f32(act):
    # The fused linear layer has no float64 kernel: gradcheck in float32 with
    # step and tolerances for float32 finite differences (relu is checked against
    # torch's autograd above; its kink defeats finite differences).
    import fusekit.torch.linalg as fto

    x, w, b = _tinputs(seed=2)
    assert torch.autograd.gradcheck(lambda x, w, b: fto.linear(x, w, b, act), (x, w, b),
                                    eps=1e-2, atol=5e-3, rtol=5e-3, fast_mode=False)


def test_torch_linear_opcheck_and_compile():
    import fusekit.torch.linalg as fto

    x, w, b = _tinputs(seed=3)
    for code in (2, 3):  # gelu_tanh, gelu (erf)
        torch.library.opcheck(torch.ops.fusekit.linear.default, (x, w, b, code),
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    f = torch.compile(lambda x, w, b: fto.linear(x, w, b, "gelu"), fullgraph=True, backend="eager")
    y = f(x, w, b)
    torch.testing.assert_close(y, fto.linear(x, w, b, "gelu"))
    y.sum().backward()
    assert x.grad is not None and w.grad is not None and b.grad is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.complex128])
@pytest.mark.parametrize("op_a,op_b", [("N", "N"), ("T", "C"), ("C", "N")])
def test_gemm_cuda_tensors(dtype, op_a, op_b):
    # complex128 runs fusekit's own CUDA kernel (cuBLAS 13.0's ZGEMM crashed in testing)
    g = torch.Generator(device="cuda").manual_seed(7)
    m, n, k = 37, 19, 41
    op = {"N": lambda x: x, "T": lambda x: x.mT, "C": lambda x: x.mH}
    a = torch.randn((2, m, k) if op_a == "N" else (2, k, m), generator=g, device="cuda", dtype=dtype)
    b = torch.randn((k, n) if op_b == "N" else (n, k), generator=g, device="cuda", dtype=dtype)
    c = torch.randn(2, m, n, generator=g, device="cuda", dtype=dtype)
    want = 0.5 * op[op_a](a.to(torch.complex128)) @ op[op_b](b.to(torch.complex128)) - 2.0 * c.to(torch.complex128)
    got = fusekit.gemm(a, b, op_a=op_a, op_b=op_b, alpha=0.5, beta=-2.0, c=c)
    assert got is c
    tol = 1e-4 if dtype in (torch.float32, torch.complex64) else 1e-12
    torch.testing.assert_close(c.to(torch.complex128), want, rtol=tol, atol=tol * 10)
