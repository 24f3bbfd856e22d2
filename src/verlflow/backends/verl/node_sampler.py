"""Every node of a Ray cluster sampled: one MLflow system-metrics monitor per alive node, as a Ray actor.

    pytest tests/test_node_sampler.py -m slow      # a two-node local Ray cluster, metrics from both nodes

verlflow's own monitor (:mod:`verlflow.device.system_metrics`) samples only the machine verlflow runs on;
in a multi-node verl launch (``trainer.nnodes > 1`` on the Ray cluster verl joins from here) the training
happens on the other nodes too. The train step wraps such a launch in :func:`sampling_nodes`.
:func:`start_node_samplers` connects to the cluster as a Ray driver and places one :class:`NodeSampler`
actor on each alive node (``NodeAffinitySchedulingStrategy``, ``num_cpus=0``: it takes none of the resources
verl's placement groups ask for). Each actor runs MLflow's own ``SystemMetricsMonitor`` with ``node_id`` set,
so the run gets MLflow's node-id convention: ``system/<node>/cpu_utilization_percentage``,
``system/<node>/gpu_0_utilization_percentage``, … where ``<node>`` is the node's IP and the first 8 hex digits
of its Ray node id (two nodes on one machine differ).

Off the critical path: the monitors run in the actors' own processes and log straight to the tracking
store; verl never waits on them. They stop with the run: :meth:`NodeSamplers.stop` (called however the
launch ends) kills the actors, and as ordinary (non-detached) actors of this driver they also die when
verlflow's process does. A cluster that cannot be joined is a warning, never a failed training.

A Ray job (``-P ray_address=http://<head>:8265``) is sampled from inside the cluster: the submitting machine
reaches the dashboard's HTTP port, not necessarily the GCS port a Ray driver needs. The job's entrypoint
(:func:`job_sampler_line`, composed by :func:`verlflow.backends.verl.launch.ray_job_spec`) starts
``python3 -m verlflow.backends.verl.node_sampler`` in the background on the head, right before it ``exec``s
verl; that process joins the job's cluster (``RAY_ADDRESS``, set by Ray for every job) and runs
:func:`start_node_samplers` with the run and tracking URI of the job's runtime env. verlflow's code reaches
the head as the job's ``py_modules`` (uploaded through the dashboard like any job package). The sampler
process stops the samplers when verl's process ends (it is that process's child: its parent changes),
crash included, and on SIGTERM, which Ray's ``stop_job`` sends to the entrypoint and all its children.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verlflow import stopping
from verlflow.backends.verl.ray_cluster import joined_address

log = logging.getLogger(__name__)

ACTOR_NAME_PREFIX = "verlflow-node-sampler"
# Run with ``python -m`` by a Ray job's entrypoint (``__name__`` is ``__main__`` there).
JOB_MODULE = "verlflow.backends.verl.node_sampler"


class NodeSampler:
    """Ray actor body: MLflow's ``SystemMetricsMonitor`` for one node, logging ``system/<node_id>/*``."""

    def __init__(self, run_id: str, *, node_id: str, tracking_uri: str, interval_s: float):
        from verlflow.tracking.system_metrics import node_monitor

        # The actor is a process of its own: it logs to tracking_uri; a resumed run's samples continue after the
        # steps it already has.
        self.monitor = node_monitor(run_id, node_id=node_id, tracking_uri=tracking_uri, interval=interval_s)
        self.monitor.start()

    def node_id(self) -> str:
        """The node id this sampler logs under (answers once the monitor has started)."""
        return self.monitor.node_id

    def stop(self) -> None:
        """Stop sampling and flush what is buffered."""
        self.monitor.finish()


def node_label(ip: str, ray_node_id: str) -> str:
    """``<ip>_<8 hex>``: readable, and distinct for two Ray nodes on one machine."""
    return f"{ip}_{ray_node_id[:8]}"


