"""Handle lifetimes: wrapped memory kept alive, any order of release, garbage
collection, interpreter exit."""

import gc
import itertools
import os
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import fusekit as fk
from conftest import PKG_ROOT
from fk_testutil import assert_kept_alive


def test_wrapped_array_is_kept_alive():
    assert_kept_alive(lambda: np.arange(8.0), fk.Buffer.from_numpy,
                      lambda b: np.testing.assert_array_equal(fk.exp(b).to_numpy(), np.exp(np.arange(8.0))))


def test_wrapped_array_released_by_gc():
    a = np.arange(3.0)
    r = weakref.ref(a)
    b = fk.Buffer.from_numpy(a)
    del a, b
    gc.collect()
    assert r() is None


def test_temporary_wrappers_do_not_hold_the_callers_arrays():
    a = np.arange(5.0)
    out = np.empty(5)
    ra, ro = weakref.ref(a), weakref.ref(out)
    fk.add(a, a, out=out)
    res = fk.exp(a)
    del a, out
    gc.collect()
    assert ra() is None and ro() is None
    assert res.shape == (5,)


@pytest.mark.parametrize("order", list(itertools.permutations(["ctx", "stream", "buf", "view"])))
def test_release_in_any_order(order):
    ctx = fk.Context("cpu")
    stream = fk.Stream(ctx)
    buf = fk.Buffer.empty(ctx, (4,), "f32", stream=stream)
    buf.copy_from(np.arange(4, dtype=np.float32), stream=stream)
    view = fk.Buffer.from_numpy(np.ones(4, np.float32), ctx)
    objs = {"ctx": ctx, "stream": stream, "buf": buf, "view": view}
    for name in order:
        objs[name].close()
        # everything not yet closed still works
        if not buf.closed:
            np.testing.assert_array_equal(buf.to_numpy(), np.arange(4))
        if not view.closed and not buf.closed:
            fk.add(buf, view, out=buf, stream=None if stream.closed else stream)
            buf.copy_from(np.arange(4, dtype=np.float32))
    for o in objs.values():
        assert o.closed


@pytest.mark.parametrize("order", list(itertools.permutations(["ctx", "stream", "buf"])))
def test_del_in_any_order(order):
    objs = {}
    objs["ctx"] = fk.Context("cpu")
    objs["stream"] = fk.Stream(objs["ctx"])
    objs["buf"] = fk.Buffer.empty(objs["ctx"], (3,), "f64", stream=objs["stream"])
    for name in order:
        del objs[name]
        gc.collect()


def test_buffer_outlives_its_context():
    ctx = fk.Context("cpu")
    b = fk.Buffer.empty(ctx, (3,), "f64").copy_from([1.0, 2.0, 3.0])
    ctx.close()
    np.testing.assert_array_equal(fk.scalar_mul(b, 2.0).to_numpy(), [2.0, 4.0, 6.0])


def test_cycles_are_collected():
    class Holder:
        pass

    h = Holder()
    h.self = h
    h.buf = fk.Buffer.from_numpy(np.zeros(3))
    r = weakref.ref(h.buf.owner)
    del h
    gc.collect()
    assert r() is None


def test_context_manager_closes():
    with fk.Buffer.from_numpy(np.zeros(2)) as b:
        assert not b.closed
    assert b.closed and b.owner is None
    with fk.Stream("cpu") as s:
        pass
    assert s.closed


def test_interpreter_exit_with_live_handles(tmp_path):
    """Handles, exports and capsules alive at exit are released without errors."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(PKG_ROOT)!r})
        import numpy as np, fusekit as fk
        ctx = fk.Context("cpu")
        s = fk.Stream(ctx)
        b = fk.Buffer.empty(ctx, (1000,), "f64", stream=s).copy_from(1.0)
        w = fk.Buffer.from_numpy(np.ones(10))
        cap = b.__dlpack__(max_version=(1, 0))
        legacy = w.__dlpack__()
        try:
            v = np.from_dlpack(w)
        except Exception:
            v = None
        imported = fk.from_dlpack(np.arange(3.0))
        class Cycle: pass
        c = Cycle(); c.c = c; c.b = fk.Buffer.from_numpy(np.zeros(3))
        r = fk.add(b, b)
        y = fk.add(np.ones(3), np.ones(3))  # views left in the op calls' table
        print("ok")
        """
    )
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"
    assert "Exception ignored" not in p.stderr and "Traceback" not in p.stderr, p.stderr


# --- the views that op calls make of numpy arrays (fusekit._buffer._temp_view) ----------


