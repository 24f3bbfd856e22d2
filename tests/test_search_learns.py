"""A search over the smoke recipe (the one that learns) tells its trials apart, and registers the best.

The search config is the default one with each trial cut to 10 GRPO steps (validation on 128 test problems before
training, after step 5 and after step 10) so that 4 trials fit in a few minutes on 2 cores; the space is the
default one (learning rate, KL coefficient, group size around the smoke recipe's values).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from verlflow.data import gsm8k
from verlflow.step_requests import SearchRequest
from verlflow.steps.search import run_search

REPO = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((REPO / "src/verlflow/config/search/default.yaml").read_text())


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_four_smoke_trials_give_distinct_objectives_and_the_best_is_registered(tmp_path, tracking_uri, monkeypatch,
                                                                               warm_model_cache):
    monkeypatch.setenv("VERLFLOW_CACHE", str(warm_model_cache))
    monkeypatch.chdir(tmp_path)
    gsm8k.preprocess("synthetic-easy", tmp_path / "data", 0, log_to_mlflow=False)
    search = yaml.safe_load(yaml.safe_dump(DEFAULT))
    # 128 of the 512 test problems per validation: the trials' objectives still differ, at a quarter of the cost.
    search["trial"]["overrides"] = {"trainer.total_training_steps": 10, "trainer.test_freq": 5,
                                    "data.val_max_samples": 128}
    config_path = tmp_path / "short.yaml"
    config_path.write_text(yaml.safe_dump(search))

    result = run_search(SearchRequest("smoke", "cpu", 4, study_name="learns", storage=str(tmp_path / "study.journal"),
                                      pruner="none", search_config=str(config_path), data_dir=str(tmp_path / "data")))

    client = MlflowClient()
    experiment_ids = [e.experiment_id for e in client.search_experiments()]
    trials = client.search_runs(experiment_ids, f"tags.`mlflow.parentRunId` = '{result.parent_run_id}' "
                                "and tags.`optuna.trial_number` != ''")
    objectives = [t.data.metrics["val-core/openai/gsm8k/reward/mean_at_1"] for t in trials]
    assert result.trial_counts.get("COMPLETE") == 4 and len(objectives) == 4
    assert len(set(objectives)) >= 3, objectives
    assert result.best_value == max(objectives)
    assert result.best_run_id in {t.info.run_id for t in trials}
    (registered,) = client.search_model_versions(f"tags.source_run_id = '{result.best_run_id}'")
    assert str(registered.version) == str(getattr(result.registered, "version", ""))
