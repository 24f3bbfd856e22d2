"""SIGTERM to the ``mlflow run`` launcher stops its train step (KILLED, steps kept); ``--resume`` finishes it.

What a scheduler, a ``timeout`` or a closed terminal does: signal the ``mlflow run`` process only. Its
child, the train step, must not train on unseen: it ends the run KILLED within seconds, keeping its
metrics and last checkpoint. ``verlflow train --resume <run_id>`` then continues the same run from that
checkpoint to FINISHED with every step logged exactly once, and ``timing_s/e2e`` covering both attempts; a
second ``--resume`` started at the same moment is refused in one line (the run's lease), so no step is logged twice.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import paused, wait_until
from mlflow.tracking import MlflowClient

from verlflow import names
from verlflow.data import gsm8k
from verlflow.process import lifecycle

ROOT = Path(__file__).resolve().parents[1]
# The step is held still (SIGSTOP) from two logged steps until the launcher's SIGTERM has reached it: the signal
# lands with steps remaining however fast a step is, and the resume has few steps left to train.
STEPS = 8
OVERRIDES = f"trainer.total_training_steps={STEPS} trainer.save_freq=1 trainer.test_freq=-1"  # + output_dir


def _sigterm_pending(pid: int) -> bool:
    """Whether a SIGTERM waits to be delivered to process ``pid`` (``SigPnd``/``ShdPnd`` in ``/proc/<pid>/status``):
    one the dying launcher's kernel sent it (``PR_SET_PDEATHSIG``) while it was held still."""
    status = Path(f"/proc/{pid}/status").read_text()
    pending = [int(value, 16) for value in re.findall(r"^(?:SigPnd|ShdPnd):\s*([0-9a-f]+)", status, re.M)]
    return any(mask & (1 << (signal.SIGTERM - 1)) for mask in pending)


def _train_run(client: MlflowClient):
    runs = client.search_runs(["0"], "tags.`verlflow.step` = 'train'")
    return runs[0] if runs else None


@pytest.mark.slow
def test_sigterm_to_mlflow_run_kills_the_step_and_resume_finishes_it(tracking_uri, tmp_path, monkeypatch,
                                                                      tiny_workdir):
    monkeypatch.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))
    # Each step written as it ends (not gathered for 2 s), so the test can signal while steps remain.
    monkeypatch.setenv("VERLFLOW_METRICS_WRITE_S", "0")
    monkeypatch.setenv("VERLFLOW_METRICS_NICE", "0")  # at nice 19 a busy trainer's steps show seconds late
    gsm8k.preprocess("synthetic", tmp_path / "data", 32, log_to_mlflow=False)
    client = MlflowClient()
    client.search_experiments()  # create the store's tables before two processes race to
    log = (tmp_path / "launcher.log").open("w")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "train",
         "-P", "recipe=tiny", "-P", "device=cpu", "-P", f"data_dir={tmp_path / 'data'}",
         "-P", f"overrides={OVERRIDES} verlflow.output_dir={tmp_path / 'outputs'}"],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        run = wait_until(lambda: _train_run(client), 300, "the train run: " + str(tmp_path / "launcher.log"),
                         poll_s=0.5)
        run_id = run.info.run_id
        wait_until(lambda: len(client.get_metric_history(run_id, "timing_s/step")) >= 2, 600, "two logged steps",
                   poll_s=0.5)
        step_pid = int(client.get_run(run_id).data.tags[names.PID_TAG])
        with paused(step_pid):
            launcher.send_signal(signal.SIGTERM)  # the launcher only, not its process group
            signalled = time.monotonic()
            wait_until(lambda: _sigterm_pending(step_pid), 60, "the launcher's SIGTERM pending in the step")
        wait_until(lambda: client.get_run(run_id).info.status != "RUNNING", 60, "the run to end", poll_s=0.5)
        ended_after = time.monotonic() - signalled
    finally:
        launcher.kill()
        launcher.wait(timeout=60)
    print(f"SIGTERM to mlflow run -> run ended after {ended_after:.1f} s")  # fault figure, not asserted
    killed = client.get_run(run_id)
    assert killed.info.status == "KILLED"
    # one train run: the metric writer process did not run the entry-point script again
    assert [r.info.run_id for r in client.search_runs(["0"], "tags.`verlflow.step` = 'train'")] == [run_id]
    kept = sorted(m.step for m in client.get_metric_history(run_id, "timing_s/step"))
    assert 2 <= len(kept) < STEPS and kept == list(range(1, len(kept) + 1))
    wait_until(lambda: not lifecycle.process_alive(step_pid), 30, "the step process to exit", poll_s=0.5)

    # Two resumes at once (a retried job, two people): the run's lease lets one train, the other is refused.
    resumes = [subprocess.Popen([sys.executable, "-m", "verlflow.cli", "train", "--resume", run_id], cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    ended = sorted(((proc.returncode, err) for proc in resumes for _, err in [proc.communicate(timeout=900)]),
                   key=lambda ended: ended[0])
    assert [code for code, _ in ended] == [0, 2], ended[1][1][-3000:]
    refused = ended[1][1].strip()
    assert "is being resumed by process" in refused and refused.count("\n") == 0, refused
    resumed = client.get_run(run_id)
    assert resumed.info.status == "FINISHED"
    assert "verlflow.error" not in resumed.data.tags
    for name in ("timing_s/step", "critic/score/mean", "actor/pg_loss"):
        assert sorted(m.step for m in client.get_metric_history(run_id, name)) == list(range(1, STEPS + 1)), name
    attempts = {m.step: m.value for m in client.get_metric_history(run_id, "attempt/e2e_s")}
    assert sorted(attempts) == [1, 2]
    # timing_s/e2e = attempt 1's time + attempt 2's time up to its end-of-training summaries; attempt 2's
    # own time runs on to its process's end. Both from one clock: exact, whatever the machine's load.
    e2e, rounding = resumed.data.metrics["timing_s/e2e"], 1e-3  # epoch seconds in a float: ~1e-6 s steps
    assert attempts[1] < e2e <= attempts[1] + attempts[2] + rounding
