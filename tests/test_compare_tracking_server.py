"""`compare` against a real `mlflow server` on 127.0.0.1: same report, histories read through MLflow's public client."""

from __future__ import annotations

import time

import pytest
from conftest import serving
from mlflow.tracking import MlflowClient

from verlflow.compare.comparison import compare_runs
from verlflow.tracking import tracking


@pytest.fixture
def server(tmp_path, monkeypatch):
    yield from serving(tmp_path, monkeypatch, {})


def _train_run(name: str, device: str, gen: float, score: float, e2e: float) -> str:
    started = time.time() - e2e
    with tracking.tracked_run(run_name=name, tags={"verlflow.step": "train", "device.type": device}) as run:
        for step in (1, 2, 3):
            tracking.log_metrics({"timing_s/gen": gen, "critic/score/mean": score * step,
                                  "actor/pg_loss": 0.1 * step}, step=step)
        tracking.log_run_summaries(run.info.run_id, started, ended_at=started + e2e)
    return run.info.run_id


@pytest.mark.slow
def test_compare_reads_a_tracking_server_through_public_history_calls_only(server, tmp_path):
    url, log = server.url, server.log
    base = _train_run("h20", "gpu", gen=10.0, score=0.1, e2e=100.0)
    cand = _train_run("a3", "npu", gen=8.0, score=0.1, e2e=158.0)
    already = len(log.read_text(errors="replace"))

    result = compare_runs(base, cand, str(tmp_path / "out"))

    rows = {r.key: r.ratio for r in result.timings}
    assert rows["timing_s_mean/gen"] == pytest.approx(0.8)
    assert rows["timing_s/e2e"] == pytest.approx(1.58)
    score = next(r for r in result.parity if r.key == "critic/score/mean")
    assert score.steps == [1, 2, 3] and score.passed
    assert "compare/report.md" in {f.path for f in MlflowClient().list_artifacts(result.run_id, "compare")}

    requests = log.read_text(errors="replace")[already:]
    # the public REST history call, once per run and logged curve (critic/score/mean, actor/pg_loss)
    assert requests.count("/metrics/get-history?") == 4
    assert "get-history-bulk-interval" not in requests
    assert url in result.report and f"{url}/#/compare-runs?" in result.report  # the server's own address
