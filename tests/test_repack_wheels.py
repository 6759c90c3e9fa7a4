"""scripts/repack_installed_wheels.py: a wheel rebuilt from an installed distribution
installs the same files (pip, no index), its RECORD is regenerated, and the bad
cases are errors naming the distribution."""

import base64
import csv
import hashlib
import importlib.util
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("repack", ROOT / "scripts" / "repack_installed_wheels.py")
repack = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repack)


def h(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


FILES = {
    "fk_fake_pkg/__init__.py": b"VALUE = 42\n",
    "fk_fake_pkg/lib/libthing.so": bytes(range(256)) * 64,
    "fk_fake_pkg/include/thing.h": b"#define THING 1\n",
    "fk_fake_pkg/bin/tool": b"#!/bin/sh\necho tool\n",
}
EXECUTABLE = "fk_fake_pkg/bin/tool"
WHEEL = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-manylinux2014_x86_64\nTag: py3-none-manylinux_2_17_x86_64\n"


def install_fake(site: Path, wheel_text: str = WHEEL) -> None:
    """A distribution fk-fake-pkg 1.2.3 as an installer leaves it in site-packages."""
    di = "fk_fake_pkg-1.2.3.dist-info"
    files = dict(FILES)
    files[f"{di}/METADATA"] = b"Metadata-Version: 2.1\nName: fk-fake-pkg\nVersion: 1.2.3\n"
    files[f"{di}/WHEEL"] = wheel_text.encode()
    files[f"{di}/INSTALLER"] = b"pip\n"
    files["fk_fake_pkg/__pycache__/__init__.cpython-311.pyc"] = b"compiled"
    rows = []
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        if rel == EXECUTABLE:
            (site / rel).chmod(0o755)
        rows.append([rel, "" if "__pycache__" in rel else h(data), len(data)])
    rows.append(["../../../bin/fk-fake", h(b"#!python\n"), 9])  # a console script
    rows.append([f"{di}/RECORD", "", ""])
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    (site / di / "RECORD").write_text(out.getvalue())


@pytest.fixture
def site(tmp_path, monkeypatch):
    s = tmp_path / "site"
    s.mkdir()
    monkeypatch.syspath_prepend(str(s))
    return s


def test_repacked_wheel_installs_the_same_files(site, tmp_path):
    install_fake(site)
    name, version, whl = repack.repack("fk-fake-pkg", tmp_path / "out")
    assert (name, version) == ("fk-fake-pkg", "1.2.3")
    assert whl.name == "fk_fake_pkg-1.2.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        record = list(csv.reader(io.StringIO(z.read("fk_fake_pkg-1.2.3.dist-info/RECORD").decode())))
        for rel, digest, size in record:
            if rel.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = z.read(rel)
            assert digest == h(data) and int(size) == len(data), rel
    assert set(FILES) <= names
    assert not any("__pycache__" in n or n.endswith(("INSTALLER", "bin/fk-fake")) for n in names)
    assert {r[0] for r in record} == names
    target = tmp_path / "target"
    p = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target), str(whl)],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr
    for rel, data in FILES.items():
        assert (target / rel).read_bytes() == data, rel
    # the executable bit survives (triton's ptxas lost it once and torch.compile failed)
    assert (target / EXECUTABLE).stat().st_mode & 0o111, "executable bit lost"
    assert not (target / "fk_fake_pkg" / "include" / "thing.h").stat().st_mode & 0o111


def test_a_file_changed_after_install_is_an_error(site, tmp_path):
    install_fake(site)
    (site / "fk_fake_pkg" / "include" / "thing.h").write_bytes(b"#define THING 2\n")
    with pytest.raises(repack.RepackError, match=r"fk-fake-pkg: installed files differ from its RECORD: fk_fake_pkg/include/thing.h"):
        repack.repack("fk-fake-pkg", tmp_path / "out")


def test_a_wheel_file_without_tags_is_an_error(site, tmp_path):
    install_fake(site, wheel_text="Wheel-Version: 1.0\n")
    with pytest.raises(repack.RepackError, match="its WHEEL file has no Tag line"):
        repack.repack("fk-fake-pkg", tmp_path / "out")


def test_a_distribution_not_installed_is_an_error_and_exit_1(tmp_path, capsys):
    with pytest.raises(repack.RepackError, match="fk-not-installed-dist: not installed in"):
        repack.repack("fk-not-installed-dist", tmp_path)
    assert repack.main(["-o", str(tmp_path), "fk-not-installed-dist"]) == 1
    assert "fk-not-installed-dist: not installed" in capsys.readouterr().err


def test_wheel_tags_compress_like_wheel_names():
    assert repack.wheel_tags("Tag: py3-none-any\n") == "py3-none-any"
    assert repack.wheel_tags(WHEEL) == "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"
    with pytest.raises(repack.RepackError, match="malformed tags"):
        repack.wheel_tags("Tag: py3-none\n")


def fake_dist(site: Path, name: str, requires: list[str]) -> None:
    di = site / f"{name.replace('-', '_')}-1.0.dist-info"
    di.mkdir(parents=True)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    (di / "METADATA").write_text(meta)
    (di / "RECORD").write_text("")


def test_dependencies_follow_requested_extras_and_markers(site):
    fake_dist(site, "fk-top", ["fk-mid[x]>=1", "fk-only-with-y; extra == 'y'", "fk-never; python_version < '3'"])
    fake_dist(site, "fk-mid", ["fk-leaf; extra == 'x'", "fk-other; extra == 'z'"])
    fake_dist(site, "fk-leaf", ["fk-mid"])  # a cycle ends
    assert repack.with_dependencies(["fk-top"]) == ["fk-top", "fk-mid", "fk-leaf"]
