"""An artifact store that refuses writes while the tracking API answers stays an artifact fault: the metrics go on,
the refused write is kept in the spill file as its own record, and its upload says what it could not send.

A real ``mlflow server`` on 127.0.0.1 whose artifact folder is replaced by a file for the fault (root writes through
``chmod``, so a read-only mode would not stop it) and put back afterwards. Before: one refused ``samples/step_N.json``
was taken for an outage, every later metric point was spilled, and the printed upload took 4 minutes of retries,
printed 3 tracebacks and uploaded nothing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MlflowServer, tracking_at, wait_until
from mlflow.tracking import MlflowClient

from verlflow.outage import spill
from verlflow.outage.metric_buffer import MetricBuffer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def server(module_server, monkeypatch):
    """The module's server as this test's tracking URI, straight (no proxy: the fault is in its artifact store)."""
    tracking_at(module_server.url, monkeypatch)
    return module_server


@contextlib.contextmanager
def artifacts_refused(server: MlflowServer):
    """The server's artifact folder replaced by a file (every artifact write fails, the tracking API is untouched),
    put back on exit."""
    folder = server.root / "artifacts"
    aside = server.root / "artifacts.aside"
    if folder.exists():
        folder.rename(aside)
    folder.write_text("not a folder: the artifact store refuses writes\n")
    try:
        yield
    finally:
        folder.unlink()
        if aside.exists():
            aside.rename(folder)


@contextlib.contextmanager
def logging_while_artifacts_are_refused(server: MlflowServer, tmp_path: Path):
    """A new run's metric buffer (spill file under ``tmp_path``) with its first point logged, while the server
    refuses artifact writes: ``(client, run_id, spill path, buffer)``."""
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    path = tmp_path / "metrics.spill.jsonl"
    with artifacts_refused(server):
        buffer = MetricBuffer(run_id, path, retry_s=0.3, write_every_s=0.1)
        buffer.log({"loss": 1.0}, 1)
        yield client, run_id, path, buffer


def _upload(path: Path) -> subprocess.CompletedProcess:
    # The printed command, as a user runs it: MLflow's default HTTP retries (minutes on a refused write) included.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    return subprocess.run([sys.executable, "-m", "verlflow.outage.metric_buffer", str(path)], capture_output=True,
                          text=True, timeout=120, env={**env, "PYTHONPATH": str(ROOT / "src")})


@pytest.mark.slow
def test_a_refused_artifact_is_kept_apart_while_the_metrics_go_on(server, tmp_path, capfd):
    with logging_while_artifacts_are_refused(server, tmp_path) as (client, run_id, path, buffer):
        buffer.log_record({"kind": "table", "artifact_file": "samples/step_1.json",
                           "data": {"prompt": ["1+1?"], "response": ["2"], "reward": [1.0]}})
        for step in range(2, 6):
            buffer.log({"loss": 1.0 / step}, step)
        # Before: the table's 500 was an outage, and every later point waited behind it in the spill file.
        wait_until(lambda: buffer.written == buffer.enqueued, 60, "every point and record taken by the writer")
        assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2, 3, 4, 5]
        assert not buffer.outage and buffer.parked == 1
        assert buffer.close(wait_s=30) == 0
        lines = [line for line in capfd.readouterr().err.splitlines() if "artifact writes of run" in line]
        assert len(lines) == 1 and run_id in lines[0], lines
        kept = spill._records(path)[0]
        assert [r["kind"] for r in kept] == ["table"]

        upload = _upload(path)  # the store still refuses: one line for the table, no traceback, in seconds
        assert upload.returncode == 1, upload.stderr
        assert "Traceback" not in upload.stderr, upload.stderr
        refused = [line for line in upload.stderr.splitlines() if "not uploaded" in line]
        assert len(refused) == 1 and "samples/step_1.json" in refused[0], upload.stderr
        assert [r["kind"] for r in spill._records(path)[0]] == ["table"]
    upload = _upload(path)  # the store takes writes again
    assert upload.returncode == 0, upload.stderr
    assert [a.path for a in client.list_artifacts(run_id, "samples")] == ["samples/step_1.json"]
    assert not path.exists()


def _models(client: MlflowClient, run_id: str) -> list[tuple[str, str]]:
    found = client.search_logged_models(experiment_ids=["0"], filter_string=f"source_run_id = '{run_id}'")
    return sorted((m.name, str(m.status)) for m in found)


@pytest.mark.slow
def test_a_refused_final_model_leaves_no_unfinished_model_and_the_upload_makes_it(server, tmp_path):
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    checkpoint = resolve_model_path(TINY_SENTINEL, tmp_path / "cache")
    with logging_while_artifacts_are_refused(server, tmp_path) as (client, run_id, path, buffer):
        buffer.log_record({"kind": "final_model", "checkpoint": checkpoint, "step": 1})
        buffer.log({"loss": 0.5}, 2)
        assert buffer.close(wait_s=60) == 0
        assert buffer.parked == 1 and not buffer.outage
        assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2]
        assert _models(client, run_id) == []  # before: a FAILED `model` stayed beside the READY one made later
    upload = _upload(path)
    assert upload.returncode == 0, upload.stderr
    assert _models(client, run_id) == [("model", "READY")]
