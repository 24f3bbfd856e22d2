"""The names verl resolves from its registries, asked of the installed verl: one line each, listing the valid ones.

    verlflow train --device npu --dry_run true --overrides "actor_rollout_ref.rollout.name=vlm"

- ``actor_rollout_ref.rollout.name``: verl's rollout registry (``workers/rollout/base.py``
  ``_ROLLOUT_REGISTRY``), or, in verls without one (0.5.x), its ``workers/rollout/<name>_rollout`` modules;
- ``algorithm.adv_estimator``: ``core_algos.ADV_ESTIMATOR_REGISTRY``;
- ``actor_rollout_ref.actor.loss_agg_mode``: the modes ``core_algos.agg_loss`` compares against;
- ``trainer.logger``: ``verl.utils.tracking.Tracking.supported_backend``;
- the reward manager (0.5 ``reward_model.reward_manager``, 0.9 ``reward.reward_manager.name``): verl's own
  lookup is called, and its registry listed when it refuses the name.

This is the rehearsal's first stage: verl itself fails on these names later (the advantage estimator and the
loss aggregation at the first step, :mod:`.first_step`; the rollout when a worker builds it; the logger when
the trainer starts; the reward manager when the start-up loads it, where the rehearsal reaches that only for
a model on this machine), with a message that names neither the key nor the valid names. The rehearsal keeps the
first line for a key (:func:`verlflow.backends.verl.dryrun.rehearsal.rehearse`), so this one, which says what
would be valid, is the one shown.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from verlflow.backends.verl.dryrun.keys import ACTOR, ROLLOUT, value_of
from verlflow.backends.verl.dryrun.startup_checks import compared_strings
from verlflow.compat import verl as compat_verl
from verlflow.errors import Problem

# Where each verl names its reward manager (0.5 the top level's reward_model, 0.9 the reward section).
REWARD_MANAGER_KEYS = ("reward_model.reward_manager", "reward.reward_manager.name")


@dataclass(frozen=True)
class VerlNames:
    """The names the installed verl accepts, asked of its registries."""

    rollout_engines: tuple[str, ...]
    adv_estimators: tuple[str, ...]
    loss_agg_modes: tuple[str, ...]
    loggers: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def verl_names() -> VerlNames:
    """Read the accepted names from the installed verl (imports its core_algos: a few seconds, once)."""
    from verl.trainer.ppo import core_algos
    from verl.utils.tracking import Tracking

    return VerlNames(
        rollout_engines=_rollout_engines(),
        adv_estimators=tuple(sorted(getattr(core_algos, "ADV_ESTIMATOR_REGISTRY", {}))),
        loss_agg_modes=compared_strings(core_algos.agg_loss, "loss_agg_mode"),
        loggers=tuple(Tracking.supported_backend),
    )


def _rollout_engines() -> tuple[str, ...]:
    registry = compat_verl.rollout_registry()
    if registry:
        return tuple(sorted({key[0] if isinstance(key, tuple) else key for key in registry}))
    package = importlib.import_module("verl.workers.rollout")
    return tuple(sorted(m.name.removesuffix("_rollout") for m in pkgutil.iter_modules(package.__path__)
                        if m.name.endswith("_rollout")))


def name_problems(cfg: DictConfig) -> list[Problem]:
    """Engine, estimator, aggregation mode and logger names the installed verl does not know."""
    names = verl_names()
    checks = [
        (f"{ROLLOUT}.name", names.rollout_engines, "rollout engine"),
        ("algorithm.adv_estimator", names.adv_estimators, "advantage estimator"),
        (f"{ACTOR}.loss_agg_mode", names.loss_agg_modes, "loss aggregation mode"),
    ]
    problems = []
    for key, valid, what in checks:
        value = value_of(cfg, key)
        if valid and str(value) not in valid:
            fix = f"unknown {what} for the installed verl: use one of {', '.join(valid)}"
            problems.append(Problem(key, value, fix))
    loggers = value_of(cfg, "trainer.logger", [])
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    unknown = [name for name in loggers if name not in names.loggers]
    if unknown:
        problems.append(Problem("trainer.logger", loggers, f"{', '.join(map(str, unknown))} unknown to verl's "
                                                           f"Tracking: use some of {', '.join(names.loggers)}"))
    return problems + reward_manager_problems(cfg)


def reward_manager_problems(cfg: DictConfig) -> list[Problem]:
    """A reward manager name unknown to verl (0.5: ``reward_model.reward_manager``, 0.9: ``reward.reward_manager``).

    verl 0.9 resolves it with ``reward.resolve_reward_manager_cls`` (its reward-loop registry), called here;
    0.5 with ``workers.reward_manager.get_reward_manager_cls``. A manager loaded from a user's module
    (``source: importlib``) is not executed here.
    """
    if OmegaConf.select(cfg, "reward.reward_manager.name") is not None:
        if value_of(cfg, "reward.reward_manager.source", "register") != "register":
            return []
        from verl.trainer.ppo.reward import resolve_reward_manager_cls

        key, registry = REWARD_MANAGER_KEYS[1], "verl.experimental.reward_loop.reward_manager.registry"
        lookup = functools.partial(resolve_reward_manager_cls, cfg)
    else:
        from verl.workers.reward_manager.registry import get_reward_manager_cls

        key, registry = REWARD_MANAGER_KEYS[0], "verl.workers.reward_manager.registry"
        lookup = functools.partial(get_reward_manager_cls, value_of(cfg, key) or "naive")
    try:
        lookup()
    except ValueError:
        module = importlib.import_module(registry)
        names = getattr(module, "REWARD_MANAGER", None) or getattr(module, "REWARD_MANAGER_REGISTRY", {})
        return [Problem(key, value_of(cfg, key), f"unknown reward manager for the installed verl: use one of "
                                             f"{', '.join(sorted(names))}")]
    return []


__all__ = ["REWARD_MANAGER_KEYS", "VerlNames", "verl_names", "name_problems", "reward_manager_problems"]
