"""The installed wheel's contents (FUSEKIT_TEST_INSTALLED=1, scripts/test.sh): the
library next to the package, the compiled torch ops, and the prebuilt kernels for
sm_80 and sm_90 (docs/packaging.md). That the library finds them is checked on a GPU
(scripts/wheel_gpu.sh cold_start: a warm-up compiles nothing)."""

import os
import re
from pathlib import Path

import pytest

import fusekit
from conftest import INSTALLED, REPO_ROOT

pytestmark = pytest.mark.skipif(not INSTALLED, reason="checks the installed wheel (FUSEKIT_TEST_INSTALLED=1)")

PKG = Path(fusekit.__file__).resolve().parent
KERNELS = PKG / "fusekit-kernels"


def test_library_is_the_one_inside_the_package():
    assert "FUSEKIT_LIBRARY" not in os.environ
    assert Path(fusekit.library_path()) == PKG / "libfusekit.so"


def elf_section_names(data: bytes) -> list[str]:
    """Section names of a little-endian ELF64 file (from its section header table)."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a little-endian ELF64 file"
    shoff = int.from_bytes(data[0x28:0x30], "little")
    shentsize, shnum, shstrndx = (int.from_bytes(data[o:o + 2], "little") for o in (0x3A, 0x3C, 0x3E))

    def header(i):
        h = data[shoff + i * shentsize: shoff + (i + 1) * shentsize]
        return int.from_bytes(h[0:4], "little"), int.from_bytes(h[0x18:0x20], "little")

    _, strtab = header(shstrndx)
    names = []
    for i in range(shnum):
        name, _ = header(i)
        names.append(data[strtab + name: data.index(b"\0", strtab + name)].decode())
    return names


def test_every_module_of_the_source_package_is_installed():
    src = REPO_ROOT / "bindings" / "python" / "fusekit"
    want = {p.relative_to(src).as_posix() for p in src.rglob("*.py") if "__pycache__" not in p.parts}
    have = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")}
    assert "_core.py" in want and not want - have, sorted(want - have)


def test_library_has_no_debug_sections():
    names = elf_section_names((PKG / "libfusekit.so").read_bytes())
    assert ".text" in names and ".dynsym" in names
    assert not [n for n in names if n.startswith(".debug")], names


def test_torch_ops_are_inside_the_package():
    torch = pytest.importorskip("torch")  # noqa: F841
    from fusekit.torch import _ext as ext

    assert Path(ext.load()) == PKG / "_fusekit_torch.so"


def test_prebuilt_kernels_cover_every_module_for_sm80_and_sm90():
    assert re.fullmatch(r"\d+\.\d+\n?", (KERNELS / "nvrtc-version").read_text())
    by_arch: dict[str, set[str]] = {}
    for f in KERNELS.glob("*.cubin"):
        m = re.fullmatch(r"(.+)-(sm_\d+)-([0-9a-f]{32})\.cubin", f.name)
        assert m, f.name
        assert f.read_bytes()[:4] == b"\x7fELF", f.name
        by_arch.setdefault(m.group(2), set()).add(m.group(1))
    assert set(by_arch) == {"sm_80", "sm_90"}
    assert by_arch["sm_80"] == by_arch["sm_90"]
    # one image per module and architecture; every op family is there
    families = {"elementwise", "gaussian", "linalg", "geodesic", "optim"}
    assert {n.split("_")[0] for n in by_arch["sm_90"]} >= families, sorted(by_arch["sm_90"])
