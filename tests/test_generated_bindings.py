"""The bindings' generated files match include/fusekit.h.

scripts/gen_bindings.py writes bindings/python/fusekit/_abi.py,
bindings/python/fusekit/csrc/fk_abi.h and bindings/julia/abi_gen.jl from the
header. This fails when one of them is stale (run `python scripts/gen_bindings.py`),
shows that the check does fail on a stale file, checks the parser on the
constructs cbindgen may emit, and guards against hand copies of what is generated
(the ABI version, the torch op codes) elsewhere in the bindings.
"""

from __future__ import annotations

import ast
import ctypes
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADER = ROOT / "include" / "fusekit.h"
SCRIPT = ROOT / "scripts" / "gen_bindings.py"
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bindings" / "python"))

import gen_bindings as G  # noqa: E402


def run_gen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def header_text() -> str:
    return HEADER.read_text()


# ----------------------------------------------------------------------------- the check


def test_generated_files_are_up_to_date():
    r = run_gen("--check")
    assert r.returncode == 0, r.stderr + "\nrun `python scripts/gen_bindings.py` and commit the result"


def test_generation_is_deterministic():
    assert G.generate(header_text()) == G.generate(header_text())
    for rel, text in G.generate(header_text()).items():
        assert G.BANNER in text.splitlines()[0], f"{rel} lacks the banner on its first line"


def test_check_fails_on_a_stale_file(tmp_path):
    """Files generated from a modified header copy are stale for the real header,
    and the check names exactly the files that differ."""
    modified = tmp_path / "fusekit.h"
    modified.write_text(
        header_text().replace(
            "#ifdef __cplusplus\n}", "fk_status fk_brand_new(const fk_buffer *a);\n\n#ifdef __cplusplus\n}"
        )
    )
    assert modified.read_text() != header_text()
    out = tmp_path / "tree"
    r = run_gen("--header", str(modified), "--root", str(out))
    assert r.returncode == 0, r.stderr
    for rel in G.OUTPUTS:
        assert "fk_brand_new" in (out / rel).read_text(), rel

    r = run_gen("--check", "--root", str(out))  # the real header against the modified files
    assert r.returncode == 1
    for rel in G.OUTPUTS:
        assert rel in r.stderr, r.stderr

    r = run_gen("--root", str(out))  # regenerate from the real header: up to date again
    assert r.returncode == 0 and run_gen("--check", "--root", str(out)).returncode == 0

    # one hand edit makes exactly that file stale; a missing file is stale too
    jl = out / G.JULIA_ABI
    jl.write_text(jl.read_text().replace("const FK_OK = 0", "const FK_OK = 1"))
    (out / G.CPP_ABI).unlink()
    r = run_gen("--check", "--root", str(out))
    assert r.returncode == 1
    assert G.JULIA_ABI in r.stderr and G.CPP_ABI in r.stderr and G.PY_ABI not in r.stderr


def test_a_header_the_parser_cannot_read_is_an_error(tmp_path):
    bad = tmp_path / "fusekit.h"
    bad.write_text(header_text() + "\ntypedef void (*fk_callback)(int32_t x);\n")
    r = run_gen("--check", "--header", str(bad), "--root", str(tmp_path))
    assert r.returncode == 2 and "unsupported typedef" in r.stderr


# ----------------------------------------------------------------------------- the parser

CBINDGEN_STYLES = """
/** Doc of a constant. */
#define FK_A 3
#define FK_B (FK_A << 2)
#define FK_C 0x10u
#define FK_D -2
#define FK_E 2.5e-3
#define FK_F "text"
#define NOT_OURS 7

/** An opaque handle. */
typedef struct fk_thing fk_thing;

typedef enum fk_mode {
  /** first */
  FK_MODE_X = 1,
  FK_MODE_Y,
  FK_MODE_Z = FK_B,
} fk_mode;

enum fk_other {
  FK_OTHER_P,
  FK_OTHER_Q,
};
typedef int32_t fk_other_t;

/** A struct
 * over two lines. */
typedef struct fk_pair {
  /** the first */
  int64_t first;
  const char *name;
  uint8_t bytes[FK_A];
} fk_pair;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/** Does things; `x` is /* not a nested comment. */
fk_status_t fk_do(const fk_thing *const *things,
                  fk_pair pair,
                  fk_mode mode,
                  void *out); // trailing comment

uint64_t fk_count(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus
"""


