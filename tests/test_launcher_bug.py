"""The ``mlflow run`` launcher bug the launcher watcher undoes is still there exactly where the version check says.

MLflow's launcher ends its run through ``_maybe_set_run_terminated``, which is meant to leave a run that already
ended alone but always overwrites it (:data:`verlflow.processes.LAUNCHER_BUG_BELOW`). When an MLflow release fixes
it, this test fails: move the bound, and the watcher stops being started for an MLflow that no longer needs it.
"""

from __future__ import annotations

import mlflow
from mlflow.tracking import MlflowClient

from verlflow.processes import launcher_overwrites_end


def test_the_launchers_end_overwrites_a_killed_run_exactly_when_the_version_check_says(tracking_uri):
    from mlflow import projects

    client = MlflowClient()
    run = client.create_run("0")
    client.set_terminated(run.info.run_id, "KILLED")  # what the interrupted step did
    projects._maybe_set_run_terminated(run, "FAILED")  # what the launcher does after it
    overwritten = client.get_run(run.info.run_id).info.status == "FAILED"
    assert overwritten == launcher_overwrites_end(mlflow.__version__)
