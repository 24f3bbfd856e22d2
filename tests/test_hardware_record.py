"""A node is two YAML files: a profile with its hardware record (``accelerator:``, ``stack:``) and a stack.

Doctor, the dry run's device tags and ``compare`` read the record; nothing is keyed by device in code. Shown on
every shipped accelerator profile against a recorded node (npu-smi / nvidia-smi output, tests/fixtures/device),
and on two made-up nodes whose profile and stack exist only under tests/fixtures/hardware.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import CliResult, cli_in_process, fresh_store
from mlflow.tracking import MlflowClient

from verlflow import config
from verlflow.device.detect import NPU_SMI_INFO, NVIDIA_SMI_QUERY, Probe, collect_device_profile
from verlflow.device.doctor import diagnose, fitting_profiles, node_label
from verlflow.device.stacks import list_stacks, load_stack
from verlflow.errors import VerlflowError
from verlflow.platforms import Device

TESTS = Path(__file__).parent
DEVICE = TESTS / "fixtures" / "device"
HARDWARE = TESTS / "fixtures" / "hardware"
FAKES = TESTS / "fakes"

# Each shipped accelerator profile, and the recorded node it describes.
NODES = {
    "a3": (Device.NPU, "npu-smi-info-a3-16chip.txt", 16, "Ascend910 (A3)"),  # no board query: no SKU
    "a2": (Device.NPU, "npu-smi-info-910b3-8npu-v25.2.0.txt", 8, "Ascend910B3 (A2)"),
    "h20": (Device.GPU, "nvidia-smi-query-h20x8.csv.txt", 8, "NVIDIA H20"),
    "h100": (Device.GPU, "nvidia-smi-query-h100x8.csv.txt", 8, "NVIDIA H100 80GB HBM3"),
    "h200": (Device.GPU, "nvidia-smi-query-h200x8.csv.txt", 8, "NVIDIA H200"),
}


def _probe(dev: Device, sample: Path) -> Probe:
    command = NPU_SMI_INFO if dev is Device.NPU else NVIDIA_SMI_QUERY
    return Probe.recorded({" ".join(command): sample.read_text()}, modules=["torch_npu"], torch_cuda="12.6")


def _rows(dev: Device, profile: str, sample: Path) -> dict:
    rows = diagnose(dev, profile, probe=_probe(dev, sample), environ={}, versions={}, check_import=lambda *_: None)
    return {r.item: r for r in rows}


def test_every_shipped_accelerator_profile_carries_a_consistent_record_and_a_stack():
    names = config.list_profiles()
    assert {"a2", "a3", "h20", "h100", "h200", "cpu", "cpu-verl"} <= set(names)
    for name in names:
        profile = config.load_profile(name)
        if profile.device is Device.CPU:
            assert profile.accelerator is None and profile.stack == ""
            continue
        record = profile.accelerator
        assert record is not None and profile.stack in list_stacks(), name
        assert load_stack(profile.stack).device == profile.device, name
        assert profile.verl["trainer"]["n_gpus_per_node"] == record.devices_per_node, name
        assert record.peak_tflops > 0 and record.memory_gb > 0 and record.peak_source and record.interconnect
        # HBM bandwidth per device and where each figure comes from (data sheet, paper, or the derivation)
        assert record.hbm_gbps > 0 and record.hbm_source and record.memory_source, name
        assert all(sku.peak_tflops > 0 and sku.peak_source for sku in record.skus), name
    a3 = config.load_profile("a3").accelerator
    assert (a3.devices_per_node, a3.dies_per_chip, a3.chips_per_node, a3.memory_gb) == (16, 2, 8, 64)
    assert config.load_profile("a2").accelerator.chips_per_node == 8


@pytest.mark.parametrize("profile", list(NODES))
def test_doctor_on_each_recorded_node_names_it_and_the_profile_that_fits(profile):
    dev, sample, count, label = NODES[profile]
    rows = _rows(dev, profile, DEVICE / sample)
    word = dev.short_word
    assert (rows[f"{word}s visible"].found, rows[f"{word}s visible"].ok) == (str(count), True)
    assert (rows["accelerator"].found, rows["accelerator"].ok) == (label, True)
    assert rows["memory per device"].ok is True
    assert rows["accelerator"].note.startswith(f"this node has {count} × {label}: ")
    assert rows["accelerator"].note.endswith(f"the {profile} profile fits it")
    assert fitting_profiles(dev, label) == [profile]


@pytest.mark.parametrize(("profile", "other", "node"), [
    ("a3", "a2", "8 × Ascend910B3 (A2)"), ("h20", "h100", "8 × NVIDIA H100 80GB HBM3"),
    ("h100", "h200", "8 × NVIDIA H200"), ("h200", "h20", "8 × NVIDIA H20"),
])
def test_doctor_on_another_node_names_the_mismatch_and_the_profile_that_fits(profile, other, node):
    dev, sample = NODES[other][:2]
    model = _rows(dev, profile, DEVICE / sample)["accelerator"]
    record = config.load_profile(profile).accelerator
    assert model.ok is None and model.note == (
        f"this node has {node}, not the {record.name} the {profile} profile describes; "
        f"the {other} profile fits it (-P profile={other})")


def _doctor(device: str, profile: str, **fake: str) -> CliResult:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FAKE_")},
           "PATH": f"{FAKES}:{os.environ['PATH']}", **fake}
    return cli_in_process(["doctor", "--device", device, "--profile", profile], env=env)


def _table(stdout: str) -> dict[str, list[str]]:
    """The doctor's table, item → the rest of its columns (split on runs of two or more spaces)."""
    import re

    return {cells[0]: cells[1:] for line in stdout.splitlines()[2:] if (cells := re.split(r"\s{2,}", line.strip()))}


