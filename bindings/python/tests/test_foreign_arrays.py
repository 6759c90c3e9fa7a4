"""Other libraries' arrays through the ctypes package's functions (``fusekit.add``
& co., not fusekit.jax): imported through DLPack without a copy, results handed
back as the caller's kind of array through its library's ``from_dlpack``.

Two libraries on the CPU: JAX (jax.Array on the CPU backend), and ``Fake``, a
stand-in for CuPy written here: an array type of its own over numpy memory with
``__dlpack__`` / ``__dlpack_device__``, a namespace with ``from_dlpack``
(``__array_namespace__``), and CuPy's refusals: ``numpy.asarray`` of it raises,
and its ``asarray`` of an object it does not know goes through ``numpy.array``
and raises CuPy's "Unsupported dtype object" unless that gives an array of
numbers (a fusekit.Buffer gives dtype object). CuPy's own path (fusekit knows
its allocator: results are CuPy's arrays) runs on foreign_testutil.fake_cupy, a
module named cupy over host memory. The CuPy and JAX CUDA arrays are in
test_foreign_gpu.py.
"""

import sys

import numpy as np
import pytest

import fusekit
from foreign_testutil import Producer, fake_cupy, record_allocations

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402


@pytest.fixture(autouse=True)
def _jax_on_the_cpu():
    """This file's arrays are host memory (numpy, the fakes): its jax arrays are made
    on the CPU device too (on a GPU machine jax's default device is CUDA, and a CUDA
    jax array next to host memory is a device mismatch; test_foreign_gpu.py covers
    CUDA arrays)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


class FakeNamespace:
    """The fake library's namespace: ``from_dlpack`` counts what it imports."""

    def __init__(self):
        self.imports = 0

    def from_dlpack(self, x):
        self.imports += 1
        return Fake(np.from_dlpack(x))

    @staticmethod
    def asarray(obj):
        """CuPy's ``asarray`` of an object it does not know: ``numpy.array`` of it,
        refused unless that is an array of numbers."""
        if isinstance(obj, Fake):
            return obj
        a = np.array(obj)
        if a.dtype == object:
            raise ValueError("Unsupported dtype object")  # CuPy's message
        return Fake(a)


FAKE = FakeNamespace()


class Fake(Producer):
    """A foreign library's array over numpy memory (see the module documentation)."""

    def __array_namespace__(self, api_version=None):
        return FAKE

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed (as CuPy)")

    @property
    def shape(self):
        return self._a.shape

    def get(self):
        """A numpy copy (CuPy's name)."""
        return self._a.copy()

    @property
    def ptr(self) -> int:
        return self._a.ctypes.data


def values(x):
    return x.get() if isinstance(x, Fake) else np.asarray(x)


def close(got, want, tol=1e-12):
    np.testing.assert_allclose(values(got), want, rtol=tol, atol=tol)


@pytest.fixture
def problem(rng):
    """float64 operands of every family, as numpy arrays."""
    n = 4
    L = np.tril(rng.standard_normal((n, 3, 3)) * 0.2)
    L[:, [0, 1, 2], [0, 1, 2]] = 0.6 + rng.random((n, 3))
    q, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    return {
        "a": rng.standard_normal((6, 5)), "b": rng.standard_normal((5,)), "m": rng.standard_normal((5, 4)),
        "x": rng.standard_normal((7, 5)), "w": rng.standard_normal((3, 5)), "bias": rng.standard_normal((3,)),
        "p": rng.standard_normal((9, 3)), "mu": rng.standard_normal((n, 3)), "L": L, "wt": rng.standard_normal(n),
        "v": rng.standard_normal((6, 5)), "U": 0.3 * rng.standard_normal((5, 2)),
        "W": 0.3 * rng.standard_normal((5, 2)),
        "spd": (q * np.geomspace(1.0, 10.0, 5)) @ q.T, "g": rng.standard_normal((5, 4)),
    }


