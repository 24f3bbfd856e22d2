"""The guide's recipe on the a3 / h20 profiles composes to the guide's two launch scripts, key for key.

The scripts are read out of the reference guide itself (tests/fixtures/reference), so a drift between the
recipe and the guide fails here. Keys that are site-specific in the guide (its paths and run names)
are set by the train step from its parameters, and the logger list gains mlflow; those are listed and
checked separately.
"""

from __future__ import annotations

import re

import pytest

from verlflow.config import compose, parse_overrides

# Set per site/run by the train step, not by the recipe (the guide's absolute paths and names).
SITE_KEYS = {
    "data.train_files",
    "data.val_files",
    "actor_rollout_ref.model.path",
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.default_local_dir",
}
# The guide logs to wandb (H20) / tensorboard (A3); verlflow adds mlflow in the verl launcher.
LOGGER_KEY = "trainer.logger"


def _guide_scripts(text: str) -> dict[str, str]:
    h20_start = text.index("四、 H20训练")
    a3_start = text.index("五、A3训练")
    end = text.index("六、指标对比")
    return {"h20": text[h20_start:a3_start], "a3": text[a3_start:end]}


def _script_overrides(script: str) -> dict[str, str]:
    """The ``key=value`` arguments of the script's ``python3 -m verl.trainer.main_ppo`` call, variables expanded."""
    shell_vars = dict(re.findall(r"^(\w+)=['\"]?([^'\"\s]*)['\"]?\s*$", script, flags=re.M))
    call = script[script.index("python3 -m verl.trainer.main_ppo"):]
    overrides = {}
    for key, value in re.findall(r"^\s+([\w.]+)=(\S+?)\s*(?:\\|2>&1|$)", call, flags=re.M):
        value = re.sub(r"\$\{?(\w+)\}?", lambda m: shell_vars.get(m.group(1), m.group(0)), value)
        overrides[key] = value.strip("'")
    return overrides


def _same(guide_text: str, ours) -> bool:
    """Whether our value is what verl's command line reads from the guide's text."""
    guide_value = parse_overrides([f"k={guide_text}"])["k"]
    if isinstance(guide_value, float) or isinstance(ours, float):
        return ours is not None and not isinstance(ours, bool) and float(ours) == pytest.approx(float(guide_value))
    return guide_value == ours


@pytest.fixture
def guide_overrides(fixtures_dir):
    text = (fixtures_dir / "reference" / "000_d7fe20b50de8a307.txt").read_text(encoding="utf-8")
    return {name: _script_overrides(script) for name, script in _guide_scripts(text).items()}


@pytest.mark.parametrize("profile", ["a3", "h20"])
def test_recipe_on_profile_equals_guide_script(profile, guide_overrides):
    guide = guide_overrides[profile]
    assert len(guide) > 40, "the guide's launch script was not found or not parsed"
    ours = compose("qwen3-4b-gsm8k-grpo", profile).overrides
    compared = sorted(set(guide) - SITE_KEYS - {LOGGER_KEY})
    mismatches = {k: (guide[k], ours.get(k)) for k in compared if not _same(guide[k], ours.get(k))}
    assert mismatches == {}, f"recipe+{profile} differs from the guide (guide, ours): {mismatches}"
    extra = sorted(set(ours) - set(guide) - {LOGGER_KEY})
    assert extra == [], f"recipe+{profile} sets keys the guide's script does not: {extra}"


@pytest.mark.parametrize("profile", ["a3", "h20"])
def test_profile_loggers_are_the_guides_without_wandb(profile, guide_overrides):
    guide_loggers = re.findall(r"\w+", guide_overrides[profile][LOGGER_KEY])
    ours = compose("qwen3-4b-gsm8k-grpo", profile).overrides[LOGGER_KEY]
    assert ours == [name for name in guide_loggers if name != "wandb"]


def test_guide_values_without_the_reference():
    """The headline numbers of the guide, spelled out here too (a readable summary of what the recipe holds)."""
    a3 = compose("qwen3-4b-gsm8k-grpo", "a3").resolved
    assert a3.trainer.n_gpus_per_node == 16 and a3.trainer.device == "npu"
    assert a3.data.train_batch_size == 512 and a3.actor_rollout_ref.rollout.n == 5
    assert a3.actor_rollout_ref.actor.optim.lr == pytest.approx(5e-7)
    assert a3.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    h20 = compose("qwen3-4b-gsm8k-grpo", "h20").resolved
    assert h20.trainer.n_gpus_per_node == 8


def test_two_profiles_of_one_recipe_differ_only_in_profile_keys():
    a3 = compose("qwen3-4b-gsm8k-grpo", "a3")
    h20 = compose("qwen3-4b-gsm8k-grpo", "h20")
    differing = {k for k in set(a3.overrides) | set(h20.overrides) if a3.overrides.get(k) != h20.overrides.get(k)}
    assert differing and differing <= a3.profile_keys() | h20.profile_keys()
