"""The metric writer's HTTP timeout, sized from how long the tracking server takes to answer.

A fixed timeout treats a slow server as a dead one: a server that answers every request in 15 s behind a 10 s
timeout never gets a write, and the run's end spills its final model and summaries although the server is up.
The writer starts with its usual timeout (``MLFLOW_HTTP_REQUEST_TIMEOUT``, at most 10 s), doubles it after each
request that ran out of time, and after each answer sets it to three times the slowest of the last answers
(never below the start), all bounded by ``VERLFLOW_METRICS_TIMEOUT_MAX_S`` (60 s) so that a server that accepts
connections and never answers still ends in a bounded time. MLflow reads ``MLFLOW_HTTP_REQUEST_TIMEOUT`` on each
request, so the timeout is applied by setting it in the writer's own environment.
"""

from __future__ import annotations

import math
import os
from collections import deque

from verlflow.util import env_number

MAX_TIMEOUT_S = int(env_number("VERLFLOW_METRICS_TIMEOUT_MAX_S", 60, integer=True, minimum=1))
# Answers remembered: a server that was slow a while ago but is quick now gets a short timeout again.
_RECENT = 8
# How much slower than the slowest recent answer a request may be before it counts as lost.
_MARGIN = 3.0


class RequestTimeout:
    """The writer's current request timeout in seconds, learned from the server's answers and its time-outs."""

    def __init__(self, start_s: int, max_s: float = MAX_TIMEOUT_S):
        self.start_s = start_s
        self.max_s = max(int(max_s), start_s)
        self.seconds = start_s
        self._answers: deque[float] = deque(maxlen=_RECENT)

    def answered(self, took_s: float) -> None:
        """A request was answered after ``took_s`` seconds: the timeout follows the slowest recent answer."""
        self._answers.append(took_s)
        self._set(max(self.start_s, _MARGIN * max(self._answers)))

    def ran_out(self) -> None:
        """A request ran out of time: the next one waits twice as long (up to the bound)."""
        self._set(self.seconds * 2)

    def apply(self) -> None:
        """Make MLflow's next requests in this process use the current timeout."""
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(self.seconds)

    def _set(self, seconds: float) -> None:
        self.seconds = min(self.max_s, max(self.start_s, math.ceil(seconds)))  # MLflow takes whole seconds
        self.apply()
