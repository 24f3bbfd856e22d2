"""The tiny Qwen3 builds offline, deterministically, and loads and generates like any HF model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verlflow.errors import VerlflowError
from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path
from verlflow.models.tinymodel import IM_END, build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "seed0", seed=0)


def test_tiny_model_loads_with_auto_classes_and_generates(tiny):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert 1e5 < sum(p.numel() for p in model.parameters()) < 5e6
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == "<|endoftext|>"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                           add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    # Special tokens are single ids, digits are split one by one (as in Qwen's tokenizer).
    assert tokenizer.convert_ids_to_tokens(inputs["input_ids"][0, :1]) == ["<|im_start|>"]
    assert tokenizer.tokenize("1234") == ["1", "2", "3", "4"]
    torch.manual_seed(0)
    out = model.generate(**inputs, max_new_tokens=8, do_sample=True)
    prompt_len = inputs["input_ids"].shape[1]
    assert out.shape[1] > prompt_len
    # The prompt comes back unchanged and every sampled id is a token the tokenizer can write out.
    assert tokenizer.decode(out[0, :prompt_len]) == prompt
    new = out[0, prompt_len:].tolist()
    assert all(0 <= token < len(tokenizer) for token in new), new


def test_same_seed_gives_identical_files_and_another_seed_other_weights(tiny, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()


def test_size_fields_follow_qwen3_config(tmp_path):
    path = build_tiny_model(tmp_path / "wide", corpus=["a b c 1 2 3 #### 4"] * 20, hidden_size=32,
                            num_hidden_layers=1, vocab_size=300)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    with pytest.raises(VerlflowError, match="hidden_sise"):
        build_tiny_model(tmp_path / "bad", hidden_sise=32)


def test_sentinel_is_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERLFLOW_CACHE", str(tmp_path / "cache"))
    first = resolve_model_path(TINY_SENTINEL)
    assert Path(first).parent == tmp_path / "cache" and (Path(first) / "model.safetensors").is_file()
    stamp = (Path(first) / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(TINY_SENTINEL) == first
    assert (Path(first) / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [Path(first).name]  # no temp folder left


def test_model_paths_resolve_to_folders_hub_ids_or_one_clear_error(tiny, tmp_path):
    assert resolve_model_path(str(tiny)) == str(tiny)
    assert resolve_model_path("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    with pytest.raises(VerlflowError, match="does not exist") as missing:
        resolve_model_path(str(tmp_path / "no" / "such-model"))
    assert "\n" not in str(missing.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(VerlflowError, match="no config.json"):
        resolve_model_path(str(tmp_path / "empty"))
