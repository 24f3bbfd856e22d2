"""The actor's and reference's FSDP engine as verl's workers build it, on the meta device (no weights allocated).

verl 0.9.1 ``workers/engine/fsdp/transformer_impl.py`` (0.5.0 ``workers/fsdp_workers.py`` alike) builds, in each
worker: the device mesh (``workers/engine/fsdp/utils.py:create_device_mesh(world, fsdp_size)``), the dtype
(``utils/torch_dtypes.py:PrecisionType.to_dtype(fsdp_config.model_dtype)``), the model from its config with the
attention implementation (``workers/config/model.py:185``), Liger kernels (``use_liger`` imports
``liger_kernel``), LoRA (``peft.get_peft_model`` with ``target_modules``), the wrap policy
(``utils/fsdp_utils.py:get_fsdp_wrap_policy``, which raises when the layer class is not in the model), and the
LR scheduler (``utils/torch_functional.py:get_cosine_schedule_with_warmup`` asserts ``0 <= min_lr_ratio <= 1``).
Here the model is built once from the model folder's ``config.json`` under ``torch.device("meta")`` and every
one of these is called or checked on it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verlflow.backends.verl.dryrun.keys import ACTOR, MODEL, REF
from verlflow.backends.verl.dryrun.rehearsal import machine
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import message_of, value_of
from verlflow.errors import Problem

# The dtypes verl reads from fsdp_config (0.9 workers/engine/fsdp/transformer_impl.py:393-395 mixed precision;
# 0.5 workers/fsdp_workers.py the same reads), each through PrecisionType.to_dtype.
DTYPE_FIELDS = ("model_dtype", "mixed_precision.param_dtype", "mixed_precision.reduce_dtype",
                "mixed_precision.buffer_dtype")


def dtype_problems(cfg: DictConfig) -> list[Problem]:
    """``fsdp_config`` dtypes (the model's, mixed precision's) that verl's ``PrecisionType.to_dtype`` refuses
    (actor and reference)."""
    try:
        dtypes = importlib.import_module("verl.utils.torch_dtypes")
    except ImportError:
        return []
    problems = []
    for section, field in ((s, f) for s in (ACTOR, REF) for f in DTYPE_FIELDS):
        key = f"{section}.fsdp_config.{field}"
        value = value_of(cfg, key)
        if value is None:
            continue
        try:
            dtypes.PrecisionType.to_dtype(value)
        except Exception:  # verl raises RuntimeError("unexpected precision: …")
            names = [n for n in (*dtypes.HALF_LIST, *dtypes.FLOAT_LIST, *dtypes.BFLOAT_LIST) if isinstance(n, str)]
            problems.append(Problem(key, value, f"verl's PrecisionType.to_dtype refuses it (utils/torch_dtypes.py): "
                                                f"use one of {', '.join(names)}"))
    return problems


def mesh_problems(cfg: DictConfig) -> list[Problem]:
    """``fsdp_config.fsdp_size`` that leaves ranks out of the (world // fsdp_size, fsdp_size) mesh."""
    nodes, per_node = value_of(cfg, "trainer.nnodes"), value_of(cfg, "trainer.n_gpus_per_node")
    if not (isinstance(nodes, int) and isinstance(per_node, int)):
        return []
    world, problems = nodes * per_node, []
    for section in (ACTOR, REF):
        key = f"{section}.fsdp_config.fsdp_size"
        size = value_of(cfg, key)
        if isinstance(size, int) and 0 < size < world and world % size:
            fits = [d for d in range(1, world + 1) if world % d == 0]
            problems.append(Problem(key, size, (
                f"verl's create_device_mesh builds a ({world} // {size}, {size}) mesh that leaves "
                f"{world % size} of the {world} ranks out (init_device_mesh refuses it): use -1 (all ranks) or one "
                f"of {', '.join(map(str, fits))}")))
    return problems


def attention_names() -> set[str]:
    """The attention implementations transformers accepts (``eager`` and its attention registry)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return {"eager", *ALL_ATTENTION_FUNCTIONS.keys()}


def meta_model(folder: str) -> Any:
    """The model from ``folder``'s config on the meta device (eager attention: the layout is the same)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def model_problems(cfg: DictConfig, folder: str, stack_has: Any) -> tuple[list[Problem], list[str]]:
    """Attention name, Liger, LoRA targets and the wrap policy, on one model built on the meta device."""
    problems, warnings = [], []
    key = f"{MODEL}.override_config.attn_implementation"
    attention = value_of(cfg, key)
    if isinstance(attention, str) and "/" not in attention and attention not in attention_names():
        problems.append(Problem(key, attention, f"transformers knows no such attention implementation (verl passes "
                                                f"it to the model's config): use one of "
                                                f"{', '.join(sorted(attention_names()))}"))
    if value_of(cfg, f"{MODEL}.use_liger") and not machine.installed("liger_kernel"):
        line = (f"{MODEL}.use_liger=True: verl imports liger_kernel for it in every worker "
                "(workers/engine/fsdp/transformer_impl.py)")
        if stack_has("liger_kernel"):
            warnings.append(f"{line}, and it is not installed on this machine")
        else:
            problems.append(Problem(f"{MODEL}.use_liger", True, "verl imports liger_kernel for it in every worker, "
                                                                "and neither this machine nor the cluster image has "
                                                                "it: install liger-kernel on the nodes or set False"))
    module = meta_model(folder)
    module, lora = _with_lora(cfg, module, problems)
    problems += _wrap_policy_problems(cfg, module, lora)
    return problems, warnings


def _with_lora(cfg: DictConfig, module: Any, problems: list[Problem]) -> tuple[Any, bool]:
    rank = value_of(cfg, f"{MODEL}.lora_rank")
    if not (isinstance(rank, int) and rank > 0):
        return module, False
    from peft import LoraConfig, TaskType, get_peft_model

    key = f"{MODEL}.target_modules"
    targets = value_of(cfg, key)
    try:
        return get_peft_model(module, LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank,
                                                 lora_alpha=value_of(cfg, f"{MODEL}.lora_alpha") or rank,
                                                 target_modules=targets, bias="none")), True
    except ValueError as exc:  # peft: "Target modules … not found in the base model"
        layers = sorted({name.rsplit(".", 1)[-1] for name, child in module.named_modules()
                         if type(child).__name__ == "Linear"})
        problems.append(Problem(key, targets, f"peft finds none of them in the model ({message_of(exc)[:120]}): use "
                                              f"all-linear or some of {', '.join(layers)}"))
        return module, False


