"""The hardware a run carries is the machine's: `auto` picks the record that fits what npu-smi / nvidia-smi list
(the SKU's own peak included), a profile of another accelerator is refused before any run opens unless the user
accepts it, the run tags detected and profile identity side by side, a run without a record is known by its
``device.name``, and two records of one accelerator are one device to ``compare``.

The machines are the recorded listings of tests/fixtures/device (see its README), replayed in-process through
``Probe.recorded`` or, for the command line, by tests/fakes/nvidia-smi and tests/fakes/npu-smi on PATH.
"""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pytest
from conftest import CliResult, cli_in_process, fresh_store
from mlflow.tracking import MlflowClient

from verlflow import config
from verlflow.backends.train_setup import choose_train_setup, compose_train_config
from verlflow.compare.efficiency import hardware_of
from verlflow.compare.snapshot import RunSnapshot
from verlflow.device.detect import NPU_SMI_INFO, NVIDIA_SMI_QUERY, Probe, collect_device_profile
from verlflow.device.identity import record_from_name, same_accelerator
from verlflow.errors import VerlflowError
from verlflow.platforms import Device

TESTS = Path(__file__).parent
DEVICE = TESTS / "fixtures" / "device"
FAKES = TESTS / "fakes"
GUIDE = "qwen3-4b-gsm8k-grpo"
RECORDINGS = {
    "H100x8": (Device.GPU, "nvidia-smi-query-h100x8.csv.txt"),
    "H200x8": (Device.GPU, "nvidia-smi-query-h200x8.csv.txt"),
    "H20x8": (Device.GPU, "nvidia-smi-query-h20x8.csv.txt"),
    "910B2x8": (Device.NPU, "npu-smi-info-910b2-8npu.txt"),
    "910B3x8": (Device.NPU, "npu-smi-info-910b3-8npu-v25.2.0.txt"),
    "910B4x1": (Device.NPU, "npu-smi-info-910b4-v26.0.rc1-wide.txt"),
    "A3x16": (Device.NPU, "npu-smi-info-a3-16chip.txt"),
}


def machine(recording: str) -> Probe:
    """A machine whose listing tool prints the recording (torch_npu installed, a CUDA torch)."""
    dev, sample = RECORDINGS[recording]
    command = NPU_SMI_INFO if dev is Device.NPU else NVIDIA_SMI_QUERY
    return Probe.recorded({" ".join(command): (DEVICE / sample).read_text()}, modules=["torch_npu"],
                          torch_cuda="12.6")


def composed(recording: str, profile: str = "auto", overrides: str = ""):
    """What ``train --device <dev> --profile <profile>`` composes on the recorded machine."""
    dev = RECORDINGS[recording][0]
    _, _, chosen, _ = choose_train_setup(GUIDE, dev, profile, "auto", probe=machine(recording))
    return compose_train_config(GUIDE, chosen, "data", "", overrides, check_counts=False, probe=machine(recording))


@pytest.mark.parametrize(("recording", "profile", "model", "peak", "memory", "hbm"), [
    ("H100x8", "h100", "NVIDIA H100 SXM5 80GB", 989, 80, 3350),
    ("H200x8", "h200", "NVIDIA H200 SXM 141GB", 989, 141, 4800),
    ("H20x8", "h20", "NVIDIA H20 96GB HBM3", 148, 96, 4000),
    ("910B2x8", "a2", "Ascend 910B2", 354, 64, 1600),
    ("910B3x8", "a2", "Ascend 910B3", 313, 64, 1600),
    ("910B4x1", "a2", "Ascend 910B4", 245, 32, 800),
    ("A3x16", "a3", "Ascend 910C", 376, 64, 1600),
])
def test_auto_picks_the_record_the_listed_accelerator_fits_with_the_skus_own_figures(
        recording, profile, model, peak, memory, hbm):
    one_chip = "trainer.n_gpus_per_node=1" if recording == "910B4x1" else ""  # a node of 8 listing 1 is refused
    cfg = composed(recording, overrides=one_chip)
    record = cfg.profile.accelerator
    assert cfg.profile.name == profile
    assert (record.model, record.peak_tflops, record.memory_gb, record.hbm_gbps) == (model, peak, memory, hbm)
    assert record.skus == []  # the run carries one SKU's figures, not the family's list


