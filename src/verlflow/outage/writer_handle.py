"""The trainer's handle on its metric writer process: steps handed over, kept until reported written.

    python -c "from verlflow.outage.writer_handle import MetricBuffer; help(MetricBuffer)"

:mod:`.metric_buffer` says why a process and how the two talk; this module is the training side of that talk
(:mod:`.metric_writer` is the writer's side): the pipe fed by a thread of its own, the writer's reports read,
a dead writer replaced with what it had not written, and the end of the run (wait, then spill what is left).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from verlflow import stopping
from verlflow.outage import spill
from verlflow.outage.metric_writer import GONE, MEMORY_POINTS, WRITER_HTTP_KNOBS, points, write_until_closed
from verlflow.outage.spill import Entry
from verlflow.outage.summaries import TimingSums
from verlflow.util import env_number, first_line

logger = logging.getLogger("verlflow.outage.metric_buffer")

RETRY_S = env_number("VERLFLOW_METRICS_RETRY_S", 5.0, minimum=0)
# Seconds between two writes: steps arriving meanwhile go in one write. Each write is a transaction on the
# tracking store that takes CPU from training (2 cores: a write per 0.4 s step cost ~20% wall time).
WRITE_EVERY_S = env_number("VERLFLOW_METRICS_WRITE_S", 2.0, minimum=0)
# The most the end of a run waits for the tracking server to take a write before leaving the rest to the spill file
# (counted again from each write: a replay that goes on is not cut).
FLUSH_WAIT_S = env_number("VERLFLOW_METRICS_FLUSH_S", 120.0, minimum=0)
# The most the end of a run waits for a writer that has written everything to exit by itself. Generous: at nice 19
# beside busy cores the writer gets a sliver of one, and the 15 s once given to its exit ran out there (it was
# killed, "exited with code -9", with every point written).
EXIT_WAIT_S = env_number("VERLFLOW_METRICS_EXIT_S", 120.0, minimum=0)
# Writers one run may start: one that keeps dying is replaced this often, then the trainer writes at the end.
MAX_WRITERS = 4
spilled: dict[str, Path] = {}  # runs whose buffer closed with a spill file left: their end goes in it too
# What the trainer keeps until it is written: ("step", Step) or ("record", {"kind": ..., ...}).
Item = tuple[str, Any]


class MetricBuffer:
    """The training side of one run's writer process: sends steps, keeps them until they are reported written."""

    def __init__(self, run_id: str, spill_path: str | os.PathLike[str], *, retry_s: float = RETRY_S,
                 write_every_s: float = WRITE_EVERY_S):
        import mlflow

        self.run_id, self.spill_path = run_id, Path(spill_path)
        self.tracking_uri = mlflow.get_tracking_uri()
        self.retry_s, self.write_every_s = retry_s, write_every_s
        self.enqueued = 0  # points and records handed over
        # In order, what no writer has reported written; the first may be partly written (_head_written points).
        self._unwritten: collections.deque[Item] = collections.deque()
        self._head_written = 0
        self._written_before = 0  # by writers that have ended
        self._cpu_before = 0.0
        self.outage = False  # the writer says the server does not answer
        self.spill_full = False  # the writer says the spill folder takes no more
        self.run_deleted: bool | str = False  # the writer says the run is deleted (True) or gone (GONE): no wait helps
        self.dropped = 0  # points not kept: the spill folder was full and MEMORY_POINTS were held here
        self.writers_started = 0
        self.parked, self.parked_cause = 0, ""  # artifact writes the writer kept in the spill file
        self.beats = 0  # the writer's "at work on a record" reports: progress for the end's window
        self.request_timeout_s = float(WRITER_HTTP_KNOBS["MLFLOW_HTTP_REQUEST_TIMEOUT"])  # as the writer reports it
        self.timing = TimingSums()  # the run's end writes its summaries from these, not from read-back histories
        self.writer_exit_codes: list[int | None] = []  # of the writers that have ended, in order (0: a clean exit)
        self._last_step: tuple[int, int, dict[str, float]] | None = None  # a checkpoint's model links to it
        self._process: Any = None
        self._start_writer()

    def _start_writer(self) -> None:
        """Start a writer process and hand it everything not yet written."""
        import mlflow  # noqa: F401  (the child imports it while the trainer loads its model)

        # spawn, not fork: a forked child would inherit the trainer's threads' locks and its store connections
        context = multiprocessing.get_context("spawn")
        steps_in, steps_out = context.Pipe(duplex=False)
        acks_in, acks_out = context.Pipe(duplex=False)
        self._process = context.Process(
            target=write_until_closed, name=f"verlflow-metrics-{self.run_id[:8]}", daemon=True,
            args=(steps_in, acks_out, self.run_id, self.tracking_uri, str(self.spill_path), self.retry_s,
                  self.write_every_s))
        with _main_module_hidden():
            stopping.start_child(self._process)
        steps_in.close()  # the writer's ends are the writer's alone: its death closes them
        acks_out.close()
        self.writers_started += 1
        self._acks, self._written_now, self._cpu_now, self.outage = acks_in, 0, 0.0, False
        self._feed = _Feed(steps_out)
        for index, item in enumerate(self._unwritten):
            kind, body = item
            if index == 0 and kind == "step" and self._head_written:
                item = (kind, (body[0], body[1], body[2][self._head_written:]))
            self._feed.put(item)

    @property
    def written(self) -> int:
        """Points (and records) stored in the tracking store so far."""
        self._read_acks()
        return self._written_before + self._written_now

    @property
    def write_cpu_s(self) -> float:
        """CPU seconds the writer processes spent in writes (what tracking costs the machine)."""
        self._read_acks()
        return self._cpu_before + self._cpu_now

    @property
    def writing(self) -> bool:
        """Whether a writer process is there to write (False once it has ended or died, until replaced)."""
        return self._process is not None and self._process.is_alive()

    @property
    def writer_pid(self) -> int | None:
        """The current writer process's id (its CPU is not the trainer's)."""
        return None if self._process is None else self._process.pid

    def log(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Queue one step's metrics (never blocks on the server or on the writer).

        While the spill folder is full, at most :data:`MEMORY_POINTS` unwritten points are held: a later step's
        points are dropped (counted, said once) until the server or the folder takes some."""
        values = [(k, float(v)) for k, v in metrics.items()]
        if self.spill_full and self.enqueued - self.written + len(values) > MEMORY_POINTS:
            if not self.dropped:
                print(f"verlflow: the spill folder {self.spill_path.parent} is full and {MEMORY_POINTS} unwritten "
                      "metric points are held in memory (VERLFLOW_METRICS_MEMORY_POINTS): later steps' points are "
                      "dropped until the tracking server answers", file=sys.stderr, flush=True)
            self.dropped += len(values)
            return
        timestamp_ms = timestamp_ms or int(time.time() * 1000)
        self.timing.add(dict(values), int(step))
        self._last_step = (int(step), timestamp_ms, dict(values))
        self._hand_over(("step", (int(step), timestamp_ms, values)), len(values))

    def link_model(self, model_id: str, step: int) -> bool:
        """Queue the link of the points of ``step`` (the last step logged) to the LoggedModel ``model_id``, written
        behind them in one call; False when the last step logged is another (the end's link reads them back)."""
        if self._last_step is None or self._last_step[0] != step:
            return False
        _, timestamp, values = self._last_step
        self.log_record({"kind": "link", "model_id": model_id,
                         "points": [[key, value, timestamp, step] for key, value in values.items()]})
        return True

    def log_record(self, record: dict[str, Any]) -> None:
        """Queue a table, tags or summaries record (:mod:`.spill` says what each holds), in order with the steps."""
        self._hand_over(("record", record), 1)

    def _hand_over(self, item: Item, units: int) -> None:
        self.enqueued += units
        self._unwritten.append(item)
        if self._process is not None:
            self._feed.put(item)
        self._read_acks()
        self._replace_if_dead()

    def wait_in_pipe(self, wait_s: float = 10.0) -> bool:
        """Wait up to ``wait_s`` until all logged so far has left this process for the writer's pipe; True if so.

        What is in the pipe outlives this process: the writer reads the pipe to its end and writes it all, even
        after the trainer is killed outright. A full pipe (a writer held up by the server) can hold it back.
        """
        deadline = time.monotonic() + wait_s
        while self._process is not None and not self._feed.in_pipe():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return self._process is not None

    def write_soon(self) -> None:
        """Write what is queued now instead of gathering more steps first (before metrics are read back)."""
        if self._process is not None:
            self._feed.put(("write_now",))

    def flush(self, wait_s: float = FLUSH_WAIT_S) -> bool:
        """Wait up to ``wait_s`` until everything is written; False at once while the server is away."""
        deadline = time.monotonic() + wait_s
        self.write_soon()
        while self.written < self.enqueued:
            self._replace_if_dead()
            if self.outage or self._process is None or time.monotonic() > deadline:
                return False
            self._read_acks(wait_s=0.1)
        return True

    def close(self, wait_s: float = FLUSH_WAIT_S) -> int:
        """Wait for everything to be written, up to ``wait_s`` without progress; returns how much is left in the
        spill file. The window counts from the server's last answer (a write, or a long record still under way
        after one): a server that answers again within it gets the whole replay, however long, and the run ends
        complete with nothing to upload by hand."""
        deadline, written, beats = time.monotonic() + wait_s, self.written, self.beats
        if self._process is not None:
            self._feed.put(("close",))
        while (self._process is not None and self.written < self.enqueued and time.monotonic() < deadline
               and not self.run_deleted):
            if not self._process.is_alive():
                self._replace_if_dead()
                if self._process is not None:
                    self._feed.put(("close",))
                continue
            self._read_acks(wait_s=0.2)
            if self.written > written or self.beats > beats:  # the server answers: the window starts again
                deadline, written, beats = time.monotonic() + wait_s, self.written, self.beats
        self._end_writer(finished=self.written >= self.enqueued)
        left = kept = self.enqueued - self.written
        if left:  # outage, or no writer left: the spill file gets everything not reported written
            kept = self._spill_leftover(left)
            if not self.outage and kept == left:  # the writers died, not the server: write them from here
                left = self._write_spill_here(left)
        if self.parked and not left:  # the metrics are all in, the run ends as it is: only artifacts to upload
            print(f"verlflow: {self.parked} artifact writes of run {self.run_id} were refused by the artifact store "
                  f"({self.parked_cause}) while its metrics were written; they are kept in {self.spill_path}. Upload "
                  f"them once it takes writes:\n  {spill.upload_command(self.spill_path, self.tracking_uri)}",
                  file=sys.stderr, flush=True)
        elif not left and self.spill_path.exists():  # an earlier attempt's records the writer could not write
            print(f"verlflow: {self.spill_path} still holds metric points or records of run {self.run_id} that an "
                  "earlier attempt (or writer) left and that are not written yet. Upload them once the tracking "
                  f"server takes them:\n  {spill.upload_command(self.spill_path, self.tracking_uri)}",
                  file=sys.stderr, flush=True)
        if left and self.run_deleted == GONE:
            spilled[self.run_id] = self.spill_path
            print(f"verlflow: run {self.run_id} no longer exists on the tracking server {self.tracking_uri} (its "
                  f"database was replaced, or the run purged): not an outage, no wait brings it back. Its {left} "
                  f"unwritten metric points and records are kept in {self.spill_path}; what was written before is in "
                  "the database the run was in.", file=sys.stderr, flush=True)
        elif left and self.run_deleted:
            spilled[self.run_id] = self.spill_path
            print(f"verlflow: run {self.run_id} was deleted in the tracking store {self.tracking_uri} (or its "
                  f"experiment was) while it trained: its {left} unwritten metric points and records are kept in "
                  f"{self.spill_path}. Restore it (mlflow experiments restore / mlflow runs restore), then upload "
                  f"them:\n  {spill.upload_command(self.spill_path, self.tracking_uri)}", file=sys.stderr, flush=True)
        elif left:
            spilled[self.run_id] = self.spill_path
            print(f"verlflow: the tracking server {self.tracking_uri} did not take {left} metric points and records "
                  f"within {wait_s:g} s (VERLFLOW_METRICS_FLUSH_S); {'they' if kept == left else f'{kept} of them'} "
                  f"are kept in {self.spill_path} with the run's final status. Upload them once the server answers, "
                  f"from any shell:\n  {spill.upload_command(self.spill_path, self.tracking_uri)}",
                  file=sys.stderr, flush=True)
        return left

    def _spill_leftover(self, left: int) -> int:
        """Add to the spill file what it lacks of the ``left`` unwritten entries (append-only: what a writer put
        there stays); returns how many it holds. A full folder is one line: which, and how much is lost."""
        try:
            return spill.append_missing(self.spill_path, self.run_id, self._leftover())
        except spill.SpillFull as full:
            dropped = f", and {self.dropped} points of later steps were dropped before" if self.dropped else ""
            print(f"verlflow: {full}: {full.kept} of the {left} metric points and records the tracking server did "
                  f"not take are kept in {self.spill_path}, the other {left - full.kept} are lost{dropped} (free "
                  "room there, or give verlflow.output_dir a folder with room)", file=sys.stderr, flush=True)
            return full.kept

    def _write_spill_here(self, left: int) -> int:
        try:
            spill.upload(self.spill_path)
        except Exception as exc:  # the server went away meanwhile: the spill file keeps them
            logger.warning("writing the metrics the writer left failed (%s)", first_line(exc, 200))
            return left
        logger.warning("the %d metric points and records the writer processes left were written by the trainer",
                       left)
        self._written_before += left
        self._unwritten.clear()
        self._head_written = 0
        return 0

    def _leftover(self) -> Iterator[Entry]:
        for index, (kind, body) in enumerate(self._unwritten):
            if kind == "record":
                yield body
            else:
                yield from points(body)[self._head_written if index == 0 else 0:]

    def _read_acks(self, wait_s: float = 0.0) -> None:
        """Take the writer's reports (points written, outage) that have arrived, waiting up to ``wait_s``."""
        if self._process is None:
            return
        try:
            while self._acks.poll(wait_s):
                wait_s = 0.0
                kind, *body = self._acks.recv()
                if kind == "written":
                    self._consume(body[0] - self._written_now)
                    self._written_now, self._cpu_now = body
                elif kind == "outage":
                    self.outage = body[0]
                elif kind == "spill_full":
                    self.spill_full = body[0]
                elif kind == "deleted":
                    self.run_deleted = body[0]
                elif kind == "parked":  # artifact writes refused while the API answers: in the spill file
                    self.parked, self.parked_cause = body[0], body[1] or self.parked_cause
                elif kind == "working":  # a long record under way on a server that answers
                    self.beats += 1
                elif kind == "timeout":  # the writer's request timeout, sized from the server's answers
                    self.request_timeout_s = body[0]
        except (EOFError, OSError):  # the writer has ended: _replace_if_dead sees to it
            pass

    def _consume(self, units: int) -> None:
        """Forget the first ``units`` points of the unwritten steps (the writer writes in order)."""
        while units and self._unwritten:
            kind, body = self._unwritten[0]
            remaining = (len(body[2]) if kind == "step" else 1) - self._head_written
            if units < remaining:
                self._head_written += units
                return
            units -= remaining
            self._unwritten.popleft()
            self._head_written = 0

    def _replace_if_dead(self) -> None:
        """When the writer has died, take back what it had not written and start a new one (or keep it here)."""
        if self._process is None or self._process.is_alive():
            return
        code = self._process.exitcode
        self._retire_writer()
        left = self.enqueued - self.written
        if self.writers_started >= MAX_WRITERS:
            logger.warning("the metric writer process ended again (exit code %s): training keeps the %d unwritten "
                           "points and writes them when the run ends", code, left)
            return
        logger.warning("the metric writer process ended (exit code %s): %d unwritten points taken back, a new "
                       "writer process writes them", code, left)
        self._start_writer()

    def _retire_writer(self) -> None:
        self._read_acks()
        self.writer_exit_codes.append(self._process.exitcode)
        self._written_before += self._written_now
        self._cpu_before += self._cpu_now
        self._written_now, self._cpu_now = 0, 0.0
        self._feed.close()
        self._acks.close()
        self._process = None

    def _end_writer(self, finished: bool) -> None:
        """Let the writer end: one that has written everything (``finished``: told to close, it exits by itself
        once the spill file is settled) is waited for up to :data:`EXIT_WAIT_S`; one with work left is told to
        spill it and go, and given the time to end a call to the server under way. Only a writer still there
        after that is killed, and said so with what it had not written."""
        if self._process is None:
            return
        if finished:
            self._wait_exit(EXIT_WAIT_S)
        elif self._process.is_alive():
            self._feed.put(("abandon",))
            self._wait_exit(self.request_timeout_s + 5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
            left = self.enqueued - self.written
            if finished:
                logger.warning("the metric writer process had written every point and record but did not exit "
                               "within %g s (VERLFLOW_METRICS_EXIT_S): it was killed", EXIT_WAIT_S)
            else:
                logger.warning("the metric writer process did not end within %g s of being told to stop: it was "
                               "killed with %d metric points and records unwritten",
                               self.request_timeout_s + 5, left)
        elif self._process.exitcode != 0:
            logger.warning("the metric writer process exited with code %s", self._process.exitcode)
        self._retire_writer()

    def _wait_exit(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for the writer to exit, taking its last reports meanwhile (the parked artifact
        writes its last retry settled)."""
        deadline = time.monotonic() + wait_s
        while self._process.is_alive() and time.monotonic() < deadline:
            self._read_acks()
            self._process.join(min(0.2, max(0.0, deadline - time.monotonic())))


class _Feed:
    """The trainer's items on their way into the writer's pipe, sent by a thread of their own: a full pipe
    holds that thread, never training."""

    def __init__(self, connection):
        self._queue: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self.put_count = self.sent_count = 0
        threading.Thread(target=self._send_until_closed, args=(connection,), name="verlflow-metrics-feed",
                         daemon=True).start()

    def put(self, item: tuple) -> None:
        """Queue ``item`` for the pipe."""
        self.put_count += 1
        self._queue.put(item)

    def close(self) -> None:
        """End the thread after what is queued, and close the pipe."""
        self._queue.put(None)

    def in_pipe(self) -> bool:
        """Whether every item put so far has been sent into the pipe."""
        return self.sent_count >= self.put_count

    def _send_until_closed(self, connection) -> None:
        with contextlib.suppress(OSError, ValueError):  # the writer is gone: the trainer still holds every item
            while (item := self._queue.get()) is not None:
                connection.send(item)
                self.sent_count += 1
        connection.close()


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
