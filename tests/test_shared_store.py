"""Several processes on one SQLite tracking store: a write waits out another's lock instead of failing.

Two `mlflow run . -e main` started together in one folder used to end with one pipeline FAILED after its
training (``database is locked`` in ``log_batch``) and with system metrics dropped. Both tests use the real
store: one holds SQLite's write lock from another process past MLflow's own 20 s wait; the other runs two
whole pipelines at once and checks both finish and the registry has one champion.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO_ROOT, wait_until
from mlflow.tracking import MlflowClient

from verlflow.outage.store_retry import LockRetryingClient

# Holds SQLite's write lock on the file in argv[1] until a line arrives on stdin.
HOLD_LOCK = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("COMMIT")
"""


@pytest.mark.slow
def test_a_write_waits_out_another_process_holding_the_lock(tracking_uri, caplog):
    """MLflow waits 20 s for a lock, then fails; the retrying client keeps trying until the holder lets go."""
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    db_file = tracking_uri.removeprefix("sqlite:///")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, db_file], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        outcome: list[BaseException | None] = []

        def write() -> None:
            try:
                LockRetryingClient().set_tag(run_id, "written", "after the lock")
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                outcome.append(exc)

        caplog.set_level(logging.INFO, logger="verlflow.outage.store_retry")
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        # MLflow's own wait ran out and the write was refused: the writer now waits out the lock itself
        wait_until(lambda: "waits for it" in caplog.text or not writer.is_alive(), 300,
                   "the writer's retry after MLflow's own lock wait")
        assert writer.is_alive(), outcome
        holder.stdin.write("release\n")
        holder.stdin.flush()
        writer.join(timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert outcome == [None]
    assert client.get_run(run_id).data.tags["written"] == "after the lock"


def _project_copy(root: Path) -> Path:
    work = root / "project"
    work.mkdir()
    for name in ("MLproject", "conda.yaml"):
        shutil.copy(REPO_ROOT / name, work / name)
    shutil.copytree(REPO_ROOT / "entry_points", work / "entry_points")
    return work


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_two_main_pipelines_at_once_on_one_store_both_finish_with_one_champion(tmp_path, tiny_workdir):
    """The README's command twice at the same moment in one folder (tiny recipe: the plumbing, not learning)."""
    work = _project_copy(tmp_path)
    cache = tiny_workdir / "cache"  # the model built once, not by both pipelines racing for the folder
    # The folder's store exists, as in a project used before: two `mlflow run` creating a new store at the
    # same moment race in MLflow's own schema migration, before any verlflow code runs.
    MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}").search_experiments()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")}
    env.update(VERLFLOW_CACHE=str(cache), PYTHONPATH=str(REPO_ROOT / "src"))
    mlflow_cli = str(Path(sys.executable).with_name("mlflow"))
    # System metrics every second: more writes from both sides, and the ones MLflow's monitor used to drop.
    command = [mlflow_cli, "run", ".", "--env-manager", "local", "-P", "recipe=tiny", "-P", "device=cpu",
               "-P", "overrides=verlflow.system_metrics_interval=1"]
    logs = [tmp_path / f"main{i}.log" for i in (1, 2)]
    procs = []
    for log in logs:
        with open(log, "w") as out:
            procs.append(subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        codes = [proc.wait(timeout=3000) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n---\n".join(out[-3000:] for out in outputs)
    assert not any("database is locked" in out for out in outputs)

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    mains = client.search_runs(["0"], "tags.`verlflow.step` = 'main'")
    assert [r.info.status for r in mains] == ["FINISHED", "FINISHED"]
    everything = client.search_runs(["0"])
    assert {r.info.status for r in everything} == {"FINISHED"}  # every child of both pipelines too
    trains = client.search_runs(["0"], "tags.`verlflow.step` = 'train'")
    assert len(trains) == 2
    for train in trains:  # each kept its per-step history and its system metrics
        assert train.data.metrics.get("timing_s/e2e", 0) > 0
        assert any(key.startswith("system/") for key in train.data.metrics)
    name = "tiny-qwen3-gsm8k-tiny"  # the tiny recipe's verlflow.model_name
    versions = client.search_model_versions(f"name = '{name}'")
    assert 1 <= len(versions) <= 2  # one each, or one when a pipeline reused the other's finished training
    champion = client.get_model_version_by_alias(name, "champion")
    assert champion.version in {v.version for v in versions}
    holders = [v.version for v in versions if "champion" in client.get_model_version(name, v.version).aliases]
    assert holders == [champion.version]
