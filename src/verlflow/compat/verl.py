"""verl's private names and the patches of its namespace verlflow relies on, each behind one accessor.

    python -c "from verlflow.compat.verl import mlflow_params; print(mlflow_params({'a': {'b': [1, 2]}}))"

Checked on verl 0.5.0 (the guide's) and 0.9.1 (the installed one): tests/test_verl_version_matrix.py, the
rehearsal tables (tests/test_dry_run_rehearsal_*.py) and the CPU launch (tests/test_verl_cpu_launch.py).

- tracking: verl's MLflow param flattening and metric-key sanitizer; reusing them keeps a local run's param
  keys and metric names identical to a verl run's, so ``compare`` can diff the two;
- the rehearsal: the task runner and its trainer stopped before its Ray workers, the resume branch, the
  registries (rollout, agent loop, checkpoint engines) and the raise sites keyed by verl's function names;
- patches (the CPU plugin, the secret guard): ``patch_*`` and ``register_*``, each idempotent.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from verlflow.errors import VerlflowError

SUPPORTED = ">=0.5.0,<0.10"


def mlflow_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` flattened as verl's MLflow logger flattens it (``a/b/c``, lists as ``x/list_len``).

    ``verl.utils.tracking._compute_mlflow_params_from_objects``: checked on verl 0.5.0 through 0.9.x. Fallback:
    none that would keep the keys equal; a verl without it is one line naming the supported range.
    """
    try:
        from verl.utils.tracking import _compute_mlflow_params_from_objects
    except ImportError as exc:
        raise VerlflowError(f"this verl has no verl.utils.tracking._compute_mlflow_params_from_objects: "
                            f"install a verl verlflow supports ({SUPPORTED}): {exc}") from None
    return _compute_mlflow_params_from_objects(dict(config))


@functools.lru_cache(maxsize=1)
def metric_key_sanitizer() -> Callable[[str], str]:
    """verl's metric-key sanitizer (``@`` → ``_at_``; from verl 0.6 also characters MLflow refuses → ``_``).

    ``verl.utils.tracking._MlflowLoggingAdapter()._sanitize_key``: checked on verl 0.9.1. verl 0.5.0's adapter
    has no such method and replaces only ``@`` inside its ``log``: that rule is the fallback, so a key is what
    the installed verl itself logs. A verl without the adapter is one line naming the supported range.
    """
    try:
        from verl.utils.tracking import _MlflowLoggingAdapter
    except ImportError as exc:
        raise VerlflowError(f"this verl has no verl.utils.tracking._MlflowLoggingAdapter: "
                            f"install a verl verlflow supports ({SUPPORTED}): {exc}") from None
    return getattr(_MlflowLoggingAdapter(), "_sanitize_key", None) or _at_only


def _at_only(key: str) -> str:
    """verl 0.5.0's metric-key rule (``_MlflowLoggingAdapter.log``): ``@`` → ``_at_``, nothing else."""
    return key.replace("@", "_at_")


# ---- the rehearsal: verl's start-up built with verl's own code, stopped before its Ray workers ----------------

def task_runner() -> tuple[Any, list[Any]]:
    """verl's ``TaskRunner`` class (unwrapped from its Ray actor) and the modules whose ``RayPPOTrainer`` it uses.

    ``verl.trainer.main_ppo_v0`` (verl >= 0.9's classic trainer) else ``verl.trainer.main_ppo``; the class
    through :func:`verlflow.compat.ray.actor_class`. Checked on verl 0.5.0 and 0.9.1. Fallback: none (an
    ImportError or AttributeError, which the rehearsal reports as its start-up stage failing).
    """
    from verlflow.compat.ray import actor_class

    ray_trainer = importlib.import_module("verl.trainer.ppo.ray_trainer")
    try:
        module = importlib.import_module("verl.trainer.main_ppo_v0")
    except ModuleNotFoundError:
        module = importlib.import_module("verl.trainer.main_ppo")
    return actor_class(module.TaskRunner), [m for m in (module, ray_trainer) if hasattr(m, "RayPPOTrainer")]


