"""The dry run's table: mistakes a cluster user makes on the guide recipe, and legal variations that must pass.

Each row is one ``verlflow train --dry_run true`` of the guide's recipe with a few overrides (and sometimes a
broken model or data folder), and what each verl must say: ``error`` (exit 2, the run FAILED, one
``key=value: …`` line naming the key), ``warning`` (exit 0, a ``verlflow: warning: key=…`` line) or ``pass``
(exit 0, no warning but those about this machine's missing packages). ``skip`` rows do not exist in that
verl (a key or code path it lacks) and are reported as skipped, with the reason.

The folders are real: a tiny Qwen3 with ``architectures`` and its tokenizer's chat template (4096 positions),
and the real GSM8K slice of ``tests/fixtures/gsm8k`` in verl's parquet schema (its 300 training rows twice, so
the guide's 512-row batch fits); variants break one thing each. Used by tests/test_dry_run_rehearsal_*.py,
one verl per module so the two run on both xdist workers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
A, R, REF, M = ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref",
                "actor_rollout_ref.model")
FIXED_BATCH = f"{A}.use_dynamic_bsz=false {R}.log_prob_use_dynamic_bsz=false {REF}.log_prob_use_dynamic_bsz=false"
MICRO_SET = f"{FIXED_BATCH} {R}.log_prob_micro_batch_size_per_gpu=8 {REF}.log_prob_micro_batch_size_per_gpu=8"
ENGINE_ONLY = "verl 0.5.0's fsdp_workers split batches their own way (rows of docs/preflight.md cover them)"
NO_KEY_05 = "the key does not exist in verl 0.5.0"
LORA = f"{M}.lora_rank=32 {M}.lora_alpha=32"
LOADED = ("model", "optim", "extra_state")  # the files of verl's FSDP checkpoint, per rank


@dataclass(frozen=True)
class Row:
    """One dry run and what each verl must say: ``(outcome, key)``, or ``("skip", why)``."""

    kind: str
    device: str
    overrides: str
    newest: tuple[str, str | None]
    guide: tuple[str, str | None] | None = None  # None: the same as newest
    model: str = "good"
    data: str = "full"
    extra: dict[str, str] = field(default_factory=dict)
    profile: str = ""  # "" = the device's; a name of build_folders' profiles (a3_091: the A3 with verl 0.9.1)

    def expected(self, which: str) -> tuple[str, str | None]:
        """What ``which`` verl (guide | newest) must say."""
        return self.newest if which == "newest" or self.guide is None else self.guide


def error(key: str) -> tuple[str, str]:
    return ("error", key)


def warning(key: str) -> tuple[str, str]:
    return ("warning", key)


PASS = ("pass", None)


def skip(why: str) -> tuple[str, str]:
    return ("skip", why)


MISTAKES: dict[str, Row] = {
    # Names verl resolves (registries, lookups).
    "rollout_name": Row("names", "npu", f"{R}.name=vlm", error(f"{R}.name")),
    "adv_estimator": Row("names", "npu", "algorithm.adv_estimator=grpoo", error("algorithm.adv_estimator")),
    "loss_agg_mode": Row("names", "npu", f"{A}.loss_agg_mode=tokenmean", error(f"{A}.loss_agg_mode")),
    "logger": Row("names", "npu", "trainer.logger=['mlfow']", error("trainer.logger")),
    "kl_loss_type": Row("names", "npu", f"{A}.kl_loss_type=low_var_kll", error(f"{A}.kl_loss_type")),
    "kl_penalty": Row("names", "npu", "algorithm.use_kl_in_reward=true algorithm.kl_penalty=low_var_kll",
                      error("algorithm.kl_penalty")),
    "kl_ctrl": Row("names", "npu", "algorithm.use_kl_in_reward=true algorithm.kl_ctrl.type=adaptve",
                   error("algorithm.kl_ctrl.type")),
    "policy_loss": Row("names", "npu", f"{A}.policy_loss.loss_mode=vanila", error(f"{A}.policy_loss.loss_mode")),
    "clip_ratio_c": Row("names", "npu", f"{A}.clip_ratio_c=0.5", error(f"{A}.clip_ratio_c")),
    "optimizer": Row("names", "npu", f"{A}.optim.optimizer=adamw", error(f"{A}.optim.optimizer"),
                     skip("verl 0.5.0 builds AdamW in its worker; it has no optim.optimizer key")),
    "lr_scheduler": Row("names", "npu", f"{A}.optim.lr_scheduler_type=linear", error(f"{A}.optim.lr_scheduler_type"),
                        skip(NO_KEY_05)),
    "agent_loop": Row("names", "npu", f"{R}.agent.default_agent_loop=single_turn",
                      error(f"{R}.agent.default_agent_loop"), skip(NO_KEY_05)),
    # Sizes and the batch arithmetic verl asserts at start-up.
    "batch_negative": Row("sizes", "npu", "data.train_batch_size=-3", error("data.train_batch_size")),
    "n_fraction": Row("sizes", "npu", f"{R}.n=5.5", error(f"{R}.n")),
    "grpo_one_response": Row("sizes", "npu", f"{R}.n=1", error(f"{R}.n")),  # GRPO needs a group of >= 2
    "batch_devices": Row("sizes", "npu", "data.train_batch_size=500", error("data.train_batch_size")),
    "tp_devices": Row("sizes", "npu", f"{R}.tensor_model_parallel_size=3", error(f"{R}.tensor_model_parallel_size")),
    "no_micro_batch": Row("sizes", "npu", FIXED_BATCH, error(f"{A}.ppo_micro_batch_size_per_gpu")),
    "micro_batch_division": Row("sizes", "npu", f"{MICRO_SET} {A}.ppo_micro_batch_size_per_gpu=96",
                                error(f"{A}.ppo_micro_batch_size_per_gpu")),
    "micro_batch_both": Row("sizes", "npu", f"{MICRO_SET} {A}.ppo_micro_batch_size=32 "
                                           f"{A}.ppo_micro_batch_size_per_gpu=4", error(f"{A}.ppo_micro_batch_size")),
    "dynamic_mismatch": Row("sizes", "npu", f"{A}.use_dynamic_bsz=false {A}.ppo_micro_batch_size_per_gpu=4",
                            error(f"{R}.log_prob_use_dynamic_bsz"), error(f"{R}.log_prob_micro_batch_size_per_gpu")),
    "log_prob_division": Row("sizes", "npu", f"{FIXED_BATCH} {A}.ppo_micro_batch_size_per_gpu=4 "
                                             f"{R}.log_prob_micro_batch_size_per_gpu=48 "
                                             f"{REF}.log_prob_micro_batch_size_per_gpu=8",
                             error(f"{R}.log_prob_micro_batch_size_per_gpu"), PASS),
    # Dynamic batches' token budgets (utils/seqlen_balancing.py:277 on 0.5.0, which pads to prompt + response).
    "token_budget": Row("sizes", "npu", f"{A}.ppo_max_token_len_per_gpu=1024", error(f"{A}.ppo_max_token_len_per_gpu")),
    "ref_token_budget": Row("sizes", "gpu", f"{REF}.log_prob_max_token_len_per_gpu=2000",
                            error(f"{REF}.log_prob_max_token_len_per_gpu")),  # 0.5 fsdp_workers.py:821
    "token_budget_null": Row("sizes", "npu", f"{R}.log_prob_max_token_len_per_gpu=null",
                             error(f"{R}.log_prob_max_token_len_per_gpu")),  # 0.5 dp_actor.py:322 None × sp
    "remove_padding": Row("sizes", "npu", f"{A}.ulysses_sequence_parallel_size=2 {M}.use_remove_padding=false",
                          error(f"{M}.use_remove_padding")),
    # What needs the devices, by arithmetic for the profile's world size (16 on A3, 8 on H20).
    "mini_batch_192": Row("device meshes", "npu", f"{A}.ppo_mini_batch_size=192", error(f"{A}.ppo_mini_batch_size"),
                          skip(ENGINE_ONLY)),
    "mini_batch_100": Row("device meshes", "npu", f"{A}.ppo_mini_batch_size=100", error(f"{A}.ppo_mini_batch_size"),
                          skip(ENGINE_ONLY)),
    "rollout_dp": Row("device meshes", "npu", f"{R}.data_parallel_size=3", error(f"{R}.data_parallel_size"),
                      skip(NO_KEY_05)),
    "ref_dynamic_alone": Row("device meshes", "npu", f"{REF}.log_prob_use_dynamic_bsz=False",
                             error(f"{REF}.log_prob_micro_batch_size"), skip(ENGINE_ONLY)),
    "sp_heads": Row("device meshes", "npu", f"{A}.ulysses_sequence_parallel_size=8",
                    error(f"{A}.ulysses_sequence_parallel_size")),
    "ref_sp_world": Row("device meshes", "npu", f"{REF}.ulysses_sequence_parallel_size=3",
                        error(f"{REF}.ulysses_sequence_parallel_size")),
    "sp_world_h20": Row("device meshes", "gpu", f"{A}.ulysses_sequence_parallel_size=3",
                        error(f"{A}.ulysses_sequence_parallel_size")),
    "response_past_positions": Row("device meshes", "npu", "data.max_response_length=3500",
                                   error("data.max_response_length")),  # 0.5 vllm_rollout_spmd.py:120
    "max_model_len_positions": Row("device meshes", "npu", f"{R}.max_model_len=8192", error(f"{R}.max_model_len")),
    # The rollout engine and vLLM's own arguments.
    "gpu_memory_over": Row("rollout engine", "npu", f"{R}.gpu_memory_utilization=1.5",
                           error(f"{R}.gpu_memory_utilization")),
    "gpu_memory_zero": Row("rollout engine", "gpu", f"{R}.gpu_memory_utilization=0",
                           error(f"{R}.gpu_memory_utilization")),
    "max_model_len_short": Row("rollout engine", "npu", f"{R}.max_model_len=1024", error(f"{R}.max_model_len")),
    "batched_tokens": Row("rollout engine", "npu", f"{R}.max_num_batched_tokens=1024",
                          warning(f"{R}.max_num_batched_tokens"), error(f"{R}.max_num_batched_tokens")),
    "val_temperature": Row("rollout engine", "npu", f"{R}.val_kwargs.do_sample=true {R}.temperature=0",
                           error(f"{R}.temperature")),
    "vllm_dtype": Row("vLLM arguments", "npu", f"{R}.dtype=bf16", error(f"{R}.dtype")),
    "vllm_quantization": Row("vLLM arguments", "gpu", f"{R}.quantization=int8", error(f"{R}.quantization"),
                             skip(NO_KEY_05)),
    "vllm_temperature": Row("vLLM arguments", "npu", f"{R}.temperature=-1", error(f"{R}.temperature")),
    "vllm_top_p": Row("vLLM arguments", "gpu", f"{R}.top_p=0", error(f"{R}.top_p")),
    "vllm_val_top_k": Row("vLLM arguments", "npu", f"{R}.val_kwargs.top_k=-5", error(f"{R}.val_kwargs.top_k")),
    # vLLM's engine configuration, by the recorded choices of the stack's vLLM (rehearsal/vllm_engine.py).
    "vllm_tp_heads": Row("vLLM engine", "npu", f"{R}.tensor_model_parallel_size=8",
                         error(f"{R}.tensor_model_parallel_size")),
    "vllm_batched_below_seqs": Row("vLLM engine", "npu", f"{R}.enable_chunked_prefill=true "
                                                         f"{R}.max_num_batched_tokens=256 {R}.max_num_seqs=512",
                                   error(f"{R}.max_num_batched_tokens")),
    "vllm_load_format": Row("vLLM engine", "gpu", f"{R}.load_format=safetensor", error(f"{R}.load_format")),
    "vllm_scheduling": Row("vLLM engine", "npu", f"{R}.scheduling_policy=fifo", error(f"{R}.scheduling_policy"),
                           skip(NO_KEY_05)),
    "vllm_engine_kwarg": Row("vLLM engine", "npu", f"+{R}.engine_kwargs.vllm.swap_spaces=4",
                             error(f"{R}.engine_kwargs.vllm.swap_spaces"), skip("verl 0.5.0 has no engine_kwargs")),
    "vllm_cudagraph_string": Row("vLLM engine", "npu", f"{R}.cudagraph_capture_sizes='1,2,4'",
                                 error(f"{R}.cudagraph_capture_sizes"), skip(NO_KEY_05)),
    "vllm_logprobs_mode": Row("vLLM engine", "npu", f"{R}.logprobs_mode=processed_logprob", error(f"{R}.logprobs_mode"),
                              skip(NO_KEY_05)),
    "sglang_missing": Row("the machine", "npu", f"{R}.name=sglang", error(f"{R}.name")),
    # What verl imports and the device it asks Ray for.
    "megatron": Row("imports", "npu", f"{A}.strategy=megatron", error(f"{A}.strategy")),
    "strategy": Row("imports", "gpu", f"{A}.strategy=deepspeed", error(f"{A}.strategy")),
    "critic_strategy": Row("imports", "npu", "critic.strategy=megatron", PASS, error("critic.strategy")),
    "trainer_device": Row("imports", "npu", "trainer.device=cuda", error("trainer.device")),
    # The model folder.
    "model_missing": Row("model folder", "npu", "", error(f"{M}.path"), model="missing"),
    "model_no_tokenizer": Row("model folder", "npu", "", error(f"{M}.path"), model="no_tokenizer"),
    "model_no_architectures": Row("model folder", "gpu", "", error(f"{M}.path"),
                                  skip("verl 0.5.0 reads architectures only inside its workers"), model="no_arch"),
    "no_chat_template": Row("data", "npu", "", error(f"{M}.path"), model="no_template"),
    # The data, as verl's dataset, filter, sampler and dataloader see it.
    "prompt_key": Row("data", "npu", "data.prompt_key=question", error("data.prompt_key")),
    "reward_fn_key": Row("data", "npu", "data.reward_fn_key=source", error("data.reward_fn_key")),
    "prompt_too_long": Row("data", "npu", "data.max_prompt_length=64", error("data.max_prompt_length")),
    "rows_below_batch": Row("data", "npu", "", error("data.train_batch_size"), data="small"),
    "train_files_missing": Row("data", "npu", "data.train_files=/nowhere/train.parquet", error("data.train_files")),
    "val_not_parquet": Row("data", "gpu", "data.val_files={not_parquet}", error("data.val_files")),
    "custom_dataset_missing": Row("data", "npu", "data.custom_cls.path=/nowhere/dataset.py data.custom_cls.name=Mine",
                                  error("data.custom_cls.path")),
    "dataloader_workers": Row("data", "gpu", "data.dataloader_num_workers=-1", error("data.dataloader_num_workers")),
    "data_seed_string": Row("data", "npu", "data.seed=abc", error("data.seed"), extra={"guide": "+data.seed=abc"}),
    "train_max_samples": Row("data", "npu", "data.train_max_samples=10", error("data.train_max_samples"),
                             skip(NO_KEY_05)),
    # The reward, loaded as verl loads it and called once.
    "reward_path": Row("reward", "npu", "custom_reward_function.path=/nope.py", error("custom_reward_function.path")),
    "reward_name": Row("reward", "npu", "custom_reward_function.path={reward} custom_reward_function.name=my_score",
                       error("custom_reward_function.name")),
    "reward_syntax": Row("reward", "gpu", "custom_reward_function.path={reward_broken}",
                         error("custom_reward_function.path")),
    "reward_kwargs": Row("reward", "npu", "reward.custom_reward_function.path={reward} "
                                          "+reward.custom_reward_function.reward_kwargs.scale=2",
                         error("reward.custom_reward_function.reward_kwargs"),
                         error("custom_reward_function.reward_kwargs"),
                         extra={"guide": "custom_reward_function.path={reward} "
                                         "+custom_reward_function.reward_kwargs.scale=2"}),
    "reward_raises": Row("reward", "npu", "reward.custom_reward_function.path={reward_raises}",
                         error("reward.custom_reward_function.path"), error("custom_reward_function.path"),
                         extra={"guide": "custom_reward_function.path={reward_raises}"}),
    "reward_manager": Row("reward", "npu", "reward.reward_manager.name=nave", error("reward.reward_manager.name"),
                          error("reward_model.reward_manager"), extra={"guide": "reward_model.reward_manager=nave"}),
    # The function's signature against what verl passes (0.9 reward_manager/naive.py:67, reward.py:38).
    "reward_no_extra_info": Row("reward", "npu", "reward.custom_reward_function.path={reward_no_extra_info}",
                                error("reward.custom_reward_function.path"), error("custom_reward_function.path"),
                                extra={"guide": "custom_reward_function.path={reward_no_extra_info}"}),
    "reward_needs_kwarg": Row("reward", "gpu", "reward.custom_reward_function.path={reward_needs_scale}",
                              error("reward.custom_reward_function.reward_kwargs"),
                              error("custom_reward_function.reward_kwargs"),
                              extra={"guide": "custom_reward_function.path={reward_needs_scale}"}),
    "reward_source": Row("reward", "npu", "reward.reward_manager.source=registry",
                         error("reward.reward_manager.source"), skip(NO_KEY_05)),
    # The first step on a tiny batch: the reward's return read as verl reads it, the advantage estimator and the
    # policy loss called on a dummy batch, the profiler's steps and the rollout folder (rehearsal/first_step.py).
    "reward_no_score": Row("first step", "npu", "reward.custom_reward_function.path={reward_dict}",
                           error("reward.custom_reward_function.path"), error("custom_reward_function.path"),
                           extra={"guide": "custom_reward_function.path={reward_dict}"}),
    "reward_score_string": Row("first step", "npu", "reward.custom_reward_function.path={reward_score_string}",
                               error("reward.custom_reward_function.path"),
                               skip("0.5.0 reads the return the same way; reward_no_score runs there")),
    # ^ 0.9 reward_manager/naive.py:93 result["score"], base.py:assemble_rm_scores new_tensor
    "reward_keys_vary": Row("first step", "gpu", "reward.custom_reward_function.path={reward_keys_vary}",
                            error("reward.custom_reward_function.path"),
                            skip("0.5.0 fails at validation's length assert; the same row runs on 0.9.1")),
    # ^ 0.9 experimental/agent_loop/agent_loop.py:1111 info[key]
    "reward_extra_list": Row("first step", "npu", "reward.custom_reward_function.path={reward_extra_list}",
                             error("reward.custom_reward_function.path"),
                             skip("the same np.mean in 0.5.0's validation")),  # metric_utils.py:1016 np.mean
    "truth_float": Row("first step", "npu", "", error("data.train_files"), data="float_truth"),  # gsm8k.py:72
    "truth_none": Row("first step", "gpu", "", error("data.train_files"), data="no_truth"),  # gsm8k.py:72
    "reward_none": Row("first step", "gpu", "reward.custom_reward_function.path={reward_none}",
                       error("reward.custom_reward_function.path"), error("custom_reward_function.path"),
                       extra={"guide": "custom_reward_function.path={reward_none}"}),
    "otb_no_sum_pi": Row("first step", "npu", "algorithm.adv_estimator=optimal_token_baseline",
                         error(f"{A}.calculate_sum_pi_squared"), skip("the estimator came after verl 0.5.0")),
    "dro_no_beta": Row("first step", "npu", f"{A}.policy_loss.loss_mode=dro", error(f"{A}.policy_loss.dro_beta"),
                       skip("DRO came after verl 0.5.0")),
    "gen_batch_split": Row("first step", "npu", "data.gen_batch_size=100", error("data.gen_batch_size"),
                           extra={"guide": "+data.gen_batch_size=100"}),
    "profiler_steps_int": Row("first step", "npu", "global_profiler.steps=5", error("global_profiler.steps"),
                              error("trainer.profile_steps"), extra={"guide": "trainer.profile_steps=5"}),
    "rollout_data_dir": Row("first step", "gpu", "trainer.rollout_data_dir={not_parquet}/rollouts",
                            error("trainer.rollout_data_dir")),
    "log_prob_micro_zero": Row("first step", "npu", f"{R}.log_prob_micro_batch_size_per_gpu=0",
                               error(f"{R}.log_prob_micro_batch_size_per_gpu")),
    # The rollout side verl's workers build (rehearsal/rollout_side.py): registries, agent loop, trace, reward loop.
    "rollout_mode_server": Row("rollout side", "npu", f"{R}.mode=server", error(f"{R}.mode"),
                               skip("verl 0.5.0 runs every mode but async as its sync rollout")),
    "checkpoint_engine_shm": Row("rollout side", "npu", f"{R}.checkpoint_engine.backend=shm",
                                 error(f"{R}.checkpoint_engine.backend"), skip(NO_KEY_05)),
    "agent_workers_split": Row("rollout side", "npu", f"{R}.agent.num_workers=7", error(f"{R}.agent.num_workers"),
                               skip("verl 0.5.0 runs its agent loop only with rollout.mode=async")),
    "agent_config_missing": Row("rollout side", "gpu", f"{R}.agent.agent_loop_config_path=/nowhere/agents.yaml",
                                error(f"{R}.agent.agent_loop_config_path"),
                                skip("verl 0.5.0 runs its agent loop only with rollout.mode=async")),
    "trace_weave": Row("rollout side", "npu", f"{R}.trace.backend=weave", warning(f"{R}.trace.backend"),
                       skip(NO_KEY_05)),
    "agent_loop_target_nowhere": Row("rollout side", "npu", f"{R}.agent.agent_loop_config_path={{agent_loops_nowhere}} "
                                                            f"{R}.agent.default_agent_loop=my_lost_loop",
                                     error(f"{R}.agent.agent_loop_config_path"), skip(NO_KEY_05)),  # agent_loop.py:682
    "tool_config_missing": Row("rollout side", "gpu", f"{R}.multi_turn.tool_config_path=/nowhere/tools.yaml",
                               error(f"{R}.multi_turn.tool_config_path"), skip(NO_KEY_05)),  # tool_registry.py:44
    "tool_class_nowhere": Row("rollout side", "npu", f"{R}.multi_turn.tool_config_path={{tools_nowhere}}",
                              error(f"{R}.multi_turn.tool_config_path"), skip(NO_KEY_05)),  # tool_registry.py:42
    "reward_workers_zero": Row("rollout side", "npu", "reward.num_workers=0", error("reward.num_workers"),
                               skip(NO_KEY_05)),
    # Judged for the cluster's verl (the profile's stack names it; rehearsal/versions.py): legal on 0.9.1.
    "max_model_len_short_091": Row("verl versions", "npu", f"{R}.max_model_len=1024", warning(f"{R}.max_model_len"),
                                   profile="a3_091"),
    "response_past_positions_091": Row("verl versions", "npu", "data.max_response_length=3500",
                                       warning("data.max_response_length"), profile="a3_091"),  # async_server:593
    "ref_strategy_091": Row("verl versions", "npu", f"{REF}.strategy=fsdp_2", error(f"{REF}.strategy"),
                            profile="a3_091"),  # 0.9 workers/config/actor.py:325, workers/engine/base.py:401
    "token_budget_091": Row("verl versions", "npu", f"{A}.ppo_max_token_len_per_gpu=1024",
                            warning(f"{A}.ppo_max_token_len_per_gpu"), profile="a3_091"),  # seqlen_balancing.py:384
    "trainer_device_091": Row("verl versions", "npu", "trainer.device=cuda", warning("trainer.device"),
                              profile="a3_091"),
    "reward_legacy_missing_091": Row("verl versions", "npu", "custom_reward_function.path=/nope.py",
                                     warning("custom_reward_function.path"), profile="a3_091"),
    "reward_legacy_091": Row("verl versions", "npu", "custom_reward_function.path={reward}",
                             warning("custom_reward_function.path"), profile="a3_091"),
    # LoRA on: every stage still runs (validate_config's vLLM import is the machine's, not a reason to stop).
    "lora_rank_over": Row("LoRA", "npu", f"{M}.lora_rank=1024 {M}.lora_alpha=32", error(f"{M}.lora_rank")),
    "lora_rows_below_batch": Row("LoRA", "gpu", LORA, error("data.train_batch_size"), data="small"),
    "lora_train_max_samples": Row("LoRA", "gpu", f"{LORA} data.train_max_samples=10", error("data.train_max_samples"),
                                  skip(NO_KEY_05)),
    "lora_reward_kwargs": Row("LoRA", "npu", f"{LORA} reward.custom_reward_function.path={{reward}} "
                                             "+reward.custom_reward_function.reward_kwargs.scale=2",
                              error("reward.custom_reward_function.reward_kwargs"),
                              error("custom_reward_function.reward_kwargs"),
                              extra={"guide": f"{LORA} custom_reward_function.path={{reward}} "
                                              "+custom_reward_function.reward_kwargs.scale=2"}),
    # The actor's engine built on the meta device (rehearsal/engine.py).
    "wrap_policy_class": Row("engine", "npu", f"+{A}.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap="
                                              "[LlamaDecoderLayer]",
                             error(f"{A}.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap")),
    "model_dtype": Row("engine", "npu", f"{A}.fsdp_config.model_dtype=bfloat", error(f"{A}.fsdp_config.model_dtype"),
                       extra={"guide": f"+{A}.fsdp_config.model_dtype=bfloat"}),
    "mixed_precision_dtype": Row("engine", "npu", f"+{A}.fsdp_config.mixed_precision.param_dtype=bfloat",
                                 error(f"{A}.fsdp_config.mixed_precision.param_dtype")),
    # ^ 0.9 workers/engine/fsdp/transformer_impl.py:393, 0.5 workers/fsdp_workers.py PrecisionType.to_dtype
    "ref_strategy": Row("engine", "npu", f"{REF}.strategy=fsdp_2", warning(f"{REF}.strategy")),  # 0.5 never reads it
    "fsdp_size": Row("engine", "npu", f"{A}.fsdp_config.fsdp_size=3", error(f"{A}.fsdp_config.fsdp_size")),
    "lora_targets": Row("engine", "gpu", f"{LORA} {M}.target_modules=[q_projx]", error(f"{M}.target_modules")),
    "lora_targets_string": Row("engine", "npu", f"{LORA} {M}.target_modules=q_projx", error(f"{M}.target_modules")),
    "betas_one": Row("engine", "npu", f"{A}.optim.betas=[0.9]", error(f"{A}.optim.betas"),
                     extra={"guide": f"+{A}.optim.betas=[0.9]"}),
    "optimizer_kwargs": Row("engine", "npu", f"+{A}.optim.override_optimizer_config.bogus=1",
                            error(f"{A}.optim.override_optimizer_config.bogus"),
                            skip("verl 0.5.0 builds AdamW in its worker; it has no override_optimizer_config key")),
    "attn_flash_attn": Row("engine", "npu", f"+{M}.override_config.attn_implementation=flash_attn",
                           error(f"{M}.override_config.attn_implementation")),
    "use_liger": Row("engine", "npu", f"{M}.use_liger=true", error(f"{M}.use_liger")),
    "cosine_min_lr": Row("engine", "npu", f"{A}.optim.lr_scheduler_type=cosine {A}.optim.min_lr_ratio=1.5",
                         error(f"{A}.optim.min_lr_ratio"), extra={"guide": f"{A}.optim.warmup_style=cosine "
                                                                           f"{A}.optim.min_lr_ratio=1.5"}),
    # The resume branch verl takes.
    "resume_mode": Row("resume", "npu", "trainer.resume_mode=resume", error("trainer.resume_mode")),
    "resume_path_unset": Row("resume", "npu", "trainer.resume_mode=resume_path", error("trainer.resume_from_path")),
    "resume_path_malformed": Row("resume", "gpu", "trainer.resume_mode=resume_path trainer.resume_from_path=/tmp/ckpt",
                                 error("trainer.resume_from_path")),
    "resume_path_missing": Row("resume", "npu", "trainer.resume_mode=resume_path "
                                                "trainer.resume_from_path=/nowhere/global_step_5",
                               error("trainer.resume_from_path")),
    "resume_world_size": Row("resume", "npu", "trainer.resume_mode=resume_path trainer.resume_from_path={ckpt_w8}",
                             error("trainer.resume_from_path")),
    "resume_path_actor": Row("resume", "gpu", "trainer.resume_mode=resume_path "
                                              "trainer.resume_from_path={ckpt_w8}/actor",
                             error("trainer.resume_from_path")),  # 0.9 ray_trainer.py:1083 int(…global_step_…)
    "resume_model_only": Row("resume", "npu", "trainer.resume_mode=resume_path "
                                              "trainer.resume_from_path={ckpt_model_only}",
                             error("trainer.resume_from_path")),  # fsdp_checkpoint_manager.py:233 optim_…pt
    "resume_hdfs": Row("resume", "npu", "trainer.default_hdfs_dir=hdfs://namenode/ckpt",
                       error("trainer.default_hdfs_dir")),
}

WARNINGS: dict[str, Row] = {
    "lr_far": Row("warnings", "npu", f"{A}.optim.lr=0.1", warning(f"{A}.optim.lr")),
    "greedy_group": Row("warnings", "gpu", f"{R}.temperature=0", warning(f"{R}.temperature")),
    "clip_inverted": Row("warnings", "npu", f"{A}.clip_ratio_low=0.3 {A}.clip_ratio_high=0.2",
                         warning(f"{A}.clip_ratio_low")),
    "one_response_per_group": Row("warnings", "npu", f"algorithm.adv_estimator=rloo {R}.n=1", warning(f"{R}.n")),
    "save_contents_unknown": Row("warnings", "npu", f"{A}.checkpoint.save_contents=['model','optimizer','weights']",
                                 warning(f"{A}.checkpoint.save_contents")),
    "prometheus": Row("warnings", "npu", f"{R}.prometheus.enable=True", warning(f"{R}.prometheus.enable"),
                      skip(NO_KEY_05)),
}

LEGAL: dict[str, Row] = {
    "guide_a3": Row("legal", "npu", "", PASS),
    "guide_h20": Row("legal", "gpu", "", PASS),
    "lora": Row("legal", "gpu", LORA, PASS),
    "gspo": Row("legal", "npu", f"{A}.policy_loss.loss_mode=gspo {A}.loss_agg_mode=seq-mean-token-mean", PASS,
                skip("GSPO came after verl 0.5.0")),
    "fsdp2": Row("legal", "npu", f"{A}.strategy=fsdp2 {REF}.strategy=fsdp2", PASS),
    "validation_sampling": Row("legal", "gpu", f"{R}.val_kwargs.do_sample=true {R}.val_kwargs.temperature=0.6 "
                                               f"{R}.val_kwargs.n=4", PASS),
    "thinking_off": Row("legal", "npu", "+data.apply_chat_template_kwargs.enable_thinking=false", PASS),
    "smaller_batches": Row("legal", "npu", f"data.train_batch_size=256 {A}.ppo_mini_batch_size=128", PASS),
    "tp1": Row("legal", "gpu", f"{R}.tensor_model_parallel_size=1", PASS),
    "tp4": Row("legal", "npu", f"{R}.tensor_model_parallel_size=4", PASS),
    "no_kl_loss": Row("legal", "npu", f"{A}.use_kl_loss=False", PASS),
    "eight_responses": Row("legal", "gpu", f"{R}.n=8", PASS),
    "fixed_micro_batches": Row("legal", "npu", f"{MICRO_SET} {A}.ppo_micro_batch_size_per_gpu=4", PASS),
    "rloo": Row("legal", "npu", "algorithm.adv_estimator=rloo", PASS),
    "sequence_parallel_2": Row("legal", "npu", f"{A}.ulysses_sequence_parallel_size=2", PASS),
    "sequence_parallel_kv": Row("legal", "npu", f"{A}.ulysses_sequence_parallel_size=4", PASS),
    "four_devices": Row("legal", "gpu", "trainer.n_gpus_per_node=4", PASS),
    "dapo_clip": Row("legal", "npu", f"{A}.clip_ratio_low=0.2 {A}.clip_ratio_high=0.28", PASS),
    "resume_disabled": Row("legal", "npu", "trainer.resume_mode=disable", PASS),
    "reward_function": Row("legal", "npu", "custom_reward_function.path={reward}", PASS),
    "lora_all_linear": Row("legal", "gpu", f"{LORA} {M}.target_modules=all-linear", PASS),
    "wrap_policy_own": Row("legal", "npu", f"+{A}.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap="
                                           "[Qwen3DecoderLayer]", PASS),
    "resume_same_world": Row("legal", "npu", "trainer.resume_mode=resume_path trainer.resume_from_path={ckpt_w16}",
                             PASS),
    "reward_dict_score": Row("legal", "gpu", "reward.custom_reward_function.path={reward_scored}", PASS,
                             extra={"guide": "custom_reward_function.path={reward_scored}"}),
    "otb_sum_pi": Row("legal", "npu", f"algorithm.adv_estimator=optimal_token_baseline "
                                      f"{A}.calculate_sum_pi_squared=true", PASS, skip("after verl 0.5.0")),
    "dro_beta": Row("legal", "npu", f"{A}.policy_loss.loss_mode=dro {A}.policy_loss.dro_beta=0.1", PASS,
                    skip("DRO came after verl 0.5.0")),
    "gen_batch_half": Row("legal", "npu", "data.gen_batch_size=256", PASS, extra={"guide": "+data.gen_batch_size=256"}),
    "vllm_logprobs_raw": Row("legal", "gpu", f"{R}.logprobs_mode=raw_logprobs", PASS, skip(NO_KEY_05)),
    # The user's own code verl loads, called or looked up as verl does (a false refusal blocks a correct launch).
    "reward_reads_num_turns": Row("legal", "npu", "reward.custom_reward_function.path={reward_turns}", PASS,
                                  skip("verl 0.5.0's sync rollout passes num_turns=None and no rollout_reward_scores"
                                       " (workers/reward_manager/naive.py:80)")),  # 0.9 reward_manager/naive.py:49
    "agent_loop_own_module": Row("legal", "npu", f"{R}.agent.default_agent_loop=my_single_turn", PASS,
                                 skip(NO_KEY_05), profile="a3_agents"),  # verl/__init__.py:49, agent_loop.py:475
    "agent_loop_config_file": Row("legal", "gpu", f"{R}.agent.agent_loop_config_path={{agent_loops}} "
                                                  f"{R}.agent.default_agent_loop=my_config_loop", PASS,
                                  skip(NO_KEY_05)),  # agent_loop.py:534-539
    "reward_kwarg_given": Row("legal", "gpu", "reward.custom_reward_function.path={reward_needs_scale} "
                                              "+reward.custom_reward_function.reward_kwargs.scale=2", PASS,
                              extra={"guide": "custom_reward_function.path={reward_needs_scale} "
                                              "+custom_reward_function.reward_kwargs.scale=2"}),
    "mixed_precision_fp32": Row("legal", "npu", f"+{A}.fsdp_config.mixed_precision.param_dtype=fp32", PASS),
    "token_budget_sequence_parallel": Row("legal", "npu", f"{A}.ppo_max_token_len_per_gpu=1024 "
                                                          f"{A}.ulysses_sequence_parallel_size=2", PASS),
    "resume_model_only_loaded": Row("legal", "npu", "trainer.resume_mode=resume_path trainer.resume_from_path="
                                                    f"{{ckpt_model_only}} {A}.checkpoint.load_contents=[model]", PASS),
    "reward_extra_text": Row("legal", "npu", "reward.custom_reward_function.path={reward_extra_text}", PASS,
                             extra={"guide": "custom_reward_function.path={reward_extra_text}"}),
    "truth_float_own_reward": Row("legal", "gpu", "reward.custom_reward_function.path={reward}", PASS,
                                  extra={"guide": "custom_reward_function.path={reward}"}, data="float_truth"),
    "tool_config_own": Row("legal", "npu", f"{R}.multi_turn.tool_config_path={{tools}}", PASS, skip(NO_KEY_05),
                           profile="a3_agents"),  # the class on the profile's PYTHONPATH
    "profiler_steps_list": Row("legal", "npu", "global_profiler.steps=[1,2]", PASS,
                               extra={"guide": "trainer.profile_steps=[1,2]"}),
}

ROWS: dict[str, Row] = {**MISTAKES, **WARNINGS, **LEGAL}


def guide_rows() -> list[str]:
    """The rows verl 0.5.0 runs too: those where the two verls differ, and enough of the rest to start every stage
    of the 0.5.0 rehearsal from end to end.

    A row runs on 0.5.0 when it expects something else there or is written another way for it (a key or a rule
    that changed between the versions), when it breaks the model, the data or the profile (their files are read
    by each verl's own code), and the first row of each kind otherwise (each stage of the rehearsal, entered once
    on 0.5.0). The other rows expect the same on both verls and exercise the same check: they run on the newest
    only. Rows 0.5.0 lacks (``skip``) never run there.
    """
    chosen, kinds = [], set()
    for name, row in ROWS.items():
        if row.expected("guide")[0] == "skip":
            continue
        differs = row.guide is not None or "guide" in row.extra
        own_files = (row.model, row.data, row.profile) != ("good", "full", "")
        if differs or own_files or row.kind not in kinds:
            chosen.append(name)
            kinds.add(row.kind)
    return chosen

# The newest verl's table in three files, so the suite's workers share it: each file one share of the row kinds.
NEWEST_SHARES = {
    "settings": ("names", "sizes", "device meshes", "rollout engine", "vLLM arguments", "vLLM engine", "the machine",
                 "imports"),
    "inputs": ("model folder", "data", "reward", "first step", "rollout side", "engine", "resume", "LoRA",
               "verl versions"),
    "clean": ("legal", "warnings"),
}


def newest_rows(share: str) -> list[str]:
    """The rows whose kind is in ``share`` of :data:`NEWEST_SHARES`, in the table's order."""
    return [name for name, row in ROWS.items() if row.kind in NEWEST_SHARES[share]]


