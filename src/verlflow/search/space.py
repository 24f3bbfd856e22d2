"""The search space against a recipe: Optuna's distributions, checked before any trial.

The space is written in the search config (:mod:`verlflow.search.search_config`); here it meets the installed
verl and the composed recipe: a parameter that is not a key of verl's config is one clear line naming the
nearest keys. Ranges are absolute (``low``/``high``) or ``relative`` to the value the composed recipe already
has, so one file serves the guide's recipe (lr 5e-7 → [1e-7, 2.5e-6]) and the smoke recipe (lr 1e-3 → [2e-4,
5e-3]). Categorical choices (the group size ``actor_rollout_ref.rollout.n``) are composed into the
recipe one by one and put through verl's own batch-size checks (and the local trainer's, on the local
backend), so a choice that would break a trial minutes in is refused up front.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import warnings
from typing import Any

import optuna
from omegaconf import OmegaConf

from verlflow import config
from verlflow.config import nearest
from verlflow.errors import VerlflowError
from verlflow.search.search_config import SearchConfig, fail

Distributions = dict[str, optuna.distributions.BaseDistribution]


def check_space_keys(search: SearchConfig) -> None:
    """Every searched key must be a key of the installed verl's config (one line naming the nearest)."""
    known = config.verl_default_keys()
    for spec in search.space:
        if spec.name not in known:
            near = nearest(spec.name, known, n=3)
            hint = f"; nearest valid keys: {', '.join(near)}" if near else ""
            raise fail(str(search.path), f"unknown key 'space.{spec.name}': not a key of the installed "
                                         f"verl's config{hint}")


def distributions(search: SearchConfig, composed: config.ComposedConfig) -> Distributions:
    """The Optuna distribution of every searched key, relative ranges applied to the composed recipe.

    ``composed`` is the recipe on its profile with the search's fixed trial overrides; a key that is not
    in the installed verl's config, or a relative range around a recipe value that is not a positive
    number, is one clear line.
    """
    where = str(search.path)
    check_space_keys(search)
    dists: dict[str, optuna.distributions.BaseDistribution] = {}
    for spec in search.space:
        if spec.type == "categorical":
            dists[spec.name] = optuna.distributions.CategoricalDistribution(list(spec.choices))
            continue
        low, high = spec.low, spec.high
        if spec.relative is not None:
            base = OmegaConf.select(composed.resolved, spec.name)
            if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 0:
                raise fail(where, f"'space.{spec.name}.relative' needs a positive recipe value to scale, "
                                  f"recipe '{composed.recipe_name}' has {base!r}: give low and high instead")
            low, high = base * spec.relative[0], base * spec.relative[1]
            if spec.type == "int":
                low, high = math.ceil(low), math.floor(high)
                if low >= high:
                    raise fail(where, f"'space.{spec.name}.relative' around {base} is an empty "
                                      "integer range")
        if spec.type == "int":
            dists[spec.name] = optuna.distributions.IntDistribution(int(low), int(high), log=spec.log,
                                                                    step=int(spec.step or 1))
        else:
            dists[spec.name] = optuna.distributions.FloatDistribution(float(low), float(high), log=spec.log,
                                                                      step=spec.step)
    return dists


def space_fingerprint(dists: Distributions) -> str:
    """The space as canonical JSON, stored on the study so a resumed study is known to search the same."""
    return json.dumps({k: optuna.distributions.distribution_to_json(v) for k, v in sorted(dists.items())},
                      sort_keys=True)


def suggest(trial: optuna.Trial, dists: Distributions) -> dict[str, Any]:
    """Draw the trial's value for every searched key (a retried trial gets its earlier values back)."""
    values: dict[str, Any] = {}
    for name, dist in dists.items():
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            values[name] = trial.suggest_categorical(name, dist.choices)
        elif isinstance(dist, optuna.distributions.IntDistribution):
            values[name] = trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
        else:
            values[name] = trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return values


def check_trial_configs(
    search: SearchConfig,
    dists: Distributions,
    compose_trial,
    *,
    backend_check=None,
) -> None:
    """Compose each categorical choice and both ends of each integer range into the recipe; run verl's checks.

    ``compose_trial(overrides: dict) -> ComposedConfig`` composes the recipe with the search's fixed
    overrides plus ``overrides``. A choice the installed verl (or the trainer: ``backend_check(composed)``, the
    chosen backend's ``check_config``) would reject is one line naming the key, the value and the reason, before
    any trial starts.
    """
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    probes: list[tuple[str, Any]] = []
    for name, dist in dists.items():
        # Float values (lr, KL coefficient) cannot break batch arithmetic; their keys and types are
        # checked when the base recipe is composed.
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            probes += [(name, choice) for choice in dist.choices]
        elif isinstance(dist, optuna.distributions.IntDistribution):
            probes += [(name, dist.low), (name, dist.high)]
    for name, value in probes:
        try:
            composed = compose_trial({name: value})
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                validate_config(composed.resolved, need_reference_policy(composed.resolved),
                                need_critic(composed.resolved))
            if backend_check is not None:
                backend_check(composed)
        except (VerlflowError, AssertionError, ValueError) as exc:
            reason = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise fail(str(search.path), f"{name}={value} is refused for this recipe: {reason}") from None
