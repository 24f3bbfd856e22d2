"""One GRPO step and one validation pass of the local trainer, timed under verl's timer names.

A step: generate → reward → old log-probs → reference log-probs → advantages → PPO update, each phase timed
as verl's ``marked_timer`` times it (``timing_s/gen``, …) and annotated for ``torch.profiler``; validation
scores ``val_kwargs`` samples on the val prompts. The trainer (:mod:`.trainer`) owns the run around them:
which prompts a step takes, when to validate, checkpoints and logging.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from verlflow.backends.local.loss import batched_log_probs, compute_advantages, is_on_policy, update_actor
from verlflow.backends.local.metrics import val_metric_names, verl_batch_metrics
from verlflow.backends.local.rollout import PromptSet, generate, score
from verlflow.backends.local.settings import LocalSettings

# Rows of the samples table per logged step (a 2560-response step would make an unreadable table).
MAX_SAMPLE_ROWS = 64
# verl's timer names of a step's phases: also the profiler's annotations (a profiled step's summary rows).
PHASES = ("step", "gen", "reward", "old_log_prob", "ref", "adv", "update_actor")


def grpo_step(
    model: Any, ref_model: Any, optimizer: Any, scheduler: Any, tokenizer: Any, prompts: PromptSet, *,
    settings: LocalSettings, reward_fn: Any, device: torch.device, step: int,
) -> tuple[dict[str, float], dict[str, list]]:
    """One GRPO step of ``model`` on ``prompts`` (``step``'s batch); returns (metrics, samples table rows)."""
    from verl.trainer.ppo.core_algos import agg_loss

    timing, metrics = {}, {}
    temperature = settings.sampling.get("temperature", 1.0)
    with timer("step", timing):
        with timer("gen", timing):
            rollout = generate(model, tokenizer, prompts, n=settings.n, sampling=settings.sampling,
                               max_new_tokens=settings.max_response_length, device=device)
        with timer("reward", timing):
            rollout.scores = score(rollout, prompts, settings.n, reward_fn)
        input_ids, attention_mask, mask = rollout.input_ids, rollout.attention_mask, rollout.response_mask
        length = mask.shape[1]
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": mask}
        on_policy = is_on_policy(model, ppo_epochs=settings.actor.ppo_epochs,
                                 mini_batch=settings.ppo_mini_batch_size * settings.n, batch_size=len(input_ids))
        with timer("old_log_prob", timing):
            # On-policy (one epoch, one mini-batch) the update's first forward gives the old log-probs
            # and the entropy, as in verl and TRL: no separate pass, this phase costs nothing.
            if not on_policy:
                batch["old_log_probs"], entropy = batched_log_probs(
                    model, input_ids, attention_mask, length, temperature, settings.log_prob_micro_batch,
                    with_entropy=True, group=settings.n)
                metrics["actor/entropy"] = agg_loss(loss_mat=entropy, loss_mask=mask.bool(),
                                                    loss_agg_mode=settings.actor.loss_agg_mode).item()
        if ref_model is not None:
            with timer("ref", timing):
                batch["ref_log_prob"], _ = batched_log_probs(
                    ref_model, input_ids, attention_mask, length, temperature,
                    settings.ref_log_prob_micro_batch, group=settings.n)
        with timer("adv", timing):
            scores = rollout.token_level_scores()
            # No KL in the reward (algorithm.use_kl_in_reward is not supported): rewards = scores.
            advantages, returns = compute_advantages(
                settings.adv_estimator, scores, mask, rollout.index,
                norm_adv_by_std_in_grpo=settings.norm_adv_by_std_in_grpo, algorithm=settings.algorithm)
            batch["advantages"] = advantages
        with timer("update_actor", timing):
            metrics.update(update_actor(
                model, optimizer, batch, actor=settings.actor,
                mini_batch=settings.ppo_mini_batch_size * settings.n, micro_batch=settings.ppo_micro_batch_size,
                grad_clip=settings.grad_clip, temperature=temperature, group=settings.n))
            metrics["actor/lr"] = scheduler.get_last_lr()[0]
            scheduler.step()
    metrics.update(verl_batch_metrics(
        rollout, scores, advantages, returns, timing, max_prompt_length=settings.max_prompt_length,
        max_response_length=settings.max_response_length))
    samples = {"step": [step] * len(rollout.response_texts), "prompt": rollout.prompt_texts,
               "response": rollout.response_texts, "reward": rollout.scores.tolist()}
    return metrics, {k: v[:MAX_SAMPLE_ROWS] for k, v in samples.items()}


def validate(model: Any, tokenizer: Any, prompts: PromptSet, *, settings: LocalSettings, reward_fn: Any,
             device: torch.device) -> dict[str, float]:
    """Score ``val_kwargs`` samples on the val prompts; verl's ``val-core/<source>/reward/mean@N``."""
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    # verl hands the whole val set to vLLM at once; transformers generates a training batch's worth at a time.
    batch = settings.val_batch_size or settings.train_batch_size * settings.n
    sources, uids, rewards = [], [], []
    for start in range(0, len(prompts), batch):
        rows = list(range(start, min(start + batch, len(prompts))))
        chunk = prompts.take(rows)
        rollout = generate(model, tokenizer, chunk, n=settings.val_n, sampling=settings.val_sampling,
                           max_new_tokens=settings.max_response_length, device=device)
        rewards += score(rollout, chunk, settings.val_n, reward_fn).tolist()
        sources += [chunk.data_sources[i // settings.val_n] for i in range(len(rollout.response_texts))]
        uids += [str(rows[i // settings.val_n]) for i in range(len(rollout.response_texts))]
    return val_metric_names(process_validation_metrics(sources, uids, {"reward": rewards}))


@contextlib.contextmanager
def timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    """verl's ``marked_timer``: seconds of the block into ``timing[name]``, annotated for ``torch.profiler``."""
    start = time.perf_counter()
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        timing[name] = timing.get(name, 0.0) + time.perf_counter() - start
