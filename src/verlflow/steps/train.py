"""Step ``train``: resolve what the user asked for, open the run, hand over to a backend.

    mlflow run . --env-manager local -e train -P device=cpu

``auto`` recipe, profile and backend are chosen from the device (:mod:`verlflow.backends.train_setup`); the
backend is asked for by name (:mod:`verlflow.backends.registry`), never imported from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time

from verlflow import config, stopping
from verlflow.backends.registry import TrainLaunch, get_backend
from verlflow.backends.train_setup import (
    check_train_inputs,
    choose_train_setup,
    compose_train_config,
    settle_device,
)
from verlflow.backends.writable import check_writable_folders
from verlflow.device import system_metrics
from verlflow.errors import VerlflowError
from verlflow.names import DATA_DIGEST_TAG, DRY_RUN_TAG, MODEL_NAME_TAG, STEP_TAG
from verlflow.step_requests import TrainRequest
from verlflow.tracking import naming as run_names
from verlflow.tracking import tracking, ui_links, writes
from verlflow.tracking.run_logger import RunLogging

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
    """Train with GRPO (step ``train``): the chosen backend (verl on npu/gpu, the local trainer on cpu) in a run.

    ``request.resume``: a train run id to continue in place from its last checkpoint (:mod:`verlflow.tracking.resume`).
    ``run_id``: the train run, already created for it (``main``'s child); else a new run (or ``mlflow run``'s).
    """
    from verlflow.tracking import resume as resuming

    started_at = time.time()
    resume = request.resume
    if resume:
        request = resuming.prepare_resume(request)
        run_id = resume
    recipe, device, profile, data_dir, model, overrides = (
        request.recipe, request.device, request.profile, request.data_dir, request.model, request.overrides)
    recipe, dev, profile, backend_name = choose_train_setup(recipe, device, profile, request.backend)
    backend = get_backend(backend_name)
    # No NPU/GPU here: said first (refused, or a dry run told it is expected), before anything about the data.
    settle_device(dev, recipe, profile, overrides, dry_run=request.dry_run, ray_address=request.ray_address)
    launch = TrainLaunch(data_dir=data_dir, dry_run=request.dry_run, ray_address=request.ray_address,
                         resume=resume or "")
    cluster = backend.find_cluster(launch)
    if not data_dir:  # the recipe's data, where main puts it; prepared now when it can be made here
        from verlflow.data import recipe_data

        data_dir = recipe_data.step_data_dir("", recipe_data.recipe_source(recipe, overrides))
        launch = dataclasses.replace(launch, data_dir=data_dir)
    cfg = compose_train_config(recipe, profile, data_dir, model, overrides, check_counts=backend.checks_up_front)
    if cfg.profile.device is not dev:
        raise VerlflowError(f"profile '{cfg.profile.name}' is for device '{cfg.profile.device}', not '{dev}'")
    interval = system_metrics.sampling_interval(cfg.verlflow)
    check_train_inputs(cfg, data_dir, require_splits=backend.checks_up_front)
    run_logging = backend.run_logging(cfg)
    check_writable_folders(cfg, run_logging.folders)
    # Every train run says whether it trained, so a filter can leave dry runs out: tags.verlflow.dry_run = 'false'.
    # The record a later --resume trusts is the first attempt's: a resume neither rewrites nor re-logs it.
    record_tags, record_params = resuming.args_record(request) if not resume else ({}, {})
    run_tags = {**_lineage_tags(cfg, data_dir), **record_tags, DRY_RUN_TAG: str(request.dry_run).lower()}
    prepared = backend.prepare(cfg, launch, cluster)
    tags = tracking.standard_tags(backend=backend.name, recipe=recipe, profile=profile)
    with _train_run(cfg, {**tags, **run_tags}, recipe, profile, started_at,
                    interval if backend.samples_system_metrics(launch) else None,
                    run_logging=run_logging, overrides=overrides, data_dir=data_dir,
                    run_id=run_id, dry_run=request.dry_run, params=record_params) as (run, since, logger):
        result = backend.train(cfg, launch, run_id=run.info.run_id, started_at=since, prepared=prepared,
                               logger=logger)
    if tracking.parent_run_id(run) is None:  # a nested run (main's, a search trial's): its parent links it
        ui_links.print_links("train", [
            ("this run", ui_links.run_route(run.info.experiment_id, run.info.run_id)),
            ("runs of its experiment", ui_links.experiment_route(run.info.experiment_id)),
        ])
    return result


@contextlib.contextmanager
def _train_run(cfg, tags, recipe, profile, started_at, interval, *, run_logging: RunLogging,
               overrides="", data_dir="", run_id: str | None = None, dry_run: bool = False,
               params: dict[str, str] | None = None):
    """The train run, in its recipe's experiment, named for the UI, with its data splits as dataset inputs,
    timed across resumed attempts, with system metrics sampled while it trains.

    Yields the run, the start time its ``timing_s/e2e`` counts from (the first attempt's, on a resume) and the
    logger its backend's ``run_logging`` opened for it (the local trainer's: a buffer that rides out a tracking
    outage), which also logs its attempt time; the backend's ``train`` is handed that logger.
    """
    from verlflow.data.lineage import log_split_inputs
    from verlflow.tracking import resume as resuming
    from verlflow.tracking.experiments import recipe_experiment

    with tracking.tracked_run(tags=tags, log_system_metrics=False, experiment=recipe_experiment(recipe),
                              run_id=run_id) as run, \
            run_logging.open(run.info.run_id) as logger, \
            resuming.attempt_clock(run.info.run_id, started_at, logger) as since:
        if params:
            writes.log_params(params)
        run_names.name_train_run_or_warn(run.info.run_id, recipe, profile, overrides, dry_run=dry_run)
        if data_dir:
            log_split_inputs(data_dir, TRAIN_INPUT_CONTEXTS)
        environ = {**os.environ, **cfg.profile.env}
        stopping.stop_point()  # a stop during the run's set-up: no system-metric sampler, no backend started
        with system_metrics.recording(run.info.run_id, interval=interval, device=cfg.profile.device,
                                      environ=environ):
            yield run, since, logger

