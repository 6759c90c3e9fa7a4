"""torch CPU tensors in and out (zero-copy), every dtype incl. bfloat16."""

import numpy as np
import pytest
from fk_testutil import TORCH_DTYPES, assert_close, assert_kept_alive, torch_rand, torch_ref
from fk_testutil import check_torch_binary, check_torch_unary, torch_elementwise_refs  # elementwise checks

torch = pytest.importorskip("torch")
import fusekit as fk  # noqa: E402

_rand = torch_rand
_ref = torch_ref


UNARY, BINARY = torch_elementwise_refs()


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, dtype):
    a, out = check_torch_binary(fk, name, dtype, (5, 7), (7,))
    assert isinstance(out, torch.Tensor) and out.dtype == a.dtype and out.shape == (5, 7)


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, dtype):
    checked = check_torch_unary(fk, name, dtype, (4, 9))
    if checked is None:
        return
    a, out = checked
    assert isinstance(out, torch.Tensor)
    if name == "abs" and a.is_complex():
        assert out.dtype == a.real.dtype
    else:
        assert out.dtype == a.dtype


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_axpby_and_scalars(dtype):
    a = _rand((3, 4), dtype, seed=4)
    b = _rand((3, 4), dtype, seed=5)
    alpha, beta = (0.5 + 1j, -2 - 0.5j) if a.is_complex() else (0.5, -2.0)
    assert_close(_ref(fk.axpby(alpha, a, beta, b)).numpy(), (alpha * _ref(a) + beta * _ref(b)).numpy(), dtype)
    assert_close(_ref(fk.scalar_add(a, alpha)).numpy(), (_ref(a) + alpha).numpy(), dtype)
    assert_close(_ref(fk.scalar_mul(a, beta)).numpy(), (_ref(a) * beta).numpy(), dtype)


def test_zero_copy_wrap_and_out():
    t = torch.arange(6.0).reshape(2, 3)
    b = fk.Buffer.from_torch(t)
    assert b.data_ptr == t.data_ptr() and b.owner is t
    out = torch.empty(2, 3)
    res = fk.scalar_mul(t, 3.0, out=out)
    assert res is out
    assert torch.equal(out, t * 3)
    fk.add(t, t, out=t)  # in place
    assert torch.equal(t, torch.arange(6.0).reshape(2, 3) * 2)


def test_strided_tensors():
    base = torch.arange(48.0, dtype=torch.float64).reshape(6, 8)
    for v in (base.t(), base[::2, 1::3], base.flip(0)[:, ::2], base.expand(2, 6, 8)):
        assert torch.equal(fk.sin(v), torch.sin(v))
        assert torch.equal(fk.copy(v), v)
    out = torch.zeros(6, 6, dtype=torch.float64).t()  # non-contiguous out
    fk.add(base[:, :6], base[:, 2:], out=out)
    assert torch.equal(out, base[:, :6] + base[:, 2:])


def test_conjugate_and_negative_views_are_resolved():
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex128)
    assert z.conj().is_conj()
    assert torch.equal(fk.copy(z.conj()), z.conj().resolve_conj())
    assert torch.equal(fk.mul(z, z.conj()), z * z.conj())
    with pytest.raises(fk.InvalidArgumentError, match="out is a lazily conjugated"):
        fk.copy(z, out=torch.empty_like(z).conj())


def test_requires_grad_out_is_refused_and_inputs_are_fine():
    a = torch.ones(3, requires_grad=True)
    out = fk.exp(a)
    assert not out.requires_grad
    with pytest.raises(fk.InvalidArgumentError, match="out requires grad"):
        fk.exp(a.detach(), out=torch.empty(3, requires_grad=True))


def test_out_version_counter_is_bumped():
    out = torch.empty(3)
    v = out._version
    fk.exp(torch.zeros(3), out=out)
    assert out._version > v


def test_mixed_numpy_and_torch_gives_torch():
    a = torch.arange(3.0)
    b = np.arange(3.0, dtype=np.float32)
    out = fk.add(a, b)
    assert isinstance(out, torch.Tensor) and torch.equal(out, a * 2)


def test_wrapped_tensor_is_kept_alive():
    def use(b):
        assert torch.equal(torch.from_dlpack(fk.neg(b)), -torch.arange(4.0))

    assert_kept_alive(lambda: torch.arange(4.0), fk.Buffer.from_torch, use)


def test_buffer_copy_from_torch_bfloat16():
    src = torch.linspace(-1, 1, 6, dtype=torch.bfloat16)
    b = fk.Buffer.empty("cpu", (6,), "bf16").copy_from(src)
    assert torch.equal(torch.from_dlpack(b), src)
    z = fk.Buffer.zeros("cpu", (2,), "bf16")
    assert torch.equal(torch.from_dlpack(z), torch.zeros(2, dtype=torch.bfloat16))


def test_unsupported_torch_dtype_names_argument():
    with pytest.raises(fk.UnsupportedDtypeError, match="a"):
        fk.neg(torch.arange(3))


def test_broadcast_shapes_for_torch():
    a = torch.ones(3, 1, 2)
    b = torch.ones(4, 1)
    assert fk.add(a, b).shape == (3, 4, 2)
