"""The search config: objective, sampler, pruner, storage settings and the space, checked before any trial.

    python -c "from verlflow.search.space import load_search_config as l; print(l('default').space)"

A search config (``config/search/<name>.yaml``, or a user's ``.yaml`` path) says what a search optimises
and over what. Every key is checked: an unknown key, an empty range (``low >= high``, no choices) or a
parameter that is not a key of the installed verl's config is one clear line before any trial runs.

Ranges are absolute (``low``/``high``) or ``relative`` to the value the composed recipe already has, so
one file serves the guide's recipe (lr 5e-7 → [1e-7, 2.5e-6]) and the smoke recipe (lr 1e-3 → [2e-4,
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml
from omegaconf import OmegaConf

from verlflow import config
from verlflow.errors import VerlflowError

SEARCH_DIR = config.CONFIG_ROOT / "search"
DIRECTIONS = ("maximize", "minimize")
PRUNERS = ("median", "hyperband", "none")
PARAM_TYPES = ("float", "int", "categorical")

# Every key a search config may hold: section → field → default (None: required, no default).
SCHEMA: dict[str, dict[str, Any]] = {
    "objective": {"metric": None, "direction": None},
    "sampler": {"seed": 0, "n_startup_trials": 5},
    "pruner": {"default": "median", "median": {}, "hyperband": {}},
    "storage": {"heartbeat_interval": 30, "grace_period": 120, "max_retry": 2},
    "trial": {"overrides": {}, "poll_interval": 5.0, "stop_timeout": 60.0},
    "space": None,
}
PRUNER_FIELDS = {
    "median": {"n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"},
    "hyperband": {"min_resource", "max_resource", "reduction_factor"},
}
PARAM_FIELDS = {"type", "low", "high", "relative", "log", "step", "choices"}


@dataclass(frozen=True)
class ParamSpec:
    """One searched key as written in the search config (``relative`` not yet applied)."""

    # A dotted verl key, e.g. actor_rollout_ref.actor.optim.lr.
    name: str
    # float | int | categorical
    type: str
    low: float | None = None
    high: float | None = None
    # (low factor, high factor) × the composed recipe's value, instead of low/high.
    relative: tuple[float, float] | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()


@dataclass
class SearchConfig:
    """A loaded, checked search config (see ``config/search/default.yaml`` for every field's meaning)."""

    name: str
    path: Path
    metric: str
    direction: str
    seed: int
    n_startup_trials: int
    pruner_default: str
    pruner_settings: dict[str, dict[str, Any]]
    heartbeat_interval: int
    grace_period: int
    max_retry: int
    trial_overrides: dict[str, Any]
    poll_interval: float
    stop_timeout: float
    space: list[ParamSpec]
    raw: dict[str, Any] = field(default_factory=dict)


def list_search_configs() -> list[str]:
    """Names of the shipped search configs (file stems under ``config/search``)."""
    return sorted(p.stem for p in SEARCH_DIR.glob("*.yaml"))


def _fail(where: str, message: str) -> VerlflowError:
    return VerlflowError(f"search config {where}: {message}")


def _check_keys(where: str, data: dict[str, Any], valid: set[str] | dict[str, Any], what: str) -> None:
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise _fail(where, f"unknown key '{what}{unknown[0]}': valid keys are {', '.join(sorted(valid))}")


def _number(where: str, key: str, value: Any, *, integer: bool = False, positive: bool = False) -> float:
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or (positive and value <= 0):
        kind = "a positive " if positive else "a "
        raise _fail(where, f"'{key}' must be {kind}{'integer' if integer else 'number'}, got {value!r}")
    return value


def load_search_config(name: str) -> SearchConfig:
    """Load a shipped search config by name or a user's by ``.yaml`` path, checking every key and range."""
    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = SEARCH_DIR / f"{name}.yaml"
        if not path.is_file():
            known = ", ".join(list_search_configs())
            raise VerlflowError(f"unknown search config '{name}': choose one of {known} or give a .yaml path")
    where = str(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise _fail(where, f"not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise _fail(where, f"must hold a mapping, not {type(data).__name__}")
    _check_keys(where, data, SCHEMA, "")
    sections: dict[str, dict[str, Any]] = {}
    for section, fields_ in SCHEMA.items():
        if fields_ is None:
            continue
        given = data.get(section) or {}
        if not isinstance(given, dict):
            raise _fail(where, f"'{section}' must be a mapping")
        _check_keys(where, given, fields_, f"{section}.")
        merged = {**fields_, **given}
        missing = [k for k, v in merged.items() if v is None]
        if missing:
            raise _fail(where, f"'{section}.{missing[0]}' is required")
        sections[section] = merged

    objective, sampler, pruner = sections["objective"], sections["sampler"], sections["pruner"]
    storage, trial = sections["storage"], sections["trial"]
    if not isinstance(objective["metric"], str) or not objective["metric"]:
        raise _fail(where, f"'objective.metric' must be a metric name, got {objective['metric']!r}")
    if objective["direction"] not in DIRECTIONS:
        raise _fail(where, f"'objective.direction' is '{objective['direction']}': use maximize or minimize")
    if pruner["default"] not in PRUNERS:
        raise _fail(where, f"'pruner.default' is '{pruner['default']}': use one of {', '.join(PRUNERS)}")
    pruner_settings = {}
    for kind, valid in PRUNER_FIELDS.items():
        settings = pruner[kind] or {}
        if not isinstance(settings, dict):
            raise _fail(where, f"'pruner.{kind}' must be a mapping")
        _check_keys(where, settings, valid, f"pruner.{kind}.")
        pruner_settings[kind] = dict(settings)
    if not isinstance(trial["overrides"], dict):
        raise _fail(where, "'trial.overrides' must be a mapping of dotted verl keys to values")

    space_data = data.get("space")
    if not isinstance(space_data, dict) or not space_data:
        raise _fail(where, "'space' must map at least one dotted verl key to its range")
    return SearchConfig(
        name=path.stem,
        path=path,
        metric=objective["metric"],
        direction=objective["direction"],
        seed=int(_number(where, "sampler.seed", sampler["seed"], integer=True)),
        n_startup_trials=int(_number(where, "sampler.n_startup_trials", sampler["n_startup_trials"],
                                     integer=True)),
        pruner_default=pruner["default"],
        pruner_settings=pruner_settings,
        heartbeat_interval=int(_number(where, "storage.heartbeat_interval", storage["heartbeat_interval"],
                                       integer=True, positive=True)),
        grace_period=int(_number(where, "storage.grace_period", storage["grace_period"],
                                 integer=True, positive=True)),
        max_retry=int(_number(where, "storage.max_retry", storage["max_retry"], integer=True)),
        trial_overrides=dict(trial["overrides"]),
        poll_interval=float(_number(where, "trial.poll_interval", trial["poll_interval"], positive=True)),
        stop_timeout=float(_number(where, "trial.stop_timeout", trial["stop_timeout"], positive=True)),
        space=[_param_spec(where, key, spec) for key, spec in space_data.items()],
        raw=data,
    )


def _param_spec(where: str, key: str, spec: Any) -> ParamSpec:
    """Check one ``space`` entry; its range must be non-empty (relative ranges are checked once applied)."""
    if not isinstance(spec, dict):
        raise _fail(where, f"'space.{key}' must be a mapping with 'type' and a range")
    _check_keys(where, spec, PARAM_FIELDS, f"space.{key}.")
    kind = spec.get("type")
    if kind not in PARAM_TYPES:
        raise _fail(where, f"'space.{key}.type' is {kind!r}: use one of {', '.join(PARAM_TYPES)}")
    if kind == "categorical":
        extra = sorted(set(spec) & {"low", "high", "relative", "log", "step"})
        if extra:
            raise _fail(where, f"'space.{key}.{extra[0]}' does not apply to a categorical parameter")
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _fail(where, f"'space.{key}.choices' is empty: list at least one value")
        if len(set(map(repr, choices))) != len(choices):
            raise _fail(where, f"'space.{key}.choices' lists a value twice: {choices}")
        return ParamSpec(name=key, type=kind, choices=tuple(choices))
    if "choices" in spec:
        raise _fail(where, f"'space.{key}.choices' applies to type categorical only")
    has_abs, has_rel = "low" in spec or "high" in spec, "relative" in spec
    if has_abs == has_rel:
        raise _fail(where, f"'space.{key}' needs either low and high, or relative: [low factor, high factor]")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise _fail(where, f"'space.{key}.log' must be true or false")
    step = spec.get("step")
    if step is not None:
        _number(where, f"space.{key}.step", step, integer=kind == "int", positive=True)
        if log:
            raise _fail(where, f"'space.{key}' cannot have both log: true and a step")
    if has_rel:
        factors = spec["relative"]
        if not (isinstance(factors, list) and len(factors) == 2):
            raise _fail(where, f"'space.{key}.relative' must be [low factor, high factor], got {factors!r}")
        lo, hi = (_number(where, f"space.{key}.relative", f, positive=True) for f in factors)
        if lo >= hi:
            raise _fail(where, f"'space.{key}.relative' is an empty range: {lo} >= {hi}")
        return ParamSpec(name=key, type=kind, relative=(float(lo), float(hi)), log=log, step=step)
    if "low" not in spec or "high" not in spec:
        raise _fail(where, f"'space.{key}' needs both low and high")
    lo = _number(where, f"space.{key}.low", spec["low"], integer=kind == "int")
    hi = _number(where, f"space.{key}.high", spec["high"], integer=kind == "int")
    if lo >= hi:
        raise _fail(where, f"'space.{key}' is an empty range: low {lo} >= high {hi}")
    if log and lo <= 0:
        raise _fail(where, f"'space.{key}' is log-scaled, so low must be > 0, got {lo}")
    return ParamSpec(name=key, type=kind, low=lo, high=hi, log=log, step=step)


Distributions = dict[str, optuna.distributions.BaseDistribution]


def check_space_keys(search: SearchConfig) -> None:
    """Every searched key must be a key of the installed verl's config (one line naming the nearest)."""
    import difflib

    known = config.verl_default_keys()
    for spec in search.space:
        if spec.name not in known:
            near = difflib.get_close_matches(spec.name, known, n=3, cutoff=0.6)
            hint = f"; nearest valid keys: {', '.join(near)}" if near else ""
            raise _fail(str(search.path), f"unknown key 'space.{spec.name}': not a key of the installed "
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
                raise _fail(where, f"'space.{spec.name}.relative' needs a positive recipe value to scale, "
                                   f"recipe '{composed.recipe_name}' has {base!r}: give low and high instead")
            low, high = base * spec.relative[0], base * spec.relative[1]
            if spec.type == "int":
                low, high = math.ceil(low), math.floor(high)
                if low >= high:
                    raise _fail(where, f"'space.{spec.name}.relative' around {base} is an empty "
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
    local_backend: bool,
) -> None:
    """Compose each categorical choice and both ends of each integer range into the recipe; run verl's checks.

    ``compose_trial(overrides: dict) -> ComposedConfig`` composes the recipe with the search's fixed
    overrides plus ``overrides``. A choice the installed verl (or the local trainer) would reject is one
    line naming the key, the value and the reason, before any trial starts.
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
            if local_backend:
                from verlflow.backends.local.settings import read_settings

                read_settings(composed)
        except (VerlflowError, AssertionError, ValueError) as exc:
            reason = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise _fail(str(search.path), f"{name}={value} is refused for this recipe: {reason}") from None