# Runs every row in one process against one verl (in-process ``cli.main``), reporting exit code, output and
# the status of the run each row left.
DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from mlflow.tracking import MlflowClient
    from verlflow import cli

    jobs = json.loads(sys.argv[1])
    client, seen, out = MlflowClient(), set(), {}
    for name, job in jobs.items():
        stdout, stderr, code = io.StringIO(), io.StringIO(), 0
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                cli.main(["train", "--device", job["device"], "--dry_run", "true", "--data_dir", job["data"],
                          "--model", job["model"], "--overrides", job["overrides"], "--profile", job["profile"]])
            except SystemExit as exc:
                code = exc.code
        every = [e.experiment_id for e in client.search_experiments()]
        runs = [r for r in client.search_runs(every) if r.info.run_id not in seen]
        seen |= {r.info.run_id for r in runs}
        out[name] = {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
                     "statuses": [r.info.status for r in runs]}
    print("RESULT " + json.dumps(out))
    """
)


def build_model(folder: Path) -> None:
    """The tiny Qwen3 (architectures, chat template) with the guide's lengths in reach: 4096 positions."""
    from verlflow.models.tinymodel import build_tiny_model

    build_tiny_model(folder, max_position_embeddings=4096)


def build_folders(model: Path, root: Path) -> dict[str, str]:
    """The model and data variants and the helper files the rows name, under ``root``; name → path."""
    import pandas as pd

    from verlflow.data import gsm8k

    full, small = root / "data", root / "data-small"
    gsm8k.preprocess(str(REPO / "tests" / "fixtures" / "gsm8k"), full, 0, log_to_mlflow=False)
    train = pd.read_parquet(full / "train.parquet")
    pd.concat([train, train], ignore_index=True).to_parquet(full / "train.parquet")
    small.mkdir()
    train.head(100).to_parquet(small / "train.parquet")
    shutil.copy(full / "test.parquet", small / "test.parquet")
    truths = {"float_truth": lambda truth: float(truth.replace(",", "")), "no_truth": lambda truth: None}
    for name, change in truths.items():  # the ground truth another preprocessing wrote (verlflow's: a string)
        (root / f"data-{name}").mkdir()
        for split in ("train", "test"):
            frame = pd.read_parquet(full / f"{split}.parquet")
            frame["reward_model"] = [{**row, "ground_truth": change(row["ground_truth"])}
                                     for row in frame["reward_model"]]
            frame.to_parquet(root / f"data-{name}" / f"{split}.parquet")
    variants = {"good": model, "missing": root / "nowhere-qwen"}
    for name, damage in (("no_arch", _drop_architectures), ("no_template", _drop_chat_template),
                         ("no_tokenizer", _drop_tokenizer)):
        variants[name] = root / f"model-{name}"
        shutil.copytree(model, variants[name])
        damage(variants[name])
    reward, broken, not_parquet = root / "reward.py", root / "reward_broken.py", root / "val.parquet"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(solution_str.strip().endswith(str(ground_truth)))\n")
    broken.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None)\n    return 0\n")
    not_parquet.write_text("question,answer\n1+1,2\n")
    returns = {"reward_dict": "{'acc': 1.0}", "reward_none": "None", "reward_scored": "{'score': 1.0, 'acc': True}",
               "reward_raises": "1 / 0"}
    profiles = _profiles_with_verl(root, "0.9.1")
    checkpoints = {}
    # verl's FSDP shards, one per rank and content (empty: the dry run reads names, never loads them); the last a
    # model-only save (fsdp_checkpoint_manager.py:213/233/241 load model, optim and extra_state by default).
    for name, world, contents in (("ckpt_w8", 8, LOADED), ("ckpt_w16", 16, LOADED), ("ckpt_model_only", 16, ["model"])):
        actor = root / name / "global_step_5" / "actor"
        actor.mkdir(parents=True)
        for rank, content in ((r, c) for r in range(world) for c in contents):
            (actor / f"{content}_world_size_{world}_rank_{rank}.pt").touch()
        checkpoints[name] = str(actor.parent)
    signature = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    for name, value in returns.items():
        (root / f"{name}.py").write_text(f"{signature}    return {value}\n")
    return {**profiles, **checkpoints, **{name: str(root / f"{name}.py") for name in returns}, **_user_code(root),
            "data:full": str(full), "data:small": str(small), **{f"data:{n}": str(root / f"data-{n}") for n in truths},
            **{f"model:{k}": str(v) for k, v in variants.items()},
            "reward": str(reward), "reward_broken": str(broken), "not_parquet": str(not_parquet)}


