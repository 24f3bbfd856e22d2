"""The device profile: parsers on every recorded real output, and whole profiles of recorded machines.

Hardware is the only fake: a :class:`Probe` that answers with recorded ``npu-smi`` / ``nvidia-smi``
texts and CANN files. The samples live in ``tests/fixtures/device`` (its README.md gives each one's
source): real outputs copied unchanged, and a few cut-downs for whole-machine profiles.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from verlflow.device.detect import (
    NPU_SMI_INFO,
    NVIDIA_SMI,
    NVIDIA_SMI_QUERY,
    DeviceProfile,
    Probe,
    capture_env,
    collect_device_profile,
    count_visible,
    detect_device,
    first_error_line,
    npu_generation,
    package_versions,
    parse_ascend_version_file,
    parse_key_values,
    parse_npu_smi_info,
    parse_npu_smi_version,
    parse_nvidia_smi_q_versions,
    parse_nvidia_smi_query,
    parse_nvidia_smi_table,
    run_command,
    soc_name,
)
from verlflow.device.npu_listing import npu_board_command
from verlflow.device.probe import module_installed, read_text
from verlflow.errors import VerlflowError

LOCAL = Path(__file__).resolve().parent / "fixtures" / "device"
ASCEND = "/usr/local/Ascend"
CANN_INFO = f"{ASCEND}/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info"


def body(path: Path) -> str:
    """The recorded output without the provenance line every sample starts with."""
    lines = path.read_text().splitlines(keepends=True)
    return "".join(lines[1:] if lines and lines[0].startswith("#") else lines)


def blocks(text: str) -> dict[str, str]:
    """Samples holding several outputs mark each with a ``## <command>`` line."""
    out, key = {"": ""}, ""
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            key = line[3:].strip()
            out[key] = ""
        else:
            out[key] += line
    return {k: v for k, v in out.items() if v.strip() or k}


# ---- what each parser yields, reduced to the fields a profile uses ---------------------------


def npu_info(text: str, **_) -> dict:
    chips = parse_npu_smi_info(text)
    return {
        "chips": len(chips),
        "npus": len({c.npu_id for c in chips}),
        "names": sorted({c.name for c in chips}),
        "hbm_total_mb": sorted({c.hbm_total_mb for c in chips}),
        "phy_ids": [c.phy_id for c in chips if c.phy_id is not None],
        "no_power": sum(c.power_w is None for c in chips),
        "max_hbm_used_mb": max((c.hbm_used_mb or 0 for c in chips), default=None),
        "health": sorted({c.health for c in chips}),
        **parse_npu_smi_version(text),
    }


def board(text: str, **_) -> dict:
    out = {}
    for key, part in blocks(text).items():
        kv = parse_key_values(part)
        out[key] = {"soc": soc_name(kv), "software": kv.get("Software Version"),
                    "firmware": kv.get("Firmware Version"), "hbm_mb": kv.get("HBM Capacity(MB)"),
                    "chip_count": kv.get("Chip Count"), "total": kv.get("Total Count")}
    return out


def version_file(text: str, **_) -> dict:
    return parse_ascend_version_file(text)


def tool_failure(text: str, **_) -> dict:
    return {"chips": len(parse_npu_smi_info(text)), "gpus": len(parse_nvidia_smi_table(text)["gpus"]),
            "error": first_error_line(text)}


def npu_smi_v(text: str, **_) -> dict:
    return parse_npu_smi_version(text)


def gpu_query(text: str, columns=None, **_) -> dict:
    out = {}
    for key, part in blocks(text).items():
        gpus = parse_nvidia_smi_query(part, columns)
        out[key] = {"count": len(gpus), "names": sorted({g.name for g in gpus}),
                    "memory_total_mb": sorted({g.memory_total_mb for g in gpus}),
                    "first_used_mb": gpus[0].memory_used_mb if gpus else None,
                    "driver": gpus[0].driver_version if gpus else None,
                    "compute_cap": gpus[0].fields.get("compute_cap") if gpus else None}
    return out


