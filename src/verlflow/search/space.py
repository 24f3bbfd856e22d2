"""The search config: objective, sampler, pruner, storage settings and the space, checked before any trial.

    python -c "from verlflow.search.space import load_search_config as l; print(l('default').space)"

A search config (``config/search/<name>.yaml``, or a user's ``.yaml`` path) says what a search optimises
and over what. Its shape is typed (:class:`SearchFile` and the dataclasses it holds, one comment per key),
read by the same reader as recipes and profiles (:func:`verlflow.config.typed_build.build`): an unknown key at
any level is one line naming the nearest valid key, a value of the wrong type one line naming key and value.
Then the meaning is checked: an empty range (``low >= high``, no choices), an unknown direction or pruner,
a parameter that is not a key of the installed verl's config — each one clear line before any trial runs.

Ranges are absolute (``low``/``high``) or ``relative`` to the value the composed recipe already has, so
one file serves the guide's recipe (lr 5e-7 → [1e-7, 2.5e-6]) and the smoke recipe (lr 1e-3 → [2e-4,
5e-3]). Categorical choices (the group size ``actor_rollout_ref.rollout.n``) are composed into the
recipe one by one and put through verl's own batch-size checks (and the local trainer's, on the local
backend), so a choice that would break a trial minutes in is refused up front.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from omegaconf import OmegaConf

from verlflow import config
from verlflow.config import SEARCH_DIR, build, load_named_yaml, nearest
from verlflow.errors import VerlflowError

DIRECTIONS = ("maximize", "minimize")
PRUNERS = ("median", "hyperband", "none")
PARAM_TYPES = ("float", "int", "categorical")


# --- the file's schema: every key a search config may hold (config/search/default.yaml explains each) -------


@dataclass
class Objective:
    """``objective:`` what a trial is judged by."""

    # The metric whose last value is the trial's value and whose history drives pruning.
    metric: str
    # maximize | minimize.
    direction: str


@dataclass
class Sampler:
    """``sampler:`` Optuna's TPE sampler."""

    # Trial k draws with seed + k: reproducible, and two workers never draw the same point.
    seed: int = 0
    # Random trials before TPE starts modelling the results.
    n_startup_trials: int = 5


@dataclass
class MedianSettings:
    """``pruner.median:`` arguments of Optuna's MedianPruner (None: Optuna's default)."""

    # Trials that finish before any is pruned.
    n_startup_trials: int | None = None
    # Training steps of a trial before it can be pruned.
    n_warmup_steps: int | None = None
    # Steps between pruning checks.
    interval_steps: int | None = None
    # Trials reported at a step before the median there counts.
    n_min_trials: int | None = None


@dataclass
class HyperbandSettings:
    """``pruner.hyperband:`` arguments of Optuna's HyperbandPruner, in training steps (None: Optuna's default)."""

    # Steps every trial gets before it can be pruned.
    min_resource: int | None = None
    # Steps of a full trial ("auto": the first trial's).
    max_resource: int | str | None = None
    # 1/reduction_factor of the trials go on to the next rung.
    reduction_factor: int | None = None


@dataclass
class Pruner:
    """``pruner:`` which pruner a search uses when ``-P pruner=`` is empty, and each pruner's settings."""

    # median | hyperband | none.
    default: str = "median"
    median: MedianSettings = field(default_factory=MedianSettings)
    hyperband: HyperbandSettings = field(default_factory=HyperbandSettings)


@dataclass
class Storage:
    """``storage:`` how a lost trial (its worker killed) is found and retried."""

    # Seconds between a running trial's heartbeats.
    heartbeat_interval: int = 30
    # Seconds without a heartbeat before the trial counts as lost.
    grace_period: int = 120
    # Retries of one lost trial before it stays failed.
    max_retry: int = 2


@dataclass
class Trial:
    """``trial:`` what every trial shares."""

    # Fixed verl overrides of every trial (dotted verl key → value).
    overrides: dict[str, Any] = field(default_factory=dict)
    # Seconds between reads of a running trial's metric history (for pruning).
    poll_interval: float = 5.0
    # Seconds a pruned trial gets to end after SIGTERM before it is killed.
    stop_timeout: float = 60.0


@dataclass
class SpaceEntry:
    """``space.<dotted verl key>:`` one searched key, as written."""

    # float | int | categorical.
    type: str
    # Absolute range (float and int).
    low: int | float | None = None
    high: int | float | None = None
    # [low factor, high factor] × the composed recipe's value, instead of low/high.
    relative: list[float] | None = None
    # Sample on a log scale (float and int; not with a step).
    log: bool = False
    # Quantisation step (float and int).
    step: int | float | None = None
    # The values of a categorical parameter.
    choices: list[Any] | None = None


@dataclass(kw_only=True)
class SearchFile:
    """A search config file's top level, in the file's order."""

    objective: Objective
    sampler: Sampler = field(default_factory=Sampler)
    pruner: Pruner = field(default_factory=Pruner)
    storage: Storage = field(default_factory=Storage)
    trial: Trial = field(default_factory=Trial)
    # Dotted verl key → its range: at least one.
    space: dict[str, SpaceEntry]


# --- the checked config the search uses -----------------------------------------------------------------------


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


def _fail(where: str, message: str) -> VerlflowError:
    return VerlflowError(f"search config {where}: {message}")


def _number(where: str, key: str, value: Any, *, integer: bool = False, positive: bool = False) -> float:
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or (positive and value <= 0):
        kind = "a positive " if positive else "a "
        raise _fail(where, f"'{key}' must be {kind}{'integer' if integer else 'number'}, got {value!r}")
    return value


