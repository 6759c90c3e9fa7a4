"""Build of the fusekit Python package (metadata in pyproject.toml).

Besides the pure-Python package, this builds the compiled torch integration,
``fusekit/_fusekit_torch.so`` from ``fusekit/csrc/fusekit_torch.cpp``, when torch
is importable at build time. It is built against PyTorch's stable ABI
(``TORCH_TARGET_VERSION`` = 2.10), so the one binary serves torch 2.10 and every
later torch, CPU or CUDA builds alike; it needs a C++17 compiler and torch's
headers, no CUDA toolkit (libfusekit loads CUDA at run time, and torch's current
stream comes through torch's C shim).

torch is not a build requirement (pip would otherwise download a torch into the
isolated build environment, possibly another version than yours): build with the
torch you use, without build isolation::

    pip install --no-build-isolation ./bindings/python
    python bindings/python/setup.py build_ext --inplace     # in a source tree

Environment:
    FUSEKIT_REQUIRE_TORCH_EXT=1   fail the build when the extension cannot be built
                                  (torch missing, compiler error); CI sets it
    FUSEKIT_NO_TORCH_EXT=1        do not build it
"""

import os
import pathlib
import sys

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent
# fusekit.h: the repository's generated C header
INCLUDE = HERE.parent.parent / "include"
TORCH_TARGET_VERSION = "0x020a000000000000"  # torch 2.10: the oldest torch the binary serves


def _skip(why: str):
    if os.environ.get("FUSEKIT_REQUIRE_TORCH_EXT") == "1":
        raise SystemExit(f"fusekit: the compiled torch ops cannot be built: {why}")
    print(f"fusekit: not building the compiled torch ops: {why}", file=sys.stderr)
    return [], {}


def torch_extension():
    if os.environ.get("FUSEKIT_NO_TORCH_EXT") == "1":
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError as e:
        return _skip(f"torch is not importable in the build environment ({e}); install with "
                     "`pip install --no-build-isolation` where torch is installed")
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 10):
        return _skip(f"torch {torch.__version__} is older than 2.10 (the stable ABI's version)")
    if not (INCLUDE / "fusekit.h").exists():
        return _skip(f"{INCLUDE / 'fusekit.h'} not found (build from the fusekit repository)")
    ext = CppExtension(
        "fusekit._fusekit_torch",
        ["fusekit/csrc/fusekit_torch.cpp"],
        include_dirs=[str(INCLUDE)],
        extra_compile_args=["-O2", "-std=c++17", "-fvisibility=hidden",
                            f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}"],
        libraries=["dl"],
        py_limited_api=True,
    )
    return [ext], {"build_ext": BuildExtension.with_options(no_python_abi_suffix=True, use_ninja=False)}


ext_modules, cmdclass = torch_extension()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