def test_the_910b_skus_get_different_peaks_each_with_its_source():
    a2 = config.load_profile("a2").accelerator
    peaks = {sku: a2.for_listed(f"Ascend{sku} (A2)") for sku in ("910B1", "910B2", "910B2C", "910B3", "910B4")}
    assert [peaks[s].peak_tflops for s in peaks] == [414, 354, 354, 313, 245]
    assert len({peaks[s].peak_source for s in ("910B1", "910B2", "910B3", "910B4")}) == 4
    a3 = config.load_profile("a3").accelerator
    assert "CloudMatrix384" in a3.peak_source and "press" not in a3.peak_source


def test_an_explicit_profile_of_another_accelerator_is_refused_naming_both_and_the_one_that_fits():
    with pytest.raises(VerlflowError) as refused:
        composed("H100x8", "h20")
    assert str(refused.value) == (
        "profile 'h20' describes H20 (NVIDIA H20 96GB HBM3) but this node has 8 × NVIDIA H100 80GB HBM3: the h100 "
        "profile fits it (-P profile=h100); to run the h20 record here anyway pass "
        "-P overrides=\"verlflow.accept_other_hardware=true\" (its figures then describe another machine)")


def test_the_preflights_count_fix_on_a_910b2_node_no_longer_keeps_the_a3_record():
    # The verl preflight's hint for too few devices is trainer.n_gpus_per_node=<visible>: on a 910B2 x 8 node under
    # the a3 profile that would run with the A3's record (2 dies per chip: 4 "chips", the A3's peak). Train refuses
    # it as doctor does, naming the a2 profile.
    with pytest.raises(VerlflowError, match=r"profile 'a3' describes A3 \(Ascend 910C\) but this node has "
                                            r"8 × Ascend910B2 \(A2\): the a2 profile fits it \(-P profile=a2\)"):
        composed("910B2x8", "a3", "trainer.n_gpus_per_node=8")
    fitted = composed("910B2x8", "a2", "trainer.n_gpus_per_node=8")
    assert (fitted.profile.accelerator.dies_per_chip, fitted.profile.accelerator.peak_tflops) == (1, 354)


def test_an_accepted_mismatch_runs_and_says_so_beside_the_detected_identity():
    cfg = composed("H100x8", "h20", "verlflow.accept_other_hardware=true")
    assert cfg.profile.accelerator.name == "H20"
    tags = collect_device_profile(Device.GPU, probe=machine("H100x8"), environ={}, profile=cfg.profile).to_tags()
    assert {k: tags[k] for k in ("device.detected", "device.detected_profile", "device.record", "device.record_fits",
                                 "device.peak_tflops")} == {
        "device.detected": "NVIDIA H100 80GB HBM3", "device.detected_profile": "h100", "device.record": "H20",
        "device.record_fits": "false", "device.peak_tflops": "148 bf16"}


def test_a_machine_that_lists_nothing_keeps_the_device_default_and_refuses_nothing():
    laptop = Probe.recorded({})
    assert choose_train_setup(GUIDE, "gpu", "auto", "auto", probe=laptop)[2] == "h20"
    cfg = compose_train_config(GUIDE, "h20", "data", "", "", check_counts=False, probe=laptop)
    assert cfg.profile.accelerator.name == "H20"


# -- the command line, on the recorded H100 x 8 (tests/fakes/nvidia-smi) ------------------------------------------

def _train(root: Path, uri: str, profile: str, *extra: str) -> CliResult:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "MLFLOW_RUN_ID"))},
           "PATH": f"{FAKES}:{os.environ['PATH']}", "MLFLOW_TRACKING_URI": uri,
           "FAKE_NVIDIA_SMI_QUERY": str(DEVICE / RECORDINGS["H100x8"][1])}
    return cli_in_process(["train", "--device", "gpu", "--profile", profile, "--dry_run", "true",
                           "--data_dir", str(root / "data"), *extra],
                          env=env, cwd=root)


def test_profile_h20_on_the_h100_recording_is_one_line_and_leaves_no_run(tmp_path):
    uri = fresh_store(tmp_path)
    done = _train(tmp_path, uri, "h20")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "profile 'h20' describes H20" in lines[0] and "8 × NVIDIA H100 80GB HBM3" in lines[0]
    assert "-P profile=h100" in lines[0]
    client = MlflowClient(uri)
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