def gpu_table(text: str, **_) -> dict:
    table = parse_nvidia_smi_table(text)
    return {"driver": table["driver"], "cuda": table["cuda"],
            "indices": [g.index for g in table["gpus"]], "names": sorted({g.name for g in table["gpus"]}),
            "memory_total_mb": sorted({g.memory_total_mb for g in table["gpus"]}),
            "mig_modes": [g.mig_mode for g in table["gpus"]]}


def gpu_q(text: str, **_) -> dict:
    return {key: parse_nvidia_smi_q_versions(part) for key, part in blocks(text).items()}


def torch_npu_names(text: str, **_) -> dict:
    names = re.findall(r"'(Ascend910[A-Za-z0-9_]*)'", text)
    return {name: npu_generation(name) for name in names}


def collect_env_block(text: str, **_) -> dict:
    environ = dict(re.findall(r"^([A-Z][A-Z0-9_]*)=(.*)$", text.split("ENV Variables:")[1], re.MULTILINE))
    kept = capture_env(environ)
    assert all(environ[k] == v for k, v in kept.items())
    return {"kept": len(kept), "dropped": sorted(set(environ) - set(kept))}


A3_BOARD = {"soc": "Ascend910_9392", "software": None, "firmware": None, "hbm_mb": None,
            "chip_count": None, "total": None}
A2_BOARD = {**A3_BOARD, "soc": "Ascend910B4"}

