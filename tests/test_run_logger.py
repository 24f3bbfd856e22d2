"""Each backend's run logger writes the same run: metrics at their step, a table, tags (issue 44, item 4).

Real MLflow (a SQLite store per test); the local backend's logger is the real buffer with its writer process.
"""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from verlflow import config
from verlflow.backends.registry import get_backend
from verlflow.tracking.run_logger import RunLogger


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