def _wrap_policy_problems(cfg: DictConfig, module: Any, lora: bool) -> list[Problem]:
    try:
        get_policy = importlib.import_module("verl.utils.fsdp_utils").get_fsdp_wrap_policy
    except (ImportError, AttributeError):
        return []
    problems = []
    for section in (ACTOR, REF):
        node = OmegaConf.select(cfg, f"{section}.fsdp_config.wrap_policy")
        if node is None:
            continue
        try:
            get_policy(module=module, config=node, is_lora=lora)
        except Exception as exc:  # verl raises Exception("Could not find the transformer layer class to wrap …")
            key = f"{section}.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap"
            classes = sorted({type(m).__name__ for m in module.modules() if type(m).__name__.endswith("Layer")})
            problems.append(Problem(key, value_of(cfg, key), (
                f"verl's get_fsdp_wrap_policy fails on the model ({message_of(exc)[:120]}): name a layer class it "
                f"has ({', '.join(classes) or 'see its modeling file'}) or null for the model's own")))
    return problems


def scheduler_problems(cfg: DictConfig) -> list[Problem]:
    """A cosine schedule whose ``min_lr_ratio`` verl's ``get_cosine_schedule_with_warmup`` refuses."""
    optim = f"{ACTOR}.optim"
    kind = value_of(cfg, f"{optim}.lr_scheduler_type") or value_of(cfg, f"{optim}.warmup_style")
    ratio = value_of(cfg, f"{optim}.min_lr_ratio")
    if kind != "cosine" or ratio is None:
        return []
    import torch

    functional = importlib.import_module("verl.utils.torch_functional")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    try:
        functional.get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=10,
                                                   min_lr_ratio=ratio)
    except (AssertionError, TypeError, ValueError):
        return [Problem(f"{optim}.min_lr_ratio", ratio, "verl's get_cosine_schedule_with_warmup asserts "
                                                        "0 <= min_lr_ratio <= 1 (utils/torch_functional.py): the "
                                                        "floor is a share of the peak learning rate")]
    return []


def optimizer_problems(cfg: DictConfig) -> list[Problem]:
    """Adam's ``betas`` that are not two coefficients in [0, 1), and an ``override_optimizer_config`` key the
    optimizer does not take: both raise inside the optimizer's constructor (verl >= 0.6
    ``workers/config/optimizer.py:build_optimizer`` passes them as keyword arguments), whose statement names no key.
    """
    optim = f"{ACTOR}.optim"
    name = str(value_of(cfg, f"{optim}.optimizer") or "AdamW")  # verl 0.5 builds AdamW, with no key to say so
    betas = value_of(cfg, f"{optim}.betas")
    numbers = isinstance(betas, list) and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
    if "adam" in name.lower() and betas is not None and not (numbers and len(betas) == 2 and
                                                             all(0 <= b < 1 for b in betas)):
        return [Problem(f"{optim}.betas", betas, f"{name} takes two coefficients (beta1, beta2), each in [0, 1): "
                                                 "verl's default is [0.9, 0.999]")]
    override = value_of(cfg, f"{optim}.override_optimizer_config")
    if not isinstance(override, dict) or not override:
        return []
    try:
        accepted = inspect.signature(getattr(importlib.import_module(str(value_of(cfg, f"{optim}.optimizer_impl"))),
                                             name)).parameters
    except Exception:  # an optimizer that does not import here: the optimizer stage reports it
        return []
    if any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        return []
    unknown = sorted(k for k in override if k not in accepted)
    takes = ", ".join(p for p in accepted if p not in ("self", "params"))
    return [Problem(f"{optim}.override_optimizer_config.{k}", override[k], (
        f"verl passes override_optimizer_config to {name} as keyword arguments and it takes no {k}: use some of "
        f"{takes}")) for k in unknown]
