"""Build of the fusekit Python package (metadata in pyproject.toml).

Besides the pure-Python package, this builds the compiled torch integration,
``fusekit/_fusekit_torch.so`` from every ``fusekit/csrc/*.cpp`` (``common.cpp``
and one file per op family), when torch is importable at build time. It is built
against PyTorch's stable ABI (``TORCH_TARGET_VERSION`` = 2.10), so the one binary
serves torch 2.10 and every later torch, CPU or CUDA builds alike; it needs a C++17 compiler and torch's
headers, no CUDA toolkit (libfusekit loads CUDA at run time, and torch's current
stream comes through torch's C shim).

torch is not a build requirement (pip would otherwise download a torch into the
isolated build environment, possibly another version than yours): build with the
torch you use, without build isolation::

    pip install --no-build-isolation ./bindings/python
    python bindings/python/setup.py build_ext --inplace     # in a source tree

The version is Cargo.toml's ([package] version), the one source: read here and
written to ``fusekit/_version.py`` (``fusekit.__version__``); a tree without
Cargo.toml (an sdist) keeps the ``_version.py`` it has.

A wheel with the library inside is made by ``scripts/build_wheel.sh`` (it stages
the package with ``libfusekit.so`` and the prebuilt kernels, builds here and
tags the wheel ``py3-none-manylinux_*``: nothing in it depends on the Python ABI);
docs/packaging.md.

Environment:
    FUSEKIT_REQUIRE_TORCH_EXT=1   fail the build when the extension cannot be built
                                  (torch missing, compiler error); CI sets it
    FUSEKIT_NO_TORCH_EXT=1        do not build it
    FUSEKIT_REPO=DIR              the fusekit repository (Cargo.toml, include/fusekit.h);
                                  default: two folders up from this file
    FUSEKIT_STRIP=1               link the extension without debug information
"""

import os
import pathlib
import re
import sys

from setuptools import setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = pathlib.Path(__file__).resolve().parent
REPO = pathlib.Path(os.environ.get("FUSEKIT_REPO") or HERE.parent.parent)
# fusekit.h: the repository's generated C header
INCLUDE = REPO / "include"
VERSION_FILE = HERE / "fusekit" / "_version.py"


def cargo_version(cargo_toml: pathlib.Path) -> str:
    """[package] version of Cargo.toml."""
    section = None
    for line in cargo_toml.read_text().splitlines():
        m = re.match(r"\s*\[([^\]]+)\]", line)
        if m:
            section = m.group(1).strip()
        elif section == "package":
            m = re.match(r'\s*version\s*=\s*"([^"]+)"', line)
            if m:
                return m.group(1)
    raise SystemExit(f"fusekit: no [package] version in {cargo_toml}")


def version() -> str:
    """Cargo.toml's version, written to fusekit/_version.py; without Cargo.toml
    (an sdist), the version _version.py holds."""
    cargo_toml = REPO / "Cargo.toml"
    if cargo_toml.is_file():
        v = cargo_version(cargo_toml)
        text = f'# Written by setup.py from Cargo.toml\'s version; do not edit.\n__version__ = "{v}"\n'
        if not VERSION_FILE.is_file() or VERSION_FILE.read_text() != text:
            VERSION_FILE.write_text(text)
        return v
    if VERSION_FILE.is_file():
        m = re.search(r'__version__ = "([^"]+)"', VERSION_FILE.read_text())
        if m:
            return m.group(1)
    raise SystemExit(f"fusekit: neither {cargo_toml} nor {VERSION_FILE} gives the version")


class BdistWheel(bdist_wheel):
    """A wheel holding native code (libfusekit.so, the torch ops) that uses no
    Python C API: tagged py3-none-<platform> (auditwheel then makes the platform
    manylinux_*), so one wheel serves every Python 3."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = not any((HERE / "fusekit").glob("*.so")) and not ext_modules

    def get_tag(self):
        _, _, plat = super().get_tag()
        return ("py3", "none", plat) if not self.root_is_pure else ("py3", "none", "any")
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
    # every source of the one library: common.cpp and one file per op family (relative
    # paths, as setuptools wants them)
    sources = sorted(str(p.relative_to(HERE)) for p in (HERE / "fusekit" / "csrc").glob("*.cpp"))
    ext = CppExtension(
        "fusekit._fusekit_torch",
        sources,
        include_dirs=[str(INCLUDE), str(HERE / "fusekit" / "csrc")],
        depends=sorted(str(p.relative_to(HERE)) for p in (HERE / "fusekit" / "csrc").glob("*.h")),
        extra_compile_args=["-O2", "-std=c++17", "-fvisibility=hidden",
                            f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}"],
        extra_link_args=["-Wl,--strip-debug"] if os.environ.get("FUSEKIT_STRIP") == "1" else [],
        libraries=["dl"],
        py_limited_api=True,
    )
    return [ext], {"build_ext": BuildExtension.with_options(no_python_abi_suffix=True, use_ninja=False)}


ext_modules, cmdclass = torch_extension()
setup(version=version(), ext_modules=ext_modules, cmdclass={**cmdclass, "bdist_wheel": BdistWheel})
