"""Compose a recipe, a device profile and command-line overrides into one verl-shaped config.

    python -c "from verlflow.config import compose; print(compose('qwen3-4b-gsm8k-grpo', 'a3').overrides)"

A *recipe* (``config/recipes/<name>.yaml``) is a tree shaped like verl's ``ppo_trainer`` config plus a
``verlflow:`` block of our own. A *profile* (``config/profiles/<name>.yaml``) holds what differs between
machines: the device, environment variables, files to source, libraries to preload and a ``verl:`` tree of
overrides. Composition order is recipe < profile < overrides. Every verl-shaped key is validated against the
config schema of the *installed* verl, and every key of our own blocks against its typed schema, so an
unknown key fails here, naming the key and its nearest valid neighbour, instead of minutes later on a cluster.

Overrides use verl's dotted form (``actor_rollout_ref.rollout.n=8``) with Hydra's prefixes (``+key``,
``++key``, ``~key``). Two prefixes reach our own blocks: ``verlflow.<key>=…`` edits the recipe's
``verlflow:`` block and ``profile.<field>=…`` edits the profile (``profile.env.OMP_NUM_THREADS=1``).

This package, one job per module (each imports its siblings, never this facade; every module outside the
package imports from this facade only, tests/test_import_layout.py):

- :mod:`~verlflow.config.schema` — the typed schemas: :class:`Profile` (its ``device`` a
  :class:`verlflow.platforms.Device`, re-exported here), its hardware record :class:`Accelerator`, and the recipe's
  ``verlflow:`` block, :class:`VerlflowBlock` (every key, its type, its default, one comment each).
- :mod:`~verlflow.config.loading` — find a recipe, profile or search config by name or ``.yaml`` path, read it
  into its schema.
- :mod:`~verlflow.config.typed_build` — a mapping → a schema dataclass (:func:`build`), overrides applied to one;
  the one "unknown key, did you mean …" message.
- :mod:`~verlflow.config.device_defaults` — what ``auto`` means on each device (recipe, profile).
- :mod:`~verlflow.config.counts` — counts of a composed config (secrets in overrides: :mod:`verlflow.secrets`).
- :mod:`~verlflow.config.overrides` — ``key=value`` syntax: parsing, dotted keys, Hydra quoting.
- :mod:`~verlflow.config.verl_schema` — the installed verl's defaults; overrides checked against them.
- :mod:`~verlflow.config.compose` — :func:`compose` and its result, :class:`ComposedConfig`.

Data next to the code: ``recipes/``, ``profiles/``, ``search/`` (search configs) and ``stacks/`` (the guide's
cluster images) under :data:`CONFIG_ROOT`. The names below are the ones the rest of verlflow imports from
here.
"""

from __future__ import annotations

from verlflow.config.compose import OWN_PREFIX, ComposedConfig, compose
from verlflow.config.counts import check_config_counts, config_count_problems, group_size_problems
from verlflow.config.device_defaults import PROFILE_FOR_DEVICE, VERL_CPU_PROFILE, default_recipe
from verlflow.config.loading import (
    CONFIG_ROOT,
    PROFILES_DIR,
    SEARCH_DIR,
    list_profiles,
    list_recipes,
    load_named_yaml,
    load_profile,
    load_recipe,
)
from verlflow.config.loggable import loggable_tree
from verlflow.config.overrides import DELETE, LiteralText, flatten_tree, parse_overrides, split_prefix
from verlflow.config.schema import Accelerator, Device, Profile, VerlflowBlock
from verlflow.config.typed_build import build, nearest, with_overrides
from verlflow.config.verl_schema import (
    hydra_overrides,
    validate_against_verl,
    verl_config_dir,
    verl_default_keys,
    verl_defaults,
)

__all__ = [
    "CONFIG_ROOT",
    "DELETE",
    "OWN_PREFIX",
    "PROFILES_DIR",
    "PROFILE_FOR_DEVICE",
    "SEARCH_DIR",
    "VERL_CPU_PROFILE",
    "Accelerator",
    "ComposedConfig",
    "Device",
    "LiteralText",
    "Profile",
    "VerlflowBlock",
    "build",
    "check_config_counts",
    "compose",
    "config_count_problems",
    "group_size_problems",
    "default_recipe",
    "flatten_tree",
    "hydra_overrides",
    "list_profiles",
    "list_recipes",
    "load_named_yaml",
    "load_profile",
    "load_recipe",
    "loggable_tree",
    "nearest",
    "parse_overrides",
    "split_prefix",
    "validate_against_verl",
    "verl_config_dir",
    "verl_default_keys",
    "verl_defaults",
    "with_overrides",
]
