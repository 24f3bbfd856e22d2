"""Per-step metrics go through the train step's buffer (a background writer) and none is lost when the run ends.

Real MLflow (a SQLite store per test through the ``tracking_uri`` fixture).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import pytest
from conftest import process_running, wait_until
from mlflow.tracking import MlflowClient

from verlflow.outage import metric_buffer, writer_handle
from verlflow.tracking import tracking

STEPS, KEYS = 50, 20


def tracking_uri_dir(run) -> str:
    """Where the buffer would spill (it does not: the store is up)."""
    return mlflow.get_tracking_uri().removeprefix("sqlite:///").rsplit("/", 1)[0] + f"/spill-{run.info.run_id}"


def _log_steps(first: int = 1, last: int = STEPS) -> None:
    for step in range(first, last + 1):
        tracking.log_metrics({f"actor/m{k}": step + k / 100 for k in range(KEYS)} | {"val-core/x/mean@1": step},
                             step)


def test_every_async_step_is_in_the_store_once_the_run_has_ended(tracking_uri):
    with tracking.tracked_run() as run, metric_buffer.buffering(run.info.run_id, tracking_uri_dir(run)):
        _log_steps(1, STEPS // 2)
        # flush makes the queued steps readable while the run is still open (one writer: both checks share it)
        tracking.flush_metrics()
        assert len(MlflowClient().get_metric_history(run.info.run_id, "actor/m1")) == STEPS // 2
        assert mlflow.active_run().info.run_id == run.info.run_id
        _log_steps(STEPS // 2 + 1, STEPS)  # left queued: only the run's end writes these
    client = MlflowClient()
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    for key in ("actor/m0", "actor/m1", f"actor/m{KEYS - 1}", "val-core/x/mean_at_1"):
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


def test_a_dead_writer_process_is_replaced_and_every_point_reaches_the_store(tracking_uri, tmp_path, caplog, capsys):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    with metric_buffer.buffering(run_id, tmp_path) as buffer:
        buffer.log({"loss": 1.0}, 1)
        # One run's writers in turn: killed as the OOM killer does, then stopped as a scheduler does.
        for step, signum in ((2, signal.SIGKILL), (3, signal.SIGTERM)):
            caplog.clear()
            dead_pid = _signal_the_writer_once_written(buffer, step - 1, signum)
            _wait_ended(buffer)
            buffer.log({"loss": 1.0 / step}, step)
            assert buffer.writer_pid != dead_pid, signum  # noticed at the next step, not at the run's end
            assert "metric writer process ended" in caplog.text, signum
        buffer.log({"loss": 0.25}, 4)
        assert metric_buffer.flush(run_id)  # the new writer wrote what the dead ones had not
        assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2, 3, 4]
    assert not (tmp_path / "metrics.spill.jsonl").exists()
    assert "upload-spill" not in capsys.readouterr().err  # no upload command: nothing left over


def test_when_writers_keep_dying_the_trainer_writes_their_points_itself(tracking_uri, tmp_path, monkeypatch):
    monkeypatch.setattr(writer_handle, "MAX_WRITERS", 1)  # no replacement: the last resort at once
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    with metric_buffer.buffering(run_id, tmp_path) as buffer:
        buffer.log({"loss": 1.0}, 1)
        _signal_the_writer_once_written(buffer, 1, signal.SIGKILL)
        _wait_ended(buffer)
        for step in (2, 3):
            buffer.log({"loss": 1.0 / step}, step)
        assert not buffer.writing
        assert not metric_buffer.flush(run_id)  # says so at once instead of waiting it out
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2, 3]
    assert not (tmp_path / "metrics.spill.jsonl").exists()


# A user's script: it logs through a buffer, and has no `if __name__ == "__main__"` guard.
_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from mlflow.tracking import MlflowClient
    from verlflow.outage import metric_buffer

    with Path(sys.argv[1]).open("a") as marker:
        marker.write("ran\\n")
    run_id = MlflowClient().create_run("0").info.run_id
    print(run_id, flush=True)
    with metric_buffer.buffering(run_id, Path(sys.argv[1]).parent) as buffer:
        buffer.log({"loss": 1.0}, 1)
        print(buffer.writer_pid, flush=True)
        if sys.argv[2] == "die":
            while buffer.written < 1:  # the first write goes at once, the next steps are gathered
                time.sleep(0.05)
            buffer.log({"loss": 0.5}, 2)
            assert buffer.wait_in_pipe(60)  # the step is in the writer's pipe, not yet written
            os.kill(os.getpid(), signal.SIGKILL)
""")


def _run_script(tmp_path: Path, how: str) -> tuple[subprocess.CompletedProcess, Path]:
    script, marker = tmp_path / "user_script.py", tmp_path / "ran.txt"
    script.write_text(_SCRIPT)
    result = subprocess.run([sys.executable, str(script), str(marker), how], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "VERLFLOW_METRICS_WRITE_S": "600"})
    return result, marker


@pytest.mark.slow  # a new Python and its writer; "runs once" is asserted in the fast tier by the killed trainer's test
def test_a_script_without_a_main_guard_runs_once_beside_its_writer_process(tracking_uri, tmp_path):
    result, marker = _run_script(tmp_path, "end")
    assert result.returncode == 0, result.stderr[-2000:]
    assert marker.read_text().splitlines() == ["ran"]
    run_id = result.stdout.split()[0]
    assert [m.step for m in MlflowClient().get_metric_history(run_id, "loss")] == [1]


def test_a_killed_trainer_leaves_no_writer_behind_and_its_queued_steps_written(tracking_uri, tmp_path):
    result, marker = _run_script(tmp_path, "die")
    assert result.returncode == -signal.SIGKILL
    assert marker.read_text().splitlines() == ["ran"]  # its writer (started, it wrote step 1) did not run it again
    run_id, writer_pid = result.stdout.split()[:2]
    wait_until(lambda: not process_running(writer_pid), 60, "the writer's exit")  # within seconds, loaded or not
    assert sorted(m.step for m in MlflowClient().get_metric_history(run_id, "loss")) == [1, 2]


def _signal_the_writer_once_written(buffer: metric_buffer.MetricBuffer, points: int, signum: int) -> int:
    """Send the current writer ``signum`` once ``points`` points are written; returns its process id."""
    buffer.write_soon()
    assert _wait_written(buffer, points)
    os.kill(pid := buffer.writer_pid, signum)
    return pid



def _wait_ended(buffer: metric_buffer.MetricBuffer, timeout_s: float = 300) -> None:
    wait_until(lambda: not buffer.writing, timeout_s, "the metric writer ended")


def _wait_written(buffer: metric_buffer.MetricBuffer, points: int, timeout_s: float = 300) -> bool:
    return wait_until(lambda: buffer.written >= points, timeout_s, f"{points} point(s) written")
