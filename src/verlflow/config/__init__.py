"""Compose a recipe, a device profile and command-line overrides into one verl-shaped config.

    python -c "from verlflow.config import compose; print(compose('qwen3-4b-gsm8k-grpo', 'a3').overrides)"

A *recipe* (``config/recipes/<name>.yaml``) is a tree shaped like verl's ``ppo_trainer`` config plus a
``verlflow:`` block of our own. A *profile* (``config/profiles/<name>.yaml``) holds what differs between
machines: the device, environment variables, files to source, libraries to preload and a ``verl:`` tree of
overrides. Composition order is recipe < profile < overrides. Every verl-shaped key is validated against the
config schema of the *installed* verl (Hydra compose of its ``ppo_trainer``), so an unknown key fails here,
naming the key and its nearest valid neighbours, instead of minutes later on a cluster.

Overrides use verl's dotted form (``actor_rollout_ref.rollout.n=8``) with Hydra's prefixes: ``+key=value`` adds a
key verl's config does not have (inside an open dict such as ``rollout.engine_kwargs.vllm``), ``++key=value``
adds or overrides, ``~key`` deletes. Two prefixes reach our own blocks:
``verlflow.<key>=…`` edits the recipe's ``verlflow:`` block and ``profile.<field>=…`` edits the profile
(``profile.env.OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import difflib
import functools
import re
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from verlflow.errors import VerlflowError
from verlflow.problems import NO_VALUE, Problem, raise_problems

CONFIG_ROOT = Path(__file__).parent
RECIPES_DIR = CONFIG_ROOT / "recipes"
PROFILES_DIR = CONFIG_ROOT / "profiles"
DEVICES = ("npu", "gpu", "cpu")
# Hydra's override prefixes: add a new key, add-or-override, delete.
ADD, FORCE_ADD, DELETE_PREFIX = "+", "++", "~"


class _Delete:
    """The value of a ``~key`` override: the key is removed from verl's config."""

    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()


@dataclass
class Profile:
    """What differs between two machines running the same recipe."""

    name: str
    # npu | gpu | cpu: which accelerator this profile drives.
    device: str
    description: str = ""
    # Exported before launch (A3: TASK_QUEUE_ENABLE=2 enables the two-level task pipeline).
    env: dict[str, str] = field(default_factory=dict)
    # Shell files sourced before launch, when they exist (CANN's set_env.sh, ATB's set_env.sh).
    source_files: list[str] = field(default_factory=list)
    # Shared libraries put on LD_PRELOAD when present (jemalloc on aarch64, as the guide does).
    preload: list[str] = field(default_factory=list)
    # verl overrides of this profile, a tree shaped like verl's config.
    verl: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The profile as plain data, for ``device_profile.json`` and run comparison."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class ComposedConfig:
    """A recipe on a profile with overrides: everything a backend needs to launch or to log."""

    recipe_name: str
    profile: Profile
    # The recipe's own ``verlflow:`` block (model_name, data source, …) after overrides.
    verlflow: dict[str, Any]
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


def list_recipes() -> list[str]:
    """Names of the shipped recipes (file stems under ``config/recipes``)."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def list_profiles() -> list[str]:
    """Names of the shipped device profiles (file stems under ``config/profiles``)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def _named_yaml(kind: str, name: str, folder: Path, known: list[str]) -> tuple[str, dict[str, Any]]:
    """Load a shipped YAML by name, or a user's YAML by path; a clear error otherwise."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        stem = path.stem
    else:
        path = folder / f"{name}.yaml"
        stem = name
        if not path.is_file():
            raise VerlflowError(f"unknown {kind} '{name}': choose one of {', '.join(known)} or give a .yaml path")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise VerlflowError(f"{kind} file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise VerlflowError(f"{kind} file {path} must hold a mapping, not {type(data).__name__}")
    return stem, data


def load_recipe(name: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Return (name, verlflow block, verl tree) of a recipe given by name or path."""
    stem, data = _named_yaml("recipe", name, RECIPES_DIR, list_recipes())
    own = data.pop("verlflow", {}) or {}
    return stem, dict(own), data