@contextlib.contextmanager
def trainer_stopped_at_workers(modules: list[Any], reached: Callable[[Any], BaseException]) -> Iterator[None]:
    """While active, ``RayPPOTrainer`` in ``modules`` is built in full and raises ``reached(trainer)`` where it
    would start Ray workers (``init_workers``); verl's own class is put back on leaving.

    A patch of verl's namespace (``verl.trainer.ppo.ray_trainer.RayPPOTrainer`` and the runner module's name
    for it): checked on verl 0.5.0 and 0.9.1. Fallback: none needed, the class and method are public.
    """
    ray_trainer = importlib.import_module("verl.trainer.ppo.ray_trainer")
    original = ray_trainer.RayPPOTrainer

    class StoppedAtWorkers(original):  # type: ignore[misc, valid-type]
        def init_workers(self) -> None:
            raise reached(self)

    for module in modules:
        module.RayPPOTrainer = StoppedAtWorkers
    try:
        yield
    finally:
        for module in modules:
            module.RayPPOTrainer = original


@contextlib.contextmanager
def datasets_built_by(modules: list[Any], build: Callable[[Callable[..., Any], tuple, dict], Any]) -> Iterator[None]:
    """While active, the task runner's ``create_rl_dataset`` (in ``modules`` that name it) goes through
    ``build(create_rl_dataset, args, kwargs)``; verl's own function is put back on leaving.

    A patch of verl's namespace (``verl.trainer.main_ppo.create_rl_dataset`` on 0.5.0, the name
    ``main_ppo_v0`` imports from ``verl.trainer.ppo.utils`` on 0.9.1). Fallback: a module without the name is
    left alone (the datasets are then built as verl builds them).
    """
    originals = {module: module.create_rl_dataset for module in modules if hasattr(module, "create_rl_dataset")}
    for module, create in originals.items():
        module.create_rl_dataset = lambda *args, _create=create, **kwargs: build(_create, args, kwargs)
    try:
        yield
    finally:
        for module, create in originals.items():
            module.create_rl_dataset = create


def load_checkpoint(trainer: Any) -> Callable[[], Any] | None:
    """The trainer's resume branch, ``RayPPOTrainer._load_checkpoint`` (bound), or None where it is gone.

    Checked on verl 0.5.0 and 0.9.1. Fallback: None, and the rehearsal says it skipped the resume branch.
    """
    return getattr(trainer, "_load_checkpoint", None)


def stop_dump_executor(trainer: Any) -> None:
    """Stop the thread pool a built ``RayPPOTrainer`` keeps for dumping generations (``_shutdown_dump_executor``).

    verl 0.9.x has it; 0.5.0 has no executor. Fallback: nothing to stop.
    """
    shutdown = getattr(trainer, "_shutdown_dump_executor", None)
    if shutdown is not None:
        shutdown()


def agent_loop_registry(module: Any) -> dict[str, Any] | None:
    """verl's agent-loop registry (``verl.experimental.agent_loop.agent_loop._agent_loop_registry``: name →
    config), from that module. Checked on verl 0.5.0 and 0.9.1. Fallback: None (the check is skipped, said so)."""
    return getattr(module, "_agent_loop_registry", None)


def rollout_registry() -> dict[Any, str] | None:
    """verl's rollout classes, ``verl.workers.rollout.base._ROLLOUT_REGISTRY``: ``(name, mode)`` → class path.

    verl >= 0.7 (checked on 0.9.1); 0.5.0 has no registry. Fallback: None (callers list the rollout
    modules, or skip the check).
    """
    try:
        base = importlib.import_module("verl.workers.rollout.base")
    except ImportError:
        return None
    return getattr(base, "_ROLLOUT_REGISTRY", None)


def checkpoint_engines(registry: Any) -> tuple[list[str], dict[str, BaseException]]:
    """The backends verl's ``CheckpointEngineRegistry`` holds and the modules that failed to import into it
    (``_registry`` and ``_import_errors``, ``verl/checkpoint_engine/base.py``). Checked on verl 0.9.1 (0.5.0 has
    no checkpoint engines). Fallback: empty, and callers show verl's own message."""
    return sorted(getattr(registry, "_registry", {}) or {}), dict(getattr(registry, "_import_errors", {}) or {})


