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
    temperature: float, *, with_entropy: bool, group: int = 1, entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of the last ``response_length`` tokens, logits / temperature.

    input_ids, attention_mask: (b, P+R) left-padded prompt + right-padded response → (b, R) each.
    Rows are packed (:mod:`forward`): with ``group`` > 1 and rows that share their prompt in groups of
    ``group`` (GRPO's ``n`` samples), each distinct prompt is computed once; padding is never computed.
    Models whose attention takes no custom mask run the plain padded forward; the result is the same.
    ``entropy_grad=False``: the entropy is a metric only, computed without building its graph.
    """
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    from verlflow.backends.local.forward import can_pack, packed_response_logits, rows_share_prompts

    prompt_length = input_ids.shape[1] - response_length
    prompts, prompt_mask = input_ids[:, :prompt_length], attention_mask[:, :prompt_length]
    responses, response_mask = input_ids[:, prompt_length:], attention_mask[:, prompt_length:]
    if can_pack(model, prompt_mask, response_mask):
        shared = group if rows_share_prompts(prompts, group) and rows_share_prompts(prompt_mask, group) else 1
        logits = packed_response_logits(model, prompts, prompt_mask, responses, response_mask, shared)
    else:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).logits
        # The logit at position t predicts token t+1: (b, R, V) for the response tokens.
        logits = logits[:, -response_length - 1:-1, :]
    logits = logits.float() / temperature
    log_probs = logprobs_from_logits(logits, responses)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return log_probs, entropy


@torch.no_grad()
def batched_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
    temperature: float, micro_batch: int, *, with_entropy: bool = False, group: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_log_probs` over the whole batch in chunks of ``micro_batch`` rows, without grad."""
    was_training = model.training
    model.eval()
    parts = [response_log_probs(model, input_ids[s], attention_mask[s], response_length, temperature,
                                with_entropy=with_entropy, group=_group_of(s, group))
             for s in _chunks(len(input_ids), micro_batch)]
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
    mini_batch: int, micro_batch: int, grad_clip: float, temperature: float, group: int = 1,
) -> dict[str, float]:
    """``ppo_epochs`` passes over ``batch`` in mini-batches of ``mini_batch`` responses, one optimizer
    step each, accumulated over micro-batches of ``micro_batch``; returns verl's ``actor/*`` metrics.

    batch: input_ids, attention_mask (B, P+R); response_mask, advantages and, with ``use_kl_loss``,
    ref_log_prob (B, R); old_log_probs (B, R), or none when the update is exactly on-policy (see
    :func:`is_on_policy`): then the first forward of each micro-batch *is* the old policy, its log-probs
    are detached as the old ones (ratio 1, as verl and TRL do), and the returned metrics also hold
    ``actor/entropy`` (verl's old-log-prob entropy, from that same forward). ``group``: rows share their
    prompt in groups of this many (GRPO's ``n``), computed once per group.
    """
    from verl.trainer.ppo.core_algos import agg_loss

    model.train()
    response_length = batch["response_mask"].shape[1]
    on_policy = "old_log_probs" not in batch
    if on_policy and not (actor.ppo_epochs == 1 and mini_batch >= len(batch["input_ids"])):
        raise ValueError("update_actor without old_log_probs needs one epoch of one mini-batch (on-policy)")
    with_entropy = actor.entropy_coeff != 0 or on_policy
    history: dict[str, list[float]] = defaultdict(list)
    entropies: list[torch.Tensor] = []
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
                    temperature, with_entropy=with_entropy, group=_group_of(rows, group),
                    entropy_grad=actor.entropy_coeff != 0)
                old_log_prob = log_prob.detach() if on_policy else batch["old_log_probs"][rows]
                if on_policy:
                    entropies.append(entropy.detach())
                loss, metrics = actor_loss(
                    actor, log_prob=log_prob, old_log_prob=old_log_prob,
                    advantages=batch["advantages"][rows], response_mask=batch["response_mask"][rows],
                    ref_log_prob=batch["ref_log_prob"][rows] if actor.use_kl_loss else None,
                    entropy=entropy if actor.entropy_coeff != 0 else None, batch_num_tokens=max(tokens, 1),
                    global_batch_size=max(sequences, 1))
                loss.backward()
                for key, value in metrics.items():
                    step[key].append(value)
            _optimizer_step(model, optimizer, grad_clip, step, history)
    result = {name: sum(values) / len(values) for name, values in history.items()}
    if on_policy:
        result["actor/entropy"] = agg_loss(loss_mat=torch.cat(entropies), loss_mask=batch["response_mask"].bool(),
                                           loss_agg_mode=actor.loss_agg_mode).item()
    return result


def _optimizer_step(model: Any, optimizer: torch.optim.Optimizer, grad_clip: float,
                    step: dict[str, list[float]], history: dict[str, list[float]]) -> None:
    """One mini-batch's optimizer step after its gradient is clipped, and its metrics added to ``history``
    (``sum:``/``mean:`` keys folded over the micro-batches)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=grad_clip)
    if math.isfinite(grad_norm.item()):
        optimizer.step()
    else:  # as verl: a non-finite gradient skips the step instead of corrupting the weights
        optimizer.zero_grad(set_to_none=True)
    history["actor/grad_norm"].append(grad_norm.item())
    for key, values in step.items():
        how, name = key.split(":", 1)
        history[name].append(sum(values) if how == "sum" else sum(values) / len(values))


def is_on_policy(model: Any, *, ppo_epochs: int, mini_batch: int, batch_size: int) -> bool:
    """Whether the update's first forward sees exactly the policy that sampled: one epoch, one mini-batch
    (no optimizer step before any row is scored) and no dropout (train and eval mode compute the same)."""
    return ppo_epochs == 1 and mini_batch >= batch_size and not _has_dropout(model)


def _has_dropout(model: Any) -> bool:
    config = getattr(model, "config", None)
    rates = [getattr(config, name, 0.0) or 0.0 for name in ("attention_dropout", "hidden_dropout", "dropout")]
    return any(float(r) > 0 for r in rates) or any(
        isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def _group_of(rows: slice, group: int) -> int:
    """``group`` when the rows hold whole groups of samples of one prompt, else 1 (no sharing)."""
    return group if rows.start % group == 0 and (rows.stop - rows.start) % group == 0 else 1


def _chunks(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def _offset(outer: slice, inner: slice) -> slice:
    return slice(outer.start + inner.start, outer.start + inner.stop)
