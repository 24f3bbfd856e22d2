"""What verl imports and loads at start-up, checked before launch: strategy packages, device, reward function.

    verlflow train --device npu --dry_run true --overrides "custom_reward_function.path=/nope.py"

Rows of ``docs/preflight.md`` that depend on the installed packages or on a file the config names:

- ``actor.strategy``: ``main_ppo`` imports the FSDP or Megatron workers (``megatron`` needs ``megatron.core``);
  verl 0.5.0 asserts the critic's strategy matches; another name is ``NotImplementedError``.
- ``trainer.device``: verl asks Ray for the devices this names (0.5.0 ``RayPPOTrainer.device_name``): it
  must be the profile's (``npu`` on A3, ``cuda`` on H20).
- ``custom_reward_function.path`` / ``.name``: verl loads the file and reads the function from it
  (0.5.0 ``reward.get_custom_reward_fn``, 0.9 ``import_utils.load_extern_object``): the file must exist,
  parse, and define the name. The file is read here, never executed.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from verlflow.backends.verl.dryrun.keys import ACTOR, REF, ROLLOUT, value_of
from verlflow.backends.verl.dryrun.startup_checks import FSDP, GRPO_LR_RANGE, STRATEGY_PACKAGES, _uses_reference
from verlflow.config import Device
from verlflow.errors import Problem
from verlflow.util import first_line

# verl's load_module: ``pkg://a.b`` is a module, ``file://x.py`` or a bare path a file.
PKG_PREFIX, FILE_PREFIX = "pkg://", "file://"
# Where each verl keeps the reward function's file and name (0.9 reads ``reward.*``, copying the top level there).
REWARD_FUNCTION_SECTIONS = ("custom_reward_function", "reward.custom_reward_function")



def strategy_problems(cfg: DictConfig) -> list[Problem]:
    """A training strategy verl does not know, or whose package is not installed (``main_ppo``'s imports)."""
    problems = []
    strategy = str(value_of(cfg, f"{ACTOR}.strategy"))
    if strategy not in STRATEGY_PACKAGES:
        return [Problem(f"{ACTOR}.strategy", strategy, f"unknown to verl's main_ppo: use one of "
                                                       f"{', '.join(STRATEGY_PACKAGES)}")]
    package = STRATEGY_PACKAGES[strategy]
    if package and not _importable(package):
        problems.append(Problem(f"{ACTOR}.strategy", strategy, (
            f"verl imports {package} for it and it is not installed here: use fsdp (the guide's) or install "
            "Megatron-LM in this environment")))
    problems += reference_strategy_problems(cfg, strategy)
    critic = value_of(cfg, "critic.strategy")
    uses_critic = str(value_of(cfg, "algorithm.adv_estimator")) == "gae"
    if critic is not None and (uses_critic or _has_fsdp_workers()) and \
            (strategy in FSDP) != (str(critic) in FSDP):
        problems.append(Problem("critic.strategy", critic, f"must be of the actor's family "
                                                           f"(actor_rollout_ref.actor.strategy={strategy})"))
    return problems


def reference_strategy_problems(cfg: DictConfig, actor_strategy: str) -> list[Problem]:
    """``ref.strategy`` no engine is registered for: verl 0.9.1's reference worker builds its engine with it
    (``workers/config/actor.py:325`` copies it to the engine config, ``workers/engine/base.py:401`` asserts the
    backend); verl 0.5.0 never reads it (the reference is built with the actor's strategy, ``fsdp_workers.py:369``),
    which :mod:`.rehearsal.versions` says for a 0.5.0 image."""
    key = f"{REF}.strategy"
    strategy = value_of(cfg, key)
    if strategy is None or str(strategy) in STRATEGY_PACKAGES or not _uses_reference(cfg):
        return []
    return [Problem(key, strategy, (
        f"verl 0.9.1's reference worker builds its engine for this strategy and its engine registry has none of "
        f"that name (workers/engine/base.py:401): use {actor_strategy} (the actor's), one of "
        f"{', '.join(STRATEGY_PACKAGES)}, or remove the key (it follows actor.strategy)"))]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package
        return False


def _has_fsdp_workers() -> bool:
    """verl 0.5's main_ppo asserts the critic's strategy whatever the estimator."""
    from verlflow.backends.verl.dryrun.startup_checks import verl_traits

    return not verl_traits().engine_workers


def device_problems(cfg: DictConfig, device: Device | None) -> list[Problem]:
    """``trainer.device`` that is not the profile's device (Ray would wait for devices the node lacks)."""
    # verl's Ray resources and torch need the accelerator's torch name (cuda, npu); a CPU launch is not checked.
    want = Device(device).torch_type if device is not None and Device(device).is_accelerator else None
    got = value_of(cfg, "trainer.device")
    if want and got != want:
        return [Problem("trainer.device", got, f"the profile runs on {Device(device).short_word} devices: use "
                                               f"trainer.device={want} (or the profile for that device)")]
    return []


def reward_problems(cfg: DictConfig) -> list[Problem]:
    """The custom reward function's file and name, as verl loads them (the file is parsed, never run)."""
    problems = []
    for section in REWARD_FUNCTION_SECTIONS:
        path = value_of(cfg, f"{section}.path")
        if path:
            name = value_of(cfg, f"{section}.name") or "compute_score"
            problems += reward_function_problems(str(path), str(name), section)
    return problems


def reward_function_problems(path: str, name: str, section: str) -> list[Problem]:
    """A reward function file that is missing, does not parse, or does not define ``name``."""
    if path.startswith(PKG_PREFIX):
        module = path.removeprefix(PKG_PREFIX).replace("/", ".")
        if not _importable(module):
            return [Problem(f"{section}.path", path, f"no module {module} is importable here: check the name")]
        return []
    file = Path(path.removeprefix(FILE_PREFIX)).expanduser()
    if not file.is_file():
        return [Problem(f"{section}.path", path, "no such file: give the path of the .py file that defines "
                                                  f"the reward function ({section}.name={name})")]
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (SyntaxError, ValueError) as exc:
        return [Problem(f"{section}.path", path, f"verl cannot load it: {first_line(exc, 160)}")]
    if name not in _top_level_names(tree):
        found = sorted(n for n in _top_level_names(tree) if not n.startswith("_"))
        hint = f": it defines {', '.join(found[:8])}" if found else ""
        return [Problem(f"{section}.name", name, f"{path} defines no '{name}'{hint}")]
    return []


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module defines at its top level: functions, classes, assignments, imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


# GRPO_LR_RANGE is what fine-tuning pretrained LLMs uses; all of them are at least this wide (Qwen3-0.6B: 1024).
PRACTICE_HIDDEN_SIZE = 1024


def grpo_lr_range(model_path: Any) -> tuple[tuple[float, float], str]:
    """GRPO's usual learning rates for this model, and a note saying why they differ from :data:`GRPO_LR_RANGE`.

    The range is practice on LLMs of hidden size >= 1024. Adam's best learning rate grows as a model narrows
    (about 1 / width: muP), so for a narrower model (``config.json``'s ``hidden_size`` in a local model folder: the
    tiny Qwen3 of the ``tiny`` and ``smoke`` recipes is 64 or 96 wide, and needs ~1e-3 to move at all) the range
    is scaled by ``1024 / hidden_size``. A hub id or a folder without that key keeps the range as it is."""
    low, high = GRPO_LR_RANGE
    config_json = Path(str(model_path or "")) / "config.json"
    try:
        hidden = int(json.loads(config_json.read_text())["hidden_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return (low, high), ""
    if not 0 < hidden < PRACTICE_HIDDEN_SIZE:
        return (low, high), ""
    scale = PRACTICE_HIDDEN_SIZE / hidden
    return (low * scale, high * scale), f" for a model {hidden} wide, scaled from LLM practice by {scale:g}"


def startup_warnings(cfg: DictConfig) -> list[str]:
    """Legal values that are probably mistakes for GRPO: each a ``key=value: why`` line, not an error."""
    warnings = []
    lr = value_of(cfg, f"{ACTOR}.optim.lr")
    (low, high), why = grpo_lr_range(value_of(cfg, "actor_rollout_ref.model.path"))
    if isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0 and not low <= lr <= high:
        warnings.append(f"{ACTOR}.optim.lr={lr}: far outside GRPO practice ({low:.2g} … {high:.2g}{why}; the guide "
                        "uses 5e-7): check the exponent")
    temperature, n = value_of(cfg, f"{ROLLOUT}.temperature"), value_of(cfg, f"{ROLLOUT}.n")
    if temperature == 0 and isinstance(n, int) and n > 1:
        warnings.append(f"{ROLLOUT}.temperature=0: greedy sampling makes the {n} responses of a group identical, "
                        "so GRPO's advantages are all zero: use a temperature > 0 (the guide's is 1.0)")
    return warnings + waste_warnings(cfg)


def waste_warnings(cfg: DictConfig) -> list[str]:
    """Legal values that waste a run: inverted clip ratios, one response per group under a group estimator,
    checkpoint contents verl never looks for, a token budget smaller than one sequence."""
    warnings = []
    low, high = value_of(cfg, f"{ACTOR}.clip_ratio_low"), value_of(cfg, f"{ACTOR}.clip_ratio_high")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > high:
        warnings.append(f"{ACTOR}.clip_ratio_low={low}: above clip_ratio_high={high}, so the clip range "
                        f"[1 - {low}, 1 + {high}] is lopsided the wrong way (DAPO raises the high side): swap them")
    n, estimator = value_of(cfg, f"{ROLLOUT}.n"), str(value_of(cfg, "algorithm.adv_estimator"))
    if n == 1 and estimator in group_estimators() and not estimator.startswith("grpo"):  # GRPO's: refused (counts)
        warnings.append(f"{ROLLOUT}.n=1: the {estimator} estimator compares the responses of one prompt with each "
                        "other, so with one response it has nothing to compare (no baseline): use n >= 2 "
                        "(the guide uses 5)")
    known = checkpoint_contents()
    for section in (f"{ACTOR}.checkpoint", "critic.checkpoint"):
        for field in ("save_contents", "load_contents"):
            unknown = [c for c in value_of(cfg, f"{section}.{field}") or [] if known and c not in known]
            if unknown:
                warnings.append(f"{section}.{field}={value_of(cfg, f'{section}.{field}')}: verl's checkpoint manager "
                                f"never looks for {', '.join(map(str, unknown))}: use some of {', '.join(known)}")
    return warnings  # a token budget below one sequence: startup_checks.token_budget_problems


@functools.lru_cache(maxsize=1)
def group_estimators() -> tuple[str, ...]:
    """Advantage estimators that normalise within a prompt's group (their verl function takes ``index``)."""
    import inspect

    from verl.trainer.ppo import core_algos

    registry = getattr(core_algos, "ADV_ESTIMATOR_REGISTRY", {})
    return tuple(sorted(name for name, fn in registry.items() if "index" in inspect.signature(fn).parameters))


@functools.lru_cache(maxsize=1)
def checkpoint_contents() -> tuple[str, ...]:
    """The entries verl's checkpoint manager tests ``save_contents`` / ``load_contents`` for (asked of its code)."""
    import inspect

    try:
        from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager
    except ImportError:
        return ()
    found: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(inspect.getmodule(BaseCheckpointManager)))):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In) and \
                isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
            target = node.comparators[0]
            if isinstance(target, ast.Attribute) and target.attr.endswith("_contents"):
                found.add(node.left.value)
    return tuple(sorted(found))
