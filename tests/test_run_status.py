"""A run ends FINISHED, FAILED or KILLED as what happened, keeps what it logged, and is never left RUNNING."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from verlflow.tracking.tracking import tracked_run


def test_success_ends_finished(tracking_uri):
    with tracked_run(run_name="ok") as run:
        mlflow.log_metric("x", 1.0)
    assert MlflowClient().get_run(run.info.run_id).info.status == "FINISHED"


def test_error_ends_failed_and_keeps_metrics(tracking_uri):
    with pytest.raises(RuntimeError), tracked_run(run_name="boom") as run:
        mlflow.log_metric("critic/score/mean", 0.25, step=1)
        raise RuntimeError("the trainer broke")
    finished = MlflowClient().get_run(run.info.run_id)
    assert finished.info.status == "FAILED"
    assert finished.data.metrics["critic/score/mean"] == 0.25
    assert "the trainer broke" in finished.data.tags["verlflow.error"]


def test_attaches_to_the_run_mlflow_run_created(tracking_uri, monkeypatch):
    created = MlflowClient().create_run(experiment_id="0")
    monkeypatch.setenv("MLFLOW_RUN_ID", created.info.run_id)
    with tracked_run() as run:
        pass
    assert run.info.run_id == created.info.run_id
    assert MlflowClient().get_run(created.info.run_id).info.status == "FINISHED"


def test_explicit_parent_link(tracking_uri):
    parent = MlflowClient().create_run(experiment_id="0")
    with tracked_run(parent_run_id=parent.info.run_id) as child:
        pass
    assert MlflowClient().get_run(child.info.run_id).data.tags["mlflow.parentRunId"] == parent.info.run_id


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_killed_and_keeps_metrics(tracking_uri, tmp_path, signum):
    script = textwrap.dedent(
        """
        import mlflow
        from verlflow import stopping
        from verlflow.tracking.tracking import tracked_run
        with tracked_run(run_name="long") as run:
            mlflow.log_metric("timing_s/step", 1.5, step=1)
            print(run.info.run_id, flush=True)
            stopping.STOP.wait(120)  # a long body at a safe point: the signal only sets STOP
            stopping.stop_point()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    run_id = proc.stdout.readline().strip()  # printed inside the run: its signal handlers are set
    proc.send_signal(signum)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    run = MlflowClient().get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.metrics["timing_s/step"] == 1.5
