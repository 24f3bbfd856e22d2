"""The dry run's table on verl 0.5.0, the guide's: every row where the two verls differ, and a row of each
kind (tests/rehearsal_rows.guide_rows): the rest expect the same on both and run on the newest only
(tests/test_dry_run_rehearsal_newest_*.py). Rows 0.5.0 lacks (a key or a code path) are not parametrized here.
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
    return rehearsal_rows.run_rows(WHICH, rehearsal_rows.guide_rows(), folders, tmp, fresh_store(tmp), guide_verl)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first row waits for the whole table (a few seconds a row, more on a busy machine)
@pytest.mark.parametrize("row", rehearsal_rows.guide_rows())
def test_row(row, results):
    check_row(row, WHICH, results)
