"""What the local trainer writes into its MLflow run besides each step's metrics, all through the run's logger.

At the start, the run's description: the keys it ignores (tag ``verlflow.ignored_keys``), the resolved config
as params flattened as verl flattens them and as ``config/resolved.yaml`` (secrets masked), the device
profile; per logged step, the samples table ``samples/step_<N>.json`` and its traces; per profiled step, its
trace and summary table; at the end, the run's summaries, the final checkpoint's tag and its LoggedModel. The
train step's logger queues tables, tags and traces to its writer process (an outage keeps them in the spill
file) and writes the description at once (:class:`verlflow.tracking.run_logger.RunLogger`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from verlflow.backends.local.settings import LocalSettings, ignored_reason
from verlflow.backends.local.traces import trace_samples
from verlflow.errors import VerlflowError
from verlflow.names import CHECKPOINT_DIR_TAG, IGNORED_KEYS_TAG
from verlflow.tracking.run_logger import RunLogger, store_errors
from verlflow.util import first_line

log = logging.getLogger(__name__)


def log_run_description(cfg: Any, settings: LocalSettings, logger: RunLogger) -> None:
    """Log what the run ignores, its params and resolved config, and the device profile it runs on."""
    from verlflow.device import detect as device

    for key, value in settings.ignored.items():
        # Information, not a warning: the recipes set verl-only keys (rollout.name=vllm) for the
        # cluster on purpose; the run's tag verlflow.ignored_keys keeps the list.
        log.info("local trainer ignores %s=%s (%s)", key, value, ignored_reason(key))
    logger.set_tags({IGNORED_KEYS_TAG: ",".join(settings.ignored) or "none"})
    _log_params(cfg, logger)
    logger.log_text(_to_yaml(cfg), "config/resolved.yaml")
    # The profile's env is what this run ran with (OMP_NUM_THREADS is applied in-process).
    environ = {**os.environ, **cfg.profile.env}
    profile = device.collect_device_profile(settings.device, environ=environ, profile=cfg.profile)
    logger.set_tags(profile.to_tags())
    # As mlflow.log_dict writes a .json file.
    logger.log_text(json.dumps(profile.to_dict(), indent=2, default=str), "device_profile.json")


def _log_params(cfg: Any, logger: RunLogger) -> None:
    """The resolved verl config as params with verl's own keys, secrets masked (verl's runs log their own)."""
    from verlflow.config import loggable_tree
    from verlflow.secrets import mask_value
    from verlflow.tracking.tracking import flatten_params

    params = flatten_params(loggable_tree(cfg.resolved, cfg.overrides))
    mlflow_error, _ = store_errors()
    try:
        logger.log_params({k: ("None" if v is None else mask_value(k, v)) for k, v in params.items()})
    except mlflow_error as exc:  # the store refused a param: the run holds another value for it
        raise VerlflowError(
            f"run {logger.run_id} already holds params of a different config ({first_line(exc, 200)}): "
            "resume in a new run"
        ) from None


def log_samples(samples: dict[str, list], step: int, *, logger: RunLogger, traces: int) -> None:
    """Log a validation step's sample table (and its first ``traces`` rows as traces); a tracking outage costs
    the table, never the training."""
    trace_samples(samples, step, traces, logger)  # the run's Traces tab, as verl's
    try:
        logger.log_table(samples, f"samples/step_{step}.json")
    except store_errors() as exc:
        log.warning("samples of step %d not logged (tracking store unavailable: %s); training goes on",
                    step, first_line(exc, 200))


def log_step_profile(logger: RunLogger, step: int, trace: Path, summary: list[dict[str, Any]]) -> None:
    """A profiled step's Chrome trace and its summary table under ``profile/step_<N>/`` of the run."""
    from verlflow.tracking.profiling import SUMMARY_FILE, step_artifact_dir

    folder = step_artifact_dir(step)
    logger.log_artifact(trace, folder)
    columns = ("kind", "name", "time_ms", "calls")
    logger.log_table({column: [row.get(column) for row in summary] for column in columns}, f"{folder}/{SUMMARY_FILE}")


def record_final(logger: RunLogger, final: Path, step: int, started_at: float) -> dict[str, float]:
    """Flush the step metrics, log the run's summaries, tag the final checkpoint and record it as the run's
    final model; returns the summaries."""
    logger.flush()  # the summaries are over the per-step history
    summaries = logger.log_summaries(started_at)
    from verlflow.models.checkpoint_record import record_digest

    record_digest(logger.run_id, final, logger.log_params)
    logger.set_tags({CHECKPOINT_DIR_TAG: str(final)})
    logger.log_final_model(final, step)
    return summaries


def _to_yaml(cfg: Any) -> str:
    from omegaconf import OmegaConf

    from verlflow.config import loggable_tree

    return OmegaConf.to_yaml(loggable_tree(cfg.resolved, cfg.overrides))
