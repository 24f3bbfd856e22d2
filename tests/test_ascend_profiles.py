"""Ascend profiles that compare: verl's npu profiler asks for NPU activity and a database per rank, and the
recorded database of a real Ascend run (tests/fixtures/profiles/, with its source) is summarised, logged by step
and rank, and put beside another run's in compare's profile section.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import mlflow
import pytest

from verlflow import config
from verlflow.backends.verl.command import build_plan
from verlflow.compare import profiles
from verlflow.tracking import ascend_profile, profiling

RECORDED = Path(__file__).parent / "fixtures" / "profiles" / "rank0_ascend_pt"
DB = RECORDED / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db"


def _query(sql: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{DB}?mode=ro", uri=True) as db:
        return db.execute(sql, args).fetchall()


def test_on_an_npu_verls_resolved_profiler_records_npu_activity_into_a_database(tmp_path):
    from verl.utils.config import omega_conf_to_dataclass

    cfg = config.compose("qwen3-4b-gsm8k-grpo", "a3", f"verlflow.output_dir={tmp_path} verlflow.profile_steps=[2,5]",
                         extra={"data.train_files": "t.parquet", "data.val_files": "v.parquet"})
    plan = build_plan(cfg, run_id="0" * 32, experiment_name="e", run_name="r", tracking_uri="sqlite:///m.db")
    resolved = config.validate_against_verl(plan.overrides)  # verl 0.9.1's own composition of its config
    assert list(resolved.global_profiler.steps) == [2, 5] and resolved.global_profiler.tool == "npu"
    for role in (resolved.actor_rollout_ref.actor, resolved.actor_rollout_ref.ref):
        profiler = omega_conf_to_dataclass(role.profiler)
        assert (profiler.tool, profiler.enable, profiler.all_ranks) == ("npu", True, True)
        assert profiler.save_path == str(plan.run_dir / "profile")
        npu = omega_conf_to_dataclass(role.profiler.tool_config.npu)
        assert "npu" in npu.contents and npu.analysis is True  # NPU kernels, parsed into ascend_pytorch_profiler_*.db
    gpu_cfg = config.compose("qwen3-4b-gsm8k-grpo", "h20", f"verlflow.output_dir={tmp_path} verlflow.profile_steps=[2]",
                             extra={"data.train_files": "t.parquet", "data.val_files": "v.parquet"})
    gpu = build_plan(gpu_cfg, run_id="1" * 32, experiment_name="e", run_name="r", tracking_uri="sqlite:///m.db")
    assert not any("tool_config.npu" in key for key in gpu.overrides)


def test_the_recorded_database_is_summarised_like_a_trace():
    rows = {(r["kind"], r["name"]): (r["time_ms"], r["calls"]) for r in ascend_profile.summarize_db(DB)}
    # device kernels: each compute task's device time, summed by kernel name
    for name, total_ns, calls in _query(
            "SELECT s.value, SUM(t.endNs - t.startNs), COUNT(*) FROM TASK t JOIN COMPUTE_TASK_INFO c "
            "ON c.globalTaskId = t.globalTaskId JOIN STRING_IDS s ON s.id = c.name GROUP BY s.value "
            "ORDER BY 2 DESC LIMIT 5"):
        assert rows[("kernel", name)] == (pytest.approx(total_ns / 1e6, abs=1e-3), calls)
    # torch's step mark is an annotation, not the operator that holds every other one
    [(start, end)] = _query("SELECT a.startNs, a.endNs FROM PYTORCH_API a JOIN STRING_IDS s ON s.id = a.name "
                            "WHERE s.value = 'ProfilerStep#50'")
    assert rows[("annotation", "ProfilerStep#50")] == (pytest.approx((int(end) - int(start)) / 1e6, abs=1e-3), 1)
    # operators at the top of their thread only: a nested aten::item inside the forward is not counted twice
    operators = {name: ms for (kind, name), (ms, _) in rows.items() if kind == "operator"}
    assert "DistributedDataParallel.forward" in operators and "ProfilerStep#50" not in operators
    assert sum(operators.values()) <= (int(end) - int(start)) / 1e6 * 3  # three threads recorded operators


def test_verls_stage_ranges_become_the_phases(tmp_path):
    copy = tmp_path / "ascend_pytorch_profiler_0.db"
    shutil.copy(DB, copy)
    with sqlite3.connect(copy) as db:  # verl's npu tool marks each stage with an mstx range (msprof_tx=True)
        db.execute("INSERT INTO STRING_IDS (id, value) VALUES (900001, 'actor_update'), (900002, 'FSDP::forward')")
        db.execute("INSERT INTO PYTORCH_API (startNs, endNs, globalTid, name, type) VALUES "
                   "('1000000000', '1250000000', 1, 900001, 50004), ('2000000000', '2100000000', 1, 900002, 50004)")
    rows = {(r["kind"], r["name"]): (r["time_ms"], r["calls"]) for r in ascend_profile.summarize_db(copy)}
    assert rows[("phase", "update_actor")] == (250.0, 1)  # named as verl's timer, timing_s/update_actor
    assert rows[("annotation", "FSDP::forward")] == (100.0, 1)


def _collection(root: Path, role: str, worker: str, stamp: str, rank: int) -> Path:
    run = root / role / f"{worker}_{stamp}_ascend_pt"
    (run / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    shutil.copy(DB, run / "ASCEND_PROFILER_OUTPUT" / f"ascend_pytorch_profiler_{rank}.db")
    shutil.copy(RECORDED / "profiler_info_0.json", run / f"profiler_info_{rank}.json")
    (run / "FRAMEWORK").mkdir()
    (run / "FRAMEWORK" / "raw.bin").write_bytes(b"raw data stays on the node")
    return run


def test_collections_are_logged_per_step_and_rank_without_collisions(tmp_path, tracking_uri):
    # verl's layout: <save_path>/<role>/<host>_<pid>_<timestamp>_ascend_pt, one per process and profiled step
    root = tmp_path / "profile"
    _collection(root, "train", "node1_111", "20250109151748123", 0)
    _collection(root, "train", "node1_222", "20250109151748456", 1)
    _collection(root, "train", "node1_111", "20250109152030001", 0)
    _collection(root, "train", "node1_222", "20250109152030002", 1)
    with mlflow.start_run() as run:
        assert profiling.log_profile_folder(root, steps=[5, 2]) == [2, 5]
    summaries = profiling.read_step_summaries(run.info.run_id)
    one = {(r["kind"], r["name"]): r["time_ms"] for r in ascend_profile.summarize_db(DB)}
    both = {(r["kind"], r["name"]): r["time_ms"] for r in summaries[5]}
    assert both[("annotation", "ProfilerStep#50")] == pytest.approx(2 * one[("annotation", "ProfilerStep#50")])
    client = mlflow.MlflowClient()
    step2 = {f.path for f in client.list_artifacts(run.info.run_id, "profile/step_2/train")}
    assert step2 == {"profile/step_2/train/node1_111_20250109151748123_ascend_pt",
                     "profile/step_2/train/node1_222_20250109151748456_ascend_pt"}
    rank1 = client.list_artifacts(run.info.run_id,
                                  "profile/step_2/train/node1_222_20250109151748456_ascend_pt/ASCEND_PROFILER_OUTPUT")
    assert [f.path.rsplit("/", 1)[1] for f in rank1] == ["ascend_pytorch_profiler_1.db"]
    assert not client.list_artifacts(run.info.run_id, "profile/step_2/train/node1_111_20250109151748123_ascend_pt"
                                                      "/FRAMEWORK")


def test_compare_shows_the_kernels_of_an_ascend_run_beside_a_gpu_trace():
    npu = ascend_profile.summarize_db(DB)
    gpu = [{"kind": "kernel", "name": "ampere_bf16_gemm", "time_ms": 1.5, "calls": 3},
           {"kind": "operator", "name": "aten::item", "time_ms": 70.0, "calls": 5}]
    section = profiles.render_section({2: gpu}, {2: npu})
    assert "The device kernels that differ most" in section
    assert "| `[Notify Wait]` | - |" in section and "| `ampere_bf16_gemm` | 1.5 | - |" in section
