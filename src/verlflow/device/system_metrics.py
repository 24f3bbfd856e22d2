"""System metrics for a whole train run: MLflow's own monitors plus the Ascend NPU monitor.

    verlflow train --device cpu --overrides "verlflow.system_metrics_interval=1"

MLflow's :class:`~mlflow.system_metrics.system_metrics_monitor.SystemMetricsMonitor` samples CPU,
memory, disk, network and (with ``nvidia-ml-py``) NVIDIA GPUs in a thread of this process and logs
``system/*`` metrics into the run. :func:`recording` runs one (built by :mod:`verlflow.tracking.system_metrics`,
the bridge to MLflow) for the duration of a train step and adds
:class:`verlflow.device.npu_monitor.NpuMonitor` to its list of monitors when ``npu-smi`` answers. For verl
launches verlflow's process stays alive while verl trains, so the sampling covers the machine verlflow
runs on: the training node for a local launch, the submitting machine for a Ray job (run the train step
on the head node to sample it; other nodes are not sampled).

The interval is the recipe key ``verlflow.system_metrics_interval`` (seconds, default 10; 0 turns system
metrics off); MLflow's ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` wins over it, as MLflow documents.
Nothing here can stop training: a monitor that cannot start is logged as a warning and skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from verlflow.config import VerlflowBlock
from verlflow.device.npu_monitor import VISIBLE_VAR, NpuMonitor
from verlflow.errors import VerlflowError
from verlflow.names import SYSTEM_METRICS_INTERVAL_TAG, SYSTEM_METRICS_TAG
from verlflow.outage.store_retry import LockRetryingClient
from verlflow.platforms import Device
from verlflow.tracking import system_metrics as bridge

log = logging.getLogger(__name__)

INTERVAL_KEY = "system_metrics_interval"
DEFAULT_INTERVAL_S = VerlflowBlock.system_metrics_interval


def sampling_interval(block: Mapping[str, Any]) -> float | None:
    """Seconds between samples from a recipe's ``verlflow:`` block; None when set to 0 (off).

    A value that is not a number >= 0 is one clear error before anything is launched.
    """
    raw = block.get(INTERVAL_KEY, DEFAULT_INTERVAL_S)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if isinstance(raw, bool) or not value >= 0:
        raise VerlflowError(f"verlflow.{INTERVAL_KEY} must be seconds >= 0 (0 = no system metrics), got '{raw}'")
    return value or None


@contextlib.contextmanager
def recording(
    run_id: str,
    *,
    interval: float | None,
    device: Device | str,
    environ: Mapping[str, str] | None = None,
) -> Iterator[Any]:
    """Sample system metrics into ``run_id`` every ``interval`` seconds while the block runs.

    ``device`` is the profile's device: on ``npu`` a missing or failing ``npu-smi`` is warned about; on
    other devices the NPU monitor is added only where ``npu-smi`` exists. ``environ`` (default: this
    process's) gives ``ASCEND_RT_VISIBLE_DEVICES``. Yields the running monitor, or None when off.
    """
    if interval is None:
        yield None
        return
    environ = os.environ if environ is None else environ
    try:
        monitor = bridge.run_monitor(run_id, interval=interval)
    except Exception as exc:  # psutil missing or broken: train without system metrics
        log.warning("system metrics off for this run: %s", exc)
        yield None
        return
    npu = NpuMonitor.start_or_none(environ.get(VISIBLE_VAR), expected=Device(device) is Device.NPU)
    if npu is not None:
        bridge.add_sampler(monitor, npu)
    bridge.retry_writes_on_lock(monitor)
    client = LockRetryingClient()
    client.set_tag(run_id, SYSTEM_METRICS_INTERVAL_TAG, f"{float(monitor.sampling_interval):g}")
    client.set_tag(run_id, SYSTEM_METRICS_TAG, ",".join(bridge.monitor_names(monitor)))
    monitor.start()
    try:
        yield monitor
    finally:
        monitor.finish()

