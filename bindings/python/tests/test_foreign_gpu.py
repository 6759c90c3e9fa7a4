"""CuPy and JAX CUDA arrays through the ctypes package's functions (``fusekit.add``
& co.): results come back as the caller's kind of array on its GPU, zero copy,
ordered with the caller's streams, their memory on a stream that outlives it (a
CuPy result is CuPy's own allocation: it outlives CuPy's stream objects). The CPU
side of the same rules is test_foreign_arrays.py.

The CuPy tests need cupy with a CUDA device (``pip install cupy-cuda13x``), the
JAX ones jax with its CUDA plugin; each group is skipped without. The GPU suite's
``python`` step runs this file.
"""

import gc

import numpy as np
import pytest

import fusekit
from foreign_testutil import record_allocations
from fusekit._stream import _stream_raw_of, resolve_stream


def _cupy():
    try:
        import cupy

        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # noqa: BLE001 - not installed, or no usable device
        return None


def _jax_gpu():
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        return jax.devices("cuda")[0]
    except Exception:  # noqa: BLE001 - no jax, or no CUDA backend
        return None


cp = _cupy()
GPU = _jax_gpu()
need_cupy = pytest.mark.skipif(cp is None, reason="needs cupy with a CUDA device (pip install cupy-cuda13x)")
need_jax = pytest.mark.skipif(GPU is None, reason="needs jax with a CUDA backend")


def close(got, want, tol):
    got = cp.asnumpy(got) if cp is not None and isinstance(got, cp.ndarray) else np.asarray(got)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def gaussians(rng, b, n):
    p, m = rng.standard_normal((b, 3)), rng.standard_normal((n, 3))
    L = np.tril(rng.standard_normal((n, 3, 3)) * 0.2)
    L[:, [0, 1, 2], [0, 1, 2]] = 0.6 + rng.random((n, 3))
    w = rng.standard_normal(n)
    d = np.linalg.solve(L[None], (p[:, None] - m[None])[..., None])[..., 0]
    return (p, m, L, w), (w * np.exp(-0.5 * (d ** 2).sum(-1))).sum(-1)


def spd(rng, n):
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    lam = np.geomspace(1.0, 10.0, n)
    return (q * lam) @ q.T, (q * lam ** -0.25) @ q.T


def every_family(rng, put, cls, check_device):
    """The issue's call and one op of each family on arrays made by ``put``."""
    a = rng.random((1000, 3))
    y = fusekit.sigmoid(put(a))  # the call that failed on the H100
    assert isinstance(y, cls)
    check_device(y)
    close(y, 1 / (1 + np.exp(-a)), 1e-12)
    b = rng.standard_normal(3)
    close(fusekit.add(put(a), put(b)), a + b, 1e-12)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (16, 32), (16,)))
    y = fusekit.linear_forward(put(x), put(w), put(bias), act="relu")
    assert isinstance(y, cls)
    close(y, np.maximum(x.astype(np.float64) @ w.T + bias, 0), 1e-4)
    args, want = gaussians(rng, 200, 7)
    close(fusekit.gaussian_field_forward(*(put(v) for v in args), 0.0), want, 1e-10)
    A, root = spd(rng, 48)
    close(fusekit.matrix_power(put(A), -0.25, method="eigh"), root, 1e-9)
    v, U, W = rng.standard_normal((8, 6)), 0.3 * rng.standard_normal((6, 2)), 0.3 * rng.standard_normal((6, 2))
    xT, vT = fusekit.leapfrog_forward(put(v), put(v), put(U), put(W), 0.1, 1)
    assert isinstance(xT, cls) and isinstance(vT, cls)
    vh = v + 0.05 * -np.clip((v @ U) ** 2 @ W.T, -5, 5)
    close(xT, v + 0.1 * vh, 1e-10)


@need_cupy
def test_cupy_arrays_come_back_as_cupy_arrays(rng):
    every_family(rng, cp.asarray, cp.ndarray, lambda y: y.device.id == cp.cuda.Device().id)


@need_cupy
def test_cupy_in_place_is_zero_copy(rng):
    x = cp.random.rand(1000, 3)
    want = cp.exp(x)
    ptr = x.data.ptr
    assert fusekit.exp(x, out=x) is x and x.data.ptr == ptr
    close(x, cp.asnumpy(want), 1e-12)
    L, R, g = cp.eye(4), cp.eye(5), cp.random.rand(4, 5)
    fusekit.shampoo_stats(g, L, R)
    close(L, np.eye(4) + cp.asnumpy(g @ g.T), 1e-12)


@need_cupy
def test_cupy_runs_on_cupys_current_stream(rng):
    with cp.cuda.Stream(non_blocking=True) as s:
        # x made on s: a non-blocking stream does not wait for CuPy's null stream
        x = cp.random.rand(1 << 22)
        with fusekit.Invocation("test") as inv:
            inv.input(x, "x")
            assert inv.stream.cuda_stream == s.ptr
        y = fusekit.exp(x)
        z = y * 2  # queued on s after fusekit's kernel
        s.synchronize()
    close(z, 2 * np.exp(cp.asnumpy(x)), 1e-12)


@need_cupy
def test_cupy_results_are_cupys_own_memory(monkeypatch, rng):
    """A result is CuPy's allocation (its memory pool), written in place by the
    op: fusekit allocates nothing, CuPy's allocator frees it."""
    made = record_allocations(monkeypatch)
    pool = cp.get_default_memory_pool()
    with cp.cuda.Stream(non_blocking=True) as s:
        x = cp.random.rand(1 << 20)  # on s (see test_cupy_runs_on_cupys_current_stream)
        before = pool.used_bytes()
        y = fusekit.exp(x)
        assert made == [] and pool.used_bytes() >= before + y.nbytes
        s.synchronize()
    close(y, np.exp(cp.asnumpy(x)), 1e-12)


