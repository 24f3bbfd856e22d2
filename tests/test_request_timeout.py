"""The metric writer's request timeout follows the tracking server's answers, within its start and its bound.

The slow server end to end (a real server behind a delaying proxy) is in tests/test_spill_faults.py.
"""

from __future__ import annotations

import os

from verlflow.outage.request_timeout import RequestTimeout


def test_a_timeout_doubles_after_a_lost_request_and_stops_at_its_bound(monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    timeout = RequestTimeout(10, max_s=60)
    seen = []
    for _ in range(4):
        timeout.ran_out()
        seen.append((timeout.seconds, os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"]))
    assert seen == [(20, "20"), (40, "40"), (60, "60"), (60, "60")]  # whole seconds: MLflow reads an int


def test_answers_set_the_timeout_to_three_times_the_slowest_recent_one_never_below_the_start(monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    timeout = RequestTimeout(10, max_s=60)
    timeout.answered(15.2)  # a 15 s server: 46 s, so its answers arrive
    assert timeout.seconds == 46
    for _ in range(8):  # quick again: the slow answer leaves the recent ones, the start comes back
        timeout.answered(0.05)
    assert timeout.seconds == 10 and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "10"
    timeout.answered(100.0)
    assert timeout.seconds == 60  # bounded: a server that never answers still ends in bounded time
