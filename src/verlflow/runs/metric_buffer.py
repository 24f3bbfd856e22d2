"""Per-step metrics through a background writer process, so tracking neither slows nor stops training.

    python -m verlflow.runs.metric_buffer outputs/local/<run_id>/metrics.spill.jsonl   # upload what an outage left

Training hands each step's metrics to :func:`log` and goes on at once. A writer *process* at the lowest CPU
priority writes them with their original step and timestamp, gathering the steps of :data:`WRITE_EVERY_S`
seconds into one write. When the server does not answer it keeps them, mirrors them to a JSONL spill file
(so even a crash keeps them on disk), retries every :data:`RETRY_S`, and replays them in order once the
server is back. At the end of the run :meth:`MetricBuffer.close` waits at most ``VERLFLOW_METRICS_FLUSH_S``
seconds; what is still unwritten stays in the spill file and one line says the command that uploads it later.

Why a process and not a thread: MLflow's SQL store spends ~0.1 ms of Python per point, holding the GIL. A
writer thread made the trainer's thread wait for the GIL, and at low priority it was descheduled while
holding it (a priority inversion): 1-2% of a small model's step. A process shares no GIL, and at nice 19 it
runs when training leaves a core free (bench/grpo_vs_trl.py measures both).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import multiprocessing
import os
import queue
import signal
import sys
import time
import types
from collections.abc import Iterator, Mapping
from pathlib import Path

from verlflow.util import env_number, first_line

logger = logging.getLogger(__name__)

RETRY_S = env_number("VERLFLOW_METRICS_RETRY_S", 5.0, minimum=0)
# Seconds between two writes: steps arriving meanwhile go in one write. Each write is a transaction on the
# tracking store that takes CPU from training (2 cores: a write per 0.4 s step cost ~20% wall time).
WRITE_EVERY_S = env_number("VERLFLOW_METRICS_WRITE_S", 2.0, minimum=0)
FLUSH_WAIT_S = env_number("VERLFLOW_METRICS_FLUSH_S", 120.0, minimum=0)
WRITER_NICE = int(env_number("VERLFLOW_METRICS_NICE", 19, integer=True))
_BATCH = 1000  # MLflow's log_batch limit on metrics per call
# Given to verl, whose own MLflow logger writes in the training loop: ride out minutes of outage.
VERL_HTTP_KNOBS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "12",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
}
_active: dict[str, MetricBuffer] = {}
# One step on the way to the writer: (step, timestamp in ms, [(key, value), ...]); None ends the stream.
Step = tuple[int, int, list[tuple[str, float]]]
# One metric point as the writer keeps and spills it: (key, value, timestamp in ms, step), MLflow Metric's order.
Point = tuple[str, float, int, int]


class MetricBuffer:
    """The training side of one run's writer process: queues steps, and knows how many points are written."""

    def __init__(self, run_id: str, spill_path: str | os.PathLike[str], *, retry_s: float = RETRY_S,
                 write_every_s: float = WRITE_EVERY_S):
        import mlflow

        self.run_id, self.spill_path = run_id, Path(spill_path)
        self.enqueued = 0
        # Steps the writer has not yet reported written (it writes in order): if it dies they go to the spill file.
        self._unwritten: collections.deque[Step] = collections.deque()
        self._forgotten = 0  # points dropped from _unwritten once written
        self._said_writer_ended = False
        # spawn, not fork: a forked child would inherit the trainer's threads' locks and its store connections
        context = multiprocessing.get_context("spawn")
        self._queue: multiprocessing.Queue[Step | None] = context.Queue()
        self._written = context.Value("q", 0)  # points the writer has stored
        self._write_cpu = context.Value("d", 0.0)  # CPU seconds the writer spent writing them
        self._write_now = context.Event()  # flush() and close() cut the gathering short
        self._abandon = context.Event()  # close() gave up waiting: spill what is left and exit
        self._process = context.Process(
            target=_write_until_closed, name=f"verlflow-metrics-{run_id[:8]}", daemon=True,
            args=(self._queue, run_id, mlflow.get_tracking_uri(), str(self.spill_path), retry_s, write_every_s,
                  self._written, self._write_cpu, self._write_now, self._abandon))
        with _main_module_hidden():
            self._process.start()

    @property
    def written(self) -> int:
        """Points stored in the tracking store so far."""
        return self._written.value

    @property
    def write_cpu_s(self) -> float:
        """CPU seconds the writer process spent in writes (what tracking costs the machine)."""
        return self._write_cpu.value

    @property
    def writing(self) -> bool:
        """Whether the writer process is still there to write (False once it has ended or died)."""
        return self._process.is_alive()

    @property
    def writer_pid(self) -> int | None:
        """The writer process's id (its CPU is not the trainer's)."""
        return self._process.pid

    def log(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Queue one step's metrics (never blocks on the server or on the writer)."""
        item = (int(step), timestamp_ms or int(time.time() * 1000), [(k, float(v)) for k, v in metrics.items()])
        self.enqueued += len(item[2])
        self._unwritten.append(item)
        self._queue.put(item)
        self._forget_written()
        if not self._said_writer_ended and not self._process.is_alive():
            self._said_writer_ended = True
            logger.warning("the metric writer process has ended (exit code %s): metrics from step %d on are kept "
                           "and go to %s when the run ends", self._process.exitcode, item[0], self.spill_path)

    def _forget_written(self) -> None:
        written = self.written
        while self._unwritten and self._forgotten + len(self._unwritten[0][2]) <= written:
            self._forgotten += len(self._unwritten.popleft()[2])

    def write_soon(self) -> None:
        """Write what is queued now instead of gathering more steps first (before metrics are read back)."""
        self._write_now.set()

    def close(self, wait_s: float = FLUSH_WAIT_S) -> int:
        """Wait up to ``wait_s`` for every point to be written; returns how many are left in the spill file."""
        self._queue.put(None)
        self._write_now.set()
        self._process.join(wait_s)
        if self._process.is_alive():  # the server is still away: the writer spills what is left and exits
            self._abandon.set()
            self._process.join(float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")) + 5)
        if self._process.is_alive():  # stuck in a call to the server: what it had taken is in the spill file
            self._process.kill()
            self._process.join()
        if self._process.exitcode != 0 and not self._abandon.is_set():
            logger.error("the metric writer process exited with code %s", self._process.exitcode)
        self._forget_written()
        if self._unwritten:  # outage, killed or signalled writer: the spill file gets every step not reported written
            self.spill_path.unlink(missing_ok=True)
            _spill(self.spill_path, self.run_id, [point for item in self._unwritten for point in _points(item)])
            self._queue.cancel_join_thread()  # nobody reads the queue any more
        self._queue.close()
        self._queue.join_thread()
        left = self.enqueued - self.written
        if left:
            print(f"verlflow: {left} metric points could not reach the tracking server; upload them later with: "
                  f"python -m verlflow.runs.metric_buffer {self.spill_path}", file=sys.stderr, flush=True)
        return left


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start a spawned process without making it re-import the caller's ``__main__`` script.

    spawn re-runs the parent's main script in the child (as ``__mp_main__``): a user's script without an
    ``if __name__ == "__main__"`` guard would train a second time inside the writer. The writer needs nothing
    from it (its target lives in this module), so while ``start()`` records what the child must import, the
    main module is a bare one that names no file.
    """
    real_main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real_main


def _points(item: Step) -> list[Point]:
    step, timestamp, values = item
    return [(key, value, timestamp, step) for key, value in values]


def _spill(path: Path, run_id: str, points: list[Point]) -> None:
    """Append ``points`` to the JSONL spill file."""
    if not points:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        for key, value, timestamp, step in points:
            out.write(json.dumps({"run_id": run_id, "key": key, "value": value, "timestamp": timestamp,
                                  "step": step}) + "\n")


def _write_until_closed(steps, run_id: str, tracking_uri: str, spill_path: str, retry_s: float,
                        write_every_s: float, written, write_cpu, write_now, abandon) -> None:
    """The writer process: gather, write, and on failure spill and retry, until the stream ends."""
    # A Ctrl-C to the terminal's process group is the trainer's to handle: it ends its run, then closes the stream.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    writer = _Writer(steps, run_id, tracking_uri, Path(spill_path), retry_s, write_every_s, written, write_cpu,
                     write_now, abandon)
    signal.signal(signal.SIGTERM, writer.stop)
    # Set up (imports, client) at normal priority, while the trainer loads its model, so that the first
    # steps are written at once; then training first: the writer runs when a core is free.
    if hasattr(os, "nice"):  # not on Windows
        with contextlib.suppress(OSError):
            os.nice(WRITER_NICE)
    writer.run()


class _Writer:
    """Inside the writer process: the queue drained into MLflow, steps of ``write_every_s`` per write."""

    def __init__(self, steps, run_id, tracking_uri, spill_path, retry_s, write_every_s, written, write_cpu,
                 write_now, abandon):
        from mlflow.tracking import MlflowClient

        self.steps, self.run_id, self.spill_path = steps, run_id, spill_path
        self.retry_s, self.write_every_s = retry_s, write_every_s
        self.written, self.write_cpu, self.write_now, self.abandon = written, write_cpu, write_now, abandon
        self.client = MlflowClient(tracking_uri)
        self.pending: list[Point] = []  # taken from the queue, not yet written
        self.spilled = 0  # points of `pending` already mirrored in the spill file
        self.closing = False  # the stream ended (None received, or the training process is gone)
        self.last_write = 0.0
        self.outage_started: float | None = None
        self.trainer = multiprocessing.parent_process()  # alive until the training process ends, however it ends
        self.stopped = False  # SIGTERM: write what was taken once, spill it if that fails, and exit

    def stop(self, signum=None, frame=None) -> None:
        """SIGTERM handler (a scheduler stopping the job, or the trainer's exit): end after one last write."""
        self.closing = self.stopped = True

    def trainer_gone(self) -> bool:
        """Whether the training process has ended (then what it queued is written and the writer exits)."""
        return not self.trainer.is_alive()

    def take(self, wait_s: float = 0.0) -> None:
        """Move what is queued into ``pending``, waiting up to ``wait_s`` for the first step."""
        try:
            item = self.steps.get(timeout=wait_s) if wait_s else self.steps.get_nowait()
            while True:
                if item is None:
                    self.closing = True
                    return
                self.pending.extend(_points(item))
                item = self.steps.get_nowait()
        except queue.Empty:
            # The queue never ends by itself (this process holds its write end too): a trainer killed
            # outright shows only through its process sentinel.
            self.closing = self.closing or self.trainer_gone()
        except (EOFError, OSError):  # the training process died: write what arrived, then stop
            self.closing = True

    def run(self) -> None:
        """Until the stream ends and everything is written (or close() abandons the rest to the spill file)."""
        while not self.abandon.is_set():
            self.take(wait_s=0.0 if self.pending else 0.2)
            if not self.pending:
                if self.closing:
                    return
                continue
            gathered_until = self.last_write + self.write_every_s
            while not self.closing and time.monotonic() < gathered_until:
                if self.write_now.wait(min(1.0, gathered_until - time.monotonic())):
                    break
                self.closing = self.trainer_gone()
            self.take()
            self.write_now.clear()
            try:
                self.write_pending()
            except Exception as exc:  # any failure of the server or the network: keep, spill, retry
                self.on_failure(exc)
                if self.stopped or self.trainer_gone():  # nobody left to wait for the server: the spill file keeps them
                    return
                self.abandon.wait(min(1.0, self.retry_s) if self.closing else self.retry_s)
                continue
            if self.outage_started is not None:
                outage = time.time() - self.outage_started
                logger.warning("tracking server back after %.0f s: metrics replayed", outage)
                self.outage_started = None
            with contextlib.suppress(FileNotFoundError):
                self.spill_path.unlink()
        while not self.closing:  # close() queued the end of the stream before giving up: take all up to it
            before = len(self.pending)
            self.take(wait_s=1.0)
            if len(self.pending) == before and not self.closing:
                break  # nothing more arrives
        self.on_failure(RuntimeError("still unreachable at the end of the run"))

    def write_pending(self) -> None:
        """Write ``pending`` batch by batch, so that none is written twice when a later batch fails."""
        from mlflow.entities import Metric

        from verlflow.runs.store_retry import retry_on_lock  # another run's lock on a shared SQLite store

        while self.pending and not self.abandon.is_set():
            batch = [Metric(*point) for point in self.pending[:_BATCH]]
            started = time.process_time()
            try:
                retry_on_lock(self.client.log_batch, self.run_id, metrics=batch)
            finally:
                self.write_cpu.value += time.process_time() - started
            self.pending = self.pending[len(batch):]
            self.spilled = max(0, self.spilled - len(batch))
            self.written.value += len(batch)
        self.last_write = time.monotonic()

    def on_failure(self, exc: Exception) -> None:
        """Say the server is away (once per outage) and mirror the points not yet on disk to the spill file."""
        if self.outage_started is None:
            self.outage_started = time.time()
            logger.warning("tracking server not answering (%s): metrics kept in %s, training goes on",
                           first_line(exc, 200), self.spill_path)
        _spill(self.spill_path, self.run_id, self.pending[self.spilled:])
        self.spilled = len(self.pending)


def flush(run_id: str, wait_s: float = FLUSH_WAIT_S) -> bool:
    """Wait (at most ``wait_s``) until the buffer of ``run_id`` has written everything; True when it has."""
    buffer = _active.get(run_id)
    deadline = time.monotonic() + wait_s
    while buffer is not None and buffer.written < buffer.enqueued:
        buffer.write_soon()
        if time.monotonic() > deadline or not buffer.writing:
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
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

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
