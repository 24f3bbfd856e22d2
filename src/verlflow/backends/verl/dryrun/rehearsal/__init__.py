"""The dry run's rehearsal: verl's own start-up, on the resolved config, on any machine.

    verlflow train --device npu --dry_run true --overrides "data.max_prompt_length=64"

A list of rules cannot keep up with verl, so the dry run builds what verl builds before its first step,
with the installed verl's code (:mod:`.stages`): its config validation and worker config dataclasses, the
model's config and tokenizer, the datasets and dataloaders from the real files, the reward function called
on a real row, the resume branch, the optimizer and rollout lookups. What needs the devices is checked by
arithmetic from verl's source for the profile's world size (:mod:`.mesh`), and vLLM's arguments by vLLM's
own validators or its recorded choices (:mod:`.vllm_args`, :mod:`.vllm_engine`). The first step is called on a
dummy batch (:mod:`.first_step`: the reward's return, the advantage estimator, the policy loss), the rollout
side is looked up in verl's registries (:mod:`.rollout_side`), and a setting the cluster's verl (the profile's
stack) treats differently from the installed one is judged for the cluster's (:mod:`.versions`). Every exception
becomes one
``key=value: what is wrong: the fix`` line (:mod:`.raise_sites`); one caused by a package this machine lacks
but the cluster image has is a warning (:mod:`.machine`).

Each stage is a check registered in the ``rehearsal`` group of :mod:`verlflow.backends.verl.dryrun.checks`, in the
order verl reaches it: stages that load nothing heavy first, the model-dependent ones (one model config, one
model-on-meta build) after; a stage that needs the model's files runs only where they are, and one that follows
another (``after``) only when that one passed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from verlflow.backends.verl.dryrun import checks
from verlflow.backends.verl.dryrun.keys import MODEL
from verlflow.backends.verl.dryrun.rehearsal import (
    checkpoint,
    data_files,
    engine,
    first_step,
    mesh,
    names,
    rollout_side,
    stages,
    vllm_args,
    vllm_engine,
)
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import value_of
from verlflow.backends.verl.dryrun.rehearsal.state import Findings, Rehearsal, quiet
from verlflow.errors import Problem
from verlflow.util import environ_restored, first_line

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# What cannot be rehearsed without the model's files.
MODEL_STAGES = ("the model's config and tokenizer", "the datasets and dataloaders", "the reward call",
                "the resume branch", "the attention-head and length rules")


def stack_packages(stack: str) -> frozenset[str]:
    """The distributions the profile's cluster image lists (empty for a CPU profile or an unreadable stack)."""
    if not stack:
        return frozenset()
    from verlflow.device.stacks import load_stack

    try:
        return frozenset(load_stack(stack).packages)
    except Exception:  # an unreadable stack is doctor's to report; here it only means "image unknown"
        return frozenset()


def local_model_folder(path: object) -> str | None:
    """A local folder for the model: the path itself, or a hub id's snapshot in the local cache (no network)."""
    text = str(path or "")
    if text and Path(text).expanduser().is_dir():
        return str(Path(text).expanduser())
    if not HUB_ID.fullmatch(text):
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id=text, local_files_only=True)
    except Exception:  # not in the cache (huggingface_hub raises LocalEntryNotFoundError and friends)
        return None


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """No hub traffic while rehearsing: everything verl loads must already be here."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    with environ_restored(keys):
        os.environ.update({k: "1" for k in keys})
        yield


stage = functools.partial(checks.register, group="rehearsal")


@stage("names.name_problems", needs=("config", "verl"))
def _names(rehearsal: Rehearsal) -> None:
    rehearsal.add(names.name_problems(rehearsal.cfg))


@stage("stages.worker_configs", needs=("config", "verl"))
def _worker_configs(rehearsal: Rehearsal) -> bool:
    return stages.worker_configs(rehearsal)


@stage("first_step.config_problems", needs=("config", "verl"))
def _first_step_config(rehearsal: Rehearsal) -> None:
    rehearsal.add(first_step.config_problems(rehearsal.cfg, check_files=rehearsal.check_files))


@stage("rollout_side.problems", needs=("config", "verl", "cluster"))
def _rollout_side(rehearsal: Rehearsal) -> None:
    rehearsal.add(*rollout_side.problems(rehearsal.cfg, check_files=rehearsal.check_files,
                                         image_says=rehearsal.image_says, launch_env=rehearsal.launch_env))


@stage("stages.first_step_calls", needs=("config", "verl"), after=("stages.worker_configs",))
def _first_step_calls(rehearsal: Rehearsal) -> None:
    stages.first_step_calls(rehearsal)


@stage("stages.model_config", needs=("files", "verl"))
def _model_config(rehearsal: Rehearsal) -> bool:
    return stages.model_config(rehearsal)


@stage("mesh.device_problems", needs=("config", "devices"))
def _mesh(rehearsal: Rehearsal) -> None:
    from verlflow.backends.verl.dryrun.startup_checks import verl_traits

    rehearsal.add(mesh.device_problems(rehearsal.cfg, rehearsal.folder, engine_workers=verl_traits().engine_workers))


@stage("vllm_engine.engine_problems", needs=("config",))
def _vllm_engine(rehearsal: Rehearsal) -> None:
    rehearsal.add(vllm_engine.engine_problems(rehearsal.cfg, mesh.model_shape(rehearsal.folder)))


@stage("engine.dtype_problems", needs=("config", "verl"))
def _engine_dtype(rehearsal: Rehearsal) -> None:
    rehearsal.add(engine.dtype_problems(rehearsal.cfg))


@stage("engine.mesh_problems", needs=("config", "devices"))
def _engine_mesh(rehearsal: Rehearsal) -> None:
    rehearsal.add(engine.mesh_problems(rehearsal.cfg))


@stage("engine.scheduler_problems", needs=("config", "verl"))
def _engine_scheduler(rehearsal: Rehearsal) -> None:
    rehearsal.add(engine.scheduler_problems(rehearsal.cfg))


@stage("engine.model_problems", needs=("files", "verl", "cluster"), after=("stages.model_config",))
def _engine_on_meta(rehearsal: Rehearsal) -> None:
    """The actor's model, LoRA and wrap policy on the meta device (:mod:`.engine`); a build that fails for a
    reason of this rehearsal's own (a model class transformers here lacks) is said, not blamed on the config."""
    try:
        with quiet():
            problems, warnings = engine.model_problems(rehearsal.cfg, rehearsal.folder, rehearsal.image_may_have)
    except Exception as exc:  # transformers/peft raise many kinds for a model they cannot build here
        rehearsal.findings.skipped.append(f"the actor's engine on the meta device: {first_line(exc, 160)}")
        return
    rehearsal.add(problems, warnings)


