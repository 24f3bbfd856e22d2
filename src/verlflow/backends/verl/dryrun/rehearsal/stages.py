"""The stages of verl's start-up that need no accelerator, each run with the installed verl's own code.

In the order verl reaches them (``main_ppo`` → ``TaskRunner.run`` → ``RayPPOTrainer``):

- :func:`worker_configs`: ``validate_config`` and every worker config dataclass verl converts the config to
  (``omega_conf_to_dataclass``: actor with its optimizer, checkpoint and profiler, the reference policy as the
  engine workers rename it, rollout with its sampling and checkpoint engine, the critic where one is used);
- :func:`model_config`: the model's ``HFModelConfig`` (its config and tokenizer, never the weights);
- :func:`start_up`: ``TaskRunner.run`` itself, up to the moment it starts Ray workers: the tokenizer, the
  reward managers (verl 0.5), the train and validation datasets with their overlong-prompt filter (an equal
  dataset built earlier in this process is reused, :mod:`.dataset_reuse`), the sampler,
  ``RayPPOTrainer.__init__`` and its dataloaders;
- :func:`reward_call`: the reward manager as verl loads it and one call of its scoring function on one real
  training row;
- :func:`.checkpoint.resume`: ``RayPPOTrainer._load_checkpoint``, the branch verl takes for ``resume_mode``
  and the folders that exist (the workers' loads are recorded, not run), and the checkpoint's world size;
- :func:`lookups`: names verl resolves later: the optimizer (``build_optimizer``), the rollout engine
  (its registry), the agent loop.

Each stage records what it found in its :class:`.state.Rehearsal`; a stage the installed verl does not have is skipped
and said so.
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from verlflow.backends.verl.dryrun.keys import ACTOR, MODEL, REF, ROLLOUT
from verlflow.backends.verl.dryrun.rehearsal import dataset_reuse, first_step, machine, names, user_modules
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import message_of, value_of
from verlflow.backends.verl.dryrun.rehearsal.state import Reached, Rehearsal, quiet
from verlflow.compat import verl as compat_verl
from verlflow.errors import Problem
from verlflow.models.checks import TOKENIZER_FILES

# Engine name → the package its rollout server imports (verl's ``workers/rollout/<name>_rollout``).
ENGINE_PACKAGES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm"}
# The reference policy's keys as verl >= 0.9's engine workers rename them onto the actor's fields.
REF_RENAMED = {"ppo_micro_batch_size_per_gpu": "log_prob_micro_batch_size_per_gpu",
               "ppo_micro_batch_size": "log_prob_micro_batch_size", "use_dynamic_bsz": "log_prob_use_dynamic_bsz",
               "ppo_max_token_len_per_gpu": "log_prob_max_token_len_per_gpu"}

def _verl_function(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def _need_reference(cfg: DictConfig) -> bool:
    need = _verl_function("verl.trainer.ppo.utils", "need_reference_policy")
    if need is not None:
        return bool(need(cfg))
    return bool(value_of(cfg, f"{ACTOR}.use_kl_loss")) or bool(value_of(cfg, "algorithm.use_kl_in_reward"))


def _need_critic(cfg: DictConfig) -> bool:
    need = _verl_function("verl.trainer.ppo.utils", "need_critic")
    if need is not None:
        return bool(need(cfg))
    return str(value_of(cfg, "algorithm.adv_estimator")) == "gae"


def worker_configs(rehearsal: Rehearsal) -> bool:
    """verl's ``validate_config`` and worker config dataclasses; True when all of them accept the config."""
    from verl.utils import config as verl_config

    cfg, ok = rehearsal.cfg, True
    validate = getattr(verl_config, "validate_config", None)
    if validate is None:
        rehearsal.findings.skipped.append("validate_config: not in this verl (it validates in RayPPOTrainer, "
                                          "rehearsed below)")
    else:
        # With LoRA on, validate_config's last check imports vLLM (get_vllm_max_lora_rank): everything before it
        # has passed when only that import fails, so the rest of the rehearsal still runs (vllm_args checks the rank).
        passed = rehearsal.attempt("validate_config", lambda: validate(
            config=cfg, use_reference_policy=_need_reference(cfg), use_critic=_need_critic(cfg)))[0]
        ok &= passed or rehearsal.machine_only
    # The sections verl itself converts (engine_workers.py, ray_trainer.py: omega_conf_to_dataclass calls).
    sections = [ACTOR, ROLLOUT]
    with quiet():
        if _need_critic(cfg):
            sections.append("critic")
        use_reference = _need_reference(cfg)
    for section in sections:
        node = OmegaConf.select(cfg, section)
        target = node.get("_target_") if isinstance(node, DictConfig) else None
        if isinstance(target, str) and target.startswith("verl."):
            ok &= rehearsal.attempt(section, lambda n=node: verl_config.omega_conf_to_dataclass(n),
                                    section=section)[0]
    if use_reference and isinstance(OmegaConf.select(cfg, f"{REF}._target_"), str):
        ok &= rehearsal.attempt(REF, lambda: verl_config.omega_conf_to_dataclass(_engine_ref(cfg)),
                                section=REF, renamed=REF_RENAMED)[0]
    return ok


