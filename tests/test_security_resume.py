"""A resume runs what the user ran, never what a run's tags say now (issue 54, case 1).

Anyone with EDIT on an experiment can rewrite a run's tags. ``train --resume`` rebuilt its whole launch (backend,
profile, Ray address, overrides) from the tag ``verlflow.train_args``: a rewritten tag made the victim's resume
source the attacker's shell file, send the job to the attacker's Ray address, and log ``${oc.env:DB_PASS}`` as a
param. The tag is now vouched for by the digest the run's first attempt logged as a param (params cannot be
changed once logged): a tag that no longer matches, or one with no digest, is refused in one line, before anything
is sourced, contacted or resolved. A real SQLite store; the runs are real dry runs of the train step.
"""

from __future__ import annotations

import json
import socket

import pytest
from conftest import cli_in_process
from mlflow.tracking import MlflowClient

from verlflow.data import gsm8k
from verlflow.names import STEP_TAG, TRAIN_ARGS_TAG
from verlflow.tracking.resume import ARGS_DIGEST_PARAM

DB_PASS = "s3cret-db-pass-never-logged"


@pytest.fixture
def killed_run(tracking_uri, tmp_path) -> str:
    """A verl train run of the tiny recipe, as a stop leaves it (KILLED), made by the real train step (a dry run:
    the record a resume reads is written before anything trains)."""
    gsm8k.preprocess("synthetic", tmp_path / "data", 8, log_to_mlflow=False)
    done = cli_in_process(["train", "--recipe", "tiny", "--device", "cpu", "--backend", "verl", "--dry_run", "true",
                           "--data_dir", str(tmp_path / "data")], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    client = MlflowClient()
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                f"tags.`{STEP_TAG}` = 'train'")
    client.set_terminated(run.info.run_id, "KILLED")
    return run.info.run_id


def test_the_first_attempt_logs_the_digest_that_vouches_for_its_arguments(killed_run):
    run = MlflowClient().get_run(killed_run)
    recorded = json.loads(run.data.tags[TRAIN_ARGS_TAG])
    assert recorded["recipe"] == "tiny" and recorded["backend"] == "verl"
    assert len(run.data.params[ARGS_DIGEST_PARAM]) == 64


def test_a_rewritten_train_args_tag_is_refused_before_anything_is_sourced_contacted_or_logged(
        killed_run, tmp_path, monkeypatch):
    marker = tmp_path / "sourced-by-the-victim"
    payload = tmp_path / "attacker.sh"
    payload.write_text(f"touch {marker}\n")
    profile = tmp_path / "attacker-profile.yaml"
    profile.write_text(f"name: evil\ndevice: cpu\nsource_files: [{payload}]\n")
    with socket.socket() as listener:  # the attacker's "Ray address": nothing may connect to it
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        client = MlflowClient()
        tampered = json.loads(client.get_run(killed_run).data.tags[TRAIN_ARGS_TAG])
        tampered.update(dry_run=False, profile=str(profile), ray_address=f"http://127.0.0.1:{port}",
                        overrides="+trainer.exfil=${oc.env:DB_PASS}")
        client.set_tag(killed_run, TRAIN_ARGS_TAG, json.dumps(tampered, sort_keys=True))
        monkeypatch.setenv("DB_PASS", DB_PASS)

        done = cli_in_process(["train", "--resume", killed_run], cwd=tmp_path)

        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection is waiting
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"verlflow train: error: resume: run {killed_run}'s tag {TRAIN_ARGS_TAG} was changed")
    assert "Traceback" not in done.stderr
    assert not marker.exists()
    run = client.get_run(killed_run)
    assert run.info.status == "KILLED"  # not attached to, not run
    assert DB_PASS not in json.dumps({**run.data.params, **run.data.tags})
    assert not any(key.startswith("trainer/exfil") for key in run.data.params)


def test_a_train_args_tag_without_its_digest_is_refused(tracking_uri, tmp_path):
    """A run made before the digest existed, or by hand, whose tag nothing vouches for."""
    client = MlflowClient()
    run = client.create_run("0", tags={STEP_TAG: "train", TRAIN_ARGS_TAG: json.dumps({"backend": "verl"})})
    client.set_terminated(run.info.run_id, "KILLED")
    done = cli_in_process(["train", "--resume", run.info.run_id], cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"cannot be vouched for (it has no param {ARGS_DIGEST_PARAM}" in done.stderr
    assert client.get_run(run.info.run_id).info.status == "KILLED"
