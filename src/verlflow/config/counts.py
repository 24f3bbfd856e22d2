"""Counts and sizes of a composed config checked before anything starts: integers of the right sign.

    python -c "from verlflow.config import compose; from verlflow.config.counts import config_count_problems as c; \
print(c(compose('smoke', 'cpu', 'trainer.total_epochs=0').resolved))"

Each problem is one line naming the key, the bad value and what would be valid (``total_training_steps=-1``
would train nothing and still end FINISHED; ``=abc`` would fail minutes later inside verl).
"""

from __future__ import annotations

from typing import Any

from verlflow.errors import Problem, raise_problems

# verl keys that count something: an integer >= the minimum (None allowed where verl derives the value).
COUNT_KEYS: dict[str, int] = {
    "data.train_batch_size": 1,
    "data.max_prompt_length": 1,
    "data.max_response_length": 1,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 1,
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.rollout.val_kwargs.n": 1,
    "trainer.total_epochs": 1,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 1,
}
OPTIONAL_COUNT_KEYS: dict[str, int] = {
    "trainer.total_training_steps": 1,
    "data.val_batch_size": 1,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
}
# Integers where -1 means "off" (verl's convention): any integer >= -1.
SWITCH_KEYS = ("trainer.save_freq", "trainer.test_freq")
NON_NEGATIVE_NUMBERS = ("actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.actor.kl_loss_coef",
                        "actor_rollout_ref.actor.entropy_coeff")


def _select(resolved: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(resolved, key, default=None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def config_count_problems(resolved: Any) -> list[Problem]:
    """Counts and sizes of a composed config that are not integers of the right sign (``total_training_steps=-1``
    would train nothing and still end FINISHED; ``=abc`` would fail minutes later inside verl)."""
    problems = []
    for key, minimum in {**COUNT_KEYS, **OPTIONAL_COUNT_KEYS}.items():
        value = _select(resolved, key)
        if value is None and key in OPTIONAL_COUNT_KEYS:
            continue
        if not _is_int(value) or value < minimum:
            unset = " (or leave it unset)" if key in OPTIONAL_COUNT_KEYS else ""
            problems.append(Problem(key, repr(value), f"must be an integer >= {minimum}{unset}"))
    for key in SWITCH_KEYS:
        value = _select(resolved, key)
        if value is not None and (not _is_int(value) or value < -1):
            problems.append(Problem(key, repr(value), "must be an integer: a step interval >= 1, or -1 for off"))
    for key in NON_NEGATIVE_NUMBERS:
        value = _select(resolved, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            problems.append(Problem(key, repr(value), "must be a number >= 0"))
    if not problems:
        problems += _rollout_size_problems(resolved) + group_size_problems(resolved)
    return problems


def group_size_problems(resolved: Any) -> list[Problem]:
    """GRPO with fewer than 2 responses per prompt: its advantage is a response's reward normalised by the mean and
    std of its prompt's group of ``rollout.n`` responses, and a group of one has neither (verl's rollout.yaml: "n: >
    1 for grpo"; its grpo estimator then passes the raw reward on, grpo_vectorized gives 0): nothing GRPO learns."""
    n, estimator = _select(resolved, "actor_rollout_ref.rollout.n"), str(_select(resolved, "algorithm.adv_estimator"))
    if not (_is_int(n) and n < 2 and estimator.startswith("grpo")):
        return []
    return [Problem("actor_rollout_ref.rollout.n", n,
                    f"algorithm.adv_estimator={estimator} normalises each response's reward by its prompt's group of "
                    "n responses, so the group size must be >= 2 (verl: \"> 1 for grpo\"); with one there is no "
                    "group advantage: use n >= 2 (the guide uses 5)")]


# What one rolled-out token holds at the least (its id as int64, its log-probability as float32), and more memory
# than any accelerator has today: a step whose rollout exceeds the two together cannot run anywhere.
BYTES_PER_TOKEN = 12
DEVICE_BYTES_CEILING = 1 << 40  # 1 TiB


def _rollout_size_problems(resolved: Any) -> list[Problem]:
    """A step whose rollout cannot fit in the memory of all the run's devices, by arithmetic alone (a rollout of
    ``n=1000000`` responses of ``100000000`` tokens started training and died at step 1)."""
    devices = _select(resolved, "trainer.nnodes") * _select(resolved, "trainer.n_gpus_per_node")
    n = _select(resolved, "actor_rollout_ref.rollout.n")
    batch = _select(resolved, "data.train_batch_size")
    length = _select(resolved, "data.max_prompt_length") + _select(resolved, "data.max_response_length")
    tokens = batch * n * length
    if tokens * BYTES_PER_TOKEN <= devices * DEVICE_BYTES_CEILING:
        return []
    return [Problem("actor_rollout_ref.rollout.n", n,
                    f"a step rolls out data.train_batch_size={batch} × n={n} × (max_prompt_length + "
                    f"max_response_length = {length}) = {tokens:.3g} tokens, more than {devices} device(s) of even "
                    f"{DEVICE_BYTES_CEILING >> 30} GiB hold at {BYTES_PER_TOKEN} bytes a token: lower n, the batch "
                    "or the lengths")]


def check_config_counts(resolved: Any) -> None:
    """Raise every :func:`config_count_problems` at once (one line each)."""
    raise_problems(config_count_problems(resolved), "the config")
