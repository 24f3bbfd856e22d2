"""Step ``train``: resolve what the user asked for, open the run, hand over to a backend.

    mlflow run . --env-manager local -e train -P device=cpu

``auto`` recipe, profile and backend are chosen from the device (:mod:`verlflow.backends.train_setup`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from verlflow import config
from verlflow.backends.train_setup import check_train_inputs, choose_train_setup, compose_train_config
from verlflow.backends.verl import ray_cluster
from verlflow.device import system_metrics
from verlflow.errors import VerlflowError
from verlflow.names import DATA_DIGEST_TAG, MODEL_NAME_TAG, STEP_TAG
from verlflow.runs import naming as run_names
from verlflow.runs import tracking
from verlflow.step_requests import TrainRequest

log = logging.getLogger(__name__)

# How a train run uses each split (MLflow dataset input contexts): it trains on one and validates on the other.
TRAIN_INPUT_CONTEXTS = {"train": "training", "test": "validation"}


def _lineage_tags(cfg: config.ComposedConfig, data_dir: str) -> dict[str, str]:
    """Tags a train run carries for the registry: its step, model name and the digest of its data."""
    from verlflow.data.gsm8k import data_dir_digest

    tags = {STEP_TAG: "train"}
    if cfg.verlflow.model_name:
        tags[MODEL_NAME_TAG] = cfg.verlflow.model_name
    digest = data_dir_digest(data_dir)
    if digest:
        tags[DATA_DIGEST_TAG] = digest
    return tags


def run_train(request: TrainRequest, *, run_id: str | None = None):
    """Train with GRPO (step ``train``): verl on npu/gpu, the local trainer on cpu or when asked.

    ``request.resume``: a train run id to continue in place from its last checkpoint (:mod:`verlflow.runs.resume`).
    ``run_id``: the train run, already created for it (``main``'s child); else a new run (or ``mlflow run``'s).
    """
    from verlflow.runs import resume as resuming

    started_at = time.time()
    resume = request.resume
    if resume:
        request = resuming.prepare_resume(request)
        run_id = resume
    recipe, device, profile, data_dir, model, overrides, backend, dry_run, ray_address = (
        request.recipe, request.device, request.profile, request.data_dir, request.model, request.overrides,
        request.backend, request.dry_run, request.ray_address)
    recipe, dev, profile, backend = choose_train_setup(recipe, device, profile, backend)
    # An address nobody answers at is refused before anything is composed (seconds, not a minute).
    ray_nodes = ray_cluster.cluster_nodes(ray_address) if ray_address and backend == "verl" else None
    if not data_dir:  # the recipe's data, where main puts it; prepared now when it can be made here
        from verlflow.data import recipe_data

        data_dir = recipe_data.step_data_dir("", recipe_data.recipe_source(recipe, overrides))
    cfg = compose_train_config(recipe, profile, data_dir, model, overrides, check_counts=backend == "local")
    if cfg.profile.device != dev:
        raise VerlflowError(f"profile '{cfg.profile.name}' is for device '{cfg.profile.device}', not '{dev}'")
    interval = system_metrics.sampling_interval(cfg.verlflow)
    check_train_inputs(cfg, data_dir, require_splits=backend == "local")
    run_tags = {**_lineage_tags(cfg, data_dir), **resuming.args_tag(request)}
    if backend == "local":
        if dry_run or ray_address:
            raise VerlflowError("dry_run and ray_address apply to backend=verl only; the local trainer runs here")
        from verlflow.backends.local import trainer as local

        tags = tracking.standard_tags(backend="local", recipe=recipe, profile=profile)
        spill_root = Path(str(cfg.verlflow.output_dir or local.DEFAULT_OUTPUT_ROOT))
        with _train_run(cfg, {**tags, **run_tags}, recipe, profile, started_at, interval,
                        spill_root=spill_root, overrides=overrides, data_dir=data_dir, run_id=run_id) as (run, since):
            return local.train_local(cfg, data_dir=data_dir, run_id=run.info.run_id, started_at=since)
    import mlflow

    from verlflow.backends.verl import backend as verl_backend

    # Before the run opens: a Ray cluster that is not there, too small, or unable to reach the store costs seconds.
    ray_cluster.check_ray_launch(device=cfg.profile.device, nnodes=cfg.resolved.trainer.nnodes,
                                 per_node=cfg.resolved.trainer.n_gpus_per_node, ray_address=ray_address,
                                 tracking_uri=mlflow.get_tracking_uri(), nodes=ray_nodes,
                                 check_resources=not cfg.verlflow.skip_preflight)
    tags = tracking.standard_tags(backend="verl", recipe=recipe, profile=profile)
    # A dry run launches nothing: no system metrics to sample.
    interval = None if dry_run else interval
    point = _verl_resume_point(resume, cfg, ray_address) if resume and not dry_run else None
    with _train_run(cfg, {**tags, **run_tags}, recipe, profile, started_at, interval,
                    overrides=overrides, data_dir=data_dir, run_id=run_id) as (run, since):
        if point is not None:
            from verlflow.backends.verl.command import checkpoint_dir_of

            _resume_verl_at(run.info.run_id, point, checkpoint_dir_of(cfg, run.info.run_id))
        return verl_backend.train_verl(
            cfg, run_id=run.info.run_id, dry_run=dry_run,
            ray_address=ray_address, started_at=since, resume_in_job=bool(resume and ray_address),
        )


def _verl_resume_point(run_id: str, cfg: config.ComposedConfig, ray_address: str):
    """Where a resumed verl run continues (checked before the run is reopened); None for a Ray job."""
    from verlflow.backends.verl import resume as verl_resume

    mode = str(cfg.resolved.trainer.get("resume_mode", "auto"))
    if mode != "auto":
        raise VerlflowError(f"resume: the run's config has trainer.resume_mode={mode}; verlflow resumes verl "
                            "through verl's resume_mode=auto (its checkpoint tracker file): drop that override")
    if ray_address:  # the checkpoints are on the cluster: the job's entrypoint chooses there
        return None
    from verlflow.backends.verl.command import checkpoint_dir_of

    return verl_resume.choose_resume_point(run_id, checkpoint_dir_of(cfg, run_id))


def _resume_verl_at(run_id: str, point, checkpoint_dir: str) -> None:
    """Point verl at the chosen checkpoint and record it on the run (metric and tag), with a console line."""
    from verlflow.backends.verl import resume as verl_resume

    verl_resume.point_verl_at(point, checkpoint_dir)
    verl_resume.record_resume_point(run_id, point)


@contextlib.contextmanager
def _train_run(cfg, tags, recipe, profile, started_at, interval, *, spill_root: Path | None = None,
               overrides="", data_dir="", run_id: str | None = None):
    """The train run, in its recipe's experiment, named for the UI, with its data splits as dataset inputs,
    timed across resumed attempts, with system metrics sampled while it trains.

    Yields the run and the start time its ``timing_s/e2e`` counts from (the first attempt's, on a resume).
    With ``spill_root`` (the local trainer) the run's metrics, tables and tags, its attempt time included, go
    through a metric buffer spilling to ``<spill_root>/<run_id>``, and its other MLflow calls are kept short.
    """
    from verlflow.data.gsm8k import log_split_inputs
    from verlflow.runs import metric_buffer
    from verlflow.runs import resume as resuming
    from verlflow.runs.experiments import recipe_experiment

    with tracking.tracked_run(tags=tags, log_system_metrics=False, experiment=recipe_experiment(recipe),
                              run_id=run_id) as run, \
            (metric_buffer.buffering(run.info.run_id, spill_root / run.info.run_id) if spill_root is not None
             else contextlib.nullcontext()), \
            resuming.attempt_clock(run.info.run_id, started_at) as since:
        run_names.name_train_run(run.info.run_id, recipe, profile, started_at, overrides)
        if data_dir:
            log_split_inputs(data_dir, TRAIN_INPUT_CONTEXTS)
        environ = {**os.environ, **cfg.profile.env}
        with system_metrics.recording(run.info.run_id, interval=interval, device=cfg.profile.device,
                                      environ=environ):
            yield run, since

