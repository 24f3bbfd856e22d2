"""The CUDA GPU's listing: ``nvidia-smi --query-gpu`` (or its plain table), the driver and CUDA versions.

The ``collector`` of :mod:`verlflow.platforms.gpu`; read through :func:`verlflow.device.listing.collector`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from verlflow.device.listing import gib, visible
from verlflow.device.parsers import GpuInfo, parse_nvidia_smi_query, parse_nvidia_smi_table
from verlflow.device.probe import Probe
from verlflow.platforms import Device

GPU_QUERY_FIELDS = ["index", "name", "memory.total", "driver_version"]
NVIDIA_SMI_QUERY = ["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY_FIELDS)}", "--format=csv"]
NVIDIA_SMI = ["nvidia-smi"]


def list_gpus(probe: Probe) -> list[GpuInfo]:
    """The GPUs nvidia-smi lists: its CSV query, else its plain table."""
    gpus = parse_nvidia_smi_query(probe.run(NVIDIA_SMI_QUERY) or "", GPU_QUERY_FIELDS)
    return gpus or parse_nvidia_smi_table(probe.run(NVIDIA_SMI) or "")["gpus"]


def visible_gpus(gpus: list[GpuInfo], environ: Mapping[str, str]) -> list[GpuInfo]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` shows when it lists indexes (``0,1,2,3``); all of them otherwise.

    Why: on a node of two models, the GPUs a run may use decide which one it is (4 × H20 shown of 4 × H20 +
    4 × H100); UUIDs and MIG names are not resolved here, so every GPU stays listed for them.
    """
    shown = [entry.strip() for entry in environ.get(Device.GPU.platform.visible_devices_var or "", "").split(",")]
    if not shown or not all(entry.isdigit() for entry in shown):
        return gpus
    return [gpus[int(entry)] for entry in shown if int(entry) < len(gpus)]


def count_listed(probe: Probe) -> int:
    """The GPUs nvidia-smi lists, before any narrowing."""
    return len(list_gpus(probe))


def fields(probe: Probe, environ: Mapping[str, str]) -> dict[str, Any]:
    """The GPU fields of the device profile: name, visible GPUs, memory, driver, CUDA, notes."""
    gpus = list_gpus(probe)
    table = parse_nvidia_smi_table(probe.run(NVIDIA_SMI) or "")  # driver's CUDA and MIG mode, not in the query
    notes = [] if gpus else ["nvidia-smi not found (or it failed) or lists no GPU"]
    shown = visible_gpus(gpus, environ)
    models = dict(Counter(g.name for g in shown))  # {name: how many}, in the order nvidia-smi lists them
    if len(models) > 1:
        notes.append("mixed GPUs: " + ", ".join(sorted(models)))
    split = {g.index for g in table["gpus"] if g.mig_mode == "Enabled"}
    mig = [g.index for g in shown if g.index in split]
    count, narrowed = visible(len(gpus), Device.GPU, environ)
    cuda = probe.torch_cuda()
    if cuda is None and table["cuda"]:
        cuda = table["cuda"]
        notes.append("torch has no CUDA build here: device.cuda is the driver's newest CUDA (nvidia-smi)")
    extra = {"cuda_driver_max": table["cuda"], "gpus": [asdict(g) for g in gpus],
             "mixed": models if len(models) > 1 else None, "mig": mig or None}
    return {
        "name": shown[0].name if shown else "unknown",
        "count": count,
        "memory_gb": gib(shown[0].memory_total_mb) if shown else None,
        "driver": (gpus[0].driver_version if gpus else None) or table["driver"],
        "cuda": cuda,
        "notes": notes + ([narrowed] if narrowed else []),
        "extra": {k: v for k, v in extra.items() if v is not None},
    }
