"""Greedy answers to GSM8K prompts, for evaluate: transformers (batched, KV cache) or vLLM.

Each problem is prompted as in training (the prompt messages through the tokenizer's chat template) and answered
greedily. With transformers, batches of similar length are left-padded; a batch that runs out of memory is
halved and tried again (said in one line), down to one problem at a time, where out of memory is the step's
one-line error naming ``max_new_tokens``.
"""

from __future__ import annotations

import pickle
from typing import Any

from verlflow import stopping
from verlflow.errors import VerlflowError
from verlflow.models.checks import unsafe_pickle
from verlflow.models.model_uri import ResolvedModel
from verlflow.out_of_memory import hold_reserve, is_out_of_memory, out_of_memory_error
from verlflow.platforms import Device

DEFAULT_BATCH_SIZE = 32


def accelerator() -> Device:
    """The device to generate on: verlflow's one detection order (:func:`detect_device`), then the CPU when this
    torch cannot drive what was found (a CPU build of torch on a GPU node, torch_npu seeing no NPU)."""
    import torch

    from verlflow.device.detect import detect_device, import_torch_npu

    # An installed torch_npu that cannot import is one line here; left alone, transformers imports it while loading
    # the model and fails with a traceback.
    import_torch_npu()
    found = detect_device()
    backend = getattr(torch, found.torch_type, None)  # torch.npu (once torch_npu is imported), torch.cuda
    if found.is_accelerator and not (backend is not None and backend.is_available()):
        return Device.CPU
    return found


def chat_tokenizer(model: ResolvedModel) -> Any:
    """The model's tokenizer, refused in one line when it has no chat template (every prompt goes through it):
    transformers' own ``ValueError`` asks for a template without naming the folder."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model.tokenizer_dir)
    if tokenizer.chat_template is None:
        raise VerlflowError(f"the tokenizer in '{model.tokenizer_dir}' has no chat template (evaluate prompts as "
                            "training does, through it): copy tokenizer_config.json and chat_template.jinja from the "
                            "model it was trained from")
    return tokenizer


def generate_hf(model: ResolvedModel, prompts: list[list[dict]], max_new_tokens: int,
                batch_size: int = DEFAULT_BATCH_SIZE) -> list[tuple[str, int]]:
    """Greedy answers (text, response tokens) with transformers: left-padded batches, KV cache."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from verlflow.progress import progress_bar

    dev = accelerator()
    device = dev.torch_type  # what torch calls it: cuda, npu, cpu
    tokenizer = chat_tokenizer(model)
    tokenizer.padding_side = "left"  # generation appends on the right, so pad on the left
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype = torch.bfloat16 if dev.is_accelerator else torch.float32
    try:
        lm = AutoModelForCausalLM.from_pretrained(model.model_dir, dtype=dtype).to(device).eval()
    except pickle.UnpicklingError:
        raise unsafe_pickle(model.model_dir) from None
    eos = _eos_ids(lm, tokenizer)
    gen_config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
        eos_token_id=sorted(eos), pad_token_id=tokenizer.pad_token_id,
    )
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in prompts]
    # Similar lengths in one batch waste less compute on padding; answers go back in input order.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    answers: list[tuple[str, int]] = [("", 0)] * len(texts)
    with torch.inference_mode(), progress_bar(len(texts), "evaluate", "problem") as bar:
        start = 0
        while start < len(order):
            batch = order[start:start + batch_size]
            enc = tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(device)
            try:
                out = lm.generate(**enc, generation_config=gen_config, stopping_criteria=_until_stopped(torch))
            except Exception as exc:
                batch_size = _smaller_batch(exc, batch_size, max_new_tokens)
                continue
            stopping.stop_point()  # per batch (a stop also cuts the batch's generation short, per token)
            new_tokens = out[:, enc["input_ids"].shape[1]:].tolist()
            for i, tokens in zip(batch, new_tokens, strict=True):
                length = _response_length(tokens, eos)
                answers[i] = (tokenizer.decode(tokens[:length], skip_special_tokens=True), length)
            bar.update(len(batch))
            start += len(batch)
    return answers


def _smaller_batch(exc: Exception, batch_size: int, max_new_tokens: int) -> int:
    """Half the batch after it ran out of memory (said once per halving); re-raised when not out of memory, and
    one line when even one problem at a time does not fit."""
    if not is_out_of_memory(exc):
        raise exc
    if batch_size <= 1:
        raise out_of_memory_error("evaluating one problem at a time", {"max_new_tokens": max_new_tokens},
                                  fix="the model and one answer of max_new_tokens (the training run's "
                                      "data.max_response_length) do not fit: evaluate where more memory is") from None
    smaller = max(1, batch_size // 2)
    hold_reserve()  # taken back for the next time
    print(f"evaluate: out of memory generating {batch_size} problems at once; going on with {smaller}", flush=True)
    return smaller


def _until_stopped(torch: Any) -> Any:
    """A stopping criterion for ``generate`` that ends every row once a stop has come (:data:`stopping.STOP`)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class UntilStopped(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), stopping.STOP.is_set(), dtype=torch.bool,
                              device=input_ids.device)

    return StoppingCriteriaList([UntilStopped()])


def _eos_ids(lm: Any, tokenizer: Any) -> set[int]:
    ids = lm.generation_config.eos_token_id
    eos = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return eos


def _response_length(tokens: list[int], eos: set[int]) -> int:
    """Tokens up to and including the first end-of-sequence token (what was actually generated)."""
    for position, token in enumerate(tokens):
        if token in eos:
            return position + 1
    return len(tokens)


def generate_vllm(model: ResolvedModel, prompts: list[list[dict]], max_new_tokens: int) -> list[tuple[str, int]]:
    """Greedy answers (text, response tokens) with vLLM, same prompts as :func:`generate_hf`."""
    from vllm import LLM, SamplingParams

    tokenizer = chat_tokenizer(model)
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in prompts]
    llm = LLM(model=str(model.model_dir), tokenizer=str(model.tokenizer_dir), seed=0)
    outputs = llm.generate(texts, SamplingParams(temperature=0.0, max_tokens=max_new_tokens), use_tqdm=True)
    return [(o.outputs[0].text, len(o.outputs[0].token_ids)) for o in outputs]
