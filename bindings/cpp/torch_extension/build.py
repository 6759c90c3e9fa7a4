"""Builds (JIT, with torch.utils.cpp_extension.load) and loads the fusekit_ext example.

    python bindings/cpp/torch_extension/build.py        # build, then a short demo
    >>> import build; ext = build.load(); ext.add(a, b)

Environment:
    FUSEKIT_LIB_DIR         folder holding libfusekit.so (default: <repo>/target/release)
    FUSEKIT_EXT_CUDA        1/0 forces the CUDA build on/off (default: on when
                            torch.cuda.is_available() and a CUDA toolkit is found)
    FUSEKIT_EXT_BUILD_DIR   build folder (default: <repo>/target/torch_ext/<cpu|cuda>)

The extension links libfusekit with an rpath, so no LD_LIBRARY_PATH is needed.
torch's cpp_extension needs ninja (`pip install ninja`) and a C++ compiler.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def library_dir() -> pathlib.Path:
    d = pathlib.Path(os.environ.get("FUSEKIT_LIB_DIR", ROOT / "target" / "release")).resolve()
    if not (d / "libfusekit.so").exists():
        raise FileNotFoundError(
            f"{d / 'libfusekit.so'} not found: run `cargo build --release` in {ROOT} "
            "or set FUSEKIT_LIB_DIR"
        )
    return d


def want_cuda() -> bool:
    import torch
    from torch.utils import cpp_extension

    forced = os.environ.get("FUSEKIT_EXT_CUDA")
    if forced is not None:
        return forced not in ("", "0", "false", "no")
    return torch.cuda.is_available() and cpp_extension.CUDA_HOME is not None


def ensure_ninja_on_path() -> bool:
    """cpp_extension needs ninja on PATH; `pip install ninja` in a virtual
    environment that is not activated puts it beside the interpreter, off PATH."""
    if shutil.which("ninja") is None:
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return shutil.which("ninja") is not None


def load(verbose: bool = False):
    """Compiles (once; cached in the build folder) and imports the extension."""
    from torch.utils import cpp_extension

    cuda = want_cuda()
    lib = library_dir()
    ensure_ninja_on_path()
    build_dir = pathlib.Path(
        os.environ.get("FUSEKIT_EXT_BUILD_DIR", ROOT / "target" / "torch_ext" / ("cuda" if cuda else "cpu"))
    )
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name="fusekit_ext_cuda" if cuda else "fusekit_ext",
        sources=[str(HERE / "fusekit_ext.cpp")],
        extra_include_paths=[str(ROOT / "include"), str(ROOT / "bindings" / "cpp")],
        extra_cflags=["-O2"] + (["-DFUSEKIT_WITH_CUDA"] if cuda else []),
        extra_ldflags=[f"-L{lib}", "-lfusekit", f"-Wl,-rpath,{lib}"],
        with_cuda=cuda,
        build_directory=str(build_dir),
        verbose=verbose,
    )


if __name__ == "__main__":
    import torch

    ext = load(verbose=True)
    print(ext.version())
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and want_cuda() else [])
    for dev in devices:
        a = torch.randn(1024, 512, device=dev)
        b = torch.randn(512, device=dev)
        out = ext.axpby(a, b, 2.0, -0.5)
        err = (out - (2.0 * a - 0.5 * b)).abs().max().item()
        print(f"{dev} ({ext.device_name(a)}): axpby max abs error vs torch = {err:.3g}")
