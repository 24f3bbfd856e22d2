"""What the local GRPO trainer reads from a composed verl config, checked before any work starts.

    python -c "from verlflow.config import compose; from verlflow.backends.local.settings import \
read_settings; print(read_settings(compose('smoke', 'cpu')).ignored)"

The local backend reads the same keys verl reads (``data.train_batch_size``,
``actor_rollout_ref.rollout.n``, ``actor_rollout_ref.actor.clip_ratio``, …). Keys it has no use for
(FSDP offload, vLLM memory settings, torch.compile, more than one device) are not silently dropped:
every such key the recipe, profile or user set to a non-default value is reported once
(:func:`ignored_keys`) and tagged on the run. Dynamic batching is approximated: a per-device token
budget becomes fixed micro-batches of ``budget // (max_prompt_length + max_response_length)``
sequences. Batch arithmetic that verl would reject on a cluster is rejected here too, in one line.
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verlflow.errors import VerlflowError
from verlflow.platforms import Device
from verlflow.util import first_line

ACTOR = "actor_rollout_ref.actor."
ROLLOUT = "actor_rollout_ref.rollout."
REF = "actor_rollout_ref.ref."
MODEL = "actor_rollout_ref.model."

# Keys (glob patterns on dotted names) the local trainer honours, or that do not change training
# (names, loggers). Anything else a recipe sets to a non-default value is reported as ignored.
SUPPORTED = (
    "data.train_files", "data.val_files", "data.train_batch_size", "data.val_batch_size",
    "data.max_prompt_length", "data.max_response_length", "data.filter_overlong_prompts",
    "data.truncation", "data.prompt_key", "data.reward_fn_key", "data.shuffle", "data.seed",
    "data.train_max_samples", "data.val_max_samples", "data.apply_chat_template_kwargs*",
    "data.return_raw_chat", "data.dataloader_num_workers", "data.filter_overlong_prompts_workers",
    f"{MODEL}path", f"{MODEL}tokenizer_path", f"{MODEL}enable_gradient_checkpointing",
    f"{MODEL}trust_remote_code", f"{MODEL}use_remove_padding", f"{MODEL}custom_chat_template",
    f"{ACTOR}ppo_mini_batch_size", f"{ACTOR}ppo_micro_batch_size", f"{ACTOR}ppo_micro_batch_size_per_gpu",
    f"{ACTOR}ppo_epochs", f"{ACTOR}clip_ratio", f"{ACTOR}clip_ratio_low", f"{ACTOR}clip_ratio_high",
    f"{ACTOR}clip_ratio_c", f"{ACTOR}loss_agg_mode", f"{ACTOR}loss_scale_factor", f"{ACTOR}entropy_coeff",
    f"{ACTOR}use_kl_loss", f"{ACTOR}kl_loss_coef", f"{ACTOR}kl_loss_type", f"{ACTOR}grad_clip",
    f"{ACTOR}policy_loss.loss_mode", f"{ACTOR}strategy", f"{ACTOR}optim.lr", f"{ACTOR}optim.weight_decay",
    f"{ACTOR}optim.betas", f"{ACTOR}optim.clip_grad", f"{ACTOR}optim.lr_warmup_steps",
    f"{ACTOR}optim.lr_warmup_steps_ratio", f"{ACTOR}optim.lr_scheduler_type", f"{ACTOR}optim.warmup_style",
    f"{ACTOR}optim.min_lr_ratio", f"{ACTOR}optim.num_cycles", f"{ACTOR}optim.optimizer",
    f"{ACTOR}optim.optimizer_impl", f"{ACTOR}optim.override_optimizer_config*",
    f"{ROLLOUT}n", f"{ROLLOUT}temperature", f"{ROLLOUT}top_p", f"{ROLLOUT}top_k", f"{ROLLOUT}do_sample",
    f"{ROLLOUT}seed", f"{ROLLOUT}prompt_length", f"{ROLLOUT}response_length", f"{ROLLOUT}val_kwargs.*",
    f"{ROLLOUT}log_prob_micro_batch_size", f"{ROLLOUT}log_prob_micro_batch_size_per_gpu",
    f"{ROLLOUT}calculate_log_probs",
    f"{REF}log_prob_micro_batch_size", f"{REF}log_prob_micro_batch_size_per_gpu",
    # Dynamic batching becomes fixed micro-batches of (token budget // max sequence length) sequences.
    f"{ACTOR}use_dynamic_bsz", f"{ACTOR}ppo_max_token_len_per_gpu", f"{ROLLOUT}log_prob_use_dynamic_bsz",
    f"{ROLLOUT}log_prob_max_token_len_per_gpu", f"{REF}log_prob_use_dynamic_bsz",
    f"{REF}log_prob_max_token_len_per_gpu",
    "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo", "algorithm.gamma", "algorithm.lam",
    # Only read by verl when use_kl_in_reward is on (it is not supported here, and reported when set).
    "algorithm.kl_ctrl.*", "algorithm.kl_penalty",
    "trainer.total_epochs", "trainer.total_training_steps", "trainer.test_freq", "trainer.save_freq",
    "trainer.resume_mode", "trainer.resume_from_path", "trainer.val_before_train", "trainer.default_local_dir",
    "trainer.max_actor_ckpt_to_keep", "trainer.device", "trainer.logger", "trainer.project_name",
    "trainer.experiment_name", "trainer.critic_warmup", "trainer.log_val_generations",
    "reward.custom_reward_function.*", "custom_reward_function.*",
)
# Supported only at these values: the local trainer runs one process on one device.
SINGLE_DEVICE = {"trainer.n_gpus_per_node": 1, "trainer.nnodes": 1}

# Why a key is ignored, by pattern; the first match wins.
REASONS = (
    ("*offload*", "no FSDP offload in the local trainer"),
    (f"{ROLLOUT}*", "transformers generates locally, not vLLM/SGLang"),
    ("*parallel_size*", "one device, no model parallelism"),
    ("trainer.n_gpus_per_node", "one device"),
    ("trainer.nnodes", "one device"),
    ("*fsdp_config*", "no FSDP in the local trainer"),
    ("*use_torch_compile*", "the local trainer runs eagerly"),
)




def _critic_free_estimator(resolved: Any) -> str:
    """The advantage estimator, refused when verl says it trains a critic (the local trainer has none)."""
    import warnings

    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.utils import need_critic

    adv = str(resolved.algorithm.adv_estimator)
    with warnings.catch_warnings():  # need_critic warns that a critic-free estimator disables the critic
        warnings.simplefilter("ignore")
        critic = need_critic(resolved)
    if critic:
        raise VerlflowError(f"algorithm.adv_estimator={adv} needs a critic, which the local trainer has not: "
                            "use a critic-free estimator such as grpo or rloo")
    try:
        core_algos.get_adv_estimator_fn(adv)
    except ValueError:
        raise VerlflowError(f"algorithm.adv_estimator={adv} is not an estimator of the installed verl: "
                            "use grpo or rloo") from None
    return adv

@dataclass
class LocalSettings:
    """Every value the local trainer uses, read once from the resolved config (names follow verl)."""

    # data.* — prompts per step, lengths, files.
    train_batch_size: int
    val_batch_size: int | None
    max_prompt_length: int
    max_response_length: int
    filter_overlong_prompts: bool
    truncation: str
    prompt_key: str
    reward_fn_key: str
    shuffle: bool
    data_seed: int
    train_max_samples: int
    val_max_samples: int
    chat_template_kwargs: dict[str, Any]
    train_files: str | None
    val_files: str | None
    # actor_rollout_ref.model.*
    model_path: str
    tokenizer_path: str | None
    gradient_checkpointing: bool
    trust_remote_code: bool
    # actor_rollout_ref.rollout.* — sampling for training and (val_kwargs) validation.
    n: int
    sampling: dict[str, Any]
    val_n: int
    val_sampling: dict[str, Any]
    rollout_seed: int
    log_prob_micro_batch: int
    ref_log_prob_micro_batch: int
    # actor_rollout_ref.actor.* — verl's own ActorConfig dataclass, handed to its policy-loss function.
    actor: Any
    ppo_mini_batch_size: int
    ppo_micro_batch_size: int
    grad_clip: float
    use_ref: bool
    # algorithm.*
    adv_estimator: str
    norm_adv_by_std_in_grpo: bool
    algorithm: Any
    # trainer.*
    total_epochs: int
    total_training_steps: int | None
    test_freq: int
    save_freq: int
    resume_mode: str
    resume_from_path: str | None
    val_before_train: bool
    default_local_dir: str
    max_ckpt_to_keep: int | None
    # The accelerator trainer.device names (cuda and gpu both mean Device.GPU).
    device: Device
    # Keys set to a non-default value that the local trainer does not use: dotted key → value.
    ignored: dict[str, Any] = field(default_factory=dict)


def read_settings(cfg: Any) -> LocalSettings:
    """Read and check the local trainer's settings from a ``ComposedConfig`` (one-line errors)."""
    resolved: DictConfig = cfg.resolved
    data, actor = resolved.data, resolved.actor_rollout_ref.actor
    rollout, trainer = resolved.actor_rollout_ref.rollout, resolved.trainer
    n = int(rollout.n)
    mini = int(actor.ppo_mini_batch_size)
    seq_len = int(data.max_prompt_length) + int(data.max_response_length)
    explicit = actor.ppo_micro_batch_size_per_gpu or actor.ppo_micro_batch_size
    micro = int(explicit or _fixed_micro(actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu, seq_len, mini * n))
    _check_batches(int(data.train_batch_size), mini, micro, n, int(actor.ppo_epochs))
    # Log-prob passes only chunk the batch: any size works, no divisibility needed.
    log_prob_micro = _log_prob_micro(rollout, seq_len, micro)
    ref_micro = _log_prob_micro(resolved.actor_rollout_ref.ref, seq_len, micro)
    adv = _critic_free_estimator(resolved)
    trainer_fields = _trainer_settings(trainer)
    overridden = cfg.overrides
    grad_clip = actor.optim.clip_grad if (
        f"{ACTOR}optim.clip_grad" in overridden and f"{ACTOR}grad_clip" not in overridden
    ) else actor.grad_clip
    val = rollout.val_kwargs
    return LocalSettings(
        **_data_settings(data, cfg.verlflow.val_limit),
        model_path=str(resolved.actor_rollout_ref.model.path),
        tokenizer_path=resolved.actor_rollout_ref.model.tokenizer_path,
        gradient_checkpointing=bool(resolved.actor_rollout_ref.model.enable_gradient_checkpointing),
        trust_remote_code=bool(resolved.actor_rollout_ref.model.trust_remote_code),
        n=n,
        sampling=_sampling(rollout),
        val_n=int(val.n),
        val_sampling=_sampling(val),
        rollout_seed=int(rollout.get("seed", 42)),
        log_prob_micro_batch=int(log_prob_micro),
        ref_log_prob_micro_batch=int(ref_micro),
        actor=_actor_config(actor, micro),
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size=micro,
        grad_clip=float(grad_clip),
        use_ref=bool(actor.use_kl_loss),
        adv_estimator=adv,
        norm_adv_by_std_in_grpo=bool(resolved.algorithm.norm_adv_by_std_in_grpo),
        algorithm=_dataclass(resolved.algorithm),
        **trainer_fields,
        ignored=ignored_keys(overridden, resolved),
    )


