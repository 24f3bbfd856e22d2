"""verl's last FSDP checkpoint becomes a Hugging Face folder that transformers loads and generates with.

The checkpoint is written the way verl writes it: the tiny Qwen3 sharded with FSDP2 over a real gloo
process group of 2 ranks, saved by verl's own FSDPCheckpointManager (tests/standins/fsdp_checkpoint.py).
World size 1 goes through the same merge in tests/test_verl_launch_status.py (the stand-in saves one).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verlflow.backends.verl.merge import last_actor_checkpoint, merge_actor_checkpoint
from verlflow.errors import VerlflowError

STANDINS = Path(__file__).parent / "standins"


def _fake_step(root: Path, step: int) -> Path:
    actor = root / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text('{"FSDP_version": 2, "world_size": 1}')
    return actor


def test_last_checkpoint_follows_verls_tracker_else_the_highest_step(tmp_path):
    with pytest.raises(VerlflowError, match="no verl checkpoint under"):
        last_actor_checkpoint(tmp_path)
    _fake_step(tmp_path, 5)
    (tmp_path / "global_step_12").mkdir()  # an unfinished save: no actor/fsdp_config.json
    tenth = _fake_step(tmp_path, 10)
    assert last_actor_checkpoint(tmp_path) == tenth
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("5")
    assert last_actor_checkpoint(tmp_path) == tmp_path / "global_step_5" / "actor"


@pytest.mark.slow
def test_two_rank_fsdp_checkpoint_merges_into_a_model_transformers_runs(tmp_path, tiny_workdir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    model_dir = resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache")  # read only: the session's copy
    ckpt = tmp_path / "checkpoints"
    subprocess.run([sys.executable, str(STANDINS / "fsdp_checkpoint.py"), str(model_dir),
                    str(ckpt / "global_step_3" / "actor"), "--world-size", "2", "--fsdp", "2", "--step", "3"],
                   check=True, capture_output=True, timeout=600)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
    actor = last_actor_checkpoint(ckpt)
    assert sorted(p.name for p in actor.glob("model_world_size_*")) == [
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]

    hf = merge_actor_checkpoint(actor, tmp_path / "hf", log_path=tmp_path / "merge.log")

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    expected = torch.load(actor.parent / "expected_state.pt", weights_only=False)
    merged = model.state_dict()
    for key, tensor in expected.items():
        # The merger writes bfloat16: the trained (not initial) weights, to bf16 precision.
        torch.testing.assert_close(merged[key], tensor.to(torch.bfloat16).float(), rtol=0, atol=0)
    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    assert not torch.equal(merged["model.layers.0.mlp.up_proj.weight"], initial["model.layers.0.mlp.up_proj.weight"])
    ids = tokenizer("Natalia sold 48 clips. ", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids.shape[1]
