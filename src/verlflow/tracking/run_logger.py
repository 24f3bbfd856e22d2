"""What a train run logs through: a small interface that each trainer backend supplies for its runs.

    python -c "from verlflow.tracking.run_logger import direct_logging; print(direct_logging().folders)"

A backend answers :meth:`verlflow.backends.registry.TrainBackend.run_logging` with a :class:`RunLogging`: the
folders its logging must be able to write (checked before the run opens) and a context that yields the
:class:`RunLogger` of an open run. The train step only enters that context; it never learns how the logger
writes. The local trainer's logger queues everything to a background writer that spills to disk during a
tracking outage (:func:`verlflow.outage.metric_buffer.buffered`); verl logs through its own tracker, so its runs
get :func:`direct_logging`, each call written at once with MLflow's client.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


class RunLogger(Protocol):
    """Log a run's metrics, tables and tags; :meth:`flush` waits until what was logged is written."""

    run_id: str

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Log ``metrics`` at ``step`` (now, unless ``timestamp_ms`` gives the time they were measured)."""

    def log_table(self, data: Mapping[str, list], artifact_file: str) -> None:
        """Log a table (columns by name) as the run's artifact ``artifact_file`` (``mlflow.log_table``)."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set tags on the run."""

    def flush(self, wait_s: float | None = None) -> bool:
        """Wait (at most ``wait_s``) until everything logged is written; True when it is."""


class DirectLogger:
    """A :class:`RunLogger` that writes each call at once through MLflow's client (no buffer, no spill)."""

    def __init__(self, run_id: str, client: MlflowClient | None = None):
        from mlflow.tracking import MlflowClient  # here: the backend registry imports this module, MLflow is slow

        self.run_id = run_id
        self.client = client or MlflowClient()

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Write ``metrics`` at ``step`` in one call."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), stamp, step) for k, v in metrics.items()])

    def log_table(self, data: Mapping[str, list], artifact_file: str) -> None:
        """Write the table as the run's artifact ``artifact_file``."""
        self.client.log_table(self.run_id, dict(data), artifact_file)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Write the tags in one call."""
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

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
