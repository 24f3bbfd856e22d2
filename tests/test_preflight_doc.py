"""docs/preflight.md and the checks agree: every numbered row names one check that exists and test rows that run.

Fast (reads the page and imports the check modules; no dry run): the table rows themselves run in
tests/test_dry_run_rehearsal_*.py.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import rehearsal_rows

DOC = Path(__file__).resolve().parents[1] / "docs" / "preflight.md"
# Where a check named `module.function` in the page lives.
PACKAGES = ("verlflow.backends.verl", "verlflow.backends.verl.rehearsal", "verlflow.config")
TESTS = Path(__file__).resolve().parent


def _numbered_rows() -> list[list[str]]:
    """The cells of every numbered table row (``| 12 | … |``)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in DOC.read_text().splitlines() if re.match(r"\|\s*\d+\s*\|", line)]


def _resolve(dotted: str) -> object | None:
    module, _, name = dotted.rpartition(".")
    for package in PACKAGES:
        try:
            return getattr(importlib.import_module(f"{package}.{module}"), name, None)
        except ImportError:
            continue
    return None


def test_every_numbered_row_names_one_check_that_exists():
    rows = _numbered_rows()
    assert len(rows) >= 50
    numbers = [int(cells[0]) for cells in rows]
    assert len(numbers) == len(set(numbers)), "a row number is used twice"
    for cells in rows:
        check = re.findall(r"`([a-z_]+\.[a-z_]+)`", cells[-2])
        assert check, f"row {cells[0]} names no check: {cells[-2]}"
        assert callable(_resolve(check[0])), f"row {cells[0]}: {check[0]} is not a function of verlflow"


def test_every_test_row_named_runs_and_every_table_row_is_documented():
    known = set(rehearsal_rows.ROWS) | {path.stem for path in TESTS.glob("test_*.py")}
    for cells in _numbered_rows():
        named = re.findall(r"`([a-z0-9_]+)`", cells[-1])
        assert named and set(named) <= known, f"row {cells[0]}: {set(named) - known or 'no test row'}"
    documented = set(re.findall(r"`([a-z0-9_]+)`", DOC.read_text()))
    assert sorted(set(rehearsal_rows.ROWS) - documented) == []
