"""The system-metrics bridge: MLflow's own ``SystemMetricsMonitor`` started for a run, and verlflow's samplers
(the Ascend NPU's, :class:`verlflow.device.npu_monitor.NpuMonitor`) plugged into it.

    python -c "from verlflow.tracking import system_metrics; help(system_metrics.run_monitor)"

What is sampled and how often is :mod:`verlflow.device.system_metrics`'s business (and, per Ray node,
:mod:`verlflow.backends.verl.node_sampler`'s); this module is the one place that builds MLflow's monitor and
fits a sampler to MLflow's monitor contract (``BaseMetricsMonitor``). MLflow is imported inside each function.
"""

from __future__ import annotations

from typing import Any


def run_monitor(run_id: str, *, interval: float, node_id: str | None = None) -> Any:
    """MLflow's ``SystemMetricsMonitor`` for ``run_id`` every ``interval`` seconds, not started yet.

    ``resume_logging``: a resumed run continues its ``system/*`` steps instead of overwriting them. ``node_id``
    (a Ray node's label) makes the keys ``system/<node_id>/*``, MLflow's convention for several nodes.
    """
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    if node_id is None:
        return SystemMetricsMonitor(run_id, sampling_interval=interval, resume_logging=True)
    return SystemMetricsMonitor(run_id, sampling_interval=interval, resume_logging=True, node_id=node_id)


def node_monitor(run_id: str, *, node_id: str, tracking_uri: str, interval: float) -> Any:
    """:func:`run_monitor` for one node, in a process of its own (a Ray actor) that logs to ``tracking_uri``.

    The URI is set process-wide, which every MLflow 3 has (the monitor's own ``tracking_uri`` argument is
    MLflow >= 3.7 only).
    """
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    return run_monitor(run_id, interval=interval, node_id=node_id)


def add_sampler(system_monitor: Any, sampler: Any) -> None:
    """Plug ``sampler`` into ``system_monitor``, fitted to MLflow's ``BaseMetricsMonitor``: ``collect_metrics()``
    adds a sample, ``metrics`` holds them by name, ``aggregate_metrics()`` returns their means,
    ``clear_metrics()`` forgets them.

    ``monitors`` is a public attribute of MLflow's class (its constructor fills it with the CPU, disk,
    network and GPU monitors); every sample walks it, so an appended monitor is sampled and published
    like MLflow's own.
    """
    system_monitor.monitors.append(_fitted(sampler))


def monitor_names(system_monitor: Any) -> list[str]:
    """Short names of the monitors a SystemMetricsMonitor runs (``cpu``, ``disk``, ``network``, ``gpu``, ``npu``)."""
    return [type(getattr(m, "sampler", m)).__name__.removesuffix("Monitor").lower() for m in system_monitor.monitors]


def retry_writes_on_lock(system_monitor: Any) -> None:
    """MLflow's monitor stops for good at its first failed write: its writes wait out another run's lock."""
    from verlflow.compat.mlflow import replace_monitor_client
    from verlflow.outage.store_retry import LockRetryingClient

    replace_monitor_client(system_monitor, LockRetryingClient)


def _fitted(sampler: Any) -> Any:
    """``sampler`` behind MLflow's ``BaseMetricsMonitor`` (the contract its sampling thread calls)."""
    from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor

    class FittedSampler(BaseMetricsMonitor):
        def __init__(self) -> None:
            super().__init__()
            self.sampler = sampler
            self._metrics = sampler.metrics  # MLflow's monitor reads the samples there, by this name

        def collect_metrics(self) -> None:
            sampler.collect_metrics()

        def aggregate_metrics(self) -> dict[str, float]:
            return sampler.aggregate_metrics()

        def clear_metrics(self) -> None:
            sampler.clear_metrics()

    return FittedSampler()
