"""Every step finds its recipe's data with no data_dir: where `main` put it, or made on the spot when it can be.

`main` preprocesses a recipe's data into data/<data_source> (the smoke recipe's into data/synthetic-easy, the
tiny one's into data/synthetic); train, search and evaluate run after it in the same folder must use that data
without being told (the session's tiny chain, tests/tiny_chain.py, runs them in process), and `-e train` in
another folder reuses it. A recipe whose data comes from the hub and is not there must stop before any run
exists, naming the command that fixes it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
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
    # `-e evaluate` of that train run, as a user starts it (the entry point's `mlflow run`): the run's own data.
    (latest,) = client.search_runs(["0"], "tags.`verlflow.step` = 'train'", max_results=1,
                                   order_by=["attributes.start_time DESC"])
    evaluate = _mlflow_run(tmp_path / "b", env, "-e", "evaluate", "-P", f"model_uri=runs:/{latest.info.run_id}",
                           "-P", "limit=16")
    assert "preparing the recipe's data" not in evaluate.stdout
    (evaluation,) = client.search_runs(["0"], "tags.`verlflow.step` = 'evaluate'")
    assert evaluation.info.status == "FINISHED" and evaluation.data.metrics["eval/gsm8k/num_samples"] == 16
    assert not (tmp_path / "b" / "data").exists()
    assert len(client.search_runs(["0"], "tags.`verlflow.step` = 'preprocess'")) == 1


@pytest.mark.slow
def test_train_search_and_evaluate_after_main_find_mains_data(tiny_chain):
    # The session's tiny chain (tests/tiny_chain.py): main, then train, search and evaluate in main's folder, none
    # told where the data is. The same chain as the smoke one, minus the warm start.
    data = tiny_chain.root / "data" / "synthetic"  # main: the tiny recipe's data into data/synthetic
    assert (data / "train.parquet").is_file()
    for step in ("train", "search", "evaluate"):
        assert "preparing the recipe's data" not in tiny_chain.printed[step], step

    client = MlflowClient(tracking_uri=tiny_chain.server.url)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    by_step: dict[str, list] = {}
    for run in runs:
        by_step.setdefault(run.data.tags.get("verlflow.step", ""), []).append(run)
    assert len(by_step["preprocess"]) == 1  # main's (reused by the second main); no step made data again
    trains = by_step["train"]  # main's, the standalone one and the two trials
    assert len(trains) == 4 and {r.info.status for r in trains} == {"FINISHED"}
    assert {r.data.params["data/train_files"] for r in trains} == {str(data / "train.parquet")}
    standalone_eval = [r for r in by_step["evaluate"] if "mlflow.parentRunId" not in r.data.tags]
    assert len(standalone_eval) == 1 and standalone_eval[0].info.status == "FINISHED"
    assert standalone_eval[0].data.tags["verlflow.model_uri"] == f"models:/{MODEL_NAME}@challenger"
    assert standalone_eval[0].data.metrics["eval/gsm8k/num_samples"] == 16
    (search_run,) = by_step["search"]
    assert search_run.info.status == "FINISHED"
