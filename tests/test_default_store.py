"""With no tracking store named, every step uses the embedded default, ``sqlite:///mlflow.db`` in the working folder,
at every MLflow verlflow supports (MLflow 3.5/3.6 would fall back to a ``./mlruns`` file store, which MLflow 3 no
longer supports and verlflow refuses; scripts/test_lowest_mlflow.sh runs this at 3.5)."""

from __future__ import annotations

import os
import subprocess
import sys

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
