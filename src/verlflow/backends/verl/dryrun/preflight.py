"""The checks a verl launch must pass before anything starts: every mistake found, one line each.

    verlflow train --device npu --dry_run true --overrides "actor_rollout_ref.rollout.name=vlm"

The dry run and the real launch both run :func:`launch_problems`; what it finds would otherwise surface on
the cluster only after Ray and the model have started. First verl's own start-up is rehearsed with the
installed verl's code (:mod:`verlflow.backends.verl.dryrun.rehearsal`): the names it resolves, its validation
and dataclasses, the model's config, the datasets, the reward, the resume branch. Then the rules below speak
for what the rehearsal cannot reach, or reaches only where the model and data are on this machine:

- sizes: whole numbers >= 1, and the divisions verl asserts for the profile's devices (``train_batch_size ×
  rollout.n`` by the devices, ``ppo_mini_batch_size × rollout.n`` at least one per data-parallel rank, the
  rollout's tensor parallel size dividing the devices per node);
- the model: a folder with ``config.json`` and a tokenizer, or a hub id (downloaded on the cluster, so the
  rehearsal skips what reads it); the data files exist and carry the columns verl reads;
- :mod:`.startup_checks` and :mod:`.startup_loads`: micro-batches, the engine's bounds, loss names, the
  strategy's packages, the devices Ray is asked for, the reward file, the warnings.

Each of these is a check registered in the ``launch`` group of :mod:`.checks` (below, in the order they run),
with what it needs; :func:`launch_problems` runs them and says which line wins when two name the same key.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from verlflow.backends.verl.dryrun import checks, rehearsal, startup_checks, startup_loads
from verlflow.backends.verl.dryrun.keys import ACTOR, ROLLOUT, value_of
from verlflow.backends.verl.dryrun.rehearsal.data_files import data_problems
from verlflow.backends.verl.dryrun.rehearsal.names import VerlNames, name_problems, verl_names
from verlflow.backends.verl.dryrun.rehearsal.versions import judge, legacy_reward_warnings, verl_versions, versions_note
from verlflow.config import Device, group_size_problems
from verlflow.errors import Problem

# ``org/name`` as the Hugging Face hub spells repository ids.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# Sections verl turns into its config dataclasses at start-up (their __post_init__ checks run there).
DATACLASS_SECTIONS = ("algorithm", ACTOR, ROLLOUT)


# Sizes that must be whole numbers >= 1 (None allowed where verl allows it: those with a False flag).
POSITIVE_SIZES = {
    "data.train_batch_size": True,
    "data.max_prompt_length": True,
    "data.max_response_length": True,
    f"{ROLLOUT}.n": True,
    f"{ROLLOUT}.tensor_model_parallel_size": True,
    f"{ACTOR}.ppo_mini_batch_size": True,
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": False,
    f"{ACTOR}.ppo_max_token_len_per_gpu": False,
    f"{ACTOR}.ulysses_sequence_parallel_size": False,
    # 0 splits a batch into micro-batches of nothing (workers/engine/utils.py:prepare_micro_batches, 0.5's split)
    f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu": False,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": False,
    # 0 workers: DataProto.chunk(0) / pad_dataproto_to_divisor(data, 0) (agent_loop.py, reward_loop.py)
    f"{ROLLOUT}.agent.num_workers": False,
    "reward.num_workers": False,
    "trainer.n_gpus_per_node": True,
    "trainer.nnodes": True,
    "trainer.total_epochs": True,
}


def size_problems(cfg: DictConfig) -> list[Problem]:
    """Sizes that are not whole numbers >= 1, and the divisibility verl asserts at start-up."""
    problems, sizes = [], {}
    for key, required in POSITIVE_SIZES.items():
        value = value_of(cfg, key)
        if value is None and not required:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(Problem(key, value, "must be a whole number >= 1"))
        else:
            sizes[key] = value
    get = sizes.get
    batch, n, mini = get("data.train_batch_size"), get(f"{ROLLOUT}.n"), get(f"{ACTOR}.ppo_mini_batch_size")
    per_node, nodes = get("trainer.n_gpus_per_node"), get("trainer.nnodes")
    sp = get(f"{ACTOR}.ulysses_sequence_parallel_size") or 1
    devices = per_node * nodes if per_node and nodes else None
    if batch and n and devices and (batch * n) % devices:
        problems.append(Problem("data.train_batch_size", batch, (
            f"train_batch_size × rollout.n = {batch} × {n} = {batch * n} responses must split evenly over the "
            f"{devices} devices (n_gpus_per_node × nnodes): make it a multiple of {devices // math.gcd(n, devices)}")))
    if batch and mini and mini > batch:
        problems.append(Problem(f"{ACTOR}.ppo_mini_batch_size", mini,
                                f"larger than data.train_batch_size={batch}: use at most {batch}"))
    if mini and n and devices and devices % sp == 0 and (mini * n) // (devices // sp) < 1:
        problems.append(Problem(f"{ACTOR}.ppo_mini_batch_size", mini, (
            f"ppo_mini_batch_size × rollout.n = {mini * n} gives no sample to some of the {devices // sp} "
            "data-parallel ranks: raise it or use fewer devices")))
    tp = get(f"{ROLLOUT}.tensor_model_parallel_size")
    if tp and per_node and per_node % tp:
        divisors = [d for d in range(1, per_node + 1) if per_node % d == 0]
        problems.append(Problem(f"{ROLLOUT}.tensor_model_parallel_size", tp,
                                f"must divide trainer.n_gpus_per_node={per_node}: use one of {divisors}"))
    return problems + group_size_problems(cfg)  # GRPO's group of rollout.n responses: 2 or more


def model_problems(path: Any) -> tuple[list[Problem], list[str]]:
    """A model that is not on this machine: a note when it is a hub id or remote, else a problem.

    A local folder is the rehearsal's (``stages.model_config`` says what it lacks, then verl reads it); a
    model that is not here is what the rehearsal cannot reach, and skips.
    """
    key = "actor_rollout_ref.model.path"
    text = str(path or "")
    if Path(text).expanduser().is_dir():
        return [], []
    if "://" in text:
        return [], [f"{key}={text} is remote: verl reads it on the cluster"]
    if HUB_ID.fullmatch(text) and not text.startswith((".", "~")):
        return [], [f"{key}={text} is a hub id: it will be downloaded on the cluster (no local folder here)"]
    return [Problem(key, text, "no such folder and not a hub id (org/name): pass -P model=<a Hugging Face "
                               "folder or hub id>")], []


@dataclass(frozen=True)
class Launch:
    """What the launch's checks read: the resolved config, whether its files are this machine's, the profile's
    device (``npu``/``gpu``: ``trainer.device`` must name it) and cluster image (``stack``)."""

    cfg: DictConfig
    check_files: bool = True
    device: Device | None = None
    stack: str = ""
    # The environment verl's processes start with (the user's modules they import, their PYTHONPATH).
    launch_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Found:
    """What one launch check found: problems, warnings and notes (a model to download, a stage not rehearsed)."""

    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


launch_check = functools.partial(checks.register, group="launch")


def _rule(name: str, needs: tuple[str, ...], function: Any) -> None:
    """Register a rule that reads only the config: ``function(cfg)`` returns problems (and warnings)."""

    def run(launch: Launch) -> Found:
        found = function(launch.cfg)
        return Found(*found) if isinstance(found, tuple) else Found(found)

    launch_check(name, needs=needs)(run)


REHEARSAL = "rehearsal.rehearse"


@launch_check(REHEARSAL, needs=("config", "verl", "devices", "cluster"))
def _rehearsal(launch: Launch) -> Found:
    found = rehearsal.rehearse(launch.cfg, stack=launch.stack, check_files=launch.check_files,
                               launch_env=launch.launch_env)
    return Found(found.problems, found.warnings, [f"not rehearsed: {what}" for what in found.skipped])


_rule("preflight.size_problems", ("config",), size_problems)
_rule("startup_checks.micro_batch_problems", ("config", "verl", "devices"), startup_checks.micro_batch_problems)
_rule("startup_checks.parallel_problems", ("config",), startup_checks.parallel_problems)
_rule("startup_checks.rollout_problems", ("config", "verl"), startup_checks.rollout_problems)
_rule("startup_checks.loss_problems", ("config", "verl"), startup_checks.loss_problems)
_rule("startup_loads.strategy_problems", ("config", "verl"), startup_loads.strategy_problems)


@launch_check("startup_loads.device_problems", needs=("config", "devices"))
def _device(launch: Launch) -> Found:
    return Found(startup_loads.device_problems(launch.cfg, launch.device))


@launch_check("preflight.model_problems", needs=("files",))
def _model(launch: Launch) -> Found:
    problems, notes = model_problems(value_of(launch.cfg, "actor_rollout_ref.model.path"))
    return Found(problems, notes=notes)


_rule("preflight.data_problems", ("files",), data_problems)
_rule("startup_loads.reward_problems", ("files",), startup_loads.reward_problems)
_rule("startup_loads.startup_warnings", ("config", "verl"), lambda cfg: ([], startup_loads.startup_warnings(cfg)))


def merged(problems: list[Problem], found: list[Problem]) -> list[Problem]:
    """``problems`` with the lines of ``found`` whose key no earlier check named: one line per key, the first
    check's (see :func:`launch_problems` for why the first)."""
    reported = {problem.key for problem in problems}
    return problems + [p for p in found if p.key not in reported]