def _given(settings: Any) -> dict[str, Any]:
    """The settings a pruner block sets (the others stay Optuna's defaults)."""
    return {k: v for k, v in dataclasses.asdict(settings).items() if v is not None}


def load_search_config(name: str) -> SearchConfig:
    """Load a shipped search config by name or a user's by ``.yaml`` path, checking every key and range.

    Why up front: a typo or an empty range found here costs nothing; found in trial 7 it costs the six
    trials before it, or — silently ignored — the whole search.
    """
    found = load_named_yaml("search config", name, SEARCH_DIR)
    where = str(found.path)
    spec = build(SearchFile, found.data, where=f"search config {where}")
    objective, storage, trial = spec.objective, spec.storage, spec.trial
    if not objective.metric:
        raise _fail(where, f"'objective.metric' must be a metric name, got {objective.metric!r}")
    if objective.direction not in DIRECTIONS:
        raise _fail(where, f"'objective.direction' is '{objective.direction}': use maximize or minimize")
    if spec.pruner.default not in PRUNERS:
        raise _fail(where, f"'pruner.default' is '{spec.pruner.default}': use one of {', '.join(PRUNERS)}")
    if not spec.space:
        raise _fail(where, "'space' must map at least one dotted verl key to its range")
    for key, value in (("storage.heartbeat_interval", storage.heartbeat_interval),
                       ("storage.grace_period", storage.grace_period),
                       ("trial.poll_interval", trial.poll_interval), ("trial.stop_timeout", trial.stop_timeout)):
        _number(where, key, value, positive=True)
    return SearchConfig(
        name=found.name,
        path=found.path,
        metric=objective.metric,
        direction=objective.direction,
        seed=spec.sampler.seed,
        n_startup_trials=spec.sampler.n_startup_trials,
        pruner_default=spec.pruner.default,
        pruner_settings={"median": _given(spec.pruner.median), "hyperband": _given(spec.pruner.hyperband)},
        heartbeat_interval=storage.heartbeat_interval,
        grace_period=storage.grace_period,
        max_retry=storage.max_retry,
        trial_overrides=dict(trial.overrides),
        poll_interval=trial.poll_interval,
        stop_timeout=trial.stop_timeout,
        space=[_param_spec(where, key, entry) for key, entry in spec.space.items()],
        raw=found.data,
    )


def _param_spec(where: str, key: str, entry: SpaceEntry) -> ParamSpec:
    """Check one ``space`` entry; its range must be non-empty (relative ranges are checked once applied)."""
    kind = entry.type
    if kind not in PARAM_TYPES:
        raise _fail(where, f"'space.{key}.type' is {kind!r}: use one of {', '.join(PARAM_TYPES)}")
    if kind == "categorical":
        extra = [name for name in ("low", "high", "relative", "step") if getattr(entry, name) is not None]
        extra += ["log"] if entry.log else []
        if extra:
            raise _fail(where, f"'space.{key}.{extra[0]}' does not apply to a categorical parameter")
        choices = entry.choices
        if not choices:
            raise _fail(where, f"'space.{key}.choices' is empty: list at least one value")
        if len(set(map(repr, choices))) != len(choices):
            raise _fail(where, f"'space.{key}.choices' lists a value twice: {choices}")
        return ParamSpec(name=key, type=kind, choices=tuple(choices))
    if entry.choices is not None:
        raise _fail(where, f"'space.{key}.choices' applies to type categorical only")
    has_abs, has_rel = entry.low is not None or entry.high is not None, entry.relative is not None
    if has_abs == has_rel:
        raise _fail(where, f"'space.{key}' needs either low and high, or relative: [low factor, high factor]")
    log, step = entry.log, entry.step
    if step is not None:
        _number(where, f"space.{key}.step", step, integer=kind == "int", positive=True)
        if log:
            raise _fail(where, f"'space.{key}' cannot have both log: true and a step")
    if has_rel:
        factors = entry.relative
        if len(factors) != 2:
            raise _fail(where, f"'space.{key}.relative' must be [low factor, high factor], got {factors!r}")
        lo, hi = (_number(where, f"space.{key}.relative", f, positive=True) for f in factors)
        if lo >= hi:
            raise _fail(where, f"'space.{key}.relative' is an empty range: {lo} >= {hi}")
        return ParamSpec(name=key, type=kind, relative=(float(lo), float(hi)), log=log, step=step)
    if entry.low is None or entry.high is None:
        raise _fail(where, f"'space.{key}' needs both low and high")
    lo = _number(where, f"space.{key}.low", entry.low, integer=kind == "int")
    hi = _number(where, f"space.{key}.high", entry.high, integer=kind == "int")
    if lo >= hi:
        raise _fail(where, f"'space.{key}' is an empty range: low {lo} >= high {hi}")
    if log and lo <= 0:
        raise _fail(where, f"'space.{key}' is log-scaled, so low must be > 0, got {lo}")
    return ParamSpec(name=key, type=kind, low=lo, high=hi, log=log, step=step)


Distributions = dict[str, optuna.distributions.BaseDistribution]


def check_space_keys(search: SearchConfig) -> None:
    """Every searched key must be a key of the installed verl's config (one line naming the nearest)."""
    known = config.verl_default_keys()
    for spec in search.space:
        if spec.name not in known:
            near = nearest(spec.name, known, n=3)
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
            raise _fail(str(search.path), f"{name}={value} is refused for this recipe: {reason}") from None
