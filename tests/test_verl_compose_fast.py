"""verl's config composed from a copy of its defaults gives what Hydra's whole composition gives, errors included.

A dry run composes verl's ppo_trainer for every check; the whole composition costs about 0.4 CPU-s, the copy
milliseconds (verlflow.compat.hydra). These compare the two on the installed verl, value by value, for every
kind of override a command line can hold, and show which lines still take the whole composition.
"""

from __future__ import annotations

import pytest
from hydra.errors import HydraException
from omegaconf import OmegaConf

from verlflow.compat.hydra import value_overrides
from verlflow.config import verl_schema

SAME_CONFIG = {
    "nothing": [],
    "values": ["trainer.nnodes=2", "actor_rollout_ref.rollout.n=8", "data.train_batch_size=64",
               "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.optim.lr=1e-06"],
    "list and interpolation": ["trainer.logger=[console,mlflow]", "trainer.experiment_name=${trainer.project_name}"],
    "quoted": ["trainer.project_name='a b,c'", "data.prompt_key=\"question\""],
    "null": ["actor_rollout_ref.model.override_config=null"],
    "added": ["+trainer.brand_new=3", "+actor_rollout_ref.model.override_config.attention_dropout=0.0"],
    "forced": ["++trainer.nnodes=4", "++trainer.also_new=x"],
    "deleted": ["~trainer.val_before_train"],
}
SAME_ERROR = {
    "unknown key": ["trainer.no_such_key=1"],
    "added twice": ["+trainer.nnodes=3"],
    "deleted, absent": ["~trainer.no_such_key"],
    "deleted, other value": ["~trainer.nnodes=5"],
    "under a leaf": ["trainer.nnodes.deeper=1"],
}
WHOLE_COMPOSITION = {
    "group choice": ["actor@actor_rollout_ref.actor=dp_actor"],
    "top-level group": ["data=legacy_data"],
    "sweep": ["trainer.nnodes=1,2"],
    "hydra's own": ["hydra.job.name=x"],
    "unparsable": ["trainer.nnodes=[1,"],
}


def _outcome(compose, overrides: list[str]):
    try:
        cfg = compose(tuple(overrides))
    except HydraException as exc:
        return ("error", type(exc).__name__, str(exc))
    return ("config", OmegaConf.to_container(cfg, resolve=False), OmegaConf.is_struct(cfg))


@pytest.mark.parametrize("case", [*SAME_CONFIG, *SAME_ERROR])
def test_a_value_override_gives_the_whole_compositions_config_or_error(case):
    overrides = {**SAME_CONFIG, **SAME_ERROR}[case]
    assert value_overrides(overrides) is not None, "this line should take the copy, not the whole composition"
    fast, whole = _outcome(verl_schema._compose_verl, overrides), _outcome(verl_schema._compose_fully, overrides)
    assert fast[0] == ("config" if case in SAME_CONFIG else "error")
    assert fast == whole


def test_a_copy_leaves_the_shared_defaults_as_they_were():
    before = OmegaConf.to_container(verl_schema._compose_verl(()), resolve=False)
    verl_schema._compose_verl(("trainer.nnodes=7", "~trainer.val_before_train", "+trainer.brand_new=1"))
    assert OmegaConf.to_container(verl_schema._compose_verl(()), resolve=False) == before


@pytest.mark.parametrize("case", list(WHOLE_COMPOSITION))
def test_a_line_that_needs_the_defaults_list_takes_the_whole_composition(case):
    assert value_overrides(WHOLE_COMPOSITION[case]) is None
