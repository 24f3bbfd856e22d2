"""Compose a recipe, a device profile and command-line overrides into one verl-shaped :class:`ComposedConfig`.

    python -c "from verlflow.config.compose import compose; print(compose('qwen3-4b-gsm8k-grpo', 'a3').overrides)"

Order: recipe < profile < the caller's ``extra`` keys < the user's overrides. The verl part is checked
against the installed verl (:mod:`verlflow.config.verl_schema`); ``verlflow.<key>=…`` overrides edit the
recipe's ``verlflow:`` block and ``profile.<field>=…`` the profile, both checked and typed like their files
(:func:`verlflow.config.typed_build.with_overrides`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verlflow.config.loading import OWN_BLOCK, load_profile, load_recipe
from verlflow.config.overrides import ADD, DELETE_PREFIX, FORCE_ADD, flatten_tree, parse_overrides, split_prefix
from verlflow.config.schema import PROFILE_OVERRIDE_FIXED, Profile, VerlflowBlock
from verlflow.config.typed_build import with_overrides
from verlflow.config.verl_schema import in_verl_schema, validate_against_verl

# Override prefixes of our own blocks: the recipe's ``verlflow:`` block and the profile.
OWN_PREFIX, PROFILE_PREFIX = f"{OWN_BLOCK}.", "profile."


@dataclass
class ComposedConfig:
    """A recipe on a profile with overrides: everything a backend needs to launch or to log."""

    recipe_name: str
    profile: Profile
    # The recipe's own ``verlflow:`` block after overrides (model_name, data_source, output_dir, …).
    verlflow: VerlflowBlock
    # Dotted verl keys → values, recipe < profile < user overrides: the command line verl is given.
    overrides: dict[str, Any]
    # verl's full ppo_trainer config with ``overrides`` applied and interpolations resolved.
    resolved: DictConfig

    def to_container(self) -> dict[str, Any]:
        """The resolved verl config as plain dicts and lists (what verl logs as params)."""
        return OmegaConf.to_container(self.resolved, resolve=True)

    def profile_keys(self) -> set[str]:
        """Dotted verl keys set by the profile: the only keys two runs of one recipe may differ in."""
        return set(flatten_tree(self.profile.verl))


def _merge_user_override(merged: dict[str, Any], raw_key: str, value: Any) -> None:
    """Apply one user override to ``merged`` in Hydra's terms, keeping one entry per key.

    ``++key`` on a key verl has is a plain override; a new key is kept as ``+key``; ``~key`` drops what the
    recipe or profile set below it and is kept as ``~key``.
    """
    prefix, key = split_prefix(raw_key)
    for existing in [k for k in merged if split_prefix(k)[1] == key or split_prefix(k)[1].startswith(f"{key}.")]:
        if prefix == DELETE_PREFIX or split_prefix(existing)[1] == key:
            del merged[existing]
    if prefix == FORCE_ADD:
        merged[key if in_verl_schema(key) else ADD + key] = value
    else:
        merged[raw_key] = value


def compose(
    recipe: str,
    profile: str,
    overrides: str | list[str] | tuple[str, ...] | None = None,
    *,
    extra: dict[str, Any] | None = None,
) -> ComposedConfig:
    """Compose recipe < profile < overrides and validate the verl part against the installed verl.

    Why here: every mistake in any of the three (an unknown key, a value of the wrong type) fails now, in
    one line, instead of minutes into a launch. ``extra`` holds dotted verl keys the caller sets on the
    user's behalf (data files, model path), applied between the profile and the user's overrides, so a
    user's explicit override still wins.
    """
    recipe_name, block, verl_tree = load_recipe(recipe)
    prof = load_profile(profile)

    merged: dict[str, Any] = flatten_tree(verl_tree)
    merged.update(flatten_tree(prof.verl))
    merged.update(extra or {})
    own_updates: dict[str, Any] = {}
    profile_updates: dict[str, Any] = {}
    parsed = parse_overrides(overrides)
    for key, value in parsed.items():
        if key.startswith(OWN_PREFIX):
            own_updates[key.removeprefix(OWN_PREFIX)] = value
        elif key.startswith(PROFILE_PREFIX):
            profile_updates[key.removeprefix(PROFILE_PREFIX)] = value
        else:
            _merge_user_override(merged, key, value)
    block = with_overrides(block, own_updates, what="recipe", prefix=OWN_PREFIX)
    prof = with_overrides(prof, profile_updates, what="profile", prefix=PROFILE_PREFIX, fixed=PROFILE_OVERRIDE_FIXED)
    resolved = validate_against_verl(merged)
    return ComposedConfig(recipe_name=recipe_name, profile=prof, verlflow=block, overrides=merged, resolved=resolved)
