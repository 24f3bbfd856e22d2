"""promote: an alias moves only to a strictly better version (unless forced), and survives a race."""

from __future__ import annotations

import os
import subprocess
import sys

import mlflow
import pytest
from conftest import isolated_store
from mlflow.tracking import MlflowClient
from registry_versions import evaluated_version

from verlflow.errors import VerlflowError
from verlflow.models import registry

NAME = "promo"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One real SQLite store for the module (creating one costs seconds); artifacts go beside it."""
    root = tmp_path_factory.mktemp("promote-store")
    with isolated_store(root) as uri:
        yield uri


@pytest.fixture
def client(store) -> MlflowClient:
    """A client on the module's store, with an empty registered model ``promo`` (recreated per test)."""
    c = MlflowClient()
    if c.search_registered_models(filter_string=f"name = '{NAME}'"):
        c.delete_registered_model(NAME)
    c.create_registered_model(NAME)
    return c


def _version(client: MlflowClient, accuracy: float | None = None, *, score_mean: float | None = None) -> str:
    """A real model version (source: its own run's artifact folder), scored by tag or by run metric."""
    with mlflow.start_run() as run:
        if score_mean is not None:
            mlflow.log_metric("critic/score/mean", score_mean)
    tags = {"source_run_id": run.info.run_id}
    if accuracy is not None:
        tags["eval.gsm8k.accuracy"] = str(accuracy)
    mv = client.create_model_version(NAME, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id,
                                     tags=tags)
    return str(mv.version)


def _holder(client: MlflowClient, alias: str = "champion") -> str:
    return str(client.get_model_version_by_alias(NAME, alias).version)


def test_champion_moves_only_to_a_strictly_better_version(client, capsys):
    v1 = _version(client, 0.25)
    first = registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False)
    assert (first.moved, first.version, _holder(client)) == (True, v1, v1)

    _version(client, 0.25)  # equal: stays
    same = registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False)
    assert (same.moved, _holder(client)) == (False, v1)
    assert "not strictly better" in capsys.readouterr().out

    v3 = _version(client, 0.5)
    better = registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False)
    assert (better.moved, better.previous_version, _holder(client)) == (True, v1, v3)
    out = capsys.readouterr().out
    assert f"version {v1} → version {v3}" in out and "0.5 is better than 0.25" in out
    run = client.get_run(better.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["promote.moved"] == "true"


def test_champion_moves_only_when_the_gain_on_the_same_problems_exceeds_the_noise(client, capsys):
    """0.441 → 0.459 on 512 problems (40 won, 31 lost: 9 net) is noise; 80 won, 10 lost is not."""
    champion = [i < 226 for i in range(512)]  # 226/512 = 0.441
    v1 = evaluated_version(client, NAME, champion)
    client.set_registered_model_alias(NAME, "champion", v1)
    close = [not right if (i < 31 or 226 <= i < 266) else right for i, right in enumerate(champion)]
    evaluated_version(client, NAME, close)  # 235/512 = 0.459
    kept = registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False)
    assert (kept.moved, _holder(client)) == (False, v1)
    out = capsys.readouterr().out
    assert "is within the noise: +1.8 points, 95% interval [" in out and "over 512 paired problems" in out
    assert "won 40, lost 31, exact McNemar p = " in out
    tags = client.get_run(kept.run_id).data.tags
    assert float(tags["promote.gain_low"]) < 0 < float(tags["promote.gain_high"])
    assert tags["promote.test"] == "paired" and tags["promote.problems"] == "512"
    assert tags["promote.comparisons"] == "1"

    clear = [not right if (i < 10 or 226 <= i < 306) else right for i, right in enumerate(champion)]
    v3 = evaluated_version(client, NAME, clear)  # 296/512 = 0.578
    moved = registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False)
    assert (moved.moved, moved.previous_version, _holder(client)) == (True, v1, v3)
    # the best of two challengers (v2, v3): the interval is at 1 - 0.05 / 2
    out = capsys.readouterr().out
    assert "beyond the noise: +13.7 points, 97.5% interval [" in out and "best of 2 candidates" in out
    tags = client.get_run(moved.run_id).data.tags
    assert float(tags["promote.gain_low"]) > 0 and tags["promote.comparisons"] == "2"


def test_four_problems_won_and_none_lost_of_1319_do_not_move_the_champion(client, capsys):
    """Exact McNemar p = 0.0625 one-sided: the Wald interval of before promoted on it (issue 42)."""
    champion = [i < 700 for i in range(1319)]
    v1 = evaluated_version(client, NAME, champion)
    client.set_registered_model_alias(NAME, "champion", v1)
    evaluated_version(client, NAME, [right or 700 <= i < 704 for i, right in enumerate(champion)])
    kept = registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False)
    assert (kept.moved, _holder(client)) == (False, v1)
    assert "won 4, lost 0, exact McNemar p = 0.062" in capsys.readouterr().out


