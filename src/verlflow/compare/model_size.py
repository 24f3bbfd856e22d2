"""How many parameters a run's model has, and how many a token uses: the N of compare's FLOPs and bytes arithmetic.

An MoE model routes each token through a few of its experts: Qwen3-30B-A3B holds ~30.5 B parameters but a token
passes through ~3.3 B, so sizing its MFU by the total overstates it ~9×. The model's ``config.json`` says which:
``num_experts`` (``num_local_experts`` in Mixtral, ``n_routed_experts`` in DeepSeek) and ``num_experts_per_tok``.
Counted as model cards count them (embeddings included), from the standard decoder layout: attention (q, k, v, o
projections), a gated MLP (three matrices) or routed experts plus a router and any shared experts, the input
embedding and, unless tied, the output head. Norms and biases are left out (well under 0.1 %).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verlflow.compare.snapshot import RunSnapshot
from verlflow.names import MODEL_PARAMS_TAG

MODEL_PATH_PARAM = "actor_rollout_ref/model/path"
# "Qwen3-4B" → 4; "Qwen3-30B-A3B" → 30 total, A3 → 3 active
_SIZE_IN_NAME = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*[Bb](?![A-Za-z0-9])")
_MOE_IN_NAME = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)[Bb]-A(\d+(?:\.\d+)?)[Bb](?![A-Za-z0-9])")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass(frozen=True)
class ModelSize:
    """Total parameters, the parameters one token passes through, and where the figures came from."""

    total: float | None
    active: float | None
    source: str

    @property
    def is_moe(self) -> bool:
        """Whether a token uses fewer parameters than the model holds (a mixture of experts)."""
        return self.total is not None and self.active is not None and self.active < self.total


def counts_from_config(cfg: dict[str, Any]) -> tuple[float, float]:
    """(total, active) parameters of a decoder-only model from its Hugging Face ``config.json`` fields."""
    h, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or h // heads)
    attention = h * head_dim * (2 * heads + 2 * kv_heads)
    dense_mlp = 3 * h * int(cfg.get("intermediate_size") or 0)
    experts = next((int(cfg[k]) for k in _EXPERT_KEYS if cfg.get(k)), 0)
    moe_layers = _moe_layer_count(cfg, layers) if experts else 0
    per_expert = 3 * h * int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    shared = 3 * h * int(cfg.get("shared_expert_intermediate_size") or 0)
    shared += int(cfg.get("n_shared_experts") or 0) * per_expert
    routed_k = int(cfg.get("num_experts_per_tok") or 0)
    router = h * experts
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    dense_layers = layers - moe_layers
    total = layers * attention + dense_layers * dense_mlp + moe_layers * (experts * per_expert + shared + router)
    active = layers * attention + dense_layers * dense_mlp + moe_layers * (routed_k * per_expert + shared + router)
    return float(total + embeddings), float(active + embeddings)


def _moe_layer_count(cfg: dict[str, Any], layers: int) -> int:
    """Layers whose MLP is routed experts (Qwen's ``mlp_only_layers`` / ``decoder_sparse_step``, DeepSeek's
    ``first_k_dense_replace``)."""
    dense = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step") or 1)
    first_dense = int(cfg.get("first_k_dense_replace") or 0)
    return sum(1 for i in range(layers) if i not in dense and i >= first_dense and (i + 1) % step == 0)


def config_json_of(path: str) -> Path | None:
    """The model's ``config.json`` readable here: in its folder, else in the local Hugging Face cache; else None."""
    if not path:
        return None
    local = Path(path).expanduser() / "config.json"
    if local.is_file():
        return local
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
    except Exception:  # noqa: BLE001 - not a repo id, no cache: the name is the fallback
        return None
    return Path(cached) if isinstance(cached, str) else None


def model_size(snap: RunSnapshot) -> ModelSize:
    """The run's model size: its ``config.json`` (expert counts), else the ``model.num_params`` tag, else its name."""
    path = snap.params.get(MODEL_PATH_PARAM, "")
    found = config_json_of(path)
    if found is not None:
        try:
            total, active = counts_from_config(json.loads(found.read_text(encoding="utf-8")))
            return ModelSize(total, active, f"the model's config.json ({found})")
        except (ValueError, KeyError, TypeError):
            pass  # not a decoder config we can count: the tag or the name below
    tagged = snap.tags.get(MODEL_PARAMS_TAG)
    if tagged:
        return ModelSize(float(tagged), float(tagged), f"tag {MODEL_PARAMS_TAG}")
    name = Path(path).name
    moe = _MOE_IN_NAME.search(name)
    if moe:
        return ModelSize(float(moe.group(1)) * 1e9, float(moe.group(2)) * 1e9,
                         f"the model's name ({name}: total-A<active>)")
    size = _SIZE_IN_NAME.search(name)
    if size:
        return ModelSize(float(size.group(1)) * 1e9, float(size.group(1)) * 1e9, f"the model's name ({name})")
    return ModelSize(None, None, "unknown (no config.json here, no tag model.num_params, no size in the model's name)")
