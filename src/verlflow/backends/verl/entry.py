"""The verl launch behind the train step's interface, registered as ``verl``.

    mlflow run . --env-manager local -e train -P device=npu -P dry_run=true

Before the run opens: the Ray cluster is reached and checked, a resumed run's checkpoint chosen; then
:func:`verlflow.backends.verl.backend.train_verl` launches. Heavy imports wait for the method that needs them.
"""

from __future__ import annotations

from typing import Any

from verlflow.backends.registry import TrainBackend, TrainLaunch, register_backend
from verlflow.config import VERL_CPU_PROFILE, ComposedConfig
from verlflow.errors import VerlflowError
from verlflow.platforms import Device
from verlflow.tracking.run_logger import RunLogger


@register_backend("verl")
class VerlBackend(TrainBackend):
    """verl's own trainer, launched under bash (or as a Ray job) with the profile's files sourced."""

    default_for = staticmethod(lambda platform: platform.accelerator)
    profile_for = {Device.CPU: VERL_CPU_PROFILE}
    checks_up_front = False

    def find_cluster(self, launch: TrainLaunch) -> Any:
        """An address nobody answers at is refused before anything is composed (seconds, not a minute)."""
        if not launch.ray_address:
            return None
        from verlflow.backends.verl import ray_cluster

        return ray_cluster.cluster_nodes(launch.ray_address)

    def prepare(self, cfg: ComposedConfig, launch: TrainLaunch, cluster: Any) -> Any:
        """A Ray cluster that is not there, too small, or unable to reach the store; a resume point."""
        from verlflow.backends.verl import ray_cluster
        from verlflow.tracking.lookups import tracking_uri

        ray_cluster.check_ray_launch(device=cfg.profile.device, nnodes=cfg.resolved.trainer.nnodes,
                                     per_node=cfg.resolved.trainer.n_gpus_per_node, ray_address=launch.ray_address,
                                     tracking_uri=tracking_uri(), nodes=cluster,
                                     check_resources=not cfg.verlflow.skip_preflight)
        return _resume_point(launch.resume, cfg, launch.ray_address) if launch.resume and not launch.dry_run else None

    def samples_system_metrics(self, launch: TrainLaunch) -> bool:
        """A dry run launches nothing: no system metrics to sample."""
        return not launch.dry_run

    def train(self, cfg: ComposedConfig, launch: TrainLaunch, *, run_id: str, started_at: float,
              prepared: Any, logger: RunLogger | None = None) -> Any:
        """Point verl at the resume point, if any, and launch (:func:`.backend.train_verl`); verl's own tracker
        logs the run, so ``logger`` is not used."""
        from verlflow.backends.verl import backend as verl_backend

        if prepared is not None:
            from verlflow.backends.verl import resume as verl_resume
            from verlflow.backends.verl.command import checkpoint_dir_of

            verl_resume.point_verl_at(prepared, checkpoint_dir_of(cfg, run_id))
            verl_resume.record_resume_point(run_id, prepared)
        return verl_backend.train_verl(
            cfg, run_id=run_id, dry_run=launch.dry_run, ray_address=launch.ray_address, started_at=started_at,
            resume_in_job=bool(launch.resume and launch.ray_address),
        )


def _resume_point(run_id: str, cfg: ComposedConfig, ray_address: str):
    """Where a resumed verl run continues (checked before the run is reopened); None for a Ray job."""
    mode = str(cfg.resolved.trainer.get("resume_mode", "auto"))
    if mode != "auto":
        raise VerlflowError(f"resume: the run's config has trainer.resume_mode={mode}; verlflow resumes verl "
                            "through verl's resume_mode=auto (its checkpoint tracker file): drop that override")
    if ray_address:  # the checkpoints are on the cluster: the job's entrypoint chooses there
        return None
    from verlflow.backends.verl import resume as verl_resume
    from verlflow.backends.verl.command import checkpoint_dir_of

    return verl_resume.choose_resume_point(run_id, checkpoint_dir_of(cfg, run_id))
