"""Batched sampling with a KV cache for the local trainer: each prompt prefilled once for its ``n`` samples.

    pytest tests/test_local_forward.py

One token per forward for the whole batch, keys/values cached (nothing recomputed), the ``n``
samples of a prompt sharing its prefill, and the loop stopping as soon as every row has produced an
eos token. Llama-family models decode through :mod:`decode` (a preallocated cache, a few ops per
layer); others through the Hugging Face forward and its cache (:func:`forward.prefill`). The
sampling rules are ``model.generate``'s for the keys verl's rollout config maps to (temperature,
then top-k, then top-p; greedy when ``do_sample`` is off).
"""

from __future__ import annotations

from typing import Any

import torch

from verlflow import stopping
from verlflow.backends.local import decode
from verlflow.backends.local.forward import prefill

# Sampling keys this loop implements; any other key makes the rollout fall back to ``model.generate``.
SUPPORTED_KEYS = frozenset({"do_sample", "temperature", "top_p", "top_k"})


def next_tokens(logits: torch.Tensor, sampling: dict[str, Any]) -> torch.Tensor:
    """(b,) next token ids from (b, V) logits: greedy, or temperature → top-k → top-p → a categorical draw."""
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
    return draw(scores.softmax(-1))


def draw(probs: torch.Tensor) -> torch.Tensor:
    """(b,) one token per row of (b, V) probabilities, by inverting each row's cumulative distribution.

    A draw from the distribution ``torch.multinomial(probs, 1)`` draws from, for one uniform number per
    row instead of multinomial's V exponential ones (which cost more than a small model's decoding step).
    A token of probability 0 is never drawn.
    """
    cumulative = probs.cumsum(-1)
    uniform = torch.rand((len(probs), 1), dtype=cumulative.dtype, device=probs.device) * cumulative[:, -1:]
    token = torch.searchsorted(cumulative, uniform, right=True).squeeze(-1)
    # Rounding can put `uniform` on the total itself: take the last token that has probability.
    last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).to(torch.uint8).argmax(-1)
    return torch.minimum(token, last)


@torch.no_grad()
def sample_responses(
    model: Any, prompts: torch.Tensor, prompt_mask: torch.Tensor, *, n: int, max_new_tokens: int,
    eos_ids: list[int], pad_id: int, sampling: dict[str, Any],
) -> torch.Tensor:
    """(U*n, R) sampled response ids, R <= max_new_tokens, each row padded with ``pad_id`` after its first eos.

    prompts, prompt_mask: (U, P) left-padded distinct prompts; row ``i*n + j`` is prompt i's j-th sample.
    """
    decoder = decode.StaticCacheDecoder(model) if decode.supports(model) else HuggingFaceDecoder(model)
    logits = decoder.prefill(prompts, prompt_mask, n, max_new_tokens)
    rows = len(logits)
    eos = torch.tensor(eos_ids, device=prompts.device)
    finished = torch.zeros(rows, dtype=torch.bool, device=prompts.device)
    out: list[torch.Tensor] = []
    for index in range(max_new_tokens):
        stopping.stop_point()  # per token: a long rollout ends at a stop, its step abandoned (the run ends KILLED)
        token = next_tokens(logits, sampling).masked_fill(finished, pad_id)
        out.append(token)
        finished |= torch.isin(token, eos)
        if index == max_new_tokens - 1 or bool(finished.all()):
            break
        logits = decoder.step(token)
    return torch.stack(out, dim=1)


class HuggingFaceDecoder:
    """:class:`decode.StaticCacheDecoder`'s interface over the model's own forward and cache (any architecture)."""

    def __init__(self, model: Any):
        self.model = model

    def prefill(self, prompts: torch.Tensor, prompt_mask: torch.Tensor, n: int, max_new_tokens: int) -> torch.Tensor:
        """Run the (U, P) left-padded prompts once; (U*n, V) logits of the next token."""
        logits, self.cache = prefill(self.model, prompts, prompt_mask, n)
        self.mask = prompt_mask.repeat_interleave(n, dim=0)
        self.position = self.mask.sum(-1, keepdim=True)  # (U*n, 1) where the first response token sits
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append (rows,) tokens; (rows, V) logits of the token after."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(tokens), 1))], dim=1)
        logits = self.model(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=self.position,
                            past_key_values=self.cache, use_cache=True).logits[:, -1, :]
        self.position = self.position + 1
        return logits
