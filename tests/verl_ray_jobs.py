"""What the tests of verl submitted as a Ray job share: a local Ray head with its job API, ``verlflow train`` of the
tiny recipe as a Ray job running the stand-in of verl's main module, and what they ask the cluster.

A real single-node Ray cluster (``ray start --head``, with its dashboard for job submission) is started in its own
process group for a test module and stopped afterwards; the stand-in for verl's main module runs as the job's
entrypoint. Its mode reaches the job only through the profile env → ``runtime_env``. The head declares 8 GPUs
(``--num-gpus 8``, an H20 node as Ray counts it): the pre-launch check asks the cluster for the
``trainer.nnodes × n_gpus_per_node`` the h20 profile wants, and nothing here uses a GPU.
Used by tests/test_verl_ray_job.py and tests/test_verl_ray_job_resume.py, two files that xdist can run at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, local_ray, wait_until
from mlflow.tracking import MlflowClient

from verlflow.backends.verl.node_sampler import ACTOR_NAME_PREFIX

STANDIN = Path(__file__).parent / "standins" / "verl_main_standin.py"


def dashboard_answers(url: str) -> bool:
    """Whether the dashboard answers at all: Ray >= 2.5x answers 401 without its auth token, which its job client
    reads from ~/.ray by itself (a plain HTTP probe that wants 200 would wait forever)."""
    try:
        with urllib.request.urlopen(url, timeout=5):
            pass
    except urllib.error.HTTPError:
        pass
    except OSError:
        return False
    return True


def sampler_actor_states(address: str, run_id: str) -> dict[str, str]:
    """The run's node-sampler actors on the cluster (name → ALIVE/DEAD/…), asked by a fresh token-auth process."""
    ask = ("import json, sys; from ray.util.state import list_actors; "
           "print(json.dumps({a.name: a.state for a in list_actors(address=sys.argv[1], "
           "filters=[('class_name', '=', 'NodeSampler')], limit=1000) if a.name.startswith(sys.argv[2])}))")
    done = subprocess.run([sys.executable, "-c", ask, address, f"{ACTOR_NAME_PREFIX}-{run_id}-"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "RAY_AUTH_MODE": "token"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def poll(condition, timeout_s: float, what: str):
    """``wait_until`` every 2 s: each check asks Ray or the store, not to be done too often."""
    return wait_until(condition, timeout_s, what, poll_s=2)


def node_scoped(client: MlflowClient, run_id: str, name: str = "cpu_utilization_percentage") -> set[str]:
    """Node ids with ``system/<node>/<name>`` in the run (verlflow's own ``system/<name>`` is not node-scoped)."""
    keys = client.get_run(run_id).data.metrics
    return {k.split("/")[1] for k in keys if k.startswith("system/") and k.endswith(f"/{name}") and k.count("/") == 2}


def train_on_ray(tmp_path, ray_head: str, tiny_workdir: Path, mode: str, *extra: str) -> subprocess.Popen:
    """``verlflow train`` of the tiny recipe as a Ray job running the stand-in in ``mode``, output piped."""
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    model = resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache")  # read only: the session's copy
    # One GPU per node, rollout TP 1: the tiny recipe's 16 responses over 8 GPUs leave a per-device mini-batch (2) its
    # micro-batch (4) cannot divide, which the preflight refuses. Samples every second: several arrive in seconds.
    overrides = (f"verlflow.launch_module={STANDIN} verlflow.output_dir={tmp_path / 'outputs'} "
                 "trainer.n_gpus_per_node=1 actor_rollout_ref.rollout.tensor_model_parallel_size=1 "
                 f"verlflow.system_metrics_interval=1 profile.env.VERLFLOW_STANDIN_MODE={mode}")
    argv = [sys.executable, "-m", "verlflow.cli", "train", "--recipe", "tiny", "--device", "gpu",
            "--backend", "verl", "--model", str(model), "--data_dir", str(tmp_path / "data"),
            "--ray_address", ray_head, "--overrides", overrides, *extra]
    env = {k: v for k, v in os.environ.items() if k != "VERLFLOW_STANDIN_MODE"}
    return subprocess.Popen(argv, env=env, cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def until_waiting(proc: subprocess.Popen) -> tuple[list[str], int]:
    """The lines up to the stand-in's STANDIN_WAITING (the job's logs, followed) and the stand-in's pid."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("STANDIN_WAITING"):
            return seen, int(line.split("pid=")[1])
    pytest.fail("the Ray job never reached the stand-in:\n" + "".join(seen[-50:]))


def only_run(client: MlflowClient):
    """The store's one run (a test's store holds the run it launched, resumed or not, and nothing else)."""
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def ask_job(address: str, job_id: str, method: str) -> str:
    """``JobSubmissionClient(address).<method>(job_id)`` printed by a fresh process: Ray reads RAY_AUTH_MODE
    once, at import, and this one may have imported it without the token mode the head uses."""
    ask = ("import sys; from ray.job_submission import JobSubmissionClient; "
           f"print(JobSubmissionClient(sys.argv[1]).{method}(sys.argv[2]))")
    done = subprocess.run([sys.executable, "-c", ask, address, job_id], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_AUTH_MODE": "token"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def job_logs(address: str, job_id: str) -> str:
    """The job's whole log as Ray keeps it."""
    return ask_job(address, job_id, "get_job_logs")


def job_status(address: str, job_id: str) -> str:
    """The job's status (PENDING, RUNNING, STOPPED, ...)."""
    return ask_job(address, job_id, "get_job_status").strip().splitlines()[-1]



def alive_gpus(address: str) -> list[float]:
    """GPUs of each alive node of the cluster, as a fresh token-auth process lists them (nothing while starting)."""
    ask = ("import json, sys; from ray.util.state import list_nodes; "
           "print(json.dumps([n.resources_total.get('GPU', 0) for n in list_nodes(address=sys.argv[1], "
           "filters=[('state', '=', 'ALIVE')], raise_on_missing_output=False)]))")
    done = subprocess.run([sys.executable, "-c", ask, address], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_AUTH_MODE": "token"})
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else []


@contextlib.contextmanager
def local_ray_head():
    """Address of a fresh local Ray head with the job API (a module's tests share one); its whole process group
    killed afterwards."""
    if shutil.which("ray") is None:  # ray comes with verl; a failure, not a skip, so the job path stays tested
        pytest.fail("the ray CLI is not installed: pip install -e '.[dev]' (verl brings ray, dev its job API)")
    # Ray >= 2.5x starts a local head with token auth: local_ray says RAY_AUTH_MODE=token to head, verlflow and
    # this test's own job client alike.
    with local_ray("vfray") as (temp, procs):
        gcs, dashboard = free_port(), free_port()
        procs.append(subprocess.Popen(
            ["ray", "start", "--head", "--block", "--port", str(gcs), "--dashboard-port", str(dashboard),
             "--dashboard-host", "127.0.0.1", "--include-dashboard", "true", "--num-cpus", "2", "--num-gpus", "8",
             "--temp-dir", temp, "--disable-usage-stats",
             # Own agent and metrics ports: a second Ray head on this machine (another session) must not collide.
             "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port())],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        address = f"http://127.0.0.1:{dashboard}"
        # The dashboard (job API) needs ray[default]'s packages (the dev extra) and minutes on 2 busy cores.
        wait_until(lambda: dashboard_answers(f"{address}/api/version"), 420, "a local Ray head with its dashboard "
                   "(is ray[default] installed? pip install -e '.[dev]')", poll_s=2, watch=procs)
        # The dashboard answers before the head's own node is listed alive; the tests want a cluster of 8 GPUs.
        wait_until(lambda: alive_gpus(address) == [8.0], 300, "the Ray head listed alive with its 8 GPUs", poll_s=2,
                   watch=procs)
        yield address
