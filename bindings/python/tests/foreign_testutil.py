"""Helpers of test_foreign_arrays.py and test_foreign_gpu.py."""

import sys
import types

import numpy as np

from fusekit import _buffer, _foreign


def record_allocations(monkeypatch, streams=None) -> list:
    """Makes ``fusekit.Buffer.empty`` append the address of every buffer it makes
    to the returned list (for the zero-copy checks: a result that is fusekit's
    allocation has one of these addresses), and, when ``streams`` is a list, the
    raw ``CUstream`` each was allocated on (0: the default stream) to ``streams``."""
    made = []
    real = _buffer.Buffer.empty.__func__

    def spy(cls, *a, **k):
        b = real(cls, *a, **k)
        made.append(b.data_ptr)
        if streams is not None:
            streams.append(0 if b._stream is None else b._stream.cuda_stream)
        return b

    monkeypatch.setattr(_buffer.Buffer, "empty", classmethod(spy))
    return made


class Producer:
    """An object with nothing but DLPack over an array (no library around it)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class FakeCupyArray(Producer):
    """A ``cupy.ndarray`` stand-in over host memory (a numpy array, or a torch
    tensor for bfloat16): what fusekit reads of a CuPy array (``__dlpack__``,
    ``__dlpack_device__``, ``data.ptr``), in a module named cupy."""

    __module__ = "cupy._core.core"

    @property
    def data(self):
        a = self._a
        return types.SimpleNamespace(ptr=a.ctypes.data if isinstance(a, np.ndarray) else a.data_ptr())

    def get(self):
        """A host copy (CuPy's name)."""
        return np.array(self._a) if isinstance(self._a, np.ndarray) else self._a.clone()


def fake_cupy(monkeypatch):
    """A stand-in for the cupy module as ``sys.modules["cupy"]`` for the test (and
    a fresh cache of fusekit's per-type library facts), so that fusekit takes its
    arrays for CuPy's. Its ``empty`` (numpy memory; torch's for ml_dtypes'
    bfloat16) records each array it makes in ``made``, with the dtype asked in
    ``dtypes`` and the device ordinal of the enclosing ``cuda.Device`` block in
    ``devices``; ``from_dlpack`` counts its imports in ``imports[0]``."""
    mod = types.ModuleType("cupy")
    mod.ndarray = FakeCupyArray
    mod.made, mod.dtypes, mod.devices, mod.imports = [], [], [], [0]
    device = []

    class Device:
        def __init__(self, ordinal):
            self.ordinal = ordinal

        def __enter__(self):
            device.append(self.ordinal)

        def __exit__(self, *exc):
            device.pop()

    def empty(shape, dtype):
        if np.dtype(dtype).name == "bfloat16":
            import torch

            a = torch.empty(shape, dtype=torch.bfloat16)
        else:
            a = np.empty(shape, dtype=dtype)
        arr = FakeCupyArray(a)
        mod.made.append(arr)
        mod.dtypes.append(dtype)
        mod.devices.append(device[-1] if device else None)
        return arr

    def from_dlpack(x):
        mod.imports[0] += 1
        return FakeCupyArray(np.from_dlpack(x))

    mod.empty, mod.from_dlpack = empty, from_dlpack
    mod.cuda = types.SimpleNamespace(Device=Device, get_current_stream=lambda: types.SimpleNamespace(ptr=0))
    monkeypatch.setitem(sys.modules, "cupy", mod)
    monkeypatch.setattr(_foreign, "_cache", {})
    return mod
