"""Whose process a run is, whether that process still lives, and what to do when it is gone.

    verlflow runs --reap            # mark RUNNING runs whose process is dead as FAILED

A run MLflow shows as RUNNING may have lost its process to SIGKILL, the OOM killer or a lost node;
nothing would ever end it. So every run verlflow opens carries

- ``verlflow.host`` / ``verlflow.pid`` / ``verlflow.pid_start`` (the process and its start time, which
  tells a reused pid apart), and
- ``verlflow.heartbeat`` (epoch seconds, refreshed every :data:`HEARTBEAT_S` by a daemon thread),

and :func:`reap` ends a RUNNING run FAILED, with the tag ``verlflow.reaped`` saying why, when its
process is gone (same host) or its heartbeat is older than :data:`STALE_AFTER_S` (another host). Every
step reaps its experiment at start. A step launched by ``mlflow run`` also dies with that launcher
(:func:`die_with_launcher`): the launcher's SIGTERM would otherwise orphan the step, which then
trains on unseen.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from mlflow.entities import Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.names import ERROR_TAG, EXIT_CODE_TAG, HEARTBEAT_TAG, HOST_TAG, PID_START_TAG, PID_TAG, REAPED_TAG
from verlflow.outage.store_retry import LockRetryingClient
from verlflow.processes import find_launcher, process_alive, process_start
from verlflow.secrets import mask_text
from verlflow.util import env_number, first_line

log = logging.getLogger(__name__)

# Tags of an attempt that ended badly; a resumed run is running again, so they no longer hold.
STALE_ON_RESUME = (ERROR_TAG, REAPED_TAG, EXIT_CODE_TAG)
HEARTBEAT_S = env_number("VERLFLOW_HEARTBEAT_S", 60.0, minimum=0)
# A run on another host is dead when its heartbeat is this old (many missed beats, not one slow write).
STALE_AFTER_S = env_number("VERLFLOW_STALE_AFTER_S", 900.0, minimum=0)
LAUNCHER_POLL_S = 1.0
_PR_SET_PDEATHSIG = 1





# --------------------------------------------------------------------------- alive marks, heartbeat


class Heartbeat:
    """A daemon thread that refreshes a run's heartbeat tag; an unreachable server only skips beats."""

    def __init__(self, run_id: str, interval_s: float = HEARTBEAT_S):
        self.run_id, self.interval_s = run_id, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{run_id[:8]}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _beat(self) -> None:
        client = LockRetryingClient()
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):  # bookkeeping must never disturb the run
                client.set_tag(self.run_id, HEARTBEAT_TAG, str(int(time.time())))

    def stop(self) -> None:
        """Stop beating (the run has ended)."""
        self._stop.set()


def mark_alive(run_id: str) -> Heartbeat:
    """Tag ``run_id`` with this host and process, drop tags of a failed earlier attempt, start a heartbeat."""
    client = LockRetryingClient()
    pid = os.getpid()
    tags = {HOST_TAG: socket.gethostname(), PID_TAG: str(pid), HEARTBEAT_TAG: str(int(time.time()))}
    if (start := process_start(pid)) is not None:
        tags[PID_START_TAG] = start
    try:
        existing = client.get_run(run_id).data.tags
        for key in STALE_ON_RESUME:
            if key in existing:
                client.delete_tag(run_id, key)
        client.log_batch(run_id, tags=[RunTag(key, value) for key, value in tags.items()])
    except MlflowException as exc:
        log.warning("could not mark run %s as alive: %s", run_id, first_line(exc))
    return Heartbeat(run_id).start()


# --------------------------------------------------------------------------- reaping


@dataclass(frozen=True)
class Reaped:
    """A run :func:`reap` ended, and why."""

    run_id: str
    reason: str


def why_dead(tags: dict[str, str], *, now: float | None = None, stale_after_s: float = STALE_AFTER_S,
             started_ms: int | None = None) -> str | None:
    """Why a RUNNING run with these tags has no live process, or None when it may still be alive.

    Runs without ``verlflow.pid`` are left alone (not opened by verlflow, or not yet attached to), except one that
    ``mlflow run`` created (started at ``started_ms``) and verlflow never reached (:func:`never_started`).
    """
    pid, host = tags.get(PID_TAG), tags.get(HOST_TAG)
    if not pid or not pid.isdigit() or not host:
        return never_started(tags, started_ms, now=now, stale_after_s=stale_after_s)
    if host == socket.gethostname():
        if process_alive(int(pid), tags.get(PID_START_TAG)):
            return None
        return f"process {pid} on {host} is gone (killed, out of memory or crashed) while the run was RUNNING"
    beat = tags.get(HEARTBEAT_TAG, "")
    if not beat.isdigit():
        return None
    age = (now or time.time()) - int(beat)
    if age <= stale_after_s:
        return None
    return f"no heartbeat from process {pid} on {host} for {age:.0f} s (more than {stale_after_s:.0f} s)"


