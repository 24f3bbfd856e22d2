"""Per-step metrics through a background writer process, so tracking neither slows nor stops training.

    MLFLOW_TRACKING_URI=http://host:5000 verlflow runs upload-spill outputs/local/<run>/metrics.spill.jsonl

Training hands each step's metrics (and its samples tables, traces, tags, model links) to its run's
:class:`BufferedLogger` (:func:`buffered`) and goes on at once. A writer *process* at the lowest CPU priority
writes them in order with their original step and timestamp, gathering the steps of :data:`WRITE_EVERY_S`
seconds into one write. When the server does not answer it keeps them, mirrors them to a JSONL spill file
(:mod:`.spill`, so even a crash keeps them on disk), retries every :data:`RETRY_S`, and replays them once
the server is back. At the end of the run :meth:`MetricBuffer.close` waits at most ``VERLFLOW_METRICS_FLUSH_S``
seconds; what is still unwritten stays in the spill file and one line gives the command above, which uploads
it later from any shell and sets the run's final status.

Nothing between the two processes can wait on a dead one: they talk over two one-way pipes (steps in,
"written" counts out), each end held by one process only, so a dead peer shows as end-of-file, never as a
lock that is not released. The trainer keeps every step until the writer reports it written: when the
writer dies (SIGKILL, the OOM killer) the trainer notices at its next step, takes those steps back and
hands them to a new writer. When the trainer dies, the writer reads the end of its pipe, writes what it has
once (spilling it if the server is away) and exits.

Why a process and not a thread: MLflow's SQL store spends ~0.1 ms of Python per point, holding the GIL. A
writer thread made the trainer's thread wait for the GIL, and at low priority it was descheduled while
holding it (a priority inversion): 1-2% of a small model's step. A process shares no GIL, and at nice 19 it
runs when training leaves a core free (bench/grpo_vs_trl.py measures both).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from verlflow.names import TIMING_E2E
from verlflow.outage import logged_models, spill, summaries
from verlflow.outage.metric_writer import WRITER_HTTP_KNOBS, cap_http  # noqa: F401  (naming's bound)
from verlflow.outage.summaries import TimingSums
from verlflow.outage.writer_handle import (  # noqa: F401  (MetricBuffer and the settings: this module's API)
    FLUSH_WAIT_S,
    MAX_WRITERS,
    RETRY_S,
    WRITE_EVERY_S,
    MetricBuffer,
    spilled,
)
from verlflow.util import environ_restored, first_line

# Given to verl, whose own MLflow logger writes in the training loop: ride out minutes of outage.
VERL_HTTP_KNOBS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "12",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
}
# The training process's own calls while a buffer is open (heartbeat, system metrics, reading metrics back):
# a few seconds each at most, instead of MLflow's default minutes of retries.
TRAINING_HTTP_KNOBS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": 2,
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": 1,
    "MLFLOW_HTTP_REQUEST_TIMEOUT": 10,
}
# The upload command's calls: a refused one (an artifact store that takes no writes) fails in seconds.
UPLOAD_HTTP_KNOBS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": 2,
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": 1,
    "MLFLOW_HTTP_REQUEST_TIMEOUT": 60,
}
_active: dict[str, MetricBuffer] = {}


@contextlib.contextmanager
def bounded_http(knobs: Mapping[str, float] = TRAINING_HTTP_KNOBS) -> Iterator[None]:
    """Cap MLflow's HTTP retries and timeout (its public env settings) for the calls made in the block.

    A smaller value already set is kept; the previous values come back afterwards.
    """
    with environ_restored(list(knobs)):
        cap_http(knobs)
        yield


def flush(run_id: str, wait_s: float = FLUSH_WAIT_S) -> bool:
    """Wait (at most ``wait_s``) until the buffer of ``run_id`` has written everything; True when it has.

    False at once while the tracking server is away: the end of the run waits for it, not every read.
    """
    buffer = _active.get(run_id)
    return buffer is None or buffer.flush(wait_s)


def log(run_id: str, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> bool:
    """Queue metrics for ``run_id`` when a buffer is open for it; False when there is none (log directly)."""
    buffer = _active.get(run_id)
    if buffer is None:
        return False
    buffer.log(metrics, step, timestamp_ms)
    return True


def defer_summaries(run_id: str, started_at: float, ended_at: float) -> bool:
    """Have the writer log the run's summaries once the steps before them are in; False when no buffer is open.

    The record carries the timing sums of the steps this buffer logged, so its replay is one write."""
    buffer = _active.get(run_id)
    return buffer is not None and _record(run_id, {"kind": "summaries", "started_at": started_at,
                                                   "ended_at": ended_at, **buffer.timing.as_record()})


def timing_sums(run_id: str) -> TimingSums | None:
    """The per-step timing sums of what ``run_id``'s open buffer logged (None when none is open)."""
    buffer = _active.get(run_id)
    return None if buffer is None else buffer.timing


