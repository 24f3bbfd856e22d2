"""Keep an interrupted run KILLED when ``mlflow run``'s launcher marks it FAILED after the step ended it.

    python -m verlflow.runs.launcher_status <run_id> <launcher pid> <launcher start>   # started by the step

Ctrl-C to ``mlflow run`` reaches the launcher and the step together. The step ends its run KILLED; the
launcher then waits for the step and calls ``_maybe_set_run_terminated(run, "FAILED")``
(``mlflow/projects/__init__.py``, MLflow 3.x), which is meant to leave a run that already ended alone but
checks ``RunStatus.is_terminated`` with the status *string* where that function expects MLflow's enum
number, so it always overwrites: every interrupted ``mlflow run`` ended FAILED. A step that ends the
launcher's run because of a signal therefore leaves this watcher behind, in its own session (the terminal's
Ctrl-C does not reach it): it waits for the launcher to exit and puts the run back to KILLED when the
launcher's FAILED replaced the step's KILLED, keeping the run's end time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from verlflow.names import ERROR_TAG
from verlflow.runs import lifecycle

# How long the watcher waits for the launcher to exit after the step ended the run (the launcher exits at once).
WAIT_S = 120.0
INTERRUPTED = "RunInterrupted"
# The launcher's run, as this process started (MLflow's end_run unsets MLFLOW_RUN_ID from the environment).
LAUNCHER_RUN_ID = os.environ.get("MLFLOW_RUN_ID")


def keep_killed_after_launcher(run_id: str) -> bool:
    """Start the watcher when ``run_id`` is the run of the ``mlflow run`` launcher this step runs under."""
    if LAUNCHER_RUN_ID != run_id:
        return False
    launcher = lifecycle.find_launcher()
    if launcher is None:
        return False
    argv = [sys.executable, "-m", "verlflow.runs.launcher_status", run_id, str(launcher),
            lifecycle.process_start(launcher) or ""]
    subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, close_fds=True)
    return True


def restore_killed(run_id: str, launcher: int, start: str | None) -> str:
    """Wait for the launcher to exit; a run it turned FAILED after a signal ended it goes back to KILLED.

    Returns the status the run is left with."""
    from mlflow.tracking import MlflowClient

    deadline = time.monotonic() + WAIT_S
    while lifecycle.process_alive(launcher, start) and time.monotonic() < deadline:
        time.sleep(0.2)
    client = MlflowClient()
    run = client.get_run(run_id)
    if run.info.status == "FAILED" and run.data.tags.get(ERROR_TAG, "").startswith(INTERRUPTED):
        client.set_terminated(run_id, "KILLED", end_time=run.info.end_time)
        return "KILLED"
    return run.info.status


if __name__ == "__main__":
    restore_killed(sys.argv[1], int(sys.argv[2]), sys.argv[3] or None)
