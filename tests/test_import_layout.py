"""The package's import graph has no loops and nothing below the command line imports it.

Reads every module's source (imports inside functions included, since a lazy import still ties two modules
together) and walks the graph; a newcomer changing one subpackage should never be pulled round a loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import verlflow

PACKAGE_DIR = Path(verlflow.__file__).parent
# The modules that sit on top: only entry points and the console script import them.
TOP = {"verlflow.cli"}


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package's ``__init__`` under the package's name)."""
    names = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    return names


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that ``path`` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("verlflow"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("verlflow"))
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the package modules it imports (itself excluded)."""
    modules = module_names()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop as a list of modules (first == last), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (loop := visit(nxt)):
                return loop
        state[node] = "done"
        stack.pop()
        return None

    for start in sorted(graph):
        if start not in state and (loop := visit(start)):
            return loop
    return None


def test_the_package_has_no_import_loop():
    loop = find_cycle(import_graph())
    assert loop is None, "import loop: " + " → ".join(loop)


def test_nothing_below_the_command_line_imports_it():
    graph = import_graph()
    upward = sorted(f"{name} imports {top}" for name, deps in graph.items() for top in deps & TOP if name not in TOP)
    assert not upward, upward


def test_the_loop_finder_finds_a_loop():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
