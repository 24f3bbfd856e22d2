"""Composition order recipe < profile < overrides, and bad keys or values rejected by name."""

from __future__ import annotations

import pytest

from verlflow.config import compose, list_profiles, list_recipes, parse_overrides
from verlflow.errors import VerlflowError


def test_shipped_recipes_and_profiles():
    assert {"qwen3-4b-gsm8k-grpo", "smoke"} <= set(list_recipes())
    assert {"a3", "h20", "cpu"} <= set(list_profiles())


def test_profile_overrides_recipe_and_user_overrides_both():
    cfg = compose("smoke", "cpu", "trainer.n_gpus_per_node=2 actor_rollout_ref.rollout.n=8")
    assert cfg.resolved.trainer.n_gpus_per_node == 2  # profile says 1, the user wins
    assert cfg.resolved.actor_rollout_ref.rollout.n == 8  # recipe says 4
    assert compose("smoke", "a3").resolved.trainer.device == "npu"  # the profile beats verl's default


def test_extra_keys_sit_between_profile_and_user():
    extra = {"data.train_files": "/d/train.parquet", "actor_rollout_ref.model.path": "/m"}
    assert compose("smoke", "cpu", extra=extra).resolved.actor_rollout_ref.model.path == "/m"
    user = compose("smoke", "cpu", "actor_rollout_ref.model.path=/u", extra=extra)
    assert user.resolved.actor_rollout_ref.model.path == "/u"


def test_own_blocks_are_overridable():
    cfg = compose("smoke", "cpu", ["verlflow.model_name=mine", "profile.env.OMP_NUM_THREADS=1"])
    assert cfg.verlflow.model_name == "mine"
    assert cfg.profile.env["OMP_NUM_THREADS"] == "1"


def test_values_read_as_verls_command_line_reads_them():
    parsed = parse_overrides("a=5e-7 b=True c=['console','mlflow'] d=error e=3")
    assert parsed == {"a": 5e-7, "b": True, "c": ["console", "mlflow"], "d": "error", "e": 3}


@pytest.mark.parametrize(
    ("recipe", "profile", "overrides", "expected"),
    [
        ("smoke", "cpu", "trainer.totl_epochs=2", "unknown config key 'trainer.totl_epochs'.*trainer.total_epochs"),
        ("smoke", "cpu", "trainer.total_epochs=many", "'trainer.total_epochs' expects a number, got 'many'"),
        ("smoke", "cpu", "noequals", "override 'noequals' is not key=value"),
        ("smoke", "cpu", "profile.colour=red", "unknown profile key 'profile.colour'"),
        ("nope", "cpu", "", "unknown recipe 'nope': choose one of .*smoke"),
        ("smoke", "tpu", "", "unknown profile 'tpu': choose one of a2, a3, cpu, cpu-verl, h100, h20, h200"),
    ],
)
def test_bad_input_is_one_clear_line(recipe, profile, overrides, expected):
    with pytest.raises(VerlflowError, match=expected) as err:
        compose(recipe, profile, overrides)
    assert "\n" not in str(err.value)


def test_a_recipe_file_of_the_users_own(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("verlflow: {model_name: mine}\ndata: {train_batch_size: 8}\n")
    cfg = compose(str(path), "cpu")
    assert cfg.recipe_name == "mine" and cfg.resolved.data.train_batch_size == 8
