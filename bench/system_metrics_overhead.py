"""What system-metrics sampling costs: CPU seconds per sample, as a share of one core at the interval.

    python bench/system_metrics_overhead.py                  # fake npu-smi replaying an A3 16-chip table
    python bench/system_metrics_overhead.py --real-npu-smi   # on an Ascend node: the npu-smi on PATH
    python bench/system_metrics_overhead.py --samples 100 --interval 10

One sample is what MLflow's sampling thread does every interval: every monitor's collect_metrics
(MLflow's CPU, disk, network and — with nvidia-ml-py on a GPU node — GPU monitors, plus verlflow's NPU
monitor), aggregate, publish into a real SQLite run, and the run-status check. The samples run back to
back; their CPU time (this process, plus the npu-smi child processes, shown apart) divided by the
interval is the share of a core that sampling takes during training.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
A3_TABLE = REPO / "tests" / "fixtures" / "device" / "npu-smi-info-a3-16chip.txt"


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples in a run (default 10)")
    parser.add_argument("--real-npu-smi", action="store_true", help="use the npu-smi on PATH, not the fake")
    args = parser.parse_args()

    if not args.real_npu_smi:
        os.environ["PATH"] = f"{REPO / 'tests' / 'fakes'}:{os.environ['PATH']}"
        os.environ["FAKE_NPU_SMI_INFO"] = str(A3_TABLE)
    tmp = tempfile.mkdtemp(prefix="verlflow-bench-")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"

    import mlflow
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    from mlflow.tracking import MlflowClient

    from verlflow.device.npu_monitor import NpuMonitor
    from verlflow.tracking import system_metrics

    with mlflow.start_run() as run:
        monitor = SystemMetricsMonitor(run.info.run_id, sampling_interval=args.interval)
        npu = NpuMonitor.start_or_none(os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), expected=True)
        if npu is not None:
            system_metrics.add_sampler(monitor, npu)
        client = MlflowClient()

        def one_sample() -> None:
            monitor.collect_metrics()
            client.get_run(run.info.run_id)  # the status check MLflow's loop makes after every sample
            monitor.publish_metrics(monitor.aggregate_metrics())

        one_sample()  # warm-up: imports, first store access
        own0, kids0, wall0 = time.process_time(), children_cpu_s(), time.perf_counter()
        for _ in range(args.samples):
            one_sample()
        own = (time.process_time() - own0) / args.samples
        kids = (children_cpu_s() - kids0) / args.samples
        wall = (time.perf_counter() - wall0) / args.samples
        monitor.mlflow_logger.flush()
        logged = len(client.get_run(run.info.run_id).data.metrics)

    names = ",".join(system_metrics.monitor_names(monitor))
    source = "npu-smi on PATH" if args.real_npu_smi else f"fake npu-smi replaying {A3_TABLE.name}"
    print(f"monitors: {names} ({source}); {logged} system metrics per sample; {args.samples} samples")
    print(f"per sample: {own * 1000:.1f} ms CPU in this process, {kids * 1000:.1f} ms CPU in npu-smi, "
          f"{wall * 1000:.1f} ms wall")
    share = (own + kids) / args.interval * 100
    print(f"overhead at a {args.interval:g} s interval: {share:.3f}% of one CPU core "
          f"({own / args.interval * 100:.3f}% in-process + {kids / args.interval * 100:.3f}% npu-smi)")


if __name__ == "__main__":
    sys.exit(main())
