"""What the tests of real verl launches on this CPU share: the tiny recipe's settings, a store and data to launch
into, `mlflow run -e train -P backend=verl` as a user starts it, and what a launch leaves behind.

Used by tests/test_verl_cpu_launch.py (one finished launch, read by its tests), tests/test_verl_cpu_crash.py (a
launch that crashes on purpose) and tests/test_verl_resume.py (a launch stopped and resumed): one file each, so
that xdist can run their launches, minutes each on 2 cores, on two workers at once.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
from conftest import cli_in_process, fresh_store
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[1]
# Two steps, validating on the last: every per-step curve has two points; same values for both backends.
RECIPE_OVERRIDES = "trainer.total_training_steps=2 trainer.test_freq=2"


def launch_env(workdir: Path, cache: Path) -> dict[str, str]:
    """This process's environment with a fresh store in ``workdir`` and the session's tiny model cache, outside any
    run or experiment of the caller."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME")}
    env["MLFLOW_TRACKING_URI"] = fresh_store(workdir)
    env["VERLFLOW_CACHE"] = str(cache)
    return env


def verlflow(args: list[str], env: dict[str, str], cwd: Path) -> None:
    """``verlflow ARGS`` run in this process (the step is tested, not its process); fails the test unless it
    succeeds."""
    done = cli_in_process(args, env=env, cwd=cwd)
    assert done.returncode == 0, f"verlflow {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def synthetic_data(env: dict[str, str], workdir: Path) -> Path:
    """32 synthetic GSM8K rows in verl's format, preprocessed into the store of ``env`` (a preprocess run)."""
    data_dir = workdir / "data"
    verlflow(["preprocess", "--source", "synthetic", "--output_dir", str(data_dir), "--limit", "32"], env, workdir)
    return data_dir


def mlflow_train(env: dict[str, str], workdir: Path, data_dir: Path, overrides: str) -> subprocess.CompletedProcess:
    """`mlflow run . -e train -P device=cpu -P backend=verl` of the tiny recipe, as a user starts it."""
    return subprocess.run(
        ["mlflow", "run", str(REPO), "--env-manager", "local", "-e", "train", "-P", "recipe=tiny", "-P", "device=cpu",
         "-P", "backend=verl",
         "-P", f"data_dir={data_dir}", "-P", f"overrides={overrides} verlflow.output_dir={workdir / 'outputs'}"],
        env=env, cwd=workdir, capture_output=True, text=True, timeout=900)


def train_runs(uri: str) -> list:
    """The store's train runs, oldest first."""
    client = MlflowClient(tracking_uri=uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`verlflow.step` = 'train'", order_by=["attributes.start_time ASC"])


def ray_processes_of(run_id: str) -> list[str]:
    """Ray's head processes (raylet, gcs_server) started for this run (they inherit MLFLOW_RUN_ID)."""
    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.info["name"] in ("raylet", "gcs_server") and proc.environ().get("MLFLOW_RUN_ID") == run_id:
                found.append(f"{proc.info['name']} pid {proc.pid}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found
