"""The C++ wrapper (bindings/cpp/fusekit.hpp) covers the whole C ABI.

Every fk_ function of include/fusekit.h (read with scripts/gen_bindings.py's
parser) must be called by fusekit.hpp, or be listed in EXCLUDED below with the
reason. Counted as calling `fk_x`, in the header's code (comments and string
literals removed):

- a call `fk_x(`;
- a call through `detail::query<T>(fk_x, args...)` (the checked call that returns its
  out-parameter);
- `fk_x` as the deleter of an RAII handle class (`detail::Handle<fk_buffer, fk_buffer_destroy>`,
  `detail::Owner<Buffer, fk_buffer, fk_buffer_destroy>`);
- an invocation `MACRO(x)` of a function-like macro whose body calls `fk_##PARAM`
  (`FUSEKIT_BINARY_OP(add)` calls fk_add).

Standard library only; needs neither a compiler nor the library.
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
HPP = ROOT / "bindings" / "cpp" / "fusekit.hpp"
sys.path.insert(0, str(ROOT / "scripts"))

from gen_bindings import read_header  # noqa: E402  (the one header parser)

#: Entry points fusekit.hpp deliberately does not call, each with the reason.
EXCLUDED = {
    # The same as fk_shampoo_stats_ex with flags = 0 (src/abi/optim.rs); the C++
    # shampoo_stats(grad, alpha, beta, l, r, flags = 0) calls fk_shampoo_stats_ex.
    "fk_shampoo_stats": "fusekit::shampoo_stats calls fk_shampoo_stats_ex (flags = 0 is this function)",
}


def strip_cpp_comments_and_strings(src: str) -> str:
    """Removes // and /* */ comments and string/char literals (keeps the quotes)."""
    return re.sub(
        r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'',
        lambda m: '""' if m.group(0).startswith('"') else ("''" if m.group(0).startswith("'") else " "),
        src,
        flags=re.S,
    )


def called_entry_points(hpp_text: str) -> set[str]:
    """The fk_ functions the wrapper's code calls (see the module docstring)."""
    code = strip_cpp_comments_and_strings(hpp_text)
    called = set(re.findall(r"\b(fk_\w+)\s*\(", code))
    called |= set(re.findall(r"\bquery\s*<[^<>();]*>\s*\(\s*(fk_\w+)\s*[,)]", code))
    called |= set(re.findall(r"\b(?:Handle|Owner)\s*<[^<>;]*,\s*(fk_\w+)\s*>", code))
    # function-like macros that paste fk_##PARAM into a call, and their invocations
    logical = code.replace("\\\n", " ")
    for m in re.finditer(r"^\s*#\s*define\s+(\w+)\(\s*(\w+)\s*\)(.*)$", logical, flags=re.M):
        macro, param, body = m.groups()
        if re.search(rf"\bfk_##\s*{param}\s*\(", body):
            # invocations outside #define lines
            for inv in re.finditer(rf"^(?!\s*#).*?\b{macro}\(\s*(\w+)\s*\)", logical, flags=re.M):
                called.add("fk_" + inv.group(1))
    return called


def missing_entry_points(header_functions, hpp_text: str) -> list[str]:
    called = called_entry_points(hpp_text)
    return sorted(n for n in header_functions if n not in called and n not in EXCLUDED)


def test_every_entry_point_is_wrapped_or_excluded():
    fns = read_header(ROOT / "include" / "fusekit.h").functions
    missing = missing_entry_points(fns, HPP.read_text())
    assert missing == [], (
        "bindings/cpp/fusekit.hpp neither calls nor excludes (EXCLUDED in "
        f"tests/test_cpp_wrapper_complete.py) these entry points: {missing}"
    )


def test_exclusions_are_real_and_needed():
    """Every exclusion names a header function the wrapper really does not call."""
    fns = read_header(ROOT / "include" / "fusekit.h").functions
    called = called_entry_points(HPP.read_text())
    for name, reason in EXCLUDED.items():
        assert name in fns, f"EXCLUDED names {name}, which is not in the header"
        assert name not in called, f"{name} is called by fusekit.hpp: drop it from EXCLUDED"
        assert reason.strip()


def test_the_scan_sees_each_way_of_calling():
    hpp = HPP.read_text()
    called = called_entry_points(hpp)
    assert {"fk_gemm", "fk_last_error_message"} <= called  # plain calls
    assert "fk_comm_destroy" in called  # an RAII deleter
    assert {"fk_add", "fk_sigmoid", "fk_copy"} <= called  # macro-generated wrappers
    assert {"fk_buffer_ndim", "fk_context_create"} <= called  # through detail::query
    # and it notices a removal: drop the RAII deleter, a macro invocation, a call, a query
    cut = hpp.replace("detail::Owner<Event, fk_event, fk_event_destroy>", "detail::Owner<Event, fk_event, nullptr>")
    cut = re.sub(r"^FUSEKIT_UNARY_OP\(sigmoid\)$", "", cut, flags=re.M)
    cut = cut.replace("fk_kron(", "other_kron(")
    cut = cut.replace("query<std::int32_t>(fk_buffer_ndim,", "query<std::int32_t>(other_ndim,")
    assert cut != hpp
    fns = read_header(ROOT / "include" / "fusekit.h").functions
    assert missing_entry_points(fns, cut) == ["fk_buffer_ndim", "fk_event_destroy", "fk_kron", "fk_sigmoid"]
    # a name only in a comment or a string is no call
    assert called_entry_points('// fk_add(a, b)\nconst char* s = "fk_sub(x)";\n') == set()
