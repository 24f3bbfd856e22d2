"""SIGTERM to ``mlflow run -e train`` ends the train run KILLED every time, never RUNNING with no process; so
does Ctrl-C to its process group, once or twice.

In 1 of 6 tries the step printed "the mlflow run launcher is gone: stopping this step" and vanished, its run
left RUNNING: the launcher was its direct parent, so the kernel (``PR_SET_PDEATHSIG``) and the launcher watcher
each sent it a SIGTERM, and the second one landed while the first was ending the run. That window is not left to
chance here: after the launcher's SIGTERM the test itself sends the step SIGTERM after SIGTERM until it exits, so
more signals land while the run is ending in every try; three launches, three KILLED runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import wait_until
from mlflow.tracking import MlflowClient

from verlflow import names
from verlflow.data import gsm8k
from verlflow.process import lifecycle

ROOT = Path(__file__).resolve().parents[1]
TRIES = 3
STORM_GAP_S = 0.02  # between the SIGTERMs sent to a stopping step


@pytest.mark.slow
def test_sigterm_to_mlflow_run_ends_the_train_run_killed_every_time(tracking_uri, tmp_path, monkeypatch,
                                                                     tiny_workdir):
    monkeypatch.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))
    monkeypatch.setenv("VERLFLOW_METRICS_WRITE_S", "0")
    gsm8k.preprocess("synthetic", tmp_path / "data", 16, log_to_mlflow=False)
    client = MlflowClient()
    client.search_experiments()  # the store's tables, before two processes race to make them
    overrides = (f"trainer.total_training_steps=200 trainer.test_freq=-1 trainer.save_freq=-1 "
                 f"verlflow.output_dir={tmp_path / 'outputs'} verlflow.system_metrics_interval=0")
    statuses = [_sigterm_once(client, tmp_path, overrides, attempt) for attempt in range(TRIES)]
    assert statuses == ["KILLED"] * TRIES


@pytest.mark.slow
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_to_mlflow_runs_process_group_ends_the_train_run_killed(presses, tracking_uri, tmp_path, monkeypatch,
                                                                        tiny_workdir):
    # MLflow's launcher marks the run FAILED after the step ended it KILLED (its _maybe_set_run_terminated checks a
    # status string as an enum number): the step leaves a watcher that puts KILLED back once the launcher is gone.
    monkeypatch.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))
    gsm8k.preprocess("synthetic", tmp_path / "data", 16, log_to_mlflow=False)
    client = MlflowClient()
    client.search_experiments()
    overrides = (f"trainer.total_training_steps=200 trainer.test_freq=-1 trainer.save_freq=-1 "
                 f"verlflow.output_dir={tmp_path / 'outputs'} verlflow.system_metrics_interval=0")
    run_id, launcher, log = _launch_and_hold(client, tmp_path, overrides, 0, own_group=True)
    for _ in range(presses):
        os.killpg(launcher.pid, signal.SIGINT)  # what the terminal sends the whole foreground group
    launcher.wait(timeout=300)
    wait_until(lambda: client.get_run(run_id).info.status == "KILLED", 120, "the run to end KILLED",
               detail=lambda: f"{client.get_run(run_id).info.status}\n{log.read_text()[-3000:]}")
    assert client.get_run(run_id).data.tags[names.ERROR_TAG] == "RunInterrupted: interrupted by SIGINT"
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


@pytest.mark.slow
def test_ctrl_c_while_the_step_still_loads_ends_the_launchers_run_killed(tracking_uri, tmp_path, monkeypatch,
                                                                        tiny_workdir):
    # Before: a traceback out of `import verlflow.cli` and the run FAILED with no reason, or (Ctrl-C before the
    # launcher's own wait began) left RUNNING; the step had not yet taken the launcher's run over.
    monkeypatch.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))
    gsm8k.preprocess("synthetic", tmp_path / "data", 16, log_to_mlflow=False)
    client = MlflowClient()
    client.search_experiments()
    log = tmp_path / "launcher.log"
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "train",
             "-P", "recipe=tiny", "-P", "device=cpu", "-P", f"data_dir={tmp_path / 'data'}"],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: _step_catches_sigterm(launcher.pid), 300, "the step's signal handlers", poll_s=0.01,
                   watch=[launcher], detail=lambda: log.read_text()[-3000:])
    except BaseException:
        launcher.kill()
        raise
    os.killpg(launcher.pid, signal.SIGINT)
    launcher.wait(timeout=300)
    run_id = re.search(r"in run with ID '(\w+)'", log.read_text()).group(1)
    wait_until(lambda: client.get_run(run_id).info.status == "KILLED", 120, "the run to end KILLED",
               detail=lambda: f"{client.get_run(run_id).info.status}\n{log.read_text()[-3000:]}")
    assert client.get_run(run_id).data.tags[names.ERROR_TAG] == "RunInterrupted: interrupted by SIGINT"
    text = log.read_text()
    assert "verlflow train: interrupted" in text and "Traceback" not in text, text[-3000:]


def _step_catches_sigterm(launcher_pid: int) -> bool:
    """Whether the step's Python process has installed its SIGTERM handler (``SigCgt`` in ``/proc/<pid>/status``):
    its first act, before it loads anything. A signal before that finds Python itself still starting."""
    for child in psutil.Process(launcher_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error, OSError):
            if "entry_points/train.py" not in child.cmdline():
                continue
            status = Path(f"/proc/{child.pid}/status").read_text()
            caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M).group(1), 16)
            if caught & (1 << (signal.SIGTERM - 1)):
                return True
    return False


def _launch_and_hold(client: MlflowClient, tmp_path: Path, overrides: str, attempt: int, *,
                     own_group: bool = False) -> tuple[str, subprocess.Popen, Path]:
    """Launch ``mlflow run -e train`` and wait until its step holds the run: (run id, launcher, its log)."""
    log = tmp_path / f"launcher-{attempt}.log"
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "train",
             "-P", "recipe=tiny", "-P", "device=cpu", "-P", f"data_dir={tmp_path / 'data'}",
             "-P", f"overrides={overrides}"], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=own_group)

    def held() -> str | None:  # the step has attached to the launcher's run and marked it as its own
        found = re.search(r"in run with ID '(\w+)'", log.read_text())
        if found and names.PID_TAG in client.get_run(found.group(1)).data.tags:
            return found.group(1)
        return None

    try:
        run_id = wait_until(held, 300, f"try {attempt}: the step holding its run", poll_s=0.1, watch=[launcher],
                            detail=lambda: log.read_text()[-3000:])
    except BaseException:
        launcher.kill()
        raise
    return run_id, launcher, log


def _sigterm_once(client: MlflowClient, tmp_path: Path, overrides: str, attempt: int) -> str:
    """Launch ``mlflow run -e train``, SIGTERM the launcher once the step holds its run, return the run's status."""
    run_id, launcher, log = _launch_and_hold(client, tmp_path, overrides, attempt)
    try:
        step_pid = int(client.get_run(run_id).data.tags[names.PID_TAG])
        launcher.send_signal(signal.SIGTERM)  # the launcher only, as a scheduler or `timeout` does
        wait_until(lambda: _signalled_again(step_pid), 120, f"try {attempt}: the step's exit", poll_s=STORM_GAP_S)
    finally:
        launcher.kill()
        launcher.wait(timeout=60)
    return client.get_run(run_id).info.status


def _signalled_again(step_pid: int) -> bool:
    """Whether the step has exited; while it has not, one more SIGTERM (the kernel's and the watcher's, and more)."""
    if not lifecycle.process_alive(step_pid):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(step_pid, signal.SIGTERM)
    return False
