"""scripts/ptxas_report.py on the library's own kernel modules: the first module of
every family that `kernel_source --list` names is compiled with NVRTC, and each one
reports the registers of its kernels. No GPU needed; skipped without the NVRTC wheel
and the CUDA headers (scripts/test.sh installs both)."""

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ptxas_report", ROOT / "scripts" / "ptxas_report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def test_one_module_of_every_family_reports_its_kernels():
    nvrtc, include = report.cuda_paths(argparse.Namespace(nvrtc=None, include=None))
    if not nvrtc or not include:
        pytest.skip("libnvrtc.so.13 / CUDA headers not found (the nvidia-cuda-nvrtc wheel)")
    source = report.KernelSource(None)  # builds examples/kernel_source
    modules = source.modules()
    first = {}
    for m in modules:
        first.setdefault(m.split("_")[0], m)
    assert len(first) >= 5, f"families of {modules}"
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ptxas_report.py"), *first.values(),
         "--kernel-source", source.exe, "--nvrtc", nvrtc, "--include", include],
        capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    sections = dict(re.findall(r"^== (\w+) \(sm_90\)[^\n]*\n(.*?)(?=^== |\Z)", out.stdout, re.M | re.S))
    assert sorted(sections) == sorted(first.values()), out.stdout[-4000:]
    for name, text in sections.items():
        assert re.search(r"Used \d+ registers", text), f"{name}: no ptxas report\n{text}"
    # a name that is no module is an error, not an empty report
    bad = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ptxas_report.py"), "no_such_module",
         "--kernel-source", source.exe], capture_output=True, text=True)
    assert bad.returncode == 1 and "no kernel module matches" in bad.stderr
