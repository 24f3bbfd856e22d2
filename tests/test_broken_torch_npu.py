"""A machine whose torch_npu is installed but cannot import (CANN not sourced) gets one line, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from verlflow.data import gsm8k
from verlflow.models.model_path import resolve_model_path

# What torch_npu raises when CANN's libraries are not on the loader path (set_env.sh not sourced).
BROKEN_TORCH_NPU = 'raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")\n'


@pytest.mark.slow
def test_evaluate_with_a_torch_npu_that_fails_to_import_prints_one_line(tmp_path, tracking_uri):
    fake_site = tmp_path / "site"
    (fake_site / "torch_npu").mkdir(parents=True)
    (fake_site / "torch_npu" / "__init__.py").write_text(BROKEN_TORCH_NPU)
    gsm8k.preprocess("synthetic", tmp_path / "data", 4, log_to_mlflow=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_site), os.environ.get("PYTHONPATH", "")])}

    result = subprocess.run(
        [sys.executable, "-m", "verlflow.cli", "evaluate", "--model_uri", resolve_model_path("tiny-qwen3"),
         "--data_dir", str(tmp_path / "data"), "--limit", "2"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("verlflow evaluate: error:")]
    assert len(errors) == 1 and "torch_npu" in errors[0] and "libhccl.so" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    client = MlflowClient()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"], [(r.info.run_name, r.info.status) for r in runs]
