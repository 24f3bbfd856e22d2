"""A train run's checkpoints are MLflow LoggedModels linked to the run at their step; register and evaluate use them.

One real train run of the tiny recipe (4 steps, a checkpoint every 2) through the CLI, on a SQLite store,
then ``register`` and ``evaluate`` through the CLI, and what a user of the MLflow UI or client would see.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
from conftest import CliResult, cli_in_process, slow_setup
from mlflow.tracking import MlflowClient

MODEL_NAME = "tiny-qwen3-gsm8k-tiny"  # the tiny recipe's verlflow.model_name
STEPS = 4


@dataclass
class TrainedRun:
    """A finished tiny train run that saved checkpoints at steps 2 and 4."""

    uri: str
    env: dict[str, str]
    workdir: Path
    data_dir: Path
    run_id: str
    experiment_id: str


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> CliResult:
    done = cli_in_process([*args], env=env, cwd=cwd)
    assert done.returncode == 0, f"verlflow {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
@slow_setup
def trained(tmp_path_factory) -> TrainedRun:
    workdir = tmp_path_factory.mktemp("logged_models")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME")}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{workdir / 'mlflow.db'}"
    env["VERLFLOW_CACHE"] = str(workdir / "cache")
    data_dir = workdir / "data"
    _cli(["preprocess", "--source", "synthetic", "--output_dir", str(data_dir), "--limit", "32"], env, workdir)
    _cli(["train", "--recipe", "tiny", "--device", "cpu", "--data_dir", str(data_dir), "--overrides",
          f"trainer.total_training_steps={STEPS} trainer.save_freq=2 trainer.test_freq=2"], env, workdir)
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                filter_string="tags.`verlflow.step` = 'train'")
    assert run.info.status == "FINISHED"
    return TrainedRun(env["MLFLOW_TRACKING_URI"], env, workdir, data_dir, run.info.run_id, run.info.experiment_id)


@pytest.fixture
def client(trained, monkeypatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", trained.uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(trained.uri)
    return MlflowClient(tracking_uri=trained.uri)


def _models(client: MlflowClient, trained: TrainedRun) -> dict[str, object]:
    found = client.search_logged_models(experiment_ids=[trained.experiment_id],
                                        filter_string=f"source_run_id = '{trained.run_id}'")
    return {m.name: m for m in found}


@pytest.mark.slow
def test_the_train_run_logs_its_final_and_intermediate_checkpoints_as_models_at_their_steps(trained, client):
    models = _models(client, trained)
    assert set(models) == {"model", "checkpoint-2"}
    final, intermediate = models["model"], models["checkpoint-2"]
    assert final.status == intermediate.status == "READY"
    # The run lists both among its outputs at the step that saved them (MLflow's model-step link).
    run = client.get_run(trained.run_id)
    assert {(o.model_id, o.step) for o in run.outputs.model_outputs} == {(final.model_id, STEPS),
                                                                         (intermediate.model_id, 2)}
    # The final model is a loadable MLflow model carrying the run's hyperparameters ...
    assert "MLmodel" in {a.path for a in client.list_logged_model_artifacts(final.model_id)}
    assert final.params["trainer/total_training_steps"] == str(STEPS)
    assert final.tags["verlflow.checkpoint_step"] == str(STEPS)
    # ... the intermediate one names its checkpoint folder and copies nothing.
    assert client.list_logged_model_artifacts(intermediate.model_id) == []
    folder = Path(intermediate.tags["verlflow.checkpoint_dir"])
    assert (folder / "config.json").is_file() and "global_step_2" in folder.parts
    # Each model's page shows the run's training metrics of its own step (system metrics are not by step).
    for model, step in ((final, STEPS), (intermediate, 2)):
        linked = client.get_logged_model(model.model_id).metrics
        assert {m.step for m in linked} == {step}
        assert {m.run_id for m in linked} == {trained.run_id}
        keys = {m.key for m in linked}
        assert {"critic/score/mean", "actor/pg_loss"} <= keys, keys
        assert not any(key.startswith("system/") for key in keys)


@pytest.mark.slow
def test_register_versions_the_runs_own_model_and_evaluations_are_linked_to_the_model_measured(trained, client):
    before = {m.model_id for m in _models(client, trained).values()}
    final = _models(client, trained)["model"]
    _cli(["register", "--run_id", trained.run_id], trained.env, trained.workdir)
    (version,) = client.search_model_versions(f"name='{MODEL_NAME}'")
    # A version of the train run's own LoggedModel: no new model, no second copy, source run = the train run.
    assert version.source == final.model_uri and version.run_id == trained.run_id
    assert {m.model_id for m in _models(client, trained).values()} == before
    _cli(["register", "--run_id", trained.run_id], trained.env, trained.workdir)
    assert [v.version for v in client.search_model_versions(f"name='{MODEL_NAME}'")] == [version.version]

    intermediate = _models(client, trained)["checkpoint-2"]
    for uri, model in ((f"models:/{MODEL_NAME}/{version.version}", final),
                       (f"models:/{intermediate.model_id}", intermediate)):
        _cli(["evaluate", "--model_uri", uri, "--data_dir", str(trained.data_dir), "--limit", "2"],
             trained.env, trained.workdir)
        (evaluation,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                           f"tags.`verlflow.step` = 'evaluate' and tags.`verlflow.model_uri` = '{uri}'")
        linked = {(m.key, m.run_id) for m in client.get_logged_model(model.model_id).metrics}
        assert ("eval/gsm8k/accuracy", evaluation.info.run_id) in linked, uri


@pytest.mark.slow
def test_the_runs_end_removes_a_model_left_pending_or_failed_by_an_earlier_attempt(trained, client):
    from mlflow.entities import LoggedModelStatus

    from verlflow.outage import logged_models

    final = _models(client, trained)["model"]
    # What a SIGKILL mid-upload (PENDING) and a failed artifact write (FAILED) leave beside the run's model.
    pending = client.create_logged_model(experiment_id=trained.experiment_id, name="model",
                                         source_run_id=trained.run_id)
    failed = client.create_logged_model(experiment_id=trained.experiment_id, name="model",
                                        source_run_id=trained.run_id)
    client.finalize_logged_model(failed.model_id, LoggedModelStatus.FAILED)
    # The resumed run's end (the final checkpoint recorded again: the READY model is reused).
    again = logged_models.record_final_model(trained.run_id, final.tags["verlflow.checkpoint_dir"], STEPS)
    assert again.model_id == final.model_id
    left = client.search_logged_models(experiment_ids=[trained.experiment_id],
                                       filter_string=f"source_run_id = '{trained.run_id}'")
    assert {m.model_id for m in left} == {m.model_id for m in left if m.status == "READY"}  # before: both stayed
    assert pending.model_id not in {m.model_id for m in left} and failed.model_id not in {m.model_id for m in left}