def test_parser_reads_cbindgen_constructs():
    h = G.parse_header("typedef int32_t fk_status_t;\n" + CBINDGEN_STYLES)
    c = {n: k.value for n, k in h.constants.items()}
    assert c == {
        "FK_A": 3, "FK_B": 12, "FK_C": 16, "FK_D": -2, "FK_E": 2.5e-3, "FK_F": "text",
        "FK_MODE_X": 1, "FK_MODE_Y": 2, "FK_MODE_Z": 12, "FK_OTHER_P": 0, "FK_OTHER_Q": 1,
    }
    assert h.constants["FK_A"].doc == "Doc of a constant."
    assert h.enums == ["fk_mode", "fk_other"] and h.opaque == ["fk_thing"]
    assert h.resolve(G.CType("fk_mode")) == G.CType("int")
    pair = h.struct_defs["fk_pair"]
    assert pair.doc == "A struct over two lines."
    assert [(str(f.type), f.name, f.array) for f in pair.fields] == [
        ("int64_t", "first", None), ("char *", "name", None), ("uint8_t", "bytes", 3),
    ]
    assert list(h.functions) == ["fk_do", "fk_count"]
    do = h.functions["fk_do"]
    assert do.params == [G.CType("fk_thing", 2), G.CType("fk_pair"), G.CType("fk_mode"), G.CType("void", 1)]
    assert do.param_names == ["things", "pair", "mode", "out"]
    assert do.doc.startswith("Does things;")
    assert h.functions["fk_count"].params == [] and h.functions["fk_count"].ret == G.CType("uint64_t")


def test_parser_refuses_what_it_does_not_know():
    with pytest.raises(G.HeaderError, match="unknown type"):
        G.parse_header("fk_status fk_f(fk_mystery *x);\n")
    with pytest.raises(G.HeaderError, match="unrecognised declaration"):
        G.parse_header("int32_t some_global;\n")


def test_generated_python_for_other_constructs_loads():
    """_abi.py generated from the synthetic header is valid Python with the
    expected ctypes layout."""
    h = G.parse_header("typedef int32_t fk_status_t;\n" + CBINDGEN_STYLES)
    ns: dict = {}
    exec(compile(G.render_python(h, torch=False), "<_abi>", "exec"), ns)  # noqa: S102
    assert ns["MODE_Z"] == 12 and ns["F"] == "text" and ns["E"] == 2.5e-3
    pair = ns["fk_pair"]
    assert [(n, t) for n, t in pair._fields_] == [
        ("first", ctypes.c_int64), ("name", ctypes.c_char_p), ("bytes", ctypes.c_uint8 * 3),
    ]
    restype, argtypes = ns["PROTOTYPES"]["fk_do"]
    assert restype is ctypes.c_int32
    assert argtypes[0] is ctypes.POINTER(ctypes.POINTER(ns["fk_thing"]))
    assert argtypes[1] is pair and argtypes[2] is ctypes.c_int and argtypes[3] is ctypes.c_void_p
    assert ns["PROTOTYPES"]["fk_count"] == (ctypes.c_uint64, [])


# ----------------------------------------------------------------------------- Python


def test_abi_module_matches_the_header():
    import fusekit._abi as A

    h = G.read_header(HEADER)
    for name, c in h.constants.items():
        assert getattr(A, name[len("FK_"):]) == c.value, name
    assert A.ABI_VERSION == h.abi_version()
    assert list(A.PROTOTYPES) == list(h.functions)
    assert A.STATUS_NAMES[A.ERROR_SHAPE_MISMATCH] == "FK_ERROR_SHAPE_MISMATCH"
    assert ctypes.sizeof(A.fk_scalar) == 16
    assert ctypes.sizeof(A.fk_matpow_report) == 32
    assert ctypes.sizeof(A.fk_memory_stats) == 8 * 12


