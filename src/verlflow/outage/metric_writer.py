"""The metric writer process: what the trainer sends it, written into MLflow in order, spilled when it cannot be.

    verlflow train --device cpu        # starts one per local train run (metric_buffer.MetricBuffer)

:func:`write_until_closed` runs in a process of its own (see :mod:`.metric_buffer` for why). It reads steps and
records from its pipe, gathers the steps of ``write_every_s`` seconds into one ``log_batch``, and reports each
write back ("written", count); when the server does not answer it mirrors what it holds to the spill file and
retries. It ends when the trainer says "close" and all is written, when the trainer abandons the rest, or
within seconds of the trainer's death (its pipe ends): then it writes what it has once and exits. What it finds in
the spill file when it starts (an earlier attempt of the run ended during an outage, a writer killed in one) it
writes too, before it rewrites or removes the file: nothing in the file is dropped unwritten.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from verlflow import known_warnings, stopping
from verlflow.outage import spill
from verlflow.outage.deadline import timed_out
from verlflow.outage.request_timeout import RequestTimeout
from verlflow.outage.spill import Entry, Point
from verlflow.outage.store_retry import retry_on_lock
from verlflow.util import env_number, first_line

logger = logging.getLogger("verlflow.outage.metric_buffer")

WRITER_NICE = int(env_number("VERLFLOW_METRICS_NICE", 19, integer=True))
# The writer retries by itself every RETRY_S: one try per call, so that close() and an orphaned writer end in seconds.
# The timeout is where it starts: it follows the server's answers from there (request_timeout.RequestTimeout).
WRITER_HTTP_KNOBS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": 0, "MLFLOW_HTTP_REQUEST_TIMEOUT": 10}
_BATCH = spill._BATCH
# While the spill folder is full, the trainer keeps at most this many unwritten points in memory (and drops later
# steps' points beyond it, saying how many): ~200 bytes each in each of the two processes.
MEMORY_POINTS = int(env_number("VERLFLOW_METRICS_MEMORY_POINTS", 1_000_000, integer=True, minimum=1))
# One step on the way to the writer: (step, timestamp in ms, [(key, value), ...]).
Step = tuple[int, int, list[tuple[str, float]]]


# What the writer reports for a run its server no longer knows (its "deleted" report for a run in the trash is True).
GONE = "gone"
# The mark of a parked artifact record in the spill file (write_entry and the upload read only the record's own keys).
PARKED = "parked"


def found_in_spill(spill_path: Path, run_id: str) -> tuple[list[dict], list[dict]] | None:
    """What a writer finds in ``run_id``'s spill file when it starts: the parked artifact records of ``run_id`` (a
    dead writer's, without their run), and every other record, with its run (what an earlier attempt of the run
    left during an outage, or a dead writer spilled), in order. Damaged lines are kept in ``<file>.bad``
    (:func:`.spill.readable_records`). None when the file is there but cannot be read: then it is never rewritten."""
    if not Path(spill_path).exists():
        return [], []
    try:
        records = spill.readable_records(Path(spill_path))
    except OSError as exc:
        logger.warning("the spill file %s cannot be read (%s): it is kept as it is", spill_path, first_line(exc, 200))
        return None
    parked, others = [], []
    for record in records:
        if record.get(PARKED) and record.get("run_id") == run_id:
            parked.append({key: value for key, value in record.items() if key != "run_id"})
        else:
            others.append(record)
    return parked, others


def points(item: Step) -> list[Point]:
    """A step's metric points as the writer keeps and spills them."""
    step, timestamp, values = item
    return [(key, value, timestamp, step) for key, value in values]


def run_deleted(exc: BaseException) -> bool:
    """Whether a write failed because its run is deleted (its experiment deleted while training, say)."""
    return "must be in the 'active' state" in str(exc) and "deleted" in str(exc)


