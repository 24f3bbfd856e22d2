"""A local run killed mid-way resumes from its last checkpoint and ends as if never interrupted.

The kill is a real SIGTERM to this process as step 3 ends (after the step-2 checkpoint): the trainer keeps step 3
as a checkpoint on its way out and the tracked run turns the stop into KILLED. Resuming with
``trainer.resume_mode=auto`` in the same MLflow run must end at the same step count, log every step exactly once,
and (CPU, restored RNG and optimizer state) land on the same weights as an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from verlflow import config
from verlflow.backends.local.trainer import train_local
from verlflow.data import gsm8k
from verlflow.tracking import tracking

STEPS = ["trainer.total_training_steps=6", "trainer.save_freq=2", "trainer.test_freq=3"]


@pytest.fixture
def workdir(tmp_path, monkeypatch, tracking_uri, tiny_workdir) -> Path:
    monkeypatch.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))
    gsm8k.preprocess("synthetic", tmp_path / "data", 0, log_to_mlflow=False)
    return tmp_path


def _train(workdir: Path, checkpoints: str, on_step_end=None):
    cfg = config.compose("tiny", "cpu", [*STEPS, f"trainer.default_local_dir={workdir / checkpoints}"])
    with tracking.tracked_run() as run:
        return train_local(cfg, data_dir=workdir / "data", run_id=run.info.run_id, on_step_end=on_step_end)


def _kill_during_step_3(step, _metrics):
    if step == 3:
        os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_end_without_duplicate_steps(workdir, monkeypatch):
    straight = _train(workdir, "straight")

    with pytest.raises(KeyboardInterrupt):
        _train(workdir, "resumed", on_step_end=_kill_during_step_3)
    client = MlflowClient()
    killed = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                filter_string="attributes.status = 'KILLED'")
    assert len(killed) == 1
    run_id = killed[0].info.run_id
    assert [m.step for m in client.get_metric_history(run_id, "timing_s/step")] == [1, 2, 3]

    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)  # as `mlflow run` does when a run is restarted
    trained = []
    resumed = _train(workdir, "resumed", on_step_end=lambda step, _: trained.append(step))
    assert trained == [4, 5, 6]  # after step 3, which the stop kept (not from scratch, nor from step 2)
    assert resumed.run_id == run_id and resumed.steps == straight.steps == 6
    finished = client.get_run(run_id)
    assert finished.info.status == "FINISHED"
    assert finished.data.tags["verlflow.resumed_from"] == str((workdir / "resumed" / "global_step_3").resolve())
    assert "verlflow.superseded_steps" not in finished.data.tags  # the stop kept step 3: nothing trained twice
    for name in ("timing_s/step", "critic/score/mean", "actor/pg_loss"):
        assert sorted(m.step for m in client.get_metric_history(run_id, name)) == [1, 2, 3, 4, 5, 6], name
    val = "val-core/openai/gsm8k/reward/mean_at_1"
    assert sorted(m.step for m in client.get_metric_history(run_id, val)) == [3, 6]

    weights = load_file(resumed.final_checkpoint / "model.safetensors")
    reference = load_file(straight.final_checkpoint / "model.safetensors")
    assert weights.keys() == reference.keys()
    assert all((weights[k] - reference[k]).abs().max() < 1e-6 for k in weights)


@pytest.mark.slow
def test_resuming_a_finished_run_trains_no_more(workdir):
    first = _train(workdir, "ckpt")
    again = _train(workdir, "ckpt")
    assert again.steps == first.steps == 6 and again.final_checkpoint == first.final_checkpoint
    history = MlflowClient().get_metric_history(again.run_id, "timing_s/step")
    assert history == []  # nothing left to train, nothing logged as a step


def _kill_during_step_5(step, _metrics):
    if step == 5:
        os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_a_truncated_newest_checkpoint_resumes_from_the_one_before(workdir, monkeypatch):
    with pytest.raises(KeyboardInterrupt):
        _train(workdir, "torn", on_step_end=_kill_during_step_5)  # checkpoints at steps 2 and 4, 5 kept on stop
    state = workdir / "torn" / "global_step_5" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # a crash or a full disk while it was written
    client = MlflowClient()
    (killed,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                   filter_string="attributes.status = 'KILLED'")

    monkeypatch.setenv("MLFLOW_RUN_ID", killed.info.run_id)
    trained = []
    resumed = _train(workdir, "torn", on_step_end=lambda step, _: trained.append(step))
    assert trained == [5, 6]  # from step 4, the newest checkpoint that can be read
    assert resumed.steps == 6
    run = client.get_run(killed.info.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["verlflow.resumed_from"] == str((workdir / "torn" / "global_step_4").resolve())
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "timing_s/step")) == [1, 2, 3, 4, 5, 6]
    # Step 5 came from the killed attempt, trained again from step 4: marked, and where the attempt continued.
    assert run.data.tags["verlflow.superseded_steps"] == "5"
    resumed_from = client.get_metric_history(run.info.run_id, "attempt/resumed_from_step")
    assert [m.value for m in resumed_from] == [4.0]  # one resumed attempt, from step 4
