"""The search config: objective, sampler, pruner, storage settings and the space as written, checked on load.

    python -c "from verlflow.search.search_config import load_search_config as l; print(l('default').space)"

A search config (``config/search/<name>.yaml``, or a user's ``.yaml`` path) says what a search optimises
and over what. Its shape is typed (:class:`SearchFile` and the dataclasses it holds, one comment per key),
read by the same reader as recipes and profiles (:func:`verlflow.config.typed_build.build`): an unknown key at
any level is one line naming the nearest valid key, a value of the wrong type one line naming key and value.
Then the meaning is checked: an empty range (``low >= high``, no choices), an unknown direction or pruner —
each one clear line before any trial runs. What the space means against a recipe and the installed verl is
:mod:`verlflow.search.space`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verlflow.config import SEARCH_DIR, build, load_named_yaml
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


def fail(where: str, message: str) -> VerlflowError:
    """The one-line error about search config ``where``."""
    return VerlflowError(f"search config {where}: {message}")


def _number(where: str, key: str, value: Any, *, integer: bool = False, positive: bool = False) -> float:
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or (positive and value <= 0):
        kind = "a positive " if positive else "a "
        raise fail(where, f"'{key}' must be {kind}{'integer' if integer else 'number'}, got {value!r}")
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
        raise fail(where, f"'objective.metric' must be a metric name, got {objective.metric!r}")
    if objective.direction not in DIRECTIONS:
        raise fail(where, f"'objective.direction' is '{objective.direction}': use maximize or minimize")
    if spec.pruner.default not in PRUNERS:
        raise fail(where, f"'pruner.default' is '{spec.pruner.default}': use one of {', '.join(PRUNERS)}")
    if not spec.space:
        raise fail(where, "'space' must map at least one dotted verl key to its range")
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
        raise fail(where, f"'space.{key}.type' is {kind!r}: use one of {', '.join(PARAM_TYPES)}")
    if kind == "categorical":
        extra = [name for name in ("low", "high", "relative", "step") if getattr(entry, name) is not None]
        extra += ["log"] if entry.log else []
        if extra:
            raise fail(where, f"'space.{key}.{extra[0]}' does not apply to a categorical parameter")
        choices = entry.choices
        if not choices:
            raise fail(where, f"'space.{key}.choices' is empty: list at least one value")
        if len(set(map(repr, choices))) != len(choices):
            raise fail(where, f"'space.{key}.choices' lists a value twice: {choices}")
        return ParamSpec(name=key, type=kind, choices=tuple(choices))
    if entry.choices is not None:
        raise fail(where, f"'space.{key}.choices' applies to type categorical only")
    has_abs, has_rel = entry.low is not None or entry.high is not None, entry.relative is not None
    if has_abs == has_rel:
        raise fail(where, f"'space.{key}' needs either low and high, or relative: [low factor, high factor]")
    log, step = entry.log, entry.step
    if step is not None:
        _number(where, f"space.{key}.step", step, integer=kind == "int", positive=True)
        if log:
            raise fail(where, f"'space.{key}' cannot have both log: true and a step")
    if has_rel:
        factors = entry.relative
        if len(factors) != 2:
            raise fail(where, f"'space.{key}.relative' must be [low factor, high factor], got {factors!r}")
        lo, hi = (_number(where, f"space.{key}.relative", f, positive=True) for f in factors)
        if lo >= hi:
            raise fail(where, f"'space.{key}.relative' is an empty range: {lo} >= {hi}")
        return ParamSpec(name=key, type=kind, relative=(float(lo), float(hi)), log=log, step=step)
    if entry.low is None or entry.high is None:
        raise fail(where, f"'space.{key}' needs both low and high")
    lo = _number(where, f"space.{key}.low", entry.low, integer=kind == "int")
    hi = _number(where, f"space.{key}.high", entry.high, integer=kind == "int")
    if lo >= hi:
        raise fail(where, f"'space.{key}' is an empty range: low {lo} >= high {hi}")
    if log and lo <= 0:
        raise fail(where, f"'space.{key}' is log-scaled, so low must be > 0, got {lo}")
    return ParamSpec(name=key, type=kind, low=lo, high=hi, log=log, step=step)
