"""Input bounds before work: a huge prompt judged overlong by its characters before any tokenizer reads it, and a
rollout no memory could hold refused by arithmetic before a run opens.

One 10 MB prompt aborted the local trainer after 104 s at 1.7 GB inside the tokenizer, although the recipe said
``max_prompt_length: 128`` and ``filter_overlong_prompts: true``. A text with more characters than the limit's
tokens can hold is left out (or cut from a window of its text), and the rows left out are named in one line.
"""

from __future__ import annotations

import mlflow
import pandas as pd
import pytest
from conftest import cli_in_process

from verlflow.backends.local.rollout import encode_prompts, longest_token_chars

HUGE = "the same words again " * 500_000  # 10.5 MB


def _rows(*contents: str) -> pd.DataFrame:
    return pd.DataFrame([{"prompt": [{"role": "user", "content": text}], "data_source": "openai/gsm8k",
                          "reward_model": {"ground_truth": "4"}} for text in contents])


@pytest.fixture
def tokenizer(tiny_workdir):
    from transformers import AutoTokenizer

    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache"))


def _encode(tokenizer, frame: pd.DataFrame, *, filter_overlong: bool, truncation: str = "error"):
    return encode_prompts(frame, tokenizer, prompt_key="prompt", reward_fn_key="data_source", max_prompt_length=128,
                          filter_overlong=filter_overlong, truncation=truncation, chat_template_kwargs={},
                          split="train")


def test_a_huge_prompt_is_left_out_and_its_row_named(tokenizer, capsys):
    prompts = _encode(tokenizer, _rows("What is 2+2?", HUGE, "And 3+1?"), filter_overlong=True)
    assert len(prompts.input_ids) == 2 and all(len(ids) <= 128 for ids in prompts.input_ids)
    assert ("verlflow: warning: data.filter_overlong_prompts: 1 train prompt(s) longer than "
            "data.max_prompt_length=128 tokens left out (row 1)") in capsys.readouterr().out


@pytest.mark.parametrize("truncation", ["left", "right", "middle"])
def test_a_huge_prompt_is_cut_to_the_limit_as_truncation_says(tokenizer, truncation):
    (ids,) = _encode(tokenizer, _rows(HUGE), filter_overlong=False, truncation=truncation).input_ids
    assert len(ids) == 128
    whole_end = tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": HUGE[-2000:]}],
                                                        add_generation_prompt=True, tokenize=False),
                          add_special_tokens=False)["input_ids"]
    if truncation in ("left", "middle"):  # the prompt's end (the generation prompt) is kept
        assert ids[-20:] == whole_end[-20:]


def test_a_prompt_within_the_character_bound_is_still_judged_by_its_tokens(tokenizer):
    text = "a " * 300  # more than 128 tokens, fewer characters than 128 tokens can hold
    assert len(text) < 128 * longest_token_chars(tokenizer)
    prompts = _encode(tokenizer, _rows(text, "short"), filter_overlong=True)
    assert len(prompts.input_ids) == 1 and prompts.texts[0].count("short") == 1


def test_a_rollout_no_memory_could_hold_is_refused_before_a_run_opens(tracking_uri, tmp_path):
    done = cli_in_process(["train", "--recipe", "tiny", "--overrides",
                           "actor_rollout_ref.rollout.n=1000000 data.max_response_length=100000000"], cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "actor_rollout_ref.rollout.n=1000000: a step rolls out data.train_batch_size=" in done.stderr, done.stderr
    assert mlflow.search_runs(search_all_experiments=True, filter_string="tags.`verlflow.step` = 'train'").empty