def _engine_ref(cfg: DictConfig) -> DictConfig:
    """The reference policy's section as verl >= 0.9's engine workers rename it before converting it.

    ``workers/engine_workers.py:ActorRolloutRefWorker.init_model`` copies the actor's mini-batch size and maps
    the ``log_prob_*`` keys onto the actor's names; the conversion then runs the actor's checks on them.
    """
    ref = OmegaConf.create(OmegaConf.to_container(OmegaConf.select(cfg, REF), resolve=True))
    if "log_prob_micro_batch_size" not in ref:  # an older verl keeps the ref's own names
        return OmegaConf.select(cfg, REF)
    with open_dict(ref):
        ref.ppo_mini_batch_size = value_of(cfg, f"{ACTOR}.ppo_mini_batch_size")
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    return ref




def model_folder_problem(folder: str) -> Problem | None:
    """A model folder without ``config.json`` or any tokenizer file, said as such.

    verl fails on it in its own words (0.9 ``HFModelConfig``: transformers cannot build a tokenizer, or a
    chat-template error; 0.5 ``hf_tokenizer`` in the start-up, its workers for ``config.json``), which do not
    say what the folder lacks; this line does.
    """
    path = Path(folder)
    missing = [] if (path / "config.json").is_file() else ["config.json"]
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"a tokenizer file ({' or '.join(TOKENIZER_FILES)})")
    if not missing:
        return None
    return Problem(f"{MODEL}.path", folder, f"the folder lacks {' and '.join(missing)}: give a Hugging Face "
                                            "model folder (-P model=…)")


def model_config(rehearsal: Rehearsal) -> bool:
    """The model's ``HFModelConfig`` as verl >= 0.6 builds it (config and tokenizer); True when it builds.

    A folder that lacks the files verl reads is said first (:func:`model_folder_problem`), and nothing that
    reads the model is rehearsed then.
    """
    lacking = model_folder_problem(str(rehearsal.folder))
    if lacking is not None:
        rehearsal.findings.problems.append(lacking)
        return False
    hf_model_config = _verl_function("verl.workers.config", "HFModelConfig")
    if hf_model_config is None:
        rehearsal.findings.skipped.append("HFModelConfig: not in this verl (its tokenizer is loaded in the "
                                          "start-up, rehearsed below)")
        return True
    from verl.utils.config import omega_conf_to_dataclass

    ok, built = rehearsal.attempt("model", lambda: omega_conf_to_dataclass(OmegaConf.select(rehearsal.cfg, MODEL)),
                                  section=MODEL)
    if ok:
        rehearsal.tokenizer = getattr(built, "tokenizer", None)
    return ok


def start_up(rehearsal: Rehearsal) -> bool:
    """verl's ``TaskRunner.run`` up to its workers: datasets, sampler, trainer and dataloaders from the files."""
    if value_of(rehearsal.cfg, "trainer.use_v1"):
        rehearsal.findings.skipped.append("start-up: trainer.use_v1=True runs verl's v1 trainer, which verlflow "
                                          "does not rehearse")
        return True
    with quiet():
        runner_class, modules = compat_verl.task_runner()
    runner = runner_class.__new__(runner_class)
    runner_class.__init__(runner)
    copy = OmegaConf.create(OmegaConf.to_container(rehearsal.cfg, resolve=False))
    _without_vllm_lora_check(copy)
    with compat_verl.trainer_stopped_at_workers(modules, Reached), \
            compat_verl.datasets_built_by(modules, dataset_reuse.build):
        ok, trainer = rehearsal.attempt("start-up", lambda: runner_class.run(runner, copy))
    if trainer is not None:
        rehearsal.trainer = trainer
        rehearsal.tokenizer = rehearsal.tokenizer or getattr(trainer, "tokenizer", None)
        compat_verl.stop_dump_executor(trainer)
    return ok and trainer is not None


