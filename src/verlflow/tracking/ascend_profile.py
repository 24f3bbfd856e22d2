"""Ascend profiles: torch_npu's profiler output, by step and rank, summarised like a torch trace.

verl 0.9.1's ``npu`` profiler tool exports only the database (``ExportType.Db``): each profiled worker process
writes ``<host>_<pid>_<YYYYmmddHHMMSSmmm>_ascend_pt/`` under ``<save_path>/<role>/``, and with
``tool_config.npu.analysis=true`` (set by verlflow) its ``ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_<rank>.db``
(SQLite; tables documented in Huawei's "Data in ascend_pytorch_profiler_{Rank_ID}.db"). verl names no step in the
path, so a process's folders, in time order, are its profiled steps in order (one start/stop per profiled step).

From the database, rows as :func:`verlflow.tracking.profiling.summarize_trace` gives them for a Chrome trace:
``phase`` (verl's stage ranges, marked with mstx: ``PYTORCH_API`` rows of type ``mstx``, else ``MSTX_EVENTS``),
``operator`` (framework operators, ``PYTORCH_API`` rows of type ``op``, top level of each thread only),
``annotation`` (other mstx ranges) and ``kernel`` (device time per kernel: ``TASK`` joined with
``COMPUTE_TASK_INFO``; other device tasks — communication waits, copies — by their task type in brackets).
"""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ASCEND_RUN_SUFFIX = "_ascend_pt"
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
DB_GLOB = "ascend_pytorch_profiler*.db"
# <host>_<pid>_<17-digit timestamp>_ascend_pt, as torch_npu's tensorboard_trace_handler names a collection
_RUN_NAME = re.compile(r"^(?P<worker>.+)_(?P<stamp>\d{14,})_ascend_pt$")
_TOP = 30
# verl's workers annotate their stages with these names (an mstx range on an NPU, a record_function elsewhere);
# a summary names them as verl's timers do (timing_s/*). verlflow.tracking.profiling reads Chrome traces with them too.
VERL_STAGES = {"generate_sequences": "gen", "actor_compute_log_prob": "old_log_prob",
               "ref_compute_log_prob": "ref", "actor_update": "update_actor", "compute_values": "values",
               "critic_update": "update_critic"}
STEP_MARK = "ProfilerStep#"


def ascend_runs(root: str | Path) -> list[Path]:
    """Every ``*_ascend_pt`` collection folder under ``root`` (verl's ``global_profiler.save_path``)."""
    return sorted(p for p in Path(root).rglob(f"*{ASCEND_RUN_SUFFIX}") if p.is_dir())


def runs_by_step(runs: Iterable[Path], steps: Sequence[int]) -> dict[int, list[Path]]:
    """The collections of each profiled step: per process (folder and worker name), the k-th in time is
    ``sorted(steps)[k]``; a process with more collections than steps keeps its extra ones out."""
    by_process: dict[tuple[Path, str], list[tuple[str, Path]]] = defaultdict(list)
    for run in runs:
        matched = _RUN_NAME.match(run.name)
        worker, stamp = (matched.group("worker"), matched.group("stamp")) if matched else (run.name, run.name)
        by_process[(run.parent, worker)].append((stamp, run))
    ordered = sorted(set(steps))
    out: dict[int, list[Path]] = defaultdict(list)
    for collections in by_process.values():
        for step, (_, run) in zip(ordered, sorted(collections), strict=False):
            out[step].append(run)
    return dict(out)


def databases(run: Path) -> list[Path]:
    """A collection's parsed databases (one per rank); empty when it was not analysed."""
    return sorted((run / OUTPUT_DIR).glob(DB_GLOB))


def _tables(db: sqlite3.Connection) -> set[str]:
    return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _api_type(db: sqlite3.Connection, tables: set[str], name: str, default: int) -> int:
    if "ENUM_API_TYPE" in tables:
        found = db.execute("SELECT id FROM ENUM_API_TYPE WHERE name = ?", (name,)).fetchone()
        if found:
            return int(found[0])
    return default


