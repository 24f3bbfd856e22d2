"""A healthy run's end lets its metric writer exit by itself (code 0, no warning), however long a loaded machine keeps
it from running; only a writer left with work is killed, and the warning says how much it left (issue 56 item 9,
issue 58 item 7, issue 59 item 6).

Before: the end gave the writer's exit 15 s, then killed it, and a healthy run on a loaded machine ended with
``WARNING … the metric writer process exited with code -9`` (every point written). The writer runs at nice 19:
beside busy cores it gets a sliver of one, and its exit after the last write took longer than that. The load is made
certain here: the writer is held still (SIGSTOP), once it has written everything and the run's end begins, for
longer than those 15 s, as the scheduler held it.

Real MLflow (a SQLite store per test), the real writer process, a real tiny-recipe training in process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest
from conftest import cli_in_process, process_running, wait_until
from mlflow.tracking import MlflowClient

from verlflow.outage import writer_handle

# How long the writer is held still: past the 15 s the end used to give its exit, well within the wait it gets now.
HELD_S = 20.0


def _hold(pid: int, seconds: float) -> threading.Thread:
    """Stop process ``pid`` now (SIGSTOP) and let it go on (SIGCONT) ``seconds`` later, or as soon as it is gone,
    from a thread: a process the scheduler does not run for that long, as a nice-19 one beside busy cores."""
    os.kill(pid, signal.SIGSTOP)
    until = time.monotonic() + seconds

    def let_go() -> None:
        wait_until(lambda: time.monotonic() >= until or not process_running(pid), seconds + 60, "the hold's end")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=let_go, name="writer-hold", daemon=True)
    thread.start()
    return thread


@pytest.fixture
def writer_held_at_the_end(monkeypatch) -> list[list[int | None]]:
    """Each run's writer is held still for :data:`HELD_S` once everything is written and the run's end begins;
    yields each closed buffer's writer exit codes."""
    exit_codes: list[list[int | None]] = []
    real_close = writer_handle.MetricBuffer.close

    def close(buffer: writer_handle.MetricBuffer, *args, **kwargs) -> int:
        assert buffer.flush()  # every point and record written: the writer only has its exit left
        held = _hold(buffer.writer_pid, HELD_S)
        try:
            return real_close(buffer, *args, **kwargs)
        finally:
            held.join()
            exit_codes.append(buffer.writer_exit_codes)

    monkeypatch.setattr(writer_handle.MetricBuffer, "close", close)
    return exit_codes


@pytest.mark.slow  # a training, and a writer held past the old 15 s
def test_a_healthy_runs_writer_exits_by_itself_however_long_the_machine_holds_it(
        tracking_uri, tmp_path, tiny_workdir, writer_held_at_the_end, caplog):
    env = {**os.environ, "VERLFLOW_CACHE": str(tiny_workdir / "cache")}
    overrides = f"verlflow.output_dir={tmp_path / 'out'} verlflow.system_metrics_interval=0"
    result = cli_in_process(["train", "--recipe", "tiny", "--device", "cpu", "--data_dir",
                             str(tiny_workdir / "data"), "--overrides", overrides], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr + caplog.text
    assert "metric writer process" not in printed, printed[-3000:]
    assert writer_held_at_the_end == [[0]]  # one writer, and it exited by itself
    client = MlflowClient()
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.`verlflow.step` = 'train'")
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "timing_s/step")]
    assert steps and steps == list(range(1, len(steps) + 1))
    assert not list((tmp_path / "out").rglob("*.spill.jsonl"))  # nothing left to upload


@pytest.mark.slow  # the end gives a writer that was told to stop 15 s to end its call
def test_only_a_writer_left_with_work_is_killed_and_the_warning_says_how_much(tracking_uri, tmp_path, caplog):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    buffer = writer_handle.MetricBuffer(run_id, tmp_path / "metrics.spill.jsonl", write_every_s=600)
    os.kill(buffer.writer_pid, signal.SIGSTOP)  # a writer that never runs again (it is killed below)
    for step in (1, 2, 3):
        buffer.log({"loss": 1.0 / step}, step)
    assert buffer.close(wait_s=1) == 0  # its points: written by the trainer once it is gone
    assert buffer.writer_exit_codes == [-signal.SIGKILL]
    assert "did not end within 15 s of being told to stop: it was killed with 3 metric points and records " \
           "unwritten" in caplog.text
    assert "exited with code" not in caplog.text
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2, 3]
