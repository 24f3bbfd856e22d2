"""Rollouts for the local GRPO trainer: chat-formatted prompts → sampled responses → GSM8K rewards.

    python -c "from verlflow.backends.local.rollout import default_reward_fn; \
print(default_reward_fn()('openai/gsm8k', 'so #### 72', '72'))"

Prompts are the rows' chat messages rendered with the tokenizer's chat template (as verl's
RLHFDataset does), filtered or truncated at ``data.max_prompt_length`` as ``data.filter_overlong_prompts``
and ``data.truncation`` say. Each prompt is sampled ``rollout.n`` times with ``model.generate``; a
response ends at the first eos token (inclusive, verl's ``get_response_mask``). Rewards come from
verl's reward-score registry (``openai/gsm8k`` → ``verl.utils.reward_score.gsm8k.compute_score``)
or from ``reward.custom_reward_function`` when the config names one, as in verl.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from verlflow.errors import VerlflowError
from verlflow.util import first_line

RewardFn = Callable[..., Any]


@dataclass
class PromptSet:
    """One split's prompts, tokenized (unpadded), with what the reward function needs per row."""

    input_ids: list[list[int]]
    texts: list[str]
    data_sources: list[str]
    ground_truths: list[str]
    extra_infos: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.input_ids)

    def take(self, rows: Sequence[int]) -> PromptSet:
        """The prompts at ``rows``, in that order."""
        return PromptSet(*([field[i] for i in rows] for field in
                           (self.input_ids, self.texts, self.data_sources, self.ground_truths, self.extra_infos)))


@dataclass
class Rollout:
    """``B = prompts x n`` sampled responses; prompt ``i``'s samples sit in rows ``i*n … i*n+n-1``."""

    prompts: torch.Tensor  # (B, P) left-padded prompt ids
    prompt_mask: torch.Tensor  # (B, P) 1 on prompt tokens
    responses: torch.Tensor  # (B, R) right-padded response ids, R <= max_response_length
    response_mask: torch.Tensor  # (B, R) 1 up to and including the first eos
    index: np.ndarray  # (B,) group id (the prompt's position in the batch) for GRPO
    prompt_texts: list[str]
    response_texts: list[str]
    scores: torch.Tensor | None = None  # (B,) scalar reward per response

    @property
    def input_ids(self) -> torch.Tensor:
        """(B, P+R) prompt and response ids, the sequence the policy scores."""
        return torch.cat([self.prompts, self.responses], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, P+R) 1 on real prompt and response tokens."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def token_level_scores(self) -> torch.Tensor:
        """(B, R) the reward on each response's last token, zero elsewhere (verl's reward manager)."""
        scores = torch.zeros(self.responses.shape, dtype=torch.float32, device=self.responses.device)
        last = (self.response_mask.sum(-1) - 1).clamp(min=0)
        scores[torch.arange(len(scores)), last] = self.scores.to(scores.device, torch.float32)
        return scores


def encode_prompts(
    frame: pd.DataFrame, tokenizer: Any, *, prompt_key: str, reward_fn_key: str, max_prompt_length: int,
    filter_overlong: bool, truncation: str, chat_template_kwargs: dict[str, Any], split: str,
) -> PromptSet:
    """Render and tokenize a split's prompts the way verl's RLHFDataset does.

    A prompt with more characters than ``max_prompt_length`` tokens can hold (:func:`longest_token_chars`) is
    overlong without being tokenized: a megabyte prompt is filtered, or cut from a bounded window of its text,
    in no time. The rows filtered are named in one line."""
    for column in (prompt_key, reward_fn_key, "reward_model"):
        if column not in frame.columns:
            raise VerlflowError(f"{split} data has no '{column}' column (it has {list(frame.columns)})")
    prompts = PromptSet([], [], [], [], [])
    window = max_prompt_length * longest_token_chars(tokenizer)
    too_long: list[int] = []
    for number, row in enumerate(frame.to_dict("records")):
        messages = [dict(m) for m in row[prompt_key]]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             **chat_template_kwargs)
        ids = _encode(tokenizer, text, window, truncation)
        if len(ids) > max_prompt_length:
            too_long.append(number)
            if filter_overlong:
                continue
            ids = _truncate(ids, max_prompt_length, truncation, split)
        prompts.input_ids.append(ids)
        prompts.texts.append(text)
        prompts.data_sources.append(str(row[reward_fn_key]))
        prompts.ground_truths.append(str(row["reward_model"]["ground_truth"]))
        prompts.extra_infos.append(dict(row.get("extra_info") or {}))
    if too_long and filter_overlong and not prompts.input_ids:
        raise VerlflowError(
            f"every {split} prompt is longer than data.max_prompt_length={max_prompt_length} tokens: raise it"
        )
    if too_long and filter_overlong:
        rows = ", ".join(map(str, too_long[:5])) + (f" and {len(too_long) - 5} more" if len(too_long) > 5 else "")
        print(f"verlflow: warning: data.filter_overlong_prompts: {len(too_long)} {split} prompt(s) longer than "
              f"data.max_prompt_length={max_prompt_length} tokens left out (row {rows})")
    return prompts


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for (its longest vocabulary entry, at least 1):
    a text of more than ``n`` times that many characters has more than ``n`` tokens."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1) or 1


