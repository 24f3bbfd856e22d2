"""Which settings differ between two runs, and what each difference means (recipe, profile, paths, launch).

    python -c "from verlflow.compare.diff import profile_param_keys; print(sorted(profile_param_keys()))"

Two runs of one recipe on two device profiles may differ only in profile keys (the comparison checks
this). Params are verl's flattened config (``trainer/n_gpus_per_node``); a param is a *profile* key when a
shipped profile (or the run's own) sets it, or when verl's default interpolates one
(``actor_rollout_ref/rollout/n_gpus_per_node`` follows ``trainer.n_gpus_per_node``). Anything else
that differs, outside paths and names, means the recipes differ, and the report says so first.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from verlflow import config
from verlflow.compare.same_work import model_name
from verlflow.compare.snapshot import MISSING
from verlflow.errors import VerlflowError
from verlflow.names import BACKEND_TAG, PROFILE_TAG, RECIPE_TAG
from verlflow.step_requests import REQUEST_TYPES, params_of

if TYPE_CHECKING:
    from verlflow.compare.snapshot import RunSnapshot

# Params that say *where* things are or what a run is called, not *how* it trains: a cluster has its
# own data and model folders, so these differ between machines without the recipe differing.
LOCATION_PARAMS = (
    "data/train_files",
    "data/val_files",
    "actor_rollout_ref/model/path",
    "trainer/default_local_dir",
    "trainer/default_hdfs_dir",
    "trainer/project_name",
    "trainer/experiment_name",
    "trainer/rollout_data_dir",
    "trainer/validation_data_dir",
    # verl's defaults interpolate these from the model path and the trainer's names.
    "actor_rollout_ref/rollout/prometheus/served_model_name",
    "actor_rollout_ref/rollout/trace/project_name",
    "actor_rollout_ref/rollout/trace/experiment_name",
)
# Params that differ between the verl backend and the local trainer without the training differing: keys
# verlflow's verl launcher forces (a save_freq that saves the final checkpoint, the V0 trainer, traces) and keys verl
# fills in while it runs (total_training_steps copied into the optimizers, the reward pool sized like the
# trainer's). They are reported with the launch, not as a recipe difference.
# verlflow's own bookkeeping of a run's attempts (a resume's lease, the digest that vouches for the arguments a
# resume reruns, the digest of the checkpoint it made): how it ran, never what it trained.
ATTEMPT_PARAM_PREFIXES = ("verlflow.lease.", "verlflow.train_args", "verlflow.checkpoint_sha256")
BACKEND_PARAMS = (
    "trainer/save_freq",
    "trainer/use_v1",
    # verl's rollout traces, which verlflow's verl launcher turns on: what is recorded, not how it trains.
    "actor_rollout_ref/rollout/trace/backend",
    "actor_rollout_ref/rollout/trace/token2text",
    "actor_rollout_ref/rollout/trace/max_samples_per_step_per_worker",
    "actor_rollout_ref/actor/optim/total_training_steps",
    "critic/optim/total_training_steps",
    "reward/reward_model/n_gpus_per_node",
    "reward/reward_model/nnodes",
)
# verl's profiler settings (verlflow.profile_steps turns them on in a verl launch): what is recorded, not how it
# trains; matched as prefixes, reported with the launch.
PROFILER_PARAMS = ("global_profiler", "actor_rollout_ref/actor/profiler", "actor_rollout_ref/ref/profiler",
                   "actor_rollout_ref/rollout/profiler", "critic/profiler")
# Params that only seed a run: a set of runs of one setting differs in them, so they are not a recipe difference.
SEED_PARAMS = ("data/seed", "actor_rollout_ref/rollout/seed")
# Tags that belong to the device profile (profile name, env knobs) or to how a run was launched.
PROFILE_TAG_PREFIXES = ("env.",)
PROFILE_TAGS = (PROFILE_TAG,)
RECIPE_TAGS = (RECIPE_TAG,)
LAUNCH_TAGS = (BACKEND_TAG,)


@dataclass
class DiffRow:
    """A setting whose value differs between the runs (``-``: absent in that run)."""

    key: str
    baseline: str
    candidate: str


@dataclass
class ConfigDiff:
    """Differences grouped by what they mean: recipe (must not differ), profile, seeds, locations, launch."""

    recipe: list[DiffRow] = field(default_factory=list)
    profile: list[DiffRow] = field(default_factory=list)
    seeds: list[DiffRow] = field(default_factory=list)
    locations: list[DiffRow] = field(default_factory=list)
    launch: list[DiffRow] = field(default_factory=list)

    @property
    def recipes_differ(self) -> bool:
        """Whether anything outside the device profile (and outside paths/names) differs."""
        return bool(self.recipe)


def _matches(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(f"{p}/") for p in prefixes)


def classify_param(key: str, profile_keys: Iterable[str], launch_params: Iterable[str]) -> str:
    """Which group a differing param belongs to: ``profile``, ``seeds``, ``locations``, ``launch`` or ``recipe``.

    ``profile_keys`` are verl keys in ``/`` form (``trainer/n_gpus_per_node``); a list param matches
    by prefix (``trainer/logger/0``). ``launch_params`` are the step parameters ``mlflow run`` logs
    (``device``, ``overrides`` …): their effect shows up in the other groups.
    """
    if _matches(key, profile_keys):
        return "profile"
    if key in SEED_PARAMS:
        return "seeds"
    if _matches(key, LOCATION_PARAMS):
        return "locations"
    if ("/" not in key and key in set(launch_params)) or key in BACKEND_PARAMS or _matches(key, PROFILER_PARAMS) \
            or key.startswith(ATTEMPT_PARAM_PREFIXES):
        return "launch"
    return "recipe"


def _short(value: str | None, width: int = 80) -> str:
    if value is None:
        return MISSING
    text = str(value).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def config_diff(
    baseline: RunSnapshot,
    candidate: RunSnapshot,
    profile_keys: Iterable[str],
    launch_params: Iterable[str] = (),
) -> ConfigDiff:
    """Every param, profile tag and dataset digest that differs, grouped (see :class:`ConfigDiff`)."""
    profile_keys, launch_params = list(profile_keys), list(launch_params)
    diff = ConfigDiff()
    for key in sorted(set(baseline.params) | set(candidate.params)):
        b, c = baseline.params.get(key), candidate.params.get(key)
        if b != c:
            group = classify_param(key, profile_keys, launch_params)
            getattr(diff, group).append(DiffRow(key, _short(b), _short(c)))
    for key in sorted(set(baseline.tags) | set(candidate.tags)):
        b, c = baseline.tags.get(key), candidate.tags.get(key)
        if b == c:
            continue
        row = DiffRow(f"tag {key}", _short(b), _short(c))
        if key in RECIPE_TAGS:
            diff.recipe.insert(0, row)
        elif key in PROFILE_TAGS or key.startswith(PROFILE_TAG_PREFIXES):
            diff.profile.append(row)
        elif key in LAUNCH_TAGS:
            diff.launch.append(row)
    # The model: its path is filed with the locations (machine-specific), but another model is another recipe.
    if model_name(baseline) != model_name(candidate):
        diff.recipe.insert(0, DiffRow("model", _short(model_name(baseline)), _short(model_name(candidate))))
    # Data: the same digest under different paths is the same data; a different digest is not.
    for name in sorted(set(baseline.datasets) & set(candidate.datasets)):
        if baseline.datasets[name] != candidate.datasets[name]:
            diff.recipe.append(
                DiffRow(f"dataset {name} digest", baseline.datasets[name], candidate.datasets[name])
            )
    return diff


def profile_param_keys(extra_profiles: Iterable[str] = ()) -> set[str]:
    """verl keys (``/`` form, as params are logged) that any shipped profile — or a run's own — sets.

    Keys whose verl default interpolates a profile key follow it and count as profile keys too
    (``actor_rollout_ref.rollout.n_gpus_per_node`` is ``${oc.select:trainer.n_gpus_per_node,8}``).
    """
    dotted: set[str] = set()
    for name in {*config.list_profiles(), *extra_profiles}:
        try:
            profile = config.load_profile(name)
        except VerlflowError:
            continue  # a run's profile given as a path on another machine
        dotted |= set(config.flatten_tree(profile.verl))
    dotted |= _interpolating_keys(dotted)
    return {k.replace(".", "/") for k in dotted}


# verl ships its default trainer config fully composed as plain YAML (verl >= 0.4.1); reading that text
# takes milliseconds, where composing it with Hydra imports verl (torch, ray, tensordict: seconds).
GENERATED_DEFAULTS = ("trainer", "config", "_generated_ppo_trainer.yaml")


@functools.lru_cache(maxsize=1)
def verl_default_values() -> dict[str, object]:
    """Every dotted key of the installed verl's default trainer config with its raw (unresolved) value.

    Read from the YAML file verl ships without importing verl; composed with Hydra where that file is
    absent (older verl). Empty when verl is not installed.
    """
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return {}
    generated = Path(next(iter(spec.submodule_search_locations)), *GENERATED_DEFAULTS)
    if generated.is_file():
        import yaml

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        tree = yaml.load(generated.read_text(encoding="utf-8"), Loader=loader) or {}
        return config.flatten_tree(tree)
    try:
        return config.verl_defaults()
    except Exception:  # noqa: BLE001 - an unimportable verl: there is nothing to follow
        return {}


def _interpolating_keys(keys: set[str]) -> set[str]:
    """Keys of verl's default config whose value interpolates one of ``keys``, transitively."""
    defaults = verl_default_values()
    found: set[str] = set()
    frontier = set(keys)
    while frontier:
        names = "|".join(map(re.escape, sorted(frontier)))
        pattern = re.compile(r"\$\{[^}]*?(?<![\w.])(" + names + r")(?![\w])")
        seen = found | keys
        new = {k for k, v in defaults.items() if isinstance(v, str) and k not in seen and pattern.search(v)}
        found |= new
        frontier = new
    return found


def launch_param_names() -> set[str]:
    """Names of the step parameters ``mlflow run`` logs as params (``device``, ``overrides`` …)."""
    return {p.name for request_type in REQUEST_TYPES for p in params_of(request_type)}
