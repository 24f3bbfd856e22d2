"""main: `mlflow run .` chains preprocess → train → register → evaluate → promote, and reuses on a rerun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from verlflow import pipeline
from verlflow.errors import VerlflowError

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "tiny-qwen3-gsm8k-smoke"  # the smoke recipe's verlflow.model_name


def _mlflow_run(workdir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")}
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    proc = subprocess.run([str(mlflow_cli), "run", ".", "--env-manager", "local"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _children(client: MlflowClient, parent_id: str) -> dict[str, object]:
    runs = client.search_runs(["0"], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    return {r.data.tags["verlflow.step"]: r for r in runs}


@pytest.mark.slow
def test_main_twice_on_the_embedded_default(tmp_path, monkeypatch):
    """The README's command in a fresh working copy: a parent with FINISHED children, then reuse."""
    work = tmp_path / "project"
    work.mkdir()
    for name in ("MLproject", "conda.yaml"):
        shutil.copy(REPO_ROOT / name, work / name)
    shutil.copytree(REPO_ROOT / "entry_points", work / "entry_points")

    _mlflow_run(work)
    uri = f"sqlite:///{work / 'mlflow.db'}"  # MLflow's embedded default, in the working directory
    monkeypatch.chdir(work)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    (parent,) = client.search_runs(["0"], "tags.`verlflow.step` = 'main'")
    assert parent.info.status == "FINISHED"
    children = _children(client, parent.info.run_id)
    assert sorted(children) == sorted(pipeline.STEPS)
    assert {r.info.status for r in children.values()} == {"FINISHED"}
    assert parent.data.params["recipe"] == "smoke"  # logged by `mlflow run` itself

    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")
    assert client.get_model_version_by_alias(MODEL_NAME, "challenger").version == champion.version
    assert champion.tags["source_run_id"] == children["train"].info.run_id
    assert champion.tags["data.digest"] == children["preprocess"].data.tags["data.digest"]
    assert {"device.type", "device.name", "verlflow.recipe", "eval.gsm8k.accuracy"} <= set(champion.tags)
    assert children["evaluate"].data.tags["verlflow.source_run_id"] == children["train"].info.run_id
    generator = mlflow.transformers.load_model(f"models:/{MODEL_NAME}@champion")
    assert generator("Ava has 3 apples.", max_new_tokens=3, do_sample=False)[0]["generated_text"]

    second = _mlflow_run(work)
    assert f"preprocess: reusing FINISHED run {children['preprocess'].info.run_id}" in second.stdout
    assert f"train: reusing FINISHED run {children['train'].info.run_id}" in second.stdout
    parents = client.search_runs(["0"], "tags.`verlflow.step` = 'main'", order_by=["attributes.start_time DESC"])
    rerun = parents[0]
    assert len(parents) == 2 and rerun.info.status == "FINISHED"
    assert rerun.data.tags["verlflow.reused_run_id.preprocess"] == children["preprocess"].info.run_id
    assert rerun.data.tags["verlflow.reused_run_id.train"] == children["train"].info.run_id
    assert sorted(_children(client, rerun.info.run_id)) == ["evaluate", "promote", "register"]
    # The same checkpoint again: a new, equal version becomes challenger; champion does not move.
    challenger = client.get_model_version_by_alias(MODEL_NAME, "challenger")
    assert int(challenger.version) == int(champion.version) + 1
    assert challenger.tags["eval.gsm8k.accuracy"] == champion.tags["eval.gsm8k.accuracy"]
    assert client.get_model_version_by_alias(MODEL_NAME, "champion").version == champion.version
    assert "stays on version" in second.stdout
    assert client.search_runs(["0"], "attributes.status = 'RUNNING'") == []


@pytest.mark.parametrize("recipe, overrides, message", [
    ("nope", "", "unknown recipe 'nope'"),
    ("smoke", "actor_rollout_ref.actor.optim.lrr=1", "unknown config key 'actor_rollout_ref.actor.optim.lrr'"),
])
def test_bad_input_fails_before_any_run(tracking_uri, recipe, overrides, message):
    with pytest.raises(VerlflowError, match=message):
        pipeline.run_main(recipe, "cpu", "", "", overrides)
    assert mlflow.search_runs(search_all_experiments=True).empty


def test_a_step_that_fails_leaves_its_child_and_the_parent_failed(tracking_uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(VerlflowError, match="source folder 'missing/folder' does not exist"):
        pipeline.run_main("smoke", "cpu", "missing/folder", "", "")
    runs = MlflowClient().search_runs(["0"])
    assert {r.data.tags["verlflow.step"]: r.info.status for r in runs} == {"main": "FAILED", "preprocess": "FAILED"}
