"""Which launches load verlflow's CPU plugin into verl: only `device=cpu backend=verl`, never an NPU/GPU one.

Fast: composes configs and launch plans in process; the real CPU launch is tests/test_verl_cpu_launch.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verlflow import config
from verlflow.backends import verl_cpu
from verlflow.backends.verl import preflight
from verlflow.backends.verl_command import build_plan
from verlflow.errors import VerlflowError
from verlflow.steps import choose_train_setup

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
    assert "export VERL_USE_EXTERNAL_MODULES=verlflow.backends.verl_cpu_plugin" in script
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


def test_no_trl_installed_is_no_trl_problem():
    # TRL is not installed in this environment; the NPU/GPU preflight may call this before launch.
    assert verl_cpu.incompatible_trl() is None