# Per file: (summary function, expected subset of its result). A new sample file must be added here.
EXPECTED: dict[str, tuple] = {
    "npu-smi-info-910b2-8npu.txt": (npu_info, {
        "chips": 8, "npus": 8, "names": ["910B2"], "hbm_total_mb": [65536], "phy_ids": [],
        "max_hbm_used_mb": 29954, "driver": "23.0.7", "npu_smi": "23.0.7"}),
    "npu-smi-info-910b3-8npu-v25.2.0.txt": (npu_info, {
        "chips": 8, "names": ["910B3"], "hbm_total_mb": [65536], "health": ["OK"], "driver": "25.2.0"}),
    "npu-smi-info-910b3-8npu-v26.1.0-wide.txt": (npu_info, {
        "chips": 8, "names": ["910B3"], "hbm_total_mb": [65536], "max_hbm_used_mb": 8676,
        "driver": "26.1.0"}),
    "npu-smi-info-910b4-v26.0.rc1-wide.txt": (npu_info, {
        "chips": 1, "names": ["910B4"], "hbm_total_mb": [32768], "max_hbm_used_mb": 2871,
        "driver": "26.0.rc1"}),
    "npu-smi-info-a3-16chip.txt": (npu_info, {
        "chips": 16, "npus": 8, "names": ["Ascend910"], "hbm_total_mb": [65536],
        "phy_ids": list(range(16)), "no_power": 8, "driver": "24.1.rc3.7"}),
    "npu-smi-info-a3-v26.0.rc2-wide-FRAGMENTS.txt": (npu_info, {
        "chips": 3, "npus": 2, "phy_ids": [0, 1, 15], "no_power": 2, "max_hbm_used_mb": 31877,
        "driver": "26.0.rc2"}),
    "npu-smi-info-t-board-i0-25.5.1-fixture.txt": (board, {
        "npu-smi info -t board -i 0": {"soc": None, "software": "25.5.1", "firmware": "7.8.0.6.201",
                                       "hbm_mb": None, "chip_count": "1", "total": None},
        "npu-smi info -t usages -i 0": {"soc": None, "software": None, "firmware": None,
                                        "hbm_mb": "65536", "chip_count": "1", "total": None},
        "npu-smi info -l": {"soc": None, "software": None, "firmware": None, "hbm_mb": None,
                            "chip_count": "1", "total": "8"}}),
    "npu-smi-info-t-board-i0-c0-a2-vs-a3.txt": (board, {
        # `-m` is a table, not "key : value"; verlflow reads the SoC name from `-t board -c`
        "npu-smi info -m (A2, 910B4)": {**A3_BOARD, "soc": None},
        "npu-smi info -t board -i 0 -c 0 (A2)": A2_BOARD,
        "npu-smi info -t board -i 0 -c 0 (A3)": A3_BOARD}),
    "npu-smi-info-t-board-i0-c0-doc-a2.txt": (board, {
        "": {**A3_BOARD, "soc": "Ascendxxx", "firmware": "7.1.0.7.220"}}),  # chip name redacted in the doc
    "npu-smi-info-t-board-i0-doc-a2.txt": (board, {
        "": {**A3_BOARD, "soc": None, "software": "23.0.5", "firmware": "7.1.0.7.220", "chip_count": "1"}}),
    "npu-smi-info-t-board-i2-910b2c-HEAD-ONLY.txt": (board, {
        "": {**A3_BOARD, "soc": None, "software": "25.2.0", "firmware": "7.7.0.6.236"}}),
    "npu-smi-info-t-usages-i0-doc.txt": (board, {
        "": {**A3_BOARD, "soc": None, "hbm_mb": "32768", "chip_count": "1"}}),
    "npu-smi-v.txt": (npu_smi_v, {"npu_smi": "x.x.x"}),  # the doc's literal placeholder
    "ascend-toolkit-version.cfg-8.2.RC2.txt": (version_file, {"version": "8.2.RC2"}),
    "ascend_toolkit_install.info-8.0.0-910b2.txt": (version_file, {"version": "8.0.0", "arch": "aarch64"}),
    "ascend_toolkit_install.info-8.2.RC1-a3.txt": (version_file, {
        "version": "8.2.RC1", "innerversion": "V100R001C22SPC001B231"}),
    "ascend_toolkit_install.info-8.3.RC2-910b3.txt": (version_file, {"version": "8.3.RC2"}),
    "ascend_toolkit_install.info-8.5.0-cann-path.txt": (version_file, {
        "version": "8.5.0", "path": "/usr/local/Ascend/cann-8.5.0/aarch64-linux"}),
    "driver-version.info-24.1.rc1.txt": (version_file, {"version": "24.1.rc1", "Version": "24.1.rc1"}),
    "driver-version.info-24.1.rc2.2.txt": (version_file, {"version": "24.1.rc2.2", "package_version": "24.1.rc2.2"}),
    "firmware-version.info-7.1.0.11.220.txt": (version_file, {
        "version": "7.1.0.11.220", "package_version": "23.0.7"}),
    "nnal-atb-version.info-8.2.RC2.txt": (version_file, {
        "version": "8.2.RC2", "Ascend-cann-atb Version": "8.2.RC2.B030", "Platform": "aarch64"}),
    "nvidia-smi-q-versions.txt": (gpu_q, {
        "": {"driver": "575.57.08", "cuda": "12.9", "attached_gpus": None, "products": []},
        "nvidia-smi -q | head": {"driver": "535.154.05", "cuda": "12.2", "attached_gpus": 1,
                                 "products": ["NVIDIA A10G"]}}),
    "nvidia-smi-query-h100.csv.txt": (gpu_query, {
        # the author elided rows 1-7 of the first query
        "": {"count": 1, "names": ["NVIDIA H100 80GB HBM3"], "memory_total_mb": [81559.0],
             "first_used_mb": None, "driver": "590.48.01", "compute_cap": None},
        "nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv": {
            "count": 1, "names": ["NVIDIA H100 80GB HBM3"], "memory_total_mb": [81559.0],
            "first_used_mb": None, "driver": None, "compute_cap": "9.0"},
        "nvidia-smi --query-gpu=name,memory.total --format=csv": {
            "count": 8, "names": ["NVIDIA H100 80GB HBM3"], "memory_total_mb": [81559.0],
            "first_used_mb": None, "driver": None, "compute_cap": None}}),
    "nvidia-smi-query-h20-nounits.csv.txt": (gpu_query, {
        "": {"count": 8, "names": ["NVIDIA H20"], "memory_total_mb": [97871.0], "first_used_mb": 50119.0,
             "driver": None, "compute_cap": None}},
        {"columns": ["index", "name", "memory.used", "memory.total", "utilization.gpu"]}),
    "nvidia-smi-query-h20.csv.txt": (gpu_query, {
        "": {"count": 8, "names": ["NVIDIA H20"], "memory_total_mb": [97871.0], "first_used_mb": 28.0,
             "driver": None, "compute_cap": None}}),
    "nvidia-smi-table-h20-535.txt": (gpu_table, {
        "driver": "535.161.03", "cuda": "12.2", "indices": [0, 1, 7], "names": ["NVIDIA H20"],
        "memory_total_mb": [97871.0]}),
    "nvidia-smi-table-h200-575.txt": (gpu_table, {
        "driver": "575.57.08", "cuda": "12.9", "indices": [0], "names": ["NVIDIA H200"],
        "memory_total_mb": [143771.0], "mig_modes": ["Disabled"]}),
    "torch_npu-device-queries.txt": (torch_npu_names, {"Ascend910B2C": "A2", "Ascend910_9392": "A3"}),
    "vllm-ascend-collect_env-910b3-excerpt.txt": (collect_env_block, {
        "kept": 21, "dropped": ["LD_LIBRARY_PATH", "PYTORCH_NVML_BASED_CUDA_CHECK"]}),
    "vllm-ascend-collect_env-a3-excerpt.txt": (collect_env_block, {"kept": 14, "dropped": []}),
}
LOCAL_EXPECTED: dict[str, tuple] = {
    "npu-smi-info-a3-2npu-4chip.txt": (npu_info, {
        "chips": 4, "npus": 2, "phy_ids": [0, 1, 2, 3], "no_power": 2, "max_hbm_used_mb": 31877}),
    "npu-smi-info-910b4-v26.0.rc1-wide.txt": EXPECTED["npu-smi-info-910b4-v26.0.rc1-wide.txt"],
    "npu-smi-info-t-board-a3-i0-c0.txt": (board, {"": A3_BOARD}),
    "npu-smi-info-t-board-a2-910b4-i0-c0.txt": (board, {"": A2_BOARD}),
    "ascend_toolkit_install.info-8.2.RC1-a3.txt": EXPECTED["ascend_toolkit_install.info-8.2.RC1-a3.txt"],
    "driver-version.info-24.1.rc2.2.txt": EXPECTED["driver-version.info-24.1.rc2.2.txt"],
    "firmware-version.info-7.1.0.11.220.txt": EXPECTED["firmware-version.info-7.1.0.11.220.txt"],
    "nvidia-smi-query-h20x2.csv.txt": (gpu_query, {
        "": {"count": 2, "names": ["NVIDIA H20"], "memory_total_mb": [97871.0], "first_used_mb": None,
             "driver": "535.161.03", "compute_cap": None}}),
    "nvidia-smi-table-h20x2-535.txt": (gpu_table, {
        "driver": "535.161.03", "cuda": "12.2", "indices": [0, 1], "names": ["NVIDIA H20"],
        "memory_total_mb": [97871.0]}),
    # NPU 0 and 1 of npu-smi-info-910b2-8npu.txt, NPU 1's AICore blanked
    "npu-smi-info-910b2-2npu-aicore-dash.txt": (npu_info, {
        "chips": 2, "npus": 2, "names": ["910B2"], "hbm_total_mb": [65536], "max_hbm_used_mb": 29954,
        "driver": "23.0.7"}),
    "npu-smi-info-fail-8020-device-used.txt": (tool_failure, {
        "chips": 0, "error": "dcmi model initialized failed, because the device is used. ret is -8020"}),
    "npu-smi-info-fail-8005-container.txt": (tool_failure, {
        "chips": 0, "error": "dcmi module initialize failed. ret is -8005"}),
    "nvidia-smi-fail-no-driver.txt": (tool_failure, {"gpus": 0, "error": (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
        "NVIDIA driver is installed and running.")}),
    "nvidia-smi-query-h20x8.csv.txt": (gpu_query, {
        "": {"count": 8, "names": ["NVIDIA H20"], "memory_total_mb": [97871.0], "first_used_mb": None,
             "driver": "535.161.03", "compute_cap": None}}),
    "nvidia-smi-query-h100x8.csv.txt": (gpu_query, {
        "": {"count": 8, "names": ["NVIDIA H100 80GB HBM3"], "memory_total_mb": [81559.0], "first_used_mb": None,
             "driver": "590.48.01", "compute_cap": None}}),
    "nvidia-smi-query-h200x8.csv.txt": (gpu_query, {
        "": {"count": 8, "names": ["NVIDIA H200"], "memory_total_mb": [143771.0], "first_used_mb": None,
             "driver": "575.57.08", "compute_cap": None}}),
    # constructed nodes no one record describes, and the H20-3e (the README says from which real samples)
    "nvidia-smi-query-h20x4-h100x4-mixed.csv.txt": (gpu_query, {
        "": {"count": 8, "names": ["NVIDIA H100 80GB HBM3", "NVIDIA H20"], "memory_total_mb": [81559.0, 97871.0],
             "first_used_mb": None, "driver": "590.48.01", "compute_cap": None}}),
    "nvidia-smi-table-h200-mig-575.txt": (gpu_table, {  # the MIG slice's rows are not a GPU
        "driver": "575.57.08", "cuda": "12.9", "indices": [0], "names": ["NVIDIA H200"],
        "memory_total_mb": [143771.0], "mig_modes": ["Enabled"]}),
    "nvidia-smi-query-h20-3e-x8.csv.txt": (gpu_query, {
        "": {"count": 8, "names": ["NVIDIA H20"], "memory_total_mb": [143771.0], "first_used_mb": None,
             "driver": "535.161.03", "compute_cap": None}}),
    "npu-smi-info-910b3-7of8-missing-chip.txt": (npu_info, {
        "chips": 7, "npus": 7, "names": ["910B3"], "hbm_total_mb": [65536], "driver": "25.2.0"}),
}


