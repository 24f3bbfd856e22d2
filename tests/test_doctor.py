"""`verlflow doctor` on recorded machines (an A3 node, an H20 node, partial ones) and on this CPU machine.

Only the hardware is recorded (npu-smi / nvidia-smi output, CANN version files, the import's result);
the profiles and the guide's stacks are the shipped ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import cli_in_process

from verlflow.device.detect import NPU_SMI_INFO, NVIDIA_SMI, NVIDIA_SMI_QUERY, Probe
from verlflow.device.doctor import diagnose, render
from verlflow.device.stacks import load_stack

FIXTURES = Path(__file__).parent / "fixtures" / "device"
ROOT = "/usr/local/Ascend"
A3_FILES = {
    f"{ROOT}/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info":
        (FIXTURES / "ascend_toolkit_install.info-8.2.RC1-a3.txt").read_text(),
    f"{ROOT}/driver/version.info": (FIXTURES / "driver-version.info-24.1.rc2.2.txt").read_text(),
    f"{ROOT}/ascend-toolkit/set_env.sh": "export ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest\n",
    f"{ROOT}/nnal/atb/set_env.sh": "export ATB_HOME_PATH=/usr/local/Ascend/nnal/atb/latest\n",
}


def _guide_versions(stack: str) -> dict[str, str]:
    return {k.replace("-", "_"): v["version"] for k, v in load_stack(stack).packages.items()}


def _a3(smi: str, import_error: str | None = None, versions: dict | None = None):
    probe = Probe.recorded({" ".join(NPU_SMI_INFO): (FIXTURES / smi).read_text()}, files=A3_FILES,
                           modules=["torch_npu"], machine="aarch64")
    return diagnose("npu", "a3", probe=probe, environ={"HCCL_CONNECT_TIMEOUT": "1200"},
                    versions=versions or _guide_versions("a3"), check_import=lambda *_: import_error)


def _blocking(rows) -> dict[str, str]:
    return {r.item: r.found for r in rows if r.ok is False}


def test_a_full_a3_node_with_the_guides_stack_can_launch():
    rows = _a3("npu-smi-info-a3-16chip.txt")
    assert _blocking(rows) == {}
    by_item = {r.item: r for r in rows}
    assert (by_item["NPUs visible"].found, by_item["NPUs visible"].guide) == ("16", "n_gpus_per_node=16")
    assert by_item["CANN toolkit"].found.startswith("8.2") and by_item["CANN toolkit"].ok is True
    assert by_item["driver (HDK)"].ok is None  # 24.1 here, 25.2.0 in the guide: shown, not blocking
    assert by_item["torch_npu"].found == "2.5.1.post1" and by_item["torch_npu"].ok is True
    assert by_item["HCCL_* environment"].found == "HCCL_CONNECT_TIMEOUT=1200"
    table = render(rows)
    assert table.splitlines()[0].split() == ["item", "this", "machine", "guide", "status"]


def test_an_a3_with_too_few_chips_and_a_broken_torch_npu_is_refused_naming_both():
    error = "ImportError: libhccl.so: cannot open shared object file: No such file or directory"
    versions = {**_guide_versions("a3"), "verl": "0.9.1"}
    del versions["vllm"]
    rows = _a3("npu-smi-info-a3-2npu-4chip.txt", import_error=error, versions=versions)
    assert _blocking(rows) == {"NPUs visible": "4", "import torch_npu": error, "vllm": "not installed"}
    assert next(r for r in rows if r.item == "verl").ok is None  # a newer verl differs, it does not block


def test_an_h20_node_and_a_partial_one():
    def h20(csv: str, cuda: str | None):
        probe = Probe.recorded({" ".join(NVIDIA_SMI_QUERY): (FIXTURES / csv).read_text()}, torch_cuda=cuda)
        versions = {**_guide_versions("h20"), "torch": "2.7.1+cu126"}
        return diagnose("gpu", "h20", probe=probe, environ={}, versions=versions,
                        check_import=lambda *_: None if cuda else "AssertionError: torch.cuda.is_available() is False")

    rows = h20("nvidia-smi-query-h20x8.csv.txt", "12.6")
    assert _blocking(rows) == {}
    assert next(r for r in rows if r.item == "torch").ok is True  # 2.7.1+cu126 is the guide's 2.7.1
    assert _blocking(h20("nvidia-smi-query-h20x2.csv.txt", None)) == {
        "GPUs visible": "2", "torch CUDA build": "none (CPU build)",
        "torch.cuda": "AssertionError: torch.cuda.is_available() is False"}


@pytest.mark.parametrize("device", ["npu", "gpu"])
def test_on_this_cpu_machine_doctor_exits_2_naming_the_missing_device(device):
    done = cli_in_process(["doctor", "--device", device])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    word = "NPU" if device == "npu" else "GPU"
    assert f"verlflow doctor: error: the launch cannot proceed: {word}s visible: 0 (no {word} on this machine" \
        in done.stderr
    assert f"{word}s visible" in done.stdout.splitlines()[2]


def _printed(sample: str) -> str:
    """What the tool printed: the recorded sample less its provenance line."""
    return (FIXTURES / sample).read_text().split("\n", 1)[1]


@pytest.mark.parametrize("smi", ["npu-smi-info-910b3-8npu-v25.2.0.txt", "npu-smi-info-910b2-8npu.txt"])
def test_an_a2_node_is_named_as_not_the_a3_the_profile_describes(smi):
    rows = _a3(smi)
    by_item = {r.item: r for r in rows}
    model = by_item["accelerator"]
    assert model.found.endswith("(A2)") and model.found.startswith("Ascend910B") and model.guide == "A3"
    assert model.ok is None  # another model differs; the device count is what blocks
    assert "not the A3 the a3 profile describes" in model.note
    count = by_item["NPUs visible"]
    assert (count.found, count.ok) == ("8", False)
    assert count.fix.startswith(f"this node has 8 × {model.found}, not the A3")
    assert count.fix.endswith("run on an A3 node, or pass -P overrides=\"trainer.n_gpus_per_node=8\" to run here")


def test_an_a3_and_an_h20_are_recognised_as_what_their_profiles_describe():
    assert next(r for r in _a3("npu-smi-info-a3-16chip.txt") if r.item == "accelerator").ok is True
    probe = Probe.recorded({" ".join(NVIDIA_SMI_QUERY): (FIXTURES / "nvidia-smi-query-h20x8.csv.txt").read_text()},
                           torch_cuda="12.6")
    rows = diagnose("gpu", "h20", probe=probe, environ={}, versions=_guide_versions("h20"),
                    check_import=lambda *_: None)
    assert [(r.found, r.ok) for r in rows if r.item == "accelerator"] == [("NVIDIA H20", True)]


def test_another_nvidia_gpu_differs_from_the_h20():
    table = (FIXTURES / "nvidia-smi-table-h200-575.txt").read_text()
    probe = Probe.recorded({" ".join(NVIDIA_SMI): table}, torch_cuda="12.6")
    rows = diagnose("gpu", "h20", probe=probe, environ={}, versions=_guide_versions("h20"),
                    check_import=lambda *_: None)
    model = next(r for r in rows if r.item == "accelerator")
    assert "H200" in model.found and model.ok is None and "not the H20 the h20 profile describes" in model.note


@pytest.mark.parametrize(("sample", "line"), [
    ("npu-smi-info-fail-8020-device-used.txt",
     "dcmi model initialized failed, because the device is used. ret is -8020"),
    ("npu-smi-info-fail-8005-container.txt", "dcmi module initialize failed. ret is -8005"),
])
def test_a_failing_npu_smi_shows_its_own_error_not_no_npu(sample, line):
    probe = Probe.recorded(failing={" ".join(NPU_SMI_INFO): _printed(sample)}, files=A3_FILES,
                           modules=["torch_npu"], machine="aarch64")
    rows = diagnose("npu", "a3", probe=probe, environ={}, versions=_guide_versions("a3"),
                    check_import=lambda *_: None)
    count = next(r for r in rows if r.item == "NPUs visible")
    assert (count.found, count.ok, count.fix) == ("0", False, f"npu-smi info failed: {line}")


def test_a_failing_nvidia_smi_shows_its_own_error():
    text = _printed("nvidia-smi-fail-no-driver.txt")
    probe = Probe.recorded(failing={" ".join(NVIDIA_SMI_QUERY): text, " ".join(NVIDIA_SMI): text},
                           torch_cuda="12.6")
    rows = diagnose("gpu", "h20", probe=probe, environ={}, versions=_guide_versions("h20"),
                    check_import=lambda *_: None)
    assert next(r for r in rows if r.item == "GPUs visible").fix == (
        "nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.")


def test_fixes_are_pinned_to_the_guides_stack_and_a_missing_vllm_ascend_blocks():
    versions = {k: v for k, v in _guide_versions("a3").items() if k not in ("torch_npu", "vllm", "vllm_ascend")}
    rows = _a3("npu-smi-info-a3-16chip.txt", versions=versions)
    fixes = {r.item: r.fix for r in rows if r.ok is False}
    assert set(fixes) == {"torch_npu", "vllm", "vllm_ascend"}
    assert fixes["torch_npu"] == "pip install torch==2.5.1 torch-npu==2.5.1.post1"  # torch_npu with its own torch
    assert "-b v0.9.1" in fixes["vllm"] and "VLLM_TARGET_DEVICE=empty pip install" in fixes["vllm"]
    assert "vllm-ascend" in fixes["vllm_ascend"] and "v0.9.1" in fixes["vllm_ascend"]
    gpu = diagnose("gpu", "h20", probe=Probe.recorded(), environ={}, versions={}, check_import=lambda *_: "x")
    assert next(r for r in gpu if r.item == "torch CUDA build").fix == (
        "pip install torch==2.7.1 --index-url https://download.pytorch.org/whl/cu126")


FAKES = Path(__file__).parent / "fakes"


@pytest.mark.parametrize(("profile", "fake_env", "expected"), [
    ("a3", {"FAKE_NPU_SMI_INFO": str(FIXTURES / "npu-smi-info-910b3-8npu-v25.2.0.txt")},
     "NPUs visible: 8 (this node has 8 × Ascend910B3 (A2), not the A3 the a3 profile describes"),
    ("auto", {"FAKE_NPU_SMI_FAIL_WITH": str(FIXTURES / "npu-smi-info-fail-8020-device-used.txt")},
     "NPUs visible: 0 (npu-smi info failed: dcmi model initialized failed, because the device is used. ret is -8020)"),
])
def test_doctor_on_a_recorded_npu_smi_says_what_the_node_is(profile, fake_env, expected):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FAKE_NPU_SMI")},
           "PATH": f"{FAKES}:{os.environ['PATH']}", **fake_env}
    done = cli_in_process(["doctor", "--device", "npu", "--profile", profile], env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("verlflow doctor: error: the launch cannot proceed: "), lines
    assert expected in lines[0], lines[0]


def test_doctor_auto_on_an_a2_node_checks_the_a2_profile():
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FAKE_NPU_SMI")},
           "PATH": f"{FAKES}:{os.environ['PATH']}",
           "FAKE_NPU_SMI_INFO": str(FIXTURES / "npu-smi-info-910b2-8npu.txt")}
    done = cli_in_process(["doctor", "--device", "npu"], env=env)
    assert "verlflow doctor: note: this node has 8 × Ascend910B2 (A2): Ascend 910B2 (354 TFLOPS fp16)" in done.stdout
    assert "the a2 profile fits it" in done.stdout and "NPUs visible" not in done.stderr, done.stderr
