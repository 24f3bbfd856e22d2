"""The package's import graph has no loops, between modules or between packages, and nothing imports upward.

Reads every module's source (imports inside functions included, since a lazy import still ties two modules
together) and walks the graph; a newcomer changing one subpackage should never be pulled round a loop. The
steps (``verlflow.steps``) sit above the domain packages: only the command line imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import verlflow

PACKAGE_DIR = Path(verlflow.__file__).parent
# The modules that sit on top: only entry points and the console script import them (the entry points through
# project_entry, which catches a Ctrl-C while the command line loads).
TOP = {"verlflow.cli", "verlflow.project_entry"}
STEPS_PACKAGE = "verlflow.steps"
# The packages that hold what the steps call; none of them may import a step.
DOMAIN = ("config", "data", "device", "backends", "models", "tracking", "outage", "process", "search", "compare")


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


def package_of(module: str) -> str:
    """``verlflow.config.schema`` → ``verlflow.config``; a top-level module (``verlflow.names``) is its own."""
    parts = module.split(".")
    return ".".join(parts[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package → the other packages its modules import (``verlflow`` itself, the package root, left out)."""
    packages: dict[str, set[str]] = {}
    for name, deps in graph.items():
        if name == "verlflow":
            continue
        here = package_of(name)
        packages.setdefault(here, set()).update(package_of(d) for d in deps if d != "verlflow")
        packages[here].discard(here)
    return packages


def test_the_packages_have_no_import_loop():
    loop = find_cycle(package_graph(import_graph()))
    assert loop is None, "package import loop: " + " → ".join(loop)


def test_no_domain_package_imports_a_step():
    graph = import_graph()
    upward = sorted(f"{name} imports {dep}" for name, deps in graph.items() for dep in deps
                    if package_of(name) in {f"verlflow.{d}" for d in DOMAIN} and package_of(dep) == STEPS_PACKAGE)
    assert not upward, upward


# The trainers' own packages: a step asks verlflow.backends.registry for one by name, it never imports them.
TRAINER_PACKAGES = ("verlflow.backends.local", "verlflow.backends.verl")


def test_no_step_imports_a_trainers_modules():
    graph = import_graph()
    reached = sorted(f"{name} imports {dep}" for name, deps in graph.items() for dep in deps
                     if package_of(name) == STEPS_PACKAGE
                     and any(dep == p or dep.startswith(p + ".") for p in TRAINER_PACKAGES))
    assert not reached, reached


def test_every_entry_point_runs_a_function_of_the_steps_package():
    from verlflow.steps import STEPS

    for name, step in STEPS.items():
        assert step.run.__module__ == f"{STEPS_PACKAGE}.{name}", f"{name}: {step.run.__module__}"


def test_the_package_loop_finder_sees_a_loop_the_module_graph_does_not():
    modules = {"verlflow.a.x": {"verlflow.b.y"}, "verlflow.b.y": set(), "verlflow.b.z": {"verlflow.a.w"},
               "verlflow.a.w": set()}
    assert find_cycle(modules) is None
    assert find_cycle(package_graph(modules)) == ["verlflow.a", "verlflow.b", "verlflow.a"]


def test_outside_config_every_import_goes_through_its_facade():
    # verlflow.config's __init__ names what the rest of the package may use; its modules are its own business.
    reached_past = []
    for name, path in module_names().items():
        if package_of(name) == "verlflow.config":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            imported = [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            reached_past += [f"{name} imports {m}" for m in imported if m.startswith("verlflow.config.")]
    assert not reached_past, reached_past


def test_no_product_module_is_test_code_or_reads_a_test_variable():
    # Fault injection lives in tests/ (fault_cli.py hands it to stopping.on_safe_point): a product module that read
    # VERLFLOW_TEST_* would let an environment variable crash every real run at a safe point.
    offenders = [name for name, path in module_names().items()
                 if name.rpartition(".")[2].startswith("test") or "VERLFLOW_TEST" in path.read_text(encoding="utf-8")]
    assert offenders == []
