"""Per-step metrics go through the train step's buffer (a background writer) and none is lost when the run ends.

Real MLflow (a SQLite store per test through the ``tracking_uri`` fixture).
"""

from __future__ import annotations

import os
import signal
import time

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from verlflow import tracking
from verlflow.runs import metric_buffer

STEPS, KEYS = 50, 20


def tracking_uri_dir(run) -> str:
    """Where the buffer would spill (it does not: the store is up)."""
    return mlflow.get_tracking_uri().removeprefix("sqlite:///").rsplit("/", 1)[0] + f"/spill-{run.info.run_id}"


def _log_steps() -> None:
    for step in range(1, STEPS + 1):
        tracking.log_metrics({f"actor/m{k}": step + k / 100 for k in range(KEYS)} | {"val-core/x/mean@1": step},
                             step)


def test_every_async_step_is_in_the_store_once_the_run_has_ended(tracking_uri):
    with tracking.tracked_run() as run, metric_buffer.buffering(run.info.run_id, tracking_uri_dir(run)):
        _log_steps()
    client = MlflowClient()
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    for key in ("actor/m0", f"actor/m{KEYS - 1}", "val-core/x/mean_at_1"):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == list(range(1, STEPS + 1)), key
    assert {m.step: m.value for m in client.get_metric_history(run.info.run_id, "actor/m3")}[37] == 37.03


def test_a_failing_run_keeps_every_step_it_logged_asynchronously(tracking_uri):
    with pytest.raises(RuntimeError), tracking.tracked_run() as run, \
            metric_buffer.buffering(run.info.run_id, tracking_uri_dir(run)):
        _log_steps()
        raise RuntimeError("step 51 broke")
    client = MlflowClient()
    assert client.get_run(run.info.run_id).info.status == "FAILED"
    assert len(client.get_metric_history(run.info.run_id, "actor/m5")) == STEPS


def test_flush_makes_queued_steps_readable_while_the_run_is_still_open(tracking_uri):
    with tracking.tracked_run() as run, metric_buffer.buffering(run.info.run_id, tracking_uri_dir(run)):
        _log_steps()
        tracking.flush_metrics()
        assert len(MlflowClient().get_metric_history(run.info.run_id, "actor/m1")) == STEPS
        assert mlflow.active_run().info.run_id == run.info.run_id


def test_a_killed_writer_process_leaves_its_points_in_the_spill_file_for_upload(tracking_uri, tmp_path, capsys):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    with metric_buffer.buffering(run_id, tmp_path) as buffer:
        buffer.log({"loss": 1.0}, 1)
        buffer.write_soon()
        assert _wait_written(buffer, 1)
        os.kill(buffer.writer_pid, signal.SIGKILL)
        for step in (2, 3):
            buffer.log({"loss": 1.0 / step}, step)
        _wait_ended(buffer)
        assert not metric_buffer.flush(run_id)  # no writer left: says so at once instead of waiting it out
    assert "python -m verlflow.runs.metric_buffer" in capsys.readouterr().err
    assert metric_buffer.upload_spill(tmp_path / "metrics.spill.jsonl") == 2
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2, 3]


def _wait_ended(buffer: metric_buffer.MetricBuffer, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while buffer.writing and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_written(buffer: metric_buffer.MetricBuffer, points: int, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while buffer.written < points and time.monotonic() < deadline:
        time.sleep(0.05)
    return buffer.written >= points
