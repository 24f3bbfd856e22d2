"""A lean decoder for Llama-family models (Qwen3, Qwen2, Llama): preallocated KV cache, a few ops per layer.

    pytest tests/test_local_forward.py -k decoder

Sampling calls the model once per generated token. Through the Hugging Face forward each call pays
for mask building, a cache that grows by concatenation and a stack of module wrappers, which on a CPU
costs more than the arithmetic of a small model. This decoder runs the same layers on the model's own
weights, taken once per rollout (the weights do not change while sampling): query/key/value and
gate/up projections fused into one matrix product each, keys and values in a cache allocated once,
one SDPA call per layer (grouped-query heads folded into the query axis instead of copying keys), and
cos/sin from the model's rotary module, computed once for every position. Its logits are the Hugging
Face forward's up to float rounding (tested per architecture). It is for sampling only: log-probs for
the loss always come from the Hugging Face forward. Models it does not know use that forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# Architectures whose decoder layers are pre-norm attention + gated MLP with rotary positions.
LLAMA_FAMILY = frozenset({"llama", "qwen2", "qwen3"})
# Rotary scalings that change with the sequence length (a fixed table would not be theirs).
LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


def supports(model: Any) -> bool:
    """Whether :class:`StaticCacheDecoder` computes what ``model``'s own forward computes."""
    config = model.config
    base = getattr(model, "model", None)
    if config.model_type not in LLAMA_FAMILY or base is None or not hasattr(base, "rotary_emb"):
        return False
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        return False
    return getattr(base.rotary_emb, "rope_type", "default") not in LENGTH_DEPENDENT_ROPE


@dataclass
class _Layer:
    """One decoder layer's weights, projections fused; biases are None where the architecture has none."""

    input_norm: tuple[torch.Tensor, float]
    qkv: tuple[torch.Tensor, torch.Tensor | None]
    head_norms: tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]] | None  # Qwen3's per-head q/k norms
    out: tuple[torch.Tensor, torch.Tensor | None]
    post_norm: tuple[torch.Tensor, float]
    gate_up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]
    act: Any
    scale: float

    @classmethod
    def of(cls, layer: Any) -> _Layer:
        """The weights of a Hugging Face decoder layer (detached: sampling builds no graph)."""
        attention, mlp = layer.self_attn, layer.mlp
        head_norms = None
        if hasattr(attention, "q_norm"):
            head_norms = (_norm_of(attention.q_norm), _norm_of(attention.k_norm))
        return cls(input_norm=_norm_of(layer.input_layernorm),
                   qkv=_fused(attention.q_proj, attention.k_proj, attention.v_proj), head_norms=head_norms,
                   out=_fused(attention.o_proj), post_norm=_norm_of(layer.post_attention_layernorm),
                   gate_up=_fused(mlp.gate_proj, mlp.up_proj), down=_fused(mlp.down_proj), act=mlp.act_fn,
                   scale=attention.scaling)

    def mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        """The gated MLP on the post-attention-normed ``hidden``."""
        gate, up = F.linear(_rms(hidden, *self.post_norm), *self.gate_up).chunk(2, dim=-1)
        return F.linear(self.act(gate) * up, *self.down)


