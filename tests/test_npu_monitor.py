"""The NPU monitor reads a fake ``npu-smi`` on PATH that replays recorded outputs (tests/fixtures/device).

What is asserted is what a user sees in the MLflow UI: per-chip ``system/npu_<i>_*`` values equal to what
``npu-smi`` printed for that chip, only the chips ``ASCEND_RT_VISIBLE_DEVICES`` names, and a broken
``npu-smi`` that costs one warning and nothing else.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import mlflow
import pytest
from conftest import wait_until
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
from mlflow.tracking import MlflowClient

from verlflow import names
from verlflow.device import system_metrics
from verlflow.device.npu_monitor import MAX_FAILURES, NpuMonitor
from verlflow.tracking import system_metrics as bridge

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures" / "device"
A3_16 = FIXTURES / "npu-smi-info-a3-16chip.txt"
A2_OLD = FIXTURES / "npu-smi-info-910b2-8npu.txt"
A2_WIDE = FIXTURES / "npu-smi-info-910b3-8npu-v26.1.0-wide.txt"
A3_FRAGMENT = FIXTURES / "npu-smi-info-a3-v26.0.rc2-wide-FRAGMENTS.txt"
A2_AICORE_DASH = FIXTURES / "npu-smi-info-910b2-2npu-aicore-dash.txt"
USAGES = FIXTURES / "npu-smi-info-t-usages-i0-doc.txt"


@pytest.fixture
def fake_npu_smi(monkeypatch, tmp_path):
    """Put tests/fakes/npu-smi first on PATH; returns a function choosing the recording it replays."""
    monkeypatch.setenv("PATH", f"{TESTS / 'fakes'}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NPU_SMI_USAGES", str(USAGES))
    monkeypatch.setenv("FAKE_NPU_SMI_CALLS", str(tmp_path / "calls.txt"))
    monkeypatch.delenv("FAKE_NPU_SMI_FAIL", raising=False)

    def use(recording: Path) -> Path:
        monkeypatch.setenv("FAKE_NPU_SMI_INFO", str(recording))
        return tmp_path / "calls.txt"

    return use


def one_sample(visible: str | None = None) -> dict[str, float]:
    monitor = NpuMonitor(visible)
    monitor.collect_metrics()
    return monitor.aggregate_metrics()


def per_chip(sample: dict[str, float], i: int) -> dict[str, float]:
    prefix = f"npu_{i}_"
    return {k.removeprefix(prefix): v for k, v in sample.items() if k.startswith(prefix)}


def test_a3_sixteen_chips_each_with_its_own_figures(fake_npu_smi):
    fake_npu_smi(A3_16)
    sample = one_sample()
    assert sorted({int(k.split("_")[1]) for k in sample}) == list(range(16))
    # card 0, chip 0 (Phy-ID 0): 178.7 W, 37 C, AICore 0 %, HBM 3419 / 65536 MB
    assert per_chip(sample, 0) == {"utilization_percentage": 0.0, "hbm_usage_megabytes": 3419.0,
                                   "hbm_usage_percentage": 5.2, "power_watts": 178.7, "temperature_celsius": 37.0}
    # card 0, chip 1 (Phy-ID 1): npu-smi prints '-' for power on an A3 card's second chip: no power metric
    assert per_chip(sample, 1) == {"utilization_percentage": 0.0, "hbm_usage_megabytes": 3196.0,
                                   "hbm_usage_percentage": 4.9, "temperature_celsius": 36.0}
    # card 7, chips 0 and 1 (Phy-ID 14, 15)
    assert per_chip(sample, 14)["power_watts"] == 186.1 and per_chip(sample, 14)["hbm_usage_megabytes"] == 3418.0
    assert per_chip(sample, 15)["temperature_celsius"] == 38.0 and "power_watts" not in per_chip(sample, 15)


@pytest.mark.parametrize(("recording", "chip", "expected"), [
    # 98-character layout, npu-smi 23.0.7: 5-digit used memory swallows the space before '/'
    (A2_OLD, 0, {"hbm_usage_megabytes": 29954.0, "hbm_usage_percentage": 45.7, "power_watts": 96.5,
                 "temperature_celsius": 36.0, "utilization_percentage": 0.0}),
    (A2_OLD, 7, {"hbm_usage_megabytes": 3347.0, "hbm_usage_percentage": 5.1, "power_watts": 93.8,
                 "temperature_celsius": 37.0, "utilization_percentage": 0.0}),
    # 116-character layout, npu-smi 26.1.0
    (A2_WIDE, 0, {"hbm_usage_megabytes": 8676.0, "hbm_usage_percentage": 13.2, "power_watts": 100.0,
                  "temperature_celsius": 50.0, "utilization_percentage": 0.0}),
    (A2_WIDE, 1, {"hbm_usage_megabytes": 3403.0, "hbm_usage_percentage": 5.2, "power_watts": 94.8,
                  "temperature_celsius": 48.0, "utilization_percentage": 0.0}),
])
def test_910b_eight_npus_in_old_and_wide_layouts(fake_npu_smi, recording, chip, expected):
    fake_npu_smi(recording)
    sample = one_sample()
    assert sorted({int(k.split("_")[1]) for k in sample}) == list(range(8))
    assert per_chip(sample, chip) == expected


def test_a_fragment_gives_the_chips_it_shows_under_their_phy_ids(fake_npu_smi):
    fake_npu_smi(A3_FRAGMENT)
    sample = one_sample()
    assert sorted({int(k.split("_")[1]) for k in sample}) == [0, 1, 15]
    assert per_chip(sample, 15)["hbm_usage_megabytes"] == 31877.0 and per_chip(sample, 0)["power_watts"] == 162.6


def test_only_the_chips_ascend_rt_visible_devices_names_are_sampled(fake_npu_smi):
    fake_npu_smi(A3_16)
    sample = one_sample("2,3, 9")
    assert sorted({int(k.split("_")[1]) for k in sample}) == [2, 3, 9]


def test_usages_fill_in_only_what_the_table_lacks(fake_npu_smi):
    calls = fake_npu_smi(A2_AICORE_DASH)
    sample = one_sample()
    assert per_chip(sample, 1)["utilization_percentage"] == 0.0  # "Aicore Usage Rate(%)" of -t usages
    assert calls.read_text().splitlines() == ["info", "info -t usages -i 1 -c 0"]
    calls.unlink()
    fake_npu_smi(A3_16)
    one_sample()
    assert calls.read_text().splitlines() == ["info"]  # a complete table: one call per sample


def test_failing_npu_smi_stops_the_monitor_with_one_warning(fake_npu_smi, monkeypatch, caplog):
    fake_npu_smi(A2_OLD)
    monitor = NpuMonitor()
    monitor.collect_metrics()
    monkeypatch.setenv("FAKE_NPU_SMI_FAIL", "1")
    with caplog.at_level(logging.WARNING, logger="verlflow.device.npu_monitor"):
        for _ in range(MAX_FAILURES + 3):
            monitor.collect_metrics()  # never raises into MLflow's sampling thread
    assert monitor.stopped
    assert len([r for r in caplog.records if "npu-smi" in r.getMessage()]) == 1
    assert per_chip(monitor.aggregate_metrics(), 0)["power_watts"] == 96.5  # what it sampled before stays


@pytest.mark.parametrize("expected", [True, False])
def test_npu_smi_failing_at_start_means_no_npu_monitor_and_one_warning(fake_npu_smi, monkeypatch, caplog, expected):
    fake_npu_smi(A2_OLD)
    monkeypatch.setenv("FAKE_NPU_SMI_FAIL", "1")
    with caplog.at_level(logging.WARNING, logger="verlflow.device.npu_monitor"):
        assert NpuMonitor.start_or_none(expected=expected) is None
    assert [r.getMessage() for r in caplog.records] == [
        "NPU system metrics off for this run: npu-smi info exited with 1: "
        "@#%! dcmi model initialized failed, because the device is used. ret is -8020"
    ]


def test_missing_npu_smi_is_silent_unless_the_profile_expects_npus(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="verlflow.device.npu_monitor"):
        assert NpuMonitor.start_or_none(expected=False) is None
        assert caplog.records == []
        assert NpuMonitor.start_or_none(expected=True) is None
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["NPU system metrics off for this run: npu-smi not found on PATH"]


def test_the_npu_monitor_publishes_through_mlflows_own_system_metrics_monitor(fake_npu_smi, tracking_uri):
    fake_npu_smi(A2_WIDE)
    with mlflow.start_run() as run:
        with system_metrics.recording(run.info.run_id, interval=0.2, device="npu") as monitor:
            assert isinstance(monitor, SystemMetricsMonitor)
            assert bridge.monitor_names(monitor)[-1] == "npu"
            wait_until(lambda: len(MlflowClient().get_metric_history(run.info.run_id, "system/npu_0_power_watts")) >= 2
                       and _logged(run.info.run_id, "system/cpu_utilization_percentage"),
                       120, "two NPU samples and MLflow's CPU sample")
    data = MlflowClient().get_run(run.info.run_id).data
    assert data.metrics["system/npu_0_hbm_usage_megabytes"] == 8676.0
    assert data.metrics["system/npu_7_power_watts"] > 0
    assert "system/cpu_utilization_percentage" in data.metrics  # MLflow's own monitors ran alongside
    assert data.tags[names.SYSTEM_METRICS_INTERVAL_TAG] == "0.2"
    assert len(MlflowClient().get_metric_history(run.info.run_id, "system/npu_0_power_watts")) >= 2


@pytest.mark.parametrize(("value", "expected"), [(None, 10.0), (1, 1.0), ("2.5", 2.5), (0, None)])
def test_sampling_interval_comes_from_the_recipe_key(value, expected):
    own = {} if value is None else {"system_metrics_interval": value}
    assert system_metrics.sampling_interval(own) == expected


@pytest.mark.parametrize("value", [-1, "often", True])
def test_a_bad_sampling_interval_is_one_clear_line(value):
    from verlflow.errors import VerlflowError

    with pytest.raises(VerlflowError, match=r"verlflow.system_metrics_interval must be seconds >= 0"):
        system_metrics.sampling_interval({"system_metrics_interval": value})


def test_npu_smi_failing_at_start_leaves_mlflows_monitors_and_the_run_alone(fake_npu_smi, monkeypatch, tracking_uri,
                                                                           caplog):
    from verlflow.tracking import tracking

    fake_npu_smi(A2_OLD)
    monkeypatch.setenv("FAKE_NPU_SMI_FAIL", "1")
    with caplog.at_level(logging.WARNING):
        with tracking.tracked_run() as run:
            with system_metrics.recording(run.info.run_id, interval=0.2, device="npu") as monitor:
                assert "npu" not in bridge.monitor_names(monitor)
                wait_until(lambda: _logged(run.info.run_id, "system/cpu_utilization_percentage"), 120,
                           "MLflow's CPU sample")
    finished = MlflowClient().get_run(run.info.run_id)
    assert finished.info.status == "FINISHED"
    assert "system/cpu_utilization_percentage" in finished.data.metrics
    assert not any(k.startswith("system/npu_") for k in finished.data.metrics)
    assert len([r for r in caplog.records if r.name.startswith("verlflow")]) == 1


def _logged(run_id: str, key: str) -> bool:
    """Whether ``run_id`` has a value for ``key`` in the store yet."""
    return key in MlflowClient().get_run(run_id).data.metrics