def load_profile(name: str) -> Profile:
    """Return the device profile given by name or path, checked field by field."""
    stem, data = _named_yaml("profile", name, PROFILES_DIR, list_profiles())
    known = {f.name for f in fields(Profile)} - {"name"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise VerlflowError(f"profile '{stem}' has unknown field '{unknown[0]}': valid fields are {sorted(known)}")
    profile = Profile(name=stem, **data)
    if profile.device not in DEVICES:
        raise VerlflowError(f"profile '{stem}' has device '{profile.device}': use one of {', '.join(DEVICES)}")
    profile.env = {str(k): str(v) for k, v in profile.env.items()}
    return profile


def flatten_tree(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten a nested mapping to dotted keys; lists stay values (verl's command-line form)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_tree(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def parse_overrides(overrides: str | list[str] | tuple[str, ...] | None) -> dict[str, Any]:
    """Parse ``key=value`` overrides (a shell-quoted string or a list) into dotted key → typed value.

    Values are read as YAML scalars/lists, so ``5e-7`` is a float, ``True`` a bool and
    ``['console','mlflow']`` a list, as Hydra reads them on verl's command line. Hydra's prefixes stay
    on the key (``+key``, ``++key``); ``~key`` maps to :data:`DELETE` (``~key=value`` to that value,
    which Hydra deletes only when it matches).
    """
    if overrides is None:
        return {}
    items = shlex.split(overrides) if isinstance(overrides, str) else list(overrides)
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        bare = key.lstrip("+~")
        if key.startswith(DELETE_PREFIX) and bare and key == DELETE_PREFIX + bare:
            parsed[key] = _yaml_value(raw) if sep else DELETE
            continue
        if not sep or not bare or key not in (bare, ADD + bare, FORCE_ADD + bare):
            raise VerlflowError(f"override '{item}' is not key=value, +key=value, ++key=value or ~key "
                                "(e.g. actor_rollout_ref.rollout.n=8)")
        parsed[key] = _yaml_value(raw)
    return parsed


def split_prefix(key: str) -> tuple[str, str]:
    """``'++a.b'`` → ``('++', 'a.b')``: Hydra's prefix of an override key and the dotted key itself."""
    bare = key.lstrip("+~")
    return key[: len(key) - len(bare)], bare


def _yaml_value(raw: str) -> Any:
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        return raw
    # YAML 1.1 reads 5e-7 as a string where verl's Hydra reads a float.
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def to_hydra_value(value: Any) -> str:
    """Render a value the way verl's Hydra command line expects it (``True``, ``5e-07``, ``['a','b']``).

    A string Hydra would not read back unchanged as a bare word (a space, ``/`` next to other symbols,
    non-ASCII letters: experiment names such as ``Qwen3 GRPO/A3 对比``) is quoted.
    """
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_quoted(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ",".join(f"{k}:{to_hydra_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, str) and not _BARE_WORD.fullmatch(value) and not _INTERPOLATION.fullmatch(value):
        return hydra_quote(value)
    return str(value)


# Strings Hydra reads back unchanged without quotes: words, numbers-as-text, absolute/relative paths, URLs.
_BARE_WORD = re.compile(r"[A-Za-z0-9_\-+.:/@%]*")
_INTERPOLATION = re.compile(r"\$\{[^{}]*\}")


def hydra_quote(text: str) -> str:
    """``text`` as a Hydra quoted string: single quotes, with ``'`` and ``${`` escaped."""
    escaped = text.replace("'", "\\'").replace("${", "\\${")
    return f"'{escaped}'"


def _quoted(value: Any) -> str:
    return hydra_quote(value) if isinstance(value, str) else to_hydra_value(value)


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


@functools.lru_cache(maxsize=1)
def verl_config_dir() -> str:
    """Folder of the installed verl's Hydra configs (``verl/trainer/config``)."""
    import verl

    return str(Path(verl.__file__).parent / "trainer" / "config")


@functools.lru_cache(maxsize=1)
def verl_defaults() -> dict[str, Any]:
    """Every dotted key of the installed verl's default ppo_trainer config, with its default value."""
    cfg = _compose_verl(())
    return flatten_tree(OmegaConf.to_container(cfg, resolve=False))


def verl_default_keys() -> tuple[str, ...]:
    """Every dotted key of the installed verl's default ppo_trainer config (for suggestions)."""
    return tuple(verl_defaults())


def _type_problem(key: str, value: Any) -> Problem | None:
    """A value whose kind cannot be what verl's default for ``key`` is (a word for a number)."""
    default = verl_defaults().get(key)
    if isinstance(default, bool) and not isinstance(value, bool):
        return Problem(key, value, f"config key '{key}' expects True or False, got '{value}'")
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        if isinstance(value, bool) or (isinstance(value, str) and not value.startswith("${")):
            return Problem(key, value, f"config key '{key}' expects a number, got '{value}'")
    return None


def _in_schema(key: str) -> bool:
    """Whether ``key`` is a key (or a section) of the installed verl's config."""
    return key in verl_defaults() or any(k.startswith(f"{key}.") for k in verl_default_keys())


def key_problems(overrides: dict[str, Any]) -> list[Problem]:
    """Keys verl's Hydra would refuse, and values of the wrong kind: every one, not only the first.

    A plain key must exist in the installed verl's config; ``+key`` must not (Hydra adds it); ``++key``
    may be either; ``~key`` must exist.
    """
    problems = []
    for raw_key, value in overrides.items():
        prefix, key = split_prefix(raw_key)
        value = NO_VALUE if value is DELETE else value
        known = _in_schema(key)
        if prefix == "" and not known and not free_form_parent(key):
            near = difflib.get_close_matches(key, verl_default_keys(), n=3, cutoff=0.6)
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


def _compose_verl(overrides: tuple[str, ...]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=list(overrides))


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
        merged[key if _in_schema(key) else ADD + key] = value
    else:
        merged[raw_key] = value


def _apply_own(block: dict[str, Any], dotted: str, value: Any, what: str, valid: set[str]) -> None:
    head, _, rest = dotted.partition(".")
    if head not in valid:
        near = difflib.get_close_matches(head, sorted(valid), n=3)
        hint = f"; nearest: {', '.join(near)}" if near else f"; valid: {', '.join(sorted(valid))}"
        raise VerlflowError(f"unknown {what} key '{dotted}'{hint}")
    if rest:
        target = block.setdefault(head, {})
        if not isinstance(target, dict):
            raise VerlflowError(f"{what} key '{head}' is not a mapping, cannot set '{dotted}'")
        target[rest] = value
    else:
        block[head] = value


def compose(
    recipe: str,
    profile: str,
    overrides: str | list[str] | tuple[str, ...] | None = None,
    *,
    extra: dict[str, Any] | None = None,
) -> ComposedConfig:
    """Compose recipe < profile < overrides and validate the verl part against the installed verl.

    ``extra`` holds dotted verl keys the caller sets on the user's behalf (data files, model path),
    applied between the profile and the user's overrides, so a user's explicit override still wins.
    """
    recipe_name, own, verl_tree = load_recipe(recipe)
    prof = load_profile(profile)

    merged: dict[str, Any] = flatten_tree(verl_tree)
    merged.update(flatten_tree(prof.verl))
    merged.update(extra or {})
    for key, value in parse_overrides(overrides).items():
        if key.startswith("verlflow."):
            own[key.removeprefix("verlflow.")] = value
        elif key.startswith("profile."):
            valid = {f.name for f in fields(Profile)} - {"name", "verl"}
            holder = prof.to_dict()
            _apply_own(holder, key.removeprefix("profile."), value, "profile", valid)
            prof = Profile(**holder)
            prof.env = {str(k): str(v) for k, v in prof.env.items()}
        else:
            _merge_user_override(merged, key, value)
    resolved = validate_against_verl(merged)
    return ComposedConfig(recipe_name=recipe_name, profile=prof, verlflow=own, overrides=merged, resolved=resolved)
