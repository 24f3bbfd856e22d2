"""The CUDA GPU's listing: ``nvidia-smi --query-gpu`` (or its plain table), the driver and CUDA versions.

The ``collector`` of :mod:`verlflow.platforms.gpu`; read through :func:`verlflow.device.listing.collector`.
"""

from __future__ import annotations

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


def count_listed(probe: Probe) -> int:
    """The GPUs nvidia-smi lists, before any narrowing."""
    return len(list_gpus(probe))


def fields(probe: Probe, environ: Mapping[str, str]) -> dict[str, Any]:
    """The GPU fields of the device profile: name, visible GPUs, memory, driver, CUDA, notes."""
    gpus = list_gpus(probe)
    table = parse_nvidia_smi_table(probe.run(NVIDIA_SMI) or "")  # driver's CUDA, not in the query
    notes = [] if gpus else ["nvidia-smi not found (or it failed) or lists no GPU"]
    if len({g.name for g in gpus}) > 1:
        notes.append("mixed GPUs: " + ", ".join(sorted({g.name for g in gpus})))
    count, narrowed = visible(len(gpus), Device.GPU, environ)
    cuda = probe.torch_cuda()
    if cuda is None and table["cuda"]:
        cuda = table["cuda"]
        notes.append("torch has no CUDA build here: device.cuda is the driver's newest CUDA (nvidia-smi)")
    extra = {"cuda_driver_max": table["cuda"], "gpus": [asdict(g) for g in gpus]}
    return {
        "name": gpus[0].name if gpus else "unknown",
        "count": count,
        "memory_gb": gib(gpus[0].memory_total_mb) if gpus else None,
        "driver": (gpus[0].driver_version if gpus else None) or table["driver"],
        "cuda": cuda,
        "notes": notes + ([narrowed] if narrowed else []),
        "extra": {k: v for k, v in extra.items() if v is not None},
    }
