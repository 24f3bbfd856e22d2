"""compare reads verl's default config from the YAML verl ships (no verl import) and finds the same keys."""

from __future__ import annotations

from verlflow import config
from verlflow.compare.diff import profile_param_keys, verl_default_values


def test_shipped_default_yaml_holds_what_hydra_composes():
    shipped, composed = verl_default_values(), config.verl_defaults()
    # Hydra adds its own `model_engine` choice to the composed tree; every verl key is in the shipped file.
    assert set(composed) - set(shipped) <= {"model_engine"}
    assert {k: v for k, v in composed.items() if k in shipped} == {k: shipped[k] for k in composed if k in shipped}


def test_keys_that_interpolate_a_profile_key_count_as_profile_keys():
    keys = profile_param_keys()
    assert {"trainer/n_gpus_per_node", "trainer/device"} <= keys
    # verl's default is ${oc.select:trainer.n_gpus_per_node,8}: it follows the profile.
    assert "actor_rollout_ref/rollout/n_gpus_per_node" in keys
    assert "actor_rollout_ref/actor/optim/lr" not in keys