def reference(name, d):
    """numpy in float64 of each call in CALLS."""
    if name == "sigmoid":
        return 1 / (1 + np.exp(-d["a"]))
    if name == "add":
        return d["a"] + d["b"]
    if name == "axpby":
        return 2 * d["a"] - 0.5 * d["b"]
    if name == "gemm":
        return d["a"] @ d["m"]
    if name == "gaussian_field_forward":
        m = np.linalg.solve(d["L"][None], (d["p"][:, None] - d["mu"][None])[..., None])[..., 0]
        return (d["wt"] * np.exp(-0.5 * (m ** 2).sum(-1))).sum(-1)
    if name == "christoffel_forward":
        return np.clip((d["v"] @ d["U"]) ** 2 @ d["W"].T, -5.0, 5.0)
    if name == "leapfrog_forward":
        x, v = d["v"], 0.5 * d["v"]
        for _ in range(2):
            vh = v + 0.05 * -np.clip((v @ d["U"]) ** 2 @ d["W"].T, -5, 5)
            x = x + 0.1 * vh
            v = vh + 0.05 * -np.clip((vh @ d["U"]) ** 2 @ d["W"].T, -5, 5)
        return x, v
    if name == "matrix_power":
        lam, q = np.linalg.eigh(d["spd"])
        return (q * lam ** -0.25) @ q.T
    if name == "shampoo_precondition":
        return d["spd"] @ d["g"]
    if name == "per_sample_grad_norms":
        return (d["x"] ** 2).sum(-1) * (d["x"][:, :3] ** 2).sum(-1)
    raise KeyError(name)


#: one plain function of every family float64 reaches (fk_linear / fk_mlp are
#: float16/bfloat16/float32: test_linear_and_mlp_in_float32), each on arrays of ``conv``
CALLS = {
    "sigmoid": lambda c, d: fusekit.sigmoid(c(d["a"])),
    "add": lambda c, d: fusekit.add(c(d["a"]), c(d["b"])),
    "axpby": lambda c, d: fusekit.axpby(2.0, c(d["a"]), -0.5, c(d["b"])),
    "gemm": lambda c, d: fusekit.gemm(c(d["a"]), c(d["m"])),
    "gaussian_field_forward": lambda c, d: fusekit.gaussian_field_forward(
        c(d["p"]), c(d["mu"]), c(d["L"]), c(d["wt"]), 0.0),
    "christoffel_forward": lambda c, d: fusekit.christoffel_forward(c(d["v"]), c(d["U"]), c(d["W"])),
    "leapfrog_forward": lambda c, d: fusekit.leapfrog_forward(c(d["v"]), c(0.5 * d["v"]), c(d["U"]), c(d["W"]),
                                                              0.1, 2),
    "matrix_power": lambda c, d: fusekit.matrix_power(c(d["spd"]), -0.25, method="eigh"),
    "shampoo_precondition": lambda c, d: fusekit.shampoo_precondition(c(d["g"]), c(d["spd"])),
    "per_sample_grad_norms": lambda c, d: fusekit.per_sample_grad_norms(c(d["x"]), c(d["x"][:, :3].copy())),
}

KINDS = {
    "jax": (lambda a: jnp.asarray(a), jax.Array),
    "fake": (lambda a: Fake(np.array(a)), Fake),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", list(CALLS))
def test_every_family_hands_back_the_callers_kind(problem, name, kind):
    conv, cls = KINDS[kind]
    got = CALLS[name](conv, problem)
    want = reference(name, problem)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert isinstance(g, cls), type(g)
        close(g, w)


def test_linear_and_mlp_in_float32(rng):
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (4, 16), (4,)))
    want = np.maximum(x.astype(np.float64) @ w.T + b, 0)
    for conv, cls in KINDS.values():
        y = fusekit.linear_forward(conv(x), conv(w), conv(b), act="relu")
        assert isinstance(y, cls)
        close(y, want, 1e-5)
        y = fusekit.mlp_forward(conv(x), [conv(w)], [conv(b)], hidden_act="relu", out_act="relu")
        assert isinstance(y, cls)
        close(y, want, 1e-5)


