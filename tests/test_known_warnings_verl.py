"""Quiet: verl's repeated warnings dropped at their source (the launch environment, inherited by Ray workers),
and MLflow's artifact-download bars off in a step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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


# A verl process of a CPU launch: `import verl` loads the cpu-verl plugin, which drops the known lines there.
IN_A_VERL_PROCESS = """
import logging
import verl
from ray._private.authentication import authentication_token_setup
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

logging.basicConfig(level=logging.INFO)
authentication_token_setup._warn_token_auth_enabled()  # what ray.init says on a new local cluster
try:
    RayPPOTrainer()  # verl's deprecation warning comes first, then the missing arguments
except TypeError:
    pass
main = logging.getLogger("__main__")  # verl's main_ppo, run as python -m
main.warning("Legacy trainer `main_ppo_v0.py` is deprecated, and wil be removed in v0.9.0.")
main.warning("Token authentication is enabled for this Ray cluster: another logger says it, and shows")
"""


@pytest.mark.slow  # imports verl's trainer in a fresh process: tens of seconds on 2 busy cores
def test_inside_verls_processes_the_legacy_trainer_and_ray_token_lines_are_dropped_and_others_kept():
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "verlflow.backends.verl.cpu_plugin"}
    done = subprocess.run([sys.executable, "-c", IN_A_VERL_PROCESS], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Token authentication is enabled for this Ray cluster. Set" not in done.stderr
    assert "RayPPOTrainer' is deprecated" not in done.stderr and "Legacy trainer" not in done.stderr
    assert "another logger says it, and shows" in done.stderr
