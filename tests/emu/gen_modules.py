#!/usr/bin/env python3
"""Turns kernels/geodesic.cu into one C++ translation unit per (module, dtype) for
the CPU emulator (tests/emu/emu.h): the few CUDA-only lines are replaced, the kernels
are wrapped in a namespace and registered by name.

    python3 tests/emu/gen_modules.py OUTDIR
"""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
KINDS = {"CHR_FWD": "chr_fwd", "CHR_BWD": "chr_bwd", "LF_FWD": "lf_fwd", "LF_BWD": "lf_bwd"}
TYPES = {"f32": "float", "f64": "double"}


def kernel_text():
    src = (ROOT / "kernels" / "geodesic.cu").read_text()
    reps = [
        ('#include "common.cuh"', ""),
        ("extern __shared__ __align__(32) unsigned char geo_smem[];", "#define geo_smem (emu::smem)"),
        ('asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));', "r = emu::dyn_smem;"),
        ('extern "C" ', ""),
    ]
    for a, b in reps:
        assert a in src, f"kernels/geodesic.cu no longer contains {a!r}: update tests/emu/gen_modules.py"
        src = src.replace(a, b)
    return src


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    text = kernel_text()
    for mod, kind in KINDS.items():
        for ty, cty in TYPES.items():
            ns = f"mod_{kind}_{ty}"
            names = [f"geo_{kind}_r{rp}_d{dj}" for rp in (8, 16, 32) for dj in (2, 4, 8, 16)]
            names.append(f"geo_{kind}_gen")
            tf32 = ty == "f32" and kind in ("chr_fwd", "lf_fwd")
            if tf32:
                names += [f"geo_{kind}_tc_r{rp}_d{dj}" for rp in (8, 16, 32) for dj in (2, 4, 8, 16)]
            if tf32 and kind == "lf_fwd":  # the 3xTF32 variants (FK_GEO_ALLOW_TF32X3)
                names += [f"geo_{kind}_tc3_r{rp}_d{dj}" for rp in (8, 16, 32) for dj in (2, 4, 8, 16)]
            lines = ['#include "emu.h"', '#include "registry.h"', f"namespace {ns} {{",
                     f"#define GEO_MODULE_{mod} 1", f"#define GEO_T {cty}"] + (["#define GEO_TF32 1"] if tf32 else []) + [
                     text, "}  // namespace", ""]
            lines.append(f"void register_{kind}_{ty}(Registry& r) {{")
            for n in names:
                lines.append(f'    r["{kind}_{ty}/{n}"] = [](const void* a) {{ {ns}::{n}(*static_cast<const {ns}::GeoArgs*>(a)); }};')
            if kind.endswith("bwd"):
                lines.append(f'    r["{kind}_{ty}/geo_reduce"] = [](const void* a) {{ {ns}::geo_reduce(*static_cast<const {ns}::ReduceArgs*>(a)); }};')
            lines.append("}")
            path, content = out / f"{ns}.cpp", "\n".join(lines) + "\n"
            if not path.exists() or path.read_text() != content:  # keep mtimes for make-like rebuilds
                path.write_text(content)
    print(f"wrote {len(KINDS) * len(TYPES)} modules to {out}")


if __name__ == "__main__":
    main()
