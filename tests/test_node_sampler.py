"""Every node of a Ray cluster sampled: a two-node local cluster logs system metrics under two node ids, from
verlflow's own driver (a local multi-node launch) and from a Ray job's entrypoint line alike.

    pytest tests/test_node_sampler.py -q

The cluster is real: ``ray start --head`` and a second ``ray start --address=<head>`` on this machine (its own
Ray node id), each ``--block``ed in its own process group and killed afterwards. No dashboard: the samplers
are found by their actor names through Ray's driver API.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from conftest import free_port, local_ray, wait_until
from mlflow.tracking import MlflowClient

from verlflow.backends.verl.node_sampler import ACTOR_NAME_PREFIX, sampler_address, start_node_samplers

CPU_NAME = "cpu_utilization_percentage"


def _ray_start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        ["ray", "start", "--block", "--num-cpus", "1", "--disable-usage-stats", "--dashboard-agent-listen-port",
         str(free_port()), "--metrics-export-port", str(free_port()), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _alive_nodes(address: str) -> int:
    """Alive nodes of the cluster, 0 while it cannot be joined yet (only ever called in the token-auth process)."""
    import ray

    try:
        ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
    except ConnectionError:
        return 0
    try:
        return sum(1 for n in ray.nodes() if n.get("Alive"))
    finally:
        ray.shutdown()


@pytest.fixture
def two_node_cluster():
    """GCS address of a fresh two-node local Ray cluster; both nodes' process groups killed afterwards."""
    if shutil.which("ray") is None:
        pytest.fail("the ray CLI is not installed: pip install -e '.[dev]' (verl brings ray)")
    with local_ray("vfns") as (temp, procs):
        address = f"127.0.0.1:{free_port()}"
        procs.append(_ray_start(["--head", "--port", address.split(":")[1], "--node-ip-address", "127.0.0.1",
                                 "--include-dashboard", "false", "--ray-client-server-port", str(free_port()),
                                 "--temp-dir", temp]))
        wait_until(lambda: _gcs_answers(address), 300, "the Ray head's GCS port", poll_s=1, watch=procs)
        procs.append(_ray_start(["--address", address, "--node-ip-address", "127.0.0.1"]))
        # Both nodes are awaited in the test's own process (check_two_nodes): joining from this one would use
        # whatever auth mode Ray was first imported with here.
        yield address


def _gcs_answers(address: str) -> bool:
    host, port = address.split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def _node_ids_with_cpu_metrics(client: MlflowClient, run_id: str) -> set[str]:
    keys = client.get_run(run_id).data.metrics
    return {k.split("/")[1] for k in keys
            if k.startswith("system/") and k.endswith(f"/{CPU_NAME}") and k.count("/") == 2}


def _sampler_actors_alive(address: str, run_id: str, labels: list[str]) -> list[str]:
    import ray

    ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
    alive = []
    try:
        for label in labels:
            try:
                ray.get_actor(f"{ACTOR_NAME_PREFIX}-{run_id}-{label}", namespace="verlflow")
                alive.append(label)
            except ValueError:
                pass
    finally:
        ray.shutdown()
    return alive


def check_two_nodes(address: str, tracking_uri: str) -> None:
    """The test's body, run in a fresh process: Ray reads RAY_AUTH_MODE once, when it is first imported, and
    earlier tests of this session have imported it (through verl) without the token mode the cluster uses."""
    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri)
    wait_until(lambda: _alive_nodes(address) >= 2, 300, "two alive Ray nodes", poll_s=1)
    on_sigterm = signal.getsignal(signal.SIGTERM)
    with mlflow.start_run() as run:
        run_id = run.info.run_id
        samplers = start_node_samplers(run_id, address=address, tracking_uri=tracking_uri, interval_s=1)
        assert samplers is not None
        assert signal.getsignal(signal.SIGTERM) is on_sigterm  # joining Ray left verlflow's SIGTERM handling alone
        try:
            assert len(set(samplers.labels)) == 2, samplers.labels
            wait_until(lambda: _node_ids_with_cpu_metrics(client, run_id) >= set(samplers.labels), 300,
                       f"system/<node>/{CPU_NAME} from both nodes {samplers.labels}", poll_s=1)
        finally:
            samplers.stop()
        labels = samplers.labels
    # The run's own (unscoped) system/* keys are not these: only the samplers wrote node-scoped keys.
    assert _node_ids_with_cpu_metrics(client, run_id) == set(labels)
    wait_until(lambda: not _sampler_actors_alive(address, run_id, labels), 120, "sampler actors gone", poll_s=1)
    print("TWO_NODES_OK", sorted(labels))


