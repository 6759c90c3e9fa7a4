"""Tests of the fusekit_ext PyTorch extension against torch itself.

    pip install torch pytest ninja
    cargo build --release
    python -m pytest bindings/cpp/torch_extension/test_extension.py -v

Runs on the CPU always and on CUDA when torch sees a GPU (and the extension was
built with CUDA: see build.py). Skipped as a whole when torch is not installed.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import build  # noqa: E402


@pytest.fixture(scope="module")
def ext():
    if not build.ensure_ninja_on_path():
        pytest.skip("torch.utils.cpp_extension needs ninja (pip install ninja)")
    return build.load()


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available():
        devs.append("cuda")
    return devs


DEVICES = _devices()
REAL = [torch.float32, torch.float64]
COMPLEX = [torch.complex64, torch.complex128]


def tol(dtype):
    if dtype in (torch.float64, torch.complex128):
        return dict(rtol=1e-12, atol=1e-12)
    if dtype in (torch.float16, torch.bfloat16):
        return dict(rtol=1e-2, atol=1e-2)
    return dict(rtol=1e-5, atol=1e-6)


def rand(shape, dtype, device, positive=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        real = torch.float32 if dtype == torch.complex64 else torch.float64
        t = torch.complex(torch.randn(shape, generator=g, dtype=real), torch.randn(shape, generator=g, dtype=real))
    else:
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        if positive:
            t = t.abs() + 0.1
        t = t.to(dtype)
    return t.to(device)


def assert_close(got, ref, dtype=None):
    dtype = dtype or ref.dtype
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.device == ref.device
    torch.testing.assert_close(got, ref, **tol(dtype))


def cuda_extension(ext, device):
    if device == "cuda" and not build.want_cuda():
        pytest.skip("extension built without CUDA (no CUDA toolkit found)")


# ---------------------------------------------------------------- binary ops


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", REAL + COMPLEX)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_broadcast(ext, device, dtype, op):
    cuda_extension(ext, device)
    a = rand((7, 5, 33), dtype, device, seed=1)
    b = rand((5, 1), dtype, device, seed=2)
    ref = getattr(torch, op)(a, b)
    assert_close(getattr(ext, op)(a, b), ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", REAL)
def test_binary_strided_inputs(ext, device, dtype):
    cuda_extension(ext, device)
    base = rand((40, 64), dtype, device, seed=3)
    a = base.t()[:, ::2]  # transposed and sliced: shape [64, 20], strides [1, 128]
    assert not a.is_contiguous()
    b = rand((20,), dtype, device, seed=4).expand(64, 20)  # stride 0
    assert_close(ext.mul(a, b), a * b)
    c = base[:39:3, 1::2]  # [13, 32], both dims strided, storage offset 1
    d = base[1::3, ::2]  # [13, 32]
    col = base[2::3, 5:6]  # [13, 1], strided column, broadcast over 32
    assert_close(ext.sub(c, d), c - d)
    assert_close(ext.div(c, col), c / col)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_axpby(ext, device, dtype):
    cuda_extension(ext, device)
    a = rand((1000, 3), dtype, device, seed=5)
    b = rand((3,), dtype, device, seed=6)
    if dtype.is_complex:
        alpha, beta = 0.5 - 2j, 1.5j
    else:
        alpha, beta = 2.0, -0.25
    assert_close(ext.axpby(a, b, alpha, beta), alpha * a + beta * b)
    assert_close(ext.axpby(a, b), a + b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", REAL)
def test_scalar_ops(ext, device, dtype):
    cuda_extension(ext, device)
    a = rand((129,), dtype, device, seed=7)
    assert_close(ext.scalar_add(a, 0.75), a + 0.75)
    assert_close(ext.scalar_mul(a, -3.0), a * -3.0)


def test_imaginary_scalar_on_real_dtype_raises(ext):
    a = torch.ones(4)
    with pytest.raises(ext.FusekitError, match="FK_ERROR_INVALID_ARGUMENT.*imaginary"):
        ext.scalar_mul(a, 1j)


# ---------------------------------------------------------------- unary ops

UNARY = ["neg", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", REAL + COMPLEX)
@pytest.mark.parametrize("op", UNARY)
def test_unary(ext, device, dtype, op):
    cuda_extension(ext, device)
    a = rand((3, 257), dtype, device, positive=op in ("log", "sqrt"), seed=8)
    assert_close(getattr(ext, op)(a), getattr(torch, op)(a))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", REAL)
def test_relu_abs_copy_real(ext, device, dtype):
    cuda_extension(ext, device)
    a = rand((16, 9), dtype, device, seed=9).t()
    assert_close(ext.relu(a), torch.relu(a))
    assert_close(ext.abs(a), torch.abs(a))
    c = ext.copy(a)
    assert c.is_contiguous() and torch.equal(c, a)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_abs_is_real(ext, device, dtype):
    cuda_extension(ext, device)
    a = rand((50,), dtype, device, seed=10)
    r = ext.abs(a)
    assert not r.dtype.is_complex
    assert_close(r, torch.abs(a))


def test_complex_relu_raises(ext):
    with pytest.raises(ext.FusekitError, match="FK_ERROR_UNSUPPORTED_DTYPE.*fk_relu"):
        ext.relu(torch.ones(3, dtype=torch.complex64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types(ext, device, dtype):
    cuda_extension(ext, device)
    a = rand((64,), dtype, device, seed=11)
    b = rand((64,), dtype, device, seed=12)
    assert_close(ext.add(a, b), a + b)
    assert_close(ext.exp(a), torch.exp(a))


# ---------------------------------------------------------------- in place, errors


@pytest.mark.parametrize("device", DEVICES)
def test_add_in_place(ext, device):
    cuda_extension(ext, device)
    a = rand((10, 4), torch.float32, device, seed=13)
    b = rand((4,), torch.float32, device, seed=14)
    ref = a + b
    ptr = a.data_ptr()
    r = ext.add_(a, b)
    assert r.data_ptr() == ptr
    assert_close(a, ref)


def test_dtype_mismatch_raises_fusekit_error(ext):
    a = torch.ones(4, dtype=torch.float32)
    b = torch.ones(4, dtype=torch.float64)
    with pytest.raises(ext.FusekitError) as ei:
        ext.add(a, b)
    msg = str(ei.value)
    assert "FK_ERROR_DTYPE_MISMATCH" in msg and "fk_add" in msg and "dtypes differ" in msg
    assert isinstance(ei.value, RuntimeError)


def test_unsupported_torch_dtype(ext):
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        ext.exp(torch.ones(3, dtype=torch.int32))


def test_version_and_device_name(ext):
    assert ext.version().startswith("fusekit ")
    assert ext.device_name(torch.ones(1))


# ---------------------------------------------------------------- CUDA streams


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_runs_on_current_stream(ext):
    """Ops are queued on torch's current stream: work before and after them on a
    side stream orders with them without any synchronisation."""
    cuda_extension(ext, "cuda")
    n = 1 << 24
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for i in range(5):
            x = torch.full((n,), float(i), device="cuda")
            x.mul_(2.0).add_(1.0)  # queued on s right before the fusekit op
            y = ext.axpby(x, x, 0.5, 0.25)  # must see x = 2i + 1
            y.add_(1.0)  # queued on s after it
            expect = 0.75 * (2 * i + 1) + 1.0
            s.synchronize()
            assert torch.all(y == expect).item(), f"iteration {i}: stream ordering broken"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_device_mismatch(ext):
    cuda_extension(ext, "cuda")
    with pytest.raises(RuntimeError, match="is on"):
        ext.add(torch.ones(3, device="cuda"), torch.ones(3))