def _without_vllm_lora_check(cfg: DictConfig) -> None:
    """LoRA off in the start-up's copy when vLLM is not installed here.

    ``validate_config`` (which ``TaskRunner.run`` calls again) ends with ``get_vllm_max_lora_rank``, importing
    vLLM; the rank itself is checked by :func:`.vllm_args.lora_rank_problems`, and nothing the start-up builds
    (datasets, sampler, dataloaders, reward, resume branch) depends on LoRA.
    """
    if machine.installed("vllm") or str(value_of(cfg, f"{ROLLOUT}.name")) != "vllm":
        return
    with open_dict(cfg):
        for key in (f"{MODEL}.lora_rank", f"{MODEL}.lora.rank"):
            rank = value_of(cfg, key)
            if isinstance(rank, int) and rank > 0:
                OmegaConf.update(cfg, key, 0)


# Rows of the first batch turned into prompts when verl's overlong filter already guarantees their length.
SAMPLED_ROWS = 8


def first_batch(rehearsal: Rehearsal) -> None:
    """verl's dataset items of the first training batch, collated as the dataloader does (no worker processes).

    With ``data.filter_overlong_prompts`` off every row of the batch is built (``truncation=error`` raises on
    an overlong prompt there); with it on, a few rows, to prove the dataset turns rows into prompts at all.
    """
    trainer, cfg = rehearsal.trainer, rehearsal.cfg
    dataset = getattr(trainer, "train_dataset", None)
    collate = getattr(getattr(trainer, "train_dataloader", None), "collate_fn", None)
    if dataset is None or collate is None or len(dataset) == 0:
        return
    batch = value_of(cfg, "data.train_batch_size") or 1
    count = SAMPLED_ROWS if value_of(cfg, "data.filter_overlong_prompts") else batch
    rehearsal.attempt("start-up", lambda: collate([dataset[i] for i in range(min(count, len(dataset)))]))


def _first_row(trainer: Any) -> dict[str, Any] | None:
    dataset = getattr(trainer, "train_dataset", None)
    frame = getattr(dataset, "dataframe", None)
    if frame is None or len(frame) == 0:
        return None
    return dict(frame[0])


def reward_call(rehearsal: Rehearsal) -> None:
    """Load the reward as verl does and score one real training row with it (its kwargs, its data source)."""
    trainer, cfg = rehearsal.trainer, rehearsal.cfg
    row = _first_row(trainer)
    if row is None:
        return
    load = _verl_function("verl.trainer.ppo.reward", "load_reward_manager")
    manager = getattr(trainer, "reward_fn", None)  # verl 0.5 loads it in TaskRunner.run
    if any(problem.key in names.REWARD_MANAGER_KEYS for problem in rehearsal.findings.problems):
        return  # the names stage refused the manager: verl would fail loading it, said there with the valid names
    if manager is None and load is not None:
        ok, manager = rehearsal.attempt("reward", lambda: load(cfg, rehearsal.tokenizer))
        if not ok:
            return
    score = getattr(manager, "compute_score", None)
    if score is None:
        rehearsal.findings.skipped.append("reward call: this verl's reward manager has no compute_score to call")
        return
    truth = (row.get("reward_model") or {}).get("ground_truth", "")
    source = row.get(str(value_of(cfg, "data.reward_fn_key") or "data_source"))
    key = reward_function_key(cfg)
    results = []
    for solution in (f"#### {truth}", first_step.WRONG_ANSWER):  # a right and a wrong answer, as a group holds
        ok, result = _one_reward_call(rehearsal, score, dict(data_source=source, solution_str=solution,
                                                            ground_truth=truth,
                                                            extra_info=reward_extra_info(row, cfg, manager)), key)
        if not ok:
            return
        results.append(result)
    if key is None:
        rehearsal.add(first_step.ground_truth_problems(truth, source, cfg))
    else:
        rehearsal.add(*first_step.reward_extra_problems(results, key, cfg))


def _one_reward_call(rehearsal: Rehearsal, score: Any, arguments: dict[str, Any], key: str | None) -> tuple[bool, Any]:
    """One call of the scoring function as verl's reward manager makes it; False when it failed (said)."""
    cfg = rehearsal.cfg
    try:
        with quiet():
            result = score(**arguments)
            result = asyncio.run(result) if asyncio.iscoroutine(result) else result
    except Exception as exc:  # whatever the user's function or verl's wrapper raises
        raised = first_step.reward_raised_problem(exc, key, value_of(cfg, key)) if key else None
        raised = raised or (first_step.reward_signature_problem(exc, key, cfg) if key else None)
        if raised is not None:
            rehearsal.findings.problems.append(raised)
        else:
            rehearsal.record(exc, "reward")
        return False, None
    returned = first_step.reward_return_problem(result, key, value_of(cfg, key)) if key else None
    if returned is not None:
        rehearsal.findings.problems.append(returned)
        return False, None
    return True, result


