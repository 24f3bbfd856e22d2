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
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verlflow.config import Profile
from verlflow.device import identity
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
from verlflow.errors import VerlflowError
from verlflow.platforms import Device
from verlflow.secrets import looks_secret, mask_text

__all__ = [  # the parsers are re-exported: callers use verlflow.device.detect only
    "DEVICE_TYPES", "DeviceProfile", "Probe", "NpuChip", "GpuInfo", "detect_device", "count_visible",
    "collect_device_profile", "capture_env", "package_versions", "parse_npu_smi_info",
    "parse_npu_smi_version", "parse_nvidia_smi_query", "parse_nvidia_smi_table",
    "parse_nvidia_smi_q_versions", "parse_ascend_version_file", "parse_key_values", "soc_name",
    "npu_generation", "first_error_line", "command_failure", "lister_command", "as_device", "hardware_tags",
    "identify_node", "node_of",
]

DEVICE_TYPES = tuple(Device)
NPU_SMI_INFO = ["npu-smi", "info"]
GPU_QUERY_FIELDS = ["index", "name", "memory.total", "driver_version"]
NVIDIA_SMI_QUERY = ["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY_FIELDS)}", "--format=csv"]
NVIDIA_SMI = ["nvidia-smi"]
# MLflow's limits (mlflow.utils.validation.MAX_TAG_VAL_LENGTH / MAX_ENTITY_KEY_LENGTH)
MAX_TAG_VALUE = 8000
MAX_TAG_KEY = 250


def lister_command(dev: Device) -> list[str]:
    """The command that lists ``dev``'s devices: ``npu-smi info`` or ``nvidia-smi`` (its plain table)."""
    return NPU_SMI_INFO if dev is Device.NPU else NVIDIA_SMI


def npu_board_command(npu_id: int, chip_id: int) -> list[str]:
    """``npu-smi info -t board -i N -c C``: the chip's SoC name parts and firmware version."""
    return ["npu-smi", "info", "-t", "board", "-i", str(npu_id), "-c", str(chip_id)]


# ----------------------------------------------------------------------------------------------
# the hardware boundary
# ----------------------------------------------------------------------------------------------


