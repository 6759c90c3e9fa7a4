"""One version, Cargo.toml's, everywhere: the Python package (and the installed
wheel's metadata), the library's fk_version_string(), the C header's FK_VERSION and
the install prefix's files (scripts/install.sh: library file name, pkg-config,
CMake package version)."""

import importlib.metadata
import re
import subprocess

import pytest

import fusekit
from conftest import INSTALLED, REPO_ROOT


try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # older Pythons: the tomli backport, or these tests are skipped
    tomllib = pytest.importorskip("tomli")

# Cargo.toml's [package] version as a TOML parser reads it: independent of the line
# scan in setup.py that wrote fusekit/_version.py (which the first test checks)
VERSION = tomllib.loads((REPO_ROOT / "Cargo.toml").read_text())["package"]["version"]


def test_package_version_is_cargo_version():
    assert fusekit.__version__ == VERSION


def test_library_version_string_is_cargo_version():
    assert fusekit.version_string() == f"fusekit {VERSION}"


def test_header_fk_version_is_cargo_version():
    header = (REPO_ROOT / "include" / "fusekit.h").read_text()
    m = re.search(r'^#define FK_VERSION "([^"]+)"$', header, re.M)
    assert m, "include/fusekit.h has no FK_VERSION"
    assert m.group(1) == VERSION


@pytest.mark.skipif(not INSTALLED, reason="the distribution's metadata is checked on the installed wheel")
def test_installed_distribution_version_is_cargo_version():
    assert importlib.metadata.version("fusekit") == VERSION
    files = [str(f) for f in importlib.metadata.files("fusekit")]
    assert "fusekit/libfusekit.so" in files


def test_install_prefix_files_carry_cargo_version(tmp_path):
    lib = REPO_ROOT / "target" / "release"
    if not (lib / "libfusekit.so").exists() or not (lib / "libfusekit.a").exists():
        pytest.skip("no release build in the repository (cargo build --release)")
    p = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "install.sh"), "--no-build", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "lib" / f"libfusekit.so.{VERSION}").is_file()
    major = VERSION.split(".")[0]
    assert (tmp_path / "lib" / f"libfusekit.so.{major}").is_symlink()
    pc = (tmp_path / "lib" / "pkgconfig" / "fusekit.pc").read_text()
    assert re.search(rf"^Version: {re.escape(VERSION)}$", pc, re.M), pc
    cmake = (tmp_path / "lib" / "cmake" / "fusekit" / "fusekitConfigVersion.cmake").read_text()
    assert f'set(PACKAGE_VERSION "{VERSION}")' in cmake
