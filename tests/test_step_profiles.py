"""A profiled step's summary: phases from annotations, operators counted once at the top of their thread.

A hand-written Chrome trace (the format torch.profiler exports) whose times are chosen for hand arithmetic, and a
real local-trainer profile of one tiny step read back from a real SQLite store.
"""

from __future__ import annotations

import gzip
import json

import mlflow
import pytest

from verlflow.tracking import profiling


def _event(name: str, cat: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


@pytest.fixture
def trace(tmp_path):
    """Step 0-10 ms: gen 0-4 ms holding aten::linear (1-3 ms) and its nested aten::addmm (1.5-2.5 ms); verl's
    actor_update 5-9 ms with aten::mm 5-8 ms; an FSDP hook; a second thread's aten::mm 0-1 ms."""
    events = [
        _event("gen", "user_annotation", 0, 4000),
        _event("actor_update", "user_annotation", 5000, 4000),
        _event("FSDP::pre_forward", "user_annotation", 5000, 500),
        _event("aten::linear", "cpu_op", 1000, 2000),
        _event("aten::addmm", "cpu_op", 1500, 1000),
        _event("aten::mm", "cpu_op", 5000, 3000),
        _event("aten::mm", "cpu_op", 0, 1000, tid=2),
        {"ph": "i", "name": "marker", "ts": 3, "pid": 7, "tid": 1},
    ]
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path


def test_a_trace_summary_is_the_hand_arithmetic(trace):
    rows = {(r["kind"], r["name"]): (r["time_ms"], r["calls"]) for r in profiling.summarize_trace(trace)}
    # verl's stage name becomes its timer's; other annotations are kept apart from the phases
    assert rows[("phase", "update_actor")] == (4.0, 1)
    assert rows[("annotation", "gen")] == (4.0, 1) and rows[("annotation", "FSDP::pre_forward")] == (0.5, 1)
    # operators: the nested addmm is inside linear, so not counted again; mm on two threads adds up
    assert rows[("operator", "aten::linear")] == (2.0, 1)
    assert ("operator", "aten::addmm") not in rows
    assert rows[("operator", "aten::mm")] == (4.0, 2)
    local = {(r["kind"], r["name"]) for r in profiling.summarize_trace(trace, phases=("gen", "update_actor"))}
    assert ("phase", "gen") in local and ("phase", "actor_update") not in local


def test_summaries_of_one_steps_files_add_up(trace):
    one = profiling.summarize_trace(trace)
    rows = {(r["kind"], r["name"]): (r["time_ms"], r["calls"]) for r in profiling.merged([one, one])}
    assert rows[("operator", "aten::mm")] == (8.0, 4) and rows[("phase", "update_actor")] == (8.0, 2)


def test_verls_profile_folder_is_logged_by_step_and_read_back(trace, tmp_path, tracking_uri):
    folder = tmp_path / "profile"
    folder.mkdir()
    (folder / "actor-rollout-ref_train_step2_rank0-of-1.json.gz").write_bytes(trace.read_bytes())
    (folder / "notes.txt").write_text("no step in this name")
    with mlflow.start_run() as run:
        assert profiling.log_profile_folder(folder) == [2]
    summaries = profiling.read_step_summaries(run.info.run_id)
    assert list(summaries) == [2]
    assert {"kind": "phase", "name": "update_actor", "time_ms": 4.0, "calls": 1} in summaries[2]
    listed = {f.path for f in mlflow.MlflowClient().list_artifacts(run.info.run_id, "profile")}
    assert {"profile/step_2", "profile/notes.txt"} <= listed
