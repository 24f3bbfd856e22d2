"""Shared-prompt forward passes: each distinct prompt runs once, its ``n`` responses reuse its keys/values.

    pytest tests/test_local_forward.py

GRPO samples ``n`` responses per prompt, so a plain forward over ``B = prompts x n`` rows of
``prompt + response`` computes every prompt ``n`` times (on GSM8K the prompt is longer than the
response). Here the ``B / n`` distinct prompts run once with the KV cache on (only the last prompt
position goes through the LM head), the cache is repeated ``n`` times along the batch, and the
responses run against it. The logits are the same as the full forward's, up to float rounding, and
gradients flow through the cached keys/values into the prompt pass, so the update is exact too.
"""

from __future__ import annotations

from typing import Any

import torch


def can_share_prompts(model: Any) -> bool:
    """Whether ``model`` can run a response against a cached prompt with gradients (no activation
    checkpointing, which turns the cache off in training, and a cache that can repeat its rows)."""
    return not getattr(model, "is_gradient_checkpointing", False)


def rows_share_prompts(prompts: torch.Tensor, group: int) -> bool:
    """Whether rows ``i*group … i*group+group-1`` of ``prompts`` (b, P) hold one identical prompt each."""
    rows = len(prompts)
    if group <= 1 or rows % group:
        return False
    grouped = prompts.view(rows // group, group, -1)
    return bool(torch.equal(grouped, grouped[:, :1].expand_as(grouped)))


def prefill(model: Any, prompts: torch.Tensor, prompt_mask: torch.Tensor, group: int) -> tuple[torch.Tensor, Any]:
    """Run the distinct prompts once; return the next-token logits and the KV cache, both repeated ``group`` times.

    prompts, prompt_mask: (U, P) left-padded → logits (U*group, V) of the last prompt position, and the cache
    of U*group rows. Gradients flow through both when grad is enabled.
    """
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompts, attention_mask=prompt_mask, position_ids=positions, use_cache=True,
                logits_to_keep=1)
    cache = out.past_key_values
    if group > 1:
        cache.batch_repeat_interleave(group)
    return out.logits[:, -1, :].repeat_interleave(group, dim=0), cache


def response_logits(
    model: Any, prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
    response_mask: torch.Tensor, group: int,
) -> torch.Tensor:
    """(b, R, V) logits predicting each response token, computing each distinct prompt once.

    prompts, prompt_mask: (b, P) left-padded, rows grouped by ``group`` (see :func:`rows_share_prompts`);
    responses, response_mask: (b, R) right-padded. Row r's logit at t predicts ``responses[r, t]``.
    """
    first, cache = prefill(model, prompts[::group], prompt_mask[::group], group)
    starts = prompt_mask.sum(-1, keepdim=True)  # (b, 1) real prompt tokens: the first response position
    positions = starts + torch.arange(responses.shape[1], device=responses.device)
    mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
    rest = model(input_ids=responses[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1],
                 past_key_values=cache, use_cache=True).logits
    return torch.cat([first[:, None, :], rest], dim=1)
