"""What a train run logs through: a small interface that each trainer backend supplies for its runs.

    python -c "from verlflow.tracking.run_logger import direct_logging; print(direct_logging().folders)"

A backend answers :meth:`verlflow.backends.registry.TrainBackend.run_logging` with a :class:`RunLogging`: the
folders its logging must be able to write (checked before the run opens) and a context that yields the
:class:`RunLogger` of an open run. The train step only enters that context and hands the open
logger to the backend's ``train``; it never learns how the logger writes. The local trainer writes nothing into
its run any other way: its logger queues metrics, tables, tags and traces to a background writer that spills to
disk during a tracking outage (:func:`buffered_logging`) and writes the run's description at once. verl logs
through its own tracker, so its runs get :func:`direct_logging`, each call written at once with MLflow's client.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


class RunLogger(Protocol):
    """Everything a trainer writes into its run: metrics, tables, tags, its description (params, text, files),
    rollout traces and checkpoints as models; :meth:`flush` waits until what was logged is written.

    Metrics, tables, tags and traces may be queued (a buffered logger writes them in order with the steps and
    keeps them through an outage); the description is written at once, so a run whose params conflict is refused
    at set-up. A write the store refused raises one of :func:`store_errors`."""

    run_id: str

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Log ``metrics`` at ``step`` (now, unless ``timestamp_ms`` gives the time they were measured)."""

    def log_table(self, data: Mapping[str, list], artifact_file: str) -> None:
        """Log a table (columns by name) as the run's artifact ``artifact_file`` (``mlflow.log_table``)."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set tags on the run."""

    def log_traces(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Record ``rows`` (``{"prompt", "response", "reward"}`` each) as the run's rollout traces of ``step``,
        with verl's tags (:mod:`verlflow.outage.rollout_traces`)."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log the run's params at once (a param the run holds with another value raises the store's error)."""

    def log_text(self, text: str, artifact_file: str) -> None:
        """Write ``text`` as the run's artifact ``artifact_file`` at once."""

    def log_artifact(self, path: str | Path, artifact_path: str) -> None:
        """Copy the local file ``path`` into the run's artifact folder ``artifact_path`` at once."""

    def log_checkpoint_model(self, checkpoint: str | Path, step: int) -> None:
        """Record an intermediate checkpoint as a LoggedModel of the run at ``step``; a store that does not answer
        costs a warning, never the training (:func:`verlflow.outage.logged_models.record_checkpoint_model`)."""

    def log_final_model(self, checkpoint: str | Path, step: int) -> None:
        """Record the final checkpoint as the run's model at ``step``, its metrics linked (a store that does not
        answer: queued behind the metrics, or a warning; :func:`verlflow.outage.logged_models.record_final_model`)."""

    def log_summaries(self, started_at: float) -> dict[str, float]:
        """Log the end-of-run timings (``timing_s/e2e`` from ``started_at``, ``timing_s_mean/*``) once the steps
        are in, and return them (:mod:`verlflow.outage.summaries`)."""

    def last_step(self, key: str) -> int:
        """The highest step of metric ``key`` the run already holds (-1 when none): what a resumed run skips."""

    def flush(self, wait_s: float | None = None) -> bool:
        """Wait (at most ``wait_s``) until everything logged is written; True when it is."""


def store_errors() -> tuple[type[Exception], ...]:
    """What a logger's write raises when the tracking store is away or refuses it: for a caller to whom the
    write is best effort (a samples table costs a warning, never the training)."""
    from mlflow.exceptions import MlflowException

    return (MlflowException, OSError)


class DirectLogger:
    """A :class:`RunLogger` that writes each call at once through MLflow's client (no buffer, no spill), waiting
    out another process's SQLite lock (:func:`verlflow.outage.store_retry.retry_on_lock`)."""

    def __init__(self, run_id: str, client: MlflowClient | None = None):
        from mlflow.tracking import MlflowClient  # here: the backend registry imports this module, MLflow is slow

        self.run_id = run_id
        self.client = client or MlflowClient()
        self._last_step: tuple[int, list] | None = None  # the last step logged, for a model saved at it

    def _write(self, call: Callable[..., Any], *args: Any) -> Any:
        from verlflow.outage.store_retry import retry_on_lock

        return retry_on_lock(call, self.run_id, *args)

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Write ``metrics`` at ``step`` in one call."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        points = [Metric(k, float(v), stamp, step) for k, v in metrics.items()]
        self._write(self.client.log_batch, points)
        self._last_step = (step, points)

    def log_table(self, data: Mapping[str, list], artifact_file: str) -> None:
        """Write the table as the run's artifact ``artifact_file``."""
        self._write(self.client.log_table, dict(data), artifact_file)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Write the tags in one call."""
        from mlflow.entities import RunTag

        self._write(self.client.log_batch, [], [], [RunTag(k, str(v)) for k, v in tags.items()])

    def log_traces(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Make the traces now, as the metric writer makes a queued ``traces`` record."""
        from verlflow.outage.rollout_traces import write_traces

        if rows:
            write_traces(self.client, self.run_id, {"step": int(step), "rows": rows})

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Write the params in one call (``mlflow.log_params``)."""
        from mlflow.entities import Param

        self._write(self.client.log_batch, [], [Param(k, str(v)) for k, v in params.items()])

    def log_text(self, text: str, artifact_file: str) -> None:
        """Write the text artifact."""
        self._write(self.client.log_text, text, artifact_file)

    def log_artifact(self, path: str | Path, artifact_path: str) -> None:
        """Copy the file into the run's artifacts."""
        self._write(self.client.log_artifact, str(path), artifact_path)

    def log_checkpoint_model(self, checkpoint: str | Path, step: int) -> None:
        """Record it now, its step's metrics linked to it when that step was the last logged (else the end links
        them, :meth:`log_final_model`)."""
        from verlflow.outage import logged_models

        logged_models.record_checkpoint_model(self.run_id, checkpoint, step, link=self._link)

    def _link(self, _run_id: str, model_id: str, step: int) -> bool:
        """Link the last step's points to the model, as the metric writer links them; False: the end will."""
        from verlflow.outage import logged_models
        from verlflow.outage.store_retry import retry_on_lock

        if self._last_step is None or self._last_step[0] != step:
            return False
        try:
            retry_on_lock(logged_models.link_points, self.client, self.run_id, model_id, self._last_step[1])
        except store_errors():
            return False  # the end of training links them (logged_models.link_step_metrics)
        return True

    def log_final_model(self, checkpoint: str | Path, step: int) -> None:
        """Record it now; a store that does not answer costs a warning (``register`` makes it later)."""
        from verlflow.outage import logged_models

        logged_models.record_final_model(self.run_id, checkpoint, step)

    def log_summaries(self, started_at: float) -> dict[str, float]:
        """Log them now from the run's per-step history."""
        from verlflow.outage import summaries
        from verlflow.outage.store_retry import LockRetryingClient

        return summaries.log_timing_summaries(LockRetryingClient(), self.run_id, started_at, time.time())

    def last_step(self, key: str) -> int:
        """Read the key's history."""
        return max((m.step for m in self.client.get_metric_history(self.run_id, key)), default=-1)

    def flush(self, wait_s: float | None = None) -> bool:
        """Nothing waits: every call was written when it returned."""
        return True


@dataclass(frozen=True)
class RunLogging:
    """How a backend's runs log: ``open(run_id)`` yields the run's :class:`RunLogger` while the run trains;
    ``folders`` are ``(folder, the setting that names it)`` pairs it writes, checked before the run opens."""

    open: Callable[[str], AbstractContextManager[RunLogger]]
    folders: tuple[tuple[Path, str], ...] = ()


@contextlib.contextmanager
def _direct(run_id: str) -> Iterator[RunLogger]:
    yield DirectLogger(run_id)


def direct_logging() -> RunLogging:
    """Logging that writes straight to the tracking server and needs no folder (a backend's default)."""
    return RunLogging(open=_direct)


def buffered_logging(root: Path, setting: str) -> RunLogging:
    """Logging through a metric buffer whose writer process rides out a tracking outage, spilling to
    ``<root>/<run id>`` (:func:`verlflow.outage.metric_buffer.buffered`); ``setting`` names ``root`` for the
    line that says it is not writable."""
    from verlflow.outage import metric_buffer

    return RunLogging(open=lambda run_id: metric_buffer.buffered(run_id, root / run_id, _lock_retrying(run_id)),
                      folders=((root, setting),))


def _lock_retrying(run_id: str) -> DirectLogger:
    """A buffered logger's writer of what is not queued: at once, every store write waiting out a SQLite lock."""
    from verlflow.outage.store_retry import LockRetryingClient

    return DirectLogger(run_id, LockRetryingClient())


def logger_of(run_id: str | None = None) -> RunLogger:
    """The logger of the active run (``run_id``'s, which must be it) for a trainer called outside the train step
    (tests, benches): the metric buffer open for it (:func:`verlflow.outage.metric_buffer.buffering`), else direct."""
    import mlflow

    from verlflow.errors import VerlflowError
    from verlflow.outage import metric_buffer

    active = mlflow.active_run()
    if active is None or (run_id is not None and active.info.run_id != run_id):
        raise VerlflowError("a trainer given no logger logs into the active MLflow run: call it inside "
                            "tracking.tracked_run()")
    run_id = active.info.run_id
    return metric_buffer.open_logger(run_id, _lock_retrying(run_id)) or DirectLogger(run_id)
