"""A warm-started tiny Qwen3: the smoke recipe's starting model, one that GRPO can make better.

    python -c "from verlflow.models.tinymodel_sft import build_warm_started_model as b; print(b('/tmp/tiny-sft'))"

A randomly initialised model earns no reward, so GRPO has no signal and every curve stays at zero. This
builder starts from :func:`verlflow.models.tinymodel.build_tiny_model` and runs a short supervised pass over
seeded one-step GSM8K-style problems (:mod:`verlflow.data.synthetic`, ``easy``), in exactly the chat format the
trainer and ``evaluate`` prompt with, learning the worked answer and its ``#### <number>`` line.

The teacher is sloppy on purpose, and says so: in :data:`SLOPPY_FRACTION` of its answers the worked
calculation is right but the final line reads ``The answer is N.`` instead of ``#### N``. The model learns
both habits, so it often computes the right number and then writes it in a form verl's strict GSM8K scorer
gives 0. GRPO thus has a clear, honest signal to learn from (write the computed number after ``####``), the
way a real model learns the answer format in its first GRPO steps. Nothing in the reward is shaped.

Deterministic for a seed (CPU, fixed example order); cached like the plain tiny model under the sentinel
:data:`SFT_SENTINEL` by :func:`verlflow.models.model_path.resolve_model_path`.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any

from verlflow.models.tinymodel import IM_END, build_tiny_model, make_tokenizer_config_portable

# Share of warm-start answers that end "The answer is N." instead of "#### N" (the habit GRPO unlearns).
SLOPPY_FRACTION = 0.5
# Sized so that the warm start takes well under a minute on 2 CPU cores.
SFT_SIZE: dict[str, Any] = {"hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24}
SFT_STEPS = 300
SFT_BATCH = 32
SFT_LR = 3e-3
SFT_EXAMPLES = 4096


def sloppy_answer(answer: str) -> str:
    """``answer`` with its ``#### N`` line written as ``The answer is N.`` (the worked steps unchanged)."""
    body, _, final = answer.rpartition("####")
    return f"{body}The answer is {final.strip()}."


def warm_start_examples(n: int, seed: int, sloppy_fraction: float = SLOPPY_FRACTION) -> list[tuple[str, str]]:
    """``n`` (user message, assistant answer) pairs from the easy train split, a seeded share made sloppy."""
    from verlflow.data.gsm8k import PROMPT_SUFFIX
    from verlflow.data.synthetic import synthetic_examples

    rng = random.Random(f"verlflow-warm-start:{seed}")
    pairs = []
    for example in synthetic_examples(n, seed=seed, split="train", easy=True):
        answer = sloppy_answer(example["answer"]) if rng.random() < sloppy_fraction else example["answer"]
        pairs.append((f"{example['question']} {PROMPT_SUFFIX}", answer))
    return pairs


def build_warm_started_model(
    output_dir: str | os.PathLike[str],
    *,
    seed: int = 0,
    steps: int = SFT_STEPS,
    batch_size: int = SFT_BATCH,
    lr: float = SFT_LR,
    sloppy_fraction: float = SLOPPY_FRACTION,
    **size: Any,
) -> Path:
    """Build the tiny model into ``output_dir``, warm-start it (see the module docstring), save it there.

    ``steps`` × ``batch_size`` examples of supervised next-token loss on the answer tokens only, AdamW with
    a cosine decay; ``size`` overrides :data:`SFT_SIZE`. Returns the folder (an ordinary HF model folder).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build_tiny_model(output_dir, seed=seed, **{**SFT_SIZE, **size})
    tokenizer = AutoTokenizer.from_pretrained(out)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        pairs = warm_start_examples(max(SFT_EXAMPLES, batch_size), seed, sloppy_fraction)
        encoded = [_encode(tokenizer, question, answer) for question, answer in pairs]
        _train(model, encoded, steps=steps, batch_size=batch_size, lr=lr, pad_id=tokenizer.pad_token_id, seed=seed)
    model.save_pretrained(out)
    make_tokenizer_config_portable(out)
    return out


def _encode(tokenizer: Any, question: str, answer: str) -> tuple[list[int], int]:
    """Token ids of prompt + answer + ``<|im_end|>``, and where the answer starts (loss is on the answer)."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                           tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer + IM_END, add_special_tokens=False)["input_ids"]
    return prompt_ids + answer_ids, len(prompt_ids)


def _train(model: Any, encoded: list[tuple[list[int], int]], *, steps: int, batch_size: int, lr: float,
           pad_id: int, seed: int) -> None:
    import torch

    from verlflow.progress import progress_bar

    if steps <= 0:
        return
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    order = random.Random(seed)
    model.train()
    bar = progress_bar(steps, "warm start", "step")
    for _ in range(steps):
        batch = order.sample(encoded, batch_size)
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((batch_size, width), pad_id, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (ids, start) in enumerate(batch):  # right padding: positions stay 0..len-1
            input_ids[row, :len(ids)] = torch.tensor(ids)
            labels[row, start:len(ids)] = torch.tensor(ids[start:])
            mask[row, :len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        bar.update(1)
    bar.close()
    model.eval()
