"""A resumed train run's ``timing_s/e2e`` counts every attempt, one killed outright included.

Real MLflow (a SQLite store per test through the ``tracking_uri`` fixture); the killed attempt is a real
process that SIGKILLs itself inside :func:`verlflow.tracking.resume.attempt_clock`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from verlflow.tracking import resume

# An attempt that logs two steps and is then killed: its `finally` never runs, so it logs no time of its own.
_KILLED_ATTEMPT = textwrap.dedent("""
    import os, signal, sys, time
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient
    from verlflow.tracking import resume

    run_id, started_at = sys.argv[1], float(sys.argv[2])
    with resume.attempt_clock(run_id, started_at):
        for step in (1, 2):
            now = int(time.time() * 1000)
            MlflowClient().log_batch(run_id, metrics=[Metric("timing_s/step", 0.1, now, step)])
        os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_killed_attempts_time_is_counted_from_its_start_to_its_last_step(tracking_uri, tmp_path):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    first_started = time.time() - 30  # as if its model had loaded for 30 s before the clock was read
    killed = subprocess.run([sys.executable, "-c", _KILLED_ATTEMPT, run_id, repr(first_started)],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert client.get_metric_history(run_id, resume.ATTEMPT_METRIC) == []  # it could not say it itself
    last_step = max(m.timestamp for m in client.get_metric_history(run_id, "timing_s/step")) / 1000

    second_started = time.time()
    with resume.attempt_clock(run_id, second_started) as since:
        first = {m.step: m.value for m in client.get_metric_history(run_id, resume.ATTEMPT_METRIC)}
        assert first == {1: last_step - first_started}
        assert since == second_started - first[1]  # timing_s/e2e counts from the killed attempt's start
    attempts = {m.step: m.value for m in client.get_metric_history(run_id, resume.ATTEMPT_METRIC)}
    assert sorted(attempts) == [1, 2]


def test_an_attempt_that_logged_its_time_is_not_counted_twice(tracking_uri):
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    with resume.attempt_clock(run_id, time.time() - 5):
        client.log_batch(run_id, metrics=[Metric("timing_s/step", 0.1, int(time.time() * 1000), 1)])
    first = client.get_metric_history(run_id, resume.ATTEMPT_METRIC)
    started = time.time()
    with resume.attempt_clock(run_id, started) as since:
        assert since == started - first[0].value
    assert sorted(m.step for m in client.get_metric_history(run_id, resume.ATTEMPT_METRIC)) == [1, 2]
