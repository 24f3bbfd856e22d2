"""The rollout's engine arguments and sampling values, judged by vLLM's own validators or its recorded choices.

verl hands ``rollout.dtype``, ``rollout.quantization`` and the sampling values to vLLM when the rollout
server starts, after the model is loaded. Where vLLM is installed its own code judges them (no device is
needed): ``vllm.SamplingParams`` (``_verify_args``) for the sampling values and
``vllm.model_executor.layers.quantization.QUANTIZATION_METHODS`` for quantization. Where it is not (a laptop,
CI), the choices below are used, recorded from vLLM's source:

- dtype: ``vllm/config.py`` ``ModelConfig.dtype`` / ``--dtype`` choices (the same set in 0.8 … 0.11);
- quantization: ``vllm/model_executor/layers/quantization/__init__.py`` ``QUANTIZATION_METHODS`` of vLLM
  0.8.5 plus ``torchao`` and ``ascend`` (vllm-ascend's);
- sampling: ``vllm/sampling_params.py`` ``SamplingParams._verify_args``: temperature >= 0,
  0 < top_p <= 1, top_k = -1 (or 0 from 0.10) or >= 1.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from verlflow.backends.verl.dryrun.keys import ROLLOUT
from verlflow.backends.verl.dryrun.rehearsal import machine
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import value_of
from verlflow.errors import Problem

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
RECORDED_QUANTIZATION = (
    "aqlm", "awq", "deepspeedfp", "tpu_int8", "fp8", "ptpc_fp8", "fbgemm_fp8", "modelopt", "marlin", "gguf",
    "gptq_marlin_24", "gptq_marlin", "awq_marlin", "gptq", "compressed-tensors", "bitsandbytes", "qqq", "hqq",
    "experts_int8", "neuron_quant", "ipex", "quark", "moe_wna16", "torchao", "ascend",
)
# Sampling sections verl turns into vLLM SamplingParams: the training rollout and validation.
SAMPLING_SECTIONS = (ROLLOUT, f"{ROLLOUT}.val_kwargs")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def recorded_sampling_problems(section: str, values: dict[str, Any]) -> list[Problem]:
    """vLLM's ``SamplingParams._verify_args`` rules for temperature, top_p and top_k, as recorded."""
    problems = []
    temperature, top_p, top_k = values.get("temperature"), values.get("top_p"), values.get("top_k")
    if _number(temperature) and temperature < 0:
        problems.append(Problem(f"{section}.temperature", temperature,
                                "vLLM requires temperature >= 0 (0 is greedy): the guide uses 1.0"))
    if _number(top_p) and not 0 < top_p <= 1:
        problems.append(Problem(f"{section}.top_p", top_p, "vLLM requires 0 < top_p <= 1: use 1.0 to keep every "
                                                           "token"))
    if _number(top_k) and top_k < -1:
        problems.append(Problem(f"{section}.top_k", top_k, "vLLM requires top_k = -1 (off) or >= 1"))
    return problems


def vllm_sampling_problems(section: str, values: dict[str, Any]) -> list[Problem]:
    """The same values through the installed vLLM's ``SamplingParams``."""
    import vllm

    given = {k: v for k, v in values.items() if k in ("temperature", "top_p", "top_k") and _number(v)}
    try:
        vllm.SamplingParams(**given)
    except (ValueError, TypeError) as exc:
        key = next((k for k in given if k in str(exc)), next(iter(given), "temperature"))
        return [Problem(f"{section}.{key}", given.get(key), f"vLLM refuses it: {' '.join(str(exc).split())}")]
    return []


def quantization_choices() -> tuple[tuple[str, ...], bool]:
    """The quantization names vLLM accepts, and whether they come from the installed vLLM."""
    if machine.installed("vllm"):
        try:
            from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

            return tuple(QUANTIZATION_METHODS), True
        except ImportError:
            pass
    return RECORDED_QUANTIZATION, False


# vLLM's ``MaxLoRARanks`` (vllm/config/lora.py), as verl's get_vllm_max_lora_rank falls back to it
# (verl 0.9.1 workers/rollout/vllm_rollout/utils.py) when it cannot import vLLM.
RECORDED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_problems(cfg: DictConfig) -> list[Problem]:
    """A LoRA rank above the largest vLLM serves (validate_config's last check, which imports vLLM)."""
    key = "actor_rollout_ref.model.lora_rank"
    rank = value_of(cfg, key)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        return []
    ranks = RECORDED_LORA_RANKS
    if machine.installed("vllm"):
        try:
            from typing import get_args

            from vllm.config.lora import MaxLoRARanks

            ranks = tuple(sorted(get_args(MaxLoRARanks)))
        except Exception:  # an older vLLM without vllm.config.lora: verl uses the same recorded ranks
            pass
    if rank > ranks[-1]:
        return [Problem(key, rank, f"vLLM serves LoRA ranks up to {ranks[-1]} (MaxLoRARanks, vllm/config/lora.py; "
                                   f"verl's utils/config.py:validate_config refuses more): use one of "
                                   f"{', '.join(map(str, ranks))}")]
    return []


def engine_problems(cfg: DictConfig) -> tuple[list[Problem], list[str]]:
    """Problems and warnings for the rollout's vLLM arguments (only when the engine is vLLM)."""
    if str(value_of(cfg, f"{ROLLOUT}.name")) != "vllm":
        return [], []
    problems, warnings = [], []
    dtype = value_of(cfg, f"{ROLLOUT}.dtype")
    if dtype is not None and str(dtype) not in DTYPES:
        problems.append(Problem(f"{ROLLOUT}.dtype", dtype, f"not a vLLM dtype: use one of {', '.join(DTYPES)}"))
    quantization = value_of(cfg, f"{ROLLOUT}.quantization")
    if quantization is not None:
        choices, installed = quantization_choices()
        if str(quantization) not in choices:
            source = "the installed vLLM's" if installed else "vLLM 0.8.5's recorded"
            problems.append(Problem(f"{ROLLOUT}.quantization", quantization, (
                f"not in {source} quantization methods: use one of {', '.join(choices)} (or null)")))
    check = vllm_sampling_problems if machine.installed("vllm") else recorded_sampling_problems
    for section in SAMPLING_SECTIONS:
        values = {k: value_of(cfg, f"{section}.{k}") for k in ("temperature", "top_p", "top_k")}
        problems += check(section, values)
    problems += lora_rank_problems(cfg)
    if value_of(cfg, f"{ROLLOUT}.prometheus.enable"):
        warnings.append(f"{ROLLOUT}.prometheus.enable=True: verl writes its scrape config to "
                        f"{value_of(cfg, f'{ROLLOUT}.prometheus.file')} and asks a Prometheus on port "
                        f"{value_of(cfg, f'{ROLLOUT}.prometheus.port')} to reload, ignoring failures: nothing is "
                        "scraped unless one runs there (`ray metrics launch-prometheus` on the head node)")
    return problems, warnings
