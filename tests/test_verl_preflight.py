"""Mistakes that used to fail only on the cluster fail the dry run: all at once, one line each, exit 2.

The names are checked against the installed verl's registries, the sizes against verl's divisibility
rules, the model and data against the files themselves; Hydra's ``+key``/``++key``/``~key`` pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fresh_store
from mlflow.tracking import MlflowClient

from verlflow import config
from verlflow.backends.verl import command as verl_command
from verlflow.backends.verl import launch as verl_launch
from verlflow.backends.verl.dryrun.preflight import launch_problems
from verlflow.errors import VerlflowError

GUIDE = "qwen3-4b-gsm8k-grpo"
RUN_ID = "0123456789abcdef0123456789abcdef"

# The list: each mistake, and the start of the one line that names it.
MISTAKES = {
    "actor_rollout_ref.rollout.name=vlm": "actor_rollout_ref.rollout.name=vlm: unknown rollout engine",
    "algorithm.adv_estimator=grpoo": "algorithm.adv_estimator=grpoo: unknown advantage estimator",
    "data.train_batch_size=-3": "data.train_batch_size=-3: must be a whole number >= 1",
    "actor_rollout_ref.rollout.n=5.5": "actor_rollout_ref.rollout.n=5.5: must be a whole number >= 1",
    "trainer.logger=['mlfow']": "trainer.logger=[mlfow,console,mlflow]: mlfow unknown to verl's Tracking",
    "actor_rollout_ref.actor.loss_agg_mode=tokenmean": "actor_rollout_ref.actor.loss_agg_mode=tokenmean: unknown",
    "data.train_batch_size=500": "data.train_batch_size=500: train_batch_size × rollout.n = 500 × 5 = 2500",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=3":
        "actor_rollout_ref.rollout.tensor_model_parallel_size=3: must divide trainer.n_gpus_per_node=16",
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    from verlflow.data import gsm8k

    folder = tmp_path_factory.mktemp("data")
    gsm8k.preprocess("synthetic", str(folder), 8)
    return folder


def _lines(overrides: str, data_dir: Path, tmp_path: Path, model: str | None = None):
    extra = {"data.train_files": str(data_dir / "train.parquet"), "data.val_files": str(data_dir / "test.parquet")}
    if model is not None:
        extra["actor_rollout_ref.model.path"] = model
    cfg = config.compose(GUIDE, "a3", f"verlflow.output_dir={tmp_path} {overrides}", extra=extra)
    plan = verl_command.build_plan(cfg, run_id=RUN_ID, experiment_name="e", run_name="r", tracking_uri="sqlite:///x")
    problems, notes = launch_problems(config.validate_against_verl(plan.overrides))
    return [p.line() for p in problems], notes, plan


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_is_one_line_naming_key_value_and_fix(mistake, data_dir, tmp_path):
    lines, _, _ = _lines(mistake, data_dir, tmp_path)
    assert len(lines) == 1 and lines[0].startswith(MISTAKES[mistake]), lines


def test_the_guide_recipe_passes_and_a_hub_model_is_a_note(data_dir, tmp_path):
    lines, notes, _ = _lines("", data_dir, tmp_path)
    assert lines == []
    assert notes[0] == ("actor_rollout_ref.model.path=Qwen/Qwen3-4B is a hub id: it will be downloaded on the "
                        "cluster (no local folder here)")
    # Not in this machine's hub cache: what reads the model is not rehearsed, and the dry run says what.
    assert ("not rehearsed: actor_rollout_ref.model.path=Qwen/Qwen3-4B is not on this machine (nor in its hub "
            "cache): not rehearsed: the model's config and tokenizer, the datasets and dataloaders") in notes[1]
    assert [n for n in notes if n.startswith("warning: ") and "is not installed on this machine" not in n] == []


def test_model_and_data_must_be_usable(data_dir, tmp_path):
    no_tokenizer = tmp_path / "model"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text("{}")
    wrong_columns = tmp_path / "bad"
    wrong_columns.mkdir()
    import pandas as pd

    pd.DataFrame({"question": ["1+1"], "answer": ["2"]}).to_parquet(wrong_columns / "train.parquet")
    lines, _, _ = _lines(f"data.train_files={wrong_columns / 'train.parquet'} "
                         f"data.val_files={tmp_path / 'absent.parquet'}", data_dir, tmp_path, model=str(no_tokenizer))
    assert lines[0].startswith(f"actor_rollout_ref.model.path={no_tokenizer}: the folder lacks a tokenizer file")
    assert lines[1].startswith(f"data.prompt_key=prompt: {wrong_columns / 'train.parquet'} has no column 'prompt' "
                               "(it has answer, question)")
    assert lines[2].startswith("data.reward_fn_key=data_source: ")
    assert lines[3] == (f"data.train_files={wrong_columns / 'train.parquet'}: lacks verl's column reward_model: "
                        "write it with `mlflow run . --env-manager local --experiment-name verlflow/data -e preprocess "
                        f"-P source=openai/gsm8k -P output_dir={wrong_columns}`")
    assert lines[4].startswith(f"data.val_files={tmp_path / 'absent.parquet'}: file not found")
    lines, _, _ = _lines("", data_dir, tmp_path, model="/nowhere/Qwen3-4B")
    assert lines == ["actor_rollout_ref.model.path=/nowhere/Qwen3-4B: no such folder and not a hub id (org/name): "
                     "pass -P model=<a Hugging Face folder or hub id>"]


def test_plus_and_tilde_overrides_compose_as_in_verls_hydra(data_dir, tmp_path):
    overrides = ("+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4 ++trainer.n_gpus_per_node=8 "
                 "~actor_rollout_ref.rollout.val_kwargs.top_k")
    lines, _, plan = _lines(overrides, data_dir, tmp_path)
    assert lines == []
    argv = plan.argv()
    assert "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4" in argv
    assert "trainer.n_gpus_per_node=8" in argv and "~actor_rollout_ref.rollout.val_kwargs.top_k" in argv
    resolved = config.validate_against_verl(plan.overrides)
    assert resolved.actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space == 4
    assert "top_k" not in resolved.actor_rollout_ref.rollout.val_kwargs
    with pytest.raises(VerlflowError, match=r"'trainer.total_epochs' is already in verl's config: write "
                                            r"trainer.total_epochs=…"):
        config.compose(GUIDE, "a3", "+trainer.total_epochs=3")
    # Inside a free-form mapping (verl's default is {}) a plain key is added too, as Hydra's ++ would: a
    # recipe or profile YAML tree has no way to write the prefix. A key outside one is still refused.
    plain = config.compose(GUIDE, "a3", "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4")
    assert "++actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4" in config.hydra_overrides(plain.overrides)
    with pytest.raises(VerlflowError, match=r"unknown config key 'actor_rollout_ref.rollout.engine_kwarg.vllm.swap"):
        config.compose(GUIDE, "a3", "actor_rollout_ref.rollout.engine_kwarg.vllm.swap_space=4")


@pytest.mark.slow
def test_verls_own_command_line_takes_plus_and_tilde_and_awkward_names(data_dir, tmp_path):
    cfg = config.compose(GUIDE, "h20", f"verlflow.output_dir={tmp_path} "
                         "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4 "
                         "~actor_rollout_ref.rollout.val_kwargs.top_k")
    plan = verl_command.build_plan(cfg, run_id=RUN_ID, experiment_name="Qwen3 GRPO/A3 对比",
                                   run_name="it's team-a/h20 baseline", tracking_uri="sqlite:///x")
    job = verl_launch.validate_with_verl(plan)  # verl's main_ppo --cfg job through bash
    assert job["trainer"]["project_name"] == "Qwen3 GRPO/A3 对比"
    assert job["trainer"]["experiment_name"] == "it's team-a/h20 baseline"
    assert job["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]["swap_space"] == 4
    assert "top_k" not in job["actor_rollout_ref"]["rollout"]["val_kwargs"]


@pytest.mark.slow
def test_a_dry_run_with_every_mistake_exits_2_listing_them_all(data_dir, tmp_path):
    uri = fresh_store(tmp_path)
    overrides = " ".join(k for k in MISTAKES if "=500" not in k and "tensor_model" not in k)
    done = subprocess.run(
        [sys.executable, "-m", "verlflow.cli", "train", "--device", "npu", "--dry_run", "true",
         "--data_dir", str(tmp_path / "nodata"), "--model", "/nowhere/qwen", "--overrides", overrides],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "verlflow train: error: 9 problems in the verl launch:" in done.stderr
    for mistake, line in MISTAKES.items():
        if "=500" not in mistake and "tensor_model" not in mistake:
            assert f"\n  {line}" in done.stderr
    assert "  data.train_files=" in done.stderr and "  actor_rollout_ref.model.path=/nowhere/qwen" in done.stderr
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"]
