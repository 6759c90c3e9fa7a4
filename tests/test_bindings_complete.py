"""The Python bindings cover the whole C ABI.

Parses include/fusekit.h (with scripts/gen_bindings.py's parser), lists every fk_
function, and fails when
bindings/python lacks a ctypes prototype for one of them (fusekit._lib.PROTOTYPES),
or when an op entry point (everything but the fk_context_*/fk_stream_*/fk_buffer_*
handle functions and the version/status/error/dtype/device helpers) lacks a public
Python wrapper (a callable in fusekit.__all__, found through fusekit.ENTRY_POINTS
or by the C name without its fk_ prefix). Needs neither the built library nor numpy's ops to run.
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEADER = REPO / "include" / "fusekit.h"
sys.path.insert(0, str(REPO / "bindings" / "python"))
sys.path.insert(0, str(REPO / "scripts"))

from gen_bindings import CFunc, read_header  # noqa: E402  (the one header parser)

# Functions that are not ops: handle management and library-level helpers.
NON_OP_PREFIXES = ("fk_context_", "fk_stream_", "fk_buffer_")
NON_OP_NAMES = {
    "fk_abi_version",
    "fk_version_string",
    "fk_status_string",
    "fk_last_error_message",
    "fk_last_error_message_copy",
    "fk_dtype_size",
    "fk_device_count",
}


def header_functions() -> dict[str, CFunc]:
    """fk_ function name -> its declaration, from the header."""
    return read_header(HEADER).functions


def _ctypes_arity(name):
    import fusekit._lib as L

    return len(L.PROTOTYPES[name][1])


def _header_arity(decl: CFunc) -> int:
    return len(decl.params)


def test_header_parses_to_many_functions():
    fns = header_functions()
    assert len(fns) >= 40, sorted(fns)
    assert "fk_add" in fns and "fk_context_create" in fns


def test_every_function_has_a_ctypes_prototype():
    import fusekit._lib as L

    missing = sorted(set(header_functions()) - set(L.PROTOTYPES))
    assert not missing, (
        f"fusekit._lib.PROTOTYPES (from the generated _abi.py) lacks {missing}: "
        "run python scripts/gen_bindings.py"
    )
    stale = sorted(set(L.PROTOTYPES) - set(header_functions()))
    assert not stale, f"PROTOTYPES declares functions the header does not have: {stale}"


def test_prototype_arity_matches_header():
    wrong = []
    for name, decl in header_functions().items():
        if _ctypes_arity(name) != _header_arity(decl):
            wrong.append(f"{name}: header has {_header_arity(decl)} parameters, ctypes {_ctypes_arity(name)}")
    assert not wrong, "\n".join(wrong)


def op_entry_points() -> list[str]:
    return sorted(
        n for n in header_functions() if not n.startswith(NON_OP_PREFIXES) and n not in NON_OP_NAMES
    )


def test_every_op_has_a_public_python_wrapper():
    import fusekit

    public = {n: getattr(fusekit, n, None) for n in fusekit.__all__}
    exported = {id(f) for f in public.values() if callable(f)}
    missing = []
    for name in op_entry_points():
        # registered in an op family's ENTRY_POINTS table, or named like the C
        # function without its prefix (fk_christoffel_forward -> fusekit.christoffel_forward)
        fn = fusekit.ENTRY_POINTS.get(name) or public.get(name[len("fk_") :])
        if fn is None or not callable(fn) or id(fn) not in exported:
            missing.append(f"{name} (expected e.g. fusekit.{name[len('fk_'):]})")
    assert not missing, f"op entry points without a public Python wrapper: {missing}"
