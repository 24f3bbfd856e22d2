"""The vLLM engine's configuration as verl passes it, judged without starting vLLM (or without vLLM at all).

verl hands the rollout's fields to vLLM's engine arguments when its rollout server starts (0.9
``workers/rollout/vllm_rollout/vllm_async_server.py``: ``load_format``, ``max_num_seqs``,
``max_num_batched_tokens``, ``tensor_parallel_size``, ``scheduling_policy``, ``compilation_config`` with
``cudagraph_capture_sizes``, and every ``engine_kwargs.vllm`` key verbatim; 0.5 ``vllm_rollout_spmd.py``
the same through ``LLM(**kwargs)``). Where vLLM is installed its own classes give the choices
(``EngineArgs`` fields, ``LoadFormat``, ``SchedulerPolicy``); where it is not, :data:`RECORDED` does, read
from vLLM 0.9.1's wheel (the A3 image's vLLM; the H20 image's 0.9.2 is assumed the same), and each line says
which was used:

- ``vllm/config.py:1054`` ``ModelConfig.verify_with_parallel_config``: attention heads divisible by TP;
- ``vllm/config.py:2225`` ``SchedulerConfig._verify_args``: ``max_num_batched_tokens >= max_num_seqs``;
- ``vllm/config.py:1631`` ``LoadFormat``; ``:1992`` ``SchedulerPolicy``; ``:3951``
  ``CompilationConfig.cudagraph_capture_sizes: Optional[list[int]]``;
- ``vllm/engine/arg_utils.py`` ``EngineArgs`` / ``AsyncEngineArgs`` fields: the keys ``engine_kwargs.vllm`` may hold;
- ``logprobs_mode`` (verl 0.9 passes it): vLLM 0.9.1 has no such argument, so its choices are recorded from the
  vLLM that added it (:data:`RECORDED_LOGPROBS_MODES`: ``vllm/config/model.py`` ``LogprobsMode``, unchanged
  from 0.10.2 to the 0.24 verl 0.9.1's ``vllm`` extra pins).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from verlflow.backends.verl.dryrun.keys import ROLLOUT
from verlflow.backends.verl.dryrun.rehearsal import machine
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import value_of
from verlflow.errors import Problem


@dataclass(frozen=True)
class EngineChoices:
    """What vLLM accepts for the fields verl passes, and where that was read."""

    source: str
    load_formats: tuple[str, ...]
    scheduling_policies: tuple[str, ...]
    engine_args: frozenset[str]


RECORDED = EngineChoices(
    source="recorded from vLLM 0.9.1: vllm/config.py, vllm/engine/arg_utils.py; vLLM is not installed here",
    load_formats=("auto", "pt", "safetensors", "npcache", "dummy", "tensorizer", "sharded_state", "gguf",
                  "bitsandbytes", "mistral", "runai_streamer", "runai_streamer_sharded", "fastsafetensors"),
    scheduling_policies=("fcfs", "priority"),
    engine_args=frozenset((
        "model served_model_name tokenizer hf_config_path task skip_tokenizer_init enable_prompt_embeds "
        "tokenizer_mode trust_remote_code allowed_local_media_path download_dir load_format config_format dtype "
        "kv_cache_dtype seed max_model_len cuda_graph_sizes distributed_executor_backend pipeline_parallel_size "
        "tensor_parallel_size data_parallel_size data_parallel_size_local data_parallel_address "
        "data_parallel_rpc_port data_parallel_backend enable_expert_parallel max_parallel_loading_workers "
        "block_size enable_prefix_caching prefix_caching_hash_algo disable_sliding_window disable_cascade_attn "
        "use_v2_block_manager swap_space cpu_offload_gb gpu_memory_utilization max_num_batched_tokens "
        "max_num_partial_prefills max_long_partial_prefills long_prefill_token_threshold max_num_seqs "
        "max_logprobs disable_log_stats revision code_revision rope_scaling rope_theta hf_token hf_overrides "
        "tokenizer_revision quantization enforce_eager max_seq_len_to_capture disable_custom_all_reduce "
        "tokenizer_pool_size tokenizer_pool_type tokenizer_pool_extra_config limit_mm_per_prompt "
        "mm_processor_kwargs disable_mm_preprocessor_cache enable_lora enable_lora_bias max_loras max_lora_rank "
        "fully_sharded_loras max_cpu_loras lora_dtype lora_extra_vocab_size long_lora_scaling_factors "
        "enable_prompt_adapter max_prompt_adapters max_prompt_adapter_token device num_scheduler_steps "
        "multi_step_stream_outputs ray_workers_use_nsight num_gpu_blocks_override num_lookahead_slots "
        "model_loader_extra_config ignore_patterns preemption_mode scheduler_delay_factor enable_chunked_prefill "
        "disable_chunked_mm_input disable_hybrid_kv_cache_manager guided_decoding_backend "
        "guided_decoding_disable_fallback guided_decoding_disable_any_whitespace "
        "guided_decoding_disable_additional_properties logits_processor_pattern speculative_config "
        "qlora_adapter_name_or_path show_hidden_metrics_for_version otlp_traces_endpoint collect_detailed_traces "
        "disable_async_output_proc scheduling_policy scheduler_cls override_neuron_config override_pooler_config "
        "compilation_config worker_cls worker_extension_cls kv_transfer_config kv_events_config "
        "generation_config enable_sleep_mode override_generation_config model_impl calculate_kv_scales "
        "additional_config enable_reasoning reasoning_parser use_tqdm_on_load pt_load_map_location "
        "enable_multimodal_encoder_data_parallel disable_log_requests").split()),
)


# vLLM's LogprobsMode, a Literal in vllm/config/model.py (an enum of the same values in 0.10.2's vllm/config.py).
RECORDED_LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
LOGPROBS_SOURCE = "recorded from vLLM >= 0.10.2: vllm/config/model.py LogprobsMode; vLLM is not installed here"


def logprobs_modes() -> tuple[tuple[str, ...], str]:
    """The installed vLLM's logprobs modes and where they were read, else the recorded ones; none for a vLLM
    without the argument (then verl's passing it is the version mismatch, not the value)."""
    if not machine.installed("vllm"):
        return RECORDED_LOGPROBS_MODES, LOGPROBS_SOURCE
    from typing import get_args

    try:
        import vllm
        from vllm import config as vllm_config

        mode = getattr(vllm_config, "LogprobsMode", None) or importlib.import_module("vllm.config.model").LogprobsMode
    except Exception:  # a vLLM before 0.10.2: no logprobs mode at all
        return (), ""
    values = get_args(mode) or tuple(m.value for m in mode)
    return tuple(values), f"the installed vLLM {vllm.__version__}"


def engine_choices() -> EngineChoices:
    """The installed vLLM's choices, else :data:`RECORDED`."""
    if not machine.installed("vllm"):
        return RECORDED
    try:
        from typing import get_args

        import vllm
        from vllm.config import LoadFormat, SchedulerPolicy
        from vllm.engine.arg_utils import AsyncEngineArgs
    except Exception:  # a vLLM whose names moved: the recorded ones stand in
        return RECORDED
    return EngineChoices(source=f"the installed vLLM {vllm.__version__}",
                         load_formats=tuple(f.value for f in LoadFormat),
                         scheduling_policies=tuple(get_args(SchedulerPolicy)),
                         engine_args=frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs)))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def engine_problems(cfg: DictConfig, shape: dict[str, Any]) -> list[Problem]:
    """Problems of the vLLM engine's configuration (only when the rollout engine is vLLM)."""
    if str(value_of(cfg, f"{ROLLOUT}.name")) != "vllm":
        return []
    choices = engine_choices()
    said = f" ({choices.source})"
    problems = []
    heads, tp = shape.get("num_attention_heads"), _int(value_of(cfg, f"{ROLLOUT}.tensor_model_parallel_size"))
    if isinstance(heads, int) and tp and heads % tp:
        problems.append(Problem(f"{ROLLOUT}.tensor_model_parallel_size", tp, (
            f"vLLM splits the model's {heads} attention heads over the tensor-parallel ranks and refuses {tp} "
            f"(ModelConfig.verify_with_parallel_config){said}: use a divisor of {heads}")))
    batched, seqs = (_int(value_of(cfg, f"{ROLLOUT}.max_num_batched_tokens")),
                     _int(value_of(cfg, f"{ROLLOUT}.max_num_seqs")))
    if batched and seqs and batched < seqs:
        problems.append(Problem(f"{ROLLOUT}.max_num_batched_tokens", batched, (
            f"below max_num_seqs={seqs}: vLLM's SchedulerConfig refuses it{said}: raise it to >= {seqs}")))
    for key, valid in (("load_format", choices.load_formats), ("scheduling_policy", choices.scheduling_policies)):
        value = value_of(cfg, f"{ROLLOUT}.{key}")
        # verl 0.5 hands vLLM "dummy" for any dummy_* format (vllm_rollout_spmd.py:147)
        shown = "dummy" if key == "load_format" and str(value).startswith("dummy") else str(value).lower()
        if value is not None and shown not in valid:
            problems.append(Problem(f"{ROLLOUT}.{key}", value,
                                    f"not a vLLM {key}{said}: use one of {', '.join(valid)}"))
    mode, (modes, source) = value_of(cfg, f"{ROLLOUT}.logprobs_mode"), logprobs_modes()
    if mode is not None and modes and str(mode) not in modes:
        problems.append(Problem(f"{ROLLOUT}.logprobs_mode", mode, (
            f"not a vLLM logprobs mode (verl passes it to vLLM's engine arguments; {source}): use one of "
            f"{', '.join(modes)}")))
    sizes = value_of(cfg, f"{ROLLOUT}.cudagraph_capture_sizes")
    if sizes is not None and not (isinstance(sizes, list) and all(_int(s) for s in sizes)):
        problems.append(Problem(f"{ROLLOUT}.cudagraph_capture_sizes", sizes, (
            f"vLLM's CompilationConfig.cudagraph_capture_sizes is a list of whole numbers{said}: "
            "give one, e.g. [1,2,4,8]")))
    kwargs = value_of(cfg, f"{ROLLOUT}.engine_kwargs.vllm") or {}
    kwargs = {k: v for k, v in kwargs.items() if v is not None} if isinstance(kwargs, dict) else {}  # verl drops None
    for name in sorted(k for k in kwargs if k not in choices.engine_args):
        problems.append(Problem(f"{ROLLOUT}.engine_kwargs.vllm.{name}", kwargs[name], (
            f"verl passes engine_kwargs.vllm to vLLM's engine arguments verbatim and vLLM has no {name}{said}: "
            "remove it or spell an EngineArgs field")))
    return problems
