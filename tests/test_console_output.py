"""What a run prints: readable progress in a log file, and none of the warnings our own recipes trigger."""

from __future__ import annotations

import io
import logging

from verlflow import known_warnings
from verlflow.progress import progress_bar


def test_a_bar_in_a_log_file_writes_plain_lines_not_carriage_returns(monkeypatch):
    monkeypatch.setenv("VERLFLOW_PROGRESS_S", "3600")  # only the first and the last line are due
    log_file = io.StringIO()  # not a terminal
    bar = progress_bar(500, "GRPO", "step", stream=log_file)
    for _ in range(500):
        bar.set_postfix(reward="0.250", refresh=False)
        bar.update(1)
    bar.close()
    text = log_file.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert 2 <= len(lines) <= 4, lines
    assert lines[0].startswith("GRPO:   0% 0/500") and lines[-1].startswith("GRPO: 100% 500/500"), lines
    assert "reward=0.250" in lines[-1]


def test_known_library_warnings_are_dropped_and_others_of_their_loggers_kept(caplog):
    from verl.utils.tracking import _MlflowLoggingAdapter

    known_warnings.install()
    known_warnings.install()  # idempotent
    assert len([f for f in logging.getLogger("verl.utils.tracking").filters
                if isinstance(f, known_warnings._DropKnown)]) == 1
    with caplog.at_level(logging.WARNING):
        assert _MlflowLoggingAdapter()._sanitize_key("val-core/x/mean@1") == "val-core/x/mean_at_1"
        logging.getLogger("mlflow.transformers").warning(
            "The model card could not be retrieved from the hub due to 404")
        logging.getLogger("mlflow.transformers").warning("Unable to find license information for this model. …")
        logging.getLogger("mlflow.transformers").warning("something else went wrong")
    with caplog.at_level(logging.INFO):
        monitor = logging.getLogger("mlflow.system_metrics.system_metrics_monitor")
        monitor.info("Started monitoring system metrics.")  # each train run samples system/*: no news
        monitor.info("Successfully terminated system metrics monitoring!")
        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
        monitor.warning("Failed to log system metrics: disk")
    assert [r.getMessage() for r in caplog.records] == ["something else went wrong",
                                                        "Failed to log system metrics: disk"]
