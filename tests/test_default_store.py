"""With no tracking store named, every step uses the embedded default, ``sqlite:///mlflow.db`` in the working folder,
at every MLflow verlflow supports (MLflow 3.5/3.6 would fall back to a ``./mlruns`` file store, which MLflow 3 no
longer supports and verlflow refuses; scripts/test_lowest_mlflow.sh runs this at 3.5). A step about to create that
file says so first, on stderr: started in another folder than the project's, it reads a new, empty store (issue 58,
item 6)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import cli_in_process
from mlflow.tracking import MlflowClient


def test_a_step_with_no_tracking_uri_tracks_into_mlflow_db_in_its_folder(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    done = subprocess.run([sys.executable, "-m", "verlflow.cli", "preprocess", "--source", "synthetic", "--limit", "4",
                           "--output_dir", "data"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "data" / "train.parquet").is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [(r.info.status, r.data.tags.get("verlflow.step")) for r in runs] == [("FINISHED", "preprocess")]


def test_a_step_started_outside_the_project_says_it_makes_a_new_store_before_the_error_it_leads_to(tmp_path):
    elsewhere = tmp_path / "home"  # not the project folder: a folder with no mlflow.db
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    done = cli_in_process(["evaluate", "--model_uri", "models:/tiny-qwen3-gsm8k-smoke@champion"], env=env,
                          cwd=elsewhere)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 2, done.stderr[-2000:]
    assert lines[0].startswith("verlflow: no MLFLOW_TRACKING_URI set: using sqlite:///mlflow.db, a new, empty store "
                               f"at {elsewhere / 'mlflow.db'}; "), lines
    assert "run register first" in lines[1]  # true of this new store, and now read as such
    assert (elsewhere / "mlflow.db").is_file()

    again = cli_in_process(["evaluate", "--model_uri", "models:/tiny-qwen3-gsm8k-smoke@champion"], env=env,
                           cwd=elsewhere)
    assert "MLFLOW_TRACKING_URI" not in again.stderr and again.stderr.count("\n") == 1, again.stderr  # not new now


def test_doctor_looks_at_the_machine_only_and_leaves_no_store_behind(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    done = cli_in_process(["doctor", "--device", "npu"], env=env, cwd=tmp_path)
    assert "Traceback" not in done.stderr and "MLFLOW_TRACKING_URI" not in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists()
