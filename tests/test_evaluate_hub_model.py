"""evaluate with a Hugging Face hub id: read from Hugging Face's cache (as verl does), one line when offline.

The cache is a test folder (``HF_HOME``) laid out as huggingface_hub documents it
(``hub/models--<org>--<name>/refs/main`` → ``snapshots/<revision>/``), holding the tiny model;
``HF_HUB_OFFLINE=1`` keeps the test off the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from verlflow import names

HUB_ID = "verlflow-test/tiny-qwen3"
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def synthetic_data(tmp_path) -> Path:
    from verlflow.data import gsm8k

    out = tmp_path / "data"
    gsm8k.preprocess("synthetic", out, 4, log_to_mlflow=False)
    return out


def _evaluate(tmp_path: Path, data_dir: Path, hf_home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "HF_HUB_CACHE")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "verlflow.cli", "evaluate", "--model_uri", HUB_ID, "--data_dir", str(data_dir),
         "--limit", "2", "--backend", "hf"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
    )


@pytest.mark.slow
def test_hub_id_offline_and_not_cached_is_one_line_and_exit_2(tracking_uri, tmp_path, synthetic_data):
    proc = _evaluate(tmp_path, synthetic_data, tmp_path / "empty-hf-home")
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"verlflow evaluate: error: hub model '{HUB_ID}' is not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE is set" in last
    assert "Traceback" not in proc.stderr
    assert mlflow.search_runs(search_all_experiments=True).empty  # nothing was opened


@pytest.mark.slow
def test_hub_id_in_the_cache_is_evaluated(tracking_uri, tmp_path, synthetic_data):
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    repo = tmp_path / "hf-home" / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    shutil.copytree(resolve_model_path(TINY_SENTINEL), repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)

    proc = _evaluate(tmp_path, synthetic_data, tmp_path / "hf-home")

    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"evaluate: {HUB_ID}: accuracy" in proc.stdout
    [run] = MlflowClient().search_runs(["0"])
    assert run.info.status == "FINISHED"
    assert run.data.tags[names.MODEL_URI_TAG] == HUB_ID
    assert run.data.metrics[names.EVAL_NUM_SAMPLES] == 2
