"""Detect the device (npu | gpu | cpu) and collect the profile logged as tags + ``device_profile.json``.

The machine is reached only through a :class:`Probe` (run a command, read a file, look for a
module), so every code path runs in tests on recorded real ``npu-smi`` / ``nvidia-smi`` / CANN
outputs. Nothing here imports torch, torch_npu or vllm: versions come from package metadata,
and CANN may not be sourced in the process that collects the profile.

    python -c "import json, verlflow.device.detect as d; \
print(json.dumps(d.collect_device_profile(d.detect_device()).to_dict(), indent=1))"
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verlflow.config import Profile
from verlflow.device import identity, listing
from verlflow.device.gpu_listing import NVIDIA_SMI, NVIDIA_SMI_QUERY
from verlflow.device.npu_listing import NPU_SMI_INFO
from verlflow.device.parsers import (
    GpuInfo,
    NpuChip,
    first_error_line,
    npu_generation,
    parse_ascend_version_file,
    parse_cpu_model,
    parse_key_values,
    parse_npu_smi_info,
    parse_npu_smi_version,
    parse_nvidia_smi_q_versions,
    parse_nvidia_smi_query,
    parse_nvidia_smi_table,
    soc_name,
)
from verlflow.device.probe import Probe, command_failure, import_torch_npu, run_command, torch_cuda_version
from verlflow.errors import VerlflowError
from verlflow.platforms import Device, kinds, platform_of
from verlflow.platforms import tags as device_tags
from verlflow.secrets import looks_secret, mask_text

__all__ = [  # the parsers and the probe are re-exported: callers use verlflow.device.detect only
    "DeviceProfile", "Probe", "NpuChip", "GpuInfo", "detect_device", "count_visible", "absence",
    "collect_device_profile", "capture_env", "package_versions", "parse_npu_smi_info",
    "parse_npu_smi_version", "parse_nvidia_smi_query", "parse_nvidia_smi_table",
    "parse_nvidia_smi_q_versions", "parse_ascend_version_file", "parse_key_values", "soc_name",
    "npu_generation", "first_error_line", "command_failure", "lister_command", "as_device", "hardware_tags",
    "identify_node", "node_of", "lister_error", "import_torch_npu", "run_command", "torch_cuda_version",
    "NPU_SMI_INFO", "NVIDIA_SMI", "NVIDIA_SMI_QUERY",
]

# MLflow's limits (mlflow.utils.validation.MAX_TAG_VAL_LENGTH / MAX_ENTITY_KEY_LENGTH)
MAX_TAG_VALUE = 8000
MAX_TAG_KEY = 250


def lister_command(dev: Device | str) -> list[str]:
    """The command that lists ``dev``'s devices (its platform's lister): ``npu-smi info``, ``nvidia-smi``."""
    return list(platform_of(dev).lister)


# ----------------------------------------------------------------------------------------------
# the profile
# ----------------------------------------------------------------------------------------------


@dataclass
class DeviceProfile:
    """What ran where: the device, its driver stack, the host, package versions and env knobs."""

    type: str  # a Device (npu | gpu | cpu), kept a str for JSON
    name: str  # "Ascend910_9392" / "NVIDIA H20" / the CPU model
    count: int  # visible chips (an A3 node: 8 cards x 2 chips = 16)
    memory_gb: float | None = None  # per device, GiB (npu-smi / nvidia-smi MiB / 1024)
    driver: str | None = None
    firmware: str | None = None
    cann: str | None = None
    cuda: str | None = None  # torch's CUDA build; the driver's maximum only when torch has none
    host_arch: str = ""
    host_cpu: str = ""
    software: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # per-chip rows, sources; JSON only
    # The run profile's hardware record as tags (device.model, device.peak_tflops, …; see hardware_tags).
    hardware: dict[str, str] = field(default_factory=dict)

    def to_tags(self) -> dict[str, str]:
        """The profile as MLflow tags: None omitted, every value a string cut
        to MLflow's 8000-character limit."""
        tags: dict[str, Any] = {device_tags.TYPE_TAG: self.type, device_tags.NAME_TAG: self.name,
                                device_tags.COUNT_TAG: self.count}
        for key in ("memory_gb", "driver", "firmware", "cann", "cuda"):
            tags[device_tags.tag(key)] = getattr(self, key)
        tags.update(self.hardware)
        tags["host.arch"], tags["host.cpu"] = self.host_arch, self.host_cpu
        tags.update({f"sw.{k}": v for k, v in self.software.items()})
        tags.update({f"env.{k}": v for k, v in self.env.items()})
        out = {}
        for key, value in tags.items():
            if value is None or len(key) > MAX_TAG_KEY:
                continue
            text = f"{value:g}" if isinstance(value, float) else str(value)
            out[key] = text if len(text) <= MAX_TAG_VALUE else text[: MAX_TAG_VALUE - 3] + "..."
        return out

    def to_dict(self) -> dict:
        """The whole profile, JSON-able, for ``device_profile.json``."""
        return asdict(self)


