"""The C header parses with cffi (ABI mode) and fk_add runs through it on the CPU.

include/fusekit.h is preprocessed with `cc -E -P` after removing its system
includes (cffi's cdef knows size_t, int32_t, ... natively and cannot read glibc's
headers), then fed to FFI.cdef; the library is dlopen'ed directly.
"""

import re
import shutil
import subprocess

import numpy as np
import pytest

from conftest import REPO_ROOT
from fusekit import _lib

cffi = pytest.importorskip("cffi")

HEADER = REPO_ROOT / "include" / "fusekit.h"


def _cdef_source() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C preprocessor (cc) found")
    text = HEADER.read_text()
    text = re.sub(r"^\s*#\s*include\s*<[^>]+>\s*$", "", text, flags=re.M)
    p = subprocess.run([cc, "-E", "-P", "-"], input=text, capture_output=True, text=True, check=True)
    src = p.stdout
    # The constants are #defines, which -E expands away; give them to cffi as
    # integer constants so that ffi-level code can use them by name.
    defines = re.findall(r"^\s*#\s*define\s+(FK_\w+)\s+(-?\d+)\s*$", HEADER.read_text(), flags=re.M)
    src += "\n" + "\n".join(f"#define {n} {v}" for n, v in defines) + "\n"
    return src


@pytest.fixture(scope="module")
def ffi_lib():
    ffi = cffi.FFI()
    ffi.cdef(_cdef_source())
    lib = ffi.dlopen(_lib.library_path())
    return ffi, lib


def test_header_declares_every_prototype(ffi_lib):
    ffi, lib = ffi_lib
    for name in _lib.PROTOTYPES:
        assert hasattr(lib, name), name
    assert lib.FK_ABI_VERSION == _lib.ABI_VERSION
    assert lib.fk_abi_version() // 1000 == lib.FK_ABI_VERSION // 1000
    assert ffi.sizeof("fk_scalar") == 16


def _check(ffi, lib, st):
    if st != lib.FK_OK:
        raise AssertionError(ffi.string(lib.fk_last_error_message()).decode())


def test_fk_add_on_cpu(ffi_lib):
    ffi, lib = ffi_lib
    ctx = ffi.new("fk_context **")
    _check(ffi, lib, lib.fk_context_create(lib.FK_ABI_VERSION, lib.FK_DEVICE_CPU, 0, ctx))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.linspace(-1, 1, 4, dtype=np.float32)  # broadcasts over rows
    out = np.full((3, 4), np.nan, np.float32)
    bufs = []
    try:
        for arr in (a, b, out):
            shape = ffi.new("int64_t[]", arr.shape)
            h = ffi.new("fk_buffer **")
            ptr = ffi.cast("void *", arr.ctypes.data)
            _check(ffi, lib, lib.fk_buffer_wrap(ctx[0], ptr, lib.FK_DTYPE_F32, arr.ndim, shape, ffi.NULL, h))
            bufs.append(h[0])
        _check(ffi, lib, lib.fk_add(bufs[0], bufs[1], bufs[2], ffi.NULL))
        np.testing.assert_allclose(out, a + b, rtol=1e-6)

        # fk_axpby takes fk_scalar by value
        alpha = ffi.new("fk_scalar *", {"re": 2.0, "im": 0.0})[0]
        beta = ffi.new("fk_scalar *", {"re": -1.0, "im": 0.0})[0]
        _check(ffi, lib, lib.fk_axpby(alpha, bufs[0], beta, bufs[1], bufs[2], ffi.NULL))
        np.testing.assert_allclose(out, 2 * a - b, rtol=1e-6)

        # an error status with its message
        st = lib.fk_add(bufs[0], bufs[1], ffi.NULL, ffi.NULL)
        assert st == lib.FK_ERROR_NULL_POINTER
        assert ffi.string(lib.fk_status_string(st)) == b"FK_ERROR_NULL_POINTER"
        assert b"out" in ffi.string(lib.fk_last_error_message())
    finally:
        for h in bufs:
            lib.fk_buffer_destroy(h)
        lib.fk_context_destroy(ctx[0])