def test_the_paired_test_reads_the_tables_whatever_experiment_is_active(client, capsys, monkeypatch):
    """Issue 46: mlflow.load_table searched only the active experiment; tables are now read by run. The other
    experiment is made active the way ``mlflow run --experiment-name`` does it for a step: MLFLOW_EXPERIMENT_ID."""
    champion = [i < 226 for i in range(512)]
    v1 = evaluated_version(client, NAME, champion)
    client.set_registered_model_alias(NAME, "champion", v1)
    evaluated_version(client, NAME, [not r if (i < 31 or 226 <= i < 266) else r for i, r in enumerate(champion)])
    evaluated_in = client.get_run(client.get_model_version(NAME, v1).run_id).info.experiment_id
    elsewhere = client.get_experiment_by_name("somewhere-else")
    elsewhere_id = elsewhere.experiment_id if elsewhere else client.create_experiment("somewhere-else")
    assert elsewhere_id != evaluated_in
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", elsewhere_id)
    kept = registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False)
    assert kept.gain is not None and kept.gain.method == "paired" and kept.gain.problems == 512
    assert "over 512 paired problems" in capsys.readouterr().out


def test_a_search_best_counts_as_the_best_of_its_trials(client):
    """A search picks its best trial on the validation reward of the same test problems: best of k there too."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    champion = [i < 226 for i in range(512)]
    v1 = evaluated_version(client, NAME, champion)
    client.set_registered_model_alias(NAME, "champion", v1)
    with mlflow.start_run() as search:
        mlflow.set_tag("verlflow.step", "search")
        mlflow.log_metrics({"search/trials_complete": 4, "search/trials_pruned": 1, "search/trials_fail": 2})
    with mlflow.start_run(tags={MLFLOW_PARENT_RUN_ID: search.info.run_id}) as trial:
        mlflow.log_table({"question": [f"problem {i}" for i in range(512)],
                          "correct": [not r if (i < 10 or 226 <= i < 306) else r for i, r in enumerate(champion)]},
                         artifact_file="eval/gsm8k_predictions.json")
    client.create_model_version(NAME, source=f"{trial.info.artifact_uri}/model", run_id=trial.info.run_id, tags={
        "source_run_id": trial.info.run_id, "eval.run_id": trial.info.run_id, "eval.gsm8k.accuracy": str(296 / 512),
        "eval.gsm8k.num_samples": "512"})
    moved = registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False)
    assert moved.moved and moved.gain.comparisons == 5  # 4 complete + 1 pruned trials
    assert moved.gain.confidence == 0.99


def test_force_moves_to_the_best_even_when_only_equal(client):
    v1 = _version(client, 0.25)
    client.set_registered_model_alias(NAME, "champion", v1)
    v2 = _version(client, 0.25)
    assert not registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False).moved
    forced = registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", True)
    assert (forced.moved, _holder(client)) == (True, v2)


def test_other_metrics_come_from_the_source_run(client):
    _version(client, score_mean=0.1)
    v2 = _version(client, score_mean=0.3)
    _version(client)  # no value: not a candidate
    decision = registry.promote_best(NAME, "critic/score/mean", "best-train-score", False)
    assert (decision.version, decision.value) == (v2, 0.3)
    assert _holder(client, "best-train-score") == v2


@pytest.mark.slow
def test_racing_promotion_never_leaves_champion_on_the_worse_version(client):
    """Our promotion decides on v1 from an old view; another process promotes v2 before our write lands."""
    v1 = _version(client, 0.2)
    v2 = _version(client)  # not evaluated yet when we read the registry
    raced = []

    def other_promotion_interleaves() -> None:
        if raced:
            return
        raced.append(True)
        client.set_model_version_tag(NAME, v2, "eval.gsm8k.accuracy", "0.9")
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
        proc = subprocess.run([sys.executable, "-m", "verlflow.cli", "promote", "--model_name", NAME],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert _holder(client) == v2

    decision = registry.promote_alias(client, NAME, "eval/gsm8k/accuracy", "champion", False,
                                      before_write=other_promotion_interleaves)
    assert raced
    assert _holder(client) == v2  # our stale write of v1 was repaired
    assert decision.version == v2
    assert v1 != v2


@pytest.mark.parametrize("alias", ["v3", "latest", "bad alias!"])
def test_an_alias_mlflow_rejects_is_one_line_and_opens_no_run(client, alias):
    _version(client, 0.5)
    before = len(mlflow.search_runs(search_all_experiments=True))
    with pytest.raises(VerlflowError, match=f"alias '{alias}' is rejected by MLflow") as info:
        registry.promote_best(NAME, "eval/gsm8k/accuracy", alias, False)
    assert "\n" not in str(info.value)
    assert len(mlflow.search_runs(search_all_experiments=True)) == before


def test_unknown_model_and_unscored_versions_are_refused(client):
    with pytest.raises(VerlflowError, match="no registered model 'nope'"):
        registry.promote_best("nope", "eval/gsm8k/accuracy", "champion", False)
    _version(client)
    with pytest.raises(VerlflowError, match="no version of 'promo' has a value for 'eval/gsm8k/accuracy'"):
        registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False)
    assert mlflow.search_runs(search_all_experiments=True, filter_string="attributes.status = 'RUNNING'").empty
