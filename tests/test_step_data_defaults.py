"""Every step finds its recipe's data with no data_dir: where `main` put it, or made on the spot when it can be.

`main` preprocesses a recipe's data into data/<data_source> (the smoke recipe's into data/synthetic-easy, the
tiny one's into data/synthetic); `-e train`, `-e search` and `-e evaluate` run after it in the same folder
must use that data without being told. A recipe whose data
comes from the hub and is not there must stop before any run exists, naming the command that fixes it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import cli_in_process, fresh_store
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "tiny-qwen3-gsm8k-tiny"  # the tiny recipe's verlflow.model_name


def _project(root: Path) -> Path:
    """A working copy of the MLflow project, as a user's clone (no data, no store)."""
    root.mkdir()
    for name in ("MLproject", "conda.yaml"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "entry_points", root / "entry_points")
    return root


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")}
    return {**env, **extra}


def _mlflow_run(work: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    done = subprocess.run([str(mlflow_cli), "run", ".", "--env-manager", "local", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _all_runs(uri: str):
    client = MlflowClient(tracking_uri=uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.mark.parametrize("step", [
    ["train", "--recipe", "tiny", "--device", "cpu", "--overrides", "verlflow.data_source=openai/gsm8k"],
    ["search", "--recipe", "qwen3-4b-gsm8k-grpo", "--device", "cpu", "--n_trials", "1"],
])
def test_missing_hub_data_exits_2_with_the_command_before_any_run(tmp_path, step):
    uri = fresh_store(tmp_path)
    done = cli_in_process([*step], env=_env(MLFLOW_TRACKING_URI=uri), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith(f"verlflow {step[0]}: error:")]
    assert ("`mlflow run . --env-manager local --experiment-name verlflow/data -e preprocess -P source=openai/gsm8k "
            "-P output_dir=data/openai-gsm8k`") in line, line
    assert _all_runs(uri) == []
    assert not (tmp_path / "data").exists()


def test_an_explicit_data_dir_without_splits_is_refused_before_the_run(tmp_path):
    uri = fresh_store(tmp_path)
    (tmp_path / "empty").mkdir()
    done = cli_in_process(["train", "--recipe", "tiny", "--device", "cpu", "--data_dir", "empty"],
                          env=_env(MLFLOW_TRACKING_URI=uri), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert ("data_dir 'empty' has no train.parquet: run `mlflow run . --env-manager local --experiment-name "
            "verlflow/data -e preprocess -P source=synthetic -P output_dir=empty` first") in done.stderr
    assert _all_runs(uri) == []


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_step_prepares_its_synthetic_data_and_another_folder_reuses_it(tmp_path, tiny_workdir):
    uri = fresh_store(tmp_path)
    env = _env(MLFLOW_TRACKING_URI=uri, VERLFLOW_CACHE=str(tiny_workdir / "cache"))
    first = _mlflow_run(_project(tmp_path / "a"), env, "-e", "train", "-P", "recipe=tiny",
                        "-P", "overrides=trainer.total_training_steps=1")
    assert "data: data/synthetic has no train.parquet: preparing the recipe's data" in first.stdout
    assert (tmp_path / "a" / "data" / "synthetic" / "test.parquet").is_file()
    client = MlflowClient(tracking_uri=uri)
    (train,) = client.search_runs(["0"], "tags.`verlflow.step` = 'train'")
    (pre,) = client.search_runs(["0"], "tags.`verlflow.step` = 'preprocess'")
    assert {train.info.status, pre.info.status} == {"FINISHED"}
    assert pre.data.tags["mlflow.parentRunId"] == train.info.run_id  # made inside the step's own run
    assert train.data.params["data/train_files"] == str(tmp_path / "a" / "data" / "synthetic" / "train.parquet")

    # Another folder, the same store: the finished preprocess run's data is used, not made again.
    second = _mlflow_run(_project(tmp_path / "b"), env, "-e", "train", "-P", "recipe=tiny",
                         "-P", "overrides=trainer.total_training_steps=1")
    assert f"data: using {tmp_path / 'a' / 'data' / 'synthetic'}" in second.stdout
    assert not (tmp_path / "b" / "data").exists()
    assert len(client.search_runs(["0"], "tags.`verlflow.step` = 'preprocess'")) == 1


def _short_search_config(tmp_path: Path) -> Path:
    data = yaml.safe_load((REPO / "src/verlflow/config/search/default.yaml").read_text())
    data["trial"].update(overrides={"trainer.total_training_steps": 2, "trainer.test_freq": 2}, poll_interval=1)
    data["space"]["actor_rollout_ref.rollout.n"]["choices"] = [2, 4]  # group sizes the tiny recipe's batch takes
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_train_search_and_evaluate_after_main_find_mains_data(tmp_path, tiny_workdir):
    # The tiny recipe (an untrained model, 4 steps): the same chain as the smoke one, minus the warm start.
    work = _project(tmp_path / "project")
    env = _env(VERLFLOW_CACHE=str(tiny_workdir / "cache"))
    _mlflow_run(work, env, "-P", "recipe=tiny")  # main: the tiny recipe's data into data/synthetic
    data = work / "data" / "synthetic"
    assert (data / "train.parquet").is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")

    train = _mlflow_run(work, env, "-e", "train", "-P", "recipe=tiny",
                        "-P", "overrides=trainer.total_training_steps=2")
    search = _mlflow_run(work, env, "-e", "search", "-P", "recipe=tiny", "-P", "n_trials=2",
                         "-P", f"search_config={_short_search_config(tmp_path)}")
    evaluate = _mlflow_run(work, env, "-e", "evaluate", "-P", f"model_uri=models:/{MODEL_NAME}@champion",
                           "-P", "limit=16")
    for done in (train, search, evaluate):
        assert "preparing the recipe's data" not in done.stdout

    runs = client.search_runs(["0"], max_results=1000)
    by_step: dict[str, list] = {}
    for run in runs:
        by_step.setdefault(run.data.tags.get("verlflow.step", ""), []).append(run)
    assert len(by_step["preprocess"]) == 1  # main's; no step made data again
    trains = by_step["train"]  # main's, the standalone one and the two trials
    assert len(trains) == 4 and {r.info.status for r in trains} == {"FINISHED"}
    assert {r.data.params["data/train_files"] for r in trains} == {str(data / "train.parquet")}
    standalone_eval = [r for r in by_step["evaluate"] if r.data.params.get("model_uri", "").endswith("@champion")]
    assert len(standalone_eval) == 1 and standalone_eval[0].info.status == "FINISHED"
    assert standalone_eval[0].data.metrics["eval/gsm8k/num_samples"] == 16
    (search_run,) = by_step["search"]
    assert search_run.info.status == "FINISHED"
