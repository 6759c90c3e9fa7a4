"""Finding and loading libfusekit; the ctypes prototypes."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fusekit as fk
from conftest import PKG_ROOT, REPO_ROOT
from fusekit import _lib


def test_search_order(tmp_path):
    pkg = tmp_path / "a" / "b" / "fusekit"
    paths = [p for _, p in _lib.candidate_paths({"FUSEKIT_LIBRARY": "/x/libfusekit.so"}, pkg)]
    assert paths[0] == "/x/libfusekit.so"
    assert paths[1] == str(pkg / _lib.LIBRARY_FILE)
    # then, walking up, target/release before target/debug at each level
    assert paths[2] == str(pkg.parent / "target" / "release" / _lib.LIBRARY_FILE)
    assert paths[3] == str(pkg.parent / "target" / "debug" / _lib.LIBRARY_FILE)
    assert paths[4] == str(pkg.parent.parent / "target" / "release" / _lib.LIBRARY_FILE)
    assert str(tmp_path / "target" / "debug" / _lib.LIBRARY_FILE) in paths


def test_not_found_lists_every_place(tmp_path):
    pkg = tmp_path / "site" / "fusekit"
    with pytest.raises(fk.LibraryLoadError) as ei:
        _lib.load_library(env={}, package_dir=pkg, system=False)
    msg = str(ei.value)
    assert str(pkg / _lib.LIBRARY_FILE) in msg
    assert str(tmp_path / "site" / "target" / "release" / _lib.LIBRARY_FILE) in msg
    assert str(tmp_path / "site" / "target" / "debug" / _lib.LIBRARY_FILE) in msg
    assert "FUSEKIT_LIBRARY" in msg and "cargo build" in msg
    assert len(ei.value.searched) >= 4
    assert isinstance(ei.value, ImportError)


def test_explicit_path_that_does_not_exist_is_an_error(tmp_path):
    bad = str(tmp_path / "nope" / "libfusekit.so")
    with pytest.raises(fk.LibraryLoadError) as ei:
        _lib.load_library(env={"FUSEKIT_LIBRARY": bad}, package_dir=PKG_ROOT / "fusekit")
    assert bad in str(ei.value) and "$FUSEKIT_LIBRARY" in str(ei.value)


def test_explicit_path_that_is_not_a_library(tmp_path):
    junk = tmp_path / "libfusekit.so"
    junk.write_text("not an ELF file")
    with pytest.raises(fk.LibraryLoadError) as ei:
        _lib.load_library(env={"FUSEKIT_LIBRARY": str(junk)})
    assert str(junk) in str(ei.value)


def test_import_works_without_the_library_and_the_first_call_explains():
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(PKG_ROOT)!r})
        import numpy as np
        import fusekit
        try:
            fusekit.add(np.ones(2), np.ones(2))
        except fusekit.LibraryLoadError as e:
            print("LOAD ERROR:", e)
        """
    )
    env = dict(os.environ, FUSEKIT_LIBRARY="/definitely/missing/libfusekit.so")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "LOAD ERROR:" in p.stdout and "/definitely/missing/libfusekit.so" in p.stdout


def _built_library() -> Path:
    return Path(_lib.library_path())


def test_library_next_to_the_package_is_found(tmp_path):
    pkg = tmp_path / "fusekit"
    shutil.copytree(PKG_ROOT / "fusekit", pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so", "fusekit-kernels"))
    os.symlink(_built_library(), pkg / _lib.LIBRARY_FILE)
    code = "import fusekit; print(fusekit.library_path())"
    env = {k: v for k, v in os.environ.items() if k not in ("FUSEKIT_LIBRARY", "CARGO_TARGET_DIR")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(pkg / _lib.LIBRARY_FILE)


def test_repository_build_output_is_found():
    env = {k: v for k, v in os.environ.items() if k not in ("FUSEKIT_LIBRARY", "CARGO_TARGET_DIR")}
    release = REPO_ROOT / "target" / "release" / _lib.LIBRARY_FILE
    debug = REPO_ROOT / "target" / "debug" / _lib.LIBRARY_FILE
    if not release.exists() and not debug.exists():
        pytest.skip("no build output in the repository")
    # the source tree's package folder (an installed package holds its own library)
    cdll, path = _lib.load_library(env=env, package_dir=REPO_ROOT / "bindings" / "python" / "fusekit")
    assert path == str(release if release.exists() else debug)


def test_every_prototype_is_declared_on_the_loaded_library():
    L = _lib.lib()
    for name, (restype, argtypes) in _lib.PROTOTYPES.items():
        fn = getattr(L, name)
        assert fn.restype is restype, name
        assert list(fn.argtypes) == list(argtypes), name


def test_scalar_struct_layout():
    import ctypes

    assert ctypes.sizeof(_lib.fk_scalar) == 16
    s = _lib.scalar(1 - 2j)
    assert (s.re, s.im) == (1.0, -2.0)
    assert _lib.PROTOTYPES["fk_axpby"][1][0] is _lib.fk_scalar  # passed by value
