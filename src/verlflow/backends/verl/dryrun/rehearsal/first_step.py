"""The first training step on a tiny batch: what verl calls after the first rollout, called before launch.

verl reaches these only after Ray, the workers, the model and a whole rollout have started:

- the reward's return, read the way verl's reward managers read it (0.9
  ``experimental/reward_loop/reward_manager/naive.py:NaiveRewardManager.run_single`` takes ``result["score"]``
  of a dict, else the value, and ``base.py:assemble_rm_scores`` puts it into a float tensor; 0.5
  ``workers/reward_manager/naive.py:NaiveRewardManager.__call__`` does the same): :func:`reward_return_problem`;
- the advantage estimator, through verl's own ``trainer/ppo/ray_trainer.py:compute_advantage`` on a dummy batch
  of the configured group size, holding what the workers put in it (``sum_pi_squared`` only with
  ``actor.calculate_sum_pi_squared``): :func:`advantage`;
- the policy loss, verl's ``core_algos.get_policy_loss_fn(loss_mode)`` called as the actor calls it (0.9
  ``workers/utils/losses.py:ppo_loss``, 0.5 ``workers/actor/dp_actor.py:update_policy``) on dummy tensors with
  the actor's own config: :func:`policy_loss`;
- the profiler's steps (0.9 ``RayPPOTrainer.fit``: ``self.global_steps in global_profiler.steps``) and the
  rollout data folder (``RayPPOTrainer._dump_generations``: ``os.makedirs(rollout_data_dir)``):
  :func:`config_problems`.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verlflow.backends.verl.dryrun.keys import ACTOR, ROLLOUT
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import message_of, value_of
from verlflow.errors import Problem

# The dummy batch: prompts × rollout.n responses of this many tokens.
PROMPTS, LENGTH = 2, 4
# What the batch holds when verl computes the advantage (ray_trainer.fit, before compute_advantage).
FLOAT_FIELDS = ("token_level_scores", "token_level_rewards", "old_log_probs", "ref_log_prob", "values",
                "rollout_log_probs")


def reward_return_problem(result: Any, key: str, value: Any) -> Problem | None:
    """``result`` of one reward call read as verl reads it; a problem naming ``key`` when verl could not."""
    import torch

    try:
        score = result["score"] if isinstance(result, dict) else result
        torch.zeros(1).new_tensor([score])
    except Exception as exc:  # KeyError: a dict without score; TypeError/ValueError: None, a string, a list
        shown = _shown_return(result)
        return Problem(key, value, (
            f"the reward function returned {shown} on a real prompt; verl's reward manager takes result['score'] "
            f"of a dict, else the value, as one float ({type(exc).__name__}: {message_of(exc)[:120]}): return a "
            "number, or a dict with a numeric 'score'"))
    return None


def _shown_return(result: Any) -> str:
    """What the reward returned, in the words that say why verl cannot read a float from it."""
    if isinstance(result, dict):
        if "score" not in result:
            return f"a dict without 'score' (keys {', '.join(map(str, list(result)[:6]))})"
        result = result["score"]
        return f"a dict whose 'score' is {type(result).__name__} {result!r:.60}"
    return f"{type(result).__name__} {result!r:.60}"


# The second response the reward is called on: no answer at all (a group holds wrong answers beside right ones).
WRONG_ANSWER = "I do not know."
# Reward extra values verl's metrics take: numbers, bools, strings (skipped) and None (dropped).
SCALARS = (int, float, bool, str, type(None))


def reward_extra_problems(results: list[Any], key: str, cfg: DictConfig) -> tuple[list[Problem], list[str]]:
    """The extra keys of the reward's dict returns, as verl gathers them over a batch.

    verl 0.9 gathers each key of the first sample's dict over every sample (``experimental/agent_loop/
    agent_loop.py:1109-1111`` ``info[key]``: a key another sample lacks is a KeyError; 0.5 the validation's
    ``ray_trainer.py`` length assert) and averages them per data source in validation
    (``trainer/ppo/metric_utils.py:process_validation_metrics``, ``np.mean``: a list or dict value fails).
    """
    dicts = [result for result in results if isinstance(result, dict)]
    path = value_of(cfg, key)
    if len(dicts) == len(results) and len({frozenset(d) for d in dicts}) > 1:
        first, other = (set(d) for d in dicts[:2])
        return [Problem(key, path, (
            f"the reward function returned the keys {', '.join(sorted(map(str, first)))} for a right answer and "
            f"{', '.join(sorted(map(str, other)))} for a wrong one; verl gathers every key of the first sample's "
            "dict from each sample of the batch (experimental/agent_loop/agent_loop.py:1111, info[key]): return "
            "the same keys every time (0.0 or None where a value does not apply)"))], []
    bad = sorted({str(k) for d in dicts for k, v in d.items() if k != "score" and not isinstance(v, SCALARS)})
    if not bad:
        return [], []
    line = (f"the reward function returns {', '.join(bad)} as a list or dict; verl averages every extra key of the "
            "reward per data source in validation (trainer/ppo/metric_utils.py:process_validation_metrics, "
            "np.mean): return numbers (or strings, which it skips)")
    validates = value_of(cfg, "trainer.val_before_train") or (value_of(cfg, "trainer.test_freq") or 0) > 0
    if validates:
        return [Problem(key, path, line)], []
    return [], [f"{key}={path}: {line} (this run does not validate, so only its dumps carry them)"]


def ground_truth_problems(truth: Any, source: Any, cfg: DictConfig) -> list[Problem]:
    """A ground truth verl's default GSM8K scorer can never match: it compares the answer it extracts, a string,
    with ``ground_truth`` (``utils/reward_score/gsm8k.py:compute_score``, ``answer == ground_truth``), so a float
    or a missing one makes every reward 0, silently."""
    if isinstance(truth, str) or "gsm8k" not in str(source).lower():
        return []
    key = "data.train_files"
    return [Problem(key, value_of(cfg, key), (
        f"the first row's reward_model.ground_truth is {type(truth).__name__} {truth!r:.40}, and verl's default "
        f"scorer for {source} compares it with the answer it extracts as a string (utils/reward_score/gsm8k.py:"
        "compute_score), so every reward would be 0: write the ground truth as a string (verlflow preprocess "
        "does), or give reward.custom_reward_function"))]


def reward_raised_problem(exc: BaseException, key: str, path: Any) -> Problem | None:
    """An exception raised inside the reward function's own file (``path``), named on ``key``; None when it was
    raised elsewhere (verl calling it with arguments it does not take is verl's site, :mod:`.raise_sites`)."""
    tb, inside = exc.__traceback__, None
    while tb is not None:
        if path and Path(tb.tb_frame.f_code.co_filename).resolve() == Path(str(path)).expanduser().resolve():
            inside = tb.tb_lineno
        tb = tb.tb_next
    if inside is None:
        return None
    return Problem(key, path, (
        f"the reward function raised {type(exc).__name__} at line {inside} ({message_of(exc)[:120]}) when called "
        "on a real training prompt with a placeholder response, as verl calls it after each rollout: fix the "
        "function"))


# What verl's reward managers pass the scoring function, by keyword (0.9 reward_manager/naive.py:67, 0.5 naive.py:82).
PASSED = ("data_source", "solution_str", "ground_truth", "extra_info")
UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")
MISSING = re.compile(r"missing \d+ required (?:positional |keyword-only )?arguments?: (.+)")


def reward_signature_problem(exc: BaseException, path_key: str, cfg: DictConfig) -> Problem | None:
    """A TypeError of the call itself (the function's signature against what verl passes), on the key to change:
    ``reward_kwargs`` when the argument is one it adds or lacks, the function's path when verl's own is refused."""
    if not isinstance(exc, TypeError):
        return None
    section = path_key.rpartition(".")[0]
    kwargs_key = f"{section}.reward_kwargs"
    given = value_of(cfg, kwargs_key) or {}
    path = value_of(cfg, path_key)
    message = message_of(exc)
    unexpected, missing = UNEXPECTED.search(message), MISSING.search(message)
    if unexpected and unexpected.group(1) in given:
        return Problem(kwargs_key, given, (
            f"the reward function takes no argument {unexpected.group(1)!r}, which reward_kwargs adds to verl's "
            f"call (trainer/ppo/reward.py:_call_with_kwargs): remove it from reward_kwargs, or add it to the "
            "function's signature"))
    if unexpected:
        return Problem(path_key, path, (
            f"verl calls the reward function with {', '.join(PASSED)} by keyword (reward_manager/naive.py:"
            f"NaiveRewardManager), and its signature has no {unexpected.group(1)!r}: add "
            f"{unexpected.group(1)}=None (or **kwargs) to it"))
    if missing:
        names = re.findall(r"'(\w+)'", missing.group(1)) or ["<name>"]
        return Problem(kwargs_key, given, (
            f"the reward function requires {', '.join(names)}, which verl does not pass ({', '.join(PASSED)} "
            f"only): add +{kwargs_key}.{names[0]}=<value>, or give it a default in the function"))
    return None


def _count(cfg: DictConfig, key: str) -> int:
    value = value_of(cfg, key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def dummy_batch(cfg: DictConfig) -> Any:
    """A DataProto of ``PROMPTS`` × ``rollout.n`` responses holding what the workers put in before the advantage."""
    import numpy as np
    import torch
    from verl import DataProto

    n = _count(cfg, f"{ROLLOUT}.n")
    size = PROMPTS * n
    generator = torch.Generator().manual_seed(0)
    tensors = {name: torch.rand(size, LENGTH, generator=generator) - 0.5 for name in FLOAT_FIELDS}
    tensors["old_log_probs"] = -torch.rand(size, LENGTH, generator=generator)
    tensors["response_mask"] = torch.ones(size, LENGTH)
    tensors["responses"] = torch.zeros(size, LENGTH, dtype=torch.long)
    tensors["prompts"] = torch.zeros(size, LENGTH, dtype=torch.long)
    tensors["attention_mask"] = torch.ones(size, 2 * LENGTH, dtype=torch.long)
    if value_of(cfg, f"{ACTOR}.calculate_sum_pi_squared"):  # the actor adds it only when asked
        tensors["sum_pi_squared"] = torch.rand(size, LENGTH, generator=generator)
    uid = np.array([str(i // n) for i in range(size)], dtype=object)
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid})


def advantage(cfg: DictConfig) -> None:
    """verl's ``compute_advantage`` on a dummy batch, called with the arguments ``RayPPOTrainer.fit`` passes."""
    ray_trainer = importlib.import_module("verl.trainer.ppo.ray_trainer")
    algorithm = OmegaConf.select(cfg, "algorithm")
    ray_trainer.compute_advantage(
        dummy_batch(cfg), adv_estimator=algorithm.adv_estimator, gamma=algorithm.get("gamma", 1.0),
        lam=algorithm.get("lam", 1.0), num_repeat=_count(cfg, f"{ROLLOUT}.n"),
        norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True), config=algorithm)


def policy_loss(cfg: DictConfig) -> None:
    """verl's policy loss for ``actor.policy_loss.loss_mode`` on dummy tensors, with the actor's config object."""
    import torch
    from verl.trainer.ppo import core_algos

    mode = value_of(cfg, f"{ACTOR}.policy_loss.loss_mode") or "vanilla"
    if mode not in getattr(core_algos, "POLICY_LOSS_REGISTRY", {}):
        return  # an unknown name is loss_problems'; 0.5's vanilla loss sits outside the registry
    actor = OmegaConf.select(cfg, ACTOR)
    config: Any = actor
    if isinstance(actor.get("_target_"), str):  # verl >= 0.6 hands the loss its ActorConfig dataclass
        from verl.utils.config import omega_conf_to_dataclass

        config = omega_conf_to_dataclass(actor)
    size = PROMPTS * _count(cfg, f"{ROLLOUT}.n")
    generator = torch.Generator().manual_seed(0)
    log_prob = -torch.rand(size, LENGTH, generator=generator)
    core_algos.get_policy_loss_fn(mode)(
        old_log_prob=log_prob - 0.01, log_prob=log_prob, advantages=torch.rand(size, LENGTH, generator=generator),
        response_mask=torch.ones(size, LENGTH), loss_agg_mode=value_of(cfg, f"{ACTOR}.loss_agg_mode") or "token-mean",
        config=config)


def profiler_steps_problems(cfg: DictConfig) -> list[Problem]:
    """The profiled steps must be a list of step numbers (or null): verl tests ``global_steps in steps``.

    verl >= 0.6 reads ``global_profiler.steps``, 0.5 ``trainer.profile_steps`` (``RayPPOTrainer.fit``).
    """
    problems = []
    for key in ("global_profiler.steps", "trainer.profile_steps"):
        node = OmegaConf.select(cfg, key, default=None)
        if node is None or isinstance(node, ListConfig):
            continue
        problems.append(Problem(key, value_of(cfg, key), (
            f"verl's trainer asks `global_steps in {key.rpartition('.')[2]}` at every step (trainer/ppo/ray_trainer.py:"
            f"RayPPOTrainer.fit), which fails on {type(node).__name__} {node}: give a list, e.g. [{node}]")))
    return problems


def rollout_data_dir_problems(cfg: DictConfig) -> list[Problem]:
    """``trainer.rollout_data_dir`` must be a folder verl can create (``os.makedirs`` at the first dump)."""
    key = "trainer.rollout_data_dir"
    value = value_of(cfg, key)
    if not value or "://" in str(value):
        return []
    path = Path(str(value)).expanduser()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return []
    if not existing.is_dir():
        why = f"{existing} is a file, so no folder can be made {'there' if existing == path else 'under it'}"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = f"{existing} is not writable here"
    else:
        return []
    return [Problem(key, value, (
        f"verl writes each step's rollouts there with os.makedirs (trainer/ppo/ray_trainer.py:_dump_generations, "
        f"after the first rollout): {why}: name a folder that can be created, or null"))]


def config_problems(cfg: DictConfig, *, check_files: bool) -> list[Problem]:
    """The first step's checks that need no verl call: the profiler's steps, the rollout data folder."""
    return profiler_steps_problems(cfg) + (rollout_data_dir_problems(cfg) if check_files else [])