# the copies whose first line was reworded keep the reference sample's expectation
assert all(LOCAL_EXPECTED[k] is EXPECTED[k] for k in set(EXPECTED) & set(LOCAL_EXPECTED))
ALL_EXPECTED = {**EXPECTED, **LOCAL_EXPECTED}


def _samples(folder: Path) -> list[str]:
    # *.md are notes about the samples, not device output
    return sorted(p.name for p in folder.iterdir() if p.suffix != ".md")


def test_every_expected_sample_is_kept_with_the_tests():
    assert sorted(ALL_EXPECTED) == _samples(LOCAL)


@pytest.mark.parametrize("name", _samples(LOCAL))
def test_every_recorded_sample_parses_to_its_key_fields(name):
    folder, expected = LOCAL, ALL_EXPECTED
    assert name in expected, f"new sample {folder / name}: add its expected key fields to this test"
    summarize, want, *kwargs = expected[name]
    got = summarize(body(folder / name), **(kwargs[0] if kwargs else {}))
    assert {k: got.get(k) for k in want} == want


# ---- whole machines ---------------------------------------------------------------------------


def local(name: str) -> str:
    return body(LOCAL / name)


def a3_machine(info_text: str | None = None, files: dict[str, str] | None = None) -> Probe:
    """An A3 node: npu-smi (2 cards x 2 chips unless told), SoC board, CANN, driver, firmware."""
    return Probe.recorded(
        commands={" ".join(NPU_SMI_INFO): info_text or local("npu-smi-info-a3-2npu-4chip.txt"),
                  " ".join(npu_board_command(0, 0)): local("npu-smi-info-t-board-a3-i0-c0.txt"),
                  "lscpu": "Architecture:        aarch64\nModel name:          Kunpeng-920\n"},
        files={CANN_INFO: local("ascend_toolkit_install.info-8.2.RC1-a3.txt"),
               f"{ASCEND}/driver/version.info": local("driver-version.info-24.1.rc2.2.txt"),
               f"{ASCEND}/firmware/version.info": local("firmware-version.info-7.1.0.11.220.txt"),
               "/proc/cpuinfo": "processor\t: 0\nBogoMIPS\t: 200.00\nCPU implementer\t: 0x48\n",
               **(files or {})},
        modules=["torch_npu"], machine="aarch64", cpu_count=320)