def _user_code(root: Path) -> dict[str, str]:
    """A user's own code verl loads: a reward reading what verl adds to extra_info (0.9 reward_loop/reward_manager/
    naive.py:49-52), an agent-loop module registered through the profile's env (verl/__init__.py:49
    VERL_USE_EXTERNAL_MODULES) and agent-loop config files (agent_loop.py:534-539), one naming a class that is
    nowhere."""
    import yaml

    reward = root / "reward_turns.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    turns, earlier = extra_info['num_turns'], extra_info['rollout_reward_scores']\n"
                      "    correct = float(solution_str.strip().endswith(str(ground_truth)))\n"
                      "    return earlier.get('score', correct - 0.1 * max(0, turns - 2))\n")
    signatures = {"reward_no_extra_info": "def compute_score(data_source, solution_str, ground_truth):\n",
                  "reward_needs_scale": "def compute_score(data_source, solution_str, ground_truth, extra_info, *, "
                                        "scale):\n"}
    for name, signature in signatures.items():
        (root / f"{name}.py").write_text(f"{signature}    return float(str(ground_truth) in solution_str)\n")
    right = "float(str(ground_truth) in solution_str)"
    extras = {"reward_keys_vary": f"{{'score': {right}, 'acc': True}} if '####' in solution_str else {{'score': 0.0}}",
              "reward_extra_list": f"{{'score': {right}, 'steps': solution_str.split()}}",
              "reward_extra_text": f"{{'score': {right}, 'pred': solution_str[-20:]}}"}
    for name, value in extras.items():
        (root / f"{name}.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):"
                                         f"\n    return {value}\n")
    (root / "reward_score_string.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return {'score': '1.0'}\n")
    code = root / "user-code"
    code.mkdir()
    (code / "rehearsal_agents.py").write_text(
        "from verl.experimental.agent_loop.agent_loop import register\n"
        "from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop\n\n\n"
        "@register('my_single_turn')\nclass MySingleTurn(SingleTurnAgentLoop):\n    pass\n")
    single_turn = "verl.experimental.agent_loop.single_turn_agent_loop.SingleTurnAgentLoop"
    loops = {"agent_loops": [{"name": "my_config_loop", "_target_": single_turn}],
             "agent_loops_nowhere": [{"name": "my_lost_loop", "_target_": "my_agents.loops.LostLoop"}]}
    (code / "rehearsal_tools.py").write_text("from verl.tools.base_tool import BaseTool\n\n\n"
                                            "class Calculator(BaseTool):\n    pass\n")
    loops |= {"tools": {"tools": [{"class_name": "rehearsal_tools.Calculator", "config": {"type": "native"}}]},
              "tools_nowhere": {"tools": [{"class_name": "my_tools.calculator.Calculator",
                                           "config": {"type": "native"}}]}}
    for name, entries in loops.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump(entries))
    profile = yaml.safe_load((REPO / "src" / "verlflow" / "config" / "profiles" / "a3.yaml").read_text())
    profile.setdefault("env", {}).update({"VERL_USE_EXTERNAL_MODULES": "rehearsal_agents", "PYTHONPATH": str(code)})
    (root / "a3_agents.yaml").write_text(yaml.safe_dump(profile))
    return {"reward_turns": str(reward), "profile:a3_agents": str(root / "a3_agents.yaml"),
            **{name: str(root / f"{name}.py") for name in (*signatures, *extras, "reward_score_string")},
            **{name: str(root / f"{name}.yaml") for name in loops}}


