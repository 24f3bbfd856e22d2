"""A resolved config as it may leave the process: what an interpolation read from the environment stays there.

    python -c "from verlflow.config.loggable import env_interpolations as e; print(e({'+a.b': '${oc.env:X}'}))"

verl's config is resolved in the process that runs it (``${oc.env:DB_URL}`` becomes the variable's value), and
the resolved config is logged: ``config/resolved.yaml``, the dry run's ``config/verl_job.yaml``, the local
trainer's params. A variable whose name does not look secret was then logged in clear. Here the keys whose
value reads the environment keep their unresolved form (``${oc.env:DB_URL}``), and the values read are marked
secret for the rest of the process, so a key that copies one (``${trainer.db_url}``) is masked too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verlflow import secrets
from verlflow.config.overrides import split_prefix

# The resolvers that read the process's environment: OmegaConf's ``oc.env`` and the deprecated ``env``.
_READS_ENVIRONMENT = re.compile(r"\$\{\s*(?:oc\.env|env)\s*:")


def env_interpolations(overrides: Mapping[str, Any]) -> dict[str, str]:
    """Key (without its ``+``/``++``/``~``) → unresolved value, for each override whose value reads the environment."""
    return {split_prefix(key)[1]: value for key, value in overrides.items()
            if isinstance(value, str) and _READS_ENVIRONMENT.search(value)}


def loggable_tree(resolved: DictConfig, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``resolved`` as plain dicts and lists fit for a log: environment reads unresolved, secrets masked."""
    unresolved = env_interpolations(overrides)
    for key in unresolved:
        secrets.remember(str(OmegaConf.select(resolved, key, default="")))
    tree = OmegaConf.to_container(resolved, resolve=True)
    for key, value in unresolved.items():
        _put(tree, key.split("."), value)
    return secrets.mask_tree(tree)


def _put(tree: Any, path: list[str], value: str) -> None:
    for part in path[:-1]:
        if not isinstance(tree, dict) or part not in tree:
            return
        tree = tree[part]
    if isinstance(tree, dict) and path[-1] in tree:
        tree[path[-1]] = value