def test_lib_reexports_every_generated_name():
    """fusekit._lib keeps every public name it had (the package imports them from
    there), now the generated objects themselves."""
    import fusekit._abi as A
    import fusekit._lib as L

    for name in A.__all__:
        assert getattr(L, name) is getattr(A, name), name
    assert L._STATUS_NAMES is A.STATUS_NAMES
    for handle, short in [("fk_context", "ctx_p"), ("fk_stream", "stream_p"), ("fk_buffer", "buffer_p"),
                          ("fk_event", "event_p"), ("fk_comm", "comm_p")]:
        assert getattr(L, short) is ctypes.POINTER(getattr(A, handle))
    for name in ["ABI_VERSION", "MAX_DIMS", "COMM_ID_BYTES", "GEO_ALLOW_TF32", "GEO_FORCE_GENERIC",
                 "GEO_ALLOW_TF32X3", "GEMM_ALLOW_TF32", "MATPOW_NEWTON", "DEVICE_CUDA_HOST", "REDUCE_MIN",
                 "DTYPE_C128", "OK", "ERROR_NOT_CONVERGED", "fk_scalar", "fk_matpow_report",
                 "fk_memory_stats", "fk_status", "fk_dtype", "fk_device_kind"]:
        assert hasattr(L, name), name
    # errcheck goes on exactly the fk_status-returning functions
    assert L.PROTOTYPES["fk_add"][0] is L.fk_status
    assert L.PROTOTYPES["fk_abi_version"][0] is not L.fk_status


def test_torch_op_codes_are_the_generator_table():
    import fusekit._abi as A

    for family, names in G.TORCH_OPS.items():
        assert getattr(A, f"TORCH_{family}_OPS") == {n: i for i, n in enumerate(names)}
    # the codes the torch ops were built with (before they moved into the generator)
    assert A.TORCH_BINARY_OPS == {"fk_add": 0, "fk_sub": 1, "fk_mul": 2, "fk_div": 3}
    assert A.TORCH_SCALAR_OPS == {"fk_scalar_add": 0, "fk_scalar_mul": 1}
    assert list(A.TORCH_UNARY_OPS.values()) == list(range(11)) and A.TORCH_UNARY_OPS["fk_copy"] == 10


def test_torch_op_table_is_checked_against_the_header():
    h = G.read_header(HEADER)
    saved = G.TORCH_OPS["UNARY"]
    try:
        G.TORCH_OPS["UNARY"] = saved + ["fk_gemm"]
        with pytest.raises(G.HeaderError, match="fk_gemm has parameters"):
            G.torch_op_codes(h)
        G.TORCH_OPS["UNARY"] = saved + ["fk_gone"]
        with pytest.raises(G.HeaderError, match="not in the header"):
            G.torch_op_codes(h)
    finally:
        G.TORCH_OPS["UNARY"] = saved


# ----------------------------------------------------------------------------- no hand copies left

PKG = ROOT / "bindings" / "python" / "fusekit"
GENERATED = {ROOT / rel for rel in G.OUTPUTS}


def _binding_sources():
    for pattern in ("bindings/**/*.py", "bindings/**/*.jl", "bindings/**/*.cpp", "bindings/**/*.hpp",
                    "bindings/**/*.h"):
        for p in sorted(ROOT.glob(pattern)):
            if p not in GENERATED and "build" not in p.parts and ".venv" not in str(p):
                yield p


def test_no_hand_copy_of_the_abi_version():
    """Outside the header and the generated files, the bindings name FK_ABI_VERSION
    (or ABI_VERSION), never its value."""
    version = str(G.read_header(HEADER).abi_version())
    hits = []
    for p in _binding_sources():
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if re.search(rf"(?<![\w.]){version}(?![\w.])", line):
                hits.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert hits == [], "hand copies of the ABI version:\n" + "\n".join(hits)


def _py_op_tables(path: pathlib.Path):
    """Dict literals in a Python file whose keys are all torch op names."""
    op_names = {n for names in G.TORCH_OPS.values() for n in names}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict) and node.keys:
            keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
            if all(isinstance(k, str) and k in op_names for k in keys):
                try:
                    yield node.lineno, ast.literal_eval(node)
                except ValueError:
                    continue


def test_hand_written_torch_op_codes_agree_with_the_generator():
    """Any code table the torch layers still spell out (Python dicts of op names,
    C++ `case N: ... return a.fk_x;` switches) must agree with TORCH_OPS, until it
    switches to the generated ones."""
    codes = {n: i for names in G.TORCH_OPS.values() for i, n in enumerate(names)}
    wrong = []
    for p in _binding_sources():
        rel = p.relative_to(ROOT)
        if p.suffix == ".py":
            for line, table in _py_op_tables(p):
                for name, code in table.items():
                    if code != codes[name]:
                        wrong.append(f"{rel}:{line}: {name} = {code}, generator has {codes[name]}")
        elif p.suffix in (".cpp", ".h", ".hpp"):
            for m in re.finditer(r"case\s+(\d+)\s*:[^;]*;\s*return\s+\w+\.(fk_\w+)\s*;", p.read_text()):
                name, code = m.group(2), int(m.group(1))
                if name in codes and code != codes[name]:
                    wrong.append(f"{rel}: case {code} returns {name}, generator has {codes[name]}")
    assert wrong == [], "\n".join(wrong)


