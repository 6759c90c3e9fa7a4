#!/usr/bin/env python3
"""Rebuilds .whl files from distributions installed in this Python environment.

A machine that reaches no package index (the GPU machine) can then install a
wheel's dependencies it already has installed elsewhere into a fresh environment:

    python3 scripts/repack_installed_wheels.py -o /tmp/wheels nvidia-cublas nvidia-cuda-nvrtc ...
    python3 -m venv /tmp/v && /tmp/v/bin/pip install --no-index --find-links /tmp/wheels 'dist/fusekit-*.whl[cuda]'

For each distribution, the files its dist-info RECORD lists (paths relative to the
site-packages folder it is installed in) go into a zip named
``<name>-<version>-<tags>.whl`` after its WHEEL file's tags, with the dist-info's
METADATA and WHEEL and a regenerated RECORD (sha256 and size of every file). Left
out: compiled ``__pycache__`` files, the installer's own records (INSTALLER,
REQUESTED, direct_url.json) and files outside site-packages (console scripts); an
installed file whose content no longer matches its RECORD hash is an error (the
repacked wheel would not be the installed one). Prints ``name==version`` per wheel.

``--deps`` adds every installed distribution the named ones require (their
Requires-Dist, with extras and environment markers evaluated here), so that pip
can resolve them with ``--no-index``; ``--store`` writes the zips uncompressed
(fast for gigabytes of libraries that are installed once and deleted).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata as md
import io
import re
import sys
import zipfile
from pathlib import Path

INSTALLER_FILES = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


class RepackError(Exception):
    pass


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_tags(wheel_file_text: str) -> str:
    """The compressed tag set of a WHEEL file (``py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64``)."""
    tags = [line.split(":", 1)[1].strip() for line in wheel_file_text.splitlines() if line.startswith("Tag:")]
    if not tags:
        raise RepackError("its WHEEL file has no Tag line")
    parts = [t.split("-") for t in tags]
    if any(len(p) != 3 for p in parts):
        raise RepackError(f"malformed tags in its WHEEL file: {tags}")
    return "-".join(".".join(dict.fromkeys(p[i] for p in parts)) for i in range(3))


def _requirement_class():
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip vendors packaging
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def with_dependencies(names: list[str]) -> list[str]:
    """``names`` and every installed distribution they require, transitively (a
    requirement's extras select the dependencies under those extras)."""
    Requirement = _requirement_class()
    seen: dict[str, set[str]] = {}
    order: list[str] = []
    queue = [(n, set()) for n in names]
    while queue:
        name, extras = queue.pop(0)
        key = canonical_name(name)
        if key in seen and extras <= seen[key]:
            continue
        if key not in seen:
            order.append(name)
        seen[key] = seen.get(key, set()) | extras
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue  # reported by repack
        for text in requires:
            r = Requirement(text)
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in seen[key] | {""}):
                queue.append((r.name, set(r.extras)))
    return order


def repack(name: str, out_dir: Path, store: bool = False) -> tuple[str, str, Path]:
    """Writes the wheel of installed distribution ``name`` into ``out_dir``;
    returns (name, version, wheel path)."""
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        raise RepackError(f"{name}: not installed in {sys.prefix}") from None
    files = dist.files
    if not files:
        raise RepackError(f"{name}: no RECORD (not installed from a wheel?)")
    dist_info = next((f.parts[0] for f in files if f.parts[0].endswith(".dist-info")), None)
    if dist_info is None:
        raise RepackError(f"{name}: its RECORD lists no .dist-info folder")
    wheel_text = dist.read_text("WHEEL")
    if wheel_text is None:
        raise RepackError(f"{name}: its dist-info has no WHEEL file")
    tags = wheel_tags(wheel_text)
    version = dist.version
    canonical = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    wheel_path = out_dir / f"{canonical}-{version}-{tags}.whl"

    entries: list[tuple[str, bytes, int]] = []
    modified = []
    for f in files:
        rel = f.as_posix()
        if rel.startswith("..") or f.is_absolute():
            continue  # console scripts and other files outside site-packages
        if "__pycache__" in f.parts or rel.endswith(".pyc"):
            continue
        if f.parts[0] == dist_info and f.name in INSTALLER_FILES:
            continue
        path = Path(f.locate())
        data = path.read_bytes()
        if f.hash is not None and record_hash(data) != f"{f.hash.mode}={f.hash.value}":
            modified.append(rel)
        entries.append((rel, data, path.stat().st_mode))
    if modified:
        raise RepackError(f"{name}: installed files differ from its RECORD: {', '.join(modified[:10])}")

    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for rel, data, _ in entries:
        writer.writerow([rel, record_hash(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = wheel_path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED if store else zipfile.ZIP_DEFLATED) as z:
        # dist-info last, as wheel builders write it
        # the files' permissions go along (pip restores the executable bit, e.g. of
        # triton's ptxas, from a zip entry's Unix mode)
        method = zipfile.ZIP_STORED if store else zipfile.ZIP_DEFLATED
        for rel, data, mode in sorted(entries, key=lambda e: (e[0].startswith(dist_info + "/"), e[0])):
            info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | (mode & 0o777)) << 16
            info.compress_type = method
            z.writestr(info, data)
        z.writestr(f"{dist_info}/RECORD", record.getvalue())
    tmp.replace(wheel_path)
    return dist.metadata["Name"], version, wheel_path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="+", help="installed distributions (as pip names them)")
    ap.add_argument("-o", "--out", required=True, type=Path, help="folder for the .whl files")
    ap.add_argument("--deps", action="store_true", help="also every installed distribution they require")
    ap.add_argument("--store", action="store_true", help="no compression")
    args = ap.parse_args(argv)
    failed = False
    for name in with_dependencies(args.names) if args.deps else args.names:
        try:
            n, v, p = repack(name, args.out, store=args.store)
            print(f"{n}=={v}  {p.name}  ({p.stat().st_size / 2**20:.1f} MiB)")
        except RepackError as e:
            print(f"repack_installed_wheels: {e}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
