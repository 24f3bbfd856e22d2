"""Quiet: verl's repeated warnings dropped at their source (the launch environment, inherited by Ray workers),
and MLflow's artifact-download bars off in a step."""

from __future__ import annotations

import os
import subprocess
import sys

from verlflow import config, known_warnings
from verlflow.backends.verl import command


def test_the_launch_environment_drops_verls_engine_warnings_and_keeps_every_other(tmp_path):
    plan = command.build_plan(config.compose("tiny", "cpu-verl", f"verlflow.output_dir={tmp_path}"), run_id="r1",
                              experiment_name="verlflow/tiny", run_name="tiny · cpu-verl",
                              tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    value = plan.env["PYTHONWARNINGS"]
    assert all(f"ignore:{w.starts_with}:{w.category}" in value and w.why for w in known_warnings.VERL_PROCESS_WARNINGS)
    # A real interpreter with that environment, warning as verl.workers.engine does on import.
    code = ("import warnings; "
            "warnings.warn('megatron engine is not available: ModuleNotFoundError()', stacklevel=1); "
            "warnings.warn('something else is not available', stacklevel=1)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONWARNINGS": value})
    assert "megatron engine" not in done.stderr and "something else is not available" in done.stderr


def test_the_users_own_warning_filters_still_win():
    value = known_warnings.python_warnings("default::UserWarning")
    assert value.endswith(",default::UserWarning")  # applied last by Python, so it takes precedence


def test_a_step_switches_off_mlflows_artifact_download_bars_unless_the_user_set_them(monkeypatch):
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

    from verlflow import progress

    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    progress.quiet_library_bars()
    assert MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.get() is False  # as MLflow reads it before drawing a bar
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true")
    progress.quiet_library_bars()
    assert MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.get() is True