class StaticCacheDecoder:
    """Prefill distinct prompts once, then decode ``n`` samples of each, one token per :meth:`step`.

    Rows ``i*n … i*n+n-1`` are prompt ``i``'s samples. Call :meth:`prefill` once, then :meth:`step`
    at most ``max_new_tokens`` times; both return (rows, V) next-token logits.
    """

    def __init__(self, model: Any):
        self.model, self.base = model, model.model
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = self.base.layers[0].self_attn.head_dim
        with torch.no_grad():
            self.layers = [_Layer.of(layer) for layer in self.base.layers]
        self.final_norm = _norm_of(self.base.norm)

    @torch.no_grad()
    def prefill(self, prompts: torch.Tensor, prompt_mask: torch.Tensor, n: int, max_new_tokens: int) -> torch.Tensor:
        """Run the (U, P) left-padded prompts, fill the cache for U*n rows; (U*n, V) logits of the next token."""
        count, length = prompts.shape
        rows, capacity = count * n, length + max_new_tokens
        dtype, device = self.model.dtype, prompts.device
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in self.layers]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in self.layers]
        table = torch.arange(capacity, device=device)[None]  # positions never pass the cache's capacity
        cos, sin = self.base.rotary_emb(torch.zeros(1, dtype=dtype, device=device), table)
        self.cos, self.sin = cos[0], sin[0]  # (positions, head_dim)
        self.visible = torch.zeros((rows, capacity), dtype=torch.bool, device=device)
        self.visible[:, :length] = prompt_mask.bool().repeat_interleave(n, dim=0)
        self.length = length
        self.position = prompt_mask.sum(-1).repeat_interleave(n, dim=0)  # (rows,) first response position

        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (U, 1, P, head_dim)
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        # A pad query sees itself, so no row of the mask is empty (an empty row would give NaN).
        mask = (causal & prompt_mask.bool()[:, None, :]) | torch.eye(length, dtype=torch.bool, device=device)
        groups = self.heads // self.kv_heads
        hidden = self.base.embed_tokens(prompts)
        for index, layer in enumerate(self.layers):
            query, key, value = self._projections(layer, hidden, cos, sin)
            self.keys[index][:, :, :length] = key.repeat_interleave(n, dim=0)
            self.values[index][:, :, :length] = value.repeat_interleave(n, dim=0)
            out = F.scaled_dot_product_attention(
                query, key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1),
                attn_mask=mask[:, None], scale=layer.scale)
            hidden = hidden + F.linear(out.transpose(1, 2).reshape(count, length, -1), *layer.out)
            hidden = hidden + layer.mlp(hidden)
        return self._logits(hidden[:, -1]).repeat_interleave(n, dim=0)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append (rows,) tokens at the next position of each row; (rows, V) logits of the token after."""
        rows, at = len(tokens), self.length
        cos, sin = self.cos[self.position][:, None], self.sin[self.position][:, None]  # (rows, 1, head_dim)
        self.visible[:, at] = True
        mask = self.visible[:, None, None, :at + 1]
        hidden = self.base.embed_tokens(tokens)
        for index, layer in enumerate(self.layers):
            query, key, value = self._projections(layer, hidden, cos, sin)
            self.keys[index][:, :, at] = key
            self.values[index][:, :, at] = value
            # One query token per row: fold each kv head's query heads into the query axis (no key copies).
            out = F.scaled_dot_product_attention(
                query.reshape(rows, self.kv_heads, -1, self.head_dim), self.keys[index][:, :, :at + 1],
                self.values[index][:, :, :at + 1], attn_mask=mask, scale=layer.scale)
            hidden = hidden + F.linear(out.reshape(rows, -1), *layer.out)
            hidden = hidden + layer.mlp(hidden)
        self.length += 1
        self.position = self.position + 1
        return self._logits(hidden)

    def _projections(
        self, layer: _Layer, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query, key (both rotated) and value, heads first: (U, heads, P, head_dim) or (rows, heads, head_dim)."""
        leading = hidden.shape[:-1]
        fused = F.linear(_rms(hidden, *layer.input_norm), *layer.qkv)
        query, key, value = fused.split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
        query = query.view(*leading, self.heads, self.head_dim)
        key = key.view(*leading, self.kv_heads, self.head_dim)
        value = value.view(*leading, self.kv_heads, self.head_dim)
        if layer.head_norms is not None:
            query, key = _rms(query, *layer.head_norms[0]), _rms(key, *layer.head_norms[1])
        if hidden.dim() == 3:  # (U, P, …) → (U, heads, P, head_dim)
            query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        return _rotate(query, cos, sin), _rotate(key, cos, sin), value

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(_rms(hidden, *self.final_norm))


def _fused(*linears: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of ``linears`` stacked along their outputs: one matrix product computes them all."""
    weight = torch.cat([linear.weight for linear in linears]) if len(linears) > 1 else linears[0].weight
    biases = [linear.bias for linear in linears]
    if all(bias is None for bias in biases):
        return weight.detach(), None
    bias = torch.cat([b if b is not None else weight.new_zeros(linear.out_features)
                      for b, linear in zip(biases, linears, strict=True)])
    return weight.detach(), bias.detach()


def _norm_of(module: Any) -> tuple[torch.Tensor, float]:
    """(weight, eps) of a Llama-family RMSNorm module."""
    return module.weight.detach(), float(module.variance_epsilon)


def _rms(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the Hugging Face Llama family computes it: normalised in float32, scaled in the input dtype."""
    if hidden.dtype == torch.float32:
        return F.rms_norm(hidden, (hidden.shape[-1],), weight, eps)
    normed = F.rms_norm(hidden.float(), (hidden.shape[-1],), None, eps)
    return weight * normed.to(hidden.dtype)


def _rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, as the Hugging Face models apply it (halves rotated)."""
    half = states.shape[-1] // 2
    rotated = torch.cat((-states[..., half:], states[..., :half]), dim=-1)
    return states * cos + rotated * sin
