"""The upload command a step prints after an outage is ``verlflow runs upload-spill <file>``, the console script: it
names no module, so a command printed before an upgrade that moves modules still runs after it (the printed
``python -m verlflow.runs.metric_buffer`` stopped working when that module moved). Bad input is one line, exit 2.

A real ``mlflow server`` (a SQLite store) on 127.0.0.1 behind the fault proxy (tests/fault_proxy.py) for the outage;
the printed command is run as a user runs it, with bash and a bare environment.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from conftest import CliResult, cli_in_process
from mlflow.tracking import MlflowClient

from verlflow.outage import metric_buffer
from verlflow.outage.metric_buffer import MetricBuffer

ROOT = Path(__file__).resolve().parents[1]
BARE_ENV = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "PYTHONPATH": str(ROOT / "src")}


def _bash(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], env=BARE_ENV, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_printed_command_uploads_the_outage_once_and_then_says_it_was_done(proxied_server, tmp_path, capsys):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    proxied_server.error_every = 1  # the outage lasts past the end of the run
    buffer = MetricBuffer(run_id, tmp_path / "metrics.spill.jsonl", retry_s=0.3, write_every_s=0.1)
    for step in (1, 2):
        buffer.log({"loss": 1.0 / step}, step)
    assert buffer.close(wait_s=1) == 2
    assert metric_buffer.defer_end(run_id, "FINISHED")
    lines = capsys.readouterr().err.splitlines()
    command = lines[lines.index(next(line for line in lines if "did not take" in line)) + 1].strip()
    assert command.startswith(f"MLFLOW_TRACKING_URI={proxied_server.url} ")
    assert " runs upload-spill " in command and " -m " not in command, command  # no module path in it

    proxied_server.heal()
    first = _bash(command, tmp_path.parent)  # from another folder: the command holds every path it needs
    assert first.returncode == 0, first.stderr[-3000:]
    assert "uploaded 2 metric points" in first.stdout
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2]
    assert client.get_run(run_id).info.status == "FINISHED"

    again = _bash(command, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already uploaded" in again.stdout and "Traceback" not in again.stderr, again.stdout + again.stderr
    assert len(client.get_metric_history(run_id, "loss")) == 2


def _upload_spill(path: Path, cwd: Path) -> CliResult:
    return cli_in_process(["runs", "upload-spill", str(path)], env={**os.environ, **BARE_ENV}, cwd=cwd)


def test_a_path_that_is_not_a_spill_file_is_one_line_and_left_as_it_is(tmp_path):
    store = tmp_path / "mlflow.db"  # the tracking store given by mistake: before, renamed mlflow.db.uploaded
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE runs (run_uuid TEXT)")
    for path, why in ((store, "is not a spill file"), (tmp_path / "nothing.spill.jsonl", "does not exist"),
                      (tmp_path, "is a folder")):
        done = _upload_spill(path, tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        error = done.stderr.strip()
        assert error.count("\n") == 0 and "Traceback" not in error, error
        assert str(path) in error and why in error and "spill.jsonl" in error, error  # the file, and what would do
    assert store.exists() and not (tmp_path / "mlflow.db.uploaded").exists()
