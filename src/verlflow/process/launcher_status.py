"""Keep the end a step gave its run (KILLED, or FINISHED before a late Ctrl-C) when ``mlflow run``'s launcher
marks it FAILED, and end KILLED an interrupted run the launcher leaves FAILED with no reason or RUNNING.

    python -m verlflow.process.launcher_status <run_id> <launcher pid> <launcher start> [--interrupted SIGINT]
        [--ended FINISHED]

Ctrl-C to ``mlflow run`` reaches the launcher and the step together. The step ends its run KILLED; the
launcher then waits for the step and calls ``_maybe_set_run_terminated(run, "FAILED")``
(``mlflow/projects/__init__.py``, MLflow 3.x), which is meant to leave a run that already ended alone but
checks ``RunStatus.is_terminated`` with the status *string* where that function expects MLflow's enum
number, so it always overwrites: every interrupted ``mlflow run`` ended FAILED. A step that ends the
launcher's run because of a signal therefore leaves this watcher behind
(:func:`verlflow.processes.watch_launcher`), in its own session (the terminal's
Ctrl-C does not reach it): it waits for the launcher to exit and puts the run back to KILLED when the
launcher's FAILED replaced the step's KILLED, keeping the run's end time.

A step interrupted before it held the run (while it loaded MLflow, or checked its inputs) never ended it:
the launcher marked it FAILED with no reason, or, interrupted before its own wait began, left it RUNNING.
With ``--interrupted <signal>`` the watcher ends such a run KILLED itself, once the launcher has exited.

A signal after the step ended the run FINISHED (Ctrl-C just after ``main: done``, while the step process still
exits) reaches the launcher too, and its FAILED (with no reason) replaced the finished run's end. With
``--ended FINISHED`` the watcher puts FINISHED back: the run's work was all done and recorded.
"""

from __future__ import annotations

import argparse
import time

from verlflow.names import ERROR_TAG
from verlflow.processes import process_alive

# How long the watcher waits for the launcher to exit after the step ended the run (the launcher exits at once).
WAIT_S = 120.0
INTERRUPTED = "RunInterrupted"


def restore_killed(run_id: str, launcher: int, start: str | None, interrupted_by: str | None = None,
                   ended: str | None = None) -> str:
    """Wait for the launcher to exit; a run it turned FAILED after a signal ended it goes back to KILLED, one the
    step had ``ended`` FINISHED goes back to FINISHED, and with ``interrupted_by`` a run the step never ended
    (RUNNING, or FAILED with no reason) ends KILLED.

    Returns the status the run is left with."""
    from mlflow.tracking import MlflowClient

    deadline = time.monotonic() + WAIT_S
    while process_alive(launcher, start) and time.monotonic() < deadline:
        time.sleep(0.2)
    client = MlflowClient()
    run = client.get_run(run_id)
    reason = run.data.tags.get(ERROR_TAG)
    if ended == "FINISHED" and run.info.status == "FAILED" and reason is None:  # the launcher's, over the step's end
        client.set_terminated(run_id, "FINISHED", end_time=run.info.end_time)
        return "FINISHED"
    if interrupted_by and run.info.status in ("RUNNING", "FAILED") and reason is None:
        client.set_tag(run_id, ERROR_TAG, f"{INTERRUPTED}: interrupted by {interrupted_by}")
        client.set_terminated(run_id, "KILLED", end_time=run.info.end_time)
        return "KILLED"
    if run.info.status == "FAILED" and (reason or "").startswith(INTERRUPTED):
        client.set_terminated(run_id, "KILLED", end_time=run.info.end_time)
        return "KILLED"
    return run.info.status


def main(argv: list[str] | None = None) -> None:
    """The watcher process: ``<run_id> <launcher pid> <launcher start> [--interrupted SIGNAL] [--ended STATUS]``."""
    parser = argparse.ArgumentParser(prog="python -m verlflow.process.launcher_status")
    parser.add_argument("run_id")
    parser.add_argument("launcher", type=int)
    parser.add_argument("start")
    parser.add_argument("--interrupted", default=None)
    parser.add_argument("--ended", default=None, help="the status the step ended the run with")
    args = parser.parse_args(argv)
    restore_killed(args.run_id, args.launcher, args.start or None, args.interrupted, args.ended)


if __name__ == "__main__":
    main()
