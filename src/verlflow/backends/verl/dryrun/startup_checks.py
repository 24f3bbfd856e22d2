"""verl's config-only start-up failures, found before launch: batch sizes, rollout engine, loss names, reward file.

    verlflow train --device npu --dry_run true --overrides "actor_rollout_ref.actor.kl_loss_type=low_var_kll"

Each function below stands for rows of ``docs/preflight.md``: an ``assert`` or ``raise`` that verl (or the
vLLM engine it starts) reaches between ``main_ppo`` and the end of the first training step, decided by the
config, the installed packages or a file the config names alone. Where the installed verl has the check as
a function (``core_algos.kl_penalty``, ``get_policy_loss_fn``, ``get_kl_controller``,
``get_reward_manager_cls``) it is *called*; where it sits inside a worker's ``__init__`` or a training step
(verl 0.5.0's ``fsdp_workers`` batch normalisation, the vLLM engine's limits) it is checked the same way
here. What differs between verls is asked of the installed one (:func:`verl_traits`), never assumed.

Each function returns :class:`~verlflow.errors.Problem` lines; :func:`startup_warnings` returns legal but
suspicious values (a learning rate far from GRPO practice, greedy sampling of a GRPO group).
"""

from __future__ import annotations

import ast
import functools
import inspect
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from verlflow.backends.verl.dryrun.keys import ACTOR, REF, ROLLOUT, value_of
from verlflow.errors import Problem

# Learning rates GRPO fine-tuning of a pretrained LLM uses in practice (verl examples: 1e-7 … 1e-5).
GRPO_LR_RANGE = (1e-8, 1e-4)
# The strategies verl's main_ppo knows, and the package each needs beyond verl's own dependencies.
STRATEGY_PACKAGES = {"fsdp": None, "fsdp2": None, "megatron": "megatron.core"}
FSDP = ("fsdp", "fsdp2")


@dataclass(frozen=True)
class VerlTraits:
    """What the installed verl does differently at start-up (asked of its modules, not of a version list)."""

    version: str
    # verl >= 0.9 runs its model-engine workers (``workers/engine_workers.py``); 0.5 its ``fsdp_workers``.
    engine_workers: bool
    # The vLLM server raises max_num_batched_tokens to max_model_len itself when chunked prefill is off.
    raises_batched_tokens: bool


@functools.lru_cache(maxsize=1)
def verl_traits() -> VerlTraits:
    """The installed verl's :class:`VerlTraits`."""
    import verl

    # Files, not imports: the rollout packages import vLLM, absent where verlflow runs.
    root = Path(verl.__file__).parent
    server = root / "workers" / "rollout" / "vllm_rollout" / "vllm_async_server.py"
    raises = server.is_file() and "max_num_batched_tokens = self.config.max_model_len" in server.read_text()
    engine = not (root / "workers" / "fsdp_workers.py").is_file()
    return VerlTraits(version=str(verl.__version__), engine_workers=engine, raises_batched_tokens=raises)