def run_gone(exc: BaseException) -> bool:
    """Whether a write failed because the server no longer knows its run: its database was replaced (a server
    restarted on a fresh or older copy) or the run was purged. No wait brings it back, so it is no outage."""
    return getattr(exc, "error_code", None) == "RESOURCE_DOES_NOT_EXIST" and "Run with id=" in str(exc)


def cap_http(knobs: Mapping[str, float]) -> None:
    """Lower MLflow's HTTP env settings (retries, timeout) to at most ``knobs``; a smaller value set stays."""
    for key, cap in knobs.items():
        try:
            current = float(os.environ[key])
        except (KeyError, ValueError):
            current = cap
        os.environ[key] = f"{min(current, cap):g}"


def write_until_closed(steps, acks, run_id: str, tracking_uri: str, spill_path: str, retry_s: float,
                        write_every_s: float) -> None:
    """The writer process: gather, write, and on failure spill and retry, until the stream ends."""
    # A Ctrl-C to the terminal's process group is the trainer's to handle: it ends its run, then closes the stream.
    stopping.ignore_held_sigint()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    known_warnings.install()  # MLflow's traceback per SQLite lock retry: the writer waits it out (retry_on_lock)
    cap_http(WRITER_HTTP_KNOBS)
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)  # summaries records read the run back through the default client
    writer = _Writer(steps, acks, run_id, tracking_uri, Path(spill_path), retry_s, write_every_s)
    stopping.set_handlers({signal.SIGTERM: writer.stop})
    # Set up (imports, client) at normal priority, while the trainer loads its model, so that the first
    # steps are written at once; then training first: the writer runs when a core is free.
    if hasattr(os, "nice"):  # not on Windows
        with contextlib.suppress(OSError):
            os.nice(WRITER_NICE)
    writer.run()
    _exit_done()