def _ranges(db: sqlite3.Connection, tables: set[str]) -> list[tuple[str, int, int]]:
    """(message, start ns, end ns) of every mstx range (verl's stages) and of torch's ``ProfilerStep#N``."""
    mstx = _api_type(db, tables, "mstx", 50004)
    rows = db.execute("SELECT s.value, a.startNs, a.endNs FROM PYTORCH_API a JOIN STRING_IDS s ON s.id = a.name "
                      "WHERE a.type = ?", (mstx,)).fetchall() if "PYTORCH_API" in tables else []
    if not rows and "MSTX_EVENTS" in tables:
        rows = db.execute("SELECT s.value, e.startNs, e.endNs FROM MSTX_EVENTS e JOIN STRING_IDS s "
                          "ON s.id = e.message WHERE e.endNs > e.startNs").fetchall()
    steps = db.execute("SELECT s.value, a.startNs, a.endNs FROM PYTORCH_API a JOIN STRING_IDS s ON s.id = a.name "
                       "WHERE s.value LIKE ?", (f"{STEP_MARK}%",)).fetchall() if "PYTORCH_API" in tables else []
    return [(str(name), int(start), int(end)) for name, start, end in [*rows, *steps]]


def _operators(db: sqlite3.Connection, tables: set[str]) -> dict[str, list[float]]:
    """Operator → [ms, calls], top-level operators of each thread only (a nested aten::mm is not counted twice)."""
    if "PYTORCH_API" not in tables:
        return {}
    op = _api_type(db, tables, "op", 50001)
    rows = db.execute("SELECT a.globalTid, a.startNs, a.endNs, s.value FROM PYTORCH_API a JOIN STRING_IDS s "
                      "ON s.id = a.name WHERE a.type = ? ORDER BY a.globalTid, CAST(a.startNs AS INTEGER), "
                      "CAST(a.endNs AS INTEGER) DESC", (op,)).fetchall()
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    thread, open_until = None, -1
    for tid, start, end, name in rows:
        start, end = int(start), int(end)
        if str(name).startswith(STEP_MARK):
            continue  # torch's step annotation (a user annotation in a Chrome trace), not an operator
        if tid != thread:
            thread, open_until = tid, -1
        if start < open_until:
            continue  # nested in the operator still open on this thread
        open_until = end
        out[str(name)][0] += (end - start) / 1e6
        out[str(name)][1] += 1
    return out


def _kernels(db: sqlite3.Connection, tables: set[str]) -> dict[str, list[float]]:
    """Device task → [ms, calls]: compute kernels by name, other tasks by ``[task type]``."""
    if "TASK" not in tables or "STRING_IDS" not in tables:
        return {}
    join = ("LEFT JOIN COMPUTE_TASK_INFO c ON c.globalTaskId = t.globalTaskId LEFT JOIN STRING_IDS k ON k.id = c.name"
            if "COMPUTE_TASK_INFO" in tables else "")
    kernel = "k.value" if join else "NULL"
    rows = db.execute(f"SELECT {kernel}, s.value, SUM(t.endNs - t.startNs), COUNT(*) FROM TASK t {join} "
                      "LEFT JOIN STRING_IDS s ON s.id = t.taskType GROUP BY 1, 2").fetchall()
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, task_type, total_ns, calls in rows:
        key = str(name) if name else f"[{task_type or 'task'}]"
        out[key][0] += float(total_ns or 0) / 1e6
        out[key][1] += int(calls)
    return out


def summarize_db(path: str | Path) -> list[dict[str, Any]]:
    """Rows ``{kind, name, time_ms, calls}`` of one ``ascend_pytorch_profiler_<rank>.db``: phases, operators,
    other annotations and device kernels, the largest first (:data:`_TOP` of each but phases)."""
    with sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True) as db:
        tables = _tables(db)
        ranges, operators, kernels = _ranges(db, tables), _operators(db, tables), _kernels(db, tables)
    phases: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    others: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, start, end in ranges:
        target = phases[VERL_STAGES[name]] if name in VERL_STAGES else others[name]
        target[0] += (end - start) / 1e6
        target[1] += 1
    rows: list[dict[str, Any]] = []
    for kind, totals, limit in (("phase", phases, None), ("operator", operators, _TOP),
                                ("annotation", others, _TOP), ("kernel", kernels, _TOP)):
        ordered = sorted(totals.items(), key=lambda kv: -kv[1][0])[:limit]
        rows += [{"kind": kind, "name": name, "time_ms": round(ms, 3), "calls": int(calls)}
                 for name, (ms, calls) in ordered]
    return rows
