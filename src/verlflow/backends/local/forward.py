"""Group-packed forward passes: each GRPO group runs as one sequence, its prompt once, no padding inside.

    pytest tests/test_local_forward.py

GRPO samples ``n`` responses per prompt, so a plain forward over ``B = prompts x n`` rows of
``prompt + response`` computes every prompt ``n`` times (on GSM8K the prompt is longer than the
response) and every pad token too. Here each group becomes one row, ``[prompt, response_1, …,
response_n]`` with no padding between them, and a block attention mask in which a response sees its
prompt and its own earlier tokens only, with positions restarting after the prompt for each response.
The logits are the plain forward's, up to float rounding, and it is still *one* forward of the
Hugging Face model, so gradients and gradient checkpointing work unchanged (verl packs sequences for
the same reason, ``use_remove_padding``).

:func:`prefill` is the sampler's fallback for models the static-cache decoder does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from verlflow.compat.transformers import attention_implementation

# Attention implementations that take a custom 4D mask (flash-attention kernels do not).
PACKABLE_ATTENTION = frozenset({"sdpa", "eager"})


@dataclass
class PackedGroups:
    """``G`` packed rows of length ``L`` and where each response token's predicting logit sits in them."""

    input_ids: torch.Tensor  # (G, L) prompt then each response, right-padded to the longest group
    position_ids: torch.Tensor  # (G, L) 0… along the prompt, then prompt_length… for each response
    segments: torch.Tensor  # (G, L) 0 prompt, j+1 response j, -1 padding
    gather: torch.Tensor  # (b, R) flat index into G*L of the position predicting response token t (0 if none)

    def attention_mask(self, implementation: str, dtype: torch.dtype) -> torch.Tensor:
        """(G, 1, L, L): a query sees earlier prompt tokens and earlier tokens of its own segment.

        Boolean for SDPA; additive (0 / dtype min) for eager attention, which adds the mask to the scores.
        """
        length = self.segments.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=self.segments.device).tril()
        query, key = self.segments[:, :, None], self.segments[:, None, :]
        allowed = (causal & ((key == 0) | (key == query)))[:, None]
        if implementation == "sdpa":
            return allowed
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min)


def can_pack(model: Any, prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> bool:
    """Whether the model takes a custom 4D mask and the masks are plain padding (prompts left-padded,
    responses right-padded, no holes), which is what packing assumes."""
    implementation = attention_implementation(model)
    return implementation in PACKABLE_ATTENTION and _is_padding(prompt_mask.flip(-1)) and _is_padding(response_mask)


def _is_padding(mask: torch.Tensor) -> bool:
    """Whether each row of ``mask`` is ones then zeros."""
    lengths = mask.sum(-1, keepdim=True)
    return bool(torch.equal(mask.bool(), torch.arange(mask.shape[-1], device=mask.device) < lengths))


def rows_share_prompts(prompts: torch.Tensor, group: int) -> bool:
    """Whether rows ``i*group … i*group+group-1`` of ``prompts`` (b, P) hold one identical prompt each."""
    rows = len(prompts)
    if group <= 1 or rows % group:
        return False
    grouped = prompts.view(rows // group, group, -1)
    return bool(torch.equal(grouped, grouped[:, :1].expand_as(grouped)))


def pack_groups(
    prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor, response_mask: torch.Tensor,
    group: int, pad_id: int = 0,
) -> PackedGroups:
    """Lay rows ``i*group … i*group+group-1`` (which share prompt i) out as packed row i.

    prompts, prompt_mask: (b, P) left-padded; responses, response_mask: (b, R) right-padded.
    """
    rows, response_length = responses.shape
    groups = rows // group
    device = responses.device
    prompt_lengths = prompt_mask[::group].sum(-1).tolist()
    response_lengths = response_mask.sum(-1).tolist()
    totals = [prompt_lengths[g] + sum(response_lengths[g * group:(g + 1) * group]) for g in range(groups)]
    length = max(totals)
    input_ids = torch.full((groups, length), pad_id, dtype=responses.dtype, device=device)
    positions = torch.zeros((groups, length), dtype=torch.long, device=device)
    segments = torch.full((groups, length), -1, dtype=torch.long, device=device)
    gather = torch.zeros((rows, response_length), dtype=torch.long, device=device)
    steps = torch.arange(max(length, response_length), device=device)
    for g in range(groups):
        prompt_length = prompt_lengths[g]
        input_ids[g, :prompt_length] = prompts[g * group, prompts.shape[1] - prompt_length:]
        positions[g, :prompt_length] = steps[:prompt_length]
        segments[g, :prompt_length] = 0
        start = prompt_length
        for j in range(group):
            row, size = g * group + j, response_lengths[g * group + j]
            input_ids[g, start:start + size] = responses[row, :size]
            positions[g, start:start + size] = prompt_length + steps[:size]
            segments[g, start:start + size] = j + 1
            if size:
                # token 0 is predicted by the prompt's last position, token t by the response's position t-1
                gather[row, 0] = g * length + prompt_length - 1
                gather[row, 1:size] = g * length + start + steps[:size - 1]
            start += size
    return PackedGroups(input_ids, positions, segments, gather)


def packed_response_logits(
    model: Any, prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
    response_mask: torch.Tensor, group: int,
) -> torch.Tensor:
    """(b, R, V) logits predicting each response token, from one forward over the packed groups.

    ``group`` = 1 packs each row alone (padding removed, nothing shared). Logits at positions past a
    response's end are those of an arbitrary real position: finite, and masked by the caller.
    """
    packed = pack_groups(prompts, prompt_mask, responses, response_mask, group)
    mask = packed.attention_mask(attention_implementation(model), model.dtype)
    logits = model(input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids,
                   use_cache=False).logits
    return logits.reshape(-1, logits.shape[-1])[packed.gather]


def prefill(model: Any, prompts: torch.Tensor, prompt_mask: torch.Tensor, group: int) -> tuple[torch.Tensor, Any]:
    """Run the distinct prompts once; return the next-token logits and the KV cache, both repeated ``group`` times.

    prompts, prompt_mask: (U, P) left-padded → logits (U*group, V) of the last prompt position, and the
    Hugging Face cache of U*group rows.
    """
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompts, attention_mask=prompt_mask, position_ids=positions, use_cache=True,
                logits_to_keep=1)
    cache = out.past_key_values
    if group > 1:
        cache.batch_repeat_interleave(group)
    return out.logits[:, -1, :].repeat_interleave(group, dim=0), cache
