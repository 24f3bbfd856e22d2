"""Stop and resume say where they stand (issue 58, item 2).

Ctrl-C to a local training with ``trainer.save_freq=-1`` (as the smoke recipe has: it saves only at the end) keeps
its last whole step as a checkpoint, and the stop line names it; ``--resume`` prints the step it continues after
and trains the rest, every step logged once. A run that lost its process without a stop (SIGKILL, the OOM killer)
has logged steps and no checkpoint: ``--resume`` refuses, in one line, to restart it at step 0.

The stop is a real SIGINT to a real ``verlflow train`` process; the process is held still (SIGSTOP) while the signal
is sent, so it lands with steps remaining however fast a step is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_in_process, paused, wait_until
from mlflow.tracking import MlflowClient

from verlflow.data import gsm8k

ROOT = Path(__file__).resolve().parents[1]
STEPS = 40  # a tenth of a second each here: a stop held off until two are logged lands with many left


def _start_training(tmp_path: Path) -> tuple[subprocess.Popen, str, MlflowClient]:
    """``verlflow train`` of the tiny recipe, saving no checkpoint on schedule, until two steps are in the store."""
    gsm8k.preprocess("synthetic", tmp_path / "data", 32, log_to_mlflow=False)
    client = MlflowClient()
    client.search_experiments()  # the store's tables, before the training process makes them
    overrides = (f"trainer.total_training_steps={STEPS} trainer.save_freq=-1 trainer.test_freq=-1 "
                 f"verlflow.output_dir={tmp_path / 'outputs'} verlflow.system_metrics_interval=0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "verlflow.cli", "train", "--recipe", "tiny", "--device", "cpu",
         "--data_dir", str(tmp_path / "data"), "--overrides", overrides],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "VERLFLOW_METRICS_WRITE_S": "0",
             "VERLFLOW_METRICS_NICE": "0"})
    try:
        run = wait_until(lambda: _train_run(client), 300, "the train run", poll_s=0.2, watch=[proc])
        wait_until(lambda: len(client.get_metric_history(run.info.run_id, "timing_s/step")) >= 2, 600,
                   "two logged steps", poll_s=0.2, watch=[proc])
    except BaseException:
        proc.kill()
        print(proc.communicate()[1][-3000:])
        raise
    return proc, run.info.run_id, client


def _train_run(client: MlflowClient):
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.`verlflow.step` = 'train'")
    return runs[0] if runs else None


def _logged_steps(client: MlflowClient, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "timing_s/step"))


@pytest.mark.slow
def test_ctrl_c_keeps_the_last_step_says_so_and_resume_continues_after_it(tracking_uri, tmp_path, monkeypatch,
                                                                          tiny_workdir):
    monkeypatch.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))
    proc, run_id, client = _start_training(tmp_path)
    with paused(proc.pid):
        proc.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert client.get_run(run_id).info.status == "KILLED"
    kept = _logged_steps(client, run_id)
    assert 2 <= len(kept) < STEPS and kept == list(range(1, len(kept) + 1)), kept
    last = kept[-1]
    checkpoint = (tmp_path / "outputs").resolve() / run_id / "checkpoints" / f"global_step_{last}"
    assert (f"verlflow train: interrupted; last checkpoint: step {last} of {STEPS}, {checkpoint}; "
            f"`verlflow train --resume {run_id}` (-P resume={run_id}) continues after it") in err.splitlines(), \
        err[-3000:]
    assert (checkpoint / "trainer_state.pt").is_file()

    done = cli_in_process(["train", "--resume", run_id], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"verlflow: resume: run {run_id} continues after step {last} of {STEPS} (checkpoint {checkpoint})"
            in done.stdout), done.stdout[-3000:]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert _logged_steps(client, run_id) == list(range(1, STEPS + 1))  # each step once, none trained twice


@pytest.mark.slow
def test_resume_of_a_run_killed_without_a_checkpoint_refuses_to_start_it_over(tracking_uri, tmp_path, monkeypatch,
                                                                              tiny_workdir):
    monkeypatch.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))
    proc, run_id, client = _start_training(tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)  # as the OOM killer does (its metric writer too): no stop, no checkpoint
    proc.communicate(timeout=120)
    kept = _logged_steps(client, run_id)
    assert kept, "a step reached the run before the kill"

    done = cli_in_process(["train", "--resume", run_id], cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    folder = (tmp_path / "outputs").resolve() / run_id / "checkpoints"
    assert lines[0] == (f"verlflow train: error: resume: run {run_id} logged steps up to {kept[-1]} but has no "
                        f"checkpoint under {folder} (none was saved or all were removed; trainer.save_freq=-1): "
                        "resuming would restart it at step 0; to start over, start a new run (the same command "
                        "without --resume)"), lines
    assert _logged_steps(client, run_id) == kept  # nothing trained again
    assert client.get_run(run_id).info.status != "RUNNING"
