"""Per-step metrics through a background writer, so a tracking-server outage never stops training.

    python -m verlflow.runs.metric_buffer outputs/local/<run_id>/metrics.spill.jsonl   # upload what an outage left

Training hands each step's metrics to :func:`log` and goes on at once. A daemon thread writes them with
their original step and timestamp, gathering the steps of :data:`WRITE_EVERY_S` seconds into one write.
When the server does not answer it keeps them, mirrors them to a JSONL spill file (so even a crash keeps
them on disk), retries every :data:`RETRY_S`, and replays them in order once the server is back. At the
end of the run :meth:`MetricBuffer.close` waits at most ``VERLFLOW_METRICS_FLUSH_S`` seconds; what is
still unwritten stays in the spill file and one line says the command that uploads it later.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from verlflow.util import first_line

logger = logging.getLogger(__name__)

RETRY_S = float(os.environ.get("VERLFLOW_METRICS_RETRY_S", "5"))
# Seconds between two writes: steps arriving meanwhile go in one write. Each write is a transaction on the
# tracking store that takes CPU from training (2 cores: a write per 0.4 s step cost ~20% wall time).
WRITE_EVERY_S = float(os.environ.get("VERLFLOW_METRICS_WRITE_S", "2"))
FLUSH_WAIT_S = float(os.environ.get("VERLFLOW_METRICS_FLUSH_S", "120"))
# MLflow's client retries a dead server for minutes per call; the buffer retries itself, so fail fast there.
_BATCH = 1000  # MLflow's log_batch limit on metrics per call
# Given to verl, whose own MLflow logger writes in the training loop: ride out minutes of outage.
VERL_HTTP_KNOBS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "12",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
}
_active: dict[str, MetricBuffer] = {}


class MetricBuffer:
    """A queue of metric points for one run, drained by a daemon thread that survives server outages."""

    def __init__(self, run_id: str, spill_path: str | os.PathLike[str], *, retry_s: float = RETRY_S,
                 write_every_s: float = WRITE_EVERY_S):
        self.run_id, self.spill_path, self.retry_s = run_id, Path(spill_path), retry_s
        self.write_every_s = write_every_s
        self._last_write = 0.0
        self._write_now = threading.Event()  # flush() and close() cut the gathering short
        self.client = MlflowClient()
        self.queue: queue.Queue[Metric | None] = queue.Queue()
        self.pending: list[Metric] = []  # taken from the queue, not yet written
        self.spilled = 0  # points of `pending` already mirrored in the spill file
        self.enqueued = 0
        self.written = 0
        self.write_cpu_s = 0.0  # CPU seconds the writer thread spent writing (what tracking costs the machine)
        self.outage_started: float | None = None
        self.longest_outage_s = 0.0
        self._closing = threading.Event()
        self._abandoned = threading.Event()  # closed with points left: they belong to the spill file now
        self._thread = threading.Thread(target=self._drain, name=f"metrics-{run_id[:8]}", daemon=True)
        self._thread.start()

    def log(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Queue one step's metrics (never blocks on the server)."""
        ts = timestamp_ms or int(time.time() * 1000)
        self.enqueued += len(metrics)
        for key, value in metrics.items():
            self.queue.put(Metric(key=key, value=float(value), timestamp=ts, step=int(step)))

    def write_soon(self) -> None:
        """Write what is queued now instead of gathering more steps first (before metrics are read back)."""
        self._write_now.set()

    def _take(self, block: bool) -> None:
        try:
            item = self.queue.get(timeout=0.2) if block else self.queue.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            self.pending.append(item)
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return

    def _drain(self) -> None:
        _yield_cpu_to_training()
        while not self._abandoned.is_set():
            self._take(block=not self.pending)
            if not self.pending:
                if self._closing.is_set() and self.queue.empty():
                    return
                continue
            wait = self._last_write + self.write_every_s - time.monotonic()
            if wait > 0 and not self._closing.is_set():
                self._write_now.wait(wait)
                self._take(block=False)
            self._write_now.clear()
            try:
                while self.pending and not self._abandoned.is_set():  # batch by batch: none written twice
                    batch = self.pending[:_BATCH]
                    started = time.thread_time()
                    try:
                        self.client.log_batch(self.run_id, metrics=batch)
                    finally:
                        self.write_cpu_s += time.thread_time() - started
                    self.pending = self.pending[len(batch):]
                    self.spilled = max(0, self.spilled - len(batch))
                    self.written += len(batch)
                self._last_write = time.monotonic()
            except Exception as exc:  # any failure of the server or the network: keep, spill, retry
                self._on_failure(exc)
                if self._closing.is_set():
                    time.sleep(min(1.0, self.retry_s))
                else:
                    self._closing.wait(self.retry_s)
                continue
            if self.outage_started is not None:
                outage = time.time() - self.outage_started
                self.longest_outage_s = max(self.longest_outage_s, outage)
                logger.warning("tracking server back after %.0f s: metrics replayed", outage)
                self.outage_started = None
            with contextlib.suppress(FileNotFoundError):
                self.spill_path.unlink()

    def _on_failure(self, exc: Exception) -> None:
        if self.outage_started is None:
            self.outage_started = time.time()
            logger.warning("tracking server not answering (%s): metrics kept in %s, training goes on",
                        first_line(exc, 200), self.spill_path)
        new = self.pending[self.spilled:]
        if new:
            self.spill_path.parent.mkdir(parents=True, exist_ok=True)
            with self.spill_path.open("a") as out:
                for m in new:
                    out.write(json.dumps({"run_id": self.run_id, "key": m.key, "value": m.value,
                                          "timestamp": m.timestamp, "step": m.step}) + "\n")
            self.spilled = len(self.pending)

    def close(self, wait_s: float = FLUSH_WAIT_S) -> int:
        """Wait up to ``wait_s`` for every point to be written; returns how many are left in the spill file."""
        self._closing.set()
        self._write_now.set()
        self._thread.join(wait_s)
        if not self._thread.is_alive():
            return 0
        self._abandoned.set()
        self._thread.join(float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")) + 5)
        self._take(block=False)
        left = len(self.pending)
        self._on_failure(RuntimeError("still unreachable at the end of the run"))
        print(f"verlflow: {left} metric points could not reach the tracking server; upload them later with: "
              f"python -m verlflow.runs.metric_buffer {self.spill_path}", file=sys.stderr, flush=True)
        return left


def _yield_cpu_to_training() -> None:
    """Give the calling thread the lowest CPU priority (Linux, where priority is per thread).

    The writer's work is real (MLflow's SQL store spends ~0.1 ms per point) but never urgent: at the
    lowest priority it runs when training leaves a core idle (tokenizing, scoring, Python between
    kernels) instead of taking turns with the training threads. It still gets a share of a busy CPU,
    and everything left is written at the end of the run.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def flush(run_id: str, wait_s: float = FLUSH_WAIT_S) -> bool:
    """Wait (at most ``wait_s``) until the buffer of ``run_id`` has written everything; True when it has."""
    buffer = _active.get(run_id)
    deadline = time.monotonic() + wait_s
    while buffer is not None and buffer.written < buffer.enqueued:
        buffer.write_soon()
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def log(run_id: str, metrics: Mapping[str, float], step: int) -> bool:
    """Queue metrics for ``run_id`` when a buffer is open for it; False when there is none (log directly)."""
    buffer = _active.get(run_id)
    if buffer is None:
        return False
    buffer.log(metrics, step)
    return True


@contextlib.contextmanager
def buffering(run_id: str, spill_dir: str | os.PathLike[str]) -> Iterator[MetricBuffer]:
    """Route :func:`verlflow.tracking.log_metrics` of ``run_id`` through a buffer while the block runs."""
    buffer = MetricBuffer(run_id, Path(spill_dir) / "metrics.spill.jsonl")
    _active[run_id] = buffer
    try:
        yield buffer
    finally:
        _active.pop(run_id, None)
        buffer.close()


def upload_spill(path: str | os.PathLike[str]) -> int:
    """Write a spill file's points into their runs (original step and timestamp); removes the file. Returns count."""
    by_run: dict[str, list[Metric]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            p = json.loads(line)
            by_run.setdefault(p["run_id"], []).append(Metric(p["key"], p["value"], p["timestamp"], p["step"]))
    client = MlflowClient()
    for run_id, points in by_run.items():
        for start in range(0, len(points), _BATCH):
            client.log_batch(run_id, metrics=points[start:start + _BATCH])
    Path(path).unlink()
    return sum(len(v) for v in by_run.values())


if __name__ == "__main__":
    count = upload_spill(sys.argv[1])
    print(f"uploaded {count} metric points from {sys.argv[1]}")
