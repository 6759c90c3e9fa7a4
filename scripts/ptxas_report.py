#!/usr/bin/env python3
"""Compiles kernel modules with NVRTC (as fusekit does) plus `-Xptxas -v` and prints
each kernel's registers, spills and shared memory; no GPU needed.

    python3 scripts/ptxas_report.py [MODULE ...] [--arch sm_90] [--filter SUBSTR] [--cubin DIR] [--define NAME[=VALUE]]
    python3 scripts/ptxas_report.py --list

MODULE is a module name of `fusekit::cuda::modules()` (`--list` prints them all:
e.g. gaussian_f32, or one op, dtype and configuration of the geodesic family) or a
family, as FK_KERNELS of tests/kernels_compile.rs takes it: `geodesic` is every
module whose name starts with `geodesic_`. Without MODULE, every module. The source
of each module is the library's own, with its headers inlined, exactly as
`fusekit::testing::compile` hands it to NVRTC (`cargo run --release --example
kernel_source -- --expanded MODULE` prints it; this script builds and runs that
example, or takes a built one with --kernel-source). Module and kernel names come
from the library, so a renamed or split module needs nothing here. `--define`
prepends extra #defines ahead of that source (to try a variant); `--filter` keeps
the kernels whose name contains SUBSTR.

With --cubin DIR, each module's cubin is written to DIR/<module>-<arch>.cubin;
`nvdisasm -c` (the nvidia-cuda-nvdisasm wheel has one) shows the SASS.

Needs libnvrtc.so.13 and the CUDA headers (the nvidia-cuda-nvrtc / nvidia-cuda-runtime
wheels, as scripts/test.sh installs them): found under $VIRTUAL_ENV or this Python's
prefix, or give --nvrtc and --include. Exit status: 0, 1 when a module does not
compile or no module matches, 2 when NVRTC or the example is missing.
"""
import argparse
import ctypes
import glob
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def find(patterns):
    for p in patterns:
        hits = sorted(glob.glob(p))
        if hits:
            return hits[0]
    return None


def cuda_paths(args):
    """(libnvrtc, CUDA include folder) from the arguments, the venv or the system."""
    prefixes = [p for p in (os.environ.get("VIRTUAL_ENV"), sys.prefix) if p]
    wheel = [f"{p}/lib/python3*/site-packages/nvidia/cu13" for p in prefixes]
    nvrtc = args.nvrtc or find([f"{w}/lib/libnvrtc.so.13" for w in wheel]
                               + ["/usr/local/cuda/lib64/libnvrtc.so.13"])
    inc = args.include or find([f"{w}/include" for w in wheel] + ["/usr/local/cuda/include"])
    return nvrtc, inc


class KernelSource:
    """The library's module list and sources, through examples/kernel_source.rs."""

    def __init__(self, exe):
        if exe is None:
            subprocess.run(["cargo", "build", "--release", "-q", "--example", "kernel_source"],
                           cwd=ROOT, check=True)
            exe = ROOT / "target" / "release" / "examples" / "kernel_source"
        self.exe = str(exe)

    def modules(self):
        out = subprocess.run([self.exe, "--list"], check=True, capture_output=True, text=True)
        return out.stdout.split()

    def source(self, module):
        out = subprocess.run([self.exe, "--expanded", module], check=True,
                             capture_output=True, text=True)
        return out.stdout


def select(modules, wanted):
    """The modules named in `wanted` or of a family named there (all without names)."""
    if not wanted:
        return list(modules)
    return [m for m in modules if any(m == w or m.startswith(w + "_") for w in wanted)]


class Nvrtc:
    def __init__(self, path, include):
        for b in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")):
            ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        self.include = include

    def compile(self, name, src, arch):
        """(ok, log, cubin bytes or None) of `src` compiled for `arch`."""
        lib = self.lib
        prog = ctypes.c_void_p()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(),
                                    0, None, None)
        assert rc == 0, rc
        # src/gpu/nvrtc.rs `options`, plus the ptxas report
        opts = [f"--gpu-architecture={arch}", "--std=c++17", f"--include-path={self.include}",
                "--device-as-default-execution-space", "-DFK_NVRTC=1", "-Xptxas", "-v"]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        cubin = None
        if rc == 0:
            n = ctypes.c_size_t()
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
            buf = ctypes.create_string_buffer(n.value)
            lib.nvrtcGetCUBIN(prog, buf)
            cubin = buf.raw
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return rc == 0, log.value.decode(errors="replace"), cubin


def kernel_lines(log, substr):
    """(kernel, ptxas line) for each register / spill / shared-memory line of `log`."""
    kernel = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line) or \
            re.search(r"Function properties for (\w+)", line)
        if m:
            kernel = m.group(1)
            continue
        if kernel and substr in kernel and ("Used" in line or "spill" in line):
            yield kernel, line.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="module names or families (default: all)")
    ap.add_argument("--list", action="store_true", help="print the module names and stop")
    ap.add_argument("--define", action="append", default=[])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--filter", default="", help="only kernels whose name contains this")
    ap.add_argument("--cubin", help="write each module's cubin into this folder")
    ap.add_argument("--kernel-source", help="a built examples/kernel_source (default: build it)")
    ap.add_argument("--nvrtc")
    ap.add_argument("--include")
    args = ap.parse_args()

    ks = KernelSource(args.kernel_source)
    modules = ks.modules()
    if args.list:
        print("\n".join(modules))
        return 0
    chosen = select(modules, args.modules)
    if not chosen:
        print(f"no kernel module matches {args.modules} (--list names them)", file=sys.stderr)
        return 1
    nvrtc, inc = cuda_paths(args)
    if not nvrtc or not inc:
        print("libnvrtc.so.13 / CUDA headers not found (set VIRTUAL_ENV or --nvrtc/--include)",
              file=sys.stderr)
        return 2
    compiler = Nvrtc(nvrtc, inc)
    defines = "".join(f"#define {d.replace('=', ' ', 1)}\n" for d in args.define)
    if args.cubin:
        os.makedirs(args.cubin, exist_ok=True)
    failed = []
    for name in chosen:
        t = time.time()
        ok, log, cubin = compiler.compile(name, defines + ks.source(name), args.arch)
        if not ok:
            print(log)
            print(f"{name}: compile failed", file=sys.stderr)
            failed.append(name)
            continue
        print(f"== {name} ({args.arch}): compiled in {time.time() - t:.1f}s")
        if args.cubin:
            pathlib.Path(args.cubin, f"{name}-{args.arch}.cubin").write_bytes(cubin)
        for kernel, line in kernel_lines(log, args.filter):
            print(f"{kernel:<28} {line}")
    if failed:
        print(f"{len(failed)} of {len(chosen)} modules failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
