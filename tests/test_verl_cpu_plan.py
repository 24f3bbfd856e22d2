"""Which launches load verlflow's CPU plugin into verl: only `device=cpu backend=verl`, never an NPU/GPU one.

Fast: composes configs and launch plans in process; the real CPU launch is tests/test_verl_cpu_launch.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verlflow import config
from verlflow.backends.train_setup import choose_train_setup
from verlflow.backends.verl.backend import preflight
from verlflow.backends.verl.command import build_plan
from verlflow.data import gsm8k
from verlflow.errors import VerlflowError

RUN_ID = "0123456789abcdef0123456789abcdef"


def _plan(recipe: str, profile: str, tmp_path: Path, overrides: str = ""):
    extra = {"data.train_files": "data/gsm8k/train.parquet", "data.val_files": "data/gsm8k/test.parquet"}
    cfg = config.compose(recipe, profile, f"verlflow.output_dir={tmp_path} {overrides}", extra=extra)
    return cfg, build_plan(cfg, run_id=RUN_ID, experiment_name="gsm8k", run_name="r", tracking_uri="sqlite:///m.db")


def test_backend_verl_on_the_cpu_picks_the_cpu_verl_profile_and_local_keeps_cpu():
    assert choose_train_setup("auto", "cpu", "auto", "verl") == ("smoke", "cpu", "cpu-verl", "verl")
    assert choose_train_setup("auto", "cpu", "auto", "auto") == ("smoke", "cpu", "cpu", "local")


def test_only_the_cpu_verl_launch_loads_the_plugin(tmp_path):
    _, cpu = _plan("smoke", "cpu-verl", tmp_path)
    script = cpu.script()
    assert "export VERL_USE_EXTERNAL_MODULES=verlflow.backends.verl.cpu_plugin" in script
    assert "export VERL_PLATFORM=cpu" in script
    assert "  ++actor_rollout_ref.model.override_config.attn_implementation=sdpa" in script
    assert cpu.overrides["actor_rollout_ref.rollout.name"] == "hf"
    for profile in ("a3", "h20"):
        _, plan = _plan("qwen3-4b-gsm8k-grpo", profile, tmp_path)
        text = plan.command_text()
        assert "VERL_USE_EXTERNAL_MODULES" not in text and "VERL_PLATFORM" not in text, profile
        assert "verl_cpu_plugin" not in text and plan.overrides["actor_rollout_ref.rollout.name"] == "vllm"


def test_verl_on_the_local_cpu_profile_is_refused_in_one_line_naming_cpu_verl(tmp_path):
    cfg, plan = _plan("smoke", "cpu", tmp_path)
    with pytest.raises(VerlflowError, match=r"^device=cpu with backend=verl needs the 'cpu-verl' profile"):
        preflight(cfg, plan)
    cfg, plan = _plan("smoke", "cpu-verl", tmp_path)
    preflight(cfg, plan)  # verl 0.9.1 is installed here and the profile loads the plugin


def test_a_free_form_mapping_takes_sub_keys_and_a_typo_is_still_refused(tmp_path):
    cfg, _ = _plan("smoke", "cpu-verl", tmp_path, "actor_rollout_ref.model.override_config.rope_theta=5000")
    assert cfg.resolved.actor_rollout_ref.model.override_config == {"attn_implementation": "sdpa", "rope_theta": 5000}
    with pytest.raises(VerlflowError, match="unknown config key 'actor_rollout_ref.model.overide_config.x'"):
        _plan("smoke", "cpu-verl", tmp_path, "actor_rollout_ref.model.overide_config.x=1")


def _fake_trl(site: Path, version: str) -> None:
    """An installed TRL as importlib sees one: the package and its dist-info (no TRL code is needed)."""
    (site / "trl").mkdir(parents=True)
    (site / "trl" / "__init__.py").write_text(f"__version__ = '{version}'\n")
    info = site / f"trl-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: trl\nVersion: {version}\n")


@pytest.mark.slow
def test_an_npu_dry_run_names_a_trl_that_verl_would_crash_on(tmp_path, tracking_uri):
    site = tmp_path / "site"
    _fake_trl(site, "1.16.0")
    gsm8k.preprocess("synthetic", tmp_path / "data", 4, log_to_mlflow=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "verlflow.cli", "train", "--device", "npu", "--dry_run", "true",
         "--data_dir", str(tmp_path / "data"), "--model", "Qwen/Qwen3-4B"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    trl_lines = [line for line in done.stderr.splitlines() if "TRL" in line]
    assert len(trl_lines) == 1 and "TRL 1.16.0" in trl_lines[0] and "pip uninstall trl" in trl_lines[0], done.stderr
    assert "Traceback" not in done.stderr
