"""The spill file: what a tracking outage left unwritten, on disk, and the command that uploads it later.

    MLFLOW_TRACKING_URI=http://host:5000 python -m verlflow.runs.metric_buffer outputs/local/<run>/metrics.spill.jsonl

One JSON object per line, in the order training made them. A metric point is
``{"run_id", "key", "value", "timestamp", "step"}``; anything else names its ``kind``:

- ``table``: ``{"artifact_file", "data"}`` (a validation step's samples, for ``MlflowClient.log_table``),
- ``tags``: ``{"tags": {name: value}}``,
- ``summaries``: ``{"started_at", "ended_at"}`` (``timing_s/e2e`` and the ``timing_s_mean/*`` of
  :func:`verlflow.runs.summaries.log_timing_summaries`, taken once the points before it are in),
- ``status``: ``{"status", "end_time"}`` (the run's final status; the last line, set last).

:func:`upload` replays the lines in order with their original step and time, so running it later ends the
run exactly as the trainer would have with a server that answered.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_BATCH = 1000  # MLflow's log_batch limit on metrics per call
# One metric point as the writer keeps and spills it: (key, value, timestamp in ms, step), MLflow Metric's order.
Point = tuple[str, float, int, int]
# What the writer keeps between the trainer and the store: a metric point, or a record with its "kind".
Entry = Point | dict[str, Any]


def append(path: Path, run_id: str, entries: Iterable[Entry]) -> None:
    """Append ``entries`` (points or kind records) to the JSONL spill file at ``path``."""
    lines = [json.dumps(_as_json(run_id, entry)) + "\n" for entry in entries]
    if not lines:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.writelines(lines)


def _as_json(run_id: str, entry: Entry) -> dict[str, Any]:
    if isinstance(entry, dict):
        return {"run_id": run_id, **entry}
    key, value, timestamp, step = entry
    return {"run_id": run_id, "key": key, "value": value, "timestamp": timestamp, "step": step}


def upload_command(path: Path, tracking_uri: str) -> str:
    """The shell command that uploads ``path`` into ``tracking_uri`` from any shell (nothing taken from its env)."""
    return (f"MLFLOW_TRACKING_URI={shlex.quote(tracking_uri)} {shlex.quote(sys.executable)} -m "
            f"verlflow.runs.metric_buffer {shlex.quote(str(Path(path).resolve()))}")


def write_entry(client, run_id: str, entry: dict[str, Any]) -> None:
    """Write one kind record (table, tags, summaries, status) into ``run_id`` through ``client``."""
    from mlflow.entities import RunTag

    kind = entry["kind"]
    if kind == "table":
        client.log_table(run_id, data=entry["data"], artifact_file=entry["artifact_file"])
    elif kind == "tags":
        client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in entry["tags"].items()])
    elif kind == "summaries":
        from verlflow.runs.summaries import log_timing_summaries

        log_timing_summaries(client, run_id, entry["started_at"], entry["ended_at"])
    elif kind == "status":
        client.set_terminated(run_id, entry["status"], end_time=entry["end_time"])
    else:
        raise ValueError(f"unknown spill record kind '{kind}'")


def upload(path: str | os.PathLike[str]) -> int:
    """Write a spill file's lines into their runs, in order (metrics with their step and time); removes the file.

    Returns how many metric points it wrote. Tables, tags and summaries follow the points logged before
    them; a final status line ends the run.
    """
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    points: list[tuple[str, Metric]] = []
    count = 0

    def write_points() -> None:
        nonlocal points, count
        for run_id in dict.fromkeys(r for r, _ in points):
            metrics = [m for r, m in points if r == run_id]
            for start in range(0, len(metrics), _BATCH):
                client.log_batch(run_id, metrics=metrics[start:start + _BATCH])
            count += len(metrics)
        points = []

    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if "kind" not in record:
            points.append((record["run_id"], Metric(record["key"], record["value"], record["timestamp"],
                                                    record["step"])))
            continue
        write_points()
        write_entry(client, record["run_id"], record)
    write_points()
    Path(path).unlink()
    return count