def h20_machine(torch_cuda: str | None = "12.6", query: bool = True) -> Probe:
    commands = {" ".join(NVIDIA_SMI): local("nvidia-smi-table-h20x2-535.txt")}
    if query:
        commands[" ".join(NVIDIA_SMI_QUERY)] = local("nvidia-smi-query-h20x2.csv.txt")
    return Probe.recorded(commands=commands, torch_cuda=torch_cuda,
                          files={"/proc/cpuinfo": "model name\t: Intel(R) Xeon(R) Platinum 8480+\n"})


def test_a3_node_profile_names_the_soc_counts_chips_and_reads_the_cann_stack():
    probe = a3_machine()
    assert detect_device("auto", probe=probe) == "npu"
    profile = collect_device_profile("npu", probe=probe, environ={"TASK_QUEUE_ENABLE": "2", "HF_TOKEN": "x"})
    assert (profile.type, profile.name, profile.count, profile.memory_gb) == ("npu", "Ascend910_9392", 4, 64.0)
    assert (profile.driver, profile.firmware, profile.cann, profile.cuda) == (
        "24.1.rc2.2", "7.1.0.11.220", "8.2.RC1", None)
    assert (profile.host_arch, profile.host_cpu) == ("aarch64", "Kunpeng-920")
    assert profile.extra["generation"] == "A3" and profile.extra["cann_source"] == CANN_INFO
    assert profile.notes == []
    tags = profile.to_tags()
    assert {k: tags[k] for k in ("device.type", "device.name", "device.count", "device.memory_gb",
                                 "device.cann", "host.arch", "env.TASK_QUEUE_ENABLE")} == {
        "device.type": "npu", "device.name": "Ascend910_9392", "device.count": "4",
        "device.memory_gb": "64", "device.cann": "8.2.RC1", "host.arch": "aarch64", "env.TASK_QUEUE_ENABLE": "2"}
    assert "device.cuda" not in tags and "env.HF_TOKEN" not in tags
    assert tags["sw.python"] and all(isinstance(v, str) for v in tags.values())


