"""The rollout side verl builds in its workers, looked up in verl's own registries before launch.

- the rollout class: ``workers/rollout/base.py:get_rollout_class(name, mode)`` asserts ``(name, mode)`` is in
  ``_ROLLOUT_REGISTRY`` when the worker builds its rollout (verl >= 0.7; 0.5 has no registry);
- the checkpoint engine: ``checkpoint_engine/base.py:CheckpointEngineRegistry.get(backend)`` raises
  ``ValueError`` for a backend no module registered (``workers/engine_workers.py`` builds it);
- the agent loop: its config file (``experimental/agent_loop/agent_loop.py:AgentLoopWorker`` loads it with
  ``OmegaConf.load``) and its workers: ``AgentLoopManager.generate_sequences`` splits each step's
  ``batch × n`` prompts with ``DataProto.chunk(num_workers)``, which asserts they divide;
- the tools: ``multi_turn.tool_config_path`` loaded and each tool class located (``tools/tool_registry.py``);
- the trace backend: ``utils/rollout_trace.py:RolloutTraceConfig.init`` imports ``weave`` / ``trackio``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verlflow.backends.verl.dryrun.keys import ROLLOUT
from verlflow.backends.verl.dryrun.rehearsal import machine, user_modules
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import message_of, value_of
from verlflow.compat import verl as compat_verl
from verlflow.errors import Problem

TRACE_PACKAGES = {"weave": "weave", "trackio": "trackio", "mlflow": "mlflow"}


def rollout_class_problems(cfg: DictConfig) -> list[Problem]:
    """``rollout.mode`` (with the engine's name) that verl's rollout registry does not hold."""
    registry = compat_verl.rollout_registry()
    name, mode = value_of(cfg, f"{ROLLOUT}.name"), value_of(cfg, f"{ROLLOUT}.mode")
    if not registry or mode is None:
        return []
    modes = sorted({m for n, m in registry if n == name})
    if not modes or (name, mode) in registry:  # an unknown engine is the name check's to report
        return []
    return [Problem(f"{ROLLOUT}.mode", mode, (
        f"verl builds its {name} rollout with get_rollout_class(name, mode) (workers/rollout/base.py), whose "
        f"registry holds only mode {' or '.join(modes)} for it: use {modes[0]} (or remove the key)"))]


def checkpoint_engine_problems(cfg: DictConfig, image_has: Any) -> tuple[list[Problem], list[str]]:
    """``rollout.checkpoint_engine.backend`` that no checkpoint-engine module registers (a warning when its
    module only failed to import here: the package may be on the cluster)."""
    key = f"{ROLLOUT}.checkpoint_engine.backend"
    backend = value_of(cfg, key)
    if backend is None:
        return [], []
    try:
        registry = importlib.import_module("verl.checkpoint_engine").CheckpointEngineRegistry
    except (ImportError, AttributeError):
        return [], []
    try:
        registry.get(backend)
    except ValueError as exc:
        registered, failed = compat_verl.checkpoint_engines(registry)
        unavailable = [module for module in failed if str(backend).lower() in module.lower()]
        if unavailable:
            return [], [f"{key}={backend}: its module {unavailable[0]} does not import on this machine "
                        f"({message_of(failed[unavailable[0]])[:120]}): not checked here"]
        names = ", ".join(registered)
        return [Problem(key, backend, f"no checkpoint engine of that name in verl's registry "
                                      f"(checkpoint_engine/base.py:CheckpointEngineRegistry.get): use one of {names}"
                                      if names else message_of(exc)[:300])], []
    return [], []


def agent_loop_problems(cfg: DictConfig, *, check_files: bool) -> list[Problem]:
    """The agent-loop config file verl loads, and agent workers that do not divide each step's prompts."""
    problems = []
    key = f"{ROLLOUT}.agent.agent_loop_config_path"
    path = value_of(cfg, key)
    if path and check_files and "://" not in str(path):
        file = Path(str(path)).expanduser()
        if not file.is_file():
            problems.append(Problem(key, path, "no such file: verl's agent-loop workers load it with OmegaConf.load "
                                               "(experimental/agent_loop/agent_loop.py): give an existing YAML file"))
        else:
            try:
                OmegaConf.load(file)
            except Exception as exc:  # YAML errors of every kind
                problems.append(Problem(key, path, f"verl cannot load it: {message_of(exc)[:200]}"))
    if value_of(cfg, f"{ROLLOUT}.mode") != "async":  # verl 0.5 runs its agent loop only in async mode
        return problems
    workers = value_of(cfg, f"{ROLLOUT}.agent.num_workers")
    batch = value_of(cfg, "data.gen_batch_size") or value_of(cfg, "data.train_batch_size")
    n = value_of(cfg, f"{ROLLOUT}.n")
    counts = (workers, batch, n, value_of(cfg, "trainer.n_gpus_per_node"), value_of(cfg, "trainer.nnodes"))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in counts) or \
            (batch * n) % (counts[3] * counts[4]):
        return problems  # a batch that does not split over the devices is the size checks' to report first
    if (batch * n) % workers:
        fits = [d for d in range(1, min(batch * n, 64) + 1) if (batch * n) % d == 0]
        problems.append(Problem(f"{ROLLOUT}.agent.num_workers", workers, (
            f"verl splits each step's {batch} × {n} = {batch * n} prompts over the agent-loop workers with "
            f"DataProto.chunk, which asserts they divide evenly (agent_loop.py:AgentLoopManager.generate_sequences): "
            f"use one of {', '.join(map(str, fits))}")))
    return problems