@dataclass
class NodeSamplers:
    """The running samplers of one launch: their node labels and actor handles."""

    labels: list[str] = field(default_factory=list)
    actors: list[Any] = field(default_factory=list)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Flush and kill every sampler actor, then leave the cluster; safe to call more than once."""
        import ray

        if self.actors:
            try:
                ray.wait([a.stop.remote() for a in self.actors], num_returns=len(self.actors), timeout=timeout_s)
            except Exception as exc:  # an actor whose node died: killing it below is all that is left
                log.warning("node samplers: flushing failed: %s", exc)
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
        self.actors = []
        if ray.is_initialized():
            ray.shutdown()


def start_node_samplers(run_id: str, *, address: str, tracking_uri: str, interval_s: float,
                        namespace: str = "verlflow") -> NodeSamplers | None:
    """One :class:`NodeSampler` per alive node of the Ray cluster at ``address`` (``auto``: the one found here).

    Returns the samplers (stop them with :meth:`NodeSamplers.stop`), or None with a warning when the cluster
    cannot be joined or the actors cannot be placed: sampling is evidence, never a reason to stop training.
    """
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # By value: the actor class need not be importable on the other nodes (verlflow may not be there).
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        _joining(lambda: ray.init(address=address, namespace=namespace, log_to_driver=False,
                                  ignore_reinit_error=True, logging_level=logging.WARNING))
        remote = ray.remote(num_cpus=0, max_restarts=0)(NodeSampler)
        samplers = NodeSamplers()
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            label = node_label(node["NodeManagerAddress"], node["NodeID"])
            strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
            samplers.actors.append(remote.options(scheduling_strategy=strategy,
                                                  name=f"{ACTOR_NAME_PREFIX}-{run_id}-{label}").remote(
                run_id, node_id=label, tracking_uri=tracking_uri, interval_s=interval_s))
            samplers.labels.append(label)
    except Exception as exc:
        log.warning("node samplers off for this run: %s", exc)
        _leave_cluster()
        return None
    print(f"verlflow: sampling system metrics on {len(samplers.labels)} Ray node(s): {', '.join(samplers.labels)}",
          flush=True)
    return samplers


def _joining(join: Callable[[], Any]) -> None:
    """``join()`` with the stop signals' handlers kept as they were: ``ray.init`` replaces the SIGTERM handler
    with ``sys.exit``, which would bypass verlflow's handling of a stopped run (the launch forwards SIGTERM to
    verl, the run ends KILLED)."""
    with stopping.handlers_kept():
        join()


def _leave_cluster() -> None:
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # nothing joined, nothing to leave
        pass


@contextlib.contextmanager
def sampling_nodes(run_id: str, *, address: str | None, tracking_uri: str,
                   interval_s: float | None) -> Iterator[NodeSamplers | None]:
    """Node samplers for the block's duration (none when ``address`` or ``interval_s`` is None), stopped however
    the block ends: the launch hook around a verl launch on Ray."""
    samplers = None
    if address and interval_s:
        samplers = start_node_samplers(run_id, address=address, tracking_uri=tracking_uri, interval_s=interval_s)
    try:
        yield samplers
    finally:
        if samplers is not None:
            try:
                samplers.stop()
            except Exception as exc:  # the cluster went away with the run: its actors went with it
                log.warning("node samplers: stopping failed: %s", exc)


def sampler_address(ray_address: str, nnodes: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """Where to start node samplers for a verl launch, or None when there are none to start.

    A local multi-node launch (``trainer.nnodes > 1`` without ``ray_address``) joins the cluster verl's own
    ``ray.init()`` joins from here (``RAY_ADDRESS``, else the latest ``ray start`` on this machine:
    :func:`~verlflow.backends.verl.ray_cluster.joined_address`); None when there is none. A Ray job
    (``ray_address``, the dashboard's HTTP address) gets none from here: a driver would need the head's GCS or
    Ray Client port, which the dashboard address does not give; its entrypoint starts them on the cluster
    (:func:`job_sampler_line`).
    """
    environ = os.environ if environ is None else environ
    if ray_address:
        return None
    try:
        several = int(nnodes) > 1
    except (TypeError, ValueError):
        several = False
    return joined_address(environ) if several else None


def job_sampler_line(python: str, interval_s: float) -> str:
    """The Ray job entrypoint's line that samples every node of the job's cluster while verl runs.

    Backgrounded (verl never waits on it) and given the script's own PID (``$$``), which ``exec`` hands to verl:
    the sampler process is that PID's child and stops its samplers when its parent changes.
    """
    return f"{shlex.quote(python)} -m {JOB_MODULE} --interval {interval_s:g} --parent $$ &"


def sample_until_parent_ends(parent: int, *, interval_s: float, environ: Mapping[str, str] | None = None,
                             poll_s: float = 1.0) -> int:
    """Sample every node of the cluster this process is in until ``parent`` is no longer its parent, or SIGTERM.

    The run and the store come from the job's environment (``MLFLOW_RUN_ID``, ``MLFLOW_TRACKING_URI``), the
    cluster from ``RAY_ADDRESS`` (Ray sets it for a job's entrypoint). Returns 0 in every case: a failure to
    sample is a warning in the job's log, never a failed job.
    """
    environ = os.environ if environ is None else environ
    run_id, tracking_uri = environ.get("MLFLOW_RUN_ID"), environ.get("MLFLOW_TRACKING_URI")
    if not run_id or not tracking_uri:
        print("verlflow: node samplers off: MLFLOW_RUN_ID / MLFLOW_TRACKING_URI not in the job's environment",
              file=sys.stderr, flush=True)
        return 0
    with stopping.installed():
        samplers = start_node_samplers(run_id, address=environ.get("RAY_ADDRESS") or "auto",
                                       tracking_uri=tracking_uri, interval_s=interval_s)
        if samplers is None:
            return 0
        while os.getppid() == parent and not stopping.STOP.wait(poll_s):
            pass
        why = "signalled" if stopping.STOP.is_set() else "verl ended"
        try:
            samplers.stop()
        except Exception as exc:  # the cluster went away with the run: its actors went with it
            log.warning("node samplers: stopping failed: %s", exc)
        print(f"verlflow: node samplers stopped ({why})", flush=True)
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verlflow.backends.verl.node_sampler --interval S --parent PID``: a Ray job's node samplers."""
    parser = argparse.ArgumentParser(prog=f"python -m {JOB_MODULE}", description=main.__doc__)
    parser.add_argument("--interval", type=float, required=True, help="seconds between samples")
    parser.add_argument("--parent", type=int, required=True, help="sample while this PID is our parent")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="verlflow: %(message)s")
    return sample_until_parent_ends(args.parent, interval_s=args.interval)


__all__: Sequence[str] = ["NodeSampler", "NodeSamplers", "node_label", "start_node_samplers", "sampling_nodes",
                            "sampler_address", "job_sampler_line", "sample_until_parent_ends"]


if __name__ == "__main__":
    sys.exit(main())
