"""The GRPO math of the local trainer: log-probs, advantages and the PPO-clip actor update, all verl's.

    pytest tests/test_grpo_loss_pieces.py

Nothing here re-derives the algorithm. Advantages come from verl's advantage-estimator registry
(``compute_grpo_outcome_advantage`` for ``grpo``), the clipped policy loss from verl's policy-loss
registry (``compute_policy_loss_vanilla``, which reads clip ratios from verl's own ``ActorConfig``),
the KL term from ``kl_penalty`` and every reduction from ``agg_loss``. What is ours is the plumbing
that verl's FSDP worker does on a cluster: micro-batches, gradient accumulation with the mini-batch's
token count as the normaliser (``global_batch_info``, as verl's ``ppo_loss`` sets it), gradient
clipping, the optimizer step and verl's metric names.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def response_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
    temperature: float, *, with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of the last ``response_length`` tokens, logits / temperature.

    input_ids, attention_mask: (b, P+R) left-padded prompt + right-padded response → (b, R) each.
    """
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits
    # The logit at position t predicts token t+1: (b, R, V) for the response tokens.
    logits = logits[:, -response_length - 1:-1, :].float() / temperature
    responses = input_ids[:, -response_length:]
    log_probs = logprobs_from_logits(logits, responses)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return log_probs, entropy


@torch.no_grad()
def batched_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
    temperature: float, micro_batch: int, *, with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_log_probs` over the whole batch in chunks of ``micro_batch`` rows, without grad."""
    was_training = model.training
    model.eval()
    parts = [response_log_probs(model, input_ids[s], attention_mask[s], response_length, temperature,
                                with_entropy=with_entropy) for s in _chunks(len(input_ids), micro_batch)]
    model.train(was_training)
    log_probs = torch.cat([p[0] for p in parts])
    entropy = torch.cat([p[1] for p in parts]) if with_entropy else None
    return log_probs, entropy


def compute_advantages(
    estimator: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
    *, norm_adv_by_std_in_grpo: bool = True, algorithm: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each (B, R), from verl's advantage-estimator registry.

    ``index`` groups the responses of one prompt (GRPO normalises each group by its mean and std).
    """
    from verl.trainer.ppo import core_algos

    fn = core_algos.get_adv_estimator_fn(estimator)
    kwargs: dict[str, Any] = {"token_level_rewards": token_level_rewards, "response_mask": response_mask,
                              "index": index}
    if estimator == core_algos.AdvantageEstimator.GRPO.value:
        kwargs["norm_adv_by_std_in_grpo"] = norm_adv_by_std_in_grpo
    else:
        kwargs["config"] = algorithm
    return fn(**kwargs)


def actor_loss(
    actor: Any, *, log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
    response_mask: torch.Tensor, ref_log_prob: torch.Tensor | None, entropy: torch.Tensor | None,
    batch_num_tokens: int, global_batch_size: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's share of the mini-batch loss: PPO-clip − entropy_coeff·entropy + kl_coef·KL.

    Every (b, R) tensor is reduced with ``agg_loss`` against the *mini-batch's* token count and size,
    so summing the micro-batch losses (gradient accumulation) gives the mini-batch loss exactly.
    """
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty

    actor.global_batch_info.update(dp_size=1, batch_num_tokens=batch_num_tokens,
                                   global_batch_size=global_batch_size, loss_scale_factor=actor.loss_scale_factor)
    mask = response_mask.bool()
    mode = actor.loss_agg_mode
    policy_loss_fn = get_policy_loss_fn(actor.policy_loss.get("loss_mode", "vanilla"))
    pg_loss, pg_metrics = policy_loss_fn(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                                         response_mask=mask, loss_agg_mode=mode, config=actor,
                                         rollout_is_weights=None)
    # "sum": a share of the mini-batch value; "mean": a micro-batch statistic (verl's Metric aggregation).
    metrics = {"sum:actor/pg_loss": pg_loss.item()}
    metrics.update({f"mean:{k}": float(v) for k, v in pg_metrics.items()})
    loss = pg_loss
    if entropy is not None:
        entropy_loss = agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode=mode, **actor.global_batch_info)
        loss = loss - actor.entropy_coeff * entropy_loss
        metrics["sum:actor/entropy_loss"] = entropy_loss.item()
    if actor.use_kl_loss:
        kld = kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=actor.kl_loss_type)
        kl_loss = agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=mode, **actor.global_batch_info)
        loss = loss + kl_loss * actor.kl_loss_coef
        metrics["sum:actor/kl_loss"] = kl_loss.item()
        metrics["mean:actor/kl_coef"] = float(actor.kl_loss_coef)
    return loss, metrics


def update_actor(
    model: Any, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor], *, actor: Any,
    mini_batch: int, micro_batch: int, grad_clip: float, temperature: float,
) -> dict[str, float]:
    """``ppo_epochs`` passes over ``batch`` in mini-batches of ``mini_batch`` responses, one optimizer
    step each, accumulated over micro-batches of ``micro_batch``; returns verl's ``actor/*`` metrics.

    batch: input_ids, attention_mask (B, P+R); response_mask, old_log_probs, advantages and, with
    ``use_kl_loss``, ref_log_prob (B, R).
    """
    model.train()
    response_length = batch["response_mask"].shape[1]
    with_entropy = actor.entropy_coeff != 0
    history: dict[str, list[float]] = defaultdict(list)
    for _ in range(actor.ppo_epochs):
        for mini in _chunks(len(batch["input_ids"]), mini_batch):
            optimizer.zero_grad(set_to_none=True)
            mini_mask = batch["response_mask"][mini]
            tokens, sequences = int(mini_mask.sum()), int((mini_mask.sum(-1) > 0).sum())
            step: dict[str, list[float]] = defaultdict(list)
            for micro in _chunks(len(mini_mask), micro_batch):
                rows = _offset(mini, micro)
                log_prob, entropy = response_log_probs(
                    model, batch["input_ids"][rows], batch["attention_mask"][rows], response_length,
                    temperature, with_entropy=with_entropy)
                loss, metrics = actor_loss(
                    actor, log_prob=log_prob, old_log_prob=batch["old_log_probs"][rows],
                    advantages=batch["advantages"][rows], response_mask=batch["response_mask"][rows],
                    ref_log_prob=batch["ref_log_prob"][rows] if actor.use_kl_loss else None,
                    entropy=entropy, batch_num_tokens=max(tokens, 1), global_batch_size=max(sequences, 1))
                loss.backward()
                for key, value in metrics.items():
                    step[key].append(value)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=grad_clip)
            if math.isfinite(grad_norm.item()):
                optimizer.step()
            else:  # as verl: a non-finite gradient skips the step instead of corrupting the weights
                optimizer.zero_grad(set_to_none=True)
            history["actor/grad_norm"].append(grad_norm.item())
            for key, values in step.items():
                how, name = key.split(":", 1)
                history[name].append(sum(values) if how == "sum" else sum(values) / len(values))
    return {name: sum(values) / len(values) for name, values in history.items()}


def _chunks(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def _offset(outer: slice, inner: slice) -> slice:
    return slice(outer.start + inner.start, outer.start + inner.stop)