def _data_settings(data: DictConfig, val_limit: Any) -> dict[str, Any]:
    """The ``data.*`` fields of :class:`LocalSettings` (its files checked: one parquet file each)."""
    return dict(
        train_batch_size=int(data.train_batch_size),
        val_batch_size=int(data.val_batch_size) if data.val_batch_size else None,
        max_prompt_length=int(data.max_prompt_length),
        max_response_length=int(data.max_response_length),
        filter_overlong_prompts=bool(data.filter_overlong_prompts),
        truncation=str(data.truncation),
        prompt_key=str(data.prompt_key),
        reward_fn_key=str(data.reward_fn_key),
        shuffle=bool(data.shuffle),
        data_seed=int(data.seed) if data.get("seed") is not None else 1,
        train_max_samples=int(data.train_max_samples),
        val_max_samples=int(val_limit or data.val_max_samples),
        chat_template_kwargs=dict(data.get("apply_chat_template_kwargs") or {}),
        train_files=_one_file(data.train_files),
        val_files=_one_file(data.val_files),
    )


def _trainer_settings(trainer: DictConfig) -> dict[str, Any]:
    """The ``trainer.*`` fields of :class:`LocalSettings` (device and resume mode checked)."""
    device, resume_mode = _device_and_resume(trainer)
    return dict(
        total_epochs=int(trainer.total_epochs),
        total_training_steps=int(trainer.total_training_steps) if trainer.total_training_steps else None,
        test_freq=int(trainer.test_freq),
        save_freq=int(trainer.save_freq),
        resume_mode=resume_mode,
        resume_from_path=trainer.resume_from_path,
        val_before_train=bool(trainer.val_before_train),
        default_local_dir=str(trainer.default_local_dir),
        max_ckpt_to_keep=trainer.max_actor_ckpt_to_keep,
        device=device,
    )


