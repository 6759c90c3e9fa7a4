"""Static check of the Julia bindings (bindings/julia) against include/fusekit.h.

The module is `Fusekit.jl` (hand-written: the idiomatic layer) plus `abi_gen.jl`
(generated from the header by scripts/gen_bindings.py: the FK_* constants, the C
structs and one `ccall` wrapper per entry point), which `Fusekit.jl` includes.
There is no Julia on the project's machines, so the module is checked, not run:
this reads the C header with the generator's parser (`gen_bindings.parse_header`:
functions with their C return and parameter types, typedefs, by-value structs,
#define constants), reads every
`ccall((:fk_xxx, libfusekit), RetType, (ArgTypes...,), args...)` of the module
(Fusekit.jl with abi_gen.jl put in place of its `include`), and every row
`@fk_raw fk_xxx(arg::ArgType, ...)::RetType` of the generated raw layer (the
module's macro `fk_raw` makes each row the function
`fk_xxx(arg, ...) = ccall((:fk_xxx, libfusekit), RetType, (ArgType, ...), arg, ...)`),
and fails when

- a ccall names a symbol that is not in the header;
- a ccall has the wrong number of argument types (or of argument values);
- a return or argument type does not correspond to the C type (int32_t -> Int32 or
  Cint, uint32_t -> UInt32, int64_t -> Int64, size_t -> Csize_t, double -> Cdouble,
  pointers -> Ptr{...} / Ptr{Cvoid} / Ref{...}, `const char *` -> Cstring also,
  fk_scalar by value -> FkScalar, a Julia struct with two Float64 fields, ...);
- a header function has no ccall in the module;
- a header constant (FK_*) is missing from the module or has another value;
- a by-value C struct has no matching immutable Julia struct;
- Fusekit.jl does not include abi_gen.jl, or copies by hand what it generates.

The correspondence rules here are written independently of the generator's type
mapping, so they check the generated file too. Standard library only:
`python -m pytest tests/test_julia_module.py`.
"""

from __future__ import annotations

import pathlib
import re
import sys
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADER = ROOT / "include" / "fusekit.h"
JULIA = ROOT / "bindings" / "julia" / "Fusekit.jl"
JULIA_ABI = ROOT / "bindings" / "julia" / "abi_gen.jl"
INCLUDE_LINE = 'include("abi_gen.jl")'

sys.path.insert(0, str(ROOT / "scripts"))
import gen_bindings  # noqa: E402  (the one header parser)
from gen_bindings import CType, Header, parse_header  # noqa: E402


def module_text(fusekit_jl: str | None = None, abi_gen_jl: str | None = None) -> str:
    """The whole module: Fusekit.jl with abi_gen.jl in place of its include line."""
    fusekit_jl = JULIA.read_text() if fusekit_jl is None else fusekit_jl
    abi_gen_jl = JULIA_ABI.read_text() if abi_gen_jl is None else abi_gen_jl
    assert fusekit_jl.count(INCLUDE_LINE) == 1, f"Fusekit.jl must contain {INCLUDE_LINE} once"
    return fusekit_jl.replace(INCLUDE_LINE, abi_gen_jl)


# ----------------------------------------------------------------------------- Julia side


@dataclass(frozen=True)
class JType:
    name: str
    params: tuple["JType", ...] = ()

    def __str__(self) -> str:
        return self.name + ("{" + ", ".join(map(str, self.params)) + "}" if self.params else "")


def parse_jtype(text: str) -> JType:
    """Parses `Ptr{Ptr{fk_context}}`, `Base.Cint`, `Cvoid` ... (raises ValueError)."""
    pos = 0
    s = text.strip()

    def ident() -> str:
        nonlocal pos
        m = re.compile(r"\s*([A-Za-z_][\w.]*)\s*").match(s, pos)
        if not m:
            raise ValueError(f"expected a type name at {s[pos:]!r} in {text!r}")
        pos = m.end()
        return m.group(1).split(".")[-1]  # Base.Cint -> Cint

    def typ() -> JType:
        nonlocal pos
        name = ident()
        params: list[JType] = []
        if pos < len(s) and s[pos] == "{":
            pos += 1
            while True:
                params.append(typ())
                while pos < len(s) and s[pos] == " ":
                    pos += 1
                if pos < len(s) and s[pos] == ",":
                    pos += 1
                    continue
                if pos < len(s) and s[pos] == "}":
                    pos += 1
                    break
                raise ValueError(f"unbalanced braces in type {text!r}")
            while pos < len(s) and s[pos] == " ":
                pos += 1
        return JType(name, tuple(params))

    t = typ()
    if pos != len(s):
        raise ValueError(f"unexpected {s[pos:]!r} in type {text!r}")
    return t


