"""Shared fixtures for the fusekit Python tests.

The tests import the package from this source tree (bindings/python), so they
test the code next to them whether or not it is pip-installed. The library is
found as the package finds it ($FUSEKIT_LIBRARY, then target/release, then
target/debug of the repository).

With FUSEKIT_TEST_INSTALLED=1 they test the installed package instead (CI installs
the wheel into a fresh environment, scripts/test.sh): the source tree is not put on
sys.path, and a fusekit imported from the repository is an error. PKG_ROOT is then
the folder holding the installed package (site-packages).
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parents[2]
INSTALLED = os.environ.get("FUSEKIT_TEST_INSTALLED") == "1"
for p in (TESTS_DIR,) if INSTALLED else (TESTS_DIR.parent, TESTS_DIR):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

# XLA's command buffers (on by default on GPUs) replay custom calls that declare the
# CUDA-graph trait from graphs, without entering their handlers: the tests that count
# handler entries (fkj.count_calls) count executions, so this process runs jax with them
# off. test_jax_gpu.py's graph tests turn them on in their own processes (run_script).
if "xla_gpu_enable_command_buffer" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=").strip()

import fusekit  # noqa: E402

PKG_ROOT = Path(fusekit.__file__).resolve().parents[1]
if INSTALLED and REPO_ROOT in Path(fusekit.__file__).resolve().parents:
    raise RuntimeError(f"FUSEKIT_TEST_INSTALLED=1 but fusekit was imported from the repository: {fusekit.__file__}")

@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(scope="session")
def cpu():
    return fusekit.default_context("cpu")


def sgd_losses(model, fwd, x, target, steps, mark_step=False):
    """``steps`` steps of SGD (lr 0.05) on ``model``'s parameters, minimising the mean
    squared error of ``fwd(x)`` against ``target``: the loss of each step. With
    ``mark_step``, ``torch.compiler.cudagraph_mark_step_begin()`` before each step (a
    torch.compile reduce-overhead model)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        if mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = (fwd(x) - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def pytest_report_header(config):
    try:
        path = fusekit.library_path()
    except Exception as e:  # noqa: BLE001
        path = f"not loadable: {e}"
    return [
        f"fusekit {fusekit.__version__} ({'installed' if INSTALLED else 'source tree'}): {fusekit.__file__}",
        f"fusekit library: {path}",
        f"FUSEKIT_LIBRARY={os.environ.get('FUSEKIT_LIBRARY', '')}",
    ]