@pytest.mark.slow
def test_auto_on_the_h100_recording_tags_the_h100_record_beside_what_was_detected(tmp_path):
    from verlflow.data import gsm8k

    gsm8k.preprocess("synthetic", str(tmp_path / "data"), 8)
    uri = fresh_store(tmp_path)
    done = _train(tmp_path, uri, "auto")
    assert done.returncode == 0, done.stderr[-2000:]
    client = MlflowClient(uri)
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    tags = run.data.tags
    assert {k: tags[k] for k in ("verlflow.profile", "device.name", "device.detected", "device.detected_profile",
                                 "device.record", "device.record_fits", "device.peak_tflops", "device.hbm_gbps")} == {
        "verlflow.profile": "h100", "device.name": "NVIDIA H100 80GB HBM3",
        "device.detected": "NVIDIA H100 80GB HBM3", "device.detected_profile": "h100", "device.record": "H100",
        "device.record_fits": "true", "device.peak_tflops": "989 bf16", "device.hbm_gbps": "3350"}


# -- runs as compare reads them -------------------------------------------------------------------------------------

def _snapshot(tags: dict[str, str], per_node: int) -> RunSnapshot:
    return RunSnapshot(role="candidate", run_id="r", name="r", status="FINISHED", tags=tags,
                       params={"trainer/n_gpus_per_node": str(per_node), "trainer/nnodes": "1"}, metrics={})


def test_an_a3_run_without_a_record_is_an_a3_by_its_device_name():
    record = record_from_name("npu", "Ascend910_9392")
    assert (record.name, record.dies_per_chip, record.peak_tflops) == ("A3", 2, 376)
    assert record_from_name("npu", "Ascend910").name == "A3"  # npu-smi's table name when the board query fails
    assert record_from_name("npu", "Ascend910B2").peak_tflops == 354
    assert record_from_name("cpu", "Intel Xeon") is None and record_from_name("gpu", "NVIDIA A100-SXM4-80GB") is None
    # A run logged before records were tagged, whose profile file was another machine's: 16 devices, 8 chips.
    hardware = hardware_of(_snapshot({"device.type": "npu", "device.name": "Ascend910_9392",
                                      "verlflow.profile": "/elsewhere/our-a3.yaml"}, 16))
    assert (hardware.devices, hardware.chips, hardware.dies_per_chip, hardware.peak_tflops) == (16, 8, 2, 376)
    assert hardware.record == "the shipped A3 record its device.name fits"


def test_two_records_of_one_accelerator_are_one_device():
    cpu = {"device.type": "cpu", "device.name": "Intel Xeon Platinum 8480"}
    assert same_accelerator({**cpu, "verlflow.profile": "cpu"}, {**cpu, "verlflow.profile": "/tmp/cpu-b.yaml"})
    assert same_accelerator({"device.type": "npu", "device.name": "Ascend910_9392"},
                            {"device.type": "npu", "device.name": "Ascend910"})  # both A3
    assert not same_accelerator({"device.type": "npu", "device.name": "Ascend910B2"},
                                {"device.type": "npu", "device.name": "Ascend910B3"})  # two SKUs, two peaks
    assert not same_accelerator({"device.type": "gpu", "device.name": "NVIDIA H20"},
                                {"device.type": "npu", "device.name": "Ascend910_9392"})
    assert not same_accelerator({"device.type": "cpu"}, {"device.type": "cpu"})  # unknown: not claimed the same


def test_compare_of_two_profile_files_of_one_cpu_names_no_faster_device(tmp_path, monkeypatch):
    from test_compare_report import H20_TIMINGS, h20_curves, log_train_run

    from verlflow.compare.comparison import compare_runs

    uri = fresh_store(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    cpu = {"device.type": "cpu", "device.name": "Intel Xeon Platinum 8480", "device.count": "2"}
    slower = {k: [v * 2.61 for v in values] for k, values in H20_TIMINGS.items()}
    curves = {**h20_curves(), "perf/total_num_tokens": [4096.0] * 4}  # per-chip speed is measured
    try:
        base = log_train_run("cpu-a", recipe="smoke", profile="cpu", device_tags=cpu, timings=H20_TIMINGS,
                             curves=curves, e2e=50.0)
        cand = log_train_run("cpu-b", recipe="smoke", profile="cpu-verl", device_tags=cpu, timings=slower,
                             curves=curves, e2e=130.0)
        compare_runs(base, cand, str(tmp_path / "out"))
    finally:
        mlflow.set_tracking_uri(before)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "both sides ran on one accelerator (Intel Xeon Platinum 8480)" in report
    assert "is faster" not in report  # 2.61x slower on one machine: settings and noise, not a faster device
