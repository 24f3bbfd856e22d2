"""A search trial gets its overrides in its environment, never on its command line.

``ps`` and ``/proc/<pid>/cmdline`` (mode 0444) show every user of the machine a process's command line, and a
search's fixed overrides may hold a secret (``+trainer.wandb_password=…``). Read here: the command line of a live
trial process, which still gets every override (an unknown key among them is refused by name).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import wait_until
from mlflow.tracking import MlflowClient

from verlflow.search.trial import TrialRunner

SECRET = "TrialSecret9876"


@pytest.mark.slow
def test_a_trial_gets_its_overrides_by_environment_not_on_its_command_line(tracking_uri, tmp_path):
    runner = TrialRunner(recipe="tiny", device="cpu", data_dir=str(tmp_path / "data"), parent_run_id="",
                         experiment_id="0", study_name="study", metric="val/accuracy", tracking_uri=tracking_uri,
                         fixed_overrides={"+trainer.wandb_password": SECRET})
    run_id = MlflowClient().create_run("0").info.run_id
    proc = subprocess.Popen(runner.command(), env=runner.environment(0, run_id, {"trainer.no_such_key": 1}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    # Popen returns once the child has exec'd; the kernel sets the new command line a moment later.
    cmdline = wait_until(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes(), 120, "the trial's command line",
                         watch=[proc])
    out, err = proc.communicate(timeout=600)
    assert b"train\x00--recipe\x00tiny" in cmdline
    assert SECRET.encode() not in cmdline and b"no_such_key" not in cmdline and b"\x00--overrides" not in cmdline
    assert proc.returncode == 2 and "trainer.no_such_key" in err, err[-2000:]  # the overrides arrived
    assert SECRET not in out + err
