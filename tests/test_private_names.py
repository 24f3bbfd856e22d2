"""Other libraries' private names are used only in ``verlflow/compat/`` (one module per library).

An upgrade of verl, MLflow, Optuna, Ray, OmegaConf or transformers is then checked in one folder. This reads
every module of ``src/verlflow`` outside ``compat/`` (its syntax tree, nothing is imported) and fails on:

- ``import verl._x`` / ``from mlflow.utils._x import y`` / ``from optuna.storages import _x``;
- ``name._x`` where ``name`` is bound by an import from one of the libraries, or is a local object (a
  model, a trial, a config node: whatever it is, its private attribute is not verlflow's; ``self``/``cls``
  and modules imported from elsewhere are verlflow's own or the standard library's);
- ``getattr/setattr/hasattr/delattr(obj, "_x")``;
- a library's own dunders (``__ray_metadata__``);
- a string naming a private module path (``"verl.workers._x"``), or a private name as a string in a module
  that imports one of the libraries (``("trainer/ppo/ray_trainer.py", "_load_checkpoint")``), unless it is
  only a suffix or prefix handed to a string method or a piece of an f-string.

    python tests/test_private_names.py [SRC]   # lists the uses under SRC (default: this checkout's src)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

LIBRARIES = ("verl", "mlflow", "optuna", "ray", "omegaconf", "transformers")
SRC = Path(__file__).resolve().parents[1] / "src"
PRIVATE = re.compile(r"_[A-Za-z][A-Za-z0-9_]*[A-Za-z0-9]|_[A-Za-z]")  # _x, not _x_ (a config key) nor __x__
LIBRARY_DUNDER = re.compile(rf"__({'|'.join(LIBRARIES)})_\w*__")
PRIVATE_PATH = re.compile(rf"({'|'.join(LIBRARIES)})(\.\w+)*\._[A-Za-z]\w*(\.\w+)*")
STRING_METHODS = {"endswith", "startswith", "removesuffix", "removeprefix", "split", "rsplit", "partition",
                  "rpartition", "replace", "find", "rfind", "index"}
OWN = {"self", "cls"}
ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return bool(PRIVATE.fullmatch(name)) or bool(LIBRARY_DUNDER.fullmatch(name))


class _Imports:
    """Where each name of a module comes from, and the private ones it imports from the libraries."""

    def __init__(self, tree: ast.Module) -> None:
        self.library: set[str] = set()  # names bound by an import from one of the libraries
        self.other: set[str] = set()  # names bound by any other import (stdlib, verlflow, torch…)
        self.found: list[tuple[int, str]] = []
        for node in ast.walk(tree):  # wherever an import sits (a function's own import included)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._bind(alias.asname or alias.name.split(".")[0], alias.name, node.lineno,
                               f"import {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    module = None if node.level else node.module
                    self._bind(alias.asname or alias.name, f"{module}.{alias.name}" if module else None,
                               node.lineno, f"from {module} import {alias.name}")

    def _bind(self, name: str, dotted: str | None, line: int, what: str) -> None:
        if dotted is None or dotted.split(".")[0] not in LIBRARIES:
            self.other.add(name)
            return
        self.library.add(name)
        if any(_private(part) for part in dotted.split(".")):
            self.found.append((line, what))


def _foreign_root(node: ast.Attribute, imports: _Imports) -> bool:
    """Whether an attribute chain starts at a library's name or at a local object (not self/cls/other imports)."""
    root = node.value
    while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
        root = root.func if isinstance(root, ast.Call) else root.value
    return isinstance(root, ast.Name) and root.id not in OWN and (
        root.id in imports.library or root.id not in imports.other)


def _uses(tree: ast.Module) -> list[tuple[int, str]]:
    imports = _Imports(tree)
    found = list(imports.found)
    # a suffix handed to a string method, or a piece of an f-string, is text, not a name
    suffixes = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute) and node.func.attr in STRING_METHODS for arg in node.args}
    suffixes |= {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _foreign_root(node, imports):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_CALLS \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value):
            found.append((node.lineno, ast.unparse(node)[:80]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if PRIVATE_PATH.fullmatch(node.value) or (imports.library and id(node) not in suffixes
                                                      and PRIVATE.fullmatch(node.value)):
                found.append((node.lineno, repr(node.value)))
    return found


def private_uses(src: Path) -> list[str]:
    """``path:line: what`` for every private name of the libraries used outside ``verlflow/compat/``."""
    found = []
    for path in sorted((src / "verlflow").rglob("*.py")):
        if "compat" in path.relative_to(src / "verlflow").parts:
            continue
        hits = _uses(ast.parse(path.read_text(encoding="utf-8")))
        found += [f"{path.relative_to(src).as_posix()}:{line}: {what}" for line, what in sorted(set(hits))]
    return found


def test_no_private_name_of_another_library_outside_compat():
    found = private_uses(SRC)
    assert not found, ("private names of verl/MLflow/Optuna/Ray/OmegaConf/transformers outside verlflow/compat/ "
                       "(add an accessor there, with the versions checked and the fallback):\n" + "\n".join(found))


def test_the_check_finds_each_kind_of_use(tmp_path):
    package = tmp_path / "verlflow"
    (package / "compat").mkdir(parents=True)
    (package / "compat" / "verl.py").write_text("from verl.utils.tracking import _compute\n")  # allowed there
    (package / "uses.py").write_text(
        "import importlib\nimport os\nfrom optuna.storages._heartbeat import BaseHeartbeat\n"
        "from mlflow.utils import validation\nvalidation._validate_model_alias_name('a')\n"
        "def f(model, remote):\n"
        "    os._exit(0)\n"
        "    getattr(model.config, '_attn_implementation', None)\n"
        "    remote.__ray_metadata__.modified_class\n"
        "    model.config.name.endswith('_rollout')\n"
        "    importlib.import_module('ray._private.services')\n"
        "    return {('trainer/ppo/ray_trainer.py', '_load_checkpoint'): 1}\n")
    found = [line.split(": ", 1)[0] for line in private_uses(tmp_path)]
    assert found == [f"verlflow/uses.py:{n}" for n in (3, 5, 8, 8, 9, 11, 12)], private_uses(tmp_path)


if __name__ == "__main__":
    print("\n".join(private_uses(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC)))
