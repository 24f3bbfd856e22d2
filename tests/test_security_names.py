"""Names that become files stay inside their root: ``search --study_name ../../x`` is one line, exit 2, before
anything is prepared (it wrote its journal and trial checkpoints outside the project)."""

from __future__ import annotations

import os

import pytest
from conftest import cli_in_process

from verlflow.errors import VerlflowError
from verlflow.util import check_name_inside


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "", "x\\y", "bad\nname", "/abs"])
def test_a_name_that_leaves_or_nests_in_its_root_is_refused(name):
    with pytest.raises(VerlflowError, match=r"would name a file outside optuna/"):
        check_name_inside(name, "study_name", "optuna")


def test_plain_names_pass():
    for name in ("qwen3-4b-gsm8k-grpo-lr_kl", "s1", "run.2", "搜索"):
        assert check_name_inside(name, "study_name", "optuna") == name


def test_search_with_an_escaping_study_name_is_one_line_and_writes_nothing(tmp_path):
    work = tmp_path / "project" / "sub"
    work.mkdir(parents=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    env.pop("MLFLOW_RUN_ID", None)
    done = cli_in_process(["search", "--device", "cpu", "--recipe", "tiny", "--n_trials", "1",
                           "--study_name", "../../escaped"],
                          env=env, cwd=work)
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("verlflow search: error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    assert "study_name '../../escaped'" in errors[0] and "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("escaped*"))
    assert not (work / "data").exists() and not (work / "optuna").exists()  # refused before any work
