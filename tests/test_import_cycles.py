"""No import circles between veil's modules (issue 32: `engine/ray_grpc.py <-> engine/ray_serve.py` was one).

Every import that runs counts, also one inside a function (a lazy import still ties the two modules together);
imports under ``if TYPE_CHECKING:`` do not run and do not count.
"""

from __future__ import annotations

import ast
from importlib.util import resolve_name
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _packages() -> dict[str, Path]:
    """Import name -> folder, from pyproject's namespace mapping (``veil.engine`` -> ``engine/``...)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in setuptools["package-dir"].items() if "." in name}


def _modules() -> dict[str, Path]:
    """Every library module by its dotted name."""
    out = {}
    for package, folder in _packages().items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            out[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """The dotted names ``tree`` imports (relative ones resolved; ``from a import b``: ``a`` and ``a.b``), skipping
    ``if TYPE_CHECKING:`` blocks."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            source = resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
            found |= {source, *(f"{source}.{alias.name}" for alias in node.names)}
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        imported = _imports(ast.parse(path.read_text()), name, path.name == "__init__.py")
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_engine_has_no_import_circle() -> None:
    """The Ray fronts were an import circle; the one data plane (engine/plane.py) under two fronts has none."""
    graph = import_graph()
    engine = {m: deps for m, deps in graph.items() if m.startswith("veil.engine")}
    assert circles(engine) == []
    assert "veil.engine.ray_grpc" not in graph  # the Ray gRPC front is the one gRPC front over the Ray plane


def test_training_has_no_import_circle() -> None:
    """`from . import solvers` in training/compress/lowrank/sequential.py imported its own package, whose __init__
    imports sequential (issue 32); sequential now imports the names it uses from the solvers module."""
    graph = import_graph()
    training = {m: deps for m, deps in graph.items() if m.startswith("veil.training")}
    assert circles(training) == []
    assert "veil.training.compress.lowrank" not in graph["veil.training.compress.lowrank.sequential"]


def test_he_has_no_import_circle() -> None:
    """Two circles were left in he/ (issue 32): compiler -> latency / attention imported CompileError back from the
    compiler, and params' measured sizes imported seal_to_bytes from serialize, which imports params. CompileError
    now lives in he/errors.py with every other refusal, and SEAL objects <-> bytes in he/sealbytes.py (it needs no
    parameter set); both stay importable from where they were."""
    graph = import_graph()
    he = {m: deps for m, deps in graph.items() if m.startswith("veil.he")}
    assert circles(he) == []
    assert "veil.he.compiler" not in graph["veil.he.attention"] | graph["veil.he.latency"]
    assert "veil.he.serialize" not in graph["veil.he.params"]
    import veil.he
    from veil.he import compiler, errors, sealbytes, serialize

    assert compiler.CompileError is errors.CompileError is veil.he.CompileError
    assert (serialize.seal_to_bytes, serialize.seal_from_bytes) == (sealbytes.seal_to_bytes, sealbytes.seal_from_bytes)


def test_the_circle_finder_sees_lazy_imports_and_skips_type_checking_ones() -> None:
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
              "def f():\n    from .c import g\n")
    assert _imports(ast.parse(source), "veil.engine.a", False) >= {"veil.engine.c", "veil.engine.c.g"}
    assert "veil.engine.b" not in _imports(ast.parse(source), "veil.engine.a", False)
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
