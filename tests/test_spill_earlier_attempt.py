"""A run's spill file may hold what its writer did not put there: an earlier attempt of the run that ended during an
outage (its upload not run yet, then the run resumed), or a writer that was killed while the server was away. The
writer that finds it writes those points and records before it rewrites or removes the file: none is dropped.

A real ``mlflow server`` (a SQLite store) on 127.0.0.1 behind the fault proxy (tests/fault_proxy.py), which answers
every request 500 for the outage. Before: once all it was sent was written, the next attempt's writer rewrote the
file to hold its parked artifact records only, so the earlier attempt's points were gone for good.
"""

from __future__ import annotations

import os
import signal

import pytest
from conftest import wait_until
from mlflow.tracking import MlflowClient
from test_artifact_faults import artifacts_refused

from verlflow.outage import metric_buffer, spill
from verlflow.outage.metric_buffer import MetricBuffer


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def _buffer(run_id: str, path) -> MetricBuffer:
    return MetricBuffer(run_id, path, retry_s=0.3, write_every_s=0.1)


@pytest.mark.slow
def test_a_resumed_run_writes_what_its_earlier_attempt_left_in_the_spill_file(proxied_server, tmp_path, capsys):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    path = tmp_path / "metrics.spill.jsonl"
    proxied_server.error_every = 1  # the first attempt trains through an outage and ends before it is over
    first = _buffer(run_id, path)
    for step in (1, 2, 3):
        first.log({"loss": 1.0 / step}, step, timestamp_ms=1_000_000 + step)
    assert first.close(wait_s=1) == 3
    assert metric_buffer.defer_end(run_id, "KILLED")  # its end waits in the file too
    with path.open("a") as file:
        file.write("\x00\x00 a line the crash damaged\n")
    printed = capsys.readouterr().err

    proxied_server.heal()  # the run is resumed with the server back, before anyone ran the printed upload
    second = _buffer(run_id, path)
    second.log({"loss": 0.25}, 4, timestamp_ms=2_000_000)
    assert second.close(wait_s=60) == 0
    assert _steps(client, run_id, "loss") == [1, 2, 3, 4]  # before: [4], the first attempt's points deleted
    assert client.get_run(run_id).info.status == "RUNNING"  # the earlier end is not replayed into this attempt
    assert not path.exists()
    assert "a line the crash damaged" in (tmp_path / "metrics.spill.jsonl.bad").read_text()

    assert "upload-spill" in printed  # the command printed for the first attempt: it says the work is done
    assert metric_buffer.main(str(path)) == 0
    assert "already uploaded" in capsys.readouterr().out


TABLE = {"kind": "table", "artifact_file": "samples/step_1.json",
         "data": {"prompt": ["1+1?"], "response": ["2"], "reward": [1.0]}}


@pytest.mark.slow
def test_an_earlier_attempts_table_the_artifact_store_refuses_is_kept_for_the_upload(
        proxied_server, module_server, tmp_path, capsys):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    path = tmp_path / "metrics.spill.jsonl"
    proxied_server.error_every = 1
    first = _buffer(run_id, path)
    first.log({"loss": 1.0}, 1)
    first.log_record(TABLE)
    assert first.close(wait_s=1) == 2
    proxied_server.heal()
    with artifacts_refused(module_server):  # the resumed attempt's server answers, its artifact store does not
        second = _buffer(run_id, path)
        second.log({"loss": 0.5}, 2)
        assert second.close(wait_s=60) == 0
        assert _steps(client, run_id, "loss") == [1, 2]
        assert [r["kind"] for r in spill.readable_records(path)] == ["table"]  # kept, not dropped with the rest
    said = capsys.readouterr().err
    assert "1 artifact writes of run" in said and "upload-spill" in said, said
    assert metric_buffer.main(str(path)) == 0  # the store takes writes again: the printed upload makes the table
    assert [a.path for a in client.list_artifacts(run_id, "samples")] == ["samples/step_1.json"]


@pytest.mark.slow
def test_a_writer_killed_in_an_outage_leaves_its_points_written_once_and_no_file(proxied_server, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    path = tmp_path / "metrics.spill.jsonl"
    proxied_server.error_every = 1
    buffer = _buffer(run_id, path)
    for step in (1, 2):
        buffer.log({"loss": 1.0 / step, "reward": 0.1 * step}, step)
    wait_until(lambda: path.exists() and len(spill.readable_records(path)) == 4, 60, "the 4 points spilled")
    os.kill(buffer.writer_pid, signal.SIGKILL)  # the dead writer's points: in its file, and still with the trainer
    wait_until(lambda: not buffer.writing, 30, "the writer gone")
    proxied_server.heal()
    buffer.log({"loss": 1 / 3, "reward": 0.3}, 3)  # the trainer starts a new writer, which finds the file
    assert buffer.close(wait_s=60) == 0
    assert buffer.writers_started == 2
    for key in ("loss", "reward"):
        assert _steps(client, run_id, key) == [1, 2, 3]  # each point once: the file's copy is not written twice
    assert not path.exists()
