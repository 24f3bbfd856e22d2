"""No function or method in ``src/`` is longer than 60 lines (the project's style rule, CONTRIBUTING.md).

A function's length is its lines from ``def`` (its decorators excluded) to its last statement, docstring
included. Nothing is imported; the syntax tree of each file is read.

    python tests/test_function_length.py   # lists every function over the limit
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LIMIT = 60


def long_functions(src: Path = SRC) -> list[str]:
    """``path:function (N lines)`` for every function of ``src`` longer than :data:`LIMIT`."""
    found = []
    for path in sorted(src.rglob("*.py")):
        relative = path.relative_to(src).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    found.append(f"{relative}:{node.name} ({lines} lines)")
    return found


def test_no_function_is_over_60_lines():
    found = long_functions()
    assert not found, f"functions over {LIMIT} lines (split them into named helpers):\n" + "\n".join(found)


if __name__ == "__main__":
    print("\n".join(long_functions()))
