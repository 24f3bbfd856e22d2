"""The preprocess and train steps: resolve what the user asked for, open the run, hand over to the code.

    mlflow run . --env-manager local -e preprocess -P source=synthetic
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

import mlflow

from verlflow import config, device, run_names, system_metrics, tracking
from verlflow.errors import VerlflowError

log = logging.getLogger(__name__)

GUIDE_RECIPE = "qwen3-4b-gsm8k-grpo"
SMOKE_RECIPE = "smoke"
PROFILE_FOR_DEVICE = {"npu": "a3", "gpu": "h20", "cpu": "cpu"}
# verl's own trainer on the CPU (backend=verl, device=cpu): loads verlflow's CPU plugin into verl.
VERL_CPU_PROFILE = "cpu-verl"
BACKENDS = ("auto", "verl", "local")


def run_preprocess(source: str, output_dir: str, limit: int):
    """Preprocess GSM8K into verl's parquet format inside a tracked run (step ``preprocess``)."""
    from verlflow import data

    if limit < 0:
        raise VerlflowError(f"limit must be 0 (all rows) or a positive row count, got {limit}")
    with tracking.tracked_run(tags={"verlflow.step": "preprocess"}):
        result = data.preprocess(source, output_dir, limit)
        mlflow.set_tag("verlflow.data_dir", str(Path(result.output_dir).resolve()))
    print(f"preprocess: {result.num_train} train / {result.num_test} test rows → {result.output_dir}")
    return result


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


def compose_train_config(recipe: str, profile: str, data_dir: str, model: str, overrides: str):
    """Compose the training config with the data files and model the step parameters point at."""
    extra = {
        "data.train_files": str(Path(data_dir) / "train.parquet"),
        "data.val_files": str(Path(data_dir) / "test.parquet"),
    }
    if model:
        extra["actor_rollout_ref.model.path"] = model
    return config.compose(recipe, profile, overrides, extra=extra)


def _lineage_tags(cfg: config.ComposedConfig, data_dir: str) -> dict[str, str]:
    """Tags a train run carries for the registry: its step, model name and the digest of its data."""
    from verlflow.data import data_dir_digest

    tags = {"verlflow.step": "train"}
    if cfg.verlflow.get("model_name"):
        tags["verlflow.model_name"] = str(cfg.verlflow["model_name"])
    digest = data_dir_digest(data_dir)
    if digest:
        tags["data.digest"] = digest
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
):
    """Train with GRPO (step ``train``): verl on npu/gpu, the local trainer on cpu or when asked."""
    started_at = time.time()
    recipe, dev, profile, backend = choose_train_setup(recipe, device, profile, backend)
    cfg = compose_train_config(recipe, profile, data_dir, model, overrides)
    if cfg.profile.device != dev:
        raise VerlflowError(f"profile '{cfg.profile.name}' is for device '{cfg.profile.device}', not '{dev}'")
    interval = system_metrics.sampling_interval(cfg.verlflow)
    if backend == "local":
        if dry_run or ray_address:
            raise VerlflowError("dry_run and ray_address apply to backend=verl only; the local trainer runs here")
        from verlflow.backends import local

        tags = tracking.standard_tags(backend="local", recipe=recipe, profile=profile)
        with _train_run(cfg, tags, data_dir, recipe, profile, started_at, interval) as run:
            return local.train_local(cfg, data_dir=data_dir, run_id=run.info.run_id, started_at=started_at)
    from verlflow.backends import verl as verl_backend

    tags = tracking.standard_tags(backend="verl", recipe=recipe, profile=profile)
    # A dry run launches nothing: no system metrics to sample.
    with _train_run(cfg, tags, data_dir, recipe, profile, started_at, None if dry_run else interval) as run:
        return verl_backend.train_verl(
            cfg, run_id=run.info.run_id, data_dir=data_dir, dry_run=dry_run,
            ray_address=ray_address, started_at=started_at,
        )


@contextlib.contextmanager
def _train_run(cfg, tags, data_dir, recipe, profile, started_at, interval):
    """The train run, named for the UI, with system metrics sampled for as long as it trains."""
    with tracking.tracked_run(tags={**tags, **_lineage_tags(cfg, data_dir)}, log_system_metrics=False) as run:
        run_names.name_train_run(run.info.run_id, recipe, profile, started_at)
        environ = {**os.environ, **cfg.profile.env}
        with system_metrics.recording(run.info.run_id, interval=interval, device=cfg.profile.device,
                                      environ=environ):
            yield run