def never_started(tags: dict[str, str], started_ms: int | None, *, now: float | None = None,
                  stale_after_s: float = STALE_AFTER_S) -> str | None:
    """Why a run ``mlflow run`` created can no longer be reached by verlflow, or None while it may be.

    ``mlflow run`` creates the run, then builds the entry point's environment, then starts verlflow, which tags the
    run with its process. A launch that fails before (``mlflow run`` without ``--env-manager local`` on a machine
    with no conda, an environment that does not build) leaves the run RUNNING with nothing to end it: known at once
    when the launch asked for conda, this store is a local file and this machine has no conda; otherwise once the
    run is ``stale_after_s`` old without verlflow's tags (a conda environment may legitimately take long to build).
    """
    if tags.get(PID_TAG) or tags.get("mlflow.source.type") != "PROJECT" or started_ms is None:
        return None
    env = tags.get("mlflow.project.env", "")
    flag = "run it with mlflow run --env-manager local, as the README's commands do"
    if env == "conda" and _store_is_here() and not _conda_here():
        return (f"mlflow run created it with --env-manager conda and this machine has no conda, so verlflow never "
                f"started in it: {flag}")
    age = (now or time.time()) - started_ms / 1000
    if age <= stale_after_s:
        return None
    return (f"mlflow run created it {age:.0f} s ago (env manager {env or 'unknown'}) and verlflow never started in "
            f"it: the launch failed before the step ran; {flag}")


def _store_is_here() -> bool:
    """The tracking store is a file on this machine, so a run in it was launched here."""
    import mlflow

    return mlflow.get_tracking_uri().startswith(("sqlite:", "file:", "/"))


def _conda_here() -> bool:
    """``mlflow run`` finds conda here (on PATH, or where ``MLFLOW_CONDA_HOME`` points)."""
    import shutil

    home = os.environ.get("MLFLOW_CONDA_HOME")
    return bool(shutil.which("conda") or (home and shutil.which("conda", path=os.path.join(home, "bin"))))


def reap(experiment_ids: Iterable[str] | None = None, *, client: MlflowClient | None = None,
         stale_after_s: float = STALE_AFTER_S) -> list[Reaped]:
    """End every RUNNING run whose process is dead as FAILED, tagged ``verlflow.reaped`` with the reason.

    ``experiment_ids`` default to every experiment of the store. Returns what was reaped.
    """
    client = client or LockRetryingClient()
    ids = list(experiment_ids) if experiment_ids is not None else experiment_ids_named("", client)
    reaped = []
    for run in running_runs(ids, client):
        reason = why_dead(run.data.tags, stale_after_s=stale_after_s, started_ms=run.info.start_time)
        if reason is None:
            continue
        run_id = run.info.run_id
        client.set_tag(run_id, REAPED_TAG, reason)
        client.set_tag(run_id, ERROR_TAG, mask_text(f"reaped: {reason}")[:500])
        beat = run.data.tags.get(HEARTBEAT_TAG, "")
        end_ms = int(beat) * 1000 if beat.isdigit() else None
        client.set_terminated(run_id, "FAILED", end_time=end_ms)
        reaped.append(Reaped(run_id, reason))
    return reaped


def experiment_ids_named(name: str = "", client: MlflowClient | None = None) -> list[str]:
    """The id of the experiment ``name`` ('' = every experiment of the store); one line when there is none."""
    client = client or LockRetryingClient()
    if not name:
        return [e.experiment_id for e in client.search_experiments()]
    found = client.get_experiment_by_name(name)
    if found is None:
        raise VerlflowError(f"no experiment named '{name}' in the tracking store")
    return [found.experiment_id]


def running_runs(experiment_ids: list[str], client: MlflowClient | None = None) -> list[Run]:
    """The runs of ``experiment_ids`` that MLflow shows RUNNING (at most 5000), whether or not their process lives."""
    if not experiment_ids:
        return []
    client = client or LockRetryingClient()
    return client.search_runs(experiment_ids, "attributes.status = 'RUNNING'", max_results=5000)


def current_experiment_ids(client: MlflowClient | None = None) -> list[str]:
    """The experiment a step is about to log into (``mlflow run``'s, the named one, or Default)."""
    if experiment_id := os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return [experiment_id]
    client = client or LockRetryingClient()
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
    experiment = client.get_experiment_by_name(name)
    return [experiment.experiment_id] if experiment else []


def reap_at_start(experiment_ids: list[str] | None = None) -> list[Reaped]:
    """Reap the step's experiment (default: the current one) before it runs; a refusing store costs a warning."""
    try:
        reaped = reap(experiment_ids if experiment_ids is not None else current_experiment_ids())
    except MlflowException as exc:
        from verlflow.outage.auth_errors import auth_failure

        if auth_failure(exc) is None:  # a refused user is told once, by the step's own request
            log.warning("could not check for dead RUNNING runs: %s", first_line(exc))
        return []
    for item in reaped:
        log.warning("run %s was RUNNING without a process: marked FAILED (%s)", item.run_id, item.reason)
    return reaped


# --------------------------------------------------------------------------- dying with the launcher


def die_with_launcher(signum: int = signal.SIGTERM) -> int | None:
    """When started by ``mlflow run``, receive ``signum`` as soon as that launcher dies; returns its pid.

    The signal takes the same path as a SIGTERM sent to this process: the run ends KILLED with its
    metrics and last checkpoint kept, and a verl launch passes it to verl's process group or Ray job.
    The direct parent is covered by the kernel (``PR_SET_PDEATHSIG``); a launcher behind a shell by a
    watcher thread polling it every :data:`LAUNCHER_POLL_S`.
    """
    launcher = find_launcher()
    if launcher is None:
        return None
    kernel_signals = False
    if launcher == os.getppid():
        with contextlib.suppress(OSError, AttributeError):
            kernel_signals = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    start = process_start(launcher)
    me = os.getpid()

    def watch() -> None:
        while process_alive(launcher, start):
            time.sleep(LAUNCHER_POLL_S)
        log.warning("the mlflow run launcher (pid %d) is gone: stopping this step", launcher)
        if not kernel_signals:  # the kernel has sent it already: a second one landed while the run was ending
            os.kill(me, signum)

    if not process_alive(launcher, start):  # it died before the watch began
        os.kill(me, signum)
    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
    return launcher
