#!/usr/bin/env python3
"""Turns the geodesic kernel modules into C++ translation units for the CPU emulator
(tests/emu/emu.h): each module's source exactly as NVRTC compiles it (printed by
`kernel_source MODULE`, examples/kernel_source.rs: the launcher's #defines and
argument structs, then the kernel text), with the few CUDA-only lines replaced,
wrapped in a namespace, its kernels registered by name. Also `args.h`: the argument
structs (declared in src/cuda/geodesic/args.rs) for the host side (main.cpp).

    python3 tests/emu/gen_modules.py KERNEL_SOURCE_BINARY OUTDIR
"""
import pathlib
import re
import subprocess
import sys

KINDS = {"christoffel_fwd": "chr_fwd", "christoffel_bwd": "chr_bwd", "leapfrog_fwd": "lf_fwd", "leapfrog_bwd": "lf_bwd"}
TYPES = ("f32", "f64")
TILES = [(rp, dj) for rp in (8, 16, 32) for dj in (2, 4, 8, 16)]
REPLACE = [
    ('#include "common.cuh"', ""),
    ("extern __shared__ __align__(32) unsigned char geo_smem[];", "#define geo_smem (emu::smem)"),
    ('asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));', "r = emu::dyn_smem;"),
    ('extern "C" ', ""),
]
STRUCTS = re.compile(r"// kernel argument structs, declared in Rust \(kernel_args!\)\n(struct \w+ \{\n(    [^\n]*;\n)*\};\n)+")


def modules():
    """(module, kind, dtype, tile or None, kernel names) of every geodesic module."""
    for op, kind in KINDS.items():
        for ty in TYPES:
            tf32 = ty == "f32" and kind in ("chr_fwd", "lf_fwd")
            for rp, dj in TILES:
                names = [f"geo_{kind}_r{rp}_d{dj}"]
                if tf32:
                    names.append(f"geo_{kind}_tc_r{rp}_d{dj}")
                if tf32 and kind == "lf_fwd":  # the 3xTF32 variant (FK_GEO_ALLOW_TF32X3)
                    names.append(f"geo_{kind}_tc3_r{rp}_d{dj}")
                yield f"geodesic_{op}_r{rp}_d{dj}_{ty}", kind, ty, names
            names = [f"geo_{kind}_gen"] + (["geo_reduce"] if kind.endswith("bwd") else [])
            yield f"geodesic_{op}_generic_{ty}", kind, ty, names


def write(path, content):
    if not path.exists() or path.read_text() != content:  # keep mtimes for make-like rebuilds
        path.write_text(content)


def main():
    exe, out = sys.argv[1], pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    seen = {a: 0 for a, _ in REPLACE}
    regs = {}
    structs = None
    for module, kind, ty, names in modules():
        src = subprocess.run([exe, module], check=True, capture_output=True, text=True).stdout
        structs = structs or STRUCTS.search(src).group(0)
        for a, b in REPLACE:
            seen[a] += a in src
            src = src.replace(a, b)
        ns = f"mod_{module}"
        lines = ['#include "emu.h"', '#include "registry.h"', f"namespace {ns} {{", src, "}  // namespace", "",
                 f"void register_{ns}(Registry& r) {{"]
        for n in names:
            arg = "ReduceArgs" if n == "geo_reduce" else "GeoArgs"
            # registered by the kernel's base name; the function is named `<base>_<dtype>`
            lines.append(f'    r["{kind}_{ty}/{n}"] = [](const void* a) {{ {ns}::{n}_{ty}(*static_cast<const {ns}::{arg}*>(a)); }};')
        lines.append("}")
        write(out / f"{ns}.cpp", "\n".join(lines) + "\n")
        regs.setdefault((kind, ty), []).append(ns)
    for a, n in seen.items():
        assert n, f"no geodesic module contains {a!r}: update tests/emu/gen_modules.py"
    for (kind, ty), nss in regs.items():
        lines = ['#include "registry.h"'] + [f"void register_{ns}(Registry& r);" for ns in nss]
        lines += [f"void register_{kind}_{ty}(Registry& r) {{"] + [f"    register_{ns}(r);" for ns in nss] + ["}"]
        write(out / f"reg_{kind}_{ty}.cpp", "\n".join(lines) + "\n")
    write(out / "args.h", "#pragma once\n#include \"emu.h\"\n" + structs)
    print(f"wrote {sum(map(len, regs.values()))} modules to {out}")


if __name__ == "__main__":
    main()
