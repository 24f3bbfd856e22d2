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

This package, one job per module (each imports its siblings, never this facade):

- :mod:`~verlflow.config.schema` — the typed schemas: :class:`~verlflow.config.schema.Profile` and the
  recipe's ``verlflow:`` block, :class:`VerlflowBlock` (every key, its type, its default, one comment each).
- :mod:`~verlflow.config.loading` — find a recipe, profile or search config by name or ``.yaml`` path, read it
  into its schema (:func:`~verlflow.config.loading.build`); the one "unknown key, did you mean …" message.
- :mod:`~verlflow.config.overrides` — ``key=value`` syntax: parsing, dotted keys, Hydra quoting.
- :mod:`~verlflow.config.verl_schema` — the installed verl's defaults; overrides checked against them.
- :mod:`~verlflow.config.compose` — :func:`compose` and its result, :class:`ComposedConfig`.

Data next to the code: ``recipes/``, ``profiles/``, ``search/`` (search configs) and ``stacks/`` (the guide's
cluster images) under :data:`CONFIG_ROOT`. The names below are the ones the rest of verlflow imports from
here, plus :class:`VerlflowBlock`, the type of ``ComposedConfig.verlflow``.
"""

from __future__ import annotations

from verlflow.config.compose import ComposedConfig, compose
from verlflow.config.loading import CONFIG_ROOT, list_profiles, list_recipes, load_profile, load_recipe
from verlflow.config.overrides import DELETE, flatten_tree, parse_overrides, split_prefix
from verlflow.config.schema import VerlflowBlock
from verlflow.config.verl_schema import hydra_overrides, validate_against_verl, verl_default_keys, verl_defaults

__all__ = [
    "CONFIG_ROOT",
    "DELETE",
    "ComposedConfig",
    "VerlflowBlock",
    "compose",
    "flatten_tree",
    "hydra_overrides",
    "list_profiles",
    "list_recipes",
    "load_profile",
    "load_recipe",
    "parse_overrides",
    "split_prefix",
    "validate_against_verl",
    "verl_default_keys",
    "verl_defaults",
]
