"""The launch's "lr far outside GRPO practice" warning knows the model's width: the shipped tiny recipes (a 64- and a
96-wide Qwen3 that need lr ~1e-3 to move) are within it, the same lr on an LLM-wide model and an lr off by orders of
magnitude on the tiny one still warn."""

from __future__ import annotations

import json

import pytest

from verlflow import config
from verlflow.backends.verl.dryrun.startup_loads import startup_warnings
from verlflow.models.model_path import SFT_SENTINEL, TINY_SENTINEL, resolve_model_path

LR_KEY = "actor_rollout_ref.actor.optim.lr"


def _lr_warnings(recipe: str, model_path, *overrides: str) -> list[str]:
    composed = config.compose(recipe, "cpu-verl", [f"actor_rollout_ref.model.path={model_path}", *overrides])
    return [w for w in startup_warnings(composed.resolved) if w.startswith(LR_KEY)]


@pytest.mark.parametrize(("recipe", "sentinel", "cache"), [
    ("tiny", TINY_SENTINEL, "tiny_workdir"),
    # the warm-started model is a minute's build when no slow test built it first
    pytest.param("smoke", SFT_SENTINEL, "warm_model_cache", marks=pytest.mark.slow),
])
def test_the_shipped_tiny_recipes_are_within_the_lr_range_for_their_models_width(recipe, sentinel, cache, request):
    root = request.getfixturevalue(cache)
    model = resolve_model_path(sentinel, root / "cache" if cache == "tiny_workdir" else root)
    assert _lr_warnings(recipe, model) == []
    # two orders of magnitude too high on the same model still warns, and says why its range is not the LLM one
    (line,) = _lr_warnings(recipe, model, f"{LR_KEY}=0.1")
    assert "far outside GRPO practice" in line and "wide, scaled from LLM practice" in line


def test_the_tiny_recipes_lr_on_an_llm_wide_model_warns(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 2560}))  # Qwen3-4B's width
    (line,) = _lr_warnings("tiny", tmp_path)
    assert line.startswith(f"{LR_KEY}=0.001: far outside GRPO practice (1e-08 … 0.0001;")