def test_doctor_on_the_a2_node_fits_a2_and_refuses_a3_naming_the_node():
    a2_node = {"FAKE_NPU_SMI_INFO": str(DEVICE / NODES["a2"][1])}
    fits = _doctor("npu", "a2", **a2_node)
    table = _table(fits.stdout)
    assert table["NPUs visible"] == ["8", "n_gpus_per_node=8", "ok"]
    assert table["accelerator"] == ["Ascend910B3 (A2)", "A2", "ok"]
    assert table["memory per device"][-1] == "ok"
    assert "verlflow doctor: note: this node has 8 × Ascend910B3 (A2): Ascend 910B3" in fits.stdout
    # Packages may still block on this machine (no torch_npu here); the node and its chips do not.
    assert "Traceback" not in fits.stderr and "NPUs visible" not in fits.stderr and "accelerator" not in fits.stderr
    refused = _doctor("npu", "a3", **a2_node)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert ("NPUs visible: 8 (this node has 8 × Ascend910B3 (A2), not the A3 the a3 profile describes; "
            "the a2 profile fits it (-P profile=a2)") in lines[0]


# -- two nodes no shipped file describes: profile and stack only under tests/fixtures/hardware ------------------

MADE_UP = {
    "gpu": (HARDWARE / "made-up-gpu.yaml", {"FAKE_NVIDIA_SMI_QUERY": str(DEVICE / "nvidia-smi-query-h20x2.csv.txt")},
            "", "H20-PAIR"),
    "npu": (HARDWARE / "made-up-npu.yaml", {"FAKE_NPU_SMI_INFO": str(DEVICE / "npu-smi-info-910b4-v26.0.rc1-wide.txt")},
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "B4-BOX"),
}


@pytest.mark.parametrize("device", list(MADE_UP))
def test_doctor_reads_a_made_up_profile_and_its_stack(device):
    path, fake, _, name = MADE_UP[device]
    done = _doctor(device, str(path), **fake)
    table = _table(done.stdout)
    word = Device(device).short_word
    assert table[f"{word}s visible"][-1] == "ok" and table["accelerator"][1:] == [name, "ok"]
    stack = load_stack(str(HARDWARE / f"made-up-{device}-stack.yaml"))
    assert table["torch"][1] == stack.version("torch")  # the made-up stack's versions, not a shipped one's
    assert f"the made-up-{device} profile fits it" in done.stdout
    assert done.returncode == 2 and "Traceback" not in done.stderr  # this CPU machine lacks the stack


@pytest.fixture(scope="module")
def made_up_runs(tmp_path_factory):
    """A dry run of the guide's recipe on each made-up node (fake npu-smi / nvidia-smi), in a real store."""
    from verlflow.data import gsm8k

    root = tmp_path_factory.mktemp("made-up")
    gsm8k.preprocess("synthetic", str(root / "data"), 8)
    uri = fresh_store(root)
    runs = {}
    for device, (path, fake, overrides, _) in MADE_UP.items():
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "MLFLOW_RUN_ID"))},
               "PATH": f"{FAKES}:{os.environ['PATH']}", "MLFLOW_TRACKING_URI": uri, **fake}
        done = cli_in_process(["train", "--device", device, "--profile", str(path), "--dry_run", "true",
                               "--data_dir", str(root / "data"), "--overrides", overrides], env=env, cwd=root)
        assert done.returncode == 0, done.stderr[-2000:]
        client = MlflowClient(uri)
        every = [e.experiment_id for e in client.search_experiments()]
        runs[device] = next(r for r in client.search_runs(every) if r.info.run_id not in
                            {v.info.run_id for v in runs.values()})
    return {"uri": uri, "root": root, "runs": runs}


