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


def test_wrapped_array_is_kept_alive():
    a = np.arange(8.0)
    r = weakref.ref(a)
    b = fk.Buffer.from_numpy(a)
    del a
    gc.collect()
    assert r() is not None
    np.testing.assert_array_equal(fk.exp(b).to_numpy(), np.exp(np.arange(8.0)))
    b.close()
    gc.collect()
    assert r() is None


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
        print("ok")
        """
    )
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"
    assert "Exception ignored" not in p.stderr and "Traceback" not in p.stderr, p.stderr
