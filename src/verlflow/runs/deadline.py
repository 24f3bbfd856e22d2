"""No step waits forever on a tracking server that accepts requests and never answers them.

    VERLFLOW_TRACKING_DEADLINE_S=60 verlflow evaluate --model_uri runs:/<id>/model   # gives up after ~60 s

MLflow's client waits 120 s for each answer and retries a request seven times with back-off: a server that
hangs after the reachability probe held a step for over 15 minutes per call. :func:`bound_tracking` (every
step, at start) does two things:

- short requests by default: :data:`REQUEST_DEFAULTS` for MLflow's own ``MLFLOW_HTTP_REQUEST_TIMEOUT`` /
  ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` where the user set neither (a value they set is kept);
- a total deadline: a watchdog thread looks at what the main thread is doing every :data:`SAMPLE_S`. While it
  waits inside MLflow's REST requests with no request answered quickly in between, the wait is counted; past
  ``VERLFLOW_TRACKING_DEADLINE_S`` the watchdog raises :class:`TrackingDeadline` in the main thread (through a
  signal, so a blocked socket read is interrupted at once). The step then ends with one line naming the server
  (exit 2), and a run it had open is ended or spilled (:mod:`verlflow.runs.tracking`).

Artifact transfers (a model upload of minutes) are not counted: they make progress, and each of their reads
is bounded by the request timeout. Only the main thread is watched: training's own writes go through the
metric writer process, which never blocks the trainer.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from verlflow.util import env_number, first_line

DEADLINE_S = env_number("VERLFLOW_TRACKING_DEADLINE_S", 180.0, minimum=1)
# MLflow's defaults are 120 s and 7 retries; these keep one unanswered call near a minute.
REQUEST_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "20", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
SAMPLE_S = 0.25
# A request seen for less than this was answered (or refused) by a server that is there: the count restarts.
QUICK_S = 1.0
# The main thread outside any request this long is doing the step's own work: the count restarts.
AWAY_S = 2.0
_SIGNAL = signal.SIGUSR2
_REST_FILE = os.path.join("mlflow", "utils", "rest_utils.py")
_ARTIFACT_DIR = os.path.join("mlflow", "store", "artifact")


class TrackingDeadline(BaseException):
    """Raised in the main thread when it has waited on the tracking server past the deadline.

    A ``BaseException`` (as ``KeyboardInterrupt``) so that MLflow's ``except Exception`` around its requests
    does not turn it into a retried or logged error.
    """

    def __init__(self, uri: str, waited_s: float):
        super().__init__(f"tracking server {uri} did not answer for {waited_s:.0f} s "
                         f"(VERLFLOW_TRACKING_DEADLINE_S={DEADLINE_S:g}): check that it is up and not overloaded, "
                         "then run the step again")
        self.uri, self.waited_s = uri, waited_s


def _waiting_request(frame) -> object | None:
    """The frame of the MLflow REST request the main thread is inside (not an artifact transfer), or None."""
    request = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.endswith(_REST_FILE) and frame.f_code.co_name == "http_request":
            request = frame
        elif _ARTIFACT_DIR in filename:
            return None
        frame = frame.f_back
    return request


class _Watchdog:
    """Counts the main thread's unanswered waits on the tracking server and ends them at the deadline."""

    def __init__(self, uri: str, deadline_s: float):
        self.uri, self.deadline_s = uri, deadline_s
        self.main = threading.main_thread()
        self.fired = False

    def run(self) -> None:
        stalled_since = away_since = request = None
        seen_since = 0.0
        while self.main.is_alive():
            time.sleep(SAMPLE_S)
            now = time.monotonic()
            current = _waiting_request(sys._current_frames().get(self.main.ident))
            if current is not request:
                if request is not None and now - seen_since < QUICK_S + SAMPLE_S:
                    stalled_since = None  # the last request was answered at once
                request, seen_since = current, now
            if current is None:
                away_since = away_since or now
                if now - away_since >= AWAY_S:
                    stalled_since = None
                continue
            away_since = None
            stalled_since = stalled_since or now
            if now - stalled_since >= self.deadline_s and not self.fired:
                self.fired, self.waited_s = True, now - stalled_since
                stalled_since = None  # ending the step's run gets a whole deadline of its own
                signal.pthread_kill(self.main.ident, _SIGNAL)


_watchdog: _Watchdog | None = None


def _raise_deadline(_signum, _frame) -> None:
    if _watchdog is not None and _watchdog.fired:
        _watchdog.fired = False
        raise TrackingDeadline(_watchdog.uri, _watchdog.waited_s)


def server_failure(exc: BaseException) -> str | None:
    """One line for an MLflow request that failed at the server after its retries (500s, timeouts), else None.

    MLflow words these ``API request to <url> failed with …``; any other error is not the server's and keeps
    its traceback.
    """
    from verlflow.runs.auth_errors import auth_failure

    if (refused := auth_failure(exc)) is not None:  # 401/403: the user's permission, not the server's health
        return refused
    if type(exc).__module__.startswith("mlflow") and str(exc).startswith("API request to "):
        url = str(exc).removeprefix("API request to ").removeprefix("endpoint ").split()[0]
        return f"the tracking server failed a request to {url} after its retries ({first_line(exc)[:200]}): " \
               "check the server's health, then run the step again"
    return None


def bound_tracking(uri: str, deadline_s: float = DEADLINE_S) -> None:
    """Short MLflow requests by default, and a watchdog that ends any wait on ``uri`` past ``deadline_s``.

    Called once per step from the main thread, before anything reaches the tracking store.
    """
    global _watchdog
    for key, value in REQUEST_DEFAULTS.items():
        if not os.environ.get(key, "").strip():
            os.environ[key] = value
    if _watchdog is not None or threading.current_thread() is not threading.main_thread():
        return
    signal.signal(_SIGNAL, _raise_deadline)
    _watchdog = _Watchdog(uri, deadline_s)
    threading.Thread(target=_watchdog.run, name="tracking-deadline", daemon=True).start()
