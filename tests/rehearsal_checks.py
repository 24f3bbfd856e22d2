"""What a row of the dry run's table must show (tests/rehearsal_rows.py), asserted the same on every verl."""

from __future__ import annotations

import re

import pytest
import rehearsal_rows

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
