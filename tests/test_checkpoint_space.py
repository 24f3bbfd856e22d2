"""A write that fails for space is one line naming where and how much is free: a local run's checkpoint, and a
SQLite tracking store on a full disk.

A disk cannot be filled on cue here, so the train step runs under a file-size limit (``ulimit -f``), which
fails a write the same way (EFBIG, and torch's zip writer's "unexpected pos …" on top). The store is a real
``mlflow server`` in its own process, outside the limit, as a team's server is on another disk.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import every_experiment, fresh_store, serving
from mlflow.tracking import MlflowClient

from verlflow.data import gsm8k

ROOT = Path(__file__).resolve().parents[1]
# Above the tiny model's weights (about 0.6 MB), below its trainer state (weights plus two Adam moments).
FILE_LIMIT_BYTES = 1024 * 1024


@pytest.fixture
def server(tmp_path, monkeypatch):
    yield from serving(tmp_path, monkeypatch, {})


def _limit_file_size(size: int = FILE_LIMIT_BYTES):
    """A child's pre-exec hook: writes past ``size`` bytes fail (EFBIG), as on a full disk."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


# Below the tiny model's weights: safetensors fails first, with its own error type (issue 56: a traceback).
WEIGHTS_LIMIT_BYTES = 256 * 1024


@pytest.mark.slow
@pytest.mark.parametrize("limit, reason", [
    (FILE_LIMIT_BYTES, r"the file stopped short: torch's unexpected pos \d+ vs \d+"),
    (WEIGHTS_LIMIT_BYTES, "File too large"),
], ids=["torch", "safetensors"])
def test_a_checkpoint_that_cannot_be_written_is_one_line_naming_the_folder_and_its_free_space(
        server, tmp_path, tiny_workdir, limit, reason):
    gsm8k.preprocess("synthetic", tmp_path / "data", 16, log_to_mlflow=False)
    checkpoints = tmp_path / "checkpoints"
    env = {**os.environ, "VERLFLOW_CACHE": str(tiny_workdir / "cache"), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "verlflow.cli", "train", "--recipe", "tiny", "--device", "cpu", "--data_dir",
         str(tmp_path / "data"), "--overrides",
         f"trainer.total_training_steps=3 trainer.save_freq=2 trainer.default_local_dir={checkpoints} "
         f"verlflow.output_dir={tmp_path / 'outputs'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, preexec_fn=_limit_file_size(limit))
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("verlflow train: error:")]
    print(error)
    # Before: "unexpected pos 1002112 vs 1002000" alone, never a word on space.
    assert re.search(rf"the step-2 checkpoint could not be written to {re.escape(str(checkpoints))} \({reason}; "
                     rf"\d+ MiB free there, and a file-size limit of {limit / 2**20:.1f} MiB \(ulimit -f\)\)",
                     error), error
    assert "ulimit -f" in error and "--resume" in error
    assert not list(checkpoints.glob("*global_step_*"))  # no half checkpoint for a resume to pick up

    client = MlflowClient()
    (run,) = client.search_runs(every_experiment(client))
    assert run.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "timing_s/step")] == [1, 2]


STORE_LIMIT_BYTES = 256 * 1024  # below an empty store's size: its first write past the limit fails


@pytest.mark.slow
def test_a_sqlite_store_that_cannot_be_written_is_one_line_naming_it_and_its_free_space(tmp_path):
    # Before: a traceback out of MLflow's session ("disk I/O error"), and MLflow's own logged tracebacks.
    uri = fresh_store(tmp_path)
    assert (tmp_path / "mlflow.db").stat().st_size > STORE_LIMIT_BYTES
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT / "src")}
    env.pop("MLFLOW_RUN_ID", None)
    done = subprocess.run(
        [sys.executable, "-m", "verlflow.cli", "preprocess", "--source", "synthetic", "--limit", "8"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (STORE_LIMIT_BYTES, resource.RLIM_INFINITY)))
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("verlflow preprocess: error:")]
    assert re.search(rf"the tracking store {re.escape(str(tmp_path / 'mlflow.db'))} could not be written \(.*disk "
                     r"I/O error; \d+ MiB free there, and a file-size limit of 0\.2 MiB \(ulimit -f\)\)", error), error
    assert "MLFLOW_TRACKING_URI" in error
