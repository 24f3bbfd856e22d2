"""The Ascend NPU's listing: ``npu-smi info`` (chips, HBM, health), the board's SoC name, CANN, driver, firmware.

The ``collector`` of :mod:`verlflow.platforms.npu`; read through :func:`verlflow.device.listing.collector`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from verlflow.device.listing import gib, visible
from verlflow.device.parsers import (
    npu_generation,
    parse_ascend_version_file,
    parse_key_values,
    parse_npu_smi_info,
    parse_npu_smi_version,
    soc_name,
)
from verlflow.device.probe import Probe
from verlflow.platforms import Device

NPU_SMI_INFO = ["npu-smi", "info"]


def npu_board_command(npu_id: int, chip_id: int) -> list[str]:
    """``npu-smi info -t board -i N -c C``: the chip's SoC name parts and firmware version."""
    return ["npu-smi", "info", "-t", "board", "-i", str(npu_id), "-c", str(chip_id)]


def count_listed(probe: Probe) -> int:
    """The chips ``npu-smi info`` lists (16 on an A3 node), before any narrowing."""
    return len(parse_npu_smi_info(probe.run(NPU_SMI_INFO) or ""))


def _first_version(probe: Probe, paths: Sequence[str]) -> tuple[dict[str, str], str | None]:
    for path in paths:
        info = parse_ascend_version_file(probe.read(path) or "")
        if info.get("version"):
            return info, path
    return {}, None


def fields(probe: Probe, environ: Mapping[str, str]) -> dict[str, Any]:
    """The NPU fields of the device profile: SoC name, visible chips, HBM, driver, firmware, CANN, notes."""
    text = probe.run(NPU_SMI_INFO)
    chips = parse_npu_smi_info(text or "")
    banner = parse_npu_smi_version(text or "")
    root, arch = probe.ascend_root.rstrip("/"), probe.machine
    notes: list[str] = []
    if not chips:
        notes.append("npu-smi not found (or it failed)" if text is None else "npu-smi info lists no NPU")
    board_text = probe.run(npu_board_command(chips[0].npu_id, chips[0].chip_id)) if chips else None
    board = parse_key_values(board_text or "")
    table_name = chips[0].name if chips else "unknown"
    name = soc_name(board) or (f"Ascend{table_name}" if table_name[:1].isdigit() else table_name)
    if chips and chips[0].phy_id is not None and "_" not in name:
        notes.append("A3 SKU unknown: npu-smi info -t board gave no NPU Name")
    notes += [f"NPU {c.npu_id} chip {c.chip_id} health {c.health}" for c in chips if c.health != "OK"]
    count, narrowed = visible(len(chips), Device.NPU, environ)
    models = dict(Counter(c.name for c in chips))
    homes = [environ[v].rstrip("/") for v in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH") if environ.get(v)]
    cann, cann_path = _first_version(probe, [
        *(f"{home}/{arch}-linux/ascend_toolkit_install.info" for home in homes),
        f"{root}/ascend-toolkit/latest/{arch}-linux/ascend_toolkit_install.info",
        f"{root}/cann/{arch}-linux/ascend_toolkit_install.info",  # CANN >= 8.5 layout
        *(f"{home}/version.cfg" for home in homes),
        f"{root}/ascend-toolkit/latest/version.cfg",
    ])
    if not cann:
        notes.append(f"CANN version not found under {root} (ascend_toolkit_install.info, version.cfg)")
    driver, _ = _first_version(probe, [f"{root}/driver/version.info"])
    firmware, _ = _first_version(probe, [f"{root}/firmware/version.info"])
    firmware_version = firmware.get("version") or board.get("Firmware Version")
    if chips and not firmware_version:
        plain = ["npu-smi", "info", "-t", "board", "-i", str(chips[0].npu_id)]
        firmware_version = parse_key_values(probe.run(plain) or "").get("Firmware Version")
    if chips and not firmware_version:
        notes.append(f"firmware version not found ({root}/firmware/version.info, npu-smi info -t board)")
    atb, _ = _first_version(probe, [f"{root}/nnal/atb/latest/version.info"])
    extra = {
        "npu_smi": banner.get("npu_smi"),
        "generation": npu_generation(name) or ("A3" if chips and chips[0].phy_id is not None else None),
        "cann_source": cann_path,
        "cann_inner": cann.get("innerversion"),
        "firmware_package": firmware.get("package_version"),
        "nnal_atb": atb.get("version"),
        "chips": [asdict(c) for c in chips],
        "mixed": models if len(models) > 1 else None,  # {table name: chips} when the chips are not one model
    }
    return {
        "name": name,
        "count": count,
        "memory_gb": gib(chips[0].hbm_total_mb) if chips else None,
        "driver": driver.get("version") or banner.get("driver"),  # npu-smi's banner is the driver
        "firmware": firmware_version,
        "cann": cann.get("version"),
        "notes": notes + ([narrowed] if narrowed else []),
        "extra": {k: v for k, v in extra.items() if v is not None},
    }
