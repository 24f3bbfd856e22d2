"""What the local trainer writes into its MLflow run besides each step's metrics.

At the start, the run's description: the keys it ignores (tag ``verlflow.ignored_keys``), the resolved config
as params flattened as verl flattens them and as ``config/resolved.yaml`` (secrets masked), the device
profile; per logged step, the samples table ``samples/step_<N>.json`` and its traces; at the end, the run's
summaries, the final checkpoint's tag and its LoggedModel. With the train step's metric buffer open these go
through its writer process (an outage keeps them in the spill file), else straight to the store.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException

from verlflow.backends.local.settings import LocalSettings, ignored_reason
from verlflow.backends.local.traces import trace_samples
from verlflow.errors import VerlflowError
from verlflow.names import CHECKPOINT_DIR_TAG, IGNORED_KEYS_TAG
from verlflow.outage import logged_models
from verlflow.outage.store_retry import retry_on_lock
from verlflow.util import first_line

log = logging.getLogger(__name__)


def log_run_description(cfg: Any, settings: LocalSettings, run_id: str) -> None:
    """Log what the run ignores, its params and resolved config, and the device profile it runs on."""
    from verlflow.device import detect as device
    from verlflow.tracking import tracking

    for key, value in settings.ignored.items():
        # Information, not a warning: the recipes set verl-only keys (rollout.name=vllm) for the
        # cluster on purpose; the run's tag verlflow.ignored_keys keeps the list.
        log.info("local trainer ignores %s=%s (%s)", key, value, ignored_reason(key))
    retry_on_lock(mlflow.set_tag, IGNORED_KEYS_TAG, ",".join(settings.ignored) or "none")
    try:
        tracking.log_verl_params(cfg.to_container())
    except mlflow.exceptions.MlflowException as exc:
        raise VerlflowError(
            f"run {run_id} already holds params of a different config ({first_line(exc, 200)}): "
            "resume in a new run"
        ) from None
    retry_on_lock(mlflow.log_text, _to_yaml(cfg.resolved), "config/resolved.yaml")
    # The profile's env is what this run ran with (OMP_NUM_THREADS is applied in-process).
    environ = {**os.environ, **cfg.profile.env}
    tracking.log_device_profile(device.collect_device_profile(settings.device, environ=environ,
                                                                profile=cfg.profile))


def log_samples(samples: dict[str, list], step: int, *, run_id: str, traces: int) -> None:
    """Log a validation step's sample table (and its first ``traces`` rows as traces); a tracking outage costs
    the table, never the training."""
    from verlflow.outage import metric_buffer

    trace_samples(samples, step, traces, run_id)  # the run's Traces tab, as verl's
    if metric_buffer.log_table(run_id, samples, f"samples/step_{step}.json"):
        return  # queued for the writer process: an outage keeps it in the spill file
    try:
        mlflow.log_table(data=samples, artifact_file=f"samples/step_{step}.json")
    except MlflowException as exc:
        log.warning("samples of step %d not logged (tracking store unavailable: %s); training goes on",
                    step, first_line(exc, 200))


def log_checkpoint(run_id: str, folder: Path, step: int) -> None:
    """Record a checkpoint before the last as a LoggedModel of the run."""
    from verlflow.outage import metric_buffer

    logged_models.record_checkpoint_model(run_id, folder, step, link=metric_buffer.link_model)


def record_final(run_id: str, final: Path, step: int, started_at: float) -> dict[str, float]:
    """Flush the step metrics, log the run's summaries, tag the final checkpoint and record it as the run's
    final model; returns the summaries."""
    from verlflow.outage import metric_buffer
    from verlflow.tracking import tracking

    tracking.flush_metrics()  # the summaries read the per-step history back
    summaries = tracking.log_run_summaries(run_id, started_at)
    if not metric_buffer.set_tags(run_id, {CHECKPOINT_DIR_TAG: str(final)}):
        retry_on_lock(mlflow.set_tag, CHECKPOINT_DIR_TAG, str(final))
    logged_models.record_final_model(run_id, final, step, defer=metric_buffer.defer_final_model)
    return summaries


def _to_yaml(resolved: Any) -> str:
    from omegaconf import OmegaConf

    from verlflow.secrets import mask_tree

    return OmegaConf.to_yaml(mask_tree(OmegaConf.to_container(resolved, resolve=True)))
