"""One name per meaning: search and compare read verl 0.9's validation name as verl 0.5.0's, in a real store.

verl 0.9.x logs validation accuracy as ``val-core/openai/gsm8k/acc/mean@1``; verl 0.5.0 and the local trainer
as ``val-core/openai/gsm8k/reward/mean@1`` (both become ``..._at_1`` in MLflow). The trial here is a small
script standing in for the train step: it logs through verl's real ``Tracking`` into the trial's MLflow run
(as verl does through MLFLOW_RUN_ID), under verl 0.9's name only.
"""

from __future__ import annotations

import sys
import textwrap

import mlflow
import optuna
import pytest
from mlflow.tracking import MlflowClient

from verlflow.compare.comparison import compare_runs
from verlflow.names import VAL_ACCURACY, VAL_ACCURACY_VERL09, canonical_metric, find_metric
from verlflow.search.trial import TrialRunner
from verlflow.tracking import tracking

VERL09_TRIAL = textwrap.dedent("""
    from verl.utils.tracking import Tracking

    logger = Tracking(project_name="p", experiment_name="e", default_backend=["mlflow"])
    for step, value in [(1, 0.25), (2, 0.5)]:
        logger.log(data={"val-core/openai/gsm8k/acc/mean@1": value, "timing_s/step": 1.0}, step=step)
    logger.finish()
""")


class Verl09Trials(TrialRunner):
    """Trials whose training logs only verl 0.9's validation name."""

    def command(self):
        return [sys.executable, "-c", VERL09_TRIAL]


def test_the_map_reads_either_spelling_of_either_version():
    assert canonical_metric(VAL_ACCURACY_VERL09) == VAL_ACCURACY
    assert canonical_metric("val-core/openai/gsm8k/acc/mean@1") == VAL_ACCURACY
    assert find_metric({VAL_ACCURACY_VERL09: 0.5}, VAL_ACCURACY) == 0.5
    assert find_metric({"actor/pg_loss": 0.5}, VAL_ACCURACY) is None


@pytest.mark.slow
def test_a_search_whose_trials_log_verl09_names_finds_its_objective(tracking_uri, tmp_path):
    experiment_id = mlflow.create_experiment("search-verl09")
    parent = MlflowClient().create_run(experiment_id, run_name="search")
    runner = Verl09Trials(recipe="smoke", device="cpu", data_dir=str(tmp_path), parent_run_id=parent.info.run_id,
                          experiment_id=experiment_id, study_name="s", metric=VAL_ACCURACY,
                          tracking_uri=tracking_uri, poll_interval=0.2)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", study_name="s",
                                direction="maximize")
    study.optimize(lambda trial: runner(trial, {}), n_trials=1)
    trial = study.trials[0]
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert trial.value == 0.5  # the last validation value
    assert trial.intermediate_values == {1: 0.25, 2: 0.5}  # what pruning saw, step by step


def _train_run(name: str, val_name: str, values: list[float]) -> str:
    with tracking.tracked_run(run_name=name, tags={"verlflow.step": "train"}) as run:
        for step, value in enumerate(values, start=1):
            tracking.log_metrics({"timing_s/step": 2.0, "critic/score/mean": 0.1 * step, val_name: value},
                                 step=step)
        tracking.log_run_summaries(run.info.run_id, 0.0, ended_at=10.0)
    return run.info.run_id


def test_compare_draws_the_validation_curve_of_a_050_run_and_a_09_run(tracking_uri, tmp_path):
    old = _train_run("verl-0.5.0", "val-core/openai/gsm8k/reward/mean@1", [0.2, 0.4])
    new = _train_run("verl-0.9", "val-core/openai/gsm8k/acc/mean@1", [0.2, 0.5])
    assert VAL_ACCURACY not in MlflowClient().get_run(new).data.metrics  # only 0.9's name is in the run

    result = compare_runs(old, new, str(tmp_path / "out"))

    assert result.baseline.histories[VAL_ACCURACY] == [(1, 0.2), (2, 0.4)]
    assert result.candidate.histories[VAL_ACCURACY] == [(1, 0.2), (2, 0.5)]
    row = next(r for r in result.parity if r.key == VAL_ACCURACY)
    assert row.steps == [1, 2]
    assert (tmp_path / "out" / "curves" / "val-core_openai_gsm8k_reward_mean_at_1.png").is_file()
