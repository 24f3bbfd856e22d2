"""Run lifecycle and naming conventions shared by every step and both backends.

    python -c "from verlflow.tracking.tracking import sanitize_metric_key; print(sanitize_metric_key('mean@1'))"

- :func:`tracked_run` opens (or, under ``mlflow run``, attaches to) a run and guarantees its end state:
  FINISHED on success, FAILED on an error, KILLED on SIGTERM/SIGINT. Nothing it opened is left RUNNING.
  A signal never raises inside the run (:mod:`verlflow.stopping`): it sets ``stopping.STOP``, the body's own safe
  points end it (``stopping.stop_point``), and so do the run's start and the end of its body. A stop ends the run
  KILLED whatever the body raised after it (a request riding out its timeout), with one short try at the server.
- Params are the resolved verl config flattened *by verl's own function*, so local and verl runs carry
  identical keys; metric keys are sanitized *by verl's own MLflow adapter* (``@`` → ``_at_``).
- :func:`log_run_summaries` adds the end-of-run figures the §6 comparison needs: ``timing_s/e2e`` and
  ``timing_s_mean/<name>`` for every per-step ``timing_s/<name>``.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Run, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_USER

from verlflow import __version__, stopping
from verlflow.compat import verl as compat_verl
from verlflow.errors import StepFailed, VerlflowError
from verlflow.names import (
    BACKEND_TAG,
    ERROR_TAG,
    PROFILE_TAG,
    RECIPE_TAG,
    STEP_TAG,
    TIMING_E2E,
    VERSION_TAG,
)
from verlflow.outage import deadline, metric_buffer, spill, summaries
from verlflow.outage.store_retry import LockRetryingClient, retry_on_lock
from verlflow.process import lifecycle
from verlflow.processes import launcher_run_ended, watch_launcher
from verlflow.tracking import experiments, naming
from verlflow.util import filter_quote, first_line

RunInterrupted = stopping.RunInterrupted


def end_status(exc: BaseException | None) -> str:
    """The MLflow status a run ends with after ``exc`` (None: success)."""
    if exc is None:
        return "FINISHED"
    if isinstance(exc, KeyboardInterrupt):
        return "KILLED"
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return "FINISHED"
    return "FAILED"


@contextlib.contextmanager
def tracked_run(
    *,
    run_name: str | None = None,
    experiment: str | None = None,
    tags: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
    log_system_metrics: bool | None = None,
    run_id: str | None = None,
) -> Iterator[mlflow.ActiveRun]:
    """Start or attach to an MLflow run and always end it truthfully (FINISHED / FAILED / KILLED).

    ``run_id``: a run that already exists (``main``'s child run, a resumed run), attached to; else, under
    ``mlflow run``, the run ``mlflow run`` created (``MLFLOW_RUN_ID``). With ``parent_run_id`` a new child
    run is created under that parent (explicit link, as nested runs from several processes need), never
    the one ``MLFLOW_RUN_ID`` names. The run's status is set through the client, so it is right even
    when another process (verl's logger) ended the run in between. ``log_system_metrics`` is passed to
    ``mlflow.start_run`` (False where the caller samples system metrics itself: train, see system_metrics).
    ``experiment``: a training step's experiment (:mod:`verlflow.tracking.experiments`), used unless the caller
    chose one; the experiment the run lands in is marked as model training.
    """
    chosen = experiments.enter(experiment) if experiment and not run_id else None
    all_tags = {VERSION_TAG: __version__, **(tags or {})}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
        all_tags.setdefault(MLFLOW_USER, getpass.getuser())  # a run created by the client: its user, as start_run does
    if mlflow.active_run() is None:
        # the step's inputs are checked by now; dead RUNNING runs of its experiment end
        given = run_id and LockRetryingClient().get_run(run_id).info.experiment_id
        lifecycle.reap_at_start([chosen or given] if chosen or given else None)
    if parent_run_id and not run_id:  # created here: mlflow.start_run would attach to MLFLOW_RUN_ID instead
        where = chosen or LockRetryingClient().get_run(parent_run_id).info.experiment_id
        run_id = LockRetryingClient().create_run(where, tags=all_tags, run_name=run_name).info.run_id
    parent = mlflow.active_run()
    if parent is not None and chosen is None and not run_id and not os.environ.get("MLFLOW_RUN_ID"):
        chosen = parent.info.experiment_id  # a nested step (search's evaluate, register) stays with its parent
    with stopping.installed():  # from here on a SIGTERM/SIGINT ends the run KILLED, never leaves it RUNNING
        stopping.stop_point()  # a stop taken before it opens (between a pipeline's phases): none is opened
        run = retry_on_lock(mlflow.start_run, run_id=run_id, run_name=run_name, tags=all_tags,
                            nested=parent is not None, log_system_metrics=log_system_metrics, experiment_id=chosen)
        run_id = run.info.run_id
        heartbeat: lifecycle.Heartbeat | None = None
        error: BaseException | None = None
        try:
            if experiment:
                experiments.mark_training(run.info.experiment_id)
            heartbeat = lifecycle.mark_alive(run_id)  # host, pid, heartbeat: a dead run can be told and reaped
            stopping.stop_point()  # a stop while it opened: the body (a metric writer, a launch) never starts
            yield run
            stopping.stop_point()  # a stop taken in a body without safe points of its own (preprocess, register)
        except BaseException as exc:
            error = _after_stop(exc) or deadline.as_deadline(exc) or exc  # both: the end is short
            _name_failed(run_id, all_tags.get(STEP_TAG), error)
            if error is not exc:
                raise error from exc
            raise
        finally:
            if heartbeat is not None:
                heartbeat.stop()
            _end_run(run_id, error)


def _name_failed(run_id: str, step: str | None, error: BaseException) -> None:
    """A step whose work failed on good input (:class:`~verlflow.errors.StepFailed`: a full disk, out of memory) in a
    run without a name of its own names it ``<step> · failed: <why>``, not MLflow's made-up one."""
    if isinstance(error, StepFailed) and step:
        from verlflow.secrets import mask_text

        naming.name_refused_run(step, mask_text(str(error)), "failed", run_id=run_id)


# One short try at the server for a run's end after an interrupt or a deadline: SIGTERM to exit stays seconds.
END_HTTP_KNOBS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": 0, "MLFLOW_HTTP_REQUEST_TIMEOUT": 5}
_LEAVE_HTTP_KNOBS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": 0, "MLFLOW_HTTP_REQUEST_TIMEOUT": 2}


def _after_stop(exc: BaseException) -> RunInterrupted | None:
    """The stop that came before ``exc`` ended the run's body, as the run's end (KILLED): a blocking call rides out
    its own timeout after a stop and may fail doing so (a hung request), but the run ended because of the stop."""
    if isinstance(exc, KeyboardInterrupt) or not stopping.STOP.is_set():
        return None
    return stopping.interrupted()


def _end_run(run_id: str, error: BaseException | None) -> None:
    """End ``run_id`` with the status ``error`` calls for; a server that does not take it gets a spill file.

    After a stop or a tracking deadline the end is one short try (the server may be why we stop); a second Ctrl-C
    meanwhile is only recorded (the handler never raises), so it cannot leave the run RUNNING. A stop that came
    after the body's last safe point makes the end such an end, KILLED.
    """
    status = end_status(error)
    active = mlflow.active_run()
    active_here = active is not None and active.info.run_id == run_id
    failure = {ERROR_TAG: _one_line(error)} if error is not None and status != "FINISHED" else None
    # The server is away and the run's spill file ends it later: leave the run here without waiting.
    if metric_buffer.defer_end(run_id, status, failure):
        if active_here:
            with metric_buffer.bounded_http(metric_buffer.WRITER_HTTP_KNOBS), contextlib.suppress(Exception):
                mlflow.end_run(status)  # leaves the run here; its one try at the server fails fast
        return
    if spill_file(run_id).exists():  # what the server did not take waits there: the end follows it, in order
        spill_end(run_id, status, failure, reason="some of its data waits in a spill file")
        _leave(run_id if active_here else None, status)
        return
    if stopping.STOP.is_set() and status == "FINISHED":  # a stop between the body's end and here
        exc = stopping.interrupted()
        status, failure = "KILLED", {ERROR_TAG: _one_line(exc)}
    short = isinstance(error, (KeyboardInterrupt, deadline.TrackingDeadline)) or stopping.STOP.is_set()
    try:
        if not short:
            return _write_end(run_id, status, failure, active_here)
        with metric_buffer.bounded_http(END_HTTP_KNOBS):
            _write_end(run_id, status, failure, active_here)
            if status == "KILLED":  # mlflow run's launcher would turn it FAILED once this step has exited
                watch_launcher(run_id)
    except (MlflowException, deadline.TrackingDeadline) as exc:
        spill_end(run_id, status, failure, reason=first_line(exc))
        _leave(run_id if active_here else None, status)


def _leave(active_run_id: str | None, status: str) -> None:
    """Leave this process's active run whose end was spilled: one brief try, the server is known to be sick."""
    if active_run_id is not None:
        with metric_buffer.bounded_http(_LEAVE_HTTP_KNOBS), contextlib.suppress(Exception):
            mlflow.end_run(status)


def _write_end(run_id: str, status: str, failure: Mapping[str, str] | None, active_here: bool) -> None:
    if failure:
        retry_on_lock(LockRetryingClient().set_tag, run_id, ERROR_TAG, failure[ERROR_TAG])
    if active_here:
        retry_on_lock(mlflow.end_run, status)
    else:
        retry_on_lock(LockRetryingClient().set_terminated, run_id, status)
    launcher_run_ended(run_id, status)  # a later signal's watcher keeps this end past mlflow run's launcher


def spill_file(run_id: str) -> Path:
    """Where a step keeps what the tracking server did not take for ``run_id``: ``outputs/spill/<run_id>…``."""
    return Path.cwd() / "outputs" / "spill" / f"{run_id}.spill.jsonl"


def spill_metrics(run_id: str, metrics: Mapping[str, float], step: int = 0) -> Path:
    """Keep metrics the server did not take in ``run_id``'s spill file, uploaded with the run's end."""
    now = int(time.time() * 1000)
    path = spill_file(run_id)
    spill.append(path, run_id, [(key, float(value), now, step) for key, value in metrics.items()])
    return path


def spill_end(run_id: str, status: str, tags: Mapping[str, str] | None, *, reason: str) -> Path:
    """Write ``run_id``'s end (tags, final status) to its spill file and print the command that uploads it."""
    path = spill_file(run_id)
    records = [{"kind": "tags", "tags": dict(tags)}] if tags else []
    spill.append(path, run_id, [*records, {"kind": "status", "status": status, "end_time": int(time.time() * 1000)}])
    print(f"verlflow: the tracking server did not take the end of run {run_id} ({reason}); it is {status} and "
          f"waits in {path}: once the server answers, upload it with\n  "
          f"{spill.upload_command(path, mlflow.get_tracking_uri())}", file=sys.stderr, flush=True)
    return path


def _one_line(exc: BaseException) -> str:
    """``Type: first line`` of an exception, secrets masked, for the error tag of a failed run."""
    from verlflow.secrets import mask_text

    return f"{type(exc).__name__}: {mask_text(first_line(exc, 480))}" if str(exc).strip() else type(exc).__name__


def flatten_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten a resolved config exactly as verl's MLflow logger does (``a/b/c``, lists as ``x/list_len``), with
    verl's own function (:func:`verlflow.compat.verl.mlflow_params`): local runs' param keys equal verl runs'."""
    return compat_verl.mlflow_params(config)


def log_verl_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """Log the resolved verl config as params with verl's own keys; local runs only (verl logs its own)."""
    from verlflow.secrets import mask_value

    params = flatten_params(config)
    retry_on_lock(mlflow.log_params, {k: ("None" if v is None else mask_value(k, v)) for k, v in params.items()})
    return params


# A key verl's sanitizer leaves unchanged: no '@', no '//', only [/\w.\- :] (its own allowed set). Such
# keys skip importing verl (seconds), which `compare` would otherwise pay for a no-op.
_CLEAN_KEY = re.compile(r"(?!.*//)[/\w.\- :]*")


def sanitize_metric_key(key: str) -> str:
    """Sanitize a metric name the way verl's MLflow logger does (``@`` → ``_at_``, invalid chars → ``_``)."""
    if _CLEAN_KEY.fullmatch(key):
        return key
    return compat_verl.metric_key_sanitizer()(key)


def log_metrics(metrics: Mapping[str, float], step: int) -> None:
    """Log per-step metrics into the active run with verl's key sanitizing (as verl itself would).

    Inside :func:`verlflow.outage.metric_buffer.buffering` (every train run) the step is queued and written by the
    buffer's writer process, so a training step never waits for the store; :func:`flush_metrics` waits
    for it before the metrics are read back.
    """
    clean = {sanitize_metric_key(k): float(v) for k, v in metrics.items()}
    active = mlflow.active_run()
    if active is None or not metric_buffer.log(active.info.run_id, clean, step):  # buffered: outage-proof
        retry_on_lock(mlflow.log_metrics, clean, step=step)


def flush_metrics() -> None:
    """Wait (bounded) until the active run's buffered per-step metrics are in the tracking store."""
    active = mlflow.active_run()
    if active is not None:
        metric_buffer.flush(active.info.run_id)


def log_run_summaries(run_id: str, started_at: float, *, ended_at: float | None = None) -> dict[str, float]:
    """Log ``timing_s/e2e`` and ``timing_s_mean/<name>`` (mean over steps of every ``timing_s/<name>``).

    While the tracking server is away the buffer's writer logs them once the steps are in (later, from the
    spill file, if the run ends first): the means need the whole per-step history.
    """
    ended_at = ended_at or time.time()
    # the per-step history the means are taken over
    if not metric_buffer.flush(run_id) and metric_buffer.defer_summaries(run_id, started_at, ended_at):
        return {TIMING_E2E: ended_at - started_at}
    return summaries.log_timing_summaries(LockRetryingClient(), run_id, started_at, ended_at,
                                          metric_buffer.timing_sums(run_id))


def standard_tags(*, backend: str, recipe: str, profile: str) -> dict[str, str]:
    """The ``verlflow.*`` tags every training run carries."""
    return {
        BACKEND_TAG: backend,
        RECIPE_TAG: recipe,
        PROFILE_TAG: profile,
        VERSION_TAG: __version__,
    }


def log_device_profile(profile: Any) -> None:
    """Log a device profile as tags and as the artifact ``device_profile.json``."""
    retry_on_lock(mlflow.set_tags, profile.to_tags())
    retry_on_lock(mlflow.log_dict, profile.to_dict(), "device_profile.json")


def get_run(run_ref: str) -> Run:
    """Find a run by id, or by run name when no run has that id; one clear line when neither exists."""
    client = MlflowClient()
    try:
        return client.get_run(run_ref)
    except MlflowException:
        pass
    escaped = filter_quote(run_ref)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, filter_string=f"attributes.run_name = '{escaped}'", max_results=2)
    if not runs:
        raise VerlflowError(f"no run with id or name '{run_ref}' in the tracking store {mlflow.get_tracking_uri()}")
    if len(runs) > 1:
        raise VerlflowError(f"run name '{run_ref}' is ambiguous: give a run id ({runs[0].info.run_id}, …)")
    return runs[0]


def parent_run_id(run: Run) -> str | None:
    """The run's parent (``main``'s run for a step, the study's for a search trial); None for a top-level run."""
    return run.data.tags.get(MLFLOW_PARENT_RUN_ID)


def is_finished(run: Run) -> bool:
    """Whether a run ended successfully."""
    return run.info.status == RunStatus.to_string(RunStatus.FINISHED)
