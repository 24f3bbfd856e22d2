"""The Ray checks before a verl launch: an address nobody answers at, nodes without a cluster, a too small
cluster, and a tracking URI the other nodes cannot reach — each one line, exit 2, no run opened.

    pytest tests/test_verl_ray_checks.py

No Ray is started here (the checks against a real local head are in tests/test_verl_ray_job.py): the
unreachable address is a closed port, and "no cluster" is a Ray temp folder of the test's own.
"""

from __future__ import annotations

import os

import pytest
from conftest import CliResult, cli_in_process, every_experiment
from mlflow.tracking import MlflowClient

from verlflow.backends.verl.ray_cluster import (
    RayNode,
    local_only_reason,
    resource_problems,
    tracking_problems,
    until_listed,
)
from verlflow.errors import EXIT_BAD_INPUT

CLOSED_PORT = "http://127.0.0.1:1"


def _train(tmp_path, *args: str, env: dict[str, str] | None = None) -> CliResult:
    return cli_in_process(["train", "--device", "gpu", "--backend", "verl", "--data_dir", str(tmp_path / "data"),
                           "--dry_run", "true", *args], env=env, cwd=tmp_path)


def _one_line_no_run(done: CliResult) -> str:
    assert done.returncode == EXIT_BAD_INPUT, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    # refused before a run opened: nothing RUNNING, nothing at all
    assert MlflowClient().search_runs(every_experiment()) == []
    return lines[0]


def test_an_address_nobody_answers_at_is_one_line_before_anything_is_composed(tmp_path, tracking_uri):
    line = _one_line_no_run(_train(tmp_path, "--ray_address", CLOSED_PORT))
    assert line.startswith(f"verlflow train: error: ray_address={CLOSED_PORT}: no Ray cluster answers there ("), line
    assert "pass the dashboard address of a running cluster's head" in line


def test_several_nodes_without_a_ray_cluster_are_refused(tmp_path, tracking_uri):
    # Ray finds a local cluster through RAY_ADDRESS or <RAY_TMPDIR>/ray/ray_current_cluster: neither here.
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env["RAY_TMPDIR"] = str(tmp_path / "no-ray-here")
    line = _one_line_no_run(_train(tmp_path, "--overrides", "trainer.nnodes=2", env=env))
    assert line.startswith("verlflow train: error: trainer.nnodes=2: more than one node needs a Ray cluster and "
                           "none is reachable from this machine"), line
    assert "pass -P ray_address=http://<head>:8265" in line


@pytest.mark.parametrize(("uri", "reason"), [
    ("sqlite:///mlflow.db", "names a file on this machine"),
    ("sqlite:////shared/mlflow.db", "names a file on this machine"),
    ("file:///tmp/mlruns", "names a file on this machine"),
    ("./mlruns", "names a file on this machine"),
    ("mlruns", "names a file on this machine"),
    ("http://localhost:5000", "localhost is this machine"),
    ("http://127.0.0.2:5000", "127.0.0.2 is this machine"),
    ("http://[::1]:5000", "::1 is this machine"),
    ("http://0.0.0.0:5000", "0.0.0.0 is this machine"),
    ("postgresql://mlflow@localhost:5432/mlflow", "localhost is this machine"),
    ("http://mlflow.example:5000", None),
    ("https://10.1.2.3", None),
    ("databricks", None),  # MLflow's name for a Databricks workspace, not a folder
])
def test_which_tracking_uris_only_this_machine_can_use(uri, reason):
    assert local_only_reason(uri) == reason


def test_a_local_tracking_uri_is_refused_when_a_node_is_another_machine():
    nodes = [RayNode("10.0.0.5", {"GPU": 8.0}), RayNode("10.0.0.7", {"GPU": 8.0})]
    here = {"127.0.0.1", "10.0.0.5"}
    (problem,) = tracking_problems("http://alice:s3cret@localhost:5000", nodes, here=here, where="the cluster")
    line = problem.line()
    assert line.startswith("MLFLOW_TRACKING_URI=http://***@localhost:5000: localhost is this machine, but verl's "
                           "MLflow logger may run on another node of the cluster (10.0.0.7): set "
                           "MLFLOW_TRACKING_URI to a tracking server every node reaches"), line
    assert "s3cret" not in line
    assert tracking_problems("http://mlflow.example:5000", nodes, here=here, where="the cluster") == []
    # A cluster of this machine alone reaches this machine's store.
    assert tracking_problems("sqlite:///mlflow.db", nodes[:1], here=here, where="the cluster") == []


def test_the_cluster_must_hold_nnodes_nodes_of_n_gpus_per_node_each():
    nodes = [RayNode("10.0.0.5", {"CPU": 64.0, "GPU": 8.0}), RayNode("10.0.0.7", {"CPU": 64.0, "GPU": 4.0})]
    assert resource_problems(nodes, device="gpu", nnodes=1, per_node=8, where="c") == []
    (short,) = resource_problems(nodes, device="gpu", nnodes=2, per_node=8, where="the Ray cluster at X")
    assert short.key == "trainer.n_gpus_per_node" and short.line().endswith(
        "has 1 such node(s) (10.0.0.5: 8 GPU, 10.0.0.7: 4 GPU): ask for what it has, or add nodes")
    (few,) = resource_problems(nodes, device="gpu", nnodes=3, per_node=4, where="c")
    assert few.key == "trainer.nnodes" and few.value == 3
    (npu,) = resource_problems(nodes, device="npu", nnodes=1, per_node=16, where="c")  # Ascend counts NPU
    assert "0 NPU" in npu.line()


def test_a_cluster_whose_head_is_still_registering_is_asked_again_not_refused():
    # `ray start --head` answers on its dashboard before its own node is listed alive: CI's first launch on a fresh
    # head was refused with "0 such node(s) (none alive)". Listings as a registering head gives them:
    answers = iter([[], [], [RayNode("10.0.0.5", {"GPU": 8.0})]])
    asked = []

    def list_once():
        asked.append(1)
        return next(answers)

    assert until_listed(list_once, settle_s=5, poll_s=0.01) == [RayNode("10.0.0.5", {"GPU": 8.0})]
    assert len(asked) == 3
    # A cluster that truly lists no node is still answered, as empty, once the settle time is spent.
    assert until_listed(lambda: [], settle_s=0.05, poll_s=0.01) == []
