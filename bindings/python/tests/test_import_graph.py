"""The fusekit package imports without circles: the graph of its module-level
imports, read from the source files with ``ast``, has no cycle.

An edge ``a -> b`` is an import that runs when module ``a`` is imported: any
``import``/``from ... import`` outside function bodies (module body, class
bodies, ``if``/``try`` blocks), relative ones resolved, ``from . import x`` an
edge to the submodule ``x`` where there is one, and an import of ``p.q.m`` also
an edge to each package ``p.q`` it runs first. Imports inside functions are not
edges: the package keeps them for layers that need torch (torch is optional), and
they run only after every module involved has finished importing.
"""

import ast
from pathlib import Path

import pytest

import fusekit

PKG_DIR = Path(fusekit.__file__).resolve().parent
PKG = "fusekit"


def module_name(path: Path, root: Path, pkg: str) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [pkg, *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(tree: ast.AST, functions: bool = False):
    """Import nodes executed at import time: everything but function bodies
    (``functions``: those too)."""
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if not functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path, pkg: str, functions: bool = False) -> dict:
    """{module: set of package modules its module-level imports run} (``functions``:
    with the imports inside functions as edges too)."""
    files = {module_name(p, root, pkg): p for p in root.rglob("*.py") if "__pycache__" not in p.parts}
    modules = set(files)
    graph = {}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        here = name if is_pkg else name.rpartition(".")[0]
        edges = set()

        def runs(target, whole=True):
            """Importing ``target`` runs the packages above it that are not above
            this module, and (``whole``) ``target`` itself."""
            parts = target.split(".")
            for i in range(2, len(parts) + (1 if whole else 0)):
                m = ".".join(parts[:i])
                if m in modules and m != name and not name.startswith(m + "."):
                    edges.add(m)
            if whole and target in modules and target != name:
                edges.add(target)

        for node in _top_level_imports(ast.parse(path.read_text(), str(path)), functions):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == pkg:
                        runs(a.name)
                continue
            if node.level:
                base = here.split(".")
                base = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != pkg:
                continue
            runs(base, whole=False)
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    runs(f"{base}.{a.name}")
                elif base != name:
                    # a name defined in base's own body: base must have run (even
                    # when it is a package above this module)
                    edges.add(base)
        graph[name] = edges
    return graph


def find_cycle(graph: dict):
    """One cycle as a list of nodes ``[a, b, ..., a]``, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {n: WHITE for n in graph}
    path = []

    def visit(n):
        color[n] = GREY
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if color.get(m, BLACK) == GREY:
                return path[path.index(m):] + [m]
            if color.get(m) == WHITE:
                found = visit(m)
                if found:
                    return found
        path.pop()
        color[n] = BLACK
        return None

    for n in sorted(graph):
        if color[n] == WHITE:
            found = visit(n)
            if found:
                return found
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"b"}}) is None


def test_graph_builder_on_a_synthetic_package(tmp_path):
    """Relative imports, ``from . import x``, parent packages, class bodies and
    try blocks count; function bodies do not."""
    pkg = tmp_path / "pk"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .sub import b\nclass K:\n    from . import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("try:\n    from .. import c\nexcept ImportError:\n    pass\n")
    (pkg / "c.py").write_text("def f():\n    from . import a\n")
    g = import_graph(pkg, "pk")
    assert g["pk"] == {"pk.a"}
    assert g["pk.a"] == {"pk.sub", "pk.sub.b", "pk.c"}
    assert g["pk.sub.b"] == {"pk.c"}
    assert g["pk.c"] == set()
    assert find_cycle(g) is None
    (pkg / "c.py").write_text("from .sub.b import x\n")  # now c -> sub.b -> c
    cycle = find_cycle(import_graph(pkg, "pk"))
    assert cycle is not None and {"pk.c", "pk.sub.b"} <= set(cycle)


def test_fusekit_has_no_import_cycle():
    graph = import_graph(PKG_DIR, PKG)
    assert "fusekit.ops.elementwise" in graph and graph["fusekit"], "the graph missed the package's modules"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_fusekit_has_no_import_cycle_through_functions():
    """Imports inside functions counted too: the plain functions reach the torch
    layer only through fusekit/_route.py, which fusekit.torch fills, so no
    function-level import runs back up (the op modules once imported the torch
    layer's loader, whose route imported the torch families, which import the op
    modules: a 13-file circle)."""
    graph = import_graph(PKG_DIR, PKG, functions=True)
    assert "fusekit.torch.mlp" in graph["fusekit.torch"], "the function-level import of the families was missed"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle through functions: " + " -> ".join(cycle)


def test_graph_builder_counts_function_bodies_when_asked(tmp_path):
    pkg = tmp_path / "pk"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    assert find_cycle(import_graph(pkg, "pk")) is None
    assert find_cycle(import_graph(pkg, "pk", functions=True)) == ["pk.a", "pk.b", "pk.a"]


@pytest.mark.parametrize("module", ["fusekit._buffer", "fusekit._invocation", "fusekit.runtime"])
def test_core_modules_do_not_import_runtime_back(module):
    """The circle this test was written against: runtime.py attached methods to
    Context, Stream and Buffer, and _buffer imported runtime back."""
    graph = import_graph(PKG_DIR, PKG)
    reach, todo = set(), [module]
    while todo:
        for m in graph[todo.pop()]:
            if m not in reach:
                reach.add(m)
                todo.append(m)
    assert module not in reach