def run_command(cmd: Sequence[str]) -> str | None:
    """stdout of ``cmd``, or None when it is not installed, fails, or hangs for 60 s."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def command_failure(cmd: Sequence[str]) -> str | None:
    """Why ``cmd`` gave no output to parse: not installed, or its own first error line; None when it succeeds.

    Asked only after :func:`run_command` came back empty, so a user sees npu-smi's ``dcmi model initialized
    failed ... ret is -8020`` instead of "no NPU on this machine".
    """
    if shutil.which(cmd[0]) is None:
        return f"{cmd[0]} not found on PATH"
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", timeout=60)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd)} did not answer in 60 s"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(cmd)} could not run: {exc}"
    if done.returncode == 0:
        return None
    return first_error_line(done.stderr) or first_error_line(done.stdout) or f"exit status {done.returncode}"


def read_text(path: str) -> str | None:
    """The file's text, or None when it is missing or unreadable."""
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def module_installed(name: str) -> bool:
    """Whether a top-level module is installed, found without importing it.

    Importing torch_npu fails until CANN's set_env.sh is sourced, which the launcher does for
    verl's process, not for ours; so "installed" is the honest test here.
    """
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_torch_npu() -> bool:
    """Import torch_npu (it registers ``torch.npu``); False when it is not installed.

    An installed torch_npu that fails to import (CANN's ``set_env.sh`` not sourced, a torch it was not
    built for) raises :class:`VerlflowError` with the first line of the real error, not a traceback.
    """
    if not module_installed("torch_npu"):
        return False
    try:
        import torch_npu  # noqa: F401
    except Exception as exc:  # ImportError, OSError (missing libascend*.so), RuntimeError from its init
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise VerlflowError(
            f"torch_npu is installed but fails to import ({first[:200]}): source "
            "/usr/local/Ascend/ascend-toolkit/set_env.sh, or check that torch_npu matches torch") from None
    return True


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` (the CUDA torch was built with), read from torch/version.py
    without importing torch; None for CPU / NPU builds or when torch is absent."""
    if "torch" in sys.modules:
        return getattr(getattr(sys.modules["torch"], "version", None), "cuda", None)
    spec = importlib.util.find_spec("torch")
    for location in (spec.submodule_search_locations or []) if spec else []:
        found = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]",
                          read_text(os.path.join(location, "version.py")) or "", re.MULTILINE)
        if found:
            return found.group(1)
    return None


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class Probe:
    """How this module sees the machine; the default looks at the real one.

    Tests build one with :meth:`recorded` from fixture texts: "this machine prints the A3
    ``npu-smi info`` of fixture X and has CANN file Y" is one call.
    """

    run: Callable[[Sequence[str]], str | None] = run_command
    read: Callable[[str], str | None] = read_text
    import_ok: Callable[[str], bool] = module_installed
    torch_cuda: Callable[[], str | None] = torch_cuda_version
    # why a command gave nothing (see :func:`command_failure`); asked only when ``run`` returned None
    failure: Callable[[Sequence[str]], str | None] = command_failure
    ascend_root: str = "/usr/local/Ascend"
    machine: str = field(default_factory=platform.machine)
    cpu_count: int = field(default_factory=_cpu_count)

    @classmethod
    def recorded(
        cls,
        commands: Mapping[str, str] | None = None,
        files: Mapping[str, str] | None = None,
        modules: Sequence[str] = (),
        *,
        failing: Mapping[str, str] | None = None,
        torch_cuda: str | None = None,
        machine: str = "x86_64",
        cpu_count: int = 8,
        ascend_root: str = "/usr/local/Ascend",
    ) -> Probe:
        """A machine that prints ``commands[" ".join(cmd)]`` and holds ``files[path]``; ``failing`` commands
        exit non-zero printing their recorded text; any other command is missing, any other file absent, only
        ``modules`` installed."""
        commands, files, failing = dict(commands or {}), dict(files or {}), dict(failing or {})

        def failure(cmd: Sequence[str]) -> str | None:
            line = " ".join(cmd)
            if line in failing:
                return first_error_line(failing[line]) or "exit status 1"
            return None if line in commands else f"{cmd[0]} not found on PATH"

        return cls(
            run=lambda cmd: commands.get(" ".join(cmd)),
            failure=failure,
            read=files.get,
            import_ok=lambda name: name in modules,
            torch_cuda=lambda: torch_cuda,
            ascend_root=ascend_root,
            machine=machine,
            cpu_count=cpu_count,
        )


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
        tags: dict[str, Any] = {"device.type": self.type, "device.name": self.name, "device.count": self.count}
        for key in ("memory_gb", "driver", "firmware", "cann", "cuda"):
            tags[f"device.{key}"] = getattr(self, key)
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
    if value not in DEVICE_TYPES:
        raise VerlflowError(f"unknown device {device_type!r}: use one of {', '.join(DEVICE_TYPES)}")
    return Device(value)


def detect_device(requested: Device | str = AUTO, *, probe: Probe | None = None) -> Device:
    """The device to run on: ``npu``/``gpu``/``cpu`` as given, or for ``auto`` the first of npu
    (torch_npu installed and npu-smi lists chips), gpu (nvidia-smi lists GPUs), cpu.

    The one detection order of verlflow: every step, ``evaluate`` included, asks here.
    """
    if str(requested).strip().lower() != AUTO:
        try:
            return as_device(requested)
        except VerlflowError:
            valid = ", ".join((AUTO, *DEVICE_TYPES))
            raise VerlflowError(f"unknown device {requested!r}: use one of {valid}") from None
    probe = probe or Probe()
    if probe.import_ok("torch_npu") and count_visible(Device.NPU, probe=probe) > 0:
        return Device.NPU
    return Device.GPU if count_visible(Device.GPU, probe=probe) > 0 else Device.CPU


def _visible(total: int, device_type: Device, environ: Mapping[str, str]) -> tuple[int, str | None]:
    var = device_type.visible_devices_var
    if var is None or var not in environ:
        return total, None
    count = min(total, len([e for e in environ[var].split(",") if e.strip()]))
    return count, (f"{var}={environ[var]} shows {count} of {total}" if count != total else None)


def _list_gpus(probe: Probe) -> list[GpuInfo]:
    gpus = parse_nvidia_smi_query(probe.run(NVIDIA_SMI_QUERY) or "", GPU_QUERY_FIELDS)
    return gpus or parse_nvidia_smi_table(probe.run(NVIDIA_SMI) or "")["gpus"]


def count_visible(device_type: Device | str, *, probe: Probe | None = None,
                  environ: Mapping[str, str] | None = None) -> int:
    """How many devices of this type the process can use (0 when absent), so preflight can
    refuse a missing device. NPU counts chips (16 on an A3 node), narrowed by
    ``ASCEND_RT_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES`` when set."""
    device_type = as_device(device_type)
    probe = probe or Probe()
    environ = os.environ if environ is None else environ
    if device_type is Device.CPU:
        return probe.cpu_count
    if device_type is Device.NPU:
        total = len(parse_npu_smi_info(probe.run(NPU_SMI_INFO) or ""))
    else:
        total = len(_list_gpus(probe))
    return _visible(total, device_type, environ)[0]


def _gib(mib: float | None) -> float | None:
    return round(mib / 1024, 1) if mib else None


def _first_version(probe: Probe, paths: Sequence[str]) -> tuple[dict[str, str], str | None]:
    for path in paths:
        info = parse_ascend_version_file(probe.read(path) or "")
        if info.get("version"):
            return info, path
    return {}, None


def _npu_fields(probe: Probe, environ: Mapping[str, str]) -> dict[str, Any]:
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
    count, narrowed = _visible(len(chips), Device.NPU, environ)
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
    }
    return {
        "name": name,
        "count": count,
        "memory_gb": _gib(chips[0].hbm_total_mb) if chips else None,
        "driver": driver.get("version") or banner.get("driver"),  # npu-smi's banner is the driver
        "firmware": firmware_version,
        "cann": cann.get("version"),
        "notes": notes + ([narrowed] if narrowed else []),
        "extra": {k: v for k, v in extra.items() if v is not None},
    }


def _gpu_fields(probe: Probe, environ: Mapping[str, str]) -> dict[str, Any]:
    gpus = _list_gpus(probe)
    table = parse_nvidia_smi_table(probe.run(NVIDIA_SMI) or "")  # driver's CUDA, not in the query
    notes = [] if gpus else ["nvidia-smi not found (or it failed) or lists no GPU"]
    if len({g.name for g in gpus}) > 1:
        notes.append("mixed GPUs: " + ", ".join(sorted({g.name for g in gpus})))
    count, narrowed = _visible(len(gpus), Device.GPU, environ)
    cuda = probe.torch_cuda()
    if cuda is None and table["cuda"]:
        cuda = table["cuda"]
        notes.append("torch has no CUDA build here: device.cuda is the driver's newest CUDA (nvidia-smi)")
    extra = {"cuda_driver_max": table["cuda"], "gpus": [asdict(g) for g in gpus]}
    return {
        "name": gpus[0].name if gpus else "unknown",
        "count": count,
        "memory_gb": _gib(gpus[0].memory_total_mb) if gpus else None,
        "driver": (gpus[0].driver_version if gpus else None) or table["driver"],
        "cuda": cuda,
        "notes": notes + ([narrowed] if narrowed else []),
        "extra": {k: v for k, v in extra.items() if v is not None},
    }


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
        tags["device.stack"] = Path(profile.stack).stem
    return tags


def node_of(fields: DeviceProfile) -> identity.Node | None:
    """The node a collected profile lists (its name, count and generation); None when it lists no accelerator."""
    return identity.node_from(fields.type, fields.name, fields.count, fields.extra.get("generation"))


def identify_node(device_type: Device | str, *, probe: Probe | None = None,
                  environ: Mapping[str, str] | None = None) -> identity.Node | None:
    """What this machine's listing tool names for ``device_type`` and which shipped profiles fit it; None if nothing."""
    dev = detect_device(device_type, probe=probe)
    return None if dev is Device.CPU else node_of(collect_device_profile(dev, probe=probe, environ=environ))


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
    if device_type is Device.NPU:
        fields = _npu_fields(probe, environ)
    elif device_type is Device.GPU:
        fields = _gpu_fields(probe, environ)
    else:
        fields = {"name": host_cpu, "count": probe.cpu_count}
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