AUTO = "auto"


def as_device(device_type: Device | str) -> Device:
    """``device_type`` as a :class:`Device`; one line naming it and the valid ones when it is none."""
    value = str(device_type).strip().lower()
    if value not in Device:
        raise VerlflowError(f"unknown device {device_type!r}: use one of {', '.join(Device)}")
    return Device(value)


def detect_device(requested: Device | str = AUTO, *, probe: Probe | None = None) -> Device:
    """The device to run on: ``npu``/``gpu``/``cpu`` as given, or for ``auto`` the first accelerator, in the
    platforms' order, whose torch extension is installed and whose lister lists one (npu: torch_npu installed and
    npu-smi lists chips; gpu: nvidia-smi lists GPUs), else the CPU.

    The one detection order of verlflow: every step, ``evaluate`` included, asks here.
    """
    if str(requested).strip().lower() != AUTO:
        try:
            return as_device(requested)
        except VerlflowError:
            valid = ", ".join((AUTO, *Device))
            raise VerlflowError(f"unknown device {requested!r}: use one of {valid}") from None
    probe = probe or Probe()
    for dev in kinds():
        extension = dev.platform.torch_extension
        if not dev.is_accelerator or not (extension is None or probe.import_ok(extension)):
            continue
        if count_visible(dev, probe=probe):
            return dev
        failed = lister_error(dev, probe)
        if failed:  # the node's tool is there and fails: a broken driver, not a CPU machine
            raise VerlflowError(f"device auto: {failed}; this looks like a {dev.word} node whose {dev.short_word}s "
                                f"cannot be listed, not a CPU: fix it (verlflow doctor --device {dev} shows what "
                                "blocks) or pass --device cpu")
    return Device.CPU


def lister_error(dev: Device | str, probe: Probe | None = None) -> str | None:
    """``nvidia-smi failed: NVIDIA-SMI has failed because ...`` when ``dev``'s listing tool is installed, lists no
    device and fails with its own error (a node whose driver is broken or busy); None when it lists devices, is
    not installed (a laptop), or lists none without failing."""
    dev, probe = as_device(dev), probe or Probe()
    lists = listing.collector(dev)
    if lists is None or lists.count_listed(probe):
        return None
    cmd = lister_command(dev)
    failure = probe.failure(cmd)
    if not failure or "not found on PATH" in failure:
        return None
    return failure if failure.startswith(cmd[0]) else f"{' '.join(cmd)} failed: {failure}"


def count_visible(device_type: Device | str, *, probe: Probe | None = None,
                  environ: Mapping[str, str] | None = None) -> int:
    """How many devices of this type the process can use (0 when absent), so preflight can
    refuse a missing device. NPU counts chips (16 on an A3 node), narrowed by the platform's visible-devices
    variable (``ASCEND_RT_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES``) when set; the CPU counts its cores."""
    device_type = as_device(device_type)
    probe = probe or Probe()
    environ = os.environ if environ is None else environ
    lists = listing.collector(device_type)
    if lists is None:
        return probe.cpu_count
    return listing.visible(lists.count_listed(probe), device_type, environ)[0]


def absence(device_type: Device | str, *, probe: Probe | None = None,
            environ: Mapping[str, str] | None = None) -> str | None:
    """Why an accelerator ``device_type`` cannot be used here, as the start of a line ("no NPU is visible on this
    machine (torch_npu not installed)", "no CUDA GPU is visible here (nvidia-smi not found on PATH)"); None when
    its lister lists one, and for the CPU. The lister's own first error line wins over "lists none" (npu-smi's
    ``dcmi ... ret is -8020`` says more than "no NPU"). Asked before anything about data, so a missing device is
    the first thing a step on the wrong machine says."""
    dev = as_device(device_type)
    if not dev.is_accelerator:
        return None
    probe = probe or Probe()
    extension = dev.platform.torch_extension
    if extension and not probe.import_ok(extension):
        return f"no {dev.word} is visible on this machine ({extension} not installed)"
    if count_visible(dev, probe=probe, environ=environ):
        return None
    lister = lister_command(dev)
    said = probe.failure(lister)
    why = f"{lister[0]} lists none"
    if said:
        why = said if said.startswith(lister[0]) else f"{' '.join(lister)}: {said}"
    return f"no {dev.word} is visible here ({why})"


def _host_cpu(probe: Probe) -> str:
    return (parse_cpu_model(probe.read("/proc/cpuinfo") or "")
            or parse_cpu_model(probe.run(["lscpu"]) or "") or "unknown")