def _count_views(monkeypatch):
    """Counts the borrowed views (fk_buffer_wrap calls) that Buffer._view makes,
    from an empty view table (a view that an earlier test left for memory that an
    array here reuses would otherwise serve it, and no view would be made)."""
    from fusekit import _buffer, _core

    monkeypatch.setattr(_buffer, "_VIEWS", {})
    made = []
    real = _core.Buffer._view.__func__

    def counting(cls, *args):
        made.append(args[1:5])  # address, shape, dtype, strides
        return real(cls, *args)

    monkeypatch.setattr(_core.Buffer, "_view", classmethod(counting))
    return made


def test_op_call_views_are_shared_and_hold_no_array(monkeypatch):
    from fusekit import _buffer

    made = _count_views(monkeypatch)
    a = np.arange(1.0, 9.0)
    o = np.full_like(a, np.nan)
    r = weakref.ref(a)
    fk.exp(a, out=o)
    np.testing.assert_array_equal(o, np.exp(a))
    first = len(made)
    assert first <= 2  # a and o, unless an earlier test made the same views
    o[:] = np.nan
    fk.exp(a, out=o)
    np.testing.assert_array_equal(o, np.exp(a))
    assert len(made) == first  # the second call wrapped nothing
    held = [b for b in _buffer._VIEWS.values() if b._shared]
    assert held and all(b._owner is None and "borrowed" in repr(b) for b in held)
    del a
    gc.collect()
    assert r() is None  # the table keeps no array alive


def test_op_call_views_keyed_by_everything_that_defines_them(monkeypatch):
    made = _count_views(monkeypatch)
    a = np.arange(1.0, 13.0)
    np.testing.assert_allclose(fk.exp(a), np.exp(a))
    # the same address with another shape, other strides, another dtype: each its
    # own view, and each result right (a view found by address alone would give
    # exp(a[:6]) for a[::2], or read float64 as float32)
    for x in (a[:6], a[::2], a.reshape(3, 4), a.view(np.float32)):
        n = len(made)
        np.testing.assert_allclose(fk.exp(x), np.exp(x), rtol=1e-6)
        assert any(addr == x.ctypes.data and shape == x.shape for addr, shape, _dt, _st in made[n:]), x.shape
    # a read-only array, then the same memory written as an output
    b = np.arange(1.0, 5.0)
    ro = b.view()
    ro.flags.writeable = False
    np.testing.assert_allclose(fk.exp(ro), np.exp(b))
    fk.exp(b, out=b)
    np.testing.assert_allclose(b, np.exp(np.arange(1.0, 5.0)))


def test_op_call_views_bounded_and_reused_memory(monkeypatch):
    from fusekit import _buffer

    monkeypatch.setattr(_buffer, "_VIEWS_MAX", 16)
    arrays = [np.full(5, float(i)) for i in range(3 * _buffer._VIEWS_MAX)]
    for i, x in enumerate(arrays):
        y = fk.add(x, x)
        np.testing.assert_array_equal(y, np.full(5, 2.0 * i))
        assert len(_buffer._VIEWS) <= _buffer._VIEWS_MAX
    # memory freed and reused by new arrays with the same address and shape
    for i in range(50):
        x = np.full(7, float(i))
        np.testing.assert_array_equal(fk.add(x, x), np.full(7, 2.0 * i))
        del x


def test_op_call_views_under_threads(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from fusekit import _buffer

    monkeypatch.setattr(_buffer, "_VIEWS_MAX", 8)  # evictions while other calls run

    def work(k):
        rng = np.random.default_rng(k)
        for _ in range(200):
            x = rng.standard_normal(int(rng.integers(1, 40)))
            y = rng.standard_normal(x.shape)
            np.testing.assert_array_equal(fk.add(x, y), x + y)
        return k

    with ThreadPoolExecutor(4) as ex:
        assert sorted(ex.map(work, range(8))) == list(range(8))


def test_op_call_keeps_its_views_while_the_table_turns_over(monkeypatch):
    """A call with several outputs whose views leave the table before the C call
    (every insertion empties it here) still hands the library live handles."""
    from fusekit import _buffer

    monkeypatch.setattr(_buffer, "_VIEWS_MAX", 1)
    rng = np.random.default_rng(3)
    v, g = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    U, W = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
    dv, dU, dW = fk.christoffel_backward(v, U, W, g, 5.0)
    p = v @ U
    gp = g * (np.abs((p * p) @ W.T) <= 5.0)
    dp = 2 * p * (gp @ W)
    np.testing.assert_allclose(dv, dp @ U.T, rtol=1e-12)
    np.testing.assert_allclose(dU, v.T @ dp, rtol=1e-12)
    np.testing.assert_allclose(dW, gp.T @ (p * p), rtol=1e-12)
    assert len(_buffer._VIEWS) <= 1