def _profiles_with_verl(root: Path, version: str) -> dict[str, str]:
    """The A3 profile with its stack naming another verl (the cluster's verl that version-aware rules judge for)."""
    import yaml

    configs = REPO / "src" / "verlflow" / "config"
    stack = yaml.safe_load((configs / "stacks" / "a3.yaml").read_text())
    stack["packages"]["verl"]["version"] = version
    stack["name"] = f"a3_{version.replace('.', '')}"
    stack_file = root / f"{stack['name']}-stack.yaml"
    stack_file.write_text(yaml.safe_dump(stack))
    profile = yaml.safe_load((configs / "profiles" / "a3.yaml").read_text())
    profile["stack"] = str(stack_file)
    profile_file = root / f"{stack['name']}.yaml"
    profile_file.write_text(yaml.safe_dump(profile))
    return {f"profile:{stack['name']}": str(profile_file)}


def _drop_architectures(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.pop("architectures", None)
    (folder / "config.json").write_text(json.dumps(config))


def _drop_chat_template(folder: Path) -> None:
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))


def _drop_tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)


def run_rows(which: str, names: list[str], folders: dict[str, str], tmp: Path, uri: str,
             guide_verl: Path | None) -> dict:
    """The dry runs of the rows ``names`` on one verl (``guide_verl`` first on the path, or the installed newest)."""
    jobs = {}
    for name in names:
        row = ROWS[name]
        if row.expected(which)[0] == "skip":
            continue
        overrides = row.extra.get(which, row.overrides).format(**folders)
        jobs[name] = {"device": row.device, "overrides": overrides, "data": folders[f"data:{row.data}"],
                      "model": folders[f"model:{row.model}"],
                      "profile": folders[f"profile:{row.profile}"] if row.profile else "auto"}
    paths = [str(guide_verl)] if guide_verl else []
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": os.pathsep.join([*paths, str(REPO / "src")]),
           "HF_HOME": str(tmp / "hf")}
    env.pop("MLFLOW_RUN_ID", None)
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=1800, env=env, cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.rpartition("RESULT ")[2])
