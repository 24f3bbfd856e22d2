"""Every row of the dry run's table on the installed (newest) verl: mistakes named, legal variations clean.

The table and its folders are in tests/rehearsal_rows.py; tests/test_dry_run_rehearsal_guide.py runs the same
rows on verl 0.5.0. The rows run in one subprocess (one ``cli.main`` each, a real SQLite store), computed
once for the module.
"""

from __future__ import annotations

import pytest
import rehearsal_rows
from conftest import built_once, fresh_store
from rehearsal_checks import check_row

WHICH = "newest"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    model = built_once(tmp_path_factory, "rehearsal-model", rehearsal_rows.build_model)
    tmp = tmp_path_factory.mktemp(WHICH)
    folders = rehearsal_rows.build_folders(model, tmp / "folders")
    return rehearsal_rows.run_rows(WHICH, folders, tmp, fresh_store(tmp), None)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first row waits for the whole table (a few seconds a row, more on a busy machine)
@pytest.mark.parametrize("row", list(rehearsal_rows.ROWS))
def test_row(row, results):
    check_row(row, WHICH, results)
