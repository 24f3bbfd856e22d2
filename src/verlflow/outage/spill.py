"""The spill file: what a tracking outage left unwritten, on disk, and the command that uploads it later.

    MLFLOW_TRACKING_URI=http://host:5000 verlflow runs upload-spill outputs/local/<run>/metrics.spill.jsonl

One JSON object per line, in the order training made them. A metric point is
``{"run_id", "key", "value", "timestamp", "step"}``; anything else names its ``kind``:

- ``table``: ``{"artifact_file", "data"}`` (a validation step's samples, for ``MlflowClient.log_table``),
- ``traces``: ``{"step", "rows": [{"prompt", "response", "reward"}, ...]}`` (a step's rollout traces,
  :func:`verlflow.outage.rollout_traces.write_traces`),
- ``tags``: ``{"tags": {name: value}}``,
- ``summaries``: ``{"started_at", "ended_at", "sums", "from_step"}`` (``timing_s/e2e`` and the
  ``timing_s_mean/*`` of :func:`verlflow.outage.summaries.log_timing_summaries`, from the timing sums of the steps
  the trainer logged; the steps before ``from_step`` (a resumed run's) are read back),
- ``link``: ``{"model_id", "points": [[key, value, timestamp, step], ...]}`` (a checkpoint's step linked to its
  LoggedModel in one write, :func:`verlflow.outage.logged_models.link_points`),
- ``final_model``: ``{"checkpoint", "step"}`` (the run's final checkpoint as its LoggedModel, made from the
  folder, metrics linked: :func:`verlflow.outage.logged_models.replay_final_model`),
- ``status``: ``{"status", "end_time"}`` (the run's final status; the last line, set last).

:func:`upload` replays the lines in order with their original step and time, so running it later ends the
run exactly as the trainer would have with a server that answered.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from verlflow.compat.mlflow import latest_metric_steps
from verlflow.errors import VerlflowError

_BATCH = 1000  # MLflow's log_batch limit on metrics per call
# One metric point as the writer keeps and spills it: (key, value, timestamp in ms, step), MLflow Metric's order.
Point = tuple[str, float, int, int]
# What the writer keeps between the trainer and the store: a metric point, or a record with its "kind".
Entry = Point | dict[str, Any]


# What a failed append leaves free (bytes, when it wrote that much): room for the run's end (tags, final status).
END_RESERVE = 4096


class SpillFull(OSError):
    """The spill folder took only ``kept`` of the entries (full disk, a file-size limit, read-only): the rest stay
    with the caller. The file holds whole lines only: nothing written before is lost, no line is torn."""

    def __init__(self, path: Path, kept: int, cause: OSError):
        super().__init__(cause.errno, cause.strerror)
        self.path, self.kept, self.cause = path, kept, cause

    def __str__(self) -> str:
        return f"the spill folder {self.path.parent} is full or not writable ({self.cause.strerror or self.cause})"


def append(path: Path, run_id: str, entries: Iterable[Entry]) -> int:
    """Append ``entries`` (points or kind records) to the JSONL spill file at ``path``, durably (fsync); returns
    how many. Append-only: what the file holds is never rewritten. When the folder runs out of room, the file is
    cut back to its last whole line (leaving :data:`END_RESERVE` bytes free when this call wrote that much) and
    :class:`SpillFull` says how many entries it kept."""
    return _append_lines(Path(path), [json.dumps(_as_json(run_id, entry)) + "\n" for entry in entries])


def append_missing(path: Path, run_id: str, entries: Iterable[Entry]) -> int:
    """Append those of ``entries`` the spill file does not hold yet (a writer spilled part of them); returns how
    many of ``entries`` the file holds now. :class:`SpillFull` when the folder took only part of them."""
    path = Path(path)
    lines = [json.dumps(_as_json(run_id, entry)) + "\n" for entry in entries]
    held = set(path.read_text(errors="replace").splitlines(keepends=True)) if path.exists() else set()
    missing = [line for line in lines if line not in held]
    try:
        _append_lines(path, missing)
    except SpillFull as full:
        full.kept += len(lines) - len(missing)
        raise
    return len(lines)


def _append_lines(path: Path, lines: list[str]) -> int:
    if not lines:
        return 0
    data = [line.encode() for line in lines]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise SpillFull(path, 0, exc) from exc
    try:
        start = os.fstat(fd).st_size
        blob, done = b"".join(data), 0
        try:
            while done < len(blob):
                done += os.write(fd, blob[done:])
            os.fsync(fd)
        except OSError as exc:
            kept, size = _whole_lines(data, done)
            os.ftruncate(fd, start + size)
            raise SpillFull(path, kept, exc) from exc
    finally:
        os.close(fd)
    return len(lines)


def _whole_lines(data: list[bytes], written: int) -> tuple[int, int]:
    """How many of ``data``'s lines to keep of ``written`` bytes, and their size: whole lines only, and
    :data:`END_RESERVE` given back when that many were written (the run's end must still fit)."""
    room = written - END_RESERVE if written > END_RESERVE else written
    kept = size = 0
    for line in data:
        if size + len(line) > room:
            break
        kept, size = kept + 1, size + len(line)
    return kept, size


def _as_json(run_id: str, entry: Entry) -> dict[str, Any]:
    if isinstance(entry, dict):
        return {"run_id": run_id, **entry}
    key, value, timestamp, step = entry
    return {"run_id": run_id, "key": key, "value": value, "timestamp": timestamp, "step": step}


def upload_command(path: Path, tracking_uri: str) -> str:
    """The shell command that uploads ``path`` into ``tracking_uri`` from any shell (nothing taken from its env):
    ``verlflow runs upload-spill <file>``, the console script beside this Python named by its path, so that the
    command still works after an upgrade that moves modules (a ``python -m <module>`` form did not)."""
    script = Path(sys.executable).with_name("verlflow")
    command = shlex.quote(str(script)) if script.is_file() else f"{shlex.quote(sys.executable)} -m verlflow.cli"
    return (f"MLFLOW_TRACKING_URI={shlex.quote(tracking_uri)} {command} runs upload-spill "
            f"{shlex.quote(str(Path(path).resolve()))}")


# What the upload takes, said in a refusal.
SPILL_FILE = "the metrics.spill.jsonl (or <run_id>.spill.jsonl) file named in the upload command a step printed"
# Every spill record's line starts so (_as_json puts the run first), a damaged file's whole lines too.
_RECORD_START = b'{"run_id": "'
_SNIFF_BYTES = 1 << 20


def not_a_spill_file(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be uploaded as a spill file, in words naming it and what would do; None when it can.

    A spill file holds a line that starts as a spill record does within its first MiB: a database, a config or a
    log given by mistake is refused before anything is written or renamed."""
    path = Path(path)
    if not path.exists():
        return f"spill file {path} does not exist: give {SPILL_FILE}"
    if path.is_dir():
        return f"{path} is a folder, not a spill file: give {SPILL_FILE}"
    try:
        with path.open("rb") as file:
            head = file.read(_SNIFF_BYTES)
    except OSError as exc:
        return f"spill file {path} cannot be read ({exc.strerror or exc}): give {SPILL_FILE}, readable by you"
    if not any(line.startswith(_RECORD_START) for line in head.splitlines()):
        return f"{path} is not a spill file (no line is a spill record, {_RECORD_START.decode()}…): give {SPILL_FILE}"
    return None


def write_entry(client, run_id: str, entry: dict[str, Any]) -> None:
    """Write one kind record (table, tags, summaries, final model, status) into ``run_id`` through ``client``."""
    from mlflow.entities import Metric, RunTag

    kind = entry["kind"]
    if kind == "table":
        client.log_table(run_id, data=entry["data"], artifact_file=entry["artifact_file"])
    elif kind == "tags":
        client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in entry["tags"].items()])
    elif kind == "summaries":
        from verlflow.outage.summaries import TimingSums, log_timing_summaries

        log_timing_summaries(client, run_id, entry["started_at"], entry["ended_at"], TimingSums.from_record(entry))
    elif kind == "link":
        from verlflow.outage.logged_models import link_points

        link_points(client, run_id, entry["model_id"], [Metric(*point) for point in entry["points"]])
    elif kind == "traces":
        from verlflow.outage.rollout_traces import write_traces

        write_traces(client, run_id, entry)
    elif kind == "final_model":
        from verlflow.outage.logged_models import replay_final_model

        replay_final_model(client, run_id, entry["checkpoint"], entry["step"])
    elif kind == "status":
        client.set_terminated(run_id, entry["status"], end_time=entry["end_time"])
    else:
        raise ValueError(f"unknown spill record kind '{kind}'")


def uploaded_marker(path: str | os.PathLike[str]) -> Path:
    """What an uploaded spill file is renamed to: ``<file>.uploaded`` (so a second upload can say so)."""
    return Path(path).with_name(Path(path).name + ".uploaded")


def _records(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """The spill file's records in order, and its lines that are not records (torn or damaged), numbered."""
    records, bad = [], []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and "run_id" in record and ("kind" in record or "key" in record):
            records.append(record)
        else:
            bad.append((number, line))
    return records, bad


def _torn_status(bad: list[tuple[int, str]]) -> dict[str, Any] | None:
    """A final status record whose line was torn after its status word (the last line a step writes)."""
    for _, line in reversed(bad):
        run = re.search(r'"run_id": "(\w+)"', line)
        status = re.search(r'"kind": "status", "status": "(FINISHED|FAILED|KILLED)"', line)
        if run and status:
            return {"run_id": run.group(1), "kind": "status", "status": status.group(1), "end_time": None}
    return None


class UploadIncomplete(Exception):
    """Some records of a spill file could not be written (each said in one line); they are kept in the file."""

    def __init__(self, path: Path, count: int, kept: int):
        super().__init__(f"{kept} records of {path} could not be written and are kept there")
        self.path, self.count, self.kept = path, count, kept


# Kinds whose write goes to the artifact store: one that fails while the tracking API answers is kept and reported,
# never a stop for the records behind it.
ARTIFACT_KINDS = ("table", "traces", "final_model")


def describe(record: dict[str, Any]) -> str:
    """A record in words, for the one line that says it was not written."""
    what = (record.get("artifact_file") or record.get("checkpoint") or record.get("status")
            or (f"of step {record['step']}" if "step" in record else ""))
    return f"{record['kind']}{f' {what}' if what else ''} of run {record['run_id']}"


def replace_durably(path: Path, run_id: str | None, entries: list[Entry]) -> None:
    """Make ``path`` hold ``entries`` only (write a new file, fsync, rename over): the old file stays whole until
    the new one is on disk. No entries: the file is removed."""
    if not entries:
        Path(path).unlink(missing_ok=True)
        return
    fresh = Path(path).with_name(Path(path).name + ".new")
    fresh.unlink(missing_ok=True)
    _append_lines(fresh, [json.dumps(entry if run_id is None else _as_json(run_id, entry)) + "\n"
                          for entry in entries])
    os.replace(fresh, path)


def readable_records(path: Path) -> list[dict[str, Any]]:
    """The records of a spill file; its lines that are not records are reported, kept in ``<file>.bad`` and left
    out, and a final status torn after its status word is still taken."""
    records, bad = _records(path)
    if bad:
        with path.with_name(path.name + ".bad").open("a") as kept:
            kept.writelines(line + "\n" for _, line in bad)
        for number, line in bad:
            print(f"verlflow: {path} line {number} is not a spill record (torn or damaged): skipped, kept in "
                  f"{path.name}.bad: {line[:80]!r}", file=sys.stderr)
        if not any(r.get("kind") == "status" for r in records) and (status := _torn_status(bad)):
            records.append(status)
    return records


class _Uploader:
    """One upload of a spill file: points gathered per run and written in batches, records one by one, each
    point checked against what the run holds (one read of the run; a key's history only for a point at or
    before the run's last step of that key, as in a second upload)."""

    def __init__(self, client):
        self.client = client
        self.held: dict[tuple[str, str], set[tuple[int, int, float]]] = {}
        self.read: set[tuple[str, str]] = set()  # keys whose history has been read
        self.latest: dict[str, dict[str, float]] = {}
        self.points: list[tuple[str, Any]] = []
        self.count = 0
        self.failed: list[dict[str, Any]] = []

    def is_new(self, run_id: str, metric) -> bool:
        """Whether ``metric`` is not in the run yet."""
        if run_id not in self.latest:
            self.latest[run_id] = latest_metric_steps(self.client.get_run(run_id).data)
        seen = self.held.setdefault((run_id, metric.key), set())
        if (run_id, metric.key) not in self.read and metric.step <= self.latest[run_id].get(metric.key, -math.inf):
            seen |= {(m.step, m.timestamp, m.value) for m in self.client.get_metric_history(run_id, metric.key)}
            self.read.add((run_id, metric.key))
        return (metric.step, metric.timestamp, metric.value) not in seen

    def write_points(self) -> None:
        """Write the gathered points that the runs lack (a point spilled twice is written once)."""
        for run_id in dict.fromkeys(r for r, _ in self.points):
            metrics = []
            for r, m in self.points:
                if r == run_id and self.is_new(r, m):
                    metrics.append(m)
                    self.held[(r, m.key)].add((m.step, m.timestamp, m.value))
            self.latest.pop(run_id, None)  # read again after the writes, for the records that follow
            for start in range(0, len(metrics), _BATCH):
                self.client.log_batch(run_id, metrics=metrics[start:start + _BATCH])
            self.count += len(metrics)
        self.points = []

    def add(self, record: dict[str, Any]) -> None:
        """Gather a point, or write the points before a record and then the record (kept when it fails while the
        tracking API answers: an artifact store that refuses stops only that record)."""
        from mlflow.entities import Metric

        from verlflow.names import TIMING_E2E

        if "kind" not in record:
            self.points.append((record["run_id"], Metric(record["key"], record["value"], record["timestamp"],
                                                         record["step"])))
            return
        self.write_points()
        if record["kind"] == "summaries" and not self.is_new(record["run_id"], Metric(
                TIMING_E2E, record["ended_at"] - record["started_at"], int(record["ended_at"] * 1000), 0)):
            return  # logged by an earlier upload of this file
        try:
            write_entry(self.client, record["run_id"], record)
        except Exception as exc:
            self.client.get_run(record["run_id"])  # the tracking API does not answer either: the upload stops
            self.failed.append(record)
            print(f"verlflow: {describe(record)} not uploaded ({_first_line(exc)}): kept in the spill file",
                  file=sys.stderr, flush=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def upload(path: str | os.PathLike[str]) -> int:
    """Write a spill file's records into their runs, in order (metrics with their step and time); returns how many
    metric points it wrote, and renames the file to :func:`uploaded_marker`.

    Idempotent: a point the run already holds (same key, step, time and value) and summaries already logged are
    not written again, so uploading the same file twice adds nothing. Lines that are not records (a torn last
    line, a damaged one) are reported on stderr, kept in ``<file>.bad`` and skipped; the rest is uploaded, and a
    final status torn after its status word is still set. A record the tracking server refuses while it answers
    (an artifact store that takes no writes) is one line on stderr and stays in the file, which then holds only
    such records: :class:`UploadIncomplete` says how many. A server that does not answer stops the upload with
    its error, the file left as it was.
    """
    from mlflow.tracking import MlflowClient

    path = Path(path)
    client, records = MlflowClient(), readable_records(path)
    if refused := foreign_write(path, records, client):
        raise SpillRefused(refused)
    count, failed = replay(client, records)
    if failed:
        replace_durably(path, None, failed)
        raise UploadIncomplete(path, count, len(failed))
    path.replace(uploaded_marker(path))
    return count


class SpillRefused(VerlflowError):
    """A spill file that would write where its step could not have: another user's file or run, a finished run's
    end, a run's name. Nothing of it is written."""


# Tags a spill file never sets: what names a run (its steps' spills carry metrics, tables, tags of their own end).
_NEVER_SPILLED_TAGS = ("mlflow.runName",)


def foreign_write(path: Path, records: list[dict[str, Any]], client) -> str | None:
    """Why ``path`` cannot be uploaded as a spill file this user's step wrote, in one line; None when it can.

    A step writes its spill file as its user and into its own runs, so an upload takes only a file of the user
    who runs it, writable by no one else, whose runs are that user's; it ends no run that already ended FINISHED
    otherwise than the file says (a second upload of the same file is allowed and adds nothing), and it renames
    no run."""
    import getpass

    stat = path.stat()
    if stat.st_uid != os.getuid():
        return (f"spill file {path} belongs to another user (uid {stat.st_uid}): upload only a spill file your "
                "step wrote")
    if stat.st_mode & 0o022:
        return (f"spill file {path} is writable by other users (mode {stat.st_mode & 0o777:o}): a spill file is "
                "written by its step alone; check where it came from")
    users = {getpass.getuser(), os.environ.get("MLFLOW_TRACKING_USERNAME")} - {None, ""}
    for run_id in dict.fromkeys(str(record["run_id"]) for record in records):
        own = [record for record in records if record["run_id"] == run_id]
        run = client.get_run(run_id)
        if run.info.user_id not in users | {"unknown"}:  # "unknown": a run created without its user's tag
            return (f"spill file {path} writes into run {run_id} of user '{run.info.user_id}': a spill file only goes "
                    "into the runs of the user who uploads it")
        ends = [(r["status"], r.get("end_time")) for r in own if r.get("kind") == "status"]
        if run.info.status == "FINISHED" and ("FINISHED", run.info.end_time) not in ends:
            return (f"spill file {path} writes into run {run_id}, which ended FINISHED otherwise than this file "
                    "says: a spill file only completes the run its outage left open")
        if any(key in record.get("tags", {}) for record in own for key in _NEVER_SPILLED_TAGS):
            return f"spill file {path} renames run {run_id}: a spill file never sets a run's name"
    return None


def replay(client, records: Iterable[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """Write spill ``records`` (each with its ``run_id``) in order through ``client``, as :func:`upload` does: a
    point the run holds already is not written again. Returns how many points it wrote, and the records refused
    while the tracking API answers (each said in one line on stderr). A server that does not answer raises."""
    uploader = _Uploader(client)
    for record in records:
        uploader.add(record)
    uploader.write_points()
    return uploader.count, uploader.failed
