"""A crafted spill file changes nothing that is not its uploader's own unfinished run.

``upload-spill`` of a file naming another user's FINISHED run made it FAILED, renamed it, re-tagged it
``verlflow.profile=a3`` (moving it between compare's sides) and added metric points. Uploads here run through
``verlflow runs upload-spill`` in the test's process, on a real SQLite store.
"""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path

from conftest import cli_in_process
from mlflow.tracking import MlflowClient

from verlflow.outage import spill


def _finished_run(client: MlflowClient, user: str) -> str:
    run_id = client.create_run("0", tags={"mlflow.user": user, "verlflow.profile": "h20"}).info.run_id
    client.log_metric(run_id, "loss", 1.0, step=1)
    client.set_terminated(run_id, "FINISHED")
    return run_id


def _crafted(path: Path, run_id: str, *records: dict) -> Path:
    path.write_text("".join(json.dumps({"run_id": run_id, **record}) + "\n" for record in records))
    return path


def _unchanged(client: MlflowClient, run_id: str, before) -> None:
    after = client.get_run(run_id)
    assert (after.info.status, after.info.run_name, after.data.tags, after.data.metrics) == (
        before.info.status, before.info.run_name, before.data.tags, before.data.metrics)


HOSTILE = ({"key": "loss", "value": 9.0, "timestamp": 1, "step": 2},
           {"kind": "tags", "tags": {"verlflow.profile": "a3", "mlflow.runName": "pwned"}},
           {"kind": "status", "status": "FAILED", "end_time": 2})


def test_a_spill_file_naming_another_users_run_is_refused(tracking_uri, tmp_path):
    client = MlflowClient()
    run_id = _finished_run(client, "someone-else")
    before = client.get_run(run_id)
    done = cli_in_process(["runs", "upload-spill", str(_crafted(tmp_path / "x.spill.jsonl", run_id, *HOSTILE))])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"writes into run {run_id} of user 'someone-else'" in done.stderr, done.stderr
    _unchanged(client, run_id, before)


def test_a_spill_file_that_would_end_an_own_finished_run_otherwise_is_refused(tracking_uri, tmp_path):
    client = MlflowClient()
    run_id = _finished_run(client, getpass.getuser())
    before = client.get_run(run_id)
    done = cli_in_process(["runs", "upload-spill", str(_crafted(tmp_path / "x.spill.jsonl", run_id, *HOSTILE))])
    assert done.returncode == 2 and "which ended FINISHED otherwise than this file says" in done.stderr, done.stderr
    _unchanged(client, run_id, before)


def test_a_spill_file_never_renames_a_run(tracking_uri, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0", tags={"mlflow.user": getpass.getuser()}).info.run_id
    before = client.get_run(run_id)
    path = _crafted(tmp_path / "x.spill.jsonl", run_id, HOSTILE[1])
    done = cli_in_process(["runs", "upload-spill", str(path)])
    assert done.returncode == 2 and f"renames run {run_id}" in done.stderr, done.stderr
    _unchanged(client, run_id, before)


def test_a_spill_file_another_user_could_write_is_refused(tracking_uri, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0", tags={"mlflow.user": getpass.getuser()}).info.run_id
    path = _crafted(tmp_path / "x.spill.jsonl", run_id, HOSTILE[0])
    os.chmod(path, 0o666)
    done = cli_in_process(["runs", "upload-spill", str(path)])
    assert done.returncode == 2 and "is writable by other users (mode 666)" in done.stderr, done.stderr
    assert client.get_run(run_id).data.metrics == {}


def test_an_own_open_runs_spill_file_is_still_uploaded(tracking_uri, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0", tags={"mlflow.user": getpass.getuser()}).info.run_id
    path = _crafted(tmp_path / "x.spill.jsonl", run_id, HOSTILE[0], {"kind": "status", "status": "FINISHED",
                                                                      "end_time": 5})
    done = cli_in_process(["runs", "upload-spill", str(path)])
    assert done.returncode == 0, done.stderr
    assert client.get_run(run_id).info.status == "FINISHED" and spill.uploaded_marker(path).exists()