# What the single-turn agent loop puts beside a rollout (0.9 ``experimental/agent_loop/single_turn_agent_loop.py``:
# ``num_turns=2``, ``extra_fields`` turn_scores / tool_rewards; ``agent_loop.py:_agent_loop_postprocess`` raw_prompt).
SINGLE_TURN = 2


def reward_extra_info(row: dict[str, Any], cfg: DictConfig, manager: Any) -> dict[str, Any]:
    """The ``extra_info`` verl's reward manager hands the scoring function for ``row``'s rollout.

    verl 0.9 (``experimental/reward_loop/reward_manager/naive.py:NaiveRewardManager.run_single``, the same in dapo,
    limited, gdpo, remote): the row's own extra_info, updated with the agent loop's ``tool_extra_fields``
    (raw_prompt, turn_scores, tool_rewards), then ``num_turns`` and ``rollout_reward_scores``. verl 0.5
    (``workers/reward_manager/naive.py:NaiveRewardManager.__call__``): the row's extra_info with ``num_turns``,
    which is None unless the async agent loop set ``__num_turns__``.
    """
    extra_info = dict(row.get("extra_info") or {})
    if type(manager).__module__.startswith("verl.experimental.reward_loop"):
        prompt = row.get(str(value_of(cfg, "data.prompt_key") or "prompt"))
        extra_info.update({"raw_prompt": prompt, "turn_scores": [], "tool_rewards": []})
        extra_info.update({"num_turns": SINGLE_TURN, "rollout_reward_scores": {}})
    else:
        extra_info["num_turns"] = SINGLE_TURN if value_of(cfg, f"{ROLLOUT}.mode") == "async" else None
    return extra_info


def reward_function_key(cfg: DictConfig) -> str | None:
    """The ``…custom_reward_function.path`` the installed verl loads the reward function from, if one is set."""
    reads_reward_section = OmegaConf.select(cfg, "reward.custom_reward_function") is not None  # verl 0.9
    section = "reward.custom_reward_function" if reads_reward_section else "custom_reward_function"
    return f"{section}.path" if value_of(cfg, f"{section}.path") else None


def first_step_calls(rehearsal: Rehearsal) -> None:
    """verl's advantage estimator and policy loss on a dummy batch of the configured shapes (:mod:`.first_step`).

    A field the dummy batch lacks (an estimator reading what this rehearsal does not build) is said, not blamed
    on the config.
    """
    cfg = rehearsal.cfg
    for stage, action in (("algorithm.adv_estimator", first_step.advantage),
                          (f"{ACTOR}.policy_loss.loss_mode", first_step.policy_loss)):
        try:
            with quiet():
                action(cfg)
        except KeyError as exc:
            rehearsal.findings.skipped.append(f"{stage}: verl reads {exc} from the batch, which the rehearsal's "
                                              "dummy batch does not hold")
        except Exception as exc:  # verl's asserts and ValueErrors, as at the first update
            rehearsal.record(exc, stage, section=ACTOR if "policy_loss" in stage else "algorithm")


def lookups(rehearsal: Rehearsal) -> None:
    """Names verl resolves after start-up: the optimizer, the rollout engine's package, the agent loop."""
    cfg = rehearsal.cfg
    build_optimizer = _verl_function("verl.workers.config.optimizer", "build_optimizer")
    if build_optimizer is not None and "engine.optimizer_problems" in rehearsal.passed:
        import torch
        from verl.utils.config import omega_conf_to_dataclass

        def optimizer() -> Any:
            optim = omega_conf_to_dataclass(OmegaConf.select(cfg, f"{ACTOR}.optim"))
            return build_optimizer(torch.nn.Linear(1, 1).parameters(), optim)

        rehearsal.attempt(f"{ACTOR}.optim", optimizer, section=f"{ACTOR}.optim")
    elif build_optimizer is None:
        rehearsal.findings.skipped.append("optimizer: this verl builds it inside the worker (torch.optim.AdamW)")
    engine = str(value_of(cfg, f"{ROLLOUT}.name"))
    package = ENGINE_PACKAGES.get(engine)
    if package and not machine.installed(package):
        if rehearsal.image_may_have(package):
            rehearsal.findings.warnings.append(
                f"{ROLLOUT}.name={engine}: {package} is not installed on this machine "
                f"({rehearsal.image_says(package)}): the engine's own argument checks use vLLM 0.9.1's recorded "
                "choices and bounds")
        else:
            rehearsal.findings.problems.append(Problem(f"{ROLLOUT}.name", engine, (
                f"verl's {engine} rollout imports {package}, which is neither installed here nor in the "
                f"{rehearsal.stack or 'profile'} image: use {_image_engines(rehearsal)} or install {package} on "
                "the nodes")))
    _agent_loop(rehearsal)


