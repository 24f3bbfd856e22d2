"""Every row of the dry run's table on verl 0.5.0, the guide's: the rows whose start-up code it shares.

Rows that depend on a key or a code path 0.5.0 lacks are skipped with the reason (tests/rehearsal_rows.py).
"""

from __future__ import annotations

import pytest
import rehearsal_rows
from conftest import built_once, fresh_store
from rehearsal_checks import check_row

WHICH = "guide"


@pytest.fixture(scope="module")
def results(tmp_path_factory, guide_verl) -> dict:
    model = built_once(tmp_path_factory, "rehearsal-model", rehearsal_rows.build_model)
    tmp = tmp_path_factory.mktemp(WHICH)
    folders = rehearsal_rows.build_folders(model, tmp / "folders")
    return rehearsal_rows.run_rows(WHICH, folders, tmp, fresh_store(tmp), guide_verl)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first row waits for the whole table (a few seconds a row, more on a busy machine)
@pytest.mark.parametrize("row", list(rehearsal_rows.ROWS))
def test_row(row, results):
    check_row(row, WHICH, results)