def test_a3_full_node_counts_16_chips_and_visible_devices_narrow_it():
    probe = a3_machine(local("npu-smi-info-a3-16chip.txt"))
    assert count_visible("npu", probe=probe, environ={}) == 16
    assert collect_device_profile("npu", probe=probe, environ={}).count == 16
    narrowed = collect_device_profile("npu", probe=probe, environ={"ASCEND_RT_VISIBLE_DEVICES": "0,1"})
    assert narrowed.count == 2
    assert any("ASCEND_RT_VISIBLE_DEVICES=0,1" in note for note in narrowed.notes)


def test_npu_profile_falls_back_when_version_files_are_missing():
    """A container without /usr/local/Ascend/driver mounted: driver from npu-smi's banner, CANN
    from the newer cann/ layout, firmware from the board query; a clear note for what is missing."""
    probe = Probe.recorded(
        commands={" ".join(NPU_SMI_INFO): local("npu-smi-info-910b4-v26.0.rc1-wide.txt"),
                  " ".join(npu_board_command(0, 0)): local("npu-smi-info-t-board-a2-910b4-i0-c0.txt")},
        files={f"{ASCEND}/cann/aarch64-linux/ascend_toolkit_install.info":
               local("ascend_toolkit_install.info-8.2.RC1-a3.txt")},
        modules=["torch_npu"], machine="aarch64")
    profile = collect_device_profile("auto", probe=probe, environ={})
    assert (profile.type, profile.name, profile.count, profile.memory_gb) == ("npu", "Ascend910B4", 1, 32.0)
    assert (profile.driver, profile.cann, profile.firmware) == ("26.0.rc1", "8.2.RC1", None)
    assert profile.extra["generation"] == "A2"
    assert any("firmware version not found" in note for note in profile.notes)

    bare = Probe.recorded(commands={" ".join(NPU_SMI_INFO): local("npu-smi-info-a3-2npu-4chip.txt")},
                          machine="aarch64")
    profile = collect_device_profile("npu", probe=bare, environ={})
    assert profile.name == "Ascend910" and profile.cann is None
    assert any("A3 SKU unknown" in n for n in profile.notes)
    assert any("CANN version not found" in n for n in profile.notes)


def test_cann_is_found_where_set_env_points_and_in_version_cfg():
    home = "/opt/cann/latest"
    probe = a3_machine(files={CANN_INFO: "", f"{home}/aarch64-linux/ascend_toolkit_install.info":
                              local("ascend_toolkit_install.info-8.2.RC1-a3.txt")})
    profile = collect_device_profile("npu", probe=probe, environ={"ASCEND_TOOLKIT_HOME": home})
    assert profile.cann == "8.2.RC1" and profile.extra["cann_source"].startswith(home)
    cfg = a3_machine(files={CANN_INFO: "", f"{ASCEND}/ascend-toolkit/latest/version.cfg":
                            local("ascend-toolkit-version.cfg-8.2.RC2.txt")})
    assert collect_device_profile("npu", probe=cfg, environ={}).cann == "8.2.RC2"