@stage("vllm_args.engine_problems", needs=("config",))
def _vllm_args(rehearsal: Rehearsal) -> None:
    rehearsal.add(*vllm_args.engine_problems(rehearsal.cfg))


@stage("stages.start_up", needs=("files", "verl"), after=("stages.worker_configs", "stages.model_config"),
       unmet="the datasets, dataloaders, reward call and resume branch: not rehearsed until the problems above "
             "are fixed")
def _start_up(rehearsal: Rehearsal) -> bool:
    return stages.start_up(rehearsal) and rehearsal.trainer is not None


stage("stages.first_batch", needs=("files", "verl"), after=("stages.start_up",))(stages.first_batch)
stage("stages.reward_call", needs=("files", "verl"), after=("stages.start_up",))(stages.reward_call)
stage("checkpoint.resume", needs=("files", "verl", "devices"), after=("stages.start_up",))(checkpoint.resume)
@stage("engine.optimizer_problems", needs=("config", "verl"))
def _optimizer_arguments(rehearsal: Rehearsal) -> bool:
    problems = engine.optimizer_problems(rehearsal.cfg)
    rehearsal.add(problems)
    return not problems


stage("stages.lookups", needs=("config", "verl", "cluster"))(stages.lookups)


def _run(rehearsal: Rehearsal, check: checks.Check) -> None:
    """One registered stage: not where its files are missing, said where a stage it follows failed."""
    if "files" in check.needs and rehearsal.folder is None:
        return  # the skipped line of rehearse() names every stage that needs the model's files
    if any(name not in rehearsal.passed for name in check.after):
        if check.unmet:
            rehearsal.findings.skipped.append(check.unmet)
        return
    if check.run(rehearsal) is not False:
        rehearsal.passed.add(check.name)


def rehearse(resolved: DictConfig, *, stack: str = "", check_files: bool = True,
             launch_env: dict[str, str] | None = None) -> Findings:
    """Rehearse verl's start-up for ``resolved`` (see the module docstring) and return what it found.

    The stages are the checks registered in the ``rehearsal`` group, run in order on one :class:`Rehearsal`.
    ``stack`` is the profile's cluster image (which packages a warning may say the cluster has);
    ``check_files=False`` (a Ray job's paths are the cluster's) leaves out everything that reads the model
    or the data. ``launch_env`` is the environment verl's processes start with: the user's modules it names
    (``VERL_USE_EXTERNAL_MODULES``, ``PYTHONPATH``) are imported before verl's registries are asked.
    """
    cfg = OmegaConf.create(OmegaConf.to_container(resolved, resolve=False))
    label = Path(stack).stem if stack.endswith((".yaml", ".yml")) else stack  # a profile may name a stack file
    rehearsal = Rehearsal(cfg=cfg, stack=label, stack_packages=stack_packages(stack), check_files=check_files,
                          launch_env=dict(launch_env or {}))
    findings = rehearsal.findings
    folder = local_model_folder(value_of(cfg, f"{MODEL}.path")) if check_files else None
    if folder is not None:
        with open_dict(cfg):
            OmegaConf.update(cfg, f"{MODEL}.path", folder)
    elif check_files:
        findings.skipped.append(f"{MODEL}.path={value_of(resolved, f'{MODEL}.path')} is not on this machine "
                                f"(nor in its hub cache): not rehearsed: {', '.join(MODEL_STAGES)}")
    else:
        findings.skipped.append("the model and data are the cluster's (Ray job): not rehearsed: "
                                f"{', '.join(MODEL_STAGES)}")
    rehearsal.folder = folder
    with _offline():
        for check in checks.registered("rehearsal"):
            _run(rehearsal, check)
    findings.problems = first_per_key(findings.problems)
    if check_files:  # verl's own words on a data file name neither the column it lacks nor the fix
        findings.problems = data_files.exact_data_lines(findings.problems, cfg)
    return findings


def first_per_key(problems: list[Problem]) -> list[Problem]:
    """One line per key: the first stage to name a key speaks for it.

    The stages run in the order verl reaches them, so the first line for a key is where verl would stop; the
    names stage runs before all of them because it lists the valid names, which verl's own failure does not.
    """
    seen: set[str] = set()
    kept = []
    for problem in problems:
        if problem.key not in seen:
            seen.add(problem.key)
            kept.append(problem)
    return kept


__all__ = ["Findings", "rehearse", "first_per_key", "local_model_folder", "stack_packages"]