def _encode(tokenizer: Any, text: str, window: int, truncation: str) -> list[int]:
    """``text``'s token ids; a text longer than ``window`` characters is tokenized only where truncation keeps
    it (its start, its end, or both), which still leaves more ids than the limit, so it reads as overlong."""
    if len(text) <= window:
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    head = tokenizer(text[:window], add_special_tokens=False)["input_ids"]
    tail = tokenizer(text[-window:], add_special_tokens=False)["input_ids"]
    if truncation == "left":
        return tail
    if truncation == "middle":
        return head + tail
    return head


def _truncate(ids: list[int], limit: int, mode: str, split: str) -> list[int]:
    if mode == "left":
        return ids[-limit:]
    if mode == "right":
        return ids[:limit]
    if mode == "middle":
        head = limit // 2
        return ids[:head] + ids[len(ids) - (limit - head):]
    raise VerlflowError(
        f"a {split} prompt has {len(ids)} tokens > data.max_prompt_length={limit} and data.truncation={mode}: "
        "raise max_prompt_length, set data.filter_overlong_prompts=true, or data.truncation=left|right|middle"
    )


def left_pad(sequences: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (B, longest), padded on the left as decoder-only generation needs."""
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, longest - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[row, longest - len(seq):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def generate(
    model: Any, tokenizer: Any, prompts: PromptSet, *, n: int, sampling: dict[str, Any],
    max_new_tokens: int, device: torch.device,
) -> Rollout:
    """Sample ``n`` responses per prompt (repeated interleaved, as verl repeats a batch).

    Each distinct prompt is prefilled once and its ``n`` samples decode from its KV cache
    (:mod:`.sampling`); sampling keys that loop does not know fall back to ``model.generate``.
    """
    from verl.utils.torch_functional import get_response_mask

    from verlflow.backends.local.sampling import SUPPORTED_KEYS, sample_responses

    eos_ids, pad_id = stop_tokens(tokenizer, model)
    distinct_ids, distinct_mask = left_pad(prompts.input_ids, pad_id, device)
    prompt_ids, prompt_mask = distinct_ids.repeat_interleave(n, dim=0), distinct_mask.repeat_interleave(n, dim=0)
    was_training = model.training
    model.eval()
    if set(sampling) <= SUPPORTED_KEYS:
        responses = sample_responses(model, distinct_ids, distinct_mask, n=n, max_new_tokens=max_new_tokens,
                                     eos_ids=eos_ids, pad_id=pad_id, sampling=sampling)
    else:
        from transformers import GenerationConfig

        config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id,
                                  use_cache=True, **sampling)
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config)
        responses = out[:, prompt_ids.shape[1]:]
    model.train(was_training)
    response_mask = get_response_mask(responses, eos_token=eos_ids, dtype=torch.long)
    responses = responses.masked_fill(response_mask == 0, pad_id)
    texts = tokenizer.batch_decode([r[m.bool()] for r, m in zip(responses, response_mask, strict=True)],
                                   skip_special_tokens=True)
    return Rollout(
        prompts=prompt_ids,
        prompt_mask=prompt_mask,
        responses=responses,
        response_mask=response_mask,
        index=np.repeat(np.arange(len(prompts)), n),
        prompt_texts=[t for t in prompts.texts for _ in range(n)],
        response_texts=texts,
    )


def stop_tokens(tokenizer: Any, model: Any) -> tuple[list[int], int]:
    """(eos ids, pad id): the tokenizer's eos plus the model's generation eos ids; pad falls back to eos."""
    eos: list[int] = []
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        for token in source if isinstance(source, (list, tuple)) else [source]:
            if token is not None and token not in eos:
                eos.append(int(token))
    if not eos:
        raise VerlflowError("the tokenizer defines no eos token: the trainer cannot tell where a response ends")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    return eos, int(pad)


def score(rollout: Rollout, prompts: PromptSet, n: int, reward_fn: RewardFn) -> torch.Tensor:
    """(B,) rewards of a rollout's responses; a reward function may return a number or {'score': …}."""
    values = []
    for row, text in enumerate(rollout.response_texts):
        source = prompts.data_sources[row // n]
        try:
            result = reward_fn(data_source=source, solution_str=text,
                               ground_truth=prompts.ground_truths[row // n],
                               extra_info=prompts.extra_infos[row // n])
        except NotImplementedError:
            raise VerlflowError(
                f"verl has no reward function for data_source '{source}': use openai/gsm8k rows or set "
                "reward.custom_reward_function.path"
            ) from None
        values.append(float(result["score"] if isinstance(result, dict) else result))
    return torch.tensor(values, dtype=torch.float32)


def default_reward_fn() -> RewardFn:
    """verl's reward-score registry: picks the scorer by data_source (openai/gsm8k → GSM8K strict)."""
    from verl.utils.reward_score import default_compute_score

    def reward(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> Any:
        return default_compute_score(data_source, solution_str, ground_truth, extra_info)

    return reward


def reward_fn_from_config(resolved: Any) -> RewardFn:
    """``reward.custom_reward_function`` (or verl's legacy top-level key) when set, else verl's registry."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    legacy = resolved.get("custom_reward_function") or {}
    config = resolved
    if legacy.get("path") and not OmegaConf.select(resolved, "reward.custom_reward_function.path"):
        config = OmegaConf.create({"reward": {"custom_reward_function": OmegaConf.to_container(legacy)}})
        config.reward.custom_reward_function.name = legacy.get("name") or "compute_score"
    try:
        custom = get_custom_reward_fn(config)
    except (FileNotFoundError, AttributeError, RuntimeError) as exc:
        raise VerlflowError(f"cannot load reward.custom_reward_function: {first_line(exc)}") from None
    return custom or default_reward_fn()
