"""Silence the library warnings verlflow's own recipes trigger on every run, and only those.

    python -c "from verlflow.known_warnings import KNOWN; print(*KNOWN, sep='\\n')"

Each entry names the logger and the start of the message, and why it is harmless here. The filters match
those messages only: any other warning of the same logger still shows. :func:`install` is called once when
a step starts (:func:`verlflow.cli.run_step`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from verlflow.compat import ray as compat_ray


@dataclass(frozen=True)
class Known:
    """A harmless message: its logger, how it starts, and why verlflow may drop it."""

    logger: str
    starts_with: str
    why: str


KNOWN: tuple[Known, ...] = (
    Known("verl.utils.tracking", "[MLflow] Metric key ",
          "verl's own names (mean@1) are sanitized to MLflow keys (mean_at_1) by design, the same in every run"),
    Known("mlflow.transformers", "The model card could not be retrieved from the hub",
          "train (or register) logs a local checkpoint, which has no hub model card"),
    Known("mlflow.transformers", "Unable to find license information for this model",
          "a local checkpoint has no hub licence file; its base model's licence applies"),
    Known("mlflow.store.db.utils", "Creating initial MLflow database tables",
          "the first step in a folder creates mlflow.db, as the README says; nothing to act on"),
    Known("mlflow.store.db.utils",
          "SQLAlchemy database error. The following exception is caught.\n"
          "(sqlite3.OperationalError) database is locked",
          "another process holds SQLite's write lock: verlflow's writes wait for it (outage/store_retry.py, saying so "
          "once, up to VERLFLOW_STORE_LOCK_WAIT_S); MLflow printed a full traceback for every 20 s try"),
    Known("mlflow.store.db.utils",
          "SQLAlchemy database error. The following exception is caught.\n(sqlite3.OperationalError) disk I/O error",
          "the store's disk refused a write (full, or ulimit -f): the step ends in one line naming the store and its "
          "free space (outage/store_retry.store_write_failure)"),
    Known("mlflow.store.db.utils",
          "SQLAlchemy database error. The following exception is caught.\n"
          "(sqlite3.OperationalError) database or disk is full",
          "the same, as SQLite words a full disk"),
    Known("mlflow.store.db.utils", "Updating database tables",
          "MLflow brings the schema up to date itself (on creation, after an upgrade): nothing to act on"),
    Known("mlflow.system_metrics.system_metrics_monitor", "Skip logging GPU metrics",
          "a machine without NVIDIA GPUs; verlflow samples NPUs itself and says when a device is missing"),
    Known("mlflow.system_metrics.system_metrics_monitor", "Started monitoring system metrics",
          "every train run samples system/* (README, What a run holds); said for each run, no news"),
    Known("mlflow.system_metrics.system_metrics_monitor", "Stopping system metrics monitoring",
          "the same sampler ending with its run"),
    Known("mlflow.system_metrics.system_metrics_monitor", "Successfully terminated system metrics monitoring",
          "the same sampler ending with its run"),
    Known("mlflow.tracing.export.async_export_queue", "Flushing the async trace logging queue",
          "the train run's sampled completions are written as traces before the step exits, as they should"),
    Known("mlflow.store.model_registry.abstract_store", "Waiting up to 300 seconds for model version",
          "register waits for the version as MLflow does; register prints the version it made"),
    # The rest are said inside verl's processes (install_in_verl_process, called by the cpu-verl plugin).
    Known("__main__", "Legacy trainer `main_ppo_v0.py` is deprecated",
          "verl's main_ppo on trainer.use_v1=False, which verlflow forces on verl >= 0.9 unless TransferQueue is "
          "installed (its v1 trainer needs it); the launch notes say so once"),
    Known(compat_ray.TOKEN_AUTH_LOGGER,
          "Token authentication is enabled for this Ray cluster",
          "the local Ray instance verl starts for one launch keeps Ray's default token authentication; the line "
          "only says how to switch it off, which verlflow does not want"),
    Known("torch.fx._symbolic_trace", "is_fx_tracing will return true for both fx.symbolic_trace and torch.export",
          "transformers' model code asks torch whether it is being traced, in every FSDP worker; torch says what the "
          "answer will mean, which matters to tracing code only, and verlflow traces nothing"),
)


@dataclass(frozen=True)
class KnownPythonWarning:
    """A harmless Python warning raised in verl's own processes (the launch, its Ray workers): how its message
    starts, its category, and why verlflow may drop it there."""

    starts_with: str  # literal: no ':' or ',' (PYTHONWARNINGS separators)
    category: str
    why: str


# verl imports verl.workers.engine in the trainer and again in every Ray worker; each optional engine it lacks
# warns once per process (5 engines × every worker: 39 lines on a 4-worker CPU launch), none of them used here.
_ENGINE_WHY = ("an optional verl training engine that is not installed; verlflow's recipes use FSDP, which is, "
               "and verl falls back without it: repeated in every Ray worker")
VERL_PROCESS_WARNINGS: tuple[KnownPythonWarning, ...] = (
    *(KnownPythonWarning(f"{engine} engine is not available", "UserWarning", _ENGINE_WHY)
      for engine in ("torchtitan", "veomni", "automodel", "mindspeed", "megatron")),
    KnownPythonWarning("Disabled critic as algorithm.adv_estimator != gae", "UserWarning",
                       "GRPO has no critic by design (algorithm.adv_estimator=grpo); verl says so 3 times a launch"),
    KnownPythonWarning("'set_vital' is deprecated", "UserWarning",
                       "torchdata's StatefulDataLoader calls torch.set_vital itself; nothing a user can change"),
)
# Messages with ':' or ',' cannot be written in PYTHONWARNINGS: dropped in-process by install_in_verl_process.
VERL_IN_PROCESS_WARNINGS: tuple[KnownPythonWarning, ...] = (
    KnownPythonWarning("Warning: Class 'verl.trainer.ppo.ray_trainer.RayPPOTrainer' is deprecated", "FutureWarning",
                       "verl's legacy RayPPOTrainer, which trainer.use_v1=False selects: verlflow forces it on verl "
                       ">= 0.9 unless TransferQueue is installed (its v1 trainer needs it)"),
)


def python_warnings(existing: str = "") -> str:
    """``PYTHONWARNINGS`` for verl's processes and Ray workers (which inherit it): :data:`VERL_PROCESS_WARNINGS`
    dropped at their source, then the user's own filters, which Python applies last and so win."""
    ours = [f"ignore:{known.starts_with}:{known.category}" for known in VERL_PROCESS_WARNINGS]
    return ",".join([*ours, *([existing] if existing.strip() else [])])


def install_in_verl_process() -> None:
    """Inside a verl process (the launch, a Ray worker; the cpu-verl plugin calls it as verl is imported): the
    logging filters of :func:`install` and :data:`VERL_IN_PROCESS_WARNINGS`, appended after every other warning
    filter so the user's own ``PYTHONWARNINGS`` still win (idempotent)."""
    import builtins
    import re
    import warnings

    install()
    for known in VERL_IN_PROCESS_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(known.starts_with),
                                category=getattr(builtins, known.category), append=True)


class _DropKnown(logging.Filter):
    """Drops the records of one logger whose message starts with one of the given texts."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def install() -> None:
    """Attach one filter per logger in :data:`KNOWN` (idempotent: a second call adds nothing)."""
    by_logger: dict[str, tuple[str, ...]] = {}
    for known in KNOWN:
        by_logger[known.logger] = (*by_logger.get(known.logger, ()), known.starts_with)
    for name, prefixes in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(prefixes))
