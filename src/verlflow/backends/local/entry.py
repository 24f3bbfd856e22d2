"""The local GRPO trainer behind the train step's interface, registered as ``local``.

    mlflow run . --env-manager local -e train -P device=cpu     # this backend, the embedded default

Heavy imports (torch, transformers) wait for :meth:`LocalBackend.train`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verlflow.backends.registry import TrainBackend, TrainLaunch, register_backend
from verlflow.config import ComposedConfig
from verlflow.errors import VerlflowError
from verlflow.tracking.run_logger import RunLogger, RunLogging, buffered_logging


@register_backend("local")
class LocalBackend(TrainBackend):
    """The embedded trainer: this process, this machine, metrics through a spilling buffer."""

    default_for = staticmethod(lambda platform: not platform.accelerator)

    def check_config(self, cfg: ComposedConfig) -> None:
        """The keys the local trainer reads must hold values it supports (one line otherwise)."""
        from verlflow.backends.local.settings import read_settings

        read_settings(cfg)

    def prepare(self, cfg: ComposedConfig, launch: TrainLaunch, cluster: Any) -> None:
        """Refuse what only a verl launch has (a dry run, a Ray cluster) and a resume that would start over."""
        if launch.dry_run or launch.ray_address:
            raise VerlflowError("dry_run and ray_address apply to backend=verl only; the local trainer runs here")
        if launch.resume:
            check_resumable(cfg, launch.resume)

    def run_logging(self, cfg: ComposedConfig) -> RunLogging:
        """Through a metric buffer that spills under the recipe's output folder (default outputs/local),
        ``<it>/<run id>``, during a tracking outage; the folder must be writable before the run opens."""
        from verlflow.backends.local.trainer import DEFAULT_OUTPUT_ROOT

        return buffered_logging(Path(str(cfg.verlflow.output_dir or DEFAULT_OUTPUT_ROOT)), "verlflow.output_dir")

    def train(self, cfg: ComposedConfig, launch: TrainLaunch, *, run_id: str, started_at: float,
              prepared: Any, logger: RunLogger | None = None) -> Any:
        """Train in this process (:func:`verlflow.backends.local.trainer.train_local`), logging through ``logger``."""
        from verlflow.backends.local.trainer import train_local

        return train_local(cfg, data_dir=launch.data_dir, run_id=run_id, started_at=started_at, logger=logger)


def check_resumable(cfg: ComposedConfig, run_id: str) -> None:
    """Before a resumed run reopens: it continues after a checkpoint (the trainer says which), or from step 1 when no
    step reached the run (said here); a run that logged steps but kept no checkpoint is refused in one line, never
    restarted at step 0 in place, its logged steps trained again under the old numbers. Starting over is a new run.
    """
    from verlflow.backends.local import checkpoint as ckpt
    from verlflow.backends.local.settings import read_settings
    from verlflow.backends.local.trainer import with_run_folder
    from verlflow.names import TIMING_STEP, metric_names
    from verlflow.tracking import lookups

    settings = read_settings(with_run_folder(cfg, run_id))
    if ckpt.resume_candidates(settings.default_local_dir, settings.resume_mode, settings.resume_from_path):
        return
    logged = lookups.metric_steps(run_id, metric_names(TIMING_STEP))
    if not logged:
        print(f"verlflow: resume: run {run_id} continues from step 1 (no step had reached the run)", flush=True)
        return
    why = ("trainer.resume_mode=disable" if settings.resume_mode == "disable" else
           f"none was saved or all were removed; trainer.save_freq={settings.save_freq}")
    raise VerlflowError(f"resume: run {run_id} logged steps up to {max(logged)} but has no checkpoint under "
                        f"{settings.default_local_dir} ({why}): resuming would restart it at step 0; to start over, "
                        "start a new run (the same command without --resume)")