# ---- raise sites: where verl's start-up raises without naming a config key (rehearsal/raise_sites.py) ---------
# (path under verl/, function). Private functions of verl, keyed by name: checked on verl 0.5.0 and 0.9.1. A
# renamed one only loses its fix (the line then names the keys the statement reads, or verl's own message).
DATALOADER = ("trainer/ppo/ray_trainer.py", "_create_dataloader")
RESUME = ("trainer/ppo/ray_trainer.py", "_load_checkpoint")
ADVANTAGE = ("trainer/ppo/ray_trainer.py", "compute_advantage")
REWARD_CALL = ("trainer/ppo/reward.py", "_call_with_kwargs")
REWARD_WRAPPED = ("trainer/ppo/reward.py", "wrapped_fn")  # in neither 0.5.0 nor 0.9.1: kept for the verls between
DATASET_LENGTH = ("utils/dataset/rl_dataset.py", "doc2len")
DATASET_FILTER = ("utils/dataset/rl_dataset.py", "maybe_filter_out_long_prompts")
DATASET_ITEM = ("utils/dataset/rl_dataset.py", "__getitem__")
DATASET_MESSAGES = ("utils/dataset/rl_dataset.py", "_build_messages")
POSTPROCESS = ("utils/torch_functional.py", "postprocess_data")
DEFAULT_SCORE = ("utils/reward_score/__init__.py", "default_compute_score")
RAISE_SITES = (DATALOADER, RESUME, ADVANTAGE, REWARD_CALL, REWARD_WRAPPED, DATASET_LENGTH, DATASET_FILTER, DATASET_ITEM,
               DATASET_MESSAGES, POSTPROCESS, DEFAULT_SCORE)


# ---- patches of verl's namespace (the CPU plugin and the secret guard, in verl's own processes) ---------------

def patch_mlflow_params(wrap: Callable[[Callable[..., dict]], Callable[..., dict]]) -> bool | None:
    """Replace verl's param flattening (what its MLflow logger logs) by ``wrap(original)``, once per process.

    ``verl.utils.tracking._compute_mlflow_params_from_objects``: checked on verl 0.5.0 and 0.9.1. Returns None
    where verl is not importable, False where the function is gone (nothing patched: the caller warns).
    """
    try:
        from verl.utils import tracking
    except ImportError:
        return None
    compute = getattr(tracking, "_compute_mlflow_params_from_objects", None)
    if compute is None:
        return False
    if not getattr(compute, "verlflow_patched", False):
        wrapped = wrap(compute)
        wrapped.verlflow_patched = True
        tracking._compute_mlflow_params_from_objects = wrapped
    return True


def engine_registered(model_type: str, backend: str, device: str) -> bool:
    """Whether ``verl.workers.engine.EngineRegistry`` holds an engine for the three (``_engines``, verl 0.9.1;
    registering twice would raise). Fallback: where ``_engines`` is gone, False (the caller registers)."""
    from verl.workers.engine import EngineRegistry

    return device in getattr(EngineRegistry, "_engines", {}).get(model_type, {}).get(backend, {})


def register_rollout_class(name: str, mode: str, path: str) -> None:
    """Add ``(name, mode) → path`` to ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` (verl has no register
    function for it; checked on verl 0.9.1). Fallback: none; the CPU plugin needs verl >= 0.9."""
    from verl.workers.rollout import base

    base._ROLLOUT_REGISTRY[(name, mode)] = path


def patch_process_group_backend(default: str) -> None:
    """``verl.utils.distributed.initialize_global_process_group_ray`` called with ``backend=default`` where the
    caller gives none (verl builds ``cpu:gloo,{device}:{backend}``, which torch rejects on the CPU, with no hook).
    Checked on verl 0.9.1. Idempotent."""
    import verl.utils.distributed as dist

    original = dist.initialize_global_process_group_ray
    if getattr(original, "verlflow_patched", False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or default)

    initialize_global_process_group_ray.verlflow_patched = True
    dist.initialize_global_process_group_ray = initialize_global_process_group_ray


def patch_trl_unavailable() -> None:
    """``verl.utils.import_utils.is_trl_available`` (and the monkey-patch module's copy, if imported) return False:
    verl 0.9.1's ``apply_monkey_patch`` imports ``AutoModelForCausalLMWithValueHead`` whenever TRL is installed,
    which TRL >= 1 no longer has. Checked on verl 0.9.1."""
    import verl.utils.import_utils as import_utils

    import_utils.is_trl_available = lambda: False
    patched = sys.modules.get("verl.models.transformers.monkey_patch")
    if patched is not None:
        patched.is_trl_available = import_utils.is_trl_available


def patch_fsdp_offload_policy(policy: type) -> None:
    """``CPUOffloadPolicy`` as verl's FSDP engine module sees it (``verl.workers.engine.fsdp.transformer_impl``)
    becomes ``policy``. Checked on verl 0.9.1."""
    from verl.workers.engine.fsdp import transformer_impl

    transformer_impl.CPUOffloadPolicy = policy