def tool_config_problems(cfg: DictConfig, *, check_files: bool, launch_env: dict[str, str]) -> list[Problem]:
    """``multi_turn.tool_config_path`` as verl's agent-loop workers load it (``agent_loop.py:527`` →
    ``tools/tool_registry.py:initialize_tools_from_config``): the file (``utils/import_utils.py:
    resolve_config_path``: absolute, the working folder, then verl's own tree), each tool's ``config.type`` (the
    ``ToolType`` enum) and its ``class_name`` (``get_tool_class``), located with the user's modules' path."""
    key = f"{ROLLOUT}.multi_turn.tool_config_path"
    path = value_of(cfg, key)
    if not path or not check_files or "://" in str(path):
        return []
    try:
        resolved = importlib.import_module("verl.utils.import_utils").resolve_config_path(str(path))
        tools = OmegaConf.load(resolved).tools
    except FileNotFoundError:
        return [Problem(key, path, "no such file (as absolute, under the working folder or verl's tree, "
                                   "utils/import_utils.py:resolve_config_path): verl's agent-loop workers load it at "
                                   "start-up (tools/tool_registry.py:initialize_tools_from_config): give an existing "
                                   "YAML file with a tools list")]
    except Exception as exc:  # YAML errors, no tools list, an old verl without the resolver
        return [Problem(key, path, f"verl cannot read a tools list from it ({type(exc).__name__}: "
                                   f"{message_of(exc)[:160]}; tools/tool_registry.py:initialize_tools_from_config)")]
    for tool in tools or []:
        kind = OmegaConf.select(tool, "config.type", default=None)
        if kind != "native":
            return [Problem(key, path, f"its tool {tool.get('class_name')} has config.type {kind}, and verl's "
                                       "ToolType has only native (tools/tool_registry.py): set config.type: native")]
        try:
            user_modules.locate(str(tool.get("class_name")), launch_env)
        except Exception as exc:  # ImportError, AttributeError, whatever the tool's module raises at import
            return [Problem(key, path, (
                f"its tool class {tool.get('class_name')} does not import here ({type(exc).__name__}: "
                f"{message_of(exc)[:120]}); verl's workers import it at start-up (tools/tool_registry.py:"
                "get_tool_class): give the class's full dotted path, importable on the nodes (the profile's "
                "PYTHONPATH)"))]
    return []


def trace_warnings(cfg: DictConfig, image_says: Any) -> list[str]:
    """A trace backend whose package verl imports (``RolloutTraceConfig.init``) and this machine lacks."""
    key = f"{ROLLOUT}.trace.backend"
    backend = value_of(cfg, key)
    package = TRACE_PACKAGES.get(str(backend))
    if package is None or machine.installed(package):
        return []
    return [f"{key}={backend}: verl imports {package} for it when the rollout starts (utils/rollout_trace.py:"
            f"RolloutTraceConfig.init), and {package} is not installed on this machine ({image_says(package)})"]


def problems(cfg: DictConfig, *, check_files: bool, image_says: Any,
             launch_env: dict[str, str] | None = None) -> tuple[list[Problem], list[str]]:
    """Every check of this module: problems and warnings."""
    engine_problems, engine_warnings = checkpoint_engine_problems(cfg, image_says)
    found = rollout_class_problems(cfg) + engine_problems + agent_loop_problems(cfg, check_files=check_files)
    found += tool_config_problems(cfg, check_files=check_files, launch_env=launch_env or {})
    return found, engine_warnings + trace_warnings(cfg, image_says)
