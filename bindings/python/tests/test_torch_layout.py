"""The torch layer's layout, read from the sources: one compiled file and one
Python module per op family, one STABLE_TORCH_LIBRARY defining the namespace, and
every op a family's C++ file defines registered (with its fake) by that family's
Python module, so that nothing traces without a fake under torch.compile."""

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "fusekit"  # the source tree, also when testing a wheel
CSRC = SRC / "csrc"
FAMILIES = ("elementwise", "linalg", "mlp", "gaussian", "geodesic", "optim")


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


def schemas(cpp: str) -> list:
    """Op names of the family's table rows FK_TORCH_OP(name, "(...) -> ..."), each
    the op's schema and its kernel (FK_TORCH_FAMILY of common.h registers both)."""
    text = _strip_comments(cpp)
    names = []
    for m in re.finditer(r"FK_TORCH_OP\(\s*([A-Za-z_0-9]+)\s*,\s*\"\(", text):
        names.append(m.group(1))
    return names


def registered(py: str) -> set:
    return set(re.findall(r"register\(\s*\"([A-Za-z_0-9]+)\"", py))


def test_schema_scan_reads_a_fragment():
    cpp = 'constexpr Op kOps[] = {\n  FK_TORCH_OP(a, "(Tensor x) -> Tensor"),\n' \
          '  // FK_TORCH_OP(gone, "(Tensor x) -> ()"),\n  FK_TORCH_OP(b_out, "(Tensor x, "\n        "Tensor(a!) o) -> ()"),\n};\n'
    assert schemas(cpp) == ["a", "b_out"]
    assert registered('x = register("a", fake=f)\nregister(\n    "b_out", fake=no_output)') == {"a", "b_out"}


def test_the_one_library_definition_is_in_common_cpp():
    defs = {p.name: len(re.findall(r"\bSTABLE_TORCH_LIBRARY\(", _strip_comments(p.read_text())))
            for p in CSRC.glob("*.cpp")}
    assert {n: c for n, c in defs.items() if c} == {"common.cpp": 1}


@pytest.mark.parametrize("family", FAMILIES)
def test_family_files_and_registrations(family):
    cpp = (CSRC / f"{family}.cpp").read_text()
    py = (SRC / "torch" / f"{family}.py").read_text()
    body = _strip_comments(cpp)
    # one table per family: its rows are both the schemas (the fragment) and the kernels
    assert len(re.findall(r"^constexpr Op kOps\[\] = \{", body, flags=re.M)) == 1
    assert len(re.findall(r"^FK_TORCH_FAMILY\(fusekit_torch::kOps\)$", body, flags=re.M)) == 1
    assert "STABLE_TORCH_LIBRARY" not in body and "m.def(" not in body and "m.impl(" not in body, \
        f"csrc/{family}.cpp registers outside its table"
    ops = schemas(cpp)
    assert ops, f"{family}.cpp defines no op"
    assert set(ops) == registered(py), f"fusekit/torch/{family}.py registers other ops than csrc/{family}.cpp defines"


def test_no_op_is_defined_twice():
    seen = {}
    for family in FAMILIES:
        for op in schemas((CSRC / f"{family}.cpp").read_text()):
            assert op not in seen, f"{op} defined in {seen.get(op)} and {family}"
            seen[op] = family


def test_every_family_is_in_the_route():
    import fusekit.torch

    assert fusekit.torch.FAMILIES == FAMILIES
    assert sorted(p.stem for p in CSRC.glob("*.cpp")) == sorted(("common",) + FAMILIES)