def _count(cfg: DictConfig, key: str) -> int | None:
    """A size that is a whole number >= 1, else None (the size checks report the others)."""
    value = value_of(cfg, key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _uses_reference(cfg: DictConfig) -> bool:
    return bool(value_of(cfg, f"{ACTOR}.use_kl_loss")) or bool(value_of(cfg, "algorithm.use_kl_in_reward"))


def _data_parallel(cfg: DictConfig) -> int | None:
    """Data-parallel ranks of the actor: devices // ulysses_sequence_parallel_size (fsdp_workers' ``dp``)."""
    per_node, nodes = _count(cfg, "trainer.n_gpus_per_node"), _count(cfg, "trainer.nnodes")
    sp = _count(cfg, f"{ACTOR}.ulysses_sequence_parallel_size") or 1
    if not (per_node and nodes) or (per_node * nodes) % sp:
        return None
    return per_node * nodes // sp


def micro_batch_problems(cfg: DictConfig) -> list[Problem]:
    """Micro-batch sizes verl needs when ``use_dynamic_bsz=False``, and the divisions its workers assert.

    verl 0.5.0 ``RayPPOTrainer._validate_config`` (``check_mutually_exclusive``) and ``fsdp_workers``'
    normalisation; verl >= 0.6 ``ActorConfig.__post_init__`` / ``validate_config``; verl 0.9
    ``engine_workers`` and ``engine/utils.prepare_micro_batches``.
    """
    problems: list[Problem] = []
    traits = verl_traits()
    dynamic = bool(value_of(cfg, f"{ACTOR}.use_dynamic_bsz"))
    if traits.engine_workers and bool(value_of(cfg, f"{ROLLOUT}.log_prob_use_dynamic_bsz")) != dynamic:
        key = f"{ROLLOUT}.log_prob_use_dynamic_bsz"
        problems.append(Problem(key, value_of(cfg, key),
                                f"verl's workers need it equal to {ACTOR}.use_dynamic_bsz={dynamic}: set both alike"))
    problems += token_budget_problems(cfg)
    if dynamic:
        return problems
    sections = [(ACTOR, "ppo_micro_batch_size"), (ROLLOUT, "log_prob_micro_batch_size")]
    if _uses_reference(cfg):
        sections.append((REF, "log_prob_micro_batch_size"))
    for section, name in sections:
        total, per_gpu = value_of(cfg, f"{section}.{name}"), value_of(cfg, f"{section}.{name}_per_gpu")
        if total is None and per_gpu is None:
            problems.append(Problem(f"{section}.{name}_per_gpu", None, (
                f"{ACTOR}.use_dynamic_bsz=False needs a micro-batch size: set {section}.{name}_per_gpu "
                f"(or use_dynamic_bsz=True with a token budget)")))
        elif total is not None and per_gpu is not None:
            problems.append(Problem(f"{section}.{name}", total, (
                f"set together with {name}_per_gpu={per_gpu}: remove {section}.{name} (deprecated)")))
    if problems:
        return problems
    return problems + _division_problems(cfg, traits)


# The token budgets verl splits dynamic batches by: (budget key, its dynamic flag, the section whose Ulysses size
# multiplies it). 0.5 dp_actor.py:383 (update), :322 (log-prob, fsdp_workers.py:775 rollout, :821 ref);
# 0.9 engine/utils.py:111 (prepare_micro_batches: max_token_len_per_gpu × sp_size).
TOKEN_BUDGETS = ((f"{ACTOR}.ppo_max_token_len_per_gpu", f"{ACTOR}.use_dynamic_bsz", ACTOR),
                 (f"{ROLLOUT}.log_prob_max_token_len_per_gpu", f"{ROLLOUT}.log_prob_use_dynamic_bsz", ACTOR),
                 (f"{REF}.log_prob_max_token_len_per_gpu", f"{REF}.log_prob_use_dynamic_bsz", REF))
# Said in every too-small budget's line; rehearsal/versions.py judges those lines for the image's verl.
PADDED = "verl 0.5.0 pads every sequence to that length"


def token_budget_problems(cfg: DictConfig) -> list[Problem]:
    """Per-device token budgets of dynamic batches that cannot hold one full prompt + response.

    ``utils/seqlen_balancing.py:rearrange_micro_batches`` asserts ``max_token_len >= max_seq_len`` with
    ``max_token_len = budget × ulysses_sequence_parallel_size``. verl 0.5.0 pads every sequence to
    ``max_prompt_length + max_response_length`` (``attention_mask.shape[-1]``, ``:276``), so a smaller budget fails
    at the first update; 0.9.1 packs sequences first (``ray_trainer.py:1255 left_right_2_no_padding``) and fails
    only on a batch holding a sequence that long (``:384``), judged as a warning by :mod:`.rehearsal.versions`.
    A budget of null fails on both (``None × sp``).
    """
    prompt, response = _count(cfg, "data.max_prompt_length"), _count(cfg, "data.max_response_length")
    problems = []
    for key, flag, section in TOKEN_BUDGETS:
        if not value_of(cfg, flag) or (section == REF and not _uses_reference(cfg)):
            continue
        budget, sp = value_of(cfg, key), _count(cfg, f"{section}.ulysses_sequence_parallel_size") or 1
        if budget is None:
            problems.append(Problem(key, None, f"{flag.rpartition('.')[2]}=True splits batches by this budget "
                                               "per device (rearrange_micro_batches multiplies it): set it "
                                               f"(>= max_prompt_length + max_response_length = {prompt + response})"))
        elif isinstance(budget, int) and prompt and response and budget * sp < prompt + response:
            need = -(-(prompt + response) // sp)
            problems.append(Problem(key, budget, (
                f"{budget} × ulysses_sequence_parallel_size {sp} is below max_prompt_length + max_response_length = "
                f"{prompt + response}, and {PADDED}, so rearrange_micro_batches asserts max_token_len >= it at the "
                f"first {'update' if section == ACTOR and 'ppo' in key else 'log-prob pass'} "
                f"(utils/seqlen_balancing.py:277): use >= {need}")))
    return problems


def _division_problems(cfg: DictConfig, traits: VerlTraits) -> list[Problem]:
    """Per-device mini-batches that micro-batches do not divide (fsdp_workers' normalised sizes)."""
    problems: list[Problem] = []
    dp, n = _data_parallel(cfg), _count(cfg, f"{ROLLOUT}.n")
    mini, batch = _count(cfg, f"{ACTOR}.ppo_mini_batch_size"), _count(cfg, "data.train_batch_size")
    if not (dp and n and mini and batch):
        return problems
    devices = (_count(cfg, "trainer.n_gpus_per_node") or 1) * (_count(cfg, "trainer.nnodes") or 1)
    sp = _count(cfg, f"{ACTOR}.ulysses_sequence_parallel_size") or 1
    total_micro = _count(cfg, f"{ACTOR}.ppo_micro_batch_size")
    if total_micro is not None:
        if mini % total_micro:
            problems.append(Problem(f"{ACTOR}.ppo_micro_batch_size", total_micro,
                                    f"must divide ppo_mini_batch_size={mini}"))
        if total_micro * sp < devices:
            problems.append(Problem(f"{ACTOR}.ppo_micro_batch_size", total_micro,
                                    f"× ulysses_sequence_parallel_size={sp} must be >= the {devices} devices"))
    per_device = mini * n // dp
    micro = _count(cfg, f"{ACTOR}.ppo_micro_batch_size_per_gpu")
    if micro is None and total_micro is not None:
        micro = total_micro // dp or None
    if micro and (per_device % micro or per_device < micro):
        fits = [d for d in range(1, per_device + 1) if per_device % d == 0]
        problems.append(Problem(f"{ACTOR}.ppo_micro_batch_size_per_gpu", micro, (
            f"must divide the per-device mini-batch ppo_mini_batch_size × rollout.n / {dp} ranks = {mini} × {n} / "
            f"{dp} = {per_device}: use one of {_some(fits)}")))
    if traits.engine_workers:
        per_device_batch = batch * n // dp
        keys = [f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"]
        if _uses_reference(cfg):
            keys.append(f"{REF}.log_prob_micro_batch_size_per_gpu")
        for key in keys:
            size = _count(cfg, key)
            if size and per_device_batch % size:
                fits = [d for d in range(1, per_device_batch + 1) if per_device_batch % d == 0]
                problems.append(Problem(key, size, (
                    f"must divide the per-device batch train_batch_size × rollout.n / {dp} ranks = "
                    f"{per_device_batch}: use one of {_some(fits)}")))
    return problems


def _some(values: list[int]) -> str:
    return ", ".join(map(str, values if len(values) <= 12 else values[:6] + ["…"] + values[-3:]))


def parallel_problems(cfg: DictConfig) -> list[Problem]:
    """Sequence parallelism without ``use_remove_padding`` (0.5.0 ``_validate_config``, >= 0.6 FSDPActorConfig)."""
    sp = max(_count(cfg, f"{ACTOR}.ulysses_sequence_parallel_size") or 1,
             _count(cfg, f"{REF}.ulysses_sequence_parallel_size") or 1)
    key = "actor_rollout_ref.model.use_remove_padding"
    if sp > 1 and str(value_of(cfg, f"{ACTOR}.strategy")) in FSDP and not value_of(cfg, key):
        return [Problem(key, value_of(cfg, key), f"ulysses_sequence_parallel_size={sp} needs it: set it True")]
    return []


def rollout_problems(cfg: DictConfig) -> tuple[list[Problem], list[str]]:
    """The vLLM/SGLang engine's limits the rollout's init hits, and sampling verl refuses; plus warnings.

    ``gpu_memory_utilization`` in (0, 1] (vLLM ``CacheConfig``, SGLang ``mem_fraction_static``);
    ``max_model_len >= max_prompt_length + max_response_length`` (a full prompt leaves no room to generate);
    with chunked prefill off, ``max_num_batched_tokens >= max_model_len`` (vLLM ``SchedulerConfig``; verl
    0.9's server raises it itself, a warning there); ``val_kwargs.do_sample`` needs ``temperature > 0``.
    """
    problems: list[Problem] = []
    warnings: list[str] = []
    key = f"{ROLLOUT}.gpu_memory_utilization"
    share = value_of(cfg, key)
    if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1):
        problems.append(Problem(key, share, "the share of device memory the engine may take must be in (0, 1]: "
                                            "the guide uses 0.9"))
    prompt, response = _count(cfg, "data.max_prompt_length"), _count(cfg, "data.max_response_length")
    longest = prompt + response if prompt and response else None
    max_len = value_of(cfg, f"{ROLLOUT}.max_model_len")
    if isinstance(max_len, int) and longest and max_len < longest:
        problems.append(Problem(f"{ROLLOUT}.max_model_len", max_len, (
            f"shorter than max_prompt_length + max_response_length = {prompt} + {response} = {longest}: the "
            f"engine cannot finish a full-length prompt; raise it to >= {longest} or leave it unset (null)")))
    engine_len = max_len if isinstance(max_len, int) else longest
    batched = value_of(cfg, f"{ROLLOUT}.max_num_batched_tokens")
    chunked = bool(value_of(cfg, f"{ROLLOUT}.enable_chunked_prefill"))
    if isinstance(batched, int) and engine_len and not chunked and batched < engine_len:
        line = Problem(f"{ROLLOUT}.max_num_batched_tokens", batched, (
            f"smaller than max_model_len={engine_len} with enable_chunked_prefill=False: vLLM refuses it; "
            f"raise it to >= {engine_len} or enable chunked prefill"))
        if verl_traits().raises_batched_tokens:
            warnings.append(f"{line.line().split(': vLLM')[0]}: verl {verl_traits().version} raises it to "
                            f"{engine_len} itself")
        else:
            problems.append(line)
    temperature = value_of(cfg, f"{ROLLOUT}.temperature")
    if value_of(cfg, f"{ROLLOUT}.val_kwargs.do_sample") and isinstance(temperature, (int, float)) and temperature <= 0:
        problems.append(Problem(f"{ROLLOUT}.temperature", temperature,
                                "val_kwargs.do_sample=True needs temperature > 0: raise it or set do_sample=False"))
    return problems, warnings


def compared_strings(func, name: str) -> tuple[str, ...]:
    """The string literals ``func`` compares its argument ``name`` against (its accepted modes)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(func).lstrip())):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == name:
            for comparator in node.comparators:
                found |= {n.value for n in ast.walk(comparator)
                          if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return tuple(sorted(found))


def _kl_names(core_algos) -> tuple[str, ...]:
    """The KL estimator names the installed verl's ``kl_penalty`` computes (its compared strings, tried)."""
    import torch


    func = getattr(core_algos, "kl_penalty_forward", core_algos.kl_penalty)
    zeros = torch.zeros(1)
    return tuple(n for n in compared_strings(func, "kl_penalty") if _computes(core_algos, n, zeros))


def _computes(core_algos, name: str, zeros) -> bool:
    try:
        core_algos.kl_penalty(zeros, zeros, name)
    except NotImplementedError:
        return False
    return True


def loss_problems(cfg: DictConfig) -> list[Problem]:
    """KL estimator, KL controller and policy-loss names, asked of the installed verl's ``core_algos``.

    verl raises these only at the first actor update or reward computation (``NotImplementedError`` from
    ``kl_penalty``, ``ValueError`` from ``get_policy_loss_fn``), after a whole rollout.
    """
    import torch
    from verl.trainer.ppo import core_algos

    problems: list[Problem] = []
    zeros = torch.zeros(1)
    kl_keys = []
    if value_of(cfg, f"{ACTOR}.use_kl_loss"):
        kl_keys.append(f"{ACTOR}.kl_loss_type")
    if value_of(cfg, "algorithm.use_kl_in_reward"):
        kl_keys.append("algorithm.kl_penalty")
    for key in kl_keys:
        name = value_of(cfg, key)
        if not isinstance(name, str) or not _computes(core_algos, name, zeros):
            problems.append(Problem(key, name, f"unknown KL estimator for the installed verl's kl_penalty: use one "
                                               f"of {', '.join(_kl_names(core_algos))}"))
    if value_of(cfg, "algorithm.use_kl_in_reward"):
        kl_ctrl = OmegaConf.select(cfg, "algorithm.kl_ctrl")
        try:
            core_algos.get_kl_controller(kl_ctrl)
        except (NotImplementedError, AssertionError, ValueError) as exc:
            problems.append(Problem("algorithm.kl_ctrl.type", value_of(cfg, "algorithm.kl_ctrl.type"),
                                    f"verl's get_kl_controller refuses it ({str(exc) or 'unknown type'}): use fixed, "
                                    "or adaptive with horizon > 0"))
    mode = value_of(cfg, f"{ACTOR}.policy_loss.loss_mode", "vanilla")
    registry = getattr(core_algos, "POLICY_LOSS_REGISTRY", {})
    if mode != "vanilla" or "vanilla" in registry:  # 0.5.0 computes vanilla itself, outside the registry
        try:
            core_algos.get_policy_loss_fn(mode)
        except (ValueError, KeyError):
            valid = sorted({"vanilla", *registry})
            problems.append(Problem(f"{ACTOR}.policy_loss.loss_mode", mode,
                                    f"unknown policy loss for the installed verl: use one of {', '.join(valid)}"))
    clip_c = value_of(cfg, f"{ACTOR}.clip_ratio_c")
    if mode == "vanilla" and isinstance(clip_c, (int, float)) and not clip_c > 1:
        problems.append(Problem(f"{ACTOR}.clip_ratio_c", clip_c, "dual-clip PPO's lower bound must be > 1 "
                                                                 "(verl's compute_policy_loss asserts it): use 3.0"))
    return problems
