"""`-P ray_address=…`: verl is submitted as a Ray job, attaches to our run through the job's runtime env,
its logs are followed, and SIGTERM stops the job and ends the run KILLED. The job samples every node of its
cluster into the run (``system/<node>/…``) until verl ends, and ``--resume`` relaunches it as a Ray job.

A real single-node Ray cluster (``ray start --head``, with its dashboard for job submission) is started
for the test in its own process group and stopped afterwards; the stand-in for verl's main module runs
as the job's entrypoint. Its mode reaches the job only through the profile env → ``runtime_env``. The head
declares 8 GPUs (``--num-gpus 8``, an H20 node as Ray counts it): the pre-launch check asks the cluster for
the ``trainer.nnodes × n_gpus_per_node`` the h20 profile wants, and nothing here uses a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
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


def _dashboard_answers(url: str) -> bool:
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


def _sampler_actor_states(address: str, run_id: str) -> dict[str, str]:
    """The run's node-sampler actors on the cluster (name → ALIVE/DEAD/…), asked by a fresh token-auth process."""
    ask = ("import json, sys; from ray.util.state import list_actors; "
           "print(json.dumps({a.name: a.state for a in list_actors(address=sys.argv[1], "
           "filters=[('class_name', '=', 'NodeSampler')], limit=1000) if a.name.startswith(sys.argv[2])}))")
    done = subprocess.run([sys.executable, "-c", ask, address, f"{ACTOR_NAME_PREFIX}-{run_id}-"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "RAY_AUTH_MODE": "token"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _poll(condition, timeout_s: float, what: str):
    return wait_until(condition, timeout_s, what, poll_s=2)  # each check asks Ray or the store: not too often


def _node_scoped(client: MlflowClient, run_id: str, name: str = "cpu_utilization_percentage") -> set[str]:
    """Node ids with ``system/<node>/<name>`` in the run (verlflow's own ``system/<name>`` is not node-scoped)."""
    keys = client.get_run(run_id).data.metrics
    return {k.split("/")[1] for k in keys if k.startswith("system/") and k.endswith(f"/{name}") and k.count("/") == 2}


def _train_on_ray(tmp_path, ray_head: str, tiny_workdir: Path, mode: str, *extra: str) -> subprocess.Popen:
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


def _until_waiting(proc: subprocess.Popen) -> tuple[list[str], int]:
    """The lines up to the stand-in's STANDIN_WAITING (the job's logs, followed) and the stand-in's pid."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("STANDIN_WAITING"):
            return seen, int(line.split("pid=")[1])
    pytest.fail("the Ray job never reached the stand-in:\n" + "".join(seen[-50:]))


def _only_run(client: MlflowClient):
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def _ask_job(address: str, job_id: str, method: str) -> str:
    """``JobSubmissionClient(address).<method>(job_id)`` printed by a fresh process: Ray reads RAY_AUTH_MODE
    once, at import, and this one may have imported it without the token mode the head uses."""
    ask = ("import sys; from ray.job_submission import JobSubmissionClient; "
           f"print(JobSubmissionClient(sys.argv[1]).{method}(sys.argv[2]))")
    done = subprocess.run([sys.executable, "-c", ask, address, job_id], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_AUTH_MODE": "token"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _job_logs(address: str, job_id: str) -> str:
    """The job's whole log as Ray keeps it."""
    return _ask_job(address, job_id, "get_job_logs")


def _job_status(address: str, job_id: str) -> str:
    """The job's status (PENDING, RUNNING, STOPPED, ...)."""
    return _ask_job(address, job_id, "get_job_status").strip().splitlines()[-1]


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
             "--temp-dir", temp, "--disable-usage-stats",
             # Own agent and metrics ports: a second Ray head on this machine (another session) must not collide.
             "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port())],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        address = f"http://127.0.0.1:{dashboard}"
        # The dashboard (job API) needs ray[default]'s packages (the dev extra) and minutes on 2 busy cores.
        wait_until(lambda: _dashboard_answers(f"{address}/api/version"), 420, "a local Ray head with its dashboard "
                   "(is ray[default] installed? pip install -e '.[dev]')", poll_s=2, watch=procs)
        # The dashboard answers before the head's own node is listed alive; the tests want a cluster of 8 GPUs.
        wait_until(lambda: _alive_gpus(address) == [8.0], 300, "the Ray head listed alive with its 8 GPUs", poll_s=2,
                   watch=procs)
        yield address


def _alive_gpus(address: str) -> list[float]:
    """GPUs of each alive node of the cluster, as a fresh token-auth process lists them (nothing while starting)."""
    ask = ("import json, sys; from ray.util.state import list_nodes; "
           "print(json.dumps([n.resources_total.get('GPU', 0) for n in list_nodes(address=sys.argv[1], "
           "filters=[('state', '=', 'ALIVE')], raise_on_missing_output=False)]))")
    done = subprocess.run([sys.executable, "-c", ask, address], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_AUTH_MODE": "token"})
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else []


@pytest.mark.slow
def test_ray_job_attaches_follows_logs_and_is_stopped_by_sigterm(tracking_uri, tmp_path, ray_head, tiny_workdir):
    client = MlflowClient()
    proc = _train_on_ray(tmp_path, ray_head, tiny_workdir, "hang")
    seen, _pid = _until_waiting(proc)
    run_id = _only_run(client).info.run_id
    # The job samples its cluster's node (the head, under its own node id) while verl runs.
    nodes = _poll(lambda: _node_scoped(client, run_id), 300, "system/<node>/* from the Ray job's node")
    assert _poll(lambda: "ALIVE" in _sampler_actor_states(ray_head, run_id).values(), 120, "a live sampler actor")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]
    assert any("sampling system metrics on 1 Ray node(s)" in line for line in seen), "".join(seen[-50:])
    # Stopped with the job: every sampler of the run is dead, none left sampling the cluster.
    _poll(lambda: set(_sampler_actor_states(ray_head, run_id).values()) == {"DEAD"}, 180, "sampler actors dead")
    job = client.get_run(run_id).data.tags["verlflow.ray_job_id"]
    _poll(lambda: "verlflow: node samplers stopped (signalled)" in _job_logs(ray_head, job), 180,
          "the sampler's goodbye in the job's log")
    assert len(nodes) == 1 and next(iter(nodes)).count("_") >= 1, nodes  # <ip>_<ray node id[:8]>

    run = client.get_run(run_id)
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


@pytest.mark.slow
def test_a_crashed_ray_job_stops_its_node_samplers(tracking_uri, tmp_path, ray_head, tiny_workdir):
    client = MlflowClient()
    proc = _train_on_ray(tmp_path, ray_head, tiny_workdir, "hang")
    _seen, pid = _until_waiting(proc)
    run_id = _only_run(client).info.run_id
    _poll(lambda: _node_scoped(client, run_id), 300, "system/<node>/* from the Ray job's node")
    os.kill(pid, signal.SIGKILL)  # verl dies as the OOM killer would take it: no goodbye to anyone
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 2, out[-2000:]
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    _poll(lambda: set(_sampler_actor_states(ray_head, run_id).values()) == {"DEAD"}, 180, "sampler actors dead")
    # Stopped by the sampler process itself, which saw verl go (it then stops sampling, whatever Ray does later).
    job = run.data.tags["verlflow.ray_job_id"]
    _poll(lambda: "verlflow: node samplers stopped (verl ended)" in _job_logs(ray_head, job), 180,
          "the sampler's goodbye in the job's log")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two launches through Ray's job API on a busy 2-core machine
def test_resume_of_a_ray_job_run_relaunches_it_as_a_ray_job_from_its_checkpoint(tracking_uri, tmp_path, ray_head,
                                                                                  tiny_workdir):
    client = MlflowClient()
    # The first job fails after its checkpoint of step 2 (a FINISHED run has nothing to resume and is refused).
    first = _train_on_ray(tmp_path, ray_head, tiny_workdir, "fail_once")
    out, _ = first.communicate(timeout=600)
    assert first.returncode != 0, out[-3000:]
    run = _only_run(client)
    assert run.info.status == "FAILED"
    run_id, first_job = run.info.run_id, run.data.tags["verlflow.ray_job_id"]
    checkpoint = tmp_path / "outputs" / run_id / "checkpoints" / "global_step_2"
    assert checkpoint.is_dir()

    again = subprocess.run([sys.executable, "-m", "verlflow.cli", "train", "--resume", run_id], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600,
                           env={k: v for k, v in os.environ.items() if k != "VERLFLOW_STANDIN_MODE"})
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    run = _only_run(client)  # the same run, no second one
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    job = run.data.tags["verlflow.ray_job_id"]
    assert job != first_job and run.data.tags["verlflow.launcher"] == f"ray:{ray_head}"  # a new Ray job
    assert _job_status(ray_head, job) in ("SUCCEEDED", "JobStatus.SUCCEEDED")
    # Chosen on the cluster, by the job's entrypoint, from the run's logged steps and checkpoints; echoed here.
    assert f"verlflow: resume: run {run_id} continues after {checkpoint}" in out
    resumed = client.get_metric_history(run_id, "attempt/resumed_from_step")
    assert [(m.step, m.value) for m in resumed] == [(2, 2.0)]  # attempt 2 continued after step 2
    assert run.data.tags["verlflow.resumed_from"] == str(checkpoint)
    assert [m.step for m in client.get_metric_history(run_id, "attempt/e2e_s")] == [1, 2]


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
