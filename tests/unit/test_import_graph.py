"""The package's shape: no import cycles between rlft's modules, and no oversized files.

The import graph is read with ``ast`` (nothing is imported): every ``import`` / ``from ... import`` in
src/rlft, module level or inside a function, and those under ``if TYPE_CHECKING:`` too (an annotation-only import
is still a dependency a reader must follow; a cycle through one is a cycle). An edge goes to the module named, and
for ``from package import name`` also to ``package.name`` when that is a module. A package's ``__init__`` counts as
the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "rlft"
MAX_SRC_LINES = 450
MAX_SCRIPT_LINES = 300


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_names(tree: ast.Module, module: str, is_package: bool) -> list[str]:
    """Absolute names of what ``tree`` imports (module names, or module.name for ``from`` imports), wherever the
    import stands: module level, a function, or an ``if TYPE_CHECKING:`` block."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """``{module: modules of rlft it imports}`` for every module of src/rlft."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = {target for target in imported_names(tree, name, path.name == "__init__.py") if target in known}
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return [_cycle_in(graph, set(c)) for c in sorted(components)]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, staying inside the component (breadth-first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")  # cannot happen for a component


def test_the_cycle_finder_finds_cycles_and_only_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b", "a"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"d"}, "e": {"f"}, "f": {"e"}}) == [
        ["a", "b", "c", "a"], ["e", "f", "e"]]


def test_the_graph_sees_local_and_type_checking_imports():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import rlft.ops\n"
        "from rlft import distributed\n"
        "from . import fsio\n"
        "if TYPE_CHECKING:\n"
        "    from rlft.recipes.dpo import DPOConfig\n"
        "def f():\n"
        "    from rlft.checkpoint import MetricsLog\n"
    )
    names = set(imported_names(tree, "rlft.run_folder", is_package=False))
    assert {"rlft.ops", "rlft.distributed", "rlft.fsio", "rlft.checkpoint"} <= names
    assert "rlft.recipes.dpo.DPOConfig" in names  # a type-only import is an edge too
    graph = import_graph()
    assert "rlft.checkpoint" in graph["rlft.run_folder"] and "rlft.fsio" in graph["rlft.checkpoint"]


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, ("import cycles in src/rlft (break them: move the shared part down a layer, "
                        "see docs/design.md):\n" + "\n".join("  " + " -> ".join(cycle) for cycle in cycles))


def _line_counts(folder: Path, pattern: str) -> dict[str, int]:
    """Lines of every file under ``folder`` matching ``pattern`` (caches left out)."""
    return {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
            for p in sorted(folder.rglob(pattern)) if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("folder, pattern, limit", [
    (PACKAGE, "*.py", MAX_SRC_LINES),
    (ROOT / "scripts", "*", MAX_SCRIPT_LINES),
])
def test_no_file_is_too_long(folder, pattern, limit):
    counts = _line_counts(folder, pattern)
    assert counts, f"no files found under {folder}"
    too_long = {name: n for name, n in counts.items() if n > limit}
    assert not too_long, f"files over {limit} lines (split them along a natural seam): " + ", ".join(
        f"{name} ({n})" for name, n in sorted(too_long.items()))
