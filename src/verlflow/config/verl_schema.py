"""The installed verl's config schema: its defaults, and overrides checked against them before any launch.

    python -c "from verlflow.config.verl_schema import verl_defaults as d; print(d()['actor_rollout_ref.rollout.n'])"

verl's ``ppo_trainer`` config is composed with Hydra from the installed verl's own files, so the keys and
defaults are always those of the verl that will run. Every override is checked against them: an unknown
key, a ``+key`` verl already has, a ``~key`` it lacks, a word for a number — each is one line naming the key
(and, for a typo, the nearest valid keys), all of them at once, instead of minutes later on a cluster.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verlflow.config.overrides import ADD, DELETE, DELETE_PREFIX, FORCE_ADD, flatten_tree, split_prefix, to_hydra_value
from verlflow.config.typed_build import nearest
from verlflow.errors import NO_VALUE, Problem, VerlflowError, raise_problems


@functools.lru_cache(maxsize=1)
def verl_config_dir() -> str:
    """Folder of the installed verl's Hydra configs (``verl/trainer/config``), found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise VerlflowError("verl is not installed in this python: pip install verl (or use backend=local)")
    return str(Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config")


@functools.lru_cache(maxsize=1)
def verl_defaults() -> dict[str, Any]:
    """Every dotted key of the installed verl's default ppo_trainer config, with its default value.

    Composed once per verl install and kept in :func:`defaults_cache_file` (keyed by verl's config files,
    so another verl or an edited file composes afresh): it does not change between runs.
    """
    cache = defaults_cache_file()
    with contextlib.suppress(OSError, ValueError):
        return json.loads(cache.read_text())
    defaults = flatten_tree(OmegaConf.to_container(_compose_verl(()), resolve=False))
    with contextlib.suppress(OSError, TypeError, ValueError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        scratch = cache.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(defaults))
        os.replace(scratch, cache)  # atomic: a concurrent reader sees the whole file or none
    return defaults


def defaults_cache_file() -> Path:
    """Where :func:`verl_defaults` keeps the installed verl's defaults: named by a digest of its config files."""
    root = Path(verl_config_dir())
    digest = hashlib.sha256(str(root).encode())
    for path in sorted(root.rglob("*.yaml")):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}:{stat.st_mtime_ns}:{stat.st_size}".encode())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "verlflow" / f"verl-defaults-{digest.hexdigest()[:16]}.json"


def verl_default_keys() -> tuple[str, ...]:
    """Every dotted key of the installed verl's default ppo_trainer config (for suggestions)."""
    return tuple(verl_defaults())


def in_verl_schema(key: str) -> bool:
    """Whether ``key`` is a key (or a section) of the installed verl's config."""
    return key in verl_defaults() or any(k.startswith(f"{key}.") for k in verl_default_keys())


def free_form_parent(key: str) -> str | None:
    """The part of ``key`` whose verl default is an empty mapping that takes any sub-key, else None.

    ``actor_rollout_ref.model.override_config.attn_implementation`` → ``actor_rollout_ref.model.override_config``
    (verl's default ``override_config: {}``).
    """
    parts = key.split(".")
    defaults = verl_defaults()
    for end in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:end])
        if parent in defaults:
            return parent if defaults[parent] == {} else None
    return None


def hydra_overrides(overrides: dict[str, Any]) -> list[str]:
    """Dotted overrides as ``key=value`` strings for verl's command line or Hydra's compose (``~key`` alone).

    A plain key inside a free-form mapping (see :func:`free_form_parent`) gets Hydra's ``++`` (add or override).
    """
    rendered = []
    for key, value in overrides.items():
        if value is DELETE:
            rendered.append(key)
        else:
            prefix = "++" if split_prefix(key)[0] == "" and free_form_parent(key) else ""
            rendered.append(f"{prefix}{key}={to_hydra_value(value)}")
    return rendered


def _type_problem(key: str, value: Any) -> Problem | None:
    """A value whose kind cannot be what verl's default for ``key`` is (a word for a number)."""
    default = verl_defaults().get(key)
    if isinstance(default, bool) and not isinstance(value, bool):
        return Problem(key, value, f"config key '{key}' expects True or False, got '{value}'")
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        if isinstance(value, bool) or (isinstance(value, str) and not value.startswith("${")):
            return Problem(key, value, f"config key '{key}' expects a number, got '{value}'")
    return None


def key_problems(overrides: dict[str, Any]) -> list[Problem]:
    """Keys verl's Hydra would refuse, and values of the wrong kind: every one, not only the first.

    A plain key must exist in the installed verl's config; ``+key`` must not (Hydra adds it); ``++key``
    may be either; ``~key`` must exist.
    """
    problems = []
    for raw_key, value in overrides.items():
        prefix, key = split_prefix(raw_key)
        value = NO_VALUE if value is DELETE else value
        known = in_verl_schema(key)
        if prefix == "" and not known and not free_form_parent(key):
            near = nearest(key, verl_default_keys(), n=3)
            hint = f"; nearest valid keys: {', '.join(near)}" if near else ""
            problems.append(Problem(key, value, f"unknown config key '{key}' for the installed verl{hint} "
                                                f"(+{key}=… adds a key verl's config does not have)"))
        elif prefix == ADD and known:
            problems.append(Problem(raw_key, value, f"'{key}' is already in verl's config: write {key}=… "
                                                    f"(or ++{key}=…) to change it"))
        elif prefix == DELETE_PREFIX and not known:
            problems.append(Problem(raw_key, value, f"'{key}' is not in verl's config, nothing to delete"))
        elif prefix in ("", FORCE_ADD) and known:
            problem = _type_problem(key, value)
            if problem:
                problems.append(problem)
    return problems


def _compose_fully(overrides: tuple[str, ...]) -> DictConfig:
    """verl's ppo_trainer composed by Hydra from the installed verl's files, ``overrides`` applied."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=list(overrides))


@functools.lru_cache(maxsize=2)
def _composed_defaults(config_dir: str) -> DictConfig:
    return _compose_fully(())


def _compose_verl(overrides: tuple[str, ...]) -> DictConfig:
    """What :func:`_compose_fully` gives, from a copy of the defaults composed once per process where the
    overrides only set values (compat.hydra says why and when)."""
    from verlflow.compat import hydra as hydra_compat

    parsed = hydra_compat.value_overrides(list(overrides))
    if parsed is None:
        return _compose_fully(overrides)
    cfg = copy.deepcopy(_composed_defaults(verl_config_dir()))
    return cfg if hydra_compat.apply_value_overrides(parsed, cfg) else _compose_fully(overrides)


def validate_against_verl(overrides: dict[str, Any]) -> DictConfig:
    """Compose verl's ppo_trainer with ``overrides``; every unknown key or bad value is one clear line."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    raise_problems(key_problems(overrides))
    try:
        cfg = _compose_verl(tuple(hydra_overrides(overrides)))
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), str(exc))
        raise VerlflowError(f"verl rejects the config: {first}") from None
    return cfg
