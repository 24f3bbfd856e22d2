"""Params and metric names are verl's own, and end-of-run summaries are the means of the per-step timings."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from verlflow.config import compose
from verlflow.names import GLOSSARY
from verlflow.tracking.tracking import (
    flatten_params,
    log_metrics,
    log_run_summaries,
    log_verl_params,
    sanitize_metric_key,
)


def test_params_are_flattened_like_verls_logger():
    params = flatten_params({"trainer": {"logger": ["console", "mlflow"], "nnodes": 1}, "x": None})
    assert params == {
        "trainer/logger/list_len": 2,
        "trainer/logger/0": "console",
        "trainer/logger/1": "mlflow",
        "trainer/nnodes": 1,
        "x": None,
    }


def test_local_runs_log_the_resolved_config_under_verls_keys(tracking_uri):
    cfg = compose("tiny", "cpu")
    with mlflow.start_run() as run:
        log_verl_params(cfg.to_container())
    params = MlflowClient().get_run(run.info.run_id).data.params
    assert params["actor_rollout_ref/actor/optim/lr"] == str(cfg.resolved.actor_rollout_ref.actor.optim.lr)
    assert params["algorithm/adv_estimator"] == "grpo"
    assert len(params) > 500  # the whole verl config, as verl would log it


@pytest.mark.parametrize(
    ("raw", "clean"),
    [("val-core/openai/gsm8k/reward/mean@1", "val-core/openai/gsm8k/reward/mean_at_1"),
     ("timing_s//gen", "timing_s/gen"), ("perf/mfu(actor)", "perf/mfu_actor_")],
)
def test_metric_keys_sanitized_like_verl(raw, clean):
    assert sanitize_metric_key(raw) == clean


def test_log_metrics_accepts_names_mlflow_would_reject(tracking_uri):
    with mlflow.start_run() as run:
        log_metrics({"val-core/openai/gsm8k/reward/mean@1": 0.5}, step=3)
    history = MlflowClient().get_metric_history(run.info.run_id, "val-core/openai/gsm8k/reward/mean_at_1")
    assert [(m.step, m.value) for m in history] == [(3, 0.5)]


def test_summaries_are_means_of_per_step_timings(tracking_uri):
    with mlflow.start_run() as run:
        for step, (gen, update) in enumerate([(1.0, 4.0), (3.0, 6.0)], start=1):
            mlflow.log_metrics({"timing_s/gen": gen, "timing_s/update_actor": update}, step=step)
    summaries = log_run_summaries(run.info.run_id, started_at=100.0, ended_at=160.0)
    assert summaries == {"timing_s_mean/gen": 2.0, "timing_s_mean/update_actor": 5.0, "timing_s/e2e": 60.0}
    logged = MlflowClient().get_run(run.info.run_id).data.metrics
    assert logged["timing_s_mean/gen"] == 2.0 and logged["timing_s/e2e"] == 60.0


def test_the_metrics_page_is_the_glossary_the_code_generates():
    import subprocess
    import sys
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    generated = subprocess.run([sys.executable, "-m", "verlflow.names"], capture_output=True, text=True,
                               check=True, timeout=120).stdout
    assert page == generated, "docs/metrics.md is stale: run `python -m verlflow.names > docs/metrics.md`"
    assert all(f"| `{name}` |" in page for name, _ in GLOSSARY)
