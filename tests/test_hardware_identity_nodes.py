"""Nodes no one shipped record describes as they are listed: devices of two models, a GPU in MIG mode, an H20-3e
(the H20's name with 141 GB), a listing tool that fails, a chip missing. Each is refused the same way by the dry
run's set-up (``train``'s composition, before any run opens) and by ``doctor``, or gets its own record.

The machines are samples of tests/fixtures/device (constructed ones say from which recorded sample, in their
first line and in that folder's README), replayed in-process through ``Probe.recorded`` or, for the command line,
by tests/fakes/nvidia-smi on PATH.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import cli_in_process, fresh_store
from mlflow.tracking import MlflowClient

from verlflow.backends.train_setup import choose_train_setup, compose_train_config
from verlflow.device.detect import NPU_SMI_INFO, NVIDIA_SMI, NVIDIA_SMI_QUERY, Probe, collect_device_profile
from verlflow.device.doctor import diagnose
from verlflow.device.stacks import load_stack
from verlflow.errors import VerlflowError

TESTS = Path(__file__).parent
DEVICE = TESTS / "fixtures" / "device"
FAKES = TESTS / "fakes"
GUIDE = "qwen3-4b-gsm8k-grpo"
NO_DRIVER = "nvidia-smi-fail-no-driver.txt"
NO_DRIVER_LINE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
                  "latest NVIDIA driver is installed and running.")


def _printed(sample: str) -> str:
    """What the tool printed: the sample less its provenance line."""
    return (DEVICE / sample).read_text().split("\n", 1)[1]


def gpu_node(*, query: str | None = None, table: str | None = None, failing: str | None = None) -> Probe:
    """A GPU machine whose nvidia-smi prints ``query`` (the CSV query) and ``table`` (plain), or fails printing
    ``failing`` for both; a CUDA torch."""
    commands = {" ".join(cmd): _printed(sample) for cmd, sample in ((NVIDIA_SMI_QUERY, query), (NVIDIA_SMI, table))
                if sample}
    fails = {" ".join(cmd): _printed(failing) for cmd in (NVIDIA_SMI_QUERY, NVIDIA_SMI)} if failing else {}
    return Probe.recorded(commands, failing=fails, torch_cuda="12.6")


def npu_node(sample: str) -> Probe:
    """An Ascend machine whose ``npu-smi info`` prints ``sample``; torch_npu installed."""
    return Probe.recorded({" ".join(NPU_SMI_INFO): _printed(sample)}, modules=["torch_npu"], machine="aarch64")


def composed(probe: Probe, device: str, profile: str = "auto", overrides: str = ""):
    """What ``train --device <device> --profile <profile> --dry_run true`` composes before its run opens."""
    _, _, chosen, _ = choose_train_setup(GUIDE, device, profile, "auto", probe=probe)
    return compose_train_config(GUIDE, chosen, "data", "", overrides, check_counts=False, probe=probe)


def doctor(probe: Probe, device: str, profile: str):
    """Doctor's rows on the machine, the guide's versions installed and the import fine: only the node differs."""
    stack = "a3" if device == "npu" else "h20"
    versions = {k.replace("-", "_"): v["version"] for k, v in load_stack(stack).packages.items()}
    return {row.item: row for row in diagnose(device, profile, probe=probe, environ={}, versions=versions,
                                              check_import=lambda *_: None)}


# -- a node of two models -------------------------------------------------------------------------------------------

MIXED = "nvidia-smi-query-h20x4-h100x4-mixed.csv.txt"


@pytest.mark.parametrize("profile", ["auto", "h20", "h100"])
def test_a_node_of_four_h20_and_four_h100_is_refused_naming_both_models(profile):
    with pytest.raises(VerlflowError) as refused:
        composed(gpu_node(query=MIXED), "gpu", profile)
    assert str(refused.value).startswith(
        "this node's GPUs are not one model (4 × NVIDIA H20 + 4 × NVIDIA H100 80GB HBM3): a run carries one "
        "hardware record")


def test_accepting_another_record_does_not_accept_a_mixed_node():
    with pytest.raises(VerlflowError, match="not one model"):
        composed(gpu_node(query=MIXED), "gpu", "h20", "verlflow.accept_other_hardware=true")


def test_doctor_blocks_a_mixed_node_and_names_both_models():
    accelerator = doctor(gpu_node(query=MIXED), "gpu", "h20")["accelerator"]
    assert (accelerator.found, accelerator.ok) == ("4 × NVIDIA H20 + 4 × NVIDIA H100 80GB HBM3 (mixed)", False)


def test_showing_one_models_gpus_makes_the_node_that_model():
    shown = collect_device_profile("gpu", probe=gpu_node(query=MIXED), environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert (shown.name, shown.count, shown.extra.get("mixed")) == ("NVIDIA H100 80GB HBM3", 4, None)


# -- a GPU in MIG mode ----------------------------------------------------------------------------------------------

MIG = "nvidia-smi-table-h200-mig-575.txt"


def test_a_gpu_in_mig_mode_is_refused_with_the_reason():
    with pytest.raises(VerlflowError) as refused:
        composed(gpu_node(table=MIG), "gpu", "h200", "trainer.n_gpus_per_node=1")
    assert str(refused.value).startswith("GPU 0 of this node (NVIDIA H200) is in MIG mode: a run would see MIG "
                                         "slices, each a fraction of the whole GPU")
    assert "nvidia-smi -i 0 -mig 0" in str(refused.value)


def test_doctor_blocks_a_gpu_in_mig_mode_where_it_passed_the_whole_gpus_record():
    rows = doctor(gpu_node(table=MIG), "gpu", "h200")
    assert (rows["accelerator"].found, rows["accelerator"].ok) == ("NVIDIA H200, MIG mode on GPU 0", False)
    assert "is in MIG mode" in rows["accelerator"].fix
    whole = doctor(gpu_node(table="nvidia-smi-table-h200-575.txt"), "gpu", "h200")["accelerator"]
    assert whole.ok is True  # the same GPU with MIG off: the record fits


# -- the H20-3e -----------------------------------------------------------------------------------------------------

H20_3E = "nvidia-smi-query-h20-3e-x8.csv.txt"


def test_an_h20_listing_141_gb_gets_the_h20_3e_record_not_the_96_gb_one():
    cfg = composed(gpu_node(query=H20_3E), "gpu")
    record = cfg.profile.accelerator
    assert (cfg.profile.name, record.model, record.memory_gb, record.hbm_gbps, record.peak_tflops) == (
        "h20", "NVIDIA H20-3e 141GB HBM3e", 141, 4800, 148)
    h20 = composed(gpu_node(query="nvidia-smi-query-h20x8.csv.txt"), "gpu").profile.accelerator
    assert (h20.model, h20.memory_gb, h20.hbm_gbps) == ("NVIDIA H20 96GB HBM3", 96, 4000)


def test_doctor_names_the_h20_3e_and_its_memory_fits_its_record():
    rows = doctor(gpu_node(query=H20_3E), "gpu", "h20")
    assert "NVIDIA H20-3e 141GB HBM3e (148 TFLOPS bf16)" in rows["accelerator"].note
    assert (rows["memory per device"].guide, rows["memory per device"].ok) == ("141 GB (NVIDIA H20-3e 141GB HBM3e)",
                                                                               True)


def test_runs_on_an_h20_and_an_h20_3e_are_two_accelerators():
    from verlflow.device.identity import same_accelerator

    h20 = {"device.type": "gpu", "device.name": "NVIDIA H20", "device.memory_gb": "95.6"}
    assert not same_accelerator(h20, {**h20, "device.memory_gb": "140.4"})
    assert same_accelerator(h20, {**h20, "device.memory_gb": "95.5"})


# -- a listing tool that fails --------------------------------------------------------------------------------------

def test_a_gpu_node_whose_nvidia_smi_fails_is_refused_with_its_own_error():
    broken = gpu_node(failing=NO_DRIVER)
    for profile in ("auto", "h20", "h100"):
        with pytest.raises(VerlflowError) as refused:
            composed(broken, "gpu", profile)
        assert str(refused.value).startswith(f"nvidia-smi failed: {NO_DRIVER_LINE}: this CUDA GPU node's devices "
                                             "cannot be listed")


def test_auto_on_a_gpu_node_whose_nvidia_smi_fails_is_not_taken_for_a_cpu():
    with pytest.raises(VerlflowError) as refused:
        choose_train_setup(GUIDE, "auto", "auto", "auto", probe=gpu_node(failing=NO_DRIVER))
    assert str(refused.value).startswith(f"device auto: nvidia-smi failed: {NO_DRIVER_LINE}; this looks like a "
                                         "CUDA GPU node")
    assert choose_train_setup(GUIDE, "auto", "auto", "auto", probe=Probe.recorded())[1] == "cpu"  # no nvidia-smi


def test_a_failing_npu_smi_is_refused_by_the_dry_run_as_doctor_refuses_it():
    sample = "npu-smi-info-fail-8020-device-used.txt"
    busy = Probe.recorded(failing={" ".join(NPU_SMI_INFO): _printed(sample)}, modules=["torch_npu"])
    with pytest.raises(VerlflowError, match=r"^npu-smi info failed: dcmi model initialized failed, because the "
                                            r"device is used. ret is -8020: this NPU node"):
        composed(busy, "npu", "a3")
    assert doctor(busy, "npu", "a3")["NPUs visible"].fix == (
        "npu-smi info failed: dcmi model initialized failed, because the device is used. ret is -8020")


def _dry_run(root: Path, uri: str, *args: str, **fake: str):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "MLFLOW_RUN_ID"))},
           "PATH": f"{FAKES}:{os.environ['PATH']}", "MLFLOW_TRACKING_URI": uri, **fake}
    return cli_in_process(["train", *args, "--dry_run", "true", "--data_dir", str(root / "data")], env=env, cwd=root)


@pytest.mark.parametrize("device", [["--device", "gpu"], []])
def test_the_dry_run_on_a_gpu_node_without_its_driver_is_one_line_and_leaves_no_run(tmp_path, device):
    uri = fresh_store(tmp_path)
    done = _dry_run(tmp_path, uri, *device)  # tests/fakes/nvidia-smi without a recording: exit 9, as without driver
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" \
        in lines[0]
    client = MlflowClient(uri)
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


# -- a chip missing -------------------------------------------------------------------------------------------------

def test_an_a2_listing_seven_of_its_eight_chips_fails_the_dry_run_as_doctor_does():
    seven = npu_node("npu-smi-info-910b3-7of8-missing-chip.txt")
    with pytest.raises(VerlflowError) as refused:
        composed(seven, "npu")
    assert str(refused.value).startswith(
        "trainer.n_gpus_per_node=8 but this node lists 7 × Ascend910B3 (A2) (npu-smi info): 1 NPU missing or hidden")
    assert 'pass -P overrides="trainer.n_gpus_per_node=7"' in str(refused.value)
    assert composed(seven, "npu", "a2", "trainer.n_gpus_per_node=7").profile.name == "a2"
    count = doctor(seven, "npu", "a2")["NPUs visible"]
    assert (count.found, count.guide, count.ok) == ("7", "n_gpus_per_node=8", False)