def _image_engines(rehearsal: Rehearsal) -> str:
    engines = [name for name, package in ENGINE_PACKAGES.items()
               if machine.image_has(package, rehearsal.stack_packages)]
    return " or ".join(engines) or "an engine the image has"


def _agent_loop(rehearsal: Rehearsal) -> None:
    """``rollout.agent.default_agent_loop`` must be a name the workers' agent-loop registry holds.

    The registry as verl's workers have it: verl's own loops, those the user's modules register when verl's
    processes import them (``VERL_USE_EXTERNAL_MODULES``, :mod:`.user_modules`), and those listed in
    ``agent.agent_loop_config_path`` (``AgentLoopWorker.__init__`` loads each ``name``; its ``_target_`` is
    instantiated at the first rollout, ``_run_agent_loop``).
    """
    key = f"{ROLLOUT}.agent.default_agent_loop"
    name = value_of(rehearsal.cfg, key)
    if name is None:
        return
    try:
        with quiet():
            registry_module = importlib.import_module("verl.experimental.agent_loop.agent_loop")
            importlib.import_module("verl.experimental.agent_loop")
    except Exception as exc:  # the agent-loop package imports the engines' clients
        rehearsal.record(exc, key)
        return
    with quiet():
        failed = user_modules.import_external(rehearsal.launch_env)
    registry = compat_verl.agent_loop_registry(registry_module)
    listed = _listed_agent_loops(rehearsal)
    if registry is None:
        rehearsal.findings.skipped.append("agent loop: this verl has no agent-loop registry")
    elif listed is None:
        return  # the config file could not be read: rollout_side said so on its own key
    elif name in listed:
        _agent_loop_target(rehearsal, str(name), listed[name])
    elif name not in registry:
        _unknown_agent_loop(rehearsal, key, name, sorted({*registry, *listed}), failed)


def _listed_agent_loops(rehearsal: Rehearsal) -> dict[str, Any] | None:
    """name → ``_target_`` of the agent loops ``agent.agent_loop_config_path`` lists (None: unreadable here)."""
    path = value_of(rehearsal.cfg, f"{ROLLOUT}.agent.agent_loop_config_path")
    if not path:
        return {}
    if not rehearsal.check_files or "://" in str(path):
        return None
    try:
        entries = OmegaConf.load(Path(str(path)).expanduser())
        return {str(entry.name): entry.get("_target_") for entry in entries}
    except Exception:  # missing or malformed: rollout_side.agent_loop_problems names the key
        return None


def _agent_loop_target(rehearsal: Rehearsal, name: str, target: Any) -> None:
    """The ``_target_`` of a listed agent loop, located as ``hydra.utils.instantiate`` locates it."""
    key = f"{ROLLOUT}.agent.agent_loop_config_path"
    try:
        with quiet():
            user_modules.locate(str(target), rehearsal.launch_env)
    except Exception as exc:  # ImportError, AttributeError, or whatever the user's module raises at import
        rehearsal.findings.problems.append(Problem(key, value_of(rehearsal.cfg, key), (
            f"its agent loop {name!r} has _target_ {target}, which does not import here ({type(exc).__name__}: "
            f"{message_of(exc)[:120]}); verl's workers instantiate it at the first rollout "
            "(experimental/agent_loop/agent_loop.py:_run_agent_loop, hydra.utils.instantiate): give the class's "
            "full dotted path, importable on the nodes (the profile's PYTHONPATH)")))


def _unknown_agent_loop(rehearsal: Rehearsal, key: str, name: Any, known: list[str], failed: dict[str, str]) -> None:
    """A name no registry holds: refused, unless a user's module that could register it did not import here."""
    if failed:
        module, why = next(iter(failed.items()))
        rehearsal.findings.warnings.append(
            f"{key}={name}: not in verl's agent-loop registry, and {user_modules.EXTERNAL_MODULES} names {module}, "
            f"which does not import here ({why}): not checked; verl's workers assert the name is registered "
            "(experimental/agent_loop/agent_loop.py:_run_agent_loop)")
        return
    rehearsal.findings.problems.append(Problem(key, name, (
        f"no agent loop of that name in verl's registry (experimental/agent_loop/agent_loop.py:_run_agent_loop "
        f"asserts it at the first rollout): use one of {', '.join(known)}, register yours with @register in a "
        f"module named in the profile's env {user_modules.EXTERNAL_MODULES}, or list it in "
        "agent.agent_loop_config_path")))
