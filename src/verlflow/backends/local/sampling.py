"""Batched sampling with a KV cache for the local trainer: each prompt prefilled once for its ``n`` samples.

    pytest tests/test_local_forward.py

One token per forward for the whole batch, keys/values cached (nothing recomputed), the ``n``
samples of a prompt sharing its prefill (:func:`local_forward.prefill`), and the loop stopping as
soon as every row has produced an eos token. The sampling rules are ``model.generate``'s for the keys
verl's rollout config maps to (temperature, then top-k, then top-p; greedy when ``do_sample`` is off).
"""

from __future__ import annotations

from typing import Any

import torch

from verlflow.backends.local.forward import prefill

# Sampling keys this loop implements; any other key makes the rollout fall back to ``model.generate``.
SUPPORTED_KEYS = frozenset({"do_sample", "temperature", "top_p", "top_k"})


def next_tokens(logits: torch.Tensor, sampling: dict[str, Any]) -> torch.Tensor:
    """(b,) next token ids from (b, V) logits: greedy, or temperature → top-k → top-p → multinomial."""
    if not sampling.get("do_sample", True):
        return logits.argmax(-1)
    scores = logits.float() / float(sampling.get("temperature", 1.0))
    top_k = int(sampling.get("top_k") or 0)
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    top_p = float(sampling.get("top_p", 1.0))
    if top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        cumulative = ordered.softmax(-1).cumsum(-1)
        # Drop a token when the ones ranked above it already reach top_p (the first is always kept).
        drop = (cumulative - ordered.softmax(-1)) >= top_p
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(scores.softmax(-1), 1).squeeze(-1)


@torch.no_grad()
def sample_responses(
    model: Any, prompts: torch.Tensor, prompt_mask: torch.Tensor, *, n: int, max_new_tokens: int,
    eos_ids: list[int], pad_id: int, sampling: dict[str, Any],
) -> torch.Tensor:
    """(U*n, R) sampled response ids, R <= max_new_tokens, each row padded with ``pad_id`` after its first eos.

    prompts, prompt_mask: (U, P) left-padded distinct prompts; row ``i*n + j`` is prompt i's j-th sample.
    """
    logits, cache = prefill(model, prompts, prompt_mask, n)
    rows = len(logits)
    mask = prompt_mask.repeat_interleave(n, dim=0)
    position = mask.sum(-1, keepdim=True)  # (U*n, 1) where the first response token sits
    eos = torch.tensor(eos_ids, device=prompts.device)
    finished = torch.zeros(rows, dtype=torch.bool, device=prompts.device)
    ones = torch.ones((rows, 1), dtype=mask.dtype, device=mask.device)
    out: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        token = next_tokens(logits, sampling).masked_fill(finished, pad_id)
        out.append(token)
        finished |= torch.isin(token, eos)
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        mask = torch.cat([mask, ones], dim=1)
        logits = model(input_ids=token[:, None], attention_mask=mask, position_ids=position + step,
                       past_key_values=cache, use_cache=True).logits[:, -1, :]
    return torch.stack(out, dim=1)