def hardware_tags(profile: Profile | None, node: identity.Node | None = None) -> dict[str, str]:
    """The run profile's hardware record as ``device.*`` tags, its stack as ``device.stack``, and what the machine
    lists beside them (``device.detected``, ``device.detected_profile``, ``device.record_fits``).

    The record carries the listed SKU's figures (a 910B2 node: the 910B2's peak), so ``compare`` reads the
    machine's hardware from the run; empty for a profile without a record on a machine that lists nothing.
    """
    tags = identity.identity_tags(profile, node)
    if profile is None:
        return tags
    record = identity.run_record(profile, node)
    tags.update(record.tags() if record else {})
    if profile.stack:
        tags[device_tags.STACK_TAG] = Path(profile.stack).stem
    return tags


def node_of(fields: DeviceProfile) -> identity.Node | None:
    """The node a collected profile lists (its name, count and generation); None when it lists no accelerator."""
    return identity.node_from(fields.type, fields.name, fields.count, fields.extra.get("generation"),
                              mixed=fields.extra.get("mixed"), mig=tuple(fields.extra.get("mig") or ()),
                              memory_gb=fields.memory_gb)


def identify_node(device_type: Device | str, *, probe: Probe | None = None,
                  environ: Mapping[str, str] | None = None) -> identity.Node | None:
    """What this machine's listing tool names for ``device_type`` and which shipped profiles fit it; None if nothing."""
    dev = detect_device(device_type, probe=probe)
    return node_of(collect_device_profile(dev, probe=probe, environ=environ)) if dev.is_accelerator else None


def collect_device_profile(device_type: Device | str, *, probe: Probe | None = None,
                           environ: Mapping[str, str] | None = None, profile: Profile | None = None) -> DeviceProfile:
    """The full profile of ``device_type`` (or of the detected one for ``auto``) on this machine.

    Never fails on a missing tool or file: the field stays None and ``notes`` says what was
    missing, so ``dry_run`` on a laptop still logs a profile. ``environ`` defaults to os.environ.
    ``profile``: the run's profile, whose hardware record and stack become ``device.*`` tags too.
    """
    probe = probe or Probe()
    environ = os.environ if environ is None else environ
    device_type = detect_device(device_type, probe=probe)
    host_cpu = _host_cpu(probe)
    lists = listing.collector(device_type)
    fields = lists.fields(probe, environ) if lists else {"name": host_cpu, "count": probe.cpu_count}
    memory = re.search(r"^MemTotal:\s*(\d+)\s*kB", probe.read("/proc/meminfo") or "", re.MULTILINE)
    extra = fields.pop("extra", {})
    if memory:
        extra["host_memory_gb"] = round(int(memory.group(1)) / 1024**2, 1)
    found = DeviceProfile(type=device_type, host_arch=probe.machine, host_cpu=host_cpu,
                          software=package_versions(), env=capture_env(environ), extra=extra, **fields)
    if profile is not None:
        found.hardware = hardware_tags(profile, node_of(found))
    return found


# ----------------------------------------------------------------------------------------------
# environment and packages
# ----------------------------------------------------------------------------------------------

_ENV_NAMES = frozenset({
    "TASK_QUEUE_ENABLE", "CPU_AFFINITY_CONF", "PYTORCH_NPU_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "LD_PRELOAD", "MALLOC_CONF", "MULTI_STREAM_MEMORY_REUSE",
})
# VLLM_ covers VLLM_USE_V1 / VLLM_VERSION / VLLM_ATTENTION_BACKEND / VLLM_ASCEND_*; ASCEND_ covers
# ASCEND_RT_VISIBLE_DEVICES / ASCEND_VISIBLE_DEVICES and which CANN was sourced
_ENV_PREFIXES = ("HCCL_", "NCCL_", "GLOO_", "RAY_", "TORCH_", "TORCHINDUCTOR_", "VLLM_", "ASCEND_", "ATB_")


def capture_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowlisted performance knobs of ``environ`` (default os.environ), sorted by name.

    A name is kept when it is listed or has a listed prefix, and never when it contains a
    secret-ish word (TOKEN, KEY, SECRET, PASSWORD, AUTH, ...), whatever its prefix; a URL's
    ``user:password@`` part is masked in any value kept.
    """
    environ = os.environ if environ is None else environ
    kept = {}
    for name in sorted(environ):
        if looks_secret(name):
            continue
        upper = name.upper()
        if upper in _ENV_NAMES or upper.startswith(_ENV_PREFIXES):
            kept[name] = mask_text(environ[name])
    return kept


_PACKAGES = {
    "torch": ("torch",), "torch_npu": ("torch_npu", "torch-npu"), "transformers": ("transformers",),
    "vllm": ("vllm",), "vllm_ascend": ("vllm_ascend", "vllm-ascend"), "ray": ("ray",), "verl": ("verl",),
    "mlflow": ("mlflow", "mlflow-skinny"),
}


def package_versions() -> dict[str, str]:
    """Versions of python and of the installed packages among torch, torch_npu, transformers,
    vllm, vllm_ascend, ray, verl, mlflow — from package metadata, importing none of them."""
    versions = {"python": platform.python_version()}
    for key, dists in _PACKAGES.items():
        for dist in dists:
            try:
                versions[key] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions
