"""`-P ray_address=…`: verl is submitted as a Ray job, attaches to our run through the job's runtime env,
its logs are followed, and SIGTERM stops the job and ends the run KILLED.

A real single-node Ray cluster (``ray start --head``, with its dashboard for job submission) is started
for the test in its own process group and stopped afterwards; the stand-in for verl's main module runs
as the job's entrypoint. Its mode reaches the job only through the profile env → ``runtime_env``. The head
declares 8 GPUs (``--num-gpus 8``, an H20 node as Ray counts it): the pre-launch check asks the cluster for
the ``trainer.nnodes × n_gpus_per_node`` the h20 profile wants, and nothing here uses a GPU.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, local_ray
from mlflow.tracking import MlflowClient

STANDIN = Path(__file__).parent / "standins" / "verl_main_standin.py"


def _wait_for_dashboard(url: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    """Poll the dashboard until it answers at all: Ray >= 2.5x answers 401 without its auth token, which
    its job client reads from ~/.ray by itself (a plain HTTP probe that wants 200 would wait forever)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(2)


def _job_status(address: str, job_id: str) -> str:
    """The job's status, asked by a fresh client process: Ray reads RAY_AUTH_MODE once, at import."""
    ask = ("import sys; from ray.job_submission import JobSubmissionClient; "
           "print(JobSubmissionClient(sys.argv[1]).get_job_status(sys.argv[2]))")
    done = subprocess.run([sys.executable, "-c", ask, address, job_id], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_AUTH_MODE": "token"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def ray_head():
    """Address of a fresh local Ray head with the job API; its whole process group killed afterwards."""
    if shutil.which("ray") is None:  # ray comes with verl; a failure, not a skip, so the job path stays tested
        pytest.fail("the ray CLI is not installed: pip install -e '.[dev]' (verl brings ray, dev its job API)")
    # Ray >= 2.5x starts a local head with token auth: local_ray says RAY_AUTH_MODE=token to head, verlflow and
    # this test's own job client alike.
    with local_ray("vfray") as (temp, procs):
        gcs, dashboard = free_port(), free_port()
        procs.append(subprocess.Popen(
            ["ray", "start", "--head", "--block", "--port", str(gcs), "--dashboard-port", str(dashboard),
             "--dashboard-host", "127.0.0.1", "--include-dashboard", "true", "--num-cpus", "2", "--num-gpus", "8",
             "--temp-dir", temp, "--disable-usage-stats"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        address = f"http://127.0.0.1:{dashboard}"
        # The dashboard (job API) needs ray[default]'s packages (the dev extra) and minutes on 2 busy cores.
        if not _wait_for_dashboard(f"{address}/api/version", procs[0], timeout_s=420):
            pytest.fail("a local Ray head with its dashboard did not come up within 420 s: is ray[default] "
                        "installed (pip install -e '.[dev]')?")
        yield address


@pytest.mark.slow
def test_ray_job_attaches_follows_logs_and_is_stopped_by_sigterm(tracking_uri, tmp_path, ray_head, tiny_workdir):
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    model = resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache")  # read only: the session's copy
    # One GPU per node, rollout TP 1: the tiny recipe's 16 responses over 8 GPUs leave a per-device mini-batch (2) its
    # micro-batch (4) cannot divide, which the preflight refuses.
    overrides = (f"verlflow.launch_module={STANDIN} verlflow.output_dir={tmp_path / 'outputs'} "
                 "trainer.n_gpus_per_node=1 actor_rollout_ref.rollout.tensor_model_parallel_size=1 "
                 "profile.env.VERLFLOW_STANDIN_MODE=hang")
    argv = [sys.executable, "-m", "verlflow.cli", "train", "--recipe", "tiny", "--device", "gpu",
            "--backend", "verl", "--model", str(model), "--data_dir", str(tmp_path / "data"),
            "--ray_address", ray_head, "--overrides", overrides]
    env = {k: v for k, v in os.environ.items() if k != "VERLFLOW_STANDIN_MODE"}
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = []
    for line in proc.stdout:  # the job's logs, followed
        seen.append(line)
        if line.startswith("STANDIN_WAITING"):
            break
    else:
        pytest.fail("the Ray job never reached the stand-in:\n" + "".join(seen[-50:]))
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]

    client = MlflowClient()
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    assert run.info.status == "KILLED"
    assert run.data.tags["verlflow.launcher"] == f"ray:{ray_head}"
    assert run.data.metrics["val-core/openai/gsm8k/reward/mean_at_1"] == 0.5  # via MLFLOW_* in runtime_env
    assert run.data.params["trainer/logger/1"] == "mlflow"
    job_id = run.data.tags["verlflow.ray_job_id"]
    assert _job_status(ray_head, job_id) in ("STOPPED", "JobStatus.STOPPED")
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