def test_scan_finds_a_disagreeing_table(tmp_path):
    p = tmp_path / "copy.py"
    p.write_text('UNARY = {"fk_neg": 0, "fk_abs": 2}\n')
    assert list(_py_op_tables(p)) == [(1, {"fk_neg": 0, "fk_abs": 2})]


# ----------------------------------------------------------------------------- the C++ header


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler")
def test_fk_abi_h_compiles_and_is_a_drop_in(tmp_path):
    """fk_abi.h compiles alone (it includes fusekit.h), its entry-point list works
    as the torch extension's dlsym table, every torch op has its family's type,
    and the codes are the generator's; the static_assert rejects another header."""
    cxx = shutil.which("g++") or shutil.which("c++")
    h = G.read_header(HEADER)
    checks = []
    for family, table in G.torch_op_codes(h).items():
        for name, code in table.items():
            checks.append(f"static_assert(code_of_{family}(\"{name}\") == {code}, \"{name}\");")
    src = tmp_path / "t.cpp"
    src.write_text(
        '#include "fk_abi.h"\n#include "fk_abi.h"  /* include guard */\n'
        "#include <cstring>\n#include <type_traits>\n"
        "struct Api {\n#define FIELD(name) decltype(&::name) name = nullptr;\n"
        "FK_ABI_ENTRY_POINTS(FIELD)\n#undef FIELD\n};\n"
        "#define COUNT(name) +1\nconstexpr int n_entry_points = 0 FK_ABI_ENTRY_POINTS(COUNT);\n"
        f"static_assert(n_entry_points == {len(h.functions)}, \"every entry point\");\n"
        "using BinaryFn = fk_status (*)(const fk_buffer*, const fk_buffer*, fk_buffer*, const fk_stream*);\n"
        "using UnaryFn = fk_status (*)(const fk_buffer*, fk_buffer*, const fk_stream*);\n"
        "using ScalarFn = fk_status (*)(const fk_buffer*, fk_scalar, fk_buffer*, const fk_stream*);\n"
        "#define B(code, name) static_assert(std::is_same<decltype(&::name), BinaryFn>::value, #name);\n"
        "#define U(code, name) static_assert(std::is_same<decltype(&::name), UnaryFn>::value, #name);\n"
        "#define S(code, name) static_assert(std::is_same<decltype(&::name), ScalarFn>::value, #name);\n"
        "FK_TORCH_BINARY_OPS(B) FK_TORCH_UNARY_OPS(U) FK_TORCH_SCALAR_OPS(S)\n"
        "constexpr bool eq(const char* a, const char* b) { return *a == *b && (*a == 0 || eq(a + 1, b + 1)); }\n"
        "#define FIND(code, name) eq(s, #name) ? code :\n"
        "constexpr int code_of_BINARY(const char* s) { return FK_TORCH_BINARY_OPS(FIND) -1; }\n"
        "constexpr int code_of_UNARY(const char* s) { return FK_TORCH_UNARY_OPS(FIND) -1; }\n"
        "constexpr int code_of_SCALAR(const char* s) { return FK_TORCH_SCALAR_OPS(FIND) -1; }\n"
        + "\n".join(checks)
        + "\nint main() { Api a; return a.fk_add == nullptr ? 0 : 1; }\n"
    )
    csrc = ROOT / "bindings" / "python" / "fusekit" / "csrc"
    cmd = [cxx, "-std=c++17", "-Wall", "-Werror", "-fsyntax-only", f"-I{csrc}", f"-I{ROOT / 'include'}", str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr

    # against another header's ABI version the include fails
    other = tmp_path / "other"
    other.mkdir()
    hv = str(h.abi_version())
    (other / "fusekit.h").write_text(header_text().replace(f"#define FK_ABI_VERSION {hv}", "#define FK_ABI_VERSION 1"))
    shutil.copy(csrc / "fk_abi.h", other / "fk_abi.h")
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", f"-I{other}", "-x", "c++", "-"],
                       input='#include "fk_abi.h"\n', capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "generated from another fusekit.h" in r.stderr
