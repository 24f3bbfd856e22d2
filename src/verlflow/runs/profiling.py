"""Profiles of chosen training steps: where a step's time goes, per phase and per operator, logged with the run.

    verlflow train --device cpu --overrides "verlflow.profile_steps=[2]"

A train run with ``verlflow.profile_steps=[N, …]`` carries, for each profiled step, the trace files under
``profile/step_<N>/`` (a gzipped Chrome trace from ``torch.profiler``: open it in ``chrome://tracing`` or Perfetto) and
``profile/step_<N>/summary.json``, an MLflow table with one row per phase (verl's timer names: gen, update_actor …)
and per top-level operator (aten::mm …), milliseconds and calls. ``compare`` puts two runs' summaries side by side.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

PROFILE_ARTIFACT_DIR = "profile"
SUMMARY_FILE = "summary.json"
# Operators kept in a summary, the largest first.
TOP_OPERATORS = 30
_STEP_DIR = re.compile(r"step_(\d+)$")


def step_artifact_dir(step: int) -> str:
    """Where a profiled step's files go in the run: ``profile/step_<N>``."""
    return f"{PROFILE_ARTIFACT_DIR}/step_{step}"


def _events(trace: Mapping[str, Any]) -> list[dict]:
    return [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]


def summarize_trace(path: str | Path, phases: Iterable[str]) -> list[dict[str, Any]]:
    """Rows ``{kind, name, time_ms, calls}`` of a Chrome trace: each phase's annotated time, then the top operators.

    Phases are ``record_function`` annotations (category ``user_annotation``) named as ``phases``. Operators
    (category ``cpu_op``) are counted at the top level of their thread only, so a nested ``aten::addmm`` inside
    ``aten::linear`` is not counted twice; the sum over operators is then the time spent in operators.
    """
    raw = Path(path).read_bytes()
    trace = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    wanted = set(phases)
    phase_ms: dict[str, float] = defaultdict(float)
    phase_calls: dict[str, int] = defaultdict(int)
    op_ms: dict[str, float] = defaultdict(float)
    op_calls: dict[str, int] = defaultdict(int)
    ops_by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for event in _events(trace):
        category, name = event.get("cat", ""), str(event.get("name", ""))
        if category == "user_annotation" and name in wanted:
            phase_ms[name] += float(event["dur"]) / 1000
            phase_calls[name] += 1
        elif category == "cpu_op":
            ops_by_thread[(event.get("pid"), event.get("tid"))].append(event)
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
