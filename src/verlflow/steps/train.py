"""The train step: resolve what the user asked for, open the run, hand over to a backend.

    mlflow run . --env-manager local -e train -P device=cpu

``train`` chooses recipe, profile and backend from the device when they are ``auto``:

| device | recipe                | profile | backend |
| ------ | --------------------- | ------- | ------- |
| npu    | qwen3-4b-gsm8k-grpo   | a3      | verl    |
| gpu    | qwen3-4b-gsm8k-grpo   | h20     | verl    |
| cpu    | smoke                 | cpu     | local   |
| cpu    | smoke (backend=verl)  | cpu-verl| verl    |
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from verlflow import config, tracking
from verlflow.backends.verl import ray_cluster
from verlflow.device import detect as device
from verlflow.device import system_metrics
from verlflow.errors import VerlflowError
from verlflow.input_checks import check_config_counts
from verlflow.names import DATA_DIGEST_TAG, MODEL_NAME_TAG, STEP_TAG
from verlflow.runs import naming as run_names

log = logging.getLogger(__name__)

GUIDE_RECIPE = "qwen3-4b-gsm8k-grpo"
SMOKE_RECIPE = "smoke"
PROFILE_FOR_DEVICE = {"npu": "a3", "gpu": "h20", "cpu": "cpu"}
# verl's own trainer on the CPU (backend=verl, device=cpu): loads verlflow's CPU plugin into verl.
VERL_CPU_PROFILE = "cpu-verl"
BACKENDS = ("auto", "verl", "local")
# How a train run uses each split (MLflow dataset input contexts): it trains on one and validates on the other.
TRAIN_INPUT_CONTEXTS = {"train": "training", "test": "validation"}


def choose_train_setup(recipe: str, device_name: str, profile: str, backend: str) -> tuple[str, str, str, str]:
    """Resolve ``auto`` recipe / device / profile / backend into concrete names (see the module table)."""
    if backend not in BACKENDS:
        raise VerlflowError(f"unknown backend '{backend}': use one of {', '.join(BACKENDS)}")
    dev = device.detect_device(device_name)
    if recipe == "auto":
        recipe = SMOKE_RECIPE if dev == "cpu" else GUIDE_RECIPE
    if backend == "auto":
        backend = "local" if dev == "cpu" else "verl"
    if profile == "auto":
        profile = VERL_CPU_PROFILE if (dev, backend) == ("cpu", "verl") else PROFILE_FOR_DEVICE[dev]
    return recipe, dev, profile, backend


def compose_train_config(recipe: str, profile: str, data_dir: str, model: str, overrides: str, *,
                         check_counts: bool = True):
    """Compose the training config with the data files and model the step parameters point at.

    ``check_counts=False`` leaves the count checks to the verl preflight, which lists them with the rest.
    """
    extra = {
        "data.train_files": str(Path(data_dir) / "train.parquet"),
        "data.val_files": str(Path(data_dir) / "test.parquet"),
    }
    if model:
        extra["actor_rollout_ref.model.path"] = model
    cfg = config.compose(recipe, profile, overrides, extra=extra)
    if check_counts:
        check_config_counts(cfg.resolved)
    return cfg


def check_train_inputs(cfg: config.ComposedConfig, data_dir: str, *, require_splits: bool = True) -> None:
    """The data splits and a local model folder are readable, before a run is opened (seconds, not minutes).

    ``require_splits=False`` (verl launches) leaves a missing split to the verl preflight, which lists it
    with every other launch mistake.
    """
    from verlflow.config.schema import VerlflowBlock
    from verlflow.data.recipe_data import preprocess_command
    from verlflow.input_checks import check_model_folder, check_parquet_split

    for split in ("train", "test"):
        path = Path(data_dir) / f"{split}.parquet"
        if path.exists():
            check_parquet_split(path, required=(str(cfg.resolved.data.prompt_key), "reward_model"))
        elif require_splits:
            command = preprocess_command(cfg.verlflow.data_source or VerlflowBlock.data_source, data_dir)
            raise VerlflowError(f"data_dir '{data_dir}' has no {split}.parquet: run `{command}` first")
    check_model_folder(str(cfg.resolved.actor_rollout_ref.model.path))


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


def run_train(
    recipe: str,
    device: str,
    profile: str,
    data_dir: str,
    model: str,
    overrides: str,
    backend: str,
    dry_run: bool,
    ray_address: str,
    resume: str = "",
):
    """Train with GRPO (step ``train``): verl on npu/gpu, the local trainer on cpu or when asked.

    ``resume``: a train run id to continue in place from its last checkpoint (:mod:`verlflow.runs.resume`).
    """
    from verlflow.runs import resume as resuming

    started_at = time.time()
    args = {"recipe": recipe, "device": device, "profile": profile, "data_dir": data_dir, "model": model,
            "overrides": overrides, "backend": backend, "dry_run": dry_run, "ray_address": ray_address}
    if resume:
        defaults = {p.name: p.default for p in _train_params()}
        defaults["dry_run"] = False
        args = resuming.prepare_resume(resume, args, defaults)
        args.pop("resume")
        recipe, device, profile, data_dir, model, overrides, backend, dry_run, ray_address = args.values()
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
    run_tags = {**_lineage_tags(cfg, data_dir), **resuming.args_tag(args)}
    if backend == "local":
        if dry_run or ray_address:
            raise VerlflowError("dry_run and ray_address apply to backend=verl only; the local trainer runs here")
        from verlflow.backends.local import trainer as local

        tags = tracking.standard_tags(backend="local", recipe=recipe, profile=profile)
        spill_root = Path(str(cfg.verlflow.output_dir or local.DEFAULT_OUTPUT_ROOT))
        with _train_run(cfg, {**tags, **run_tags}, recipe, profile, started_at, interval,
                        spill_root=spill_root, overrides=overrides, data_dir=data_dir) as (run, since):
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
                    overrides=overrides, data_dir=data_dir) as (run, since):
        if point is not None:
            from verlflow.backends.verl.command import checkpoint_dir_of

            _resume_verl_at(run.info.run_id, point, checkpoint_dir_of(cfg, run.info.run_id))
        return verl_backend.train_verl(
            cfg, run_id=run.info.run_id, dry_run=dry_run,
            ray_address=ray_address, started_at=since,
        )


def _verl_resume_point(run_id: str, cfg: config.ComposedConfig, ray_address: str):
    """Where a resumed verl run continues (checked before the run is reopened); None for a Ray job."""
    from verlflow.backends.verl import resume as verl_resume

    mode = str(cfg.resolved.trainer.get("resume_mode", "auto"))
    if mode != "auto":
        raise VerlflowError(f"resume: the run's config has trainer.resume_mode={mode}; verlflow resumes verl "
                            "through verl's resume_mode=auto (its checkpoint tracker file): drop that override")
    if ray_address:
        print("verlflow: resume: Ray job: verl loads the newest checkpoint on the cluster's storage "
              "(resume_mode=auto); its step is not checked against the run from here")
        return None
    from verlflow.backends.verl.command import checkpoint_dir_of

    return verl_resume.choose_resume_point(run_id, checkpoint_dir_of(cfg, run_id))


def _resume_verl_at(run_id: str, point, checkpoint_dir: str) -> None:
    """Point verl at the chosen checkpoint and record it on the run (metric and tag), with a console line."""
    from mlflow.tracking import MlflowClient

    from verlflow.backends.verl import resume as verl_resume
    from verlflow.names import RESUMED_FROM_TAG
    from verlflow.runs import resume as resuming

    verl_resume.point_verl_at(point, checkpoint_dir)
    resuming.log_resumed_from(run_id, point.step)
    if point.folder is not None:
        MlflowClient().set_tag(run_id, RESUMED_FROM_TAG, str(point.folder))
    again = f"; step(s) {', '.join(map(str, point.rerun))} checkpointed but never logged run again" \
        if point.rerun else ""
    start = f"after {point.folder}" if point.folder is not None else "from step 1 (no step had reached the run)"
    print(f"verlflow: resume: run {run_id} continues {start}{again}", flush=True)


@contextlib.contextmanager
def _train_run(cfg, tags, recipe, profile, started_at, interval, *, spill_root: Path | None = None,
               overrides="", data_dir=""):
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

    with tracking.tracked_run(tags=tags, log_system_metrics=False, experiment=recipe_experiment(recipe)) as run, \
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


def _train_params():
    from verlflow.steps import STEPS

    return STEPS["train"].params
