"""Run by tests/test_ray_isolation.py inside a pytest session of two xdist workers; not collected on its own.

Each of the two tests runs on its own worker and, while the other worker holds a cluster of its own, starts a
Ray head the way a user does before a multi-node launch (``ray start --head`` with no ``--temp-dir``), then
checks that everything that finds a cluster without being given its address reaches this worker's: a
``ray.init()`` with no address (verl's ``main_ppo``), verlflow's node listing (the preflight's
``cluster_nodes(None)``), the node samplers' address, and a job submitted through the job API. Each head
carries a resource named after its worker, so anything that reached the other worker's cluster shows its name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import free_port

DEADLINE_S = 600  # two Ray heads with dashboards starting side by side on 2 busy cores


def _wait_for(condition, what: str, head: subprocess.Popen | None = None):
    deadline = time.monotonic() + DEADLINE_S
    while not (got := condition()):
        if head is not None and head.poll() is not None:
            pytest.fail(f"{what}: the Ray head exited ({head.returncode})")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {DEADLINE_S} s")
        time.sleep(0.5)
    return got


def _both(rendezvous: Path, stage: str) -> list[str]:
    found = sorted(p.name for p in rendezvous.glob(f"{stage}-*"))
    return found if len(found) == 2 else []


@pytest.mark.parametrize("probe", ["first", "second"])
def test_a_worker_reaches_only_its_own_ray_cluster(probe):
    import ray
    from ray.job_submission import JobStatus, JobSubmissionClient

    from verlflow.backends.verl.node_sampler import sampler_address
    from verlflow.backends.verl.ray_cluster import cluster_nodes, joined_address

    worker = os.environ["PYTEST_XDIST_WORKER"]
    mine = f"probe_{worker}"
    rendezvous = Path(os.environ["VERLFLOW_PROBE_DIR"])
    dashboard = free_port()
    head = subprocess.Popen(
        ["ray", "start", "--head", "--block", "--port", str(free_port()), "--num-cpus", "1", "--disable-usage-stats",
         "--resources", json.dumps({mine: 1}), "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
         "--dashboard-port", str(dashboard), "--ray-client-server-port", str(free_port()),
         "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        address = _wait_for(joined_address, "this worker's `ray start` recorded for ray.init()", head)
        (rendezvous / f"up-{worker}").write_text(address)
        _wait_for(lambda: _both(rendezvous, "up"), "the other worker's cluster up at the same time", head)

        ray.init(log_to_driver=False)  # as verl's main_ppo: no address
        try:
            assert sorted(k for k in ray.cluster_resources() if k.startswith("probe_")) == [mine]
        finally:
            ray.shutdown()
        listed = [sorted(k for k in node.resources if k.startswith("probe_")) for node in cluster_nodes(None)]
        assert listed == [[mine]], listed
        assert sampler_address("", 2) == address

        jobs = JobSubmissionClient(f"http://127.0.0.1:{dashboard}")
        job = jobs.submit_job(entrypoint="python -c \"import ray; ray.init(); "
                                         "print('resources:', sorted(ray.cluster_resources()))\"")
        _wait_for(lambda: jobs.get_job_status(job) in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED},
                  "the probe job's end", head)
        logs = jobs.get_job_logs(job)
        assert jobs.get_job_status(job) == JobStatus.SUCCEEDED, logs
        assert f"'{mine}'" in logs and logs.count("'probe_") == 1, logs

        (rendezvous / f"done-{worker}").write_text(probe)
        _wait_for(lambda: _both(rendezvous, "done"), "the other worker's checks done while both clusters ran", head)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