def test_h20_profile_reports_torch_cuda_and_keeps_the_drivers_cuda_apart():
    probe = h20_machine()
    assert detect_device("auto", probe=probe) == "gpu"
    profile = collect_device_profile("gpu", probe=probe, environ={"CUDA_VISIBLE_DEVICES": "1"})
    assert (profile.name, profile.memory_gb, profile.driver, profile.cuda) == (
        "NVIDIA H20", 95.6, "535.161.03", "12.6")
    assert profile.count == 1 and any("CUDA_VISIBLE_DEVICES=1" in n for n in profile.notes)
    assert profile.extra["cuda_driver_max"] == "12.2"
    assert profile.host_cpu == "Intel(R) Xeon(R) Platinum 8480+"
    assert profile.to_tags()["device.memory_gb"] == "95.6"

    no_cuda_torch = collect_device_profile("gpu", probe=h20_machine(torch_cuda=None), environ={})
    assert no_cuda_torch.cuda == "12.2" and any("driver's newest CUDA" in n for n in no_cuda_torch.notes)
    table_only = h20_machine(query=False)  # an nvidia-smi that rejects the query still lists GPUs
    assert count_visible("gpu", probe=table_only, environ={}) == 2
    assert collect_device_profile("gpu", probe=table_only, environ={}).driver == "535.161.03"


def test_auto_needs_torch_npu_for_npu_and_falls_back_to_cpu():
    npu_without_torch_npu = Probe.recorded(
        commands={" ".join(NPU_SMI_INFO): local("npu-smi-info-a3-2npu-4chip.txt")})
    assert detect_device("auto", probe=npu_without_torch_npu) == "cpu"
    torch_npu_without_npus = Probe.recorded(
        commands={" ".join(NVIDIA_SMI_QUERY): local("nvidia-smi-query-h20x2.csv.txt")}, modules=["torch_npu"])
    assert detect_device("auto", probe=torch_npu_without_npus) == "gpu"

    laptop = Probe.recorded(cpu_count=4, files={"/proc/cpuinfo": "model name\t: AMD Ryzen 7 7840U\n"})
    assert detect_device("auto", probe=laptop) == "cpu"
    assert (count_visible("npu", probe=laptop), count_visible("gpu", probe=laptop)) == (0, 0)
    cpu = collect_device_profile("auto", probe=laptop, environ={})
    assert (cpu.type, cpu.name, cpu.count, cpu.memory_gb) == ("cpu", "AMD Ryzen 7 7840U", 4, None)
    assert not any(k.startswith(("device.driver", "device.cann", "device.cuda")) for k in cpu.to_tags())
    missing = collect_device_profile("npu", probe=laptop, environ={})  # dry_run on a laptop still profiles
    assert (missing.count, missing.name) == (0, "unknown")
    assert any("npu-smi not found" in n for n in missing.notes)


@pytest.mark.parametrize("call", [detect_device, count_visible, collect_device_profile])
def test_an_unknown_device_is_refused_with_the_valid_choices(call):
    with pytest.raises(VerlflowError, match=r"'tpu'.*npu, gpu, cpu") as info:
        call("tpu", probe=Probe.recorded())
    assert "\n" not in str(info.value)
    assert detect_device("NPU", probe=Probe.recorded()) == "npu"  # as given, presence is checked elsewhere


