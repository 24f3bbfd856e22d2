"""What a row of the dry run's table must show (tests/rehearsal_rows.py), asserted the same on every verl."""

from __future__ import annotations

import re

import pytest
import rehearsal_rows
from conftest import built_once, fresh_store

# Warnings about this machine (a package the cluster image has), allowed on a row that must pass.
MACHINE_WARNING = "is not installed on this machine"


def check_row(row: str, which: str, results: dict) -> None:
    """Assert that ``row``'s dry run on ``which`` verl did what the table says (see tests/rehearsal_rows.py)."""
    outcome, key = rehearsal_rows.ROWS[row].expected(which)
    if outcome == "skip":
        pytest.skip(f"not on verl {which}: {key}")
    got = results[row]
    assert "Traceback" not in got["stderr"] + got["stdout"], got["stderr"][-2000:]
    assert len(got["statuses"]) <= 1 and "RUNNING" not in got["statuses"], got["statuses"]
    warnings = [ln for ln in got["stdout"].splitlines() if ln.startswith("verlflow: warning: ")]
    if outcome == "error":
        assert got["code"] == 2, got["stdout"][-1500:] + got["stderr"][-2000:]
        assert got["statuses"] in ([], ["FAILED"])  # refused before a run opens, or the run ends FAILED
        # One line per problem: "…error: key=value: …" alone, or "  key=value: …" under a header.
        assert re.search(rf"(error: |\n  ){re.escape(key)}=[^\n]*: ", got["stderr"]), got["stderr"][-2000:]
        return
    assert got["code"] == 0, got["stderr"][-2000:]
    assert got["statuses"] == ["FINISHED"]
    if outcome == "warning":
        assert any(ln.startswith(f"verlflow: warning: {key}=") for ln in warnings), got["stdout"][-2000:]
    else:
        assert [w for w in warnings if MACHINE_WARNING not in w] == [], warnings


def newest_results(tmp_path_factory: pytest.TempPathFactory, share: str) -> dict:
    """The dry runs of one share of the table (rehearsal_rows.NEWEST_SHARES) on the installed verl, by row name.

    The model is built once per test session; each share has its own folders and store.
    """
    model = built_once(tmp_path_factory, "rehearsal-model", rehearsal_rows.build_model)
    tmp = tmp_path_factory.mktemp(f"newest-{share}")
    folders = rehearsal_rows.build_folders(model, tmp / "folders")
    return rehearsal_rows.run_rows("newest", rehearsal_rows.newest_rows(share), folders, tmp, fresh_store(tmp), None)


def newest_share_tests(share: str):
    """The module fixture ``results`` and the parametrized ``test_row`` of one share of the newest verl's table,
    for a test file to bind at module level (``results, test_row = newest_share_tests("clean")``): the three
    share files differ only in their share."""

    @pytest.fixture(scope="module")
    def results(tmp_path_factory) -> dict:
        return newest_results(tmp_path_factory, share)

    @pytest.mark.slow
    @pytest.mark.timeout(1800)  # the first row waits for the whole share (a second or two a row, more when busy)
    @pytest.mark.parametrize("row", rehearsal_rows.newest_rows(share))
    def test_row(row, results):
        check_row(row, "newest", results)

    return results, test_row