def test_cupy_like_arrays_never_reach_numpy(rng):
    """The CuPy failure: numpy on a CuPy array is an error, and CuPy cannot read a
    fusekit.Buffer (numpy.array of it has dtype object). Every path takes DLPack
    first and hands back the caller's kind."""
    a = rng.standard_normal((1000, 3))
    with pytest.raises(TypeError):
        np.asarray(Fake(a))
    before = FAKE.imports
    y = fusekit.sigmoid(Fake(a))
    assert isinstance(y, Fake) and FAKE.imports == before + 1
    close(y, 1 / (1 + np.exp(-a)))
    assert FAKE.asarray(y) is y
    with pytest.raises(ValueError, match="Unsupported dtype object"):
        FAKE.asarray(fusekit.Buffer.empty("cpu", (1, 3), "float64"))  # the result before: CuPy's error


def test_jax_results_are_zero_copy(monkeypatch, rng):
    """A jax result is fusekit's own allocation, taken by jax without a copy; a
    jax input is read in place."""
    made = record_allocations(monkeypatch)
    x = jnp.asarray(rng.standard_normal((64, 32)))
    y = fusekit.exp(x)
    assert made and y.unsafe_buffer_pointer() == made[-1]
    assert fusekit.from_dlpack(x).data_ptr == x.unsafe_buffer_pointer()
    close(y, np.exp(np.asarray(x)))


def test_a_library_that_copies_at_import_gets_the_values(rng):
    """jax copies a one-element array at import instead of taking fusekit's memory:
    the result is copied into jax's array after the op."""
    for shape in ((1,), (), (0,), (3,)):
        x = jnp.asarray(rng.standard_normal(shape))
        y = fusekit.exp(x)
        assert isinstance(y, jax.Array) and y.shape == shape
        close(y, np.exp(np.asarray(x)))


def test_in_place_out_of_the_callers_kind(rng):
    a = rng.standard_normal((4, 5))
    x = Fake(a.copy())
    ptr = x.ptr
    assert fusekit.exp(x, out=x) is x  # written through the import: zero copy
    assert x.ptr == ptr
    close(x, np.exp(a))
    L, R = Fake(np.eye(4)), Fake(np.eye(5))
    g = Fake(a)
    out = fusekit.shampoo_stats(g, L, R, alpha=1.0, beta=1.0)
    assert out[0] is L and out[1] is R
    close(L, np.eye(4) + a @ a.T)
    close(R, np.eye(5) + a.T @ a)


def test_out_errors(rng):
    a = rng.standard_normal((4, 5))
    with pytest.raises(fusekit.InvalidArgumentError, match="out is a jax array, which cannot be written in place"):
        fusekit.exp(jnp.asarray(a), out=jnp.zeros((4, 5)))
    with pytest.raises(fusekit.InvalidArgumentError, match="l is a jax array"):
        fusekit.shampoo_stats(jnp.asarray(a), jnp.eye(4), jnp.eye(5))
    ro = a.copy()
    ro.flags.writeable = False
    with pytest.raises(fusekit.InvalidArgumentError, match="out is read-only"):
        fusekit.exp(Fake(a), out=Fake(ro))
    close(fusekit.exp(Fake(ro)), np.exp(a))  # read-only inputs are fine


def test_strided_inputs(rng):
    """A transposed view imports with its strides: elementwise ops read it as it
    is; an op that needs contiguous operands says so."""
    a = rng.standard_normal((5, 4))
    close(fusekit.exp(Fake(a.T)), np.exp(a.T))
    with pytest.raises(fusekit.Error, match="contiguous"):
        fusekit.shampoo_precondition(Fake(a.T), Fake(np.eye(4)))


