"""verl's config sections and the one way the dry run reads a key of a resolved config.

Every check of the dry run (the rule modules and the rehearsal) names keys the way a user types them in
``--overrides`` (``actor_rollout_ref.rollout.n``) and reads them through :func:`value_of`, so a value in a
problem line is the value the user gave, resolved, never an OmegaConf node.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"


def value_of(cfg: DictConfig, key: str, default: Any = None) -> Any:
    """The resolved value of ``key`` as a user would type it (a section as plain dicts and lists), else ``default``."""
    value = OmegaConf.select(cfg, key, default=default)
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


__all__ = ["ACTOR", "REF", "ROLLOUT", "MODEL", "value_of"]
