"""A tiny Qwen3 and its tokenizer, built offline, for smoke runs and tests.

    python -c "from verlflow.models.tinymodel import build_tiny_model; print(build_tiny_model('/tmp/tiny-qwen3'))"

:func:`build_tiny_model` trains a byte-level BPE tokenizer (Qwen's pre-tokenizer regex, digits split
one by one) on GSM8K-style text with ``tokenizers`` and initialises a ``Qwen3ForCausalLM`` of a few
hundred thousand parameters from a seed. The folder it writes is an ordinary Hugging Face model folder
(``config.json``, ``model.safetensors``, ``tokenizer.json``, a ChatML chat template, ``<|im_end|>`` as
eos and ``<|endoftext|>`` as pad, as Qwen has them) that ``AutoModelForCausalLM`` / ``AutoTokenizer``
and verl load. Same seed and corpus → byte-identical weights and vocabulary.

Recipes ask for it by the name ``tiny-qwen3`` (see :mod:`verlflow.models.model_path`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from verlflow.errors import VerlflowError

# Bump when the builder changes what it writes, so stale caches are not reused.
BUILD_VERSION = 1

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

# Qwen2/Qwen3's pre-tokenizer regex: words, single digits, punctuation runs, newlines, spaces.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML as Qwen writes it (without tool calls or thinking blocks).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# ~0.2 M parameters: big enough to learn the answer format, small enough for a 2-core CPU step in ~1 s.
DEFAULT_SIZE: dict[str, Any] = {
    "vocab_size": 2048,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}
# Examples the default corpus draws from verlflow.data.synthetic_examples.
DEFAULT_CORPUS_SIZE = 2000


def build_tiny_model(
    output_dir: str | os.PathLike[str],
    *,
    corpus: Iterable[str] | None = None,
    seed: int = 0,
    **size: Any,
) -> Path:
    """Build a tiny Qwen3 + byte-level BPE tokenizer into ``output_dir`` and return that folder.

    ``corpus`` is the text the tokenizer is trained on (default: seeded synthetic GSM8K problems with
    their worked answers, in the chat format the trainer prompts with). ``size`` overrides fields of
    ``Qwen3Config`` (``hidden_size=128``, ``num_hidden_layers=4``, …); ``vocab_size`` is the BPE target.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    unknown = sorted(set(size) - set(Qwen3Config().to_dict()))
    if unknown:
        raise VerlflowError(f"unknown tiny-model size field '{unknown[0]}': use Qwen3Config fields, e.g. hidden_size")
    dims = {**DEFAULT_SIZE, **size}
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = _train_tokenizer(_default_corpus(seed) if corpus is None else corpus, dims["vocab_size"])
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    # The trained vocabulary can be smaller than asked for on a small corpus; the embedding follows it.
    dims["vocab_size"] = len(tokenizer)
    config = Qwen3Config(
        **dims,
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=ids[IM_END],
        pad_token_id=ids[ENDOFTEXT],
        dtype="float32",
    )
    # Initialise from a private generator so that building never disturbs the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=[ids[IM_END], ids[ENDOFTEXT]],
        pad_token_id=ids[ENDOFTEXT],
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    make_tokenizer_config_portable(out)
    return out


def make_tokenizer_config_portable(folder: str | os.PathLike[str]) -> None:
    """Rewrite a saved ``tokenizer_config.json`` so that transformers 4.x loads it too.

    transformers 5 names a plain fast tokenizer ``TokenizersBackend`` and keeps extra special tokens as
    a list under ``extra_special_tokens``; the guide's cluster image (transformers 4.52) knows neither,
    while both versions read ``PreTrainedTokenizerFast`` and ``additional_special_tokens``. The chat
    template is also kept inline for readers that ignore ``chat_template.jinja``.
    """
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = config.get("extra_special_tokens")
    if isinstance(extra, list):
        config.pop("extra_special_tokens")
        config["additional_special_tokens"] = extra
    template = Path(folder) / "chat_template.jinja"
    if "chat_template" not in config and template.is_file():
        config["chat_template"] = template.read_text()
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE with Qwen's pre-tokenizer and wrap it as a transformers tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=DEFAULT_SIZE["max_position_embeddings"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def _default_corpus(seed: int) -> Iterator[str]:
    """Synthetic GSM8K problems and answers, plain and in the chat format the trainer uses."""
    from verlflow.data.synthetic import synthetic_examples

    for example in synthetic_examples(DEFAULT_CORPUS_SIZE, seed=seed, split="train"):
        question, answer = _question_answer(example)
        yield f"{question}\n{answer}"
        yield f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n{answer}{IM_END}\n"


def _question_answer(example: Any) -> tuple[str, str]:
    """(prompt text, worked answer) of a raw GSM8K record or a row in verl's parquet schema."""
    if "question" in example and "answer" in example:
        return str(example["question"]), str(example["answer"])
    info = example.get("extra_info") or {}
    prompt = example.get("prompt")
    content = prompt[0]["content"] if prompt is not None and len(prompt) else info.get("question", "")
    return str(content), str(info.get("answer", ""))