def test_mixed_kinds_follow_the_documented_rule(rng):
    """torch > another library (the first one's) > Buffer > numpy."""
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    want = a + b
    buf = fusekit.as_buffer(b.copy())
    for x, y, cls in [
        (jnp.asarray(a), b, jax.Array),
        (a, Fake(b.copy()), Fake),
        (buf, jnp.asarray(a), jax.Array),
        (Fake(a.copy()), jnp.asarray(b), Fake),
        (jnp.asarray(a), Fake(b.copy()), jax.Array),
        (a, buf, fusekit.Buffer),
    ]:
        got = fusekit.add(x, y)
        assert isinstance(got, cls), (type(x), type(y), type(got))
        close(got.to_numpy() if isinstance(got, fusekit.Buffer) else got, want)
    torch = pytest.importorskip("torch")
    got = fusekit.add(torch.from_numpy(a.copy()), jnp.asarray(b))
    assert isinstance(got, torch.Tensor)
    close(got.numpy(), want)


def test_traced_jax_values_point_to_fusekit_jax():
    with pytest.raises(fusekit.InvalidArgumentError, match=r"traced jax value .* use fusekit.jax.sigmoid"):
        jax.jit(fusekit.sigmoid)(jnp.ones(3))


def test_a_library_without_from_dlpack_gets_a_buffer(rng):
    """An object with ``__dlpack__`` whose library has no ``from_dlpack`` anywhere
    still works: the result is a fusekit.Buffer, as before."""
    a = rng.standard_normal((3, 2))
    got = fusekit.tanh(Producer(a))
    assert isinstance(got, fusekit.Buffer)
    close(got.to_numpy(), np.tanh(a))


def test_cupy_results_are_cupys_own_arrays(monkeypatch, rng):
    """A CuPy result is allocated by CuPy (``cupy.empty`` on the inputs' device)
    and written in place by the op, zero copy: no fusekit allocation, no import
    of fusekit memory, so CuPy's allocator frees it. (A fusekit allocation handed
    to ``cupy.from_dlpack`` was freed on the stream it was allocated on, CuPy's
    current one, which CuPy destroys with its Stream object: a crash on CUDA when
    the result outlived the stream.)"""
    cupy = fake_cupy(monkeypatch)
    made = record_allocations(monkeypatch)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal(5)
    y = fusekit.exp(cupy.ndarray(a.copy()))
    assert y is cupy.made[-1] and cupy.devices == [0] and cupy.dtypes == [np.float64]
    close(y.get(), np.exp(a))
    for x, y in ((a, cupy.ndarray(b.copy())), (cupy.ndarray(a.copy()), jnp.asarray(b))):
        got = fusekit.add(x, y)
        assert got is cupy.made[-1]  # the first library among the arguments allocates
        close(got.get(), a + b)
    U, W = 0.3 * rng.standard_normal((5, 2)), 0.3 * rng.standard_normal((5, 2))
    xT, vT = fusekit.leapfrog_forward(*(cupy.ndarray(v.copy()) for v in (a, 0.5 * a, U, W)), 0.1, 2)
    assert xT is cupy.made[-2] and vT is cupy.made[-1]  # each output is CuPy's
    x, v = reference("leapfrog_forward", {"v": a, "U": U, "W": W})
    close(xT.get(), x)
    close(vT.get(), v)
    assert made == [] and cupy.imports == [0]
    x = cupy.ndarray(a.copy())
    assert fusekit.exp(x, out=x) is x and len(cupy.made) == 5  # out= allocates nothing


def test_cupy_bfloat16_results(monkeypatch):
    """bfloat16, which numpy lacks: CuPy is asked for ml_dtypes' bfloat16 where
    ml_dtypes is loaded (a CuPy that knows it takes it), else the call is refused
    before anything is allocated."""
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    cupy = fake_cupy(monkeypatch)
    made = record_allocations(monkeypatch)
    t = torch.linspace(-1, 1, 8, dtype=torch.bfloat16)
    y = fusekit.exp(cupy.ndarray(t))
    assert y is cupy.made[-1] and cupy.dtypes == [ml_dtypes.bfloat16]
    torch.testing.assert_close(y.get(), torch.exp(t))
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(fusekit.UnsupportedDtypeError, match="cupy has no bfloat16 arrays"):
        fusekit.exp(cupy.ndarray(t))
    assert made == [] and len(cupy.made) == 1