def test_capture_env_keeps_performance_knobs_and_never_secrets():
    environ = {
        "MLFLOW_TRACKING_PASSWORD": "pw", "AWS_SECRET_ACCESS_KEY": "s3", "HF_TOKEN": "hf", "HCCL_AUTH_KEY": "k",
        "RAY_AUTH_TOKEN": "t", "HCCL_SECRET_KEY": "k", "RAY_JOB_HEADERS": "{}", "NCCL_IB_hca_password": "p",
        "MLFLOW_TRACKING_URI": "http://u:p@host", "HOME": "/root", "PATH": "/bin", "LD_LIBRARY_PATH": "/x",
        "TASK_QUEUE_ENABLE": "2", "CPU_AFFINITY_CONF": "1", "VLLM_USE_V1": "1", "VLLM_VERSION": "0.9.1",
        "HCCL_CONNECT_TIMEOUT": "1500", "NCCL_DEBUG": "WARN", "LD_PRELOAD": "/usr/lib/libjemalloc.so.2",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "ASCEND_RT_VISIBLE_DEVICES": "0,1",
        "OMP_NUM_THREADS": "8", "RAY_ADDRESS": "ray://admin:hunter2@head:10001",
    }
    assert capture_env(environ) == {
        "ASCEND_RT_VISIBLE_DEVICES": "0,1", "CPU_AFFINITY_CONF": "1", "HCCL_CONNECT_TIMEOUT": "1500",
        "LD_PRELOAD": "/usr/lib/libjemalloc.so.2", "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "RAY_ADDRESS": "ray://***@head:10001",
        "TASK_QUEUE_ENABLE": "2", "VLLM_USE_V1": "1", "VLLM_VERSION": "0.9.1",
    }


def test_tags_fit_mlflow_and_the_profile_is_json(tmp_path):
    import mlflow

    profile = collect_device_profile("npu", probe=a3_machine(), environ={
        "LD_PRELOAD": "/lib/x.so:" * 2000, "ATB_SHARE_MEMORY_NAME_SUFFIX": ""})
    tags = profile.to_tags()
    assert len(tags["env.LD_PRELOAD"]) == 8000
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = mlflow.create_experiment("device", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.set_tags(tags)
        mlflow.log_dict(profile.to_dict(), "device_profile.json")
    logged = mlflow.get_run(run.info.run_id)
    assert logged.info.status == "FINISHED"
    assert {k: logged.data.tags[k] for k in tags} == tags
    saved = mlflow.artifacts.load_dict(f"{logged.info.artifact_uri}/device_profile.json")
    assert saved["name"] == "Ascend910_9392" and len(saved["extra"]["chips"]) == 4
    assert DeviceProfile(**saved).to_tags() == tags


# ---- the real machine boundary -----------------------------------------------------------------


def test_the_default_probe_treats_missing_or_failing_tools_as_absent(tmp_path):
    assert run_command([sys.executable, "-c", "print('hi')"]) == "hi\n"
    assert run_command(["verlflow-no-such-tool-xyz"]) is None
    assert run_command([sys.executable, "-c", "raise SystemExit(3)"]) is None
    assert read_text(str(tmp_path / "missing")) is None
    assert module_installed("json") and not module_installed("verlflow_no_such_module_xyz")
    profile = collect_device_profile("cpu", environ={})
    assert profile.count >= 1 and profile.host_arch and profile.name == profile.host_cpu


def test_versions_and_torch_cuda_come_from_metadata_without_importing_heavy_modules(tmp_path):
    fake_torch = tmp_path / "torch"  # torch's own version.py shape, CUDA build
    fake_torch.mkdir()
    (fake_torch / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (fake_torch / "version.py").write_text("from typing import Optional\ncuda: Optional[str] = '12.6'\n")
    script = (
        "import json, sys, verlflow.device.detect as d; v = d.package_versions(); "
        "sys.path.insert(0, sys.argv[1]); c = d.torch_cuda_version(); "
        "heavy = [m for m in ('torch', 'torch_npu', 'vllm', 'ray', 'transformers', 'verl', 'mlflow') "
        "if m in sys.modules]; print(json.dumps({'versions': v, 'cuda': c, 'heavy': heavy}))"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          check=True)
    result = json.loads(done.stdout)
    assert result["heavy"] == [] and result["cuda"] == "12.6"
    assert result["versions"] == package_versions()
    assert set(result["versions"]) <= {"python", "torch", "torch_npu", "transformers", "vllm", "vllm_ascend",
                                       "ray", "verl", "mlflow"}
    assert {"python", "torch", "verl", "mlflow", "transformers"} <= set(result["versions"])
