"""Tracking faults a user meets in a real train run: the metric writer dies, the server never comes back.

Real ``verlflow train`` processes on the ``tiny`` recipe, with a real SQLite store (``tracking_uri``) or a
real ``mlflow server`` on 127.0.0.1 (:class:`conftest.MlflowServer`) that is stopped for good.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import every_experiment, paused, process_running, serving, wait_until
from mlflow.tracking import MlflowClient

from verlflow import names
from verlflow.data import gsm8k
from verlflow.outage import logged_models

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
FLUSH_S = 5


def _start_training(tmp_path: Path, cache: Path, overrides: str = "", **env: str) -> subprocess.Popen:
    gsm8k.preprocess("synthetic", tmp_path / "data", 32, log_to_mlflow=False)
    overrides = (f"trainer.total_training_steps={STEPS} verlflow.output_dir={tmp_path / 'outputs'} "
                 f"verlflow.system_metrics_interval=1 {overrides}")
    # Each step written as it ends (not gathered for 2 s), so the fault lands while steps remain.
    env = {**os.environ, "VERLFLOW_CACHE": str(cache), "VERLFLOW_METRICS_WRITE_S": "0",
           "VERLFLOW_METRICS_NICE": "0", "PYTHONPATH": str(ROOT / "src"), **env}
    return subprocess.Popen([sys.executable, "-m", "verlflow.cli", "train", "--recipe", "tiny", "--device", "cpu",
                             "--data_dir", str(tmp_path / "data"), "--overrides", overrides], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_steps(client: MlflowClient, proc: subprocess.Popen, steps: int) -> str:
    def reached() -> str | None:
        runs = client.search_runs(every_experiment(client), "tags.`verlflow.step` = 'train'")
        if runs and len(client.get_metric_history(runs[0].info.run_id, "timing_s/step")) >= steps:
            return runs[0].info.run_id
        return None

    return wait_until(reached, 600, f"training reached step {steps}", poll_s=0.5, watch=[proc],
                      detail=lambda: proc.stdout.read()[-3000:] if proc.poll() is not None else "")


def _writer_pid(trainer_pid: int) -> int:
    """The trainer's spawned metric writer (not multiprocessing's resource tracker)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == trainer_pid and "spawn_main" in cmdline:
            return int(stat.parent.name)
    pytest.fail(f"no metric writer process under {trainer_pid}")


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_a_killed_metric_writer_costs_the_run_nothing(tracking_uri, tmp_path, tiny_workdir):
    client = MlflowClient()
    client.search_experiments()  # create the store's tables before two processes race to
    proc = _start_training(tmp_path, tiny_workdir / "cache", "trainer.test_freq=-1")
    run_id = _wait_for_steps(client, proc, 2)
    trainer_pid = int(client.get_run(run_id).data.tags[names.PID_TAG])
    with paused(trainer_pid):  # so that steps remain to be made after the writer is gone, on any host
        os.kill(writer := _writer_pid(trainer_pid), signal.SIGKILL)  # what the OOM killer does
        wait_until(lambda: not process_running(writer), 60, "the killed writer gone")
    out, _ = proc.communicate(timeout=900)  # before: the trainer hung forever in flush()
    assert proc.returncode == 0, out[-3000:]
    assert "metric writer process ended (exit code -9)" in out
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in ("timing_s/step", "critic/score/mean", "actor/pg_loss"):
        assert _steps(client, run_id, key) == list(range(1, STEPS + 1)), key
    assert "timing_s/e2e" in run.data.metrics and names.CHECKPOINT_DIR_TAG in run.data.tags
    assert not list((tmp_path / "outputs").rglob("metrics.spill.jsonl"))


@pytest.fixture
def server(tmp_path, monkeypatch):
    yield from serving(tmp_path, monkeypatch, {})  # MLflow's default HTTP retries, as a user's run has them


@pytest.mark.slow
@pytest.mark.timeout(1200)  # training, an outage and an upload on a busy 2-core machine
def test_a_server_that_never_returns_ends_training_on_time_and_the_printed_command_finishes_the_run(
        server, tmp_path, tiny_workdir):
    # MLflow's own HTTP retries are left at their defaults (minutes per call): the trainer must bound them.
    client = MlflowClient()
    proc = _start_training(tmp_path, tiny_workdir / "cache", "trainer.test_freq=2",
                           VERLFLOW_METRICS_FLUSH_S=str(FLUSH_S), VERLFLOW_METRICS_RETRY_S="1")
    run_id = _wait_for_steps(client, proc, 2)
    with paused(proc.pid):  # so that the outage begins with steps (and validation tables) still to make
        server.stop()
    stopped = time.monotonic()
    # Before: every validation step's table went through ~4 min of retries, the end 10+ min more.
    out, _ = proc.communicate(timeout=900)
    print(f"server stopped -> training process exited after {time.monotonic() - stopped:.0f} s "
          f"(flush wait {FLUSH_S} s)")  # fault figure, not asserted
    print("\n".join(line for line in out.splitlines() if "verlflow" in line)[-3000:])
    assert proc.returncode == 0, out[-3000:]
    lines = out.splitlines()
    command = lines[lines.index(next(line for line in lines if "did not take" in line)) + 1].strip()
    assert command.startswith(f"MLFLOW_TRACKING_URI={server.url} ")
    assert f"run {run_id} is FINISHED" in out
    spill_file = Path(command.split()[-1])
    records = [json.loads(line) for line in spill_file.read_text().splitlines()]
    # The validation steps during the outage queued their tables for later instead of waiting on the server.
    tables = [r["artifact_file"] for r in records if r.get("kind") == "table"]
    assert f"samples/step_{STEPS}.json" in tables
    assert records[-1]["kind"] == "status" and records[-1]["status"] == "FINISHED"

    server.start()
    assert client.get_run(run_id).info.status == "RUNNING"  # not yet: the server has not seen the end
    fresh = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PYTHONPATH": str(ROOT / "src")}
    upload = subprocess.run(["bash", "-c", command], env=fresh, cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert upload.returncode == 0, upload.stderr[-3000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in ("timing_s/step", "critic/score/mean", "actor/pg_loss"):
        assert _steps(client, run_id, key) == list(range(1, STEPS + 1)), key
    assert {"timing_s/e2e", "timing_s_mean/step", "attempt/e2e_s"} <= set(run.data.metrics)
    assert names.CHECKPOINT_DIR_TAG in run.data.tags
    # The final checkpoint's model, which the outage kept from the store, is made by the upload, not by register.
    model = logged_models.final_model_of(run_id, client)
    assert model is not None and model.tags[logged_models.CHECKPOINT_STEP_TAG] == str(STEPS), out[-3000:]
    assert any(o.model_id == model.model_id and o.step == STEPS for o in client.get_run(run_id).outputs.model_outputs)
    assert "queued as MLflow model" in out
    logged = {a.path for a in client.list_artifacts(run_id, "samples")}
    assert {f"samples/step_{s}.json" for s in range(2, STEPS + 1, 2)} <= logged
    assert not spill_file.exists()
    assert re.search(r"uploaded \d+ metric points", upload.stdout)
