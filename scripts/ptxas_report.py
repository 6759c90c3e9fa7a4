#!/usr/bin/env python3
"""Compiles a kernel module with NVRTC (as fusekit does) plus `-Xptxas -v` and prints
each kernel's registers, spills and shared memory; no GPU needed.

    VIRTUAL_ENV=/path/to/venv python3 scripts/ptxas_report.py geodesic --define GEO_MODULE_CHR_FWD --define GEO_T=float [--arch sm_90] [--filter r32_d8] [--cubin out.cubin]

The geodesic module defines are GEO_MODULE_CHR_FWD, GEO_MODULE_CHR_BWD,
GEO_MODULE_LF_FWD and GEO_MODULE_LF_BWD (one per op, as src/cuda/geodesic/names.rs prepends
them); without GEO_CFG_RP/GEO_CFG_DJ or GEO_GENERIC every kernel of that op is compiled.

With --cubin, `nvdisasm -c out.cubin` (the nvidia-cuda-nvdisasm wheel has one) shows the SASS.

Needs libnvrtc.so.13 and the CUDA headers (the nvidia-cuda-nvrtc / nvidia-cuda-runtime
wheels): found under $VIRTUAL_ENV, or give --nvrtc and --include.
"""
import argparse
import ctypes
import glob
import os
import pathlib
import re
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def expand(path: pathlib.Path) -> str:
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r'\s*#include "(.+)"', line)
        if m and (ROOT / "kernels" / m.group(1)).exists():
            out.append(expand(ROOT / "kernels" / m.group(1)))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def find(pattern_list):
    for p in pattern_list:
        hits = sorted(glob.glob(p))
        if hits:
            return hits[0]
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("module", help="kernels/<module>.cu")
    ap.add_argument("--define", action="append", default=[])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--filter", default="")
    ap.add_argument("--nvrtc")
    ap.add_argument("--include")
    ap.add_argument("--cubin", help="also write the cubin here (for nvdisasm -c)")
    args = ap.parse_args()
    venv = os.environ.get("VIRTUAL_ENV", "")
    nvrtc = args.nvrtc or find([f"{venv}/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
                                "/usr/local/cuda/lib64/libnvrtc.so*"])
    inc = args.include or find([f"{venv}/lib/python3*/site-packages/nvidia/cu13/include",
                                "/usr/local/cuda/include"])
    if not nvrtc or not inc:
        sys.exit("libnvrtc.so.13 / CUDA headers not found (set VIRTUAL_ENV or --nvrtc/--include)")
    builtins = glob.glob(os.path.join(os.path.dirname(nvrtc), "libnvrtc-builtins.so.*"))
    for b in builtins:
        ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(nvrtc, mode=ctypes.RTLD_GLOBAL)
    src = "".join(f"#define {d.replace('=', ' ', 1)}\n" for d in args.define)
    src += expand(ROOT / "kernels" / f"{args.module}.cu")
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{args.module}.cu".encode(), 0, None, None)
    assert rc == 0, rc
    opts = [f"--gpu-architecture={args.arch}", "--std=c++17", f"--include-path={inc}",
            "--device-as-default-execution-space", "-DFK_NVRTC=1", "-Xptxas", "-v"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    t = time.time()
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    dt = time.time() - t
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace")
    if rc != 0:
        print(text)
        sys.exit(f"compile failed (rc {rc})")
    print(f"compiled in {dt:.1f}s")
    if args.cubin:
        n = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetCUBIN(prog, buf)
        pathlib.Path(args.cubin).write_bytes(buf.raw)
    kernel = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            kernel = m.group(1)
            continue
        m2 = re.search(r"Function properties for (\w+)", line)
        if m2:
            kernel = m2.group(1)
        if kernel and args.filter in kernel and ("Used" in line or "spill" in line):
            print(f"{kernel:<28} {line.strip()}")


if __name__ == "__main__":
    main()