def _exit_done() -> None:
    """Exit now, with code 0, once everything is written or spilled: past its last write the writer has nothing
    left for the interpreter's teardown (MLflow's exit hooks, every module freed), which costs ~0.85 s of CPU.
    At nice 19 beside busy cores that was a minute of waiting, and the trainer, which waits for this exit, killed
    the writer instead (exit code -9). Its reports went out synchronously on the pipe, the spill file is synced."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


class _Writer:
    """Inside the writer process: the pipe drained into MLflow, steps of ``write_every_s`` per write."""

    def __init__(self, steps, acks, run_id, tracking_uri, spill_path, retry_s, write_every_s):
        from mlflow.tracking import MlflowClient

        self.steps, self.acks, self.run_id, self.spill_path = steps, acks, run_id, spill_path
        self.retry_s, self.write_every_s = retry_s, write_every_s
        self.client = MlflowClient(tracking_uri)
        self.pending: list[Entry] = []  # taken from the pipe, not yet written
        self.spilled = 0  # entries of `pending` already mirrored in the spill file
        self.written, self.write_cpu = 0, 0.0  # reported to the trainer after each write
        self.closing = False  # no more is coming (the trainer said so, or it is gone)
        self.write_now = False
        self.abandoned = False  # the trainer gave up waiting: spill what is left and exit
        self.orphaned = False  # the training process has ended, however it ended
        self.trainer_pid = os.getppid()
        self.last_write = 0.0
        self.outage_started: float | None = None
        self.stopped = False  # SIGTERM: write what was taken once, spill it if that fails, and exit
        self.spill_full = False  # the spill folder took only part of what is pending
        self.answered = False  # the server took the last write: a long record's beats count as progress
        self.timeout = RequestTimeout(max(1, int(float(os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"]))))
        self.report_lock = threading.Lock()  # reports come from the beat thread too
        # Artifact records refused while the tracking API answers: kept, retried; a writer that replaces a dead one
        # takes over those it kept in the spill file (the trainer counted them written and no longer has them).
        # The file's other records (an earlier attempt's, a dead writer's) are written by this one, never dropped.
        found = found_in_spill(self.spill_path, run_id)
        self.keep_file = found is None  # unreadable: left as it is
        self.parked, self.inherited = found or ([], [])
        self.parked_at = self.inherited_at = 0.0
        self.drop_superseded_status()

    def stop(self, signum=None, frame=None) -> None:
        """SIGTERM handler (a scheduler stopping the job): end after one last write."""
        self.closing = self.stopped = True

    def take(self, wait_s: float = 0.0) -> None:
        """Move what the trainer sent into ``pending``, waiting up to ``wait_s`` for the first of it."""
        try:
            while self.steps.poll(wait_s):
                wait_s = 0.0
                kind, *body = self.steps.recv()
                if kind == "step":
                    self.pending.extend(points(body[0]))
                elif kind == "record":
                    self.pending.append(body[0])
                elif kind == "write_now":
                    self.write_now = True
                elif kind == "close":
                    self.closing = self.write_now = True
                elif kind == "abandon":
                    self.closing = self.abandoned = True
                    return
        except (EOFError, OSError):  # the trainer's end of the pipe is closed: it has died
            self.orphaned = True
        # A forked grandchild could hold the trainer's end open: a new parent (init) tells as well.
        self.orphaned = self.orphaned or os.getppid() != self.trainer_pid
        self.closing = self.closing or self.orphaned

    def report(self, message: tuple) -> None:
        with self.report_lock, contextlib.suppress(OSError):  # the trainer is gone: nobody to tell
            self.acks.send(message)

    @contextlib.contextmanager
    def beating(self) -> Iterator[None]:
        """While one record is written (a model's upload, a summaries read), tell the trainer every second that
        the writer is at work, when the server answered the last write: the end's window counts from the
        server's last answer, not from the record's start. A call that hangs fails within the HTTP timeout."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(1.0):
                self.report(("working",))

        if self.answered:
            threading.Thread(target=beat, name="verlflow-writer-beat", daemon=True).start()
        try:
            yield
        finally:
            done.set()

    def run(self) -> None:
        """Until the stream ends and everything is written (or the trainer abandons the rest to the spill file)."""
        if self.parked:  # taken over from a writer that died: the trainer hears they are still kept
            self.report(("parked", len(self.parked), "kept by the writer before this one"))
        self.replay_inherited()
        while not self.abandoned:
            self.take(wait_s=0.0 if self.pending else 0.2)
            if not self.pending:
                if self.closing:
                    self.settle_parked(last=True)
                    return
                continue
            gathered_until = self.last_write + self.write_every_s
            while not (self.closing or self.write_now) and time.monotonic() < gathered_until:
                self.take(wait_s=min(1.0, max(0.0, gathered_until - time.monotonic())))
            self.write_now = False
            try:
                self.write_pending()
            except Exception as exc:  # any failure of the server or the network: keep, spill, retry
                self.on_failure(exc)
                if self.stopped or self.orphaned:  # nobody left to wait for the server: the spill file keeps them
                    return
                retry_at = time.monotonic() + (min(1.0, self.retry_s) if self.closing else self.retry_s)
                while not (self.abandoned or self.orphaned) and time.monotonic() < retry_at:
                    self.take(wait_s=min(1.0, max(0.0, retry_at - time.monotonic())))
                continue
            if self.pending:  # abandoned between two writes: what is left goes to the spill file below
                continue
            if self.outage_started is not None:
                logger.warning("tracking server back after %.0f s: metrics replayed", time.time() - self.outage_started)
                self.outage_started = None
                self.report(("outage", False))
            if self.spill_full:
                self.spill_full = False
                self.report(("spill_full", False))
            self.settle_parked()
        if self.pending:
            self.on_failure(RuntimeError("still unreachable at the end of the run"))

    def write_pending(self) -> None:
        """Write ``pending`` in order, metrics batch by batch, so that none is written twice when a later one fails."""
        from mlflow.entities import Metric

        while self.pending and not self.abandoned:
            started, asked = time.process_time(), time.monotonic()
            try:
                if isinstance(self.pending[0], dict):
                    with self.beating():
                        self.write_record(self.pending[0])
                    count = 1
                else:
                    points = itertools.takewhile(lambda entry: not isinstance(entry, dict), self.pending[:_BATCH])
                    batch = [Metric(*point) for point in points]
                    retry_on_lock(self.client.log_batch, self.run_id, metrics=batch)  # another run's SQLite lock
                    count = len(batch)
            except Exception as exc:
                self.answered = False
                if timed_out(exc):
                    self.follow_timeout(None)
                raise
            finally:
                self.write_cpu += time.process_time() - started
            self.answered = True
            self.follow_timeout(time.monotonic() - asked)
            self.pending = self.pending[count:]
            self.spilled = max(0, self.spilled - count)
            self.written += count
            self.report(("written", self.written, self.write_cpu))
            self.take()
        self.last_write = time.monotonic()

    def follow_timeout(self, took_s: float | None) -> None:
        """Size the request timeout from a write's answer after ``took_s`` seconds, or from a write that ran out of
        time (None: said, with the new wait). The trainer hears each new value: it waits that long (and a little
        more) for a writer it told to stop."""
        before = self.timeout.seconds
        if took_s is None:
            self.timeout.ran_out()
            logger.warning("a write to the tracking server got no answer within %g s: the metric writer now waits up "
                           "to %g s (at most VERLFLOW_METRICS_TIMEOUT_MAX_S=%g)", before, self.timeout.seconds,
                           self.timeout.max_s)
        else:
            self.timeout.answered(took_s)
        if self.timeout.seconds != before:
            self.report(("timeout", self.timeout.seconds))

    def write_record(self, record: dict) -> None:
        """Write one record; an artifact write the server refuses while its tracking API answers is parked (kept in
        the spill file as its own record, retried later) so that the metrics behind it go on."""
        try:
            spill.write_entry(self.client, self.run_id, record)
        except Exception as exc:
            if record["kind"] not in spill.ARTIFACT_KINDS or not self.api_answers():
                raise
            record = {**record, PARKED: True}  # marked, so a writer that replaces this one takes it over
            spill.append(self.spill_path, self.run_id, [record])
            self.parked.append(record)
            self.parked_at = time.monotonic()
            logger.warning("%s not written (%s): the artifact store refuses while the tracking API answers; kept "
                           "in %s and retried, metrics go on", spill.describe({**record, "run_id": self.run_id}),
                           first_line(exc, 200), self.spill_path)
            self.report(("parked", len(self.parked), first_line(exc, 200)))

    def api_answers(self) -> bool:
        """Whether the tracking API takes a call now (the run can be read)."""
        try:
            self.client.get_run(self.run_id)
        except Exception:
            return False
        return True

    def settle_parked(self, last: bool = False) -> None:
        """All is written: retry the parked artifact writes and the records found in the spill file (every
        ``retry_s``, and once more at the ``last``), then make the file hold only what is still not written (none:
        no file)."""
        if self.parked and (last or time.monotonic() - self.parked_at >= self.retry_s):
            self.parked_at = time.monotonic()
            refused = []
            for record in self.parked:
                try:
                    spill.write_entry(self.client, self.run_id, record)
                except Exception:
                    refused.append(record)
            if len(refused) < len(self.parked):
                self.parked = refused
                self.report(("parked", len(self.parked), ""))
        if self.inherited and (last or time.monotonic() - self.inherited_at >= self.retry_s):
            self.replay_inherited()
        self.rewrite_spill()

    def rewrite_spill(self) -> bool:
        """Make the spill file hold what is not written yet: the records found in it that are still to write, then
        the parked ones (none: no file). False when it could not be rewritten (the old file stays whole)."""
        if self.keep_file:
            return False
        try:
            spill.replace_durably(self.spill_path, None, [*self.inherited,
                                                          *({"run_id": self.run_id, **r} for r in self.parked)])
        except OSError as exc:  # a full or read-only spill folder: the parked records stay in the old file
            logger.warning("the spill file %s was not rewritten (%s)", self.spill_path, first_line(exc, 200))
            return False
        return True

    def drop_superseded_status(self) -> None:
        """Take this run's final status out of the records found in its spill file: an earlier attempt's end, which
        the attempt now training supersedes (replayed, it would end the run while it trains; left, an upload after
        this attempt's end would undo that end). Its metrics, tables and tags stay."""
        ends = [r for r in self.inherited if r.get("kind") == "status" and r.get("run_id") == self.run_id]
        if not ends or self.keep_file:
            return
        self.inherited = [r for r in self.inherited if not any(r is end for end in ends)]
        if not self.rewrite_spill():
            self.keep_file = True  # it still holds the old end: an upload, not this writer, settles it
        logger.warning("run %s resumed: its earlier attempt's end (%s) in %s is replaced by this attempt's",
                       self.run_id, ends[-1].get("status"), self.spill_path.name)

    def replay_inherited(self) -> None:
        """Write the records this writer found in the spill file (:func:`found_in_spill`), in order, as the upload
        does: a point already in the run is not written twice. Those the artifact store refuses join the parked
        ones; a server that does not answer leaves them all in the file for the next try. The replayed records go
        to ``<file>.uploaded``, so that the upload command printed for them says so."""
        if not self.inherited:
            return
        self.inherited_at = time.monotonic()
        try:
            with self.beating():
                _, refused = spill.replay(self.client, self.inherited)
        except Exception as exc:  # the server is away: they stay in the file, retried once all else is written
            logger.info("the spill file's earlier records are not written yet (%s)", first_line(exc, 200))
            return
        refused_ids = {id(record) for record in refused}
        written = [record for record in self.inherited if id(record) not in refused_ids]
        with contextlib.suppress(OSError):
            spill.append(spill.uploaded_marker(self.spill_path), self.run_id, written)
        self.inherited = [r for r in refused if r.get("run_id") != self.run_id]
        parked = [{**{k: v for k, v in r.items() if k != "run_id"}, PARKED: True}
                  for r in refused if r.get("run_id") == self.run_id]
        logger.warning("%d metric points and records that an earlier writer of run %s left in %s are written",
                       len(written), self.run_id, self.spill_path)
        if parked:
            self.parked += parked
            self.parked_at = time.monotonic()
            self.report(("parked", len(self.parked), "refused when the earlier records of the spill file were written"))

    def on_failure(self, exc: Exception) -> None:
        """Say the server is away (once per outage) and mirror the entries not yet on disk to the spill file."""
        if self.outage_started is None:
            self.outage_started = time.time()
            if run_deleted(exc):  # not an outage: no wait brings the run back, a restore does
                logger.warning("run %s is deleted in the tracking store (or its experiment is): its metrics are kept "
                               "in %s, training goes on", self.run_id, self.spill_path)
                self.report(("deleted", True))
            elif run_gone(exc):  # not an outage either, and not the user's to restore
                logger.warning("run %s no longer exists on the tracking server (its database was replaced, or the run "
                               "purged): its metrics are kept in %s, training goes on", self.run_id, self.spill_path)
                self.report(("deleted", GONE))
            else:
                logger.warning("tracking server not answering (%s): metrics kept in %s, training goes on",
                               first_line(exc, 200), self.spill_path)
            self.report(("outage", True))
        try:
            self.spilled += spill.append(self.spill_path, self.run_id, self.pending[self.spilled:])
        except spill.SpillFull as full:  # the points stay here (and with the trainer) until the server answers
            self.spilled += full.kept
            if not self.spill_full:
                logger.warning("%s: %d metric points and records are on disk in %s, %d more are kept in memory "
                               "(at most %d, VERLFLOW_METRICS_MEMORY_POINTS) until the server answers",
                               full, self.spilled, self.spill_path.name, len(self.pending) - self.spilled,
                               MEMORY_POINTS)
                self.report(("spill_full", True))
            self.spill_full = True
            return
        if self.spill_full:
            self.spill_full = False
            self.report(("spill_full", False))
