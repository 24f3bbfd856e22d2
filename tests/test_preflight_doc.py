"""docs/preflight.md and the dry run's registry of checks agree: every row of the page maps to exactly one
registered check, every check is documented, and every test row named runs.

Fast (reads the page and imports the registry; no dry run): the table rows themselves run in
tests/test_dry_run_rehearsal_*.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import rehearsal_rows

from verlflow.backends.verl.dryrun import checks, preflight

DOC = Path(__file__).resolve().parents[1] / "docs" / "preflight.md"
TESTS = Path(__file__).resolve().parent
# Sections whose tables are figures, not checks.
NOT_CHECKS = ("Speed",)


def all_checks() -> tuple[checks.Check, ...]:
    """Every check of the dry run: importing the preflight registers the launch's, and the rehearsal's stages."""
    assert preflight.launch_problems  # the import above registered them
    return checks.registered()


def _table_rows() -> list[tuple[str, list[str]]]:
    """(section, cells) of every body row of every table on the page, outside :data:`NOT_CHECKS`."""
    rows, section, header_seen = [], "", False
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        if not line.startswith("|"):
            header_seen = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header_seen:
            header_seen = True  # the header row
        elif not all(set(c) <= set("-: ") for c in cells) and section not in NOT_CHECKS:
            rows.append((section, cells))
    return rows


def _named_checks(cells: list[str], names: set[str]) -> set[str]:
    return {quoted for cell in cells for quoted in re.findall(r"`([^`]+)`", cell) if quoted in names}


def test_every_row_of_the_page_maps_to_exactly_one_registered_check():
    names = {check.name for check in all_checks()}
    rows = _table_rows()
    assert len(rows) >= 80
    wrong = [(section, cells[0], sorted(_named_checks(cells, names))) for section, cells in rows
             if len(_named_checks(cells, names)) != 1]
    assert wrong == [], "rows naming zero or two registered checks (section, first cell, checks named)"


def test_every_registered_check_is_on_the_page_and_declares_what_it_needs():
    text = DOC.read_text()
    for check in all_checks():
        assert f"`{check.name}`" in text, f"{check.name} is registered but docs/preflight.md never names it"
        assert check.needs and check.needs <= set(checks.NEEDS), check


def test_numbered_rows_are_numbered_once():
    numbers = [int(cells[0]) for _, cells in _table_rows() if cells[0].isdigit()]
    assert len(numbers) >= 50 and len(numbers) == len(set(numbers)), "a row number is used twice"


def test_every_test_row_named_runs_and_every_table_row_is_documented():
    known = set(rehearsal_rows.ROWS) | {path.stem for path in TESTS.glob("test_*.py")}
    for _, cells in _table_rows():
        if not cells[0].isdigit():
            continue
        named = re.findall(r"`([a-z0-9_]+)`", cells[-1])
        assert named and set(named) <= known, f"row {cells[0]}: {set(named) - known or 'no test row'}"
    documented = set(re.findall(r"`([a-z0-9_]+)`", DOC.read_text()))
    assert sorted(set(rehearsal_rows.ROWS) - documented) == []
