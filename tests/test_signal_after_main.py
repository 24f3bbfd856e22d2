"""Ctrl-C just after ``mlflow run .`` printed ``main: done`` leaves the pipeline's run FINISHED (issue 56 item 8).

Before: the run ended FAILED with no ``verlflow.error`` tag (a Ctrl-C after main's last line), or KILLED (one at the
done line, which the step still took as a stop). The same Ctrl-C reaches ``mlflow run``'s launcher, whose
end (``_maybe_set_run_terminated(run, "FAILED")``, MLflow 3.x) overwrites a run that already ended; the step, past
its last safe point while it exits, did not leave the watcher that puts its end back (or, caught at that point, it
left one that ended the finished run KILLED). A real ``mlflow run`` of the tiny recipe, a real SIGINT to its process
group as the terminal sends it, as soon as the done line is printed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, wait_until
from mlflow.tracking import MlflowClient

from verlflow import names

# When the Ctrl-C comes: at the done line (the step prints its links after it, then reaches its last safe point: the
# step sees the stop), or after the last line it prints (past that point: only the launcher acts on it).
MOMENTS = {"at the done line": r"^main: done ", "after its last line": r"^main: \S+ v\d+: http"}


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_ctrl_c_just_after_main_printed_done_leaves_the_pipeline_finished(moment, tmp_path, tiny_workdir):
    work = tmp_path / "project"  # main writes its data folder into the project's folder: a copy of it
    work.mkdir()
    for name in ("MLproject", "conda.yaml"):
        shutil.copy(REPO_ROOT / name, work / name)
    shutil.copytree(REPO_ROOT / "entry_points", work / "entry_points")
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    client.search_experiments()  # the store's tables, before the launcher and the step race to make them
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    # Lines as a terminal shows them (a file would get the step's output only when it exits).
    env.update(VERLFLOW_CACHE=str(tiny_workdir / "cache"), PYTHONPATH=str(REPO_ROOT / "src"), PYTHONUNBUFFERED="1",
               MLFLOW_TRACKING_URI=uri)
    log = tmp_path / "main.log"
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlflow")), "run", ".", "--env-manager", "local", "-P", "recipe=tiny",
             "-P", "device=cpu", "-P", "overrides=verlflow.system_metrics_interval=0"],
            cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: re.search(MOMENTS[moment], log.read_text(), re.M), 3000, f"main's output {moment}",
                   poll_s=0.01, watch=[launcher], detail=lambda: log.read_text()[-3000:])
        os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C: the terminal sends it to the whole foreground group
        launcher.wait(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    [parent] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  f"tags.`{names.STEP_TAG}` = 'main'")

    def settled() -> str | None:  # the launcher has exited: only the step's watcher may still change the run
        status = client.get_run(parent.info.run_id).info.status
        return status if status != "FAILED" else None

    wait_until(settled, 120, "the pipeline's run to end other than FAILED",
               detail=lambda: f"{client.get_run(parent.info.run_id).data.tags}\n{log.read_text()[-3000:]}")
    ended = client.get_run(parent.info.run_id)
    assert (ended.info.status, ended.data.tags.get(names.ERROR_TAG)) == ("FINISHED", None), log.read_text()[-3000:]


def test_the_watcher_puts_back_a_finished_run_the_launcher_turned_failed(tracking_uri):
    from mlflow import projects

    from verlflow.process.launcher_status import restore_killed

    client = MlflowClient()
    run = client.create_run("0")
    client.set_terminated(run.info.run_id, "FINISHED")  # what the step did before the Ctrl-C
    projects._maybe_set_run_terminated(run, "FAILED")  # what the interrupted launcher does on its way out
    launcher = subprocess.Popen([sys.executable, "-c", "pass"])  # a launcher that has exited
    launcher.wait()
    assert restore_killed(run.info.run_id, launcher.pid, None, "SIGINT", ended="FINISHED") == "FINISHED"
    ended = client.get_run(run.info.run_id)
    assert (ended.info.status, ended.data.tags.get(names.ERROR_TAG)) == ("FINISHED", None)