@need_cupy
def test_cupy_result_outlives_cupys_current_stream(rng):
    """test_cupy_runs_on_cupys_current_stream's sequence, then the stream object
    goes (CuPy destroys the CUstream) before the result: nothing of fusekit
    outlived the call on that stream (the crash: the result's memory was
    fusekit's, freed on the destroyed stream)."""
    x = cp.random.rand(1 << 22)
    want = np.exp(cp.asnumpy(x))
    with cp.cuda.Stream(non_blocking=True) as s:
        y = fusekit.exp(x)
        z = y * 2  # queued on s after fusekit's kernel
        s.synchronize()
    del s
    gc.collect()
    close(z, 2 * want, 1e-12)
    close(y, want, 1e-12)
    del y
    gc.collect()
    del z
    gc.collect()
    cp.cuda.Device().synchronize()


@need_cupy
def test_cupy_result_outlives_an_explicit_stream(rng):
    """``stream=`` a CuPy stream that goes before the result."""
    x = cp.random.rand(1 << 22)
    other = cp.cuda.Stream(non_blocking=True)
    y = fusekit.exp(x, stream=other.ptr)
    total = float(y.sum())  # on CuPy's current stream, which waits for the op
    del other
    gc.collect()
    assert total == pytest.approx(float(np.exp(cp.asnumpy(x)).sum()), rel=1e-12)
    del y
    gc.collect()
    cp.cuda.Device().synchronize()


@need_cupy
def test_a_buffer_written_on_cupys_stream_keeps_no_reference_to_it(rng):
    """``out=`` a fusekit.Buffer next to CuPy arrays: the op runs on CuPy's current
    stream, but the buffer's last stream (where a later DLPack export records its
    event) is the buffer's own, ordered after the op, not CuPy's, which may be
    destroyed first."""
    x = cp.random.rand(1 << 20)
    out = fusekit.Buffer.empty(fusekit.default_context(f"cuda:{x.device.id}"), x.shape, "float64")
    cp.cuda.Stream.null.synchronize()  # x is written before a non-blocking stream reads it
    with cp.cuda.Stream(non_blocking=True) as s:
        assert fusekit.exp(x, out=out) is out
        ptr = s.ptr
    del s
    gc.collect()
    assert _stream_raw_of(out._last_stream) == _stream_raw_of(out._stream) != ptr
    close(cp.from_dlpack(out), np.exp(cp.asnumpy(x)), 1e-12)


@need_cupy
def test_cupy_sees_results_of_an_explicit_other_stream(rng):
    """``stream=`` another stream: CuPy's current stream waits for the op (an
    event), so CuPy's next kernel reads finished values."""
    other = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.Stream(non_blocking=True) as mine:
        for _ in range(5):
            x = cp.random.rand(1 << 23)
            y = fusekit.exp(x, stream=other.ptr)
            total = float(y.sum())  # on `mine`, right away
            mine.synchronize()
            assert total == pytest.approx(float(np.exp(cp.asnumpy(x)).sum()), rel=1e-12)


@need_cupy
def test_cupy_next_to_numpy_is_a_device_mismatch(rng):
    with pytest.raises(fusekit.DeviceMismatchError):
        fusekit.add(cp.ones(3), np.ones(3))


@need_jax
def test_jax_cuda_arrays_come_back_as_jax_arrays(rng):
    import jax

    every_family(rng, lambda a: jax.device_put(a, GPU), jax.Array, lambda y: y.devices() == {GPU})


@need_jax
def test_jax_cuda_results_are_zero_copy_and_ready(monkeypatch, rng):
    import jax
    import jax.numpy as jnp

    made = record_allocations(monkeypatch)
    for _ in range(5):
        a = rng.standard_normal((2048, 1024))
        x = jax.device_put(a, GPU)
        y = fusekit.exp(x)
        assert y.unsafe_buffer_pointer() == made[-1]
        total = float(jnp.sum(y))  # jax's next kernel reads finished values
        assert total == pytest.approx(float(np.exp(a).sum()), rel=1e-10)


@need_jax
def test_jax_results_live_on_a_lasting_stream(monkeypatch, rng):
    """A jax result is fusekit's memory, freed when jax lets go of it, on the
    stream it was allocated on: the op's stream by default (the default stream or
    torch's current one, which live as long), the default stream when the op runs
    on a borrowed stream, here one destroyed before the result."""
    import jax

    streams = []
    made = record_allocations(monkeypatch, streams)
    ctx = fusekit.default_context(f"cuda:{GPU.id}")
    a = rng.standard_normal((1024, 512))
    y = fusekit.exp(jax.device_put(a, GPU))
    assert y.unsafe_buffer_pointer() == made[-1] and streams[-1] == _stream_raw_of(resolve_stream(ctx, None))
    own = fusekit.Stream(ctx)
    raw = own.cuda_stream
    y = fusekit.exp(jax.device_put(a, GPU), stream=raw)  # borrowed: a raw handle
    assert y.unsafe_buffer_pointer() == made[-1] and streams[-1] == 0
    own.close()  # the CUstream goes: nothing was allocated on it
    gc.collect()
    close(y, np.exp(a), 1e-12)
    del y
    gc.collect()
    jax.effects_barrier()
