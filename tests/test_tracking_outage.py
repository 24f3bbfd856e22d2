"""A tracking-server outage never stops training and loses no metric point.

A real ``mlflow server`` on 127.0.0.1 (SQLite backend) is stopped mid-run and started again on the same
port and store. MLflow's own HTTP retries are cut to none (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``) and the
buffer retries every second, so a 5-minute outage is compressed into seconds with the same code path:
the points queue up, spill to the file, and are replayed with their original step and timestamp.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlflow
import pytest
from conftest import paused, process_running, wait_until
from mlflow.tracking import MlflowClient

from verlflow.data import gsm8k
from verlflow.outage import metric_buffer
from verlflow.outage.metric_buffer import MetricBuffer

FAST_FAIL = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
             "VERLFLOW_METRICS_RETRY_S": "1"}


@pytest.fixture
def server(module_server, monkeypatch):
    """The module's server (started once) as this test's tracking URI, MLflow's HTTP failing fast.

    Each test makes its own runs, and stops and starts the server itself for its outage; one that failed with the
    server down leaves it started again for the next test.
    """
    for key, value in {**FAST_FAIL, "MLFLOW_TRACKING_URI": module_server.url}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(module_server.url)
    yield module_server
    while mlflow.active_run():
        mlflow.end_run()
    if module_server.proc.poll() is not None:
        module_server.start()


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_points_logged_during_an_outage_are_replayed_with_their_step_and_time(server, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    buffer = MetricBuffer(run_id, tmp_path / "spill.jsonl", retry_s=0.5, write_every_s=0.2)
    stamps = {}
    for step in range(1, 41):
        if step == 11:
            server.stop()
            down_at = time.monotonic()
        if step == 31:  # kept on disk while the server is away (as soon as the writer has tried it)
            wait_until((tmp_path / "spill.jsonl").is_file, 120, "the spill file during the outage")
            server.start()
            print(f"outage survived: {time.monotonic() - down_at:.1f} s")  # fault figure, not asserted
        stamps[step] = int(time.time() * 1000)
        buffer.log({"loss": 1.0 / step}, step, timestamp_ms=stamps[step])
    assert buffer.close(wait_s=60) == 0
    history = {m.step: m for m in client.get_metric_history(run_id, "loss")}
    lost = 40 - len(history)
    print(f"metric points lost: {lost} of 40")  # fault figure
    assert sorted(history) == list(range(1, 41))
    assert all(history[s].timestamp == stamps[s] for s in history)  # original time, not the replay's
    assert not (tmp_path / "spill.jsonl").exists()


@pytest.mark.slow
def test_a_server_still_down_at_the_end_leaves_a_spill_file_and_its_upload_command(server, tmp_path, capsys):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    buffer = MetricBuffer(run_id, tmp_path / "spill.jsonl", retry_s=0.5, write_every_s=0.2)
    buffer.log({"loss": 0.5, "reward": 0.1}, 1)
    assert buffer.close(wait_s=30) == 0
    server.stop()
    buffer = MetricBuffer(run_id, tmp_path / "spill.jsonl", retry_s=0.5, write_every_s=0.2)
    for step in (2, 3):
        buffer.log({"loss": 0.5 / step, "reward": 0.1 * step}, step)
    assert buffer.close(wait_s=2) == 4
    command = capsys.readouterr().err.strip().splitlines()[-1]
    assert " runs upload-spill " in command and " -m verlflow" not in command  # the console script's form
    server.start()
    upload = subprocess.run([sys.executable, "-m", "verlflow.outage.metric_buffer", str(tmp_path / "spill.jsonl")],
                            capture_output=True, text=True, timeout=120)
    assert upload.returncode == 0, upload.stderr[-2000:]
    assert _steps(client, run_id, "loss") == _steps(client, run_id, "reward") == [1, 2, 3]


# A trainer that writes step 1, waits for the test to stop the server, logs step 2 and is killed outright.
_ORPHANING_TRAINER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from mlflow.tracking import MlflowClient
    from verlflow.outage import metric_buffer

    run_id, folder = sys.argv[1], Path(sys.argv[2])
    with metric_buffer.buffering(run_id, folder) as buffer:
        buffer.log({"loss": 1.0}, 1)
        buffer.write_soon()
        while buffer.written < 1:
            time.sleep(0.05)
        print(buffer.writer_pid, flush=True)
        while not (folder / "server-stopped").exists():
            time.sleep(0.05)
        buffer.log({"loss": 0.5}, 2)
        assert buffer.wait_in_pipe(60)  # the step is in the writer's hands, not written (it gathers for 600 s)
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.slow
def test_an_orphaned_writer_spills_what_it_holds_and_exits_while_the_server_is_away(server, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    trainer = subprocess.Popen([sys.executable, "-c", _ORPHANING_TRAINER, run_id, str(tmp_path)],
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "VERLFLOW_METRICS_WRITE_S": "600"})
    writer_pid = int(trainer.stdout.readline())
    server.stop()
    (tmp_path / "server-stopped").touch()
    assert trainer.wait(timeout=120) == -signal.SIGKILL
    # Before: it lived on for minutes, writing into the run being resumed. Now it exits within seconds.
    wait_until(lambda: not process_running(writer_pid), 60, "the orphaned writer's exit")
    server.start()
    assert metric_buffer.upload_spill(tmp_path / "metrics.spill.jsonl") == 1
    assert _steps(client, run_id, "loss") == [1, 2]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # above the sum of its three waits, so that a wait's own message is what fails
def test_training_goes_on_through_an_outage_and_finishes_with_every_step(server, tmp_path, monkeypatch, tiny_workdir):
    monkeypatch.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))
    # Each step written as it ends (not gathered for 2 s), so the outage starts while steps remain.
    monkeypatch.setenv("VERLFLOW_METRICS_WRITE_S", "0")
    monkeypatch.setenv("VERLFLOW_METRICS_NICE", "0")  # at nice 19 a busy trainer's steps show seconds late
    # Done training, the trainer waits this long for the server to take the rest: longer than a restart takes.
    monkeypatch.setenv("VERLFLOW_METRICS_FLUSH_S", "600")
    gsm8k.preprocess("synthetic", tmp_path / "data", 32, log_to_mlflow=False)
    steps = 8  # the outage begins once step 2 is written, the trainer a step or two further at most
    overrides = (f"trainer.total_training_steps={steps} trainer.test_freq=-1 "
                 f"verlflow.output_dir={tmp_path / 'outputs'}")
    # Output to a file, never an unread pipe: a trainer that fills a full pipe with outage warnings would block on it.
    log_path = tmp_path / "train.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "verlflow.cli", "train", "--recipe", "tiny", "--device", "cpu",
                                 "--data_dir", str(tmp_path / "data"), "--overrides", overrides], cwd=tmp_path,
                                stdout=log_file, stderr=subprocess.STDOUT, text=True)
    client = MlflowClient()

    def two_steps_written():
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  "tags.`verlflow.step` = 'train'")
        written = _steps(client, runs[0].info.run_id, "timing_s/step") if runs else []
        return (runs[0].info.run_id, written) if len(written) >= 2 else None

    try:
        run_id, written = wait_until(two_steps_written, 300, "training's step 2 written", poll_s=1, watch=[proc])
        with paused(proc.pid):  # so that the outage begins with steps still to make, on any host
            server.stop()
        # The rest of training with no server: the writer mirrors each step it cannot write to the spill file, and
        # the trainer, done, waits for the server instead of ending without it. Steps made before the pause may
        # still have reached the server: the outage's steps are those from the first spilled one on.
        spilled = wait_until(lambda: got if steps in (got := _spilled_steps(tmp_path / "outputs")) else None, 300,
                             f"step {steps} made during the outage", watch=[proc])
    except BaseException:  # pytest.fail's exception: the trainer's own account, shown with the failure
        print(log_path.read_text()[-6000:])
        raise
    assert spilled == set(range(min(spilled), steps + 1)) and min(spilled) > max(written), sorted(spilled)
    server.start()
    proc.wait(timeout=300)
    assert proc.returncode == 0, log_path.read_text()[-3000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in ("timing_s/step", "critic/score/mean", "actor/pg_loss"):
        assert _steps(client, run_id, key) == list(range(1, steps + 1)), key
    # The last step's rollout traces (verlflow.rollout_traces: 2), made during the outage: before, lost.
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=run_id, include_spans=False)
    assert sorted((t.info.tags["step"], t.info.tags["sample_index"]) for t in traces) == [(str(steps), "0"),
                                                                                          (str(steps), "1")]


def _spilled_steps(outputs: Path) -> set[int]:
    """Steps whose ``timing_s/step`` point a writer has put in a spill file under ``outputs``."""
    steps = set()
    for path in outputs.rglob("metrics.spill.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line being appended right now
                point = json.loads(line)
                if point.get("key") == "timing_s/step":
                    steps.add(int(point["step"]))
    return steps


def test_verl_is_given_mlflow_http_retry_knobs_for_a_tracking_server():
    from verlflow import config
    from verlflow.backends.verl.command import build_plan

    cfg = config.compose("qwen3-4b-gsm8k-grpo", "h20")
    remote = build_plan(cfg, run_id="r" * 32, experiment_name="E", run_name="r", tracking_uri="http://h:5000")
    local = build_plan(cfg, run_id="r" * 32, experiment_name="E", run_name="r", tracking_uri="sqlite:///m.db")
    assert int(remote.attach_env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) >= 10
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in local.attach_env
