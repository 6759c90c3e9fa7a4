"""Shared fixtures for the fusekit Python tests.

The tests import the package from this source tree (bindings/python), so they
test the code next to them whether or not it is pip-installed. The library is
found as the package finds it ($FUSEKIT_LIBRARY, then target/release, then
target/debug of the repository).
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

PKG_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = PKG_ROOT.parents[1]
for p in (PKG_ROOT, Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import fusekit  # noqa: E402

@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(scope="session")
def cpu():
    return fusekit.default_context("cpu")


def pytest_report_header(config):
    try:
        path = fusekit.library_path()
    except Exception as e:  # noqa: BLE001
        path = f"not loadable: {e}"
    return [f"fusekit library: {path}", f"FUSEKIT_LIBRARY={os.environ.get('FUSEKIT_LIBRARY', '')}"]
