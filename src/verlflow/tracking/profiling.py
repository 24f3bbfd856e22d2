"""Profiles of chosen training steps: where a step's time goes, per phase and per operator, logged with the run.

    verlflow train --device cpu --overrides "verlflow.profile_steps=[2]"

A train run with ``verlflow.profile_steps=[N, …]`` carries, for each profiled step, the trace files under
``profile/step_<N>/`` (a gzipped Chrome trace from ``torch.profiler``: open it in ``chrome://tracing`` or Perfetto;
on an NPU each rank's ``ascend_pytorch_profiler_<rank>.db``: open it in MindStudio Insight) and
``profile/step_<N>/summary.json``, an MLflow table with one row per phase (verl's timer names: gen, update_actor …),
per top-level operator (aten::mm …) and per device kernel, milliseconds and calls. ``compare`` puts two runs'
summaries side by side. The Ascend database is read by :mod:`verlflow.tracking.ascend_profile`.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from verlflow.tracking import ascend_profile
from verlflow.tracking.ascend_profile import VERL_STAGES

PROFILE_ARTIFACT_DIR = "profile"
SUMMARY_FILE = "summary.json"
# Operators (and other annotations) kept in a summary, the largest first.
TOP_OPERATORS = 30
_STEP_DIR = re.compile(r"step_(\d+)$")


def step_artifact_dir(step: int) -> str:
    """Where a profiled step's files go in the run: ``profile/step_<N>``."""
    return f"{PROFILE_ARTIFACT_DIR}/step_{step}"


def _events(trace: Mapping[str, Any]) -> list[dict]:
    return [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]


