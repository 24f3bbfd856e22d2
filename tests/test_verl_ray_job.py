"""`-P ray_address=…`: verl is submitted as a Ray job, attaches to our run through the job's runtime env,
its logs are followed, and SIGTERM stops the job and ends the run KILLED. The job samples every node of its
cluster into the run (``system/<node>/…``) until verl ends. A crashed job and ``--resume`` relaunching a run as a Ray
job are tests/test_verl_ray_job_resume.py (a file of its own, with its own Ray head: xdist can run the two at once).

A real single-node Ray cluster with 8 declared GPUs (tests/verl_ray_jobs.py) is started for this module; the
stand-in for verl's main module runs as the job's entrypoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import slow_setup
from mlflow.tracking import MlflowClient
from verl_ray_jobs import (
    STANDIN,
    job_logs,
    job_status,
    local_ray_head,
    node_scoped,
    only_run,
    poll,
    sampler_actor_states,
    train_on_ray,
    until_waiting,
)


@pytest.fixture(scope="module")
@slow_setup
def ray_head():
    """Address of a fresh local Ray head with the job API, shared by this module's tests."""
    with local_ray_head() as address:
        yield address


@pytest.mark.slow
def test_ray_job_attaches_follows_logs_and_is_stopped_by_sigterm(tracking_uri, tmp_path, ray_head, tiny_workdir):
    client = MlflowClient()
    proc = train_on_ray(tmp_path, ray_head, tiny_workdir, "hang")
    seen, _pid = until_waiting(proc)
    run_id = only_run(client).info.run_id
    # The job samples its cluster's node (the head, under its own node id) while verl runs.
    nodes = poll(lambda: node_scoped(client, run_id), 300, "system/<node>/* from the Ray job's node")
    assert poll(lambda: "ALIVE" in sampler_actor_states(ray_head, run_id).values(), 120, "a live sampler actor")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]
    assert any("sampling system metrics on 1 Ray node(s)" in line for line in seen), "".join(seen[-50:])
    # Stopped with the job: every sampler of the run is dead, none left sampling the cluster.
    poll(lambda: set(sampler_actor_states(ray_head, run_id).values()) == {"DEAD"}, 180, "sampler actors dead")
    job = client.get_run(run_id).data.tags["verlflow.ray_job_id"]
    poll(lambda: "verlflow: node samplers stopped (signalled)" in job_logs(ray_head, job), 180,
          "the sampler's goodbye in the job's log")
    assert len(nodes) == 1 and next(iter(nodes)).count("_") >= 1, nodes  # <ip>_<ray node id[:8]>

    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags["verlflow.launcher"] == f"ray:{ray_head}"
    assert run.data.metrics["val-core/openai/gsm8k/reward/mean_at_1"] == 0.5  # via MLFLOW_* in runtime_env
    assert run.data.params["trainer/logger/1"] == "mlflow"
    job_id = run.data.tags["verlflow.ray_job_id"]
    assert job_status(ray_head, job_id) in ("STOPPED", "JobStatus.STOPPED")
    log = MlflowClient().download_artifacts(run.info.run_id, "logs/verl.log", str(tmp_path))
    assert "STANDIN_WAITING" in Path(log).read_text()


def _dry_run(tmp_path, overrides: str, *, ray_address: str = "", env: dict[str, str] | None = None):
    argv = [sys.executable, "-m", "verlflow.cli", "train", "--recipe", "tiny", "--device", "gpu", "--backend", "verl",
            "--data_dir", str(tmp_path / "data"), "--dry_run", "true", "--overrides", overrides]
    if ray_address:
        argv += ["--ray_address", ray_address]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert MlflowClient().search_runs(["0"]) == []  # refused before a run opened
    return lines[0]


@pytest.mark.slow
def test_a_dry_run_asks_the_cluster_for_nnodes_times_n_gpus_per_node(tracking_uri, tmp_path, ray_head):
    line = _dry_run(tmp_path, "trainer.nnodes=2", ray_address=ray_head)
    assert line.startswith("verlflow train: error: trainer.nnodes=2: verl asks for trainer.nnodes × "
                           f"n_gpus_per_node = 2 × 8 GPU (every node 8), but the Ray cluster at {ray_head} has 1 "
                           "such node(s) ("), line
    assert line.endswith(": 8 GPU): ask for what it has, or add nodes"), line
    line = _dry_run(tmp_path, "trainer.n_gpus_per_node=16", ray_address=ray_head)
    assert line.startswith("verlflow train: error: trainer.n_gpus_per_node=16: verl asks for"), line


@pytest.mark.slow
def test_several_nodes_without_ray_address_use_the_cluster_ray_finds_from_here(tracking_uri, tmp_path, ray_head):
    env = {**os.environ, "RAY_ADDRESS": ray_head}  # what verl's ray.init() joins from this machine
    line = _dry_run(tmp_path, "trainer.nnodes=2", env=env)
    assert "trainer.nnodes=2: verl asks for" in line and "the Ray cluster verl would join from here has 1" in line


def test_a_ray_job_composes_resume_and_samplers_before_verl_and_ships_verlflow():
    """The submitted job, composed without a cluster: what runs on the head, in which order, with which code."""
    import shlex

    import verlflow
    from verlflow import config
    from verlflow.backends.verl import command, launch

    cfg = config.compose("tiny", "h20", "verlflow.launch_module=" + str(STANDIN))
    plan = command.build_plan(cfg, run_id="r1", experiment_name="E", run_name="n", tracking_uri="http://mlflow:5000")
    spec = launch.ray_job_spec(plan, run_id="r1", attempt=3, sample_interval_s=5.0, resume=True)
    script = shlex.split(spec["entrypoint"])[2].splitlines()
    resume_at = next(i for i, ln in enumerate(script) if "-m verlflow.backends.verl.resume " in ln)
    sampler_at = next(i for i, ln in enumerate(script) if "-m verlflow.backends.verl.node_sampler " in ln)
    verl_at = next(i for i, ln in enumerate(script) if ln.startswith("exec "))
    assert resume_at < sampler_at < verl_at  # a run that cannot resume ends the job before anything starts
    assert script[resume_at].endswith(f"{plan.checkpoint_dir} || exit $?")
    assert script[sampler_at].endswith("--interval 5 --parent $$ &")  # background; $$ becomes verl's pid at exec
    assert spec["runtime_env"]["py_modules"] == [str(Path(verlflow.__file__).parent)]
    assert spec["runtime_env"]["env_vars"]["MLFLOW_RUN_ID"] == "r1"
    assert spec["submission_id"] == "verlflow-r1-attempt3"  # Ray never reuses a submission id

    plain = launch.ray_job_spec(plan, run_id="r1")  # system metrics off, a first attempt: only verl runs
    assert "py_modules" not in plain["runtime_env"] and "verlflow.backends" not in plain["entrypoint"]
    assert plain["submission_id"] == "verlflow-r1"
