"""Device, tokenizer, model and optimizer of the local trainer, each with a one-line error when missing.

    python -c "from verlflow.backends.local.models import torch_device; print(torch_device('cpu'))"
"""

from __future__ import annotations

import functools
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from verlflow.backends.local.settings import LocalSettings
from verlflow.errors import VerlflowError
from verlflow.models.checks import unsafe_pickle
from verlflow.platforms import Device
from verlflow.util import first_line, hub_unreachable


def _sees_none(dev: Device) -> str:
    """How the refusal says torch sees no device of ``dev``: ``this torch (2.x) sees no CUDA GPU``."""
    extension = dev.platform.torch_extension
    return f"{extension} sees no {dev.word}" if extension else f"this torch ({torch.__version__}) sees no {dev.word}"


def torch_device(device: Device | str) -> torch.device:
    """The torch device for the device ``trainer.device`` names; a clear error when it is not there."""
    dev = Device(device)
    name = dev.torch_type
    extension = dev.platform.torch_extension
    if extension:
        from verlflow.device.detect import import_torch_npu

        if extension == "torch_npu" and not import_torch_npu():
            raise VerlflowError(f"trainer.device={name} but {extension} is not installed: use -P device=cpu")
    backend = getattr(torch, name, None)  # torch.cuda, torch.npu (once torch_npu is imported)
    if dev.is_accelerator and not (backend is not None and backend.is_available()):
        raise VerlflowError(f"trainer.device={name} but {_sees_none(dev)}: use -P device=cpu")
    return torch.device(name)


def apply_thread_count(env: dict[str, str]) -> int | None:
    """The profile's OMP_NUM_THREADS as torch's intra-op thread count (this process is already running); returns
    it, None when the profile sets none."""
    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
        return int(threads)
    return None


def make_deterministic(seed: int) -> dict[str, Any]:
    """One torch thread, deterministic algorithms, Python/NumPy/torch seeded: two runs become bit-identical.

    Multi-threaded CPU kernels sum in an order that varies between runs, and GRPO's sampling amplifies the
    last-bit differences into other tokens; one thread and verl-independent seeding remove both. Returns the
    settings it changed, for :func:`restore_determinism` (this process may run other work afterwards).
    """
    from transformers import set_seed

    before = {"threads": torch.get_num_threads(), "algorithms": torch.are_deterministic_algorithms_enabled()}
    # cuBLAS refuses deterministic matmuls on a GPU without a fixed workspace (read when CUDA first starts).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    set_seed(seed)
    return before


def restore_determinism(before: dict[str, Any]) -> None:
    """Put back the thread count and algorithm choice :func:`make_deterministic` changed."""
    torch.set_num_threads(before["threads"])
    torch.use_deterministic_algorithms(before["algorithms"])


@functools.lru_cache(maxsize=8)
def hub_load_kwargs(path: str) -> tuple[tuple[str, Any], ...]:
    """Extra ``from_pretrained`` arguments for a hub id, decided in seconds rather than after retries.

    A local folder needs none. For a hub id, when the hub does not answer: a cached copy is loaded
    with ``local_files_only``; without one, a one-line error instead of a minute of HTTP retries.
    """
    if Path(path).is_dir() or os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return ()
    from huggingface_hub import constants

    problem = hub_unreachable(f"{constants.ENDPOINT}/api/models/{path}")
    if problem is None:
        return ()
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(path, "config.json"), str):
        return (("local_files_only", True),)
    raise VerlflowError(
        f"model '{path}' is not a local folder nor in the Hugging Face cache, and the hub is unreachable "
        f"({problem}): give a model folder (-P model=/path/to/model) or 'tiny-qwen3-sft'"
    )


def load_tokenizer(path: str, settings: LocalSettings, resolved: Any) -> Any:
    """The tokenizer, left-padded, with a chat template and a pad token (verl's hf_tokenizer rules)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=settings.trust_remote_code,
                                                  **dict(hub_load_kwargs(path)))
    except (OSError, ValueError) as exc:
        raise VerlflowError(f"cannot load the tokenizer of '{path}': {first_line(exc)}") from None
    custom = resolved.actor_rollout_ref.model.get("custom_chat_template")
    if custom:
        tokenizer.chat_template = custom
    if tokenizer.chat_template is None:
        raise VerlflowError(f"the tokenizer of '{path}' has no chat template: set "
                            "actor_rollout_ref.model.custom_chat_template")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # as verl's hf_tokenizer does
    tokenizer.padding_side = "left"
    return tokenizer


def load_model(path: str, settings: LocalSettings, device: torch.device) -> Any:
    """The causal LM in float32 on ``device`` (gradient checkpointing when the config enables it)."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     trust_remote_code=settings.trust_remote_code,
                                                     **dict(hub_load_kwargs(path)))
    except (OSError, ValueError) as exc:
        raise VerlflowError(f"cannot load model '{path}': {first_line(exc)}") from None
    except pickle.UnpicklingError:
        raise unsafe_pickle(path) from None
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model.to(device)


def build_optimizer_and_scheduler(
    model: Any, settings: LocalSettings, total_steps: int,
) -> tuple[torch.optim.Optimizer, Any]:
    """verl's optimizer factory on the actor's ``optim`` config, and its warmup + constant/cosine schedule."""
    from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup
    from verl.workers.config.optimizer import build_optimizer

    optim = settings.actor.optim
    optimizer = build_optimizer(model.parameters(), optim)
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps and optim.lr_warmup_steps > 0 else int(
        optim.lr_warmup_steps_ratio * total_steps)
    kind = optim.warmup_style or optim.lr_scheduler_type
    if kind == "constant":
        return optimizer, get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    if kind == "cosine":
        return optimizer, get_cosine_schedule_with_warmup(
            optimizer, num_warmup_steps=warmup, num_training_steps=total_steps,
            min_lr_ratio=optim.min_lr_ratio, num_cycles=optim.num_cycles)
    raise VerlflowError(f"actor_rollout_ref.actor.optim.lr_scheduler_type={kind} is not supported locally: "
                        "use constant or cosine")

