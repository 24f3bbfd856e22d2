"""The warm-started tiny Qwen3 (the smoke recipe's model): built offline, deterministic, able to earn reward."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from verlflow.models import tinymodel_sft
from verlflow.models.model_path import SFT_SENTINEL, resolve_model_path


def test_a_sloppy_answer_keeps_the_work_and_drops_the_final_marker():
    answer = "He buys 4 * 3 = <<4*3=12>>12 cards.\n#### 12"
    assert tinymodel_sft.sloppy_answer(answer) == "He buys 4 * 3 = <<4*3=12>>12 cards.\nThe answer is 12."


def test_warm_start_examples_are_seeded_one_step_problems_with_a_sloppy_share():
    pairs = tinymodel_sft.warm_start_examples(400, seed=0)
    assert pairs == tinymodel_sft.warm_start_examples(400, seed=0)
    assert all(question.endswith('output the final answer after "####".') for question, _ in pairs)
    sloppy = sum("The answer is" in answer for _, answer in pairs) / len(pairs)
    assert 0.4 < sloppy < 0.6
    assert all(answer.count("<<") == 1 for _, answer in pairs)  # one arithmetic step each


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_a_short_build_is_a_loadable_model_folder_and_deterministic(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    first = tinymodel_sft.build_warm_started_model(tmp_path / "a", steps=3, batch_size=4)
    second = tinymodel_sft.build_warm_started_model(tmp_path / "b", steps=3, batch_size=4)
    assert _digest(first) == _digest(second)
    assert _digest(first) != _digest(tinymodel_sft.build_warm_started_model(tmp_path / "c", steps=0, batch_size=4))
    model = AutoModelForCausalLM.from_pretrained(first)
    tokenizer = AutoTokenizer.from_pretrained(first)
    assert model.config.hidden_size == tinymodel_sft.SFT_SIZE["hidden_size"]
    assert tokenizer.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_the_sentinel_builds_a_model_that_earns_reward_once_and_reuses_it(warm_model_cache):
    """The full warm start (about a minute on 2 cores): greedy answers score on easy held-out problems.

    The build is conftest's ``warm_model_cache``: the same sentinel resolved into a fresh cache, once per session.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.reward_score.gsm8k import compute_score

    from verlflow.data.gsm8k import PROMPT_SUFFIX
    from verlflow.data.synthetic import synthetic_examples

    folder = Path(resolve_model_path(SFT_SENTINEL, warm_model_cache))
    assert folder.name == f"{SFT_SENTINEL}-v1-seed0" and folder.parent == warm_model_cache
    built = _digest(folder)
    assert resolve_model_path(SFT_SENTINEL, warm_model_cache) == str(folder) and _digest(folder) == built

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    problems = synthetic_examples(64, seed=0, split="test", easy=True)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"{p['question']} {PROMPT_SUFFIX}"}],
                                           add_generation_prompt=True, tokenize=False) for p in problems]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    answers = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    truths = [p["answer"].rsplit("####", 1)[1].strip() for p in problems]
    scores = [compute_score(a, t) for a, t in zip(answers, truths, strict=True)]
    worked = sum(f"={t}>>" in a for a, t in zip(answers, truths, strict=True))
    # It earns some reward, and often works the right number out without writing it as '#### N'.
    assert 0 < sum(scores) < worked, (sum(scores), worked)
