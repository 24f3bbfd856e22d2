"""main: `mlflow run .` chains preprocess → evaluate the start → train → register → evaluate → promote.

The README's command on the embedded default (the smoke recipe: a warm-started tiny Qwen3, GRPO on the
CPU) must make the model measurably better, promote it because it is better, reuse what it can on a
rerun, and keep the alias when a worse setting is tried. The first run is the plain `mlflow run .` (MLflow
files it in Default); the rerun follows the README and names the experiment, and still redoes nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from verlflow import names as metrics
from verlflow.errors import VerlflowError
from verlflow.step_requests import MainRequest
from verlflow.steps import main as pipeline

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "tiny-qwen3-gsm8k-smoke"  # the smoke recipe's verlflow.model_name


def _mlflow_run(workdir: Path, cache: Path, *params: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")}
    env["VERLFLOW_CACHE"] = str(cache)  # the warm-started model, built once per session
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    started = time.monotonic()
    proc = subprocess.run([str(mlflow_cli), "run", ".", "--env-manager", "local", *params], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=1500)
    # A figure, not an assertion: the README promises a few minutes on a 2-core laptop.
    print(f"`mlflow run . --env-manager local {' '.join(params)}` took {time.monotonic() - started:.0f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _children(client: MlflowClient, parent_id: str, experiment_id: str = "0") -> dict[str, object]:
    """A parent's child runs by step (``evaluate_base`` for the starting model's evaluation)."""
    runs = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    base = {metrics.EVAL_ROLE_TAG: "base"}.items()
    return {pipeline.BASE_EVAL if base <= r.data.tags.items() else r.data.tags["verlflow.step"]: r for r in runs}


def _quarter_means(client: MlflowClient, run_id: str, key: str) -> tuple[float, float]:
    values = [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
    quarter = max(1, len(values) // 4)
    return sum(values[:quarter]) / quarter, sum(values[-quarter:]) / quarter


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_main_on_the_embedded_default_learns_promotes_and_reuses(tmp_path, monkeypatch, warm_model_cache):
    """The README's command in a fresh working copy, three times: learn, rerun (reuse), a worse setting."""
    work = tmp_path / "project"
    work.mkdir()
    for name in ("MLproject", "conda.yaml"):
        shutil.copy(REPO_ROOT / name, work / name)
    shutil.copytree(REPO_ROOT / "entry_points", work / "entry_points")

    first = _mlflow_run(work, warm_model_cache)
    uri = f"sqlite:///{work / 'mlflow.db'}"  # MLflow's embedded default, in the working directory
    monkeypatch.chdir(work)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    (parent,) = client.search_runs(["0"], "tags.`verlflow.step` = 'main'")
    assert parent.info.status == "FINISHED"
    children = _children(client, parent.info.run_id)
    assert sorted(children) == sorted([*pipeline.CHAIN, pipeline.BASE_EVAL])
    assert {r.info.status for r in children.values()} == {"FINISHED"}
    assert parent.data.params["recipe"] == "smoke"  # logged by `mlflow run` itself

    # GRPO made the model better: on the same >= 256 held-out problems, by >= 5 points of strict accuracy.
    base, trained = children[pipeline.BASE_EVAL].data.metrics, children["evaluate"].data.metrics
    assert base[metrics.EVAL_NUM_SAMPLES] == trained[metrics.EVAL_NUM_SAMPLES] >= 256
    gain = trained[metrics.EVAL_ACCURACY] - base[metrics.EVAL_ACCURACY]
    assert gain >= 0.05, (base[metrics.EVAL_ACCURACY], trained[metrics.EVAL_ACCURACY])
    assert parent.data.metrics[metrics.EVAL_ACCURACY_BASE] == base[metrics.EVAL_ACCURACY]
    assert parent.data.metrics[metrics.EVAL_ACCURACY_GAIN] == pytest.approx(gain)
    assert f"accuracy {base[metrics.EVAL_ACCURACY]:.4f} → {trained[metrics.EVAL_ACCURACY]:.4f}" in first.stdout
    # ... and the curves show it: the training reward and the validation accuracy rise.
    train_id = children["train"].info.run_id
    early, late = _quarter_means(client, train_id, metrics.SCORE_MEAN)
    assert late > early, (early, late)
    validation = sorted(client.get_metric_history(train_id, metrics.VAL_ACCURACY), key=lambda m: m.step)
    assert validation[0].step == 0 and validation[-1].value > validation[0].value

    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")
    assert client.get_model_version_by_alias(MODEL_NAME, "challenger").version == champion.version
    assert champion.tags["source_run_id"] == children["train"].info.run_id
    assert champion.tags["data.digest"] == children["preprocess"].data.tags["data.digest"]
    assert {"device.type", "device.name", "verlflow.recipe", "eval.gsm8k.accuracy"} <= set(champion.tags)
    assert children["evaluate"].data.tags["verlflow.source_run_id"] == children["train"].info.run_id
    generator = mlflow.transformers.load_model(f"models:/{MODEL_NAME}@champion")
    assert generator("Ava has 3 apples.", max_new_tokens=3, do_sample=False)[0]["generated_text"]

    # The README's command names the experiment: the rerun is filed there and reuses every step run in Default.
    second = _mlflow_run(work, warm_model_cache, "--experiment-name", "verlflow/smoke")
    for step in ("preprocess", "train", pipeline.BASE_EVAL, "evaluate"):
        assert f"{step}: reusing FINISHED run {children[step].info.run_id}" in second.stdout, step
    named = client.get_experiment_by_name("verlflow/smoke").experiment_id
    (rerun,) = client.search_runs([named], "tags.`verlflow.step` = 'main'")
    assert rerun.info.status == "FINISHED"
    assert rerun.data.tags["verlflow.reused_run_id.preprocess"] == children["preprocess"].info.run_id
    assert rerun.data.tags["verlflow.reused_run_id.train"] == children["train"].info.run_id
    assert sorted(_children(client, rerun.info.run_id, named)) == ["promote", "register"]
    # The same train run again: its version is returned, not registered twice; champion does not move.
    assert [v.version for v in client.search_model_versions(f"name='{MODEL_NAME}'")] == [champion.version]
    assert client.get_model_version_by_alias(MODEL_NAME, "challenger").version == champion.version
    assert client.get_model_version_by_alias(MODEL_NAME, "champion").version == champion.version
    assert f"already {MODEL_NAME} version {champion.version}: not registered again" in second.stdout
    assert "stays on version" in second.stdout
    assert f"champion = version {champion.version} (kept: " in second.stdout  # which version, and why

    # A worse setting (no learning at all) trains and registers a new version that does not take the alias.
    worse_setting = "overrides=actor_rollout_ref.actor.optim.lr=0 trainer.total_training_steps=4"
    third = _mlflow_run(work, warm_model_cache, "--experiment-name", "verlflow/smoke", "-P", worse_setting)
    assert "train: run " in third.stdout and "stays on version" in third.stdout
    assert client.get_model_version_by_alias(MODEL_NAME, "champion").version == champion.version
    worse = client.get_model_version_by_alias(MODEL_NAME, "challenger")
    assert float(worse.tags["eval.gsm8k.accuracy"]) < float(champion.tags["eval.gsm8k.accuracy"])
    assert client.search_runs(["0", named], "attributes.status = 'RUNNING'") == []


@pytest.mark.parametrize("recipe, overrides, message", [
    ("nope", "", "unknown recipe 'nope'"),
    ("smoke", "actor_rollout_ref.actor.optim.lrr=1", "unknown config key 'actor_rollout_ref.actor.optim.lrr'"),
])
def test_bad_input_fails_before_any_run(tracking_uri, recipe, overrides, message):
    with pytest.raises(VerlflowError, match=message):
        pipeline.run_main(MainRequest(recipe, "cpu", "", "", overrides))
    assert mlflow.search_runs(search_all_experiments=True).empty


def test_a_step_that_fails_leaves_its_child_and_the_parent_failed(tracking_uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(VerlflowError, match="source folder 'missing/folder' does not exist"):
        pipeline.run_main(MainRequest("smoke", "cpu", "missing/folder", "", ""))
    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("verlflow/smoke").experiment_id])
    assert {r.data.tags["verlflow.step"]: r.info.status for r in runs} == {"main": "FAILED", "preprocess": "FAILED"}
