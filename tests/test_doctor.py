"""`verlflow doctor` on recorded machines (an A3 node, an H20 node, partial ones) and on this CPU machine.

Only the hardware is recorded (npu-smi / nvidia-smi output, CANN version files, the import's result);
the profiles and the guide's stacks are the shipped ones.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verlflow.device.detect import NPU_SMI_INFO, NVIDIA_SMI_QUERY, Probe
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
    done = subprocess.run([sys.executable, "-m", "verlflow.cli", "doctor", "--device", device],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    word = "NPU" if device == "npu" else "GPU"
    assert f"verlflow doctor: error: the launch cannot proceed: {word}s visible: 0 (no {word} on this machine" \
        in done.stderr
    assert f"{word}s visible" in done.stdout.splitlines()[2]
