"""Ascend NPU system metrics for MLflow: a sampler on MLflow's monitor contract (collect, aggregate, clear).

    PATH=tests/fakes:$PATH FAKE_NPU_SMI_INFO=tests/fixtures/device/npu-smi-info-a3-16chip.txt \
        python -c "from verlflow.device.npu_monitor import NpuMonitor; m = NpuMonitor(); m.collect_metrics(); \
print(m.aggregate_metrics())"

MLflow samples CPU, memory, disk, network and NVIDIA/AMD GPUs but not Ascend NPUs. This monitor reads
``npu-smi info`` (parsed by :func:`verlflow.device.parsers.parse_npu_smi_info`, the parser the device
profile uses) and names what it reads as MLflow names GPU metrics, so the UI groups them alike:

    npu_<i>_utilization_percentage   AICore %                 npu_<i>_power_watts        board power
    npu_<i>_hbm_usage_megabytes      HBM used (MB)            npu_<i>_temperature_celsius
    npu_<i>_hbm_usage_percentage     HBM used / capacity

``<i>`` is the device id ``ASCEND_RT_VISIBLE_DEVICES`` uses: the Phy-ID on A3 (two chips per card,
0-15), the NPU id on A2. When set, only the chips it lists are sampled. On A3 npu-smi prints the
card's power on its first chip and ``-`` on the second: the second chip then has no power metric.
Where the table lacks a chip's AICore or HBM figure, ``npu-smi info -t usages -i <npu> -c <chip>``
fills it in (one extra call per such chip; none on a complete table).

``npu-smi`` missing or failing at start: no monitor (:meth:`NpuMonitor.start_or_none` warns once).
Failing three samples in a row: the monitor stops with one warning. It never raises into MLflow's
sampling thread, so CPU and GPU sampling — and training — go on.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Mapping, Sequence

from verlflow.device.parsers import NpuChip, parse_key_values, parse_npu_smi_info
from verlflow.platforms import Device

log = logging.getLogger(__name__)

NPU_SMI = "npu-smi"
VISIBLE_VAR = Device.NPU.visible_devices_var  # ASCEND_RT_VISIBLE_DEVICES
# Consecutive failed samples after which the monitor gives up (npu-smi can fail once under load).
MAX_FAILURES = 3
COMMAND_TIMEOUT_S = 30


class NpuSmiError(RuntimeError):
    """``npu-smi`` is missing, failed, or printed no chip table."""


def device_index(chip: NpuChip) -> int:
    """The id ``ASCEND_RT_VISIBLE_DEVICES`` uses for a chip: Phy-ID on A3, the NPU id on A2."""
    return chip.phy_id if chip.phy_id is not None else chip.npu_id


def parse_visible(spec: str | None) -> set[int] | None:
    """``"0,1, 3"`` → {0, 1, 3}; None (all chips) when unset or empty; entries that are not ids are ignored."""
    if spec is None or not spec.strip():
        return None
    return {int(part) for part in spec.split(",") if part.strip().isdigit()}


def chip_metrics(chip: NpuChip, usages: Mapping[str, str] | None = None) -> dict[str, float]:
    """The metrics of one chip (without the ``system/`` prefix), from its table row and optional usages.

    ``usages`` is the parsed ``npu-smi info -t usages`` of the chip; it is used only for what the table
    row lacks (AICore %, HBM used). A figure neither source gives is left out, never invented.
    """
    i = device_index(chip)
    out: dict[str, float] = {}
    usages = usages or {}
    aicore = chip.aicore_pct if chip.aicore_pct is not None else _float(usages.get("Aicore Usage Rate(%)"))
    if aicore is not None:
        out[f"npu_{i}_utilization_percentage"] = aicore
    used, total = chip.hbm_used_mb, chip.hbm_total_mb
    if used is None or not total:
        capacity, rate = _float(usages.get("HBM Capacity(MB)")), _float(usages.get("HBM Usage Rate(%)"))
        if capacity and rate is not None:
            used, total = capacity * rate / 100, capacity
    if used is not None and total:
        out[f"npu_{i}_hbm_usage_megabytes"] = float(used)
        out[f"npu_{i}_hbm_usage_percentage"] = round(used / total * 100, 2)
    if chip.power_w is not None:
        out[f"npu_{i}_power_watts"] = chip.power_w
    if chip.temp_c is not None:
        out[f"npu_{i}_temperature_celsius"] = chip.temp_c
    return out


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _needs_usages(chip: NpuChip) -> bool:
    return chip.aicore_pct is None or chip.hbm_used_mb is None or not chip.hbm_total_mb


def run_npu_smi(args: Sequence[str], command: str = NPU_SMI) -> str:
    """stdout of ``npu-smi <args>``; :class:`NpuSmiError` naming the cause when it is missing or fails."""
    try:
        done = subprocess.run([command, *args], capture_output=True, text=True, errors="replace",
                              timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError:
        raise NpuSmiError(f"{command} not found on PATH") from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise NpuSmiError(f"{command} {' '.join(args)} failed: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise NpuSmiError(f"{command} {' '.join(args)} exited with {done.returncode}: {said[-1] if said else ''}")
    return done.stdout


def sample_chips(visible: set[int] | None, command: str = NPU_SMI) -> dict[str, float]:
    """One sample of every visible chip: ``npu-smi info`` (plus ``-t usages`` where the table lacks a figure)."""
    chips = parse_npu_smi_info(run_npu_smi(["info"], command))
    if not chips:
        raise NpuSmiError(f"{command} info printed no chip table")
    if visible is not None:
        chips = [c for c in chips if device_index(c) in visible]
        if not chips:
            raise NpuSmiError(f"{command} info lists none of the chips {VISIBLE_VAR} names ({sorted(visible)})")
    out: dict[str, float] = {}
    for chip in chips:
        usages = None
        if _needs_usages(chip):
            text = run_npu_smi(["info", "-t", "usages", "-i", str(chip.npu_id), "-c", str(chip.chip_id)], command)
            usages = parse_key_values(text)
        out.update(chip_metrics(chip, usages))
    return out


class NpuMonitor:
    """MLflow system-metrics monitor for Ascend NPUs (see the module docstring for names and failure rules).

    It keeps MLflow's monitor contract (``BaseMetricsMonitor``: ``collect_metrics``, ``aggregate_metrics``,
    ``metrics``, ``clear_metrics``); :func:`verlflow.tracking.system_metrics.add_sampler` plugs it into MLflow's
    ``SystemMetricsMonitor``.
    """

    def __init__(self, visible: str | None = None, command: str = NPU_SMI):
        self._metrics: defaultdict[str, list[float]] = defaultdict(list)
        self.visible = parse_visible(visible)
        self.command = command
        self.failures = 0
        self.stopped = False

    @classmethod
    def start_or_none(cls, visible: str | None = None, *, expected: bool, command: str = NPU_SMI):
        """A monitor whose first sample worked, or None: with one warning when NPUs were ``expected``
        (an npu profile) and npu-smi is missing or fails; silently when it is simply absent."""
        if shutil.which(command) is None and not expected:
            return None
        monitor = cls(visible, command)
        try:
            sample_chips(monitor.visible, command)
        except NpuSmiError as exc:
            log.warning("NPU system metrics off for this run: %s", exc)
            return None
        return monitor

    def collect_metrics(self) -> None:
        """Add one sample per chip to ``self._metrics``; count failures, stop after MAX_FAILURES in a row."""
        if self.stopped:
            return
        try:
            sample = sample_chips(self.visible, self.command)
        except Exception as exc:  # a raise here would end MLflow's whole sampling thread (CPU, GPU too)
            self.failures += 1
            if self.failures >= MAX_FAILURES:
                self.stopped = True
                log.warning("NPU system metrics stopped after %d failed samples in a row: %s", self.failures, exc)
            return
        self.failures = 0
        for key, value in sample.items():
            self._metrics[key].append(value)

    def aggregate_metrics(self) -> dict[str, float]:
        """Mean of the samples since the last publish, per metric (as MLflow's GPU monitor does)."""
        return {k: round(sum(v) / len(v), 1) for k, v in self._metrics.items() if v}

    @property
    def metrics(self) -> defaultdict[str, list[float]]:
        """The samples since the last publish, per metric name."""
        return self._metrics

    def clear_metrics(self) -> None:
        """Forget the samples (MLflow's monitor calls this after each publish)."""
        self._metrics.clear()