def strip_julia_comments_and_strings(src: str) -> str:
    """Blanks out comments (`#`, nested `#= =#`) and string/char literals, keeping
    newlines so that offsets map to the same line numbers."""
    out = []
    i, n = 0, len(src)

    def blank(a: int, b: int) -> None:
        out.append("".join(c if c == "\n" else " " for c in src[a:b]))

    while i < n:
        c = src[i]
        if src.startswith("#=", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("#=", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("=#", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c == "#":
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif src.startswith('"""', i):
            j = src.find('"""', i + 3)
            j = n if j < 0 else j + 3
            out.append('"')
            blank(i + 1, j - 1)
            out.append('"')
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append('"')
            blank(i + 1, j - 1)
            out.append('"')
            i = j
        elif c == "'" and not (i > 0 and (src[i - 1].isalnum() or src[i - 1] in "_)]}'.")):
            j = i + 1
            while j < n and src[j] != "'" and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            blank(i, j)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def split_top_level(s: str) -> list[str]:
    """Splits on commas outside (), {}, []."""
    parts, depth, cur = [], 0, []
    for c in s:
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


@dataclass
class CCall:
    line: int
    symbol: str | None  # None when the first argument is not (:sym, lib)
    library: str | None
    ret: str
    argtypes: list[str] | None  # None when the third argument is not a tuple literal
    nargs: int
    text: str


def find_ccalls(src: str) -> list[CCall]:
    code = strip_julia_comments_and_strings(src)
    calls = []
    for m in re.finditer(r"\bccall\s*\(", code):
        start = m.end()
        depth, j = 1, start
        while j < len(code) and depth:
            if code[j] in "({[":
                depth += 1
            elif code[j] in ")}]":
                depth -= 1
            j += 1
        inner = code[start : j - 1]
        line = code.count("\n", 0, m.start()) + 1
        parts = split_top_level(inner)
        sym = lib = None
        sm = re.fullmatch(r"\(\s*:(\w+)\s*,\s*(.+?)\s*\)", parts[0], flags=re.S) if parts else None
        if sm:
            sym, lib = sm.group(1), sm.group(2)
        else:
            qm = re.fullmatch(r":(\w+)", parts[0]) if parts else None
            sym = qm.group(1) if qm else None
        ret = parts[1] if len(parts) > 1 else ""
        argtypes = None
        if len(parts) > 2:
            t = parts[2].strip()
            if t.startswith("(") and t.endswith(")"):
                items = split_top_level(t[1:-1])
                if items and items[-1] == "":
                    items = items[:-1]  # trailing comma
                if len(items) == 1 and not t[1:-1].rstrip().endswith(","):
                    argtypes = None  # `(T)` is not a tuple in Julia
                else:
                    argtypes = [x for x in items if x != ""] if items != [""] else []
        values = [p for p in parts[3:] if p != ""]
        calls.append(CCall(line, sym, lib, ret, argtypes, len(values), " ".join(inner.split())))
    return calls


#: A row of the raw layer: `@fk_raw name(arg::T, ...)::R` (the parameters may span lines).
RAW_ROW = re.compile(r"^@fk_raw\s+(\w+)\(([^()]*(?:\([^()]*\)[^()]*)*)\)::([\w.{}, ]+?)\s*$", flags=re.M)


def raw_rows(src: str) -> list[CCall]:
    """The `@fk_raw` rows of the module as the ccalls they define. Their library is
    `libfusekit` only where the module's `macro fk_raw` builds its ccall with
    `(QuoteNode(name), :libfusekit)` (else None: reported like a ccall of another
    library)."""
    code = strip_julia_comments_and_strings(src)
    macro = re.search(r"^macro fk_raw\(sig\)\n(.*?)^end\b", code, flags=re.M | re.S)
    lib = "libfusekit" if macro and "Expr(:tuple, QuoteNode(name), :libfusekit)" in macro.group(1) else None
    rows = []
    for m in RAW_ROW.finditer(code):
        params = [p for p in split_top_level(" ".join(m.group(2).split())) if p != ""]
        types = [p.split("::", 1)[1].strip() if "::" in p else "" for p in params]
        line = code.count("\n", 0, m.start()) + 1
        rows.append(CCall(line, m.group(1), lib, m.group(3).strip(), types, len(params), " ".join(m.group(0).split())))
    return rows


def module_ccalls(src: str) -> list[CCall]:
    """Every ccall of the module: the literal ones and those the raw layer's rows define."""
    return find_ccalls(src) + raw_rows(src)


def julia_constants(src: str) -> dict[str, str]:
    """FK_* constant -> the source text of its value (string literals kept,
    comments dropped)."""
    code = strip_julia_comments_and_strings(src)  # same length as src, offset for offset
    out = {}
    for m in re.finditer(r"^\s*const\s+(FK_\w+)\s*=\s*([^\n]+)$", code, flags=re.M):
        value = code[m.start(2) : m.end(2)].rstrip()
        out[m.group(1)] = src[m.start(2) : m.start(2) + len(value)]
    return out


def julia_literal(text: str) -> int | float | str | None:
    """The value of a Julia integer, float or plain string literal (None otherwise)."""
    t = text.strip()
    if re.fullmatch(r'"[^"\\$]*"', t):
        return t[1:-1]
    try:
        return int(t.replace("_", ""), 0)
    except ValueError:
        pass
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", t):
        return float(t)
    return None


def julia_structs(src: str) -> dict[str, tuple[bool, list[tuple[str, str]]]]:
    """name -> (mutable, [(field, type)])."""
    code = strip_julia_comments_and_strings(src)
    out = {}
    for m in re.finditer(r"^\s*(mutable\s+)?struct\s+(\w+)(?:\s*<:\s*[\w.{}]+)?\s*\n(.*?)^\s*end\b", code, flags=re.M | re.S):
        fields = re.findall(r"^\s*(\w+)\s*::\s*([\w.{}, ]+?)\s*$", m.group(3), flags=re.M)
        out[m.group(2)] = (bool(m.group(1)), fields)
    return out


# ----------------------------------------------------------------------------- correspondence

SCALARS = {
    "int8_t": {"Int8"},
    "uint8_t": {"UInt8"},
    "int16_t": {"Int16", "Cshort"},
    "uint16_t": {"UInt16", "Cushort"},
    "int32_t": {"Int32", "Cint"},
    "uint32_t": {"UInt32", "Cuint"},
    "int64_t": {"Int64", "Clonglong"},
    "uint64_t": {"UInt64", "Culonglong"},
    "int": {"Cint", "Int32"},
    "unsigned int": {"Cuint", "UInt32"},
    "size_t": {"Csize_t"},
    "double": {"Cdouble", "Float64"},
    "float": {"Cfloat", "Float32"},
    "char": {"Cchar", "UInt8", "Int8"},
    "bool": {"Bool"},
    "void": {"Cvoid", "Nothing"},
}


def camel(name: str) -> str:
    """fk_scalar -> FkScalar."""
    return "".join(p[:1].upper() + p[1:] for p in name.split("_") if p)


def expected(h: Header, t: CType, where: str) -> str:
    """Human-readable list of Julia spellings accepted for C type t."""
    r = h.resolve(t)
    if r.ptr == 0:
        if r.base in h.structs:
            return camel(r.base)
        return "/".join(sorted(SCALARS.get(r.base, {"?"})))
    inner = expected(h, r.pointee(), "pointee")
    opts = [f"Ptr{{{inner}}}", "Ptr{Cvoid}"]
    if where == "arg":
        opts.append(f"Ref{{{inner}}}")
    if r.base == "char" and r.ptr == 1:
        opts.append("Cstring")
    return " or ".join(opts)


def corresponds(h: Header, t: CType, j: JType, where: str) -> bool:
    """Does Julia type j pass/return C type t? where: 'arg', 'ret' or 'pointee'."""
    r = h.resolve(t)
    if r.ptr == 0:
        if j.params:
            return False
        if r.base == "void":
            return where in ("ret", "pointee") and j.name in SCALARS["void"]
        if r.base in h.opaque:
            # only reachable as a pointee: an opaque struct is never passed by value
            return where == "pointee" and j.name in {"Cvoid", r.base, camel(r.base)}
        if r.base in h.structs:
            return j.name in {camel(r.base), r.base}
        return j.name in SCALARS.get(r.base, set())
    # pointers
    if j.name == "Cstring" and not j.params:
        return r.base == "char" and r.ptr == 1 and where in ("arg", "ret")
    if j.name == "Ptr" and len(j.params) == 1:
        (p,) = j.params
        if p.name in ("Cvoid", "Nothing") and not p.params:
            return True  # void* is compatible with any data pointer
        return corresponds(h, r.pointee(), p, "pointee")
    if j.name == "Ref" and len(j.params) == 1 and where == "arg":
        return corresponds(h, r.pointee(), j.params[0], "pointee")
    return False


def check_module(header_text: str, julia_text: str, filename: str = "Fusekit.jl") -> list[str]:
    """All problems found; an empty list means the module matches the header."""
    h = parse_header(header_text)
    problems: list[str] = []
    covered: set[str] = set()

    for c in module_ccalls(julia_text):
        where = f"{filename}:{c.line}"
        if c.symbol is None:
            problems.append(f"{where}: cannot read the symbol of ccall({c.text[:60]}...)")
            continue
        if not c.symbol.startswith("fk_"):
            continue  # a call into another library
        if c.library != "libfusekit":
            problems.append(f"{where}: ccall of {c.symbol} must name the library as (:{c.symbol}, libfusekit)")
        f = h.functions.get(c.symbol)
        if f is None:
            problems.append(f"{where}: ccall names {c.symbol}, which is not a function of fusekit.h")
            continue
        covered.add(c.symbol)
        try:
            rt = parse_jtype(c.ret)
            if not corresponds(h, f.ret, rt, "ret"):
                problems.append(
                    f"{where}: {c.symbol} returns C '{f.ret}' but the ccall says {rt} (expected {expected(h, f.ret, 'ret')})"
                )
        except ValueError as e:
            problems.append(f"{where}: {c.symbol}: bad return type: {e}")
        if c.argtypes is None:
            problems.append(f"{where}: {c.symbol}: the argument types must be a tuple literal like (T,) or (A, B)")
            continue
        if len(c.argtypes) != len(f.params):
            problems.append(
                f"{where}: {c.symbol} has {len(c.argtypes)} argument types but the C function has {len(f.params)} parameters"
            )
        else:
            for i, (jt_text, ct) in enumerate(zip(c.argtypes, f.params)):
                try:
                    jt = parse_jtype(jt_text)
                except ValueError as e:
                    problems.append(f"{where}: {c.symbol} argument {i + 1}: {e}")
                    continue
                if not corresponds(h, ct, jt, "arg"):
                    problems.append(
                        f"{where}: {c.symbol} argument {i + 1} ({f.param_names[i]}): C type '{ct}' "
                        f"but Julia type {jt} (expected {expected(h, ct, 'arg')})"
                    )
        if c.nargs != len(c.argtypes):
            problems.append(f"{where}: {c.symbol} passes {c.nargs} values for {len(c.argtypes)} argument types")

    for name in sorted(set(h.functions) - covered):
        problems.append(f"{filename}: no ccall for header function {name}")

    consts = julia_constants(julia_text)
    for name, c in h.constants.items():
        if name not in consts:
            problems.append(f"{filename}: missing constant {name} = {c.value!r}")
            continue
        jv = julia_literal(consts[name])
        if jv is None:
            problems.append(f"{filename}: constant {name} = {consts[name]} is not a number or string literal")
        elif type(jv) is not type(c.value) or jv != c.value:
            problems.append(f"{filename}: constant {name} = {consts[name]} but fusekit.h has {c.value!r}")

    jstructs = julia_structs(julia_text)
    for cname, fields in h.structs.items():
        jname = camel(cname)
        if jname not in jstructs:
            problems.append(f"{filename}: no Julia struct {jname} for the by-value C struct {cname}")
            continue
        mutable, jfields = jstructs[jname]
        if mutable:
            problems.append(f"{filename}: {jname} must be an immutable struct to pass by value")
        if len(jfields) != len(fields):
            problems.append(f"{filename}: {jname} has {len(jfields)} fields but C {cname} has {len(fields)}")
            continue
        for (ct, cf), (jf, jt) in zip(fields, jfields):
            try:
                ok = corresponds(h, ct, parse_jtype(jt), "arg")
            except ValueError:
                ok = False
            if not ok:
                problems.append(f"{filename}: {jname}.{jf}::{jt} does not match C field '{ct} {cf}'")
    return problems


# ----------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def header_text() -> str:
    return HEADER.read_text()


@pytest.fixture(scope="module")
def julia_text() -> str:
    """The whole module (Fusekit.jl with abi_gen.jl included)."""
    return module_text()


def test_header_parses(header_text):
    h = parse_header(header_text)
    assert len(h.functions) >= 50, sorted(h.functions)
    add = h.functions["fk_add"]
    assert [str(p) for p in add.params] == ["fk_buffer *", "fk_buffer *", "fk_buffer *", "fk_stream *"]
    assert add.param_names == ["a", "b", "out", "stream"]
    assert h.resolve(add.ret) == CType("int32_t", 0)
    assert h.functions["fk_axpby"].params[0] == CType("fk_scalar", 0)
    assert h.functions["fk_abi_version"].params == []
    assert h.functions["fk_version_string"].ret == CType("char", 1)
    assert h.functions["fk_context_create"].params[3] == CType("fk_context", 2)
    assert {"fk_context", "fk_stream", "fk_buffer"} <= set(h.opaque)
    assert [(str(t), n) for t, n in h.structs["fk_scalar"]] == [("double", "re"), ("double", "im")]
    # the values as the header's own #define lines spell them
    raw = dict(re.findall(r"^#define (FK_\w+) (.+)$", header_text, flags=re.M))
    assert h.defines["FK_ABI_VERSION"] == int(raw["FK_ABI_VERSION"]) > 1000
    assert h.defines["FK_ERROR_NOT_CONVERGED"] == int(raw["FK_ERROR_NOT_CONVERGED"])
    assert h.constants["FK_VERSION"].value == raw["FK_VERSION"].strip('"')
    assert h.constants["FK_GAUSSIAN_DEFAULT_EPS"].value == float(raw["FK_GAUSSIAN_DEFAULT_EPS"])
    assert set(h.constants) == set(raw), "every FK_ #define is a constant"


def test_julia_module_has_ccalls(julia_text):
    calls = [c for c in module_ccalls(julia_text) if c.symbol and c.symbol.startswith("fk_")]
    assert len(calls) >= 50


def test_julia_module_matches_header(header_text, julia_text):
    problems = check_module(header_text, julia_text)
    assert problems == [], "Fusekit.jl does not match fusekit.h:\n" + "\n".join(problems)


def test_every_header_function_has_a_ccall(header_text, julia_text):
    h = parse_header(header_text)
    called = {c.symbol for c in module_ccalls(julia_text)}
    missing = sorted(set(h.functions) - called)
    assert missing == [], f"header functions without a ccall in Fusekit.jl: {missing}"


def test_module_loads_library_from_env():
    src = JULIA.read_text()
    assert re.search(r'const\s+libfusekit\s*=\s*get\(ENV,\s*"FUSEKIT_LIBRARY",\s*"libfusekit"\)', src)
    assert re.search(r"^module Fusekit\b", src, flags=re.M)
    assert re.search(r"struct\s+FusekitError\s*<:\s*Exception", src)


def test_fusekit_jl_includes_the_generated_abi():
    """Once, as code (not in a comment), inside the module, after `libfusekit`
    (which the generated ccalls name)."""
    code = strip_julia_comments_and_strings(JULIA.read_text())
    # string literals are blanked: match the include call by its shape
    hits = [m.start() for m in re.finditer(r"^include\(\s*\"\s*\"\s*\)\s*$", code, flags=re.M)]
    assert len(hits) == 1, "Fusekit.jl must include abi_gen.jl exactly once, on a line of its own"
    assert JULIA.read_text().count(INCLUDE_LINE) == 1
    module_at = re.search(r"^module Fusekit\b", code, flags=re.M).start()
    lib_at = re.search(r"^const\s+libfusekit\b", code, flags=re.M).start()
    end_at = [m.start() for m in re.finditer(r"^end\b", code, flags=re.M)][-1]  # the module's `end`
    assert module_at < lib_at < hits[0] < end_at


def test_hand_written_part_copies_nothing_generated(header_text):
    """Fusekit.jl keeps the idiomatic layer only: the constants, C structs and
    ccalls of the header come from abi_gen.jl."""
    h = parse_header(header_text)
    src = JULIA.read_text()
    code = strip_julia_comments_and_strings(src)
    assert [c.symbol for c in module_ccalls(src) if c.symbol and c.symbol.startswith("fk_")] == []
    assert julia_constants(src) == {}
    defined = set(julia_structs(src)) | set(re.findall(r"^\s*struct\s+(\w+)\s+end\b", code, flags=re.M))
    generated = {camel(n) for n in h.structs} | set(h.opaque)
    assert defined & generated == set()
    assert not re.search(r"^\s*(fk_\w+)\s*\([^)]*\)\s*=", code, flags=re.M), "raw wrappers belong in abi_gen.jl"


def test_generated_julia_matches_a_changed_header(header_text):
    """The generator's Julia for a header with new kinds of declarations passes the
    checker (whose type rules are written apart from the generator's)."""
    extra = header_text.replace(
        "#ifdef __cplusplus\n}",
        "fk_status fk_new_op(const fk_buffer *a, fk_scalar s, const int64_t *dims, uint8_t *bytes,\n"
        "                    float f, size_t n, void *p, const void *const *pp, fk_memory_stats *st,\n"
        "                    fk_event **ev, char *buf, const fk_stream *end);\n\n"
        "const char *fk_new_name(int32_t which);\n\n#ifdef __cplusplus\n}",
    ).replace("#define FK_MAX_DIMS 8", "#define FK_MAX_DIMS 8\n\n#define FK_NEW_FLAG (1 << 4)\n\n#define FK_NEW_NAME \"x\"")
    assert extra.count("fk_new_op") == 1 and "FK_NEW_FLAG" in extra
    generated = gen_bindings.render_julia(parse_header(extra))
    assert "const FK_NEW_FLAG = 16" in generated and 'const FK_NEW_NAME = "x"' in generated
    (row,) = [r for r in raw_rows(generated) if r.symbol == "fk_new_op"]
    params = re.search(r"fk_new_op\((.*)\)::", row.text).group(1)
    names = [p.split("::")[0].strip() for p in split_top_level(params)]
    assert names == ["a", "s", "dims", "bytes", "f", "n", "p", "pp", "st", "ev", "buf", "end_"]  # `end` is a Julia keyword
    assert check_module(extra, module_text(abi_gen_jl=generated)) == []
    # and the checker does read the generated file: the current one lacks fk_new_op
    _assert_reported(check_module(extra, module_text()), "no ccall for header function fk_new_op")


# --- negative self-tests: the checker must report deliberately wrong bindings.

FULL_BINDINGS_OK = None  # computed lazily from the real module


def _problems_for(header_text: str, julia_text: str, snippet: str) -> list[str]:
    """Problems of the real module with `snippet` appended (so that only the
    snippet's own mistakes are reported)."""
    return check_module(header_text, julia_text + "\n" + snippet + "\n", "snippet.jl")


def _assert_reported(problems: list[str], *needles: str) -> None:
    hits = [p for p in problems if all(n in p for n in needles)]
    assert hits, f"expected a problem mentioning {needles}, got:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "snippet, needles",
    [
        # symbol not in the header
        ("f() = ccall((:fk_does_not_exist, libfusekit), Int32, ())", ("fk_does_not_exist", "not a function")),
        # wrong number of argument types
        (
            "f(a, b, o) = ccall((:fk_add, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}), a, b, o)",
            ("fk_add", "3 argument types", "4 parameters"),
        ),
        # values and types disagree
        (
            "f(a, o) = ccall((:fk_exp, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, o)",
            ("fk_exp", "passes 2 values for 3"),
        ),
        # int64_t* given as Ptr{Int32}
        (
            "f(b, o) = ccall((:fk_buffer_shape, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Int32}), b, o)",
            ("fk_buffer_shape", "argument 2", "int64_t *", "Ptr{Int32}"),
        ),
        # fk_scalar by value given as Float64
        (
            "f(x, a, y, b, o, s) = ccall((:fk_axpby, libfusekit), Int32, "
            "(Float64, Ptr{fk_buffer}, FkScalar, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), x, a, y, b, o, s)",
            ("fk_axpby", "argument 1", "fk_scalar", "Float64"),
        ),
        # int32_t ndim given as Int64
        (
            "f(c, d, n, sh, s, o) = ccall((:fk_buffer_create, libfusekit), Int32, "
            "(Ptr{fk_context}, Int32, Int64, Ptr{Int64}, Ptr{fk_stream}, Ptr{Ptr{fk_buffer}}), c, d, n, sh, s, o)",
            ("fk_buffer_create", "argument 3", "Int64"),
        ),
        # a pointer passed as an integer
        (
            "f(c) = ccall((:fk_context_warmup, libfusekit), Int32, (UInt64,), c)",
            ("fk_context_warmup", "argument 1", "UInt64"),
        ),
        # out-parameter with one level of indirection missing
        (
            "f(c, o) = ccall((:fk_stream_create, libfusekit), Int32, (Ptr{fk_context}, Ptr{fk_stream}), c, o)",
            ("fk_stream_create", "argument 2", "fk_stream **"),
        ),
        # wrong return type
        ("f() = ccall((:fk_abi_version, libfusekit), Int32, ())", ("fk_abi_version", "returns", "uint32_t")),
        ("f(s) = ccall((:fk_stream_destroy, libfusekit), Cvoid, (Ptr{fk_stream},), s)", ("fk_stream_destroy", "returns")),
        # Cstring for a non-char pointer; Float32 for size_t
        (
            "f(b, o) = ccall((:fk_buffer_data, libfusekit), Int32, (Ptr{fk_buffer}, Cstring), b, o)",
            ("fk_buffer_data", "argument 2", "Cstring"),
        ),
        (
            "f(b, s, n, st) = ccall((:fk_buffer_copy_to_host, libfusekit), Int32, "
            "(Ptr{fk_buffer}, Ptr{Cvoid}, Float32, Ptr{fk_stream}), b, s, n, st)",
            ("fk_buffer_copy_to_host", "argument 3", "size_t"),
        ),
        # a pointer to another handle type
        (
            "f(a, o, s) = ccall((:fk_neg, libfusekit), Int32, (Ptr{fk_context}, Ptr{fk_buffer}, Ptr{fk_stream}), a, o, s)",
            ("fk_neg", "argument 1", "Ptr{fk_context}"),
        ),
        # `(T)` is not a tuple
        ("f(c) = ccall((:fk_context_warmup, libfusekit), Int32, (Ptr{fk_context}), c)", ("fk_context_warmup", "tuple")),
        # wrong library
        ("f() = ccall((:fk_abi_version, \"libother\"), UInt32, ())", ("fk_abi_version", "libfusekit")),
    ],
)
def test_checker_reports_wrong_ccall(header_text, julia_text, snippet, needles):
    _assert_reported(_problems_for(header_text, julia_text, snippet), *needles)


@pytest.mark.parametrize(
    "snippet",
    [
        # accepted spellings: Ref for out-parameters, Ptr{Cvoid} for any pointer, Cint, Base-qualified names
        "f(b, o) = ccall((:fk_buffer_shape, libfusekit), Cint, (Ptr{fk_buffer}, Ref{Int64}), b, o)",
        "f(b, o) = ccall((:fk_buffer_numel, libfusekit), Base.Int32, (Ptr{Cvoid}, Ptr{Cvoid}), b, o)",
        "f(c, o) = ccall((:fk_stream_create, libfusekit), Int32, (Ptr{Cvoid}, Ref{Ptr{Cvoid}}), c, o)",
        "f(s) = ccall((:fk_status_string, libfusekit), Ptr{UInt8}, (Cint,), s)",
        "f(b, c, n) = ccall((:fk_last_error_message_copy, libfusekit), Int32, (Ptr{Cchar}, Csize_t, Ref{Csize_t}), b, c, n)",
        # ccalls in comments and strings are not ccalls
        '# ccall((:fk_bogus, libfusekit), Int32, ())\nx = "ccall((:fk_bogus2, libfusekit), Int32, ())"',
        '#= ccall((:fk_bogus3, libfusekit), Int32, (Int8, Int8), 1) =#',
        # a ccall into another library is none of our business
        "g(p) = ccall(:free, Cvoid, (Ptr{Cvoid},), p)",
    ],
)
def test_checker_accepts_valid_spellings(header_text, julia_text, snippet):
    assert _problems_for(header_text, julia_text, snippet) == []


def test_checker_reports_missing_functions(header_text):
    only_one = "module M\nconst libfusekit = \"x\"\nf() = ccall((:fk_abi_version, libfusekit), UInt32, ())\nend\n"
    problems = check_module(header_text, only_one)
    h = parse_header(header_text)
    missing = [p for p in problems if "no ccall for header function" in p]
    assert len(missing) == len(h.functions) - 1
    _assert_reported(problems, "no ccall for header function fk_add")
    _assert_reported(problems, "missing constant FK_OK")
    _assert_reported(problems, "no Julia struct FkScalar")


def test_checker_reports_wrong_constant_and_struct(header_text, julia_text):
    bad = julia_text.replace("const FK_ERROR_ALIASING = 6", "const FK_ERROR_ALIASING = 7")
    assert bad != julia_text
    _assert_reported(check_module(header_text, bad), "FK_ERROR_ALIASING = 7", "has 6")
    bad = re.sub(r"struct FkScalar\n\s*re::Float64", "struct FkScalar\n    re::Float32", julia_text)
    assert bad != julia_text
    _assert_reported(check_module(header_text, bad), "FkScalar.re::Float32")
    bad = julia_text.replace("struct FkScalar\n", "mutable struct FkScalar\n")
    assert bad != julia_text
    _assert_reported(check_module(header_text, bad), "FkScalar must be an immutable struct")


def test_checker_reports_removed_ccall(header_text, julia_text):
    # drop the raw wrapper of fk_sigmoid (with any continuation lines): the checker must notice
    bad = re.sub(r"^@fk_raw fk_sigmoid\(.*\n(?:[ \t]+.*\n)*", "", julia_text, flags=re.M)
    assert bad != julia_text
    _assert_reported(check_module(header_text, bad), "no ccall for header function fk_sigmoid")
    # a multi-line wrapper too
    bad = re.sub(r"^@fk_raw fk_leapfrog_backward\(.*\n(?:[ \t]+.*\n)*", "", julia_text, flags=re.M)
    assert bad != julia_text
    _assert_reported(check_module(header_text, bad), "no ccall for header function fk_leapfrog_backward")


def test_checker_sees_new_header_functions(header_text, julia_text):
    # a function added to the header without a binding is reported
    extra = header_text.replace(
        "#ifdef __cplusplus\n}", "fk_status fk_new_op(const fk_buffer *a, double x);\n\n#ifdef __cplusplus\n}"
    )
    assert extra != header_text
    problems = check_module(extra, julia_text)
    _assert_reported(problems, "no ccall for header function fk_new_op")
    ok = julia_text + "\nfk_new_op(a, x) = ccall((:fk_new_op, libfusekit), Int32, (Ptr{fk_buffer}, Cdouble), a, x)\n"
    assert check_module(extra, ok) == []


def test_checker_reads_the_raw_rows(header_text, julia_text):
    """The generated rows are checked like ccalls: a wrong type, a missing
    parameter, and a macro that calls another library are reported."""
    rows = raw_rows(julia_text)
    assert len(rows) == len(parse_header(header_text).functions)
    row = "@fk_raw fk_buffer_shape(buf::Ptr{fk_buffer}, out::Ptr{Int64})::Int32"
    assert row in julia_text
    bad = julia_text.replace(row, row.replace("Ptr{Int64}", "Ptr{Int32}"))
    _assert_reported(check_module(header_text, bad), "fk_buffer_shape", "argument 2", "Ptr{Int32}")
    bad = julia_text.replace(row, "@fk_raw fk_buffer_shape(buf::Ptr{fk_buffer})::Int32")
    _assert_reported(check_module(header_text, bad), "fk_buffer_shape", "1 argument types", "2 parameters")
    bad = julia_text.replace(row, row.replace("::Int32", "::Cvoid"))
    _assert_reported(check_module(header_text, bad), "fk_buffer_shape", "returns")
    bad = julia_text.replace("QuoteNode(name), :libfusekit)", "QuoteNode(name), :libother)")
    assert bad != julia_text
    _assert_reported(check_module(header_text, bad), "fk_add", "libfusekit")