def launch_problems(cfg: DictConfig, *, check_files: bool = True, device: Device | None = None,
                    stack: str = "", launch_env: dict[str, str] | None = None) -> tuple[list[Problem], list[str]]:
    """Every problem of a launch's resolved config, and notes (a model to download, warnings, what was skipped).

    Runs the checks registered in the ``launch`` group (:mod:`.checks`) in order: the rehearsal of verl's
    start-up first, then the rules for what it cannot reach. ``check_files=False`` leaves out the checks that
    need files (a stand-in launcher brings its own; a Ray job's files are the cluster's). Each line is then
    judged for the verl the cluster runs (:mod:`.versions`).

    **When two checks name the same key, the first one's line is kept** (:func:`merged`), so the rehearsal's
    wins over a rule's: it ran the installed verl's own code (its registries, validation, datasets, reward),
    and says what verl would say and where (``file:line``), where a rule restates verl's condition by hand and
    may drift from it. A rule still speaks for every key the rehearsal left alone: what it cannot reach here
    (the profile's devices and Ray, the cluster's files and image, a model that is not on this machine, whose
    model stages it skips), and a mistake it saw only in another form (under another key). Where a rule said a
    mistake more exactly, that knowledge is the rehearsal's now, so both give the same line: the valid names
    (:mod:`.rehearsal.names`), what a model folder lacks (``stages.model_config``), a data file's facts
    (:mod:`.rehearsal.data_files`).
    """
    launch = Launch(cfg, check_files, device, stack, dict(launch_env or {}))
    problems: list[Problem] = []
    warnings: list[str] = []
    notes: list[str] = []
    not_rehearsed: list[str] = []  # said after the rules' notes (a hub id to download says why first)
    for check in checks.registered("launch"):
        if "files" in check.needs and not check_files:
            continue
        found = check.run(launch)
        problems = merged(problems, found.problems)
        warnings += found.warnings
        (not_rehearsed if check.name == REHEARSAL else notes).extend(found.notes)
    versions = verl_versions(stack)
    problems, judged = judge(problems, versions)
    judged += legacy_reward_warnings(value_of(cfg, "custom_reward_function.path"), judged, versions)
    return problems, versions_note(versions) + notes + not_rehearsed + [f"warning: {w}" for w in judged + warnings]


__all__ = ["VerlNames", "verl_names", "name_problems", "size_problems", "model_problems", "data_problems",
           "launch_problems", "merged", "Launch", "Found"]
