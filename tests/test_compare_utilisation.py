"""`compare` §6.4: utilisation, memory and power of two runs whose system metrics were really sampled.

Each run is a train-shaped run (timings, device tags) during which verlflow's system-metrics recording
ran for about a second — MLflow's own monitors plus the NPU monitor reading a fake ``npu-smi`` that
replays a recorded 910B (baseline, 8 NPUs) or A3 (candidate, 16 chips) table — into a real SQLite store.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import mlflow
import pytest
from conftest import isolated_store, wait_until
from mlflow.tracking import MlflowClient

from verlflow.compare.comparison import compare_runs
from verlflow.device import system_metrics
from verlflow.device.parsers import parse_npu_smi_info
from verlflow.tracking import tracking

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "device"
A2_WIDE = FIXTURES / "npu-smi-info-910b3-8npu-v26.1.0-wide.txt"
A3_16 = FIXTURES / "npu-smi-info-a3-16chip.txt"


def train_shaped_run(name: str, device_tags: dict[str, str], step_s: float, npu_smi: Path | None) -> str:
    """A run with per-step timings and summaries; system metrics sampled while it 'trains' (if npu_smi)."""
    tags = {**tracking.standard_tags(backend="verl", recipe="qwen3-4b-gsm8k-grpo", profile="a3"),
            "verlflow.step": "train", **device_tags}
    started = time.time()
    with tracking.tracked_run(run_name=name, tags=tags) as run:
        if npu_smi is not None:
            os.environ["FAKE_NPU_SMI_INFO"] = str(npu_smi)
            with system_metrics.recording(run.info.run_id, interval=0.2, device="npu"):
                wait_until(lambda: {"system/npu_0_power_watts", "system/cpu_utilization_percentage"}
                           <= set(MlflowClient().get_run(run.info.run_id).data.metrics), 120,
                           "the NPU and CPU samples of the run")
        for step in (1, 2):
            tracking.log_metrics({"timing_s/step": step_s, "critic/score/mean": 0.1 * step}, step=step)
        tracking.log_run_summaries(run.info.run_id, started)
    return run.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("utilisation")
    with isolated_store(root), pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{Path(__file__).resolve().parent / 'fakes'}:{os.environ['PATH']}")
        mp.setenv("FAKE_NPU_SMI_INFO", str(A2_WIDE))
        runs = {
            "h": train_shaped_run("a2-run", {"device.type": "npu", "device.name": "Ascend910B3"}, 20.0, A2_WIDE),
            "a": train_shaped_run("a3-run", {"device.type": "npu", "device.name": "Ascend910_9392"}, 30.0, A3_16),
            "none": train_shaped_run("old-run", {"device.type": "npu"}, 25.0, None),
        }
        yield root, runs


def expected(recording: Path) -> dict[str, float]:
    chips = parse_npu_smi_info(recording.read_text())
    return {
        "count": len(chips),
        "mem_mb": sum(c.hbm_used_mb for c in chips) / len(chips),
        "mem_peak": max(c.hbm_used_mb for c in chips),
        "power": sum(c.power_w for c in chips if c.power_w is not None),
    }


def row(report: str, label: str, stat: str) -> list[str]:
    line = next(ln for ln in report.splitlines() if ln.startswith(f"| {label} | {stat} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_utilisation_table_from_both_runs_system_metrics(store, capsys):
    root, runs = store
    result = compare_runs(runs["h"], runs["a"], str(root / "out"))
    report = result.report
    assert "## 6.4 Utilisation" in report
    a2, a3 = expected(A2_WIDE), expected(A3_16)
    assert f"baseline (npu × {a2['count']})" in report and f"candidate (npu × {a3['count']})" in report
    # the recorded tables are constant over the samples: mean over devices = the tables' own mean
    _, _, base, cand, ratio = row(report, "device memory used (MB)", "mean")
    assert (float(base.replace(",", "")), float(cand.replace(",", ""))) == pytest.approx((a2["mem_mb"], a3["mem_mb"]),
                                                                                         abs=0.1)
    assert ratio == f"{a3['mem_mb'] / a2['mem_mb']:.2f}×"
    assert float(row(report, "device memory used (MB)", "peak")[3].replace(",", "")) == a3["mem_peak"]
    # power: the node's draw (sum over devices; an A3 card reports on its first chip only)
    _, _, base, cand, _ = row(report, "device power, all devices (W)", "mean")
    assert (float(base.replace(",", "")), float(cand.replace(",", ""))) == pytest.approx((a2["power"], a3["power"]),
                                                                                         abs=0.1)
    assert row(report, "host CPU utilisation (%)", "mean")[2] != "-"  # MLflow's CPU monitor ran too
    assert (root / "out" / "utilisation.png").stat().st_size > 10_000
    artifacts = {a.path for a in MlflowClient().list_artifacts(result.run_id, "compare")}
    assert "compare/utilisation.png" in artifacts


def test_compare_links_mlflows_compare_runs_page_for_the_two_runs(store, capsys):
    _, runs = store
    result = compare_runs(runs["h"], runs["a"])
    printed = capsys.readouterr().out
    link = MlflowClient().get_run(result.run_id).data.tags["compare.mlflow_compare_runs"]
    assert runs["h"] in link and runs["a"] in link and "#/compare-runs?runs=" in link
    assert link.startswith(f"mlflow ui --backend-store-uri '{mlflow.get_tracking_uri()}'")  # a SQLite store
    assert f"MLflow compare-runs page: {link}" in printed and link in result.report


def test_a_run_without_system_metrics_gets_a_note_instead_of_the_table(store):
    _, runs = store
    report = compare_runs(runs["h"], runs["none"]).report
    assert "## 6.4 Utilisation" in report
    assert "Not shown: the candidate run logged no system metrics" in report
    assert "device utilisation (%)" not in report


def run_with_system_metrics(name: str, samples: dict[str, list[float]]) -> str:
    """A train-shaped run whose ``system/*`` metrics are ``samples`` (key → value per step), as samplers log them."""
    tags = {**tracking.standard_tags(backend="verl", recipe="qwen3-4b-gsm8k-grpo", profile="h20"),
            "verlflow.step": "train", "device.type": "gpu"}
    started = time.time()
    with tracking.tracked_run(run_name=name, tags=tags, log_system_metrics=False) as run:
        for key, values in samples.items():
            for step, value in enumerate(values):
                mlflow.log_metric(key, value, step=step)
        for step in (1, 2):
            tracking.log_metrics({"timing_s/step": 10.0, "critic/score/mean": 0.1 * step}, step=step)
        tracking.log_run_summaries(run.info.run_id, started)
    return run.info.run_id


def test_a_multi_node_run_is_aggregated_across_its_nodes_with_a_row_per_node(tracking_uri):
    # Two nodes sampled under MLflow node ids (node A busier than node B), plus the unscoped metrics of the
    # machine verlflow ran on, which the node samplers already cover and which must not count twice.
    two_nodes = run_with_system_metrics("two-nodes", {
        "system/10.0.0.1_aaaaaaaa/gpu_0_utilization_percentage": [80.0, 100.0],
        "system/10.0.0.1_aaaaaaaa/gpu_0_power_usage_watts": [300.0, 300.0],
        "system/10.0.0.1_aaaaaaaa/cpu_utilization_percentage": [50.0, 50.0],
        "system/10.0.0.2_bbbbbbbb/gpu_0_utilization_percentage": [20.0, 40.0],
        "system/10.0.0.2_bbbbbbbb/gpu_0_power_usage_watts": [100.0, 100.0],
        "system/10.0.0.2_bbbbbbbb/cpu_utilization_percentage": [10.0, 10.0],
        "system/cpu_utilization_percentage": [99.0, 99.0],
    })
    one_node = run_with_system_metrics("one-node", {
        "system/gpu_0_utilization_percentage": [60.0, 60.0],
        "system/gpu_0_power_usage_watts": [200.0, 200.0],
        "system/cpu_utilization_percentage": [30.0, 30.0],
    })
    report = compare_runs(two_nodes, one_node).report
    assert "baseline (gpu × 2 on 2 nodes)" in report and "candidate (gpu × 1)" in report
    assert row(report, "device utilisation (%)", "mean")[2:4] == ["60.0", "60.0"]  # mean of 90 and 30 across nodes
    assert row(report, "device utilisation (%)", "peak")[2] == "100.0"
    assert row(report, "device power, all devices (W)", "mean")[2] == "400.0"  # the cluster's draw
    assert row(report, "host CPU utilisation (%)", "mean")[2] == "30.0"  # mean across nodes; 99 is not read
    per_node = {cells[1]: cells for ln in report.splitlines()
                if ln.startswith("| baseline | 10.0.0.") and (cells := [c.strip() for c in ln.strip("|").split("|")])}
    assert set(per_node) == {"10.0.0.1_aaaaaaaa", "10.0.0.2_bbbbbbbb"}
    assert per_node["10.0.0.1_aaaaaaaa"][2] == "90.0" and per_node["10.0.0.2_bbbbbbbb"][2] == "30.0"
    assert not [ln for ln in report.splitlines() if ln.startswith("| candidate | ")]  # one node: no per-node rows