def summarize_trace(path: str | Path, phases: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Rows ``{kind, name, time_ms, calls}`` of a Chrome trace: each phase's annotated time, then the top operators.

    Phases are ``record_function`` annotations (category ``user_annotation``) named as ``phases``; with None, verl's
    stage annotations (:data:`VERL_STAGES`, named as verl's timers) and every other annotation as kind
    ``annotation`` (FSDP hooks, mini-batches). Operators
    (category ``cpu_op``) are counted at the top level of their thread only, so a nested ``aten::addmm`` inside
    ``aten::linear`` is not counted twice; the sum over operators is then the time spent in operators.
    """
    raw = Path(path).read_bytes()
    trace = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    wanted = None if phases is None else set(phases)
    phase_ms: dict[str, float] = defaultdict(float)
    phase_calls: dict[str, int] = defaultdict(int)
    other_ms: dict[str, float] = defaultdict(float)
    other_calls: dict[str, int] = defaultdict(int)
    op_ms: dict[str, float] = defaultdict(float)
    op_calls: dict[str, int] = defaultdict(int)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    ops_by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for event in _events(trace):
        category, name = event.get("cat", ""), str(event.get("name", ""))
        if category == "user_annotation":
            if wanted is None and name in VERL_STAGES:
                name = VERL_STAGES[name]
            elif wanted is None:
                other_ms[name] += float(event["dur"]) / 1000
                other_calls[name] += 1
                continue
            elif name not in wanted:
                continue
            phase_ms[name] += float(event["dur"]) / 1000
            phase_calls[name] += 1
        elif category == "cpu_op":
            ops_by_thread[(event.get("pid"), event.get("tid"))].append(event)
        elif category == "kernel":  # a device kernel (CUDA): its own time on the device
            kernels[name][0] += float(event["dur"]) / 1000
            kernels[name][1] += 1
    for ops in ops_by_thread.values():
        open_until = float("-inf")
        for event in sorted(ops, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
            start, duration = float(event["ts"]), float(event["dur"])
            if start < open_until:
                continue  # nested in the operator still open on this thread
            open_until = start + duration
            op_ms[event["name"]] += duration / 1000
            op_calls[event["name"]] += 1
    rows = [{"kind": "phase", "name": name, "time_ms": round(ms, 3), "calls": phase_calls[name]}
            for name, ms in sorted(phase_ms.items(), key=lambda kv: -kv[1])]
    top = sorted(op_ms.items(), key=lambda kv: -kv[1])[:TOP_OPERATORS]
    rows += [{"kind": "operator", "name": name, "time_ms": round(ms, 3), "calls": op_calls[name]} for name, ms in top]
    others = sorted(other_ms.items(), key=lambda kv: -kv[1])[:TOP_OPERATORS]
    rows += [{"kind": "annotation", "name": name, "time_ms": round(ms, 3), "calls": other_calls[name]}
             for name, ms in others]
    top_kernels = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:TOP_OPERATORS]
    rows += [{"kind": "kernel", "name": name, "time_ms": round(ms, 3), "calls": int(calls)}
             for name, (ms, calls) in top_kernels]
    return rows


def log_step_profile(step: int, files: Iterable[str | Path], summary: list[dict[str, Any]]) -> None:
    """Log a profiled step's trace files and its summary table under ``profile/step_<N>/`` of the active run."""
    import mlflow
    import pandas as pd

    folder = step_artifact_dir(step)
    for file in files:
        mlflow.log_artifact(str(file), folder)
    mlflow.log_table(pd.DataFrame(summary, columns=["kind", "name", "time_ms", "calls"]),
                     f"{folder}/{SUMMARY_FILE}")


def read_step_summaries(run_id: str) -> dict[int, list[dict[str, Any]]]:
    """Every profiled step's summary rows of a run: {step: rows}; empty when the run profiled none."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    found: dict[int, list[dict[str, Any]]] = {}
    for entry in client.list_artifacts(run_id, PROFILE_ARTIFACT_DIR):
        matched = _STEP_DIR.search(entry.path)
        if not entry.is_dir or not matched:
            continue
        try:
            table = mlflow.artifacts.load_dict(f"runs:/{run_id}/{entry.path}/{SUMMARY_FILE}")
        except Exception:  # noqa: BLE001 - a step folder without its summary (a run cut short): skipped
            continue
        columns = table.get("columns", [])
        found[int(matched.group(1))] = [dict(zip(columns, row, strict=False)) for row in table.get("data", [])]
    return found


def merged(summaries: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Several traces' rows of one step (one file per worker and stage) as one summary: times and calls added."""
    totals: dict[tuple[str, str], list[float]] = {}
    for rows in summaries:
        for row in rows:
            entry = totals.setdefault((row["kind"], row["name"]), [0.0, 0])
            entry[0] += float(row["time_ms"])
            entry[1] += int(row["calls"])
    ordered = sorted(totals.items(), key=lambda kv: -kv[1][0])
    kept = [(k, v) for k, v in ordered if k[0] == "phase"]
    for kind in ("operator", "annotation", "kernel"):
        kept += [(k, v) for k, v in ordered if k[0] == kind][:TOP_OPERATORS]
    return [{"kind": kind, "name": name, "time_ms": round(ms, 3), "calls": calls}
            for (kind, name), (ms, calls) in kept]


_TRACE_STEP = re.compile(r"step_?(\d+)")


def log_profile_folder(folder: str | Path, steps: Sequence[int] = ()) -> list[int]:
    """Log verl's profiler output in ``folder`` (``global_profiler.save_path``) by step; returns the steps logged.

    Torch traces go to ``profile/step_<N>/`` (N from verl's ``step<N>`` in their names, files without one to
    ``profile/``) and are summarized together into the step's summary table. Ascend collections
    (``*_ascend_pt``, which carry no step: ``steps`` are the profiled steps, see
    :func:`verlflow.tracking.ascend_profile.runs_by_step`) log their parsed databases under
    ``profile/step_<N>/<role>/<collection>/`` — one per process and rank, so no two collide — and the raw
    data beside them stays on the node.
    """
    import mlflow

    root = Path(folder)
    if not root.is_dir():
        return []
    collections = ascend_profile.ascend_runs(root)
    by_step: dict[int, list[Path]] = defaultdict(list)
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        if any(run in file.parents for run in collections):
            continue
        found = _TRACE_STEP.search(file.name)
        if found:
            by_step[int(found.group(1))].append(file)
        else:
            mlflow.log_artifact(str(file), PROFILE_ARTIFACT_DIR)
    ascend = ascend_profile.runs_by_step(collections, steps)
    for step in sorted(set(by_step) | set(ascend)):
        traces = [f for f in by_step.get(step, []) if f.name.endswith((".json", ".json.gz"))]
        dbs = [db for run in ascend.get(step, []) for db in ascend_profile.databases(run)]
        summary = merged([*(summarize_trace(f) for f in traces), *(ascend_profile.summarize_db(db) for db in dbs)])
        log_step_profile(step, by_step.get(step, []), summary)
        for db in dbs:
            for file in (db, *db.parent.parent.glob("profiler_info*.json")):
                mlflow.log_artifact(str(file), f"{step_artifact_dir(step)}/{file.parent.relative_to(root)}")
    return sorted(set(by_step) | set(ascend))
