"""A run ``mlflow run`` created but verlflow never reached is not left RUNNING forever.

Forgetting ``--env-manager local`` on a machine without conda: ``mlflow run`` creates the run, fails to find conda
and exits; nothing of verlflow ever ran in it, so it carried no process tags and ``verlflow runs`` called it
"alive", which ``--reap`` never ends. A real ``mlflow run`` of this project on this machine (which has no conda),
then ``verlflow runs`` in process.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_in_process
from mlflow.tracking import MlflowClient

from verlflow import names
from verlflow.process import lifecycle

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mlflow_run_without_env_manager_local_leaves_a_run_verlflow_names_and_reaps(tracking_uri, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_CONDA_HOME"}
    assert shutil.which("conda", path=env.get("PATH")) is None, "this test needs a machine without conda"
    launch = subprocess.run([sys.executable, "-m", "mlflow", "run", str(REPO), "-e", "preprocess"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600)
    assert launch.returncode != 0 and "Could not find Conda" in launch.stderr, launch.stderr[-2000:]
    (left,) = MlflowClient().search_runs(["0"], "attributes.status = 'RUNNING'")

    listed = cli_in_process(["runs"], env=env)
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith(left.info.run_id))
    assert "verlflow never started in it" in line and "--env-manager local" in line

    reaped = cli_in_process(["runs", "--reap"], env=env)
    assert f"reaped {left.info.run_id}: mlflow run created it with --env-manager conda" in reaped.stdout
    ended = MlflowClient().get_run(left.info.run_id)
    assert ended.info.status == "FAILED" and "--env-manager local" in ended.data.tags[names.REAPED_TAG]


def test_a_project_run_without_verlflow_is_dead_only_once_stale_when_its_launch_may_still_build(tracking_uri):
    # A conda environment elsewhere, or a virtualenv one, may take long to build: only age tells.
    started_ms = int(time.time() * 1000)
    tags = {"mlflow.source.type": "PROJECT", "mlflow.project.env": "virtualenv"}
    assert lifecycle.why_dead(tags, started_ms=started_ms, stale_after_s=900) is None
    later = started_ms / 1000 + 901
    reason = lifecycle.why_dead(tags, started_ms=started_ms, stale_after_s=900, now=later)
    assert reason.startswith("mlflow run created it 901 s ago (env manager virtualenv) and verlflow never started")
    # verlflow attached (its process tags): judged by its process, as every run verlflow opened.
    attached = {**tags, names.PID_TAG: str(os.getpid()), names.HOST_TAG: socket.gethostname()}
    assert lifecycle.why_dead(attached, started_ms=started_ms, stale_after_s=900, now=later) is None
    # A run no mlflow run made (a notebook's) is never judged by its age.
    assert lifecycle.why_dead({}, started_ms=started_ms, stale_after_s=900, now=later) is None
