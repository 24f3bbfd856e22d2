"""A full spill disk during an outage loses nothing already on disk, and the points it could not take stay in memory;
a server that answers again before the end gets the whole replay, however long it takes.

The spill folder is a real 64 KiB filesystem (a tmpfs mounted here when the test may mount one, as root;
otherwise a 64 KiB file-size limit, RLIMIT_FSIZE, on the trainer and its writer process, which inherits it).
The tracking server is a real ``mlflow server`` behind a fault proxy that answers every request 500 for the
outage. Before: each writer died with an ENOSPC traceback, and the end of the run deleted the spill file before
rewriting it, leaving 0 bytes. A server slower than the writer's first timeout is waited for (the timeout
follows its answers), not spilled.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import file_size_limit, wait_until
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from verlflow.outage import metric_buffer, spill
from verlflow.outage.metric_buffer import MetricBuffer

SMALL = 64 * 1024
KEYS = [f"actor/metric_{index:02d}" for index in range(20)]
STEPS = 60  # 1200 points, ~120 bytes each on disk: about twice what the folder holds


@pytest.fixture
def small_folder(tmp_path):
    """A folder that holds 64 KiB, and the context in which it is that small (a file-size limit needs one)."""
    folder = tmp_path / "small"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={SMALL}", "tmpfs", str(folder)]
    if os.geteuid() == 0 and subprocess.run(mount, capture_output=True).returncode == 0:
        try:
            yield folder, contextlib.nullcontext()
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=True)
    else:
        yield folder, file_size_limit(SMALL)


def _log_steps(buffer: MetricBuffer) -> None:
    for step in range(1, STEPS + 1):
        buffer.log({key: step + index / 100 for index, key in enumerate(KEYS)}, step, timestamp_ms=1_000_000 + step)


def _spilled_records(path: Path) -> list[dict]:
    """Every line of the spill file as a record: a torn line fails here."""
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_full_spill_disk_keeps_the_points_in_memory_and_writes_them_all_when_the_server_is_back(
        proxied_server, small_folder, tmp_path):
    folder, small = small_folder
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    proxied_server.error_every = 1  # the outage
    with small:
        buffer = MetricBuffer(run_id, folder / "metrics.spill.jsonl", retry_s=0.3, write_every_s=0.1)
        _log_steps(buffer)

        # `written` reads the writer's reports, among them that the folder is full
        wait_until(lambda: buffer.written >= 0 and buffer.spill_full, 120, "the writer's report of a full folder")
        on_disk = _spilled_records(folder / "metrics.spill.jsonl")
        assert 0 < len(on_disk) < STEPS * len(KEYS)
        assert buffer.writing  # the writer lives on (before: it died with an ENOSPC traceback, 3 times)
        proxied_server.heal()
        assert buffer.close(wait_s=120) == 0
    for key in (KEYS[0], KEYS[-1]):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == list(range(1, STEPS + 1))
    assert not (folder / "metrics.spill.jsonl").exists()  # all written: nothing left to upload


@pytest.mark.slow
def test_a_spill_disk_full_at_the_end_keeps_what_it_holds_and_the_final_status(proxied_server, small_folder, capfd):
    folder, small = small_folder
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    path = folder / "metrics.spill.jsonl"
    proxied_server.error_every = 1  # the outage
    with small:
        buffer = MetricBuffer(run_id, path, retry_s=0.3, write_every_s=0.1)
        _log_steps(buffer)
        left = buffer.close(wait_s=2)
        assert left == STEPS * len(KEYS)
        assert metric_buffer.defer_end(run_id, "FINISHED")  # the step's end, as tracking.tracking calls it
    err = capfd.readouterr().err
    full = [line for line in err.splitlines() if "spill folder" in line and "lost" in line]
    assert len(full) == 1 and str(folder) in full[0] and "lost" in full[0], err
    records = _spilled_records(path)  # before: 0 bytes (deleted before a rewrite that failed)
    points = [r for r in records if "key" in r]
    assert points and records[-1]["kind"] == "status"
    assert f"{len(points)} of the {left}" in full[0]
    assert "Traceback" not in err, err
    proxied_server.heal()
    assert metric_buffer.upload_spill(path) == len(points)
    assert client.get_run(run_id).info.status == "FINISHED"
    steps = {m.step for key in KEYS for m in client.get_metric_history(run_id, key)}
    assert steps == set(range(1, max(steps) + 1))  # what was kept is the first steps, whole


@pytest.mark.slow
def test_the_end_waits_for_a_replay_that_goes_on_past_the_window(proxied_server, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    proxied_server.error_every = 1  # the outage
    buffer = MetricBuffer(run_id, tmp_path / "spill.jsonl", retry_s=0.3, write_every_s=0.1)
    records = 30
    for index in range(records):  # one write each: the replay takes ~records x delay_s
        buffer.log_record({"kind": "tags", "tags": {f"replayed.{index:02d}": str(index)}})
    wait_until(lambda: buffer.written >= 0 and buffer.outage, 120, "the writer's report of the outage")
    proxied_server.heal()
    proxied_server.delay_s = 0.5  # back, but slow: 15 s of replay, twice the window
    assert buffer.close(wait_s=8) == 0  # before: cut after 8 s, the rest left to a manual upload
    tags = client.get_run(run_id).data.tags
    assert sorted(k for k in tags if k.startswith("replayed.")) == [f"replayed.{i:02d}" for i in range(records)]


def test_a_server_slower_than_the_writers_timeout_is_waited_for_not_spilled(proxied_server, tmp_path, monkeypatch,
                                                                             capfd):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")  # the writer process starts with a 1 s timeout
    buffer = MetricBuffer(run_id, tmp_path / "spill.jsonl", retry_s=0.3, write_every_s=0.1)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")  # this process's own reads
    proxied_server.delay_s = 1.5  # every answer takes longer than the writer first waits: slow, not down
    for step in range(1, 6):
        buffer.log({"actor/loss": 1.0 / step}, step, timestamp_ms=1_000_000 + step)
    buffer.log_record({"kind": "tags", "tags": {"final.summary": "written"}})
    left = buffer.close(wait_s=60)  # before: every try ran out at 1 s, the whole run went to the spill file
    proxied_server.heal()
    assert left == 0 and not (tmp_path / "spill.jsonl").exists()
    assert [m.step for m in client.get_metric_history(run_id, "actor/loss")] == [1, 2, 3, 4, 5]  # each once
    assert client.get_run(run_id).data.tags["final.summary"] == "written"
    err = capfd.readouterr().err
    assert "a write to the tracking server got no answer within 1 s: the metric writer now waits up to 2 s" in err


def test_a_server_restarted_on_a_fresh_database_is_named_not_waited_out_as_an_outage(proxied_server, tmp_path, capfd):
    from conftest import MlflowServer

    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    buffer = MetricBuffer(run_id, tmp_path / "spill.jsonl", retry_s=0.3, write_every_s=0.1)
    buffer.log({"loss": 1.0}, 1)
    assert buffer.flush(120)
    (tmp_path / "fresh").mkdir()
    fresh = MlflowServer(tmp_path / "fresh")  # the same address, a new database: the run is unknown there
    fresh.start()
    try:
        proxied_server.forward_to(fresh.url)
        for step in (2, 3):
            buffer.log({"loss": 1.0 / step}, step)
        # Before: taken for an outage; the end waited its window, then gave an upload that could never succeed.
        assert buffer.close(wait_s=120) == 2
    finally:
        fresh.stop()
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("verlflow: run ")]
    assert len(lines) == 1 and f"run {run_id} no longer exists on the tracking server" in lines[0], lines
    assert "upload-spill" not in lines[0]
    assert sorted(record["step"] for record in _spilled_records(tmp_path / "spill.jsonl")
                  if record.get("key") == "loss") == [2, 3]


def test_an_upload_after_an_outage_reads_no_metric_history(proxied_server, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    for step in (1, 2):  # written before the outage
        client.log_batch(run_id, metrics=[Metric(key, step, 1_000_000 + step, step) for key in KEYS])
    path = tmp_path / "metrics.spill.jsonl"
    spill.append(path, run_id, [(key, float(step), 1_000_000 + step, step) for step in (3, 4) for key in KEYS])
    spill.append(path, run_id, [{"kind": "status", "status": "FINISHED", "end_time": 1_000_010}])
    asked = len(proxied_server.paths)
    assert spill.upload(path) == 2 * len(KEYS)
    # Before: one metric-history read per key (~1 s each behind a slow proxy: 69 keys outlasted the end's window).
    assert not [p for p in proxied_server.paths[asked:] if "metrics/get-history" in p], proxied_server.paths[asked:]
    assert all(sorted(m.step for m in client.get_metric_history(run_id, key)) == [1, 2, 3, 4] for key in KEYS)
    assert client.get_run(run_id).info.status == "FINISHED"
    spill.uploaded_marker(path).replace(path)  # uploaded again: the histories are read, nothing is doubled
    assert spill.upload(path) == 0
    assert all(len(client.get_metric_history(run_id, key)) == 4 for key in KEYS)


def test_an_experiment_deleted_while_training_is_named_and_its_data_kept(proxied_server, tmp_path, capfd):
    client = MlflowClient()
    experiment = client.create_experiment(f"deleted-while-training-{tmp_path.name}")
    run_id = client.create_run(experiment).info.run_id
    buffer = MetricBuffer(run_id, tmp_path / "spill.jsonl", retry_s=0.3, write_every_s=0.1)
    buffer.log({"loss": 1.0}, 1)
    assert buffer.flush(120)
    client.delete_experiment(experiment)
    for step in (2, 3):
        buffer.log({"loss": 1.0 / step}, step)
    # Before: taken for an outage, the end waited out its whole window, then gave an upload that could only fail.
    assert buffer.close(wait_s=60) == 2
    lines = [line for line in capfd.readouterr().err.splitlines() if "was deleted" in line]
    assert len(lines) == 1 and run_id in lines[0] and "Restore it" in lines[0], lines
    client.restore_experiment(experiment)
    client.restore_run(run_id)
    assert spill.upload(tmp_path / "spill.jsonl") == 2
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2, 3]
