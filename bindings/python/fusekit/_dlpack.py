"""DLPack structs and PyCapsule plumbing (pure ctypes).

Export
------
:func:`make_versioned_capsule` puts a ``DLManagedTensorVersioned*`` (from
``fk_buffer_to_dlpack``) into a ``"dltensor_versioned"`` capsule whose destructor
calls the tensor's deleter unless a consumer renamed the capsule to
``"used_dltensor_versioned"`` (took ownership). :func:`make_legacy_capsule` does
the same for DLPack 0.x consumers (``"dltensor"``). Both can keep a Python object
alive for the consumer (the numpy array or torch tensor a wrapped buffer views).

A capsule destructor runs when the capsule is freed, which may happen while an
exception is propagating (a consumer that refused the tensor): a destructor
written in Python (a ctypes callback) cannot run correctly then, since every C
call it makes trips over the pending exception and the callback machinery clears
it. So the destructors and deleters used here are C functions: numpy's own
generic DLPack capsule destructors (``PyCapsule_IsValid`` + the tensor's
``deleter``) and its generic tensor deleter (``PyMem_Free`` the struct, then
``Py_DECREF(manager_ctx)``), taken from capsules numpy itself makes. The
wrappers made here are ``PyMem_Malloc``'d, with ``manager_ctx`` a tuple holding
the kept-alive object and a capsule that owns the library's tensor. Only where
numpy cannot provide them (numpy < 2.1) do ctypes callbacks stand in.

Import
------
:func:`take_versioned_pointer` / :func:`mark_versioned_used` read and consume a
producer's capsule.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
    py_object,
)

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13

FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", c_void_p),
        ("deleter", c_void_p),  # void (*)(DLManagedTensorVersioned*)
        ("flags", c_uint64),
        ("dl_tensor", DLTensor),
    ]


class DLManagedTensor(Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", c_void_p),
        ("deleter", c_void_p),  # void (*)(DLManagedTensor*)
    ]


_DELETER = ctypes.CFUNCTYPE(None, c_void_p)


def _leak(obj):
    """Keeps ``obj`` alive until the process ends (one extra reference, never dropped)."""
    ctypes.pythonapi.Py_IncRef(py_object(obj))
    return obj


# Names live as long as the process: a capsule keeps the pointer it was given.
NAME_VERSIONED = _leak(b"dltensor_versioned")
NAME_USED_VERSIONED = _leak(b"used_dltensor_versioned")
NAME_LEGACY = _leak(b"dltensor")
NAME_USED_LEGACY = _leak(b"used_dltensor")

# Private function objects (not the shared ctypes.pythonapi attributes, whose
# argtypes other libraries may set differently).
_papi = ctypes.pythonapi
_PyCapsule_New = ctypes.PYFUNCTYPE(py_object, c_void_p, c_char_p, c_void_p)(("PyCapsule_New", _papi))
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(c_void_p, py_object, c_char_p)(("PyCapsule_GetPointer", _papi))
_PyCapsule_SetName = ctypes.PYFUNCTYPE(c_int, py_object, c_char_p)(("PyCapsule_SetName", _papi))
_PyCapsule_GetName = ctypes.PYFUNCTYPE(c_char_p, py_object)(("PyCapsule_GetName", _papi))
_PyCapsule_GetDestructor = ctypes.PYFUNCTYPE(c_void_p, py_object)(("PyCapsule_GetDestructor", _papi))
_PyMem_Malloc = ctypes.PYFUNCTYPE(c_void_p, c_size_t)(("PyMem_Malloc", _papi))
_Py_IncRef = ctypes.PYFUNCTYPE(None, py_object)(("Py_IncRef", _papi))


def call_deleter(deleter_addr, managed_addr) -> None:
    """Calls a DLPack deleter ``void (*)(T*)`` at ``deleter_addr``."""
    if deleter_addr:
        _DELETER(deleter_addr)(managed_addr)


# ---------------------------------------------------------------------------
# C destructors and deleters, taken from numpy
# ---------------------------------------------------------------------------


class _CFuncs:
    capsule_versioned: int  # void (*)(PyObject*): destructor of "dltensor_versioned" capsules
    capsule_legacy: int  # void (*)(PyObject*): destructor of "dltensor" capsules
    deleter_versioned: int  # void (*)(DLManagedTensorVersioned*): PyMem_Free + Py_DECREF(manager_ctx)
    deleter_legacy: int  # void (*)(DLManagedTensor*): the same for DLManagedTensor


_cfuncs: _CFuncs | None = None
_cfuncs_tried = False
_cfuncs_lock = threading.Lock()


def _numpy_cfuncs() -> _CFuncs | None:
    """numpy's DLPack capsule destructors and tensor deleters, or None when this
    numpy cannot provide them (it makes versioned capsules from 2.1 on)."""
    global _cfuncs, _cfuncs_tried
    if _cfuncs_tried:
        return _cfuncs
    with _cfuncs_lock:
        if _cfuncs_tried:
            return _cfuncs
        try:
            import numpy as np

            a = np.zeros(1)
            cv = a.__dlpack__(max_version=(1, 0))
            cl = a.__dlpack__()
            if _PyCapsule_GetName(cv) != NAME_VERSIONED or _PyCapsule_GetName(cl) != NAME_LEGACY:
                raise TypeError("unexpected capsule names")
            f = _CFuncs()
            f.capsule_versioned = _PyCapsule_GetDestructor(cv)
            f.capsule_legacy = _PyCapsule_GetDestructor(cl)
            f.deleter_versioned = DLManagedTensorVersioned.from_address(
                _PyCapsule_GetPointer(cv, NAME_VERSIONED)
            ).deleter
            f.deleter_legacy = DLManagedTensor.from_address(_PyCapsule_GetPointer(cl, NAME_LEGACY)).deleter
            if not all((f.capsule_versioned, f.capsule_legacy, f.deleter_versioned, f.deleter_legacy)):
                raise TypeError("numpy capsule without destructor or deleter")
            del cv, cl  # unconsumed: numpy's destructors release them
            _cfuncs = f
        except Exception:  # noqa: BLE001 - any failure: use the fallback
            _cfuncs = None
        _cfuncs_tried = True
        return _cfuncs


def _wrapper(struct_type, versioned_addr: int, keepalive, set_flags: int, deleter: int, f: _CFuncs) -> int:
    """A PyMem_Malloc'd ``struct_type`` viewing the library tensor at
    ``versioned_addr``; its ``manager_ctx`` is a tuple holding ``keepalive`` and a
    capsule that owns the library tensor (numpy's deleter frees the struct and
    drops the tuple, whose capsule then calls the library's deleter)."""
    v = DLManagedTensorVersioned.from_address(versioned_addr)
    inner = _PyCapsule_New(versioned_addr, NAME_VERSIONED, f.capsule_versioned)
    holder = (keepalive, inner)
    size = ctypes.sizeof(struct_type)
    addr = _PyMem_Malloc(size)
    if not addr:
        # `inner` is dropped with `holder` and releases the library tensor
        raise MemoryError("fusekit: PyMem_Malloc failed for a DLPack export")
    ctypes.memset(addr, 0, size)
    w = struct_type.from_address(addr)
    ctypes.memmove(ctypes.addressof(w.dl_tensor), ctypes.addressof(v.dl_tensor), ctypes.sizeof(DLTensor))
    if struct_type is DLManagedTensorVersioned:
        w.version = v.version
        w.flags = v.flags | set_flags
    _Py_IncRef(holder)  # the reference manager_ctx owns
    w.manager_ctx = id(holder)
    w.deleter = deleter
    return addr


def make_versioned_capsule(managed_addr: int, keepalive=None, set_flags: int = 0):
    """A ``"dltensor_versioned"`` capsule owning the library tensor at
    ``managed_addr``, keeping ``keepalive`` alive and OR-ing ``set_flags`` into
    the tensor's flags."""
    f = _numpy_cfuncs()
    if f is None:
        if keepalive is not None or set_flags:
            managed_addr = _fallback_wrap_versioned(managed_addr, keepalive, set_flags)
        return _PyCapsule_New(managed_addr, NAME_VERSIONED, _versioned_destructor_addr)
    if keepalive is not None or set_flags:
        managed_addr = _wrapper(DLManagedTensorVersioned, managed_addr, keepalive, set_flags, f.deleter_versioned, f)
    return _PyCapsule_New(managed_addr, NAME_VERSIONED, f.capsule_versioned)


def make_legacy_capsule(versioned_addr: int, keepalive=None):
    """A DLPack 0.x ``"dltensor"`` capsule viewing the library tensor at
    ``versioned_addr`` (ownership passes to the capsule). The legacy struct has no
    read-only flag: the caller must refuse read-only tensors beforehand."""
    f = _numpy_cfuncs()
    if f is None:
        return _fallback_legacy_capsule(versioned_addr, keepalive)
    addr = _wrapper(DLManagedTensor, versioned_addr, keepalive, 0, f.deleter_legacy, f)
    return _PyCapsule_New(addr, NAME_LEGACY, f.capsule_legacy)


# ---------------------------------------------------------------------------
# Fallback (numpy < 2.1): destructors and deleters as ctypes callbacks, leaked
# so that capsules freed late at interpreter exit never call freed memory.
# They cannot preserve an exception that is propagating when they run.
# ---------------------------------------------------------------------------

_IsValid_raw = ctypes.PYFUNCTYPE(c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", _papi))
_GetPointer_raw = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", _papi))


def _capsule_destructor(name: bytes, managed_type):
    """The destructor of capsules named `name` holding a `managed_type` pointer: calls
    the tensor's deleter unless a consumer took the tensor (renamed the capsule)."""

    def destructor(cap, _valid=_IsValid_raw, _get=_GetPointer_raw, _name=name, _managed=managed_type):
        try:
            if _valid(cap, _name):
                managed = _get(cap, _name)
                if managed:
                    call_deleter(_managed.from_address(managed).deleter, managed)
        except BaseException:  # never let an exception out of a destructor
            pass

    return destructor


_versioned_destructor = _capsule_destructor(NAME_VERSIONED, DLManagedTensorVersioned)
_legacy_destructor = _capsule_destructor(NAME_LEGACY, DLManagedTensor)

_DESTRUCTOR = ctypes.CFUNCTYPE(None, c_void_p)
_versioned_destructor_c = _leak(_DESTRUCTOR(_versioned_destructor))
_legacy_destructor_c = _leak(_DESTRUCTOR(_legacy_destructor))
_versioned_destructor_addr = ctypes.cast(_versioned_destructor_c, c_void_p).value
_legacy_destructor_addr = ctypes.cast(_legacy_destructor_c, c_void_p).value

_live: dict[int, tuple] = {}
_live_lock = threading.Lock()


def _wrapper_deleter(addr, _live=_live, _lock=_live_lock):
    try:
        with _lock:
            entry = _live.pop(addr, None)
        if entry is not None:
            inner = entry[0].manager_ctx
            call_deleter(DLManagedTensorVersioned.from_address(inner).deleter, inner)
    except BaseException:
        pass


_wrapper_deleter_c = _leak(_DELETER(_wrapper_deleter))
_wrapper_deleter_addr = ctypes.cast(_wrapper_deleter_c, c_void_p).value


def _fallback_wrapper(w, versioned_addr: int, keepalive) -> int:
    """Makes `w` (a new DLManagedTensorVersioned or DLManagedTensor) a wrapper of the
    library's versioned tensor at `versioned_addr`: its dl_tensor, deleted by
    _wrapper_deleter, kept with `keepalive` in _live until then. Returns its address."""
    v = DLManagedTensorVersioned.from_address(versioned_addr)
    ctypes.memmove(ctypes.addressof(w.dl_tensor), ctypes.addressof(v.dl_tensor), ctypes.sizeof(DLTensor))
    w.manager_ctx = versioned_addr
    w.deleter = _wrapper_deleter_addr
    addr = ctypes.addressof(w)
    with _live_lock:
        _live[addr] = (w, keepalive)
    return addr


def _fallback_wrap_versioned(versioned_addr: int, keepalive, set_flags: int = 0) -> int:
    v = DLManagedTensorVersioned.from_address(versioned_addr)
    w = DLManagedTensorVersioned()
    w.version = v.version
    w.flags = v.flags | set_flags
    return _fallback_wrapper(w, versioned_addr, keepalive)


def _fallback_legacy_capsule(versioned_addr: int, keepalive):
    addr = _fallback_wrapper(DLManagedTensor(), versioned_addr, keepalive)
    return _PyCapsule_New(addr, NAME_LEGACY, _legacy_destructor_addr)


# ---------------------------------------------------------------------------
# Import helpers
# ---------------------------------------------------------------------------


def capsule_name(capsule) -> bytes | None:
    if not is_capsule(capsule):
        return None
    return _PyCapsule_GetName(capsule)


def take_versioned_pointer(capsule) -> int:
    """The ``DLManagedTensorVersioned*`` in an unconsumed ``"dltensor_versioned"``
    capsule (raises ValueError for any other capsule)."""
    return _PyCapsule_GetPointer(capsule, NAME_VERSIONED)


def take_legacy_pointer(capsule) -> int:
    return _PyCapsule_GetPointer(capsule, NAME_LEGACY)


def mark_versioned_used(capsule) -> None:
    """Renames a consumed capsule, so its destructor leaves the tensor alone."""
    if _PyCapsule_SetName(capsule, NAME_USED_VERSIONED) != 0:
        raise RuntimeError("PyCapsule_SetName failed")


def is_capsule(obj) -> bool:
    return type(obj).__name__ == "PyCapsule"
