"""The dry run's table on the installed (newest) verl, rows that must pass: legal variations (the guide's own
launch lines among them) clean, and those that pass with a warning naming their key.

The table, its folders and its shares are in tests/rehearsal_rows.py: one file a share of the row kinds, so the
suite's workers split the table (the other shares: the other test_dry_run_rehearsal_newest_*.py files);
tests/test_dry_run_rehearsal_guide.py runs rows on verl 0.5.0. A share's rows run in one subprocess (one
``cli.main`` each, a real SQLite store), computed once for the module.
"""

from __future__ import annotations

import rehearsal_rows
from rehearsal_checks import newest_share_tests

results, test_row = newest_share_tests("clean")


def test_every_kind_of_row_runs_in_one_newest_share():
    """A row of a new kind would run nowhere on the newest verl unless a share names its kind."""
    shares = [kind for kinds in rehearsal_rows.NEWEST_SHARES.values() for kind in kinds]
    assert sorted(shares) == sorted(set(shares)), "a kind is in two shares"
    assert {row.kind for row in rehearsal_rows.ROWS.values()} == set(shares)
