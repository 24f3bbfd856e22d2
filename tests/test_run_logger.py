"""Each backend's run logger writes the same run: metrics at their step, a table, tags, and everything else the
local trainer records (params, text and files, rollout traces, checkpoints as models, summaries) (issue 44, item 4).

Real MLflow (a SQLite store per test); the local backend's logger is the real buffer with its writer process.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from verlflow import config
from verlflow.backends.registry import get_backend
from verlflow.outage import logged_models
from verlflow.tracking.run_logger import RunLogger, store_errors


@pytest.fixture(params=["local", "verl"])
def opened(request, tracking_uri, tmp_path):
    """A run and the logger its backend supplies for it, with the folders that logging needs."""
    cfg = config.compose("smoke", "cpu", f"verlflow.output_dir={tmp_path / 'out'}")
    logging = get_backend(request.param).run_logging(cfg)
    run_id = MlflowClient().create_run("0").info.run_id
    with logging.open(run_id) as logger:
        yield request.param, run_id, logger, logging.folders


def test_a_backends_logger_writes_metrics_a_table_and_tags_into_its_run(opened, tmp_path):
    backend, run_id, logger, folders = opened
    logger: RunLogger
    assert logger.run_id == run_id
    logger.log_metrics({"critic/score/mean": 0.25}, step=3, timestamp_ms=1_000)
    logger.log_table({"prompt": ["1+1"], "reward": [1.0]}, "samples/step_3.json")
    logger.set_tags({"verlflow.attempt": "1"})
    assert logger.flush(60)

    client = MlflowClient()
    [point] = client.get_metric_history(run_id, "critic/score/mean")
    assert (point.step, point.value, point.timestamp) == (3, 0.25, 1_000)
    assert client.get_run(run_id).data.tags["verlflow.attempt"] == "1"
    table = json.loads(open(client.download_artifacts(run_id, "samples/step_3.json", str(tmp_path))).read())
    assert table["data"] == [["1+1", 1.0]]
    # The local trainer's logger spills under the output folder, so that folder is checked before the run opens.
    assert [str(f) for f, _ in folders] == ([str(tmp_path / "out")] if backend == "local" else [])


@pytest.fixture(scope="module")
def tiny_model(tiny_workdir) -> Path:
    """The tiny recipe's Hugging Face folder (conftest builds it once per session): a final checkpoint."""
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    return Path(resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache"))


def test_a_backends_logger_writes_everything_a_trainer_records_into_its_run(opened, tmp_path, tiny_model):
    """The calls beyond metrics, tables and tags that the local trainer makes: the run reads the same whichever
    logger (the local backend's buffer with its writer process, or direct) made them."""
    _, run_id, logger, _ = opened
    trace = tmp_path / "trace.json.gz"
    trace.write_bytes(b"a profiled step")
    logger.log_params({"actor_rollout_ref/actor/optim/lr": 1e-6, "data/train_batch_size": 4})
    logger.log_text("data:\n  train_batch_size: 4\n", "config/resolved.yaml")
    logger.log_artifact(trace, "profile/step_2")
    assert logger.last_step("timing_s/step") == -1  # a fresh run: nothing to skip
    logger.log_metrics({"timing_s/step": 2.0, "critic/score/mean": 0.5}, step=1)
    logger.log_metrics({"timing_s/step": 4.0, "critic/score/mean": 0.75}, step=2)
    logger.log_traces(2, [{"prompt": "1+1?", "response": "2", "reward": 1.0}])
    logger.log_checkpoint_model(tmp_path / "global_step_2", 2)
    summaries = logger.log_summaries(time.time() - 10)
    logger.log_final_model(tiny_model, 2)
    assert logger.flush(60)
    with pytest.raises(store_errors()):  # a resumed run's config changed: the store says so, at once
        logger.log_params({"data/train_batch_size": 8})

    client = MlflowClient()
    run = client.get_run(run_id)
    assert run.data.params == {"actor_rollout_ref/actor/optim/lr": "1e-06", "data/train_batch_size": "4"}
    text = Path(client.download_artifacts(run_id, "config/resolved.yaml", str(tmp_path))).read_text()
    assert text == "data:\n  train_batch_size: 4\n"
    assert [f.path for f in client.list_artifacts(run_id, "profile/step_2")] == ["profile/step_2/trace.json.gz"]
    assert logger.last_step("timing_s/step") == 2
    assert summaries["timing_s_mean/step"] == 3.0 and 9 < summaries["timing_s/e2e"] < 60
    assert run.data.metrics["timing_s_mean/step"] == 3.0

    [traced] = mlflow.search_traces(run_id=run_id, return_type="list")
    assert {k: traced.info.tags[k] for k in ("step", "sample_index", "validate")} == \
        {"step": "2", "sample_index": "0", "validate": "false"}
    [span] = traced.data.spans
    assert (span.inputs, span.outputs) == ({"prompt": "1+1?"}, {"response": "```text\n2\n```", "reward": 1.0})

    models = {m.name: m for m in logged_models.run_models(run_id)}
    assert set(models) == {"checkpoint-2", "model"}
    assert {(o.model_id, o.step) for o in client.get_run(run_id).outputs.model_outputs} == \
        {(m.model_id, 2) for m in models.values()}
    for model in models.values():  # each model's page shows the metrics of the step that saved it
        assert {(p.key, p.step, p.value) for p in client.get_logged_model(model.model_id).metrics
                if p.key == "critic/score/mean"} == {("critic/score/mean", 2, 0.75)}
    assert "MLmodel" in {a.path for a in client.list_logged_model_artifacts(models["model"].model_id)}