def link_model(run_id: str, model_id: str, step: int) -> bool:
    """Link the points of ``step`` to the LoggedModel ``model_id`` behind them in the writer (one write, kept in
    the spill file during an outage); False when no buffer is open or it logged another step last."""
    buffer = _active.get(run_id)
    return buffer is not None and buffer.link_model(model_id, step)


def _record(run_id: str, record: dict[str, Any]) -> bool:
    buffer = _active.get(run_id)
    if buffer is None:
        return False
    buffer.log_record(record)
    return True


def defer_end(run_id: str, status: str, tags: Mapping[str, str] | None = None) -> bool:
    """When ``run_id``'s buffer left a spill file, append the run's end (tags, status) to it and return True.

    The upload command then ends the run as it would have ended; the caller skips the unreachable server.
    """
    path = spilled.pop(run_id, None)
    if path is None:
        return False
    records = [{"kind": "tags", "tags": dict(tags)}] if tags else []
    try:
        spill.append(path, run_id, [*records, {"kind": "status", "status": status,
                                               "end_time": int(time.time() * 1000)}])
    except spill.SpillFull as full:
        print(f"verlflow: {full}: run {run_id}'s final status {status} is not in {path.name}; the tracking server "
              "shows the run RUNNING after the upload", file=sys.stderr, flush=True)
        return True
    print(f"verlflow: run {run_id} is {status}; the tracking server shows it once the command above has run",
          file=sys.stderr, flush=True)
    return True


@contextlib.contextmanager
def buffering(run_id: str, spill_dir: str | os.PathLike[str]) -> Iterator[MetricBuffer]:
    """Route ``run_id``'s metrics, tables and tags through a buffer while the block runs, and cap the block's
    own MLflow calls at a few seconds each (:data:`TRAINING_HTTP_KNOBS`): an outage costs training a warning."""
    with bounded_http():
        buffer = MetricBuffer(run_id, Path(spill_dir) / "metrics.spill.jsonl")
        _active[run_id] = buffer
        try:
            yield buffer
        finally:
            _active.pop(run_id, None)
            buffer.close()