def check_job_sampler(address: str, tracking_uri: str, log_path: str) -> None:
    """A Ray job entrypoint's sampler line, run as the entrypoint runs it (backgrounded, then ``exec`` of "verl",
    here ``sleep``), samples both nodes until "verl" is killed, then stops. Run in a fresh token-auth process."""
    from verlflow.backends.verl.node_sampler import job_sampler_line

    client = MlflowClient(tracking_uri)
    # A second node joins slowly when busy.
    wait_until(lambda: _alive_nodes(address) >= 2, 600, "two alive Ray nodes", poll_s=1)
    run_id = client.create_run(client.get_experiment_by_name("Default").experiment_id).info.run_id
    script = f"{job_sampler_line(sys.executable, 1)}\nexec sleep 900\n"
    env = {**os.environ, "RAY_ADDRESS": address, "MLFLOW_RUN_ID": run_id, "MLFLOW_TRACKING_URI": tracking_uri}
    with open(log_path, "w") as log:
        verl = subprocess.Popen(["bash", "-c", script], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        labels = wait_until(lambda: got if len(got := _node_ids_with_cpu_metrics(client, run_id)) >= 2 else None,
                            300, f"system/<node>/{CPU_NAME} from both nodes", poll_s=1)
        assert _sampler_actors_alive(address, run_id, sorted(labels)) == sorted(labels)
    finally:
        verl.kill()  # "verl" dies without a word; the sampler is left to notice
        verl.wait()
    wait_until(lambda: "node samplers stopped (verl ended)" in Path(log_path).read_text(), 120, "the sampler stopping",
               poll_s=1)
    wait_until(lambda: not _sampler_actors_alive(address, run_id, sorted(labels)), 120, "sampler actors gone", poll_s=1)
    print("JOB_SAMPLER_OK", sorted(labels))


def _in_token_process(check: str, *args: str) -> subprocess.CompletedProcess:
    """``test_node_sampler.<check>(*args)`` in a fresh process: Ray reads RAY_AUTH_MODE once, when first imported,
    and earlier tests of this session have imported it (through verl) without the token mode the cluster uses."""
    script = f"import sys; sys.path.insert(0, sys.argv[1]); import test_node_sampler as t; t.{check}(*sys.argv[2:])"
    return subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), *args],
                          capture_output=True, text=True, timeout=1500, env={**os.environ, "RAY_AUTH_MODE": "token"})


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a two-node cluster on a busy 2-core machine
def test_each_node_of_a_two_node_cluster_logs_system_metrics_under_its_own_node_id(tracking_uri, two_node_cluster):
    done = _in_token_process("check_two_nodes", two_node_cluster, tracking_uri)
    assert done.returncode == 0 and "TWO_NODES_OK" in done.stdout, (done.stdout + done.stderr)[-4000:]
    labels = done.stdout.rpartition("TWO_NODES_OK ")[2].strip()
    assert labels.count("_") >= 2  # two distinct <ip>_<ray node id> labels


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_ray_jobs_sampler_covers_every_node_and_stops_when_verl_dies(tracking_uri, two_node_cluster, tmp_path):
    done = _in_token_process("check_job_sampler", two_node_cluster, tracking_uri, str(tmp_path / "job.log"))
    assert done.returncode == 0 and "JOB_SAMPLER_OK" in done.stdout, (done.stdout + done.stderr)[-4000:]


def test_samplers_start_only_for_launches_that_span_a_ray_cluster(tmp_path):
    here = {"RAY_TMPDIR": str(tmp_path)}
    assert sampler_address("", 1, environ=here) is None  # one node, verl's own Ray: verlflow's monitor covers it
    assert sampler_address("", 2, environ=here) is None  # no cluster to join (the preflight refuses the launch)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:6380\n")  # what `ray start` writes
    assert sampler_address("", 2, environ=here) == "127.0.0.1:6380"
    assert sampler_address("", 2, environ={**here, "RAY_ADDRESS": "10.0.0.1:6379"}) == "10.0.0.1:6379"
    assert sampler_address("http://head:8265", 2, environ=here) is None  # a Ray job samples from its entrypoint