def test_a_dry_run_tags_the_made_up_nodes_record(made_up_runs):
    gpu, npu = made_up_runs["runs"]["gpu"].data.tags, made_up_runs["runs"]["npu"].data.tags
    assert {k: gpu[k] for k in ("device.name", "device.count", "device.model", "device.devices_per_node",
                                "device.peak_tflops", "device.interconnect", "device.stack")} == {
        "device.name": "NVIDIA H20", "device.count": "2", "device.model": "NVIDIA H20 96GB HBM3 (test record)",
        "device.devices_per_node": "2", "device.peak_tflops": "148 bf16", "device.interconnect": "PCIe (made up)",
        "device.stack": "made-up-gpu-stack"}
    assert (npu["device.name"], npu["device.model"], npu["device.peak_tflops"], npu["verlflow.profile"]) == (
        "Ascend910B4", "Ascend 910B4 (test record)", "200 fp16", str(HARDWARE / "made-up-npu.yaml"))


def test_compare_reports_both_made_up_records(made_up_runs, monkeypatch):
    import mlflow

    from verlflow.compare.comparison import compare_runs

    monkeypatch.setenv("MLFLOW_TRACKING_URI", made_up_runs["uri"])
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(made_up_runs["uri"])  # another module may have set one for this process
    runs = made_up_runs["runs"]
    client = MlflowClient(made_up_runs["uri"])
    for run, seconds in ((runs["gpu"], 100.0), (runs["npu"], 150.0)):  # a dry run trains nothing: give it a time
        client.log_metric(run.info.run_id, "timing_s/e2e", seconds)
        client.set_tag(run.info.run_id, "verlflow.dry_run", "false")  # counted as trained: compare refuses dry runs
    try:
        result = compare_runs(runs["gpu"].info.run_id, runs["npu"].info.run_id, str(made_up_runs["root"] / "out"))
    finally:
        mlflow.set_tracking_uri(before)
    versions = {label: (base, cand) for label, base, cand in result.versions}
    assert versions["accelerator (profile's record)"] == ("NVIDIA H20 96GB HBM3 (test record)",
                                                         "Ascend 910B4 (test record)")
    assert versions["peak dense TFLOPS per device (profile's record)"] == ("148 bf16", "200 fp16")
    assert versions["expected stack (config/stacks)"] == ("made-up-gpu-stack", "made-up-npu-stack")


def test_a_bandwidth_without_its_source_is_one_line(tmp_path):
    text = (HARDWARE / "made-up-gpu.yaml").read_text().replace("  interconnect: PCIe (made up)\n",
                                                              "  interconnect: PCIe (made up)\n  hbm_gbps: 4000\n")
    (tmp_path / "no-source.yaml").write_text(text)
    with pytest.raises(VerlflowError, match=r"accelerator 'H20-PAIR' \(NVIDIA H20 96GB HBM3 \(test record\)\) has "
                                            r"hbm_gbps=4000.0: give a positive GB/s per device and its hbm_source$"):
        config.load_profile(str(tmp_path / "no-source.yaml"))


def test_a_record_that_contradicts_its_profile_is_one_line(tmp_path):
    text = (HARDWARE / "made-up-gpu.yaml").read_text().replace("n_gpus_per_node: 2", "n_gpus_per_node: 4")
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(VerlflowError, match=r"^profile 'bad' sets trainer.n_gpus_per_node=4 but its accelerator "
                                            r"has devices_per_node=2: make them equal$"):
        config.load_profile(str(tmp_path / "bad.yaml"))


def test_a_record_field_can_be_overridden_like_any_profile_field():
    cfg = config.compose("smoke", "cpu", "")
    assert cfg.profile.accelerator is None
    h100 = config.compose("qwen3-4b-gsm8k-grpo", "h100", "profile.accelerator.memory_gb=94")
    assert h100.profile.accelerator.memory_gb == 94.0 and h100.profile.accelerator.name == "H100"


def test_the_node_label_is_the_listed_name_plus_its_generation():
    fields = collect_device_profile(Device.NPU, probe=_probe(Device.NPU, DEVICE / NODES["a2"][1]), environ={})
    assert node_label(fields) == "Ascend910B3 (A2)"