def _log_prob_micro(role: Any, seq_len: int, micro: int) -> int:
    """Sequences per log-prob chunk of a rollout/ref role: its own size, its token budget, or the update's."""
    if role.log_prob_micro_batch_size_per_gpu:
        return int(role.log_prob_micro_batch_size_per_gpu)
    if role.log_prob_use_dynamic_bsz:
        return max(1, int(role.log_prob_max_token_len_per_gpu) // seq_len)
    return micro


def _device_and_resume(trainer: Any) -> tuple[Device, str]:
    """The device ``trainer.device`` names and a checked ``trainer.resume_mode``."""
    device = Device.of_torch(str(trainer.device))
    if device is None:
        raise VerlflowError(f"trainer.device={trainer.device} is unknown: use cpu, cuda or npu")
    resume_mode = str(trainer.resume_mode)
    if resume_mode not in ("auto", "disable", "resume_path"):
        raise VerlflowError(f"trainer.resume_mode={resume_mode} is unknown: use auto, disable or resume_path")
    if resume_mode == "resume_path" and not trainer.resume_from_path:
        raise VerlflowError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<global_step_N folder>")
    return device, resume_mode


def _check_batches(train_bs: int, mini: int, micro: int, n: int, epochs: int) -> None:
    """verl's batch arithmetic: prompts split into mini-batches, responses into micro-batches."""
    for name, value in (("data.train_batch_size", train_bs), (f"{ACTOR}ppo_mini_batch_size", mini),
                        (f"{ROLLOUT}n", n), (f"{ACTOR}ppo_epochs", epochs),
                        (f"{ACTOR}ppo_micro_batch_size_per_gpu", micro)):
        if value < 1:
            raise VerlflowError(f"{name}={value} must be a positive integer")
    if mini > train_bs or train_bs % mini:
        raise VerlflowError(
            f"data.train_batch_size={train_bs} must be a multiple of {ACTOR}ppo_mini_batch_size={mini} "
            f"(prompts per optimizer step), e.g. ppo_mini_batch_size={_divisor(train_bs, mini)}"
        )
    responses = mini * n
    if micro > responses or responses % micro:
        raise VerlflowError(
            f"{ACTOR}ppo_micro_batch_size_per_gpu={micro} must divide ppo_mini_batch_size x rollout.n = "
            f"{mini} x {n} = {responses} responses, e.g. {_divisor(responses, micro)}"
        )


def _fixed_micro(dynamic: bool, token_budget: int, seq_len: int, total: int) -> int:
    """verl's dynamic batching approximated by a fixed micro-batch: as many full-length sequences as
    the per-device token budget holds (a divisor of ``total``); without dynamic batching, ``total``."""
    if not dynamic:
        return total
    fit = max(1, int(token_budget) // seq_len)
    return max(d for d in range(1, min(fit, total) + 1) if total % d == 0)


def _divisor(total: int, near: int) -> int:
    """The divisor of ``total`` closest to ``near`` (for a suggestion in an error)."""
    return min((d for d in range(1, total + 1) if total % d == 0), key=lambda d: (abs(d - near), d))


def _one_file(files: Any) -> str | None:
    if files is None:
        return None
    if isinstance(files, str):
        return files
    items = list(files)
    return str(items[0]) if items else None


def _sampling(node: DictConfig) -> dict[str, Any]:
    """``generate`` keyword arguments from verl's sampling keys (temperature 0 or do_sample=False → greedy)."""
    temperature = float(node.temperature)
    if not node.get("do_sample", True) or temperature <= 0:
        return {"do_sample": False, "temperature": 1.0}
    kwargs = {"do_sample": True, "temperature": temperature, "top_p": float(node.top_p)}
    kwargs["top_k"] = int(node.top_k) if int(node.top_k) > 0 else 0
    return kwargs


def _actor_config(actor: DictConfig, micro: int) -> Any:
    """verl's ActorConfig dataclass for the actor node (what ``compute_policy_loss_*`` expects)."""
    node = OmegaConf.create(OmegaConf.to_container(actor, resolve=True))
    # verl insists on a micro-batch size unless dynamic batching is on; the local trainer always has one.
    node.use_dynamic_bsz = False
    node.ppo_micro_batch_size = None
    node.ppo_micro_batch_size_per_gpu = micro
    return _dataclass(node)


def _dataclass(node: DictConfig) -> Any:
    from verl.utils.config import omega_conf_to_dataclass

    try:
        return omega_conf_to_dataclass(node)
    except (ValueError, AssertionError, TypeError) as exc:
        raise VerlflowError(f"verl rejects the config: {first_line(exc)}") from None


@functools.lru_cache(maxsize=1)
def _verl_defaults() -> dict[str, Any]:
    from verlflow.config import flatten_tree, validate_against_verl

    return flatten_tree(OmegaConf.to_container(validate_against_verl({}), resolve=True))


def ignored_keys(overrides: dict[str, Any], resolved: DictConfig) -> dict[str, Any]:
    """Keys set (by recipe, profile or user) to a non-default value that the local trainer does not use."""
    defaults = _verl_defaults()
    ignored: dict[str, Any] = {}
    for key, value in overrides.items():
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in SUPPORTED):
            continue
        if key in SINGLE_DEVICE:
            if int(value) > SINGLE_DEVICE[key]:
                ignored[key] = value
            continue
        current = OmegaConf.select(resolved, key)
        current = OmegaConf.to_container(current) if OmegaConf.is_config(current) else current
        if current != defaults.get(key, object()):
            ignored[key] = current
    return ignored


def ignored_reason(key: str) -> str:
    """A few words on why the local trainer does not use ``key``."""
    for pattern, reason in REASONS:
        if fnmatch.fnmatchcase(key, pattern):
            return reason
    return "not used by the local trainer"
