"""A verl Ray job that dies after its checkpoint: its node samplers stop by themselves, and ``verlflow train
--resume`` relaunches the run as a new Ray job from that checkpoint, in the same run.

    pytest tests/test_verl_ray_job_resume.py

One run serves both: the stand-in of verl's main module (mode ``hang_once``) saves its checkpoint of step 2 and
waits; the test kills it as the OOM killer would (no goodbye to anyone); the resumed attempt finishes. A real
single-node Ray head (tests/verl_ray_jobs.py) is started for this module. The job's other paths (SIGTERM, the
checks before a launch) are tests/test_verl_ray_job.py.
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
    """Address of a fresh local Ray head with the job API, for this module."""
    with local_ray_head() as address:
        yield address


def _crash_after_checkpoint(tmp_path: Path, ray_head: str, tiny_workdir: Path, client: MlflowClient) -> str:
    """A Ray job whose verl is killed after its checkpoint of step 2: the run FAILED, its samplers stopped by
    themselves. Returns the run's id."""
    proc = train_on_ray(tmp_path, ray_head, tiny_workdir, "hang_once")
    _seen, pid = until_waiting(proc)
    run_id = only_run(client).info.run_id
    poll(lambda: node_scoped(client, run_id), 300, "system/<node>/* from the Ray job's node")
    os.kill(pid, signal.SIGKILL)  # verl dies as the OOM killer would take it: no goodbye to anyone
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 2, out[-2000:]
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    poll(lambda: set(sampler_actor_states(ray_head, run_id).values()) == {"DEAD"}, 180, "sampler actors dead")
    # Stopped by the sampler process itself, which saw verl go (it then stops sampling, whatever Ray does later).
    job = run.data.tags["verlflow.ray_job_id"]
    poll(lambda: "verlflow: node samplers stopped (verl ended)" in job_logs(ray_head, job), 180,
         "the sampler's goodbye in the job's log")
    return run_id


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two launches through Ray's job API on a busy 2-core machine
def test_a_crashed_ray_job_stops_its_node_samplers_and_resume_relaunches_it_as_a_ray_job(tracking_uri, tmp_path,
                                                                                          ray_head, tiny_workdir):
    client = MlflowClient()
    # The first job dies after its checkpoint of step 2 (a FINISHED run has nothing to resume and is refused).
    run_id = _crash_after_checkpoint(tmp_path, ray_head, tiny_workdir, client)
    first_job = client.get_run(run_id).data.tags["verlflow.ray_job_id"]
    checkpoint = tmp_path / "outputs" / run_id / "checkpoints" / "global_step_2"
    assert checkpoint.is_dir()

    again = subprocess.run([sys.executable, "-m", "verlflow.cli", "train", "--resume", run_id], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600,
                           env={k: v for k, v in os.environ.items() if k != "VERLFLOW_STANDIN_MODE"})
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    run = only_run(client)  # the same run, no second one
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    job = run.data.tags["verlflow.ray_job_id"]
    assert job != first_job and run.data.tags["verlflow.launcher"] == f"ray:{ray_head}"  # a new Ray job
    assert job_status(ray_head, job) in ("SUCCEEDED", "JobStatus.SUCCEEDED")
    # Chosen on the cluster, by the job's entrypoint, from the run's logged steps and checkpoints; echoed here.
    assert f"verlflow: resume: run {run_id} continues after {checkpoint}" in out
    resumed = client.get_metric_history(run_id, "attempt/resumed_from_step")
    assert [(m.step, m.value) for m in resumed] == [(2, 2.0)]  # attempt 2 continued after step 2
    assert run.data.tags["verlflow.resumed_from"] == str(checkpoint)
    assert [m.step for m in client.get_metric_history(run_id, "attempt/e2e_s")] == [1, 2]
