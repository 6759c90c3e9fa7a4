#!/usr/bin/env python3
"""Compares two folders of kernel images made by tests/kernels_compile.rs with
FK_PREBUILT_OUT (files ``<module>-<arch>-<key>.cubin``; the key hashes the source,
so modules are paired by name). scripts/kernel_compare.sh runs it; see there.

    kernel_compare.py BASE_DIR WORK_DIR [--arch sm_90] [--cuobjdump PATH]
                      [--rename OLD=NEW ...] [--diffs DIR]

Per module: ``identical bytes``; else, with cuobjdump, ``same SASS`` when every
function's instructions (encodings included, addresses left out), resource use
(registers, stack, shared and constant memory) and kernel attributes (.nv.info:
parameter offsets and sizes, launch bounds) are equal, or ``same SASS, renamed``
when they are equal up to the functions' names; else ``DIFFERENT``
(the diff is written to --diffs). ``only in base`` / ``only in tree`` for a module
without a partner. Exit status 1 when any module is DIFFERENT or unpaired, 2 on
bad input.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

IMAGE = re.compile(r"^(?P<name>.+)-(?P<arch>sm_\d+[a-z]?)-(?P<key>[0-9a-f]{32})\.cubin$")
ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")


def images(folder: Path, arch: str) -> dict:
    out = {}
    for f in sorted(folder.glob("*.cubin")):
        m = IMAGE.match(f.name)
        if m is None or m["arch"] != arch:
            continue
        if m["name"] in out:
            sys.exit(f"kernel_compare.py: two images of {m['name']} for {arch} in {folder}")
        out[m["name"]] = f
    return out


def functions(cuobjdump: str, cubin: Path) -> dict:
    """Function name -> its normalised SASS (addresses left out) and resource use."""

    def run(*args):
        p = subprocess.run([cuobjdump, *args, str(cubin)], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"kernel_compare.py: cuobjdump {' '.join(args)} {cubin}: {p.stderr.strip()}")
        return p.stdout

    funcs, name = {}, None
    for line in run("-sass").splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m[1]
            funcs[name] = []
        elif name is not None and line.strip():
            funcs[name].append(" ".join(ADDRESS.sub("", line).split()))
    res = run("-res-usage")
    for m in re.finditer(r"Function (\S+):\s*\n\s*(.+)", res):
        if m[1] in funcs:
            funcs[m[1]].append("resources: " + " ".join(m[2].split()))
    # the kernel attributes of .nv.info.<function>: parameter offsets and sizes,
    # launch bounds, ...; EIATTR_PARAM_CBANK's first value is a symbol index (layout)
    name, attr = None, None
    for line in run("-elf").splitlines():
        m = re.match(r"\.nv\.info\.(\S+)\s*$", line)
        if m:
            name = m[1] if m[1] in funcs else None
        elif line[:1] not in ("", "\t", " "):
            name = None
        elif name is not None and line.strip():
            text = " ".join(line.split())
            if text.startswith("Attribute:"):
                attr = text.split()[-1]
            elif text.startswith("Value:") and attr == "EIATTR_PARAM_CBANK":
                text = " ".join(text.split()[:1] + text.split()[2:])
            funcs[name].append("info: " + text)
    return {k: "\n".join(v) + "\n" for k, v in funcs.items()}


def compare(cuobjdump, a: Path, b: Path, diff_file: Path | None):
    if a.read_bytes() == b.read_bytes():
        return "identical bytes", True
    if cuobjdump is None:
        return "DIFFERENT bytes (no cuobjdump to compare SASS)", False
    fa, fb = functions(cuobjdump, a), functions(cuobjdump, b)
    if fa == fb:
        return "same SASS", True

    if Counter(fa.values()) == Counter(fb.values()):  # equal up to the names
        gone, new = sorted(set(fa) - set(fb)), sorted(set(fb) - set(fa))
        return f"same SASS, renamed ({', '.join(gone)[:150]} -> {', '.join(new)[:150]})", True
    if diff_file is not None:
        lines = []
        for name in sorted(set(fa) | set(fb)):
            x, y = fa.get(name, ""), fb.get(name, "")
            if x != y:
                lines += difflib.unified_diff(x.splitlines(True), y.splitlines(True), f"base {name}", f"tree {name}", n=2)
        diff_file.parent.mkdir(parents=True, exist_ok=True)
        diff_file.write_text("".join(lines))
    changed = sorted(n for n in set(fa) | set(fb) if fa.get(n) != fb.get(n))
    where = f" (diff: {diff_file})" if diff_file is not None else ""
    return f"DIFFERENT SASS in {len(changed)} of {len(set(fa) | set(fb))} functions{where}", False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                    help="module OLD at the base is module NEW in the tree")
    ap.add_argument("--diffs", type=Path, help="folder for the SASS diffs of DIFFERENT modules")
    args = ap.parse_args()
    va = (args.base / "nvrtc-version").read_text().strip() if (args.base / "nvrtc-version").is_file() else None
    vb = (args.work / "nvrtc-version").read_text().strip() if (args.work / "nvrtc-version").is_file() else None
    if va is None or va != vb:
        print(f"kernel_compare.py: the images come from different NVRTCs or none ({va} vs {vb})", file=sys.stderr)
        return 2
    base, work = images(args.base, args.arch), images(args.work, args.arch)
    if not base or not work:
        print(f"kernel_compare.py: no {args.arch} images in {args.base if not base else args.work}", file=sys.stderr)
        return 2
    renames = dict(r.split("=", 1) for r in args.rename)
    pairs, only_base = [], []
    for name in sorted(base):
        new = renames.get(name, name)
        if new in work:
            pairs.append((name, new))
        else:
            only_base.append(name)
    paired = {n for _, n in pairs}
    only_work = sorted(n for n in work if n not in paired)

    rows, ok = [], True
    for old, new in pairs:
        diff = args.diffs / f"{new}.diff" if args.diffs else None
        status, same = compare(args.cuobjdump, base[old], work[new], diff)
        ok &= same
        rows.append((new if old == new else f"{old} -> {new}", status))
    rows += [(n, "only in base (DIFFERENT)") for n in only_base]
    rows += [(n, "only in tree (DIFFERENT)") for n in only_work]
    ok &= not only_base and not only_work
    width = max(len(r[0]) for r in rows)
    print(f"{'module':<{width}}  {args.arch} (NVRTC {va})")
    for name, status in rows:
        print(f"{name:<{width}}  {status}")
    counts = Counter("DIFFERENT" if "DIFFERENT" in s else s.split(" (")[0] for _, s in rows)
    print("; ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