class BufferedLogger:
    """The run logger (:class:`verlflow.tracking.run_logger.RunLogger`) of a run whose buffer is open.

    Metrics, tables, tags, traces, model links, the final model and the summaries go through the writer
    process in order with the steps (an outage keeps them in the spill file); the run's description (params,
    text, files) and its checkpoints' LoggedModels are written at once, the description by ``direct`` (a
    :class:`verlflow.tracking.run_logger.DirectLogger` of the run)."""

    def __init__(self, buffer: MetricBuffer, direct: Any):
        self.buffer, self.direct = buffer, direct
        self.run_id = buffer.run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Queue ``metrics`` at ``step`` for the writer."""
        self.buffer.log(metrics, step, timestamp_ms)

    def log_table(self, data: Mapping[str, list], artifact_file: str) -> None:
        """Queue a table (``mlflow.log_table``), in order with the steps."""
        self.buffer.log_record({"kind": "table", "artifact_file": artifact_file, "data": dict(data)})

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Queue tags, in order with the steps."""
        self.buffer.log_record({"kind": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def log_traces(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Queue a step's rollout traces: written by the writer (:mod:`.rollout_traces`), spilled in an outage."""
        if rows:
            self.buffer.log_record({"kind": "traces", "step": int(step), "rows": rows})

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Write the params at once (the store's error when the run holds another value for one)."""
        self.direct.log_params(params)

    def log_text(self, text: str, artifact_file: str) -> None:
        """Write the text artifact at once."""
        self.direct.log_text(text, artifact_file)

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str) -> None:
        """Copy the file into the run's artifacts at once."""
        self.direct.log_artifact(path, artifact_path)

    def log_checkpoint_model(self, checkpoint: str | os.PathLike[str], step: int) -> None:
        """Record it at once; the writer links its step's points to it behind them (one write, spilled in an
        outage) when that step was the last logged, else the end links them."""
        logged_models.record_checkpoint_model(self.run_id, checkpoint, step,
                                              link=lambda _run, model_id, at: self.buffer.link_model(model_id, at))

    def log_final_model(self, checkpoint: str | os.PathLike[str], step: int) -> None:
        """Record it at once; while the store does not answer it is queued behind the run's metrics, made when
        the server answers or by the spill file's upload."""
        logged_models.record_final_model(self.run_id, checkpoint, step, defer=self._defer_final_model)

    def _defer_final_model(self, _run_id: str, checkpoint: str, step: int) -> bool:
        self.buffer.log_record({"kind": "final_model", "checkpoint": checkpoint, "step": step})
        return True

    def log_summaries(self, started_at: float) -> dict[str, float]:
        """Log them from the timing sums of the steps this buffer logged, once those are written; while the
        server is away the writer logs them after the steps (or the spill file's upload does)."""
        ended_at = time.time()
        if not self.buffer.flush(FLUSH_WAIT_S):  # the means are over the whole per-step history
            self.buffer.log_record({"kind": "summaries", "started_at": started_at, "ended_at": ended_at,
                                    **self.buffer.timing.as_record()})
            return {TIMING_E2E: ended_at - started_at}
        return summaries.log_timing_summaries(self.direct.client, self.run_id, started_at, ended_at,
                                              self.buffer.timing)

    def last_step(self, key: str) -> int:
        """Read the key's history from the store (what this buffer queued is later steps)."""
        return self.direct.last_step(key)

    def flush(self, wait_s: float | None = None) -> bool:
        """Wait (at most ``wait_s``, default ``VERLFLOW_METRICS_FLUSH_S``) until the writer wrote everything."""
        return self.buffer.flush(FLUSH_WAIT_S if wait_s is None else wait_s)


def open_logger(run_id: str, direct: Any) -> BufferedLogger | None:
    """The logger of ``run_id``'s buffer while one is open (:func:`buffering`), writing at once through ``direct``
    what is not queued; None when none is open."""
    buffer = _active.get(run_id)
    return None if buffer is None else BufferedLogger(buffer, direct)


@contextlib.contextmanager
def buffered(run_id: str, spill_dir: str | os.PathLike[str], direct: Any) -> Iterator[BufferedLogger]:
    """:func:`buffering`, yielding the run's logger (``direct`` writes what is not queued): what a backend whose
    runs log through a buffer supplies (:func:`verlflow.tracking.run_logger.buffered_logging`)."""
    with buffering(run_id, spill_dir) as buffer:
        yield BufferedLogger(buffer, direct)


def upload_spill(path: str | os.PathLike[str]) -> int:
    """Write a spill file into its runs (points with their step and time, tables, tags, final status); renames it
    ``<file>.uploaded``. Idempotent, and tolerant of a torn or damaged line (:func:`verlflow.outage.spill.upload`)."""
    return spill.upload(path)


def main(path: str) -> int:
    """``verlflow runs upload-spill <spill file>`` (or ``python -m verlflow.outage.metric_buffer <spill file>``):
    upload it; a second run says it was already done; a path that is no spill file is one line, 2."""
    if not Path(path).exists() and spill.uploaded_marker(path).exists():
        print(f"{path}: already uploaded (see {spill.uploaded_marker(path)}): nothing to do")
        return 0
    if problem := spill.not_a_spill_file(path):
        print(f"verlflow: error: {problem}", file=sys.stderr)
        return 2
    try:
        with bounded_http(UPLOAD_HTTP_KNOBS):  # a refused write is reported in seconds, not after minutes of retries
            count = upload_spill(path)
    except spill.SpillRefused as refused:
        print(f"verlflow: error: {refused}", file=sys.stderr)
        return 2
    except spill.UploadIncomplete as partial:
        print(f"uploaded {partial.count} metric points from {path}; the {partial.kept} records above are kept in it: "
              "run the same command again once their cause is fixed", file=sys.stderr)
        return 1
    except Exception as exc:  # the server does not answer (or refuses the run): the file is kept as it was
        print(f"verlflow: error: the tracking server did not take {path} ({first_line(exc, 200)}): the file is "
              "kept; run the same command again once it answers", file=sys.stderr)
        return 1
    print(f"uploaded {count} metric points from {path}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: verlflow runs upload-spill <spill file>", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
