"""A real train step of the tiny recipe records system metrics for its whole run, NPUs included.

The train step runs in this process (as ``verlflow train`` does) on the local trainer, with a fake
``npu-smi`` on PATH that replays a recorded A3 table, and samples every second
(``verlflow.system_metrics_interval=1``). A failing ``npu-smi`` costs one warning, never the run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from verlflow.data import gsm8k
from verlflow.step_requests import TrainRequest
from verlflow.steps.train import run_train
from verlflow.tracking import naming as run_names

TESTS = Path(__file__).resolve().parent
A3_16 = TESTS / "fixtures" / "device" / "npu-smi-info-a3-16chip.txt"
FAST_SAMPLING = "verlflow.system_metrics_interval=1"
# The 9 npu-smi calls (start check, 5 good and 3 failed samples) take ~1 s at 0.1 s; 60 steps take 5 s or more
# (5 s on the fastest host seen). At 0.5 s the calls needed 4.5 s, and a fast host ended the run first.
LONG_FAST_SAMPLED = "verlflow.system_metrics_interval=0.1 trainer.total_training_steps=60 trainer.test_freq=-1"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sysmetrics-train")
    gsm8k.preprocess("synthetic", root / "data", 64, log_to_mlflow=False)
    return root


@pytest.fixture
def fake_npu_smi(monkeypatch, data_dir, tmp_path, tracking_uri, tiny_workdir):
    monkeypatch.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))  # the model built once per session
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{TESTS / 'fakes'}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NPU_SMI_INFO", str(A3_16))
    monkeypatch.delenv("FAKE_NPU_SMI_FAIL", raising=False)
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)
    return monkeypatch


def train(data_dir: Path, overrides: str = FAST_SAMPLING):
    """The train step as `verlflow train --device cpu --backend local --overrides ...` runs it."""
    return run_train(TrainRequest("tiny", "cpu", "cpu", str(data_dir / "data"), "", overrides, "local", False, ""))


def warnings_about_system_metrics(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("verlflow.device.")]


@pytest.mark.slow
def test_a_smoke_train_run_ends_with_npu_and_cpu_system_metrics_and_outlives_a_failing_npu_smi(
        fake_npu_smi, data_dir, tmp_path, caplog):
    # npu-smi answers its first 6 calls (the start check and 5 samples), then exits 1 with garbage,
    # as a driver that stops answering mid-run does
    fake_npu_smi.setenv("FAKE_NPU_SMI_CALLS", str(tmp_path / "calls.txt"))
    fake_npu_smi.setenv("FAKE_NPU_SMI_FAIL_AFTER", "6")
    with caplog.at_level(logging.WARNING):
        result = train(data_dir, LONG_FAST_SAMPLED)
    client = MlflowClient()
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    warned = warnings_about_system_metrics(caplog)
    assert len(warned) == 1 and "NPU system metrics stopped after 3 failed samples" in warned[0]
    # a stopped monitor calls npu-smi no more: the start check, 5 good and 3 failed samples
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 9

    metrics = run.data.metrics
    # every chip of the recorded A3 table, under MLflow's GPU naming, with the table's values
    for i in range(16):
        assert metrics[f"system/npu_{i}_hbm_usage_megabytes"] > 3000
        assert f"system/npu_{i}_utilization_percentage" in metrics
    assert metrics["system/npu_0_power_watts"] == 178.7 and metrics["system/npu_15_temperature_celsius"] == 38.0
    assert metrics["system/npu_0_hbm_usage_megabytes"] == 3419.0 and "system/npu_1_power_watts" not in metrics
    # MLflow's own monitors, sampled alongside for the whole run, also after the NPU monitor stopped
    assert "system/cpu_utilization_percentage" in metrics and "system/system_memory_usage_megabytes" in metrics
    cpu = client.get_metric_history(result.run_id, "system/cpu_utilization_percentage")
    npu = client.get_metric_history(result.run_id, "system/npu_0_power_watts")
    assert len(npu) == 5 and len(cpu) > len(npu)
    assert all(run.info.start_time <= m.timestamp <= run.info.end_time for m in cpu)
    assert run.data.tags["verlflow.system_metrics_interval_s"] == "0.1"
    assert run.data.tags["verlflow.system_metrics"].endswith(",npu")
    # named for the UI: [overrides ·] recipe · profile, and the step tag every step's run carries
    assert run.info.run_name.endswith("tiny · cpu") and run.data.tags["verlflow.step"] == "train"


def test_a_name_the_user_gave_is_kept_and_a_generated_one_replaced(tracking_uri):
    client = MlflowClient()
    experiment = client.get_experiment_by_name("Default").experiment_id
    named = client.create_run(experiment, run_name="h20 baseline, lr 1e-6").info.run_id
    unnamed = client.create_run(experiment).info.run_id  # MLflow makes a name up, as `mlflow run` does
    assert run_names.name_train_run(named, "qwen3-4b-gsm8k-grpo", "h20") == "h20 baseline, lr 1e-6"
    name = run_names.name_train_run(unnamed, "qwen3-4b-gsm8k-grpo", "a3")
    assert client.get_run(unnamed).info.run_name == name == "qwen3-4b-gsm8k-grpo · a3"


def test_compare_runs_link_points_at_the_tracking_server_or_says_how_to_open_it():
    link = run_names.compare_runs_link("http://mlflow.example:5000/", ["3", "3"], ["r1", "r2"])
    assert link == ("http://mlflow.example:5000/#/compare-runs?runs=%5B%22r1%22%2C%22r2%22%5D"
                    "&experiments=%5B%223%22%5D&workflowType=machine_learning")
    local = run_names.compare_runs_link("sqlite:///mlflow.db", ["0"], ["r1", "r2"])
    assert local.startswith("mlflow ui --backend-store-uri 'sqlite:///mlflow.db', then open /#/compare-runs?")
    assert local.endswith("on the address it prints") and "5000" not in local
