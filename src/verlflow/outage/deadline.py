"""No step waits forever on a tracking server that accepts requests and never answers them.

    VERLFLOW_TRACKING_DEADLINE_S=60 verlflow evaluate --model_uri runs:/<id>/model   # gives up after ~60 s

MLflow's client waits 120 s for each answer and retries a request seven times with back-off: a server that
hangs after the reachability probe held a step for over 15 minutes per call. :func:`bound_tracking` (every
step, at start) bounds each request by its own timeout instead, so that one call with all its tries fits in
``VERLFLOW_TRACKING_DEADLINE_S``: ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` (default 2) and
``MLFLOW_HTTP_REQUEST_TIMEOUT`` (the deadline shared by the tries, at most 20 s), each only where the user set
neither (a value they set is kept). A call that runs out of them fails in MLflow with a timeout;
:func:`as_deadline` words it as :class:`TrackingDeadline`: the step ends with one line naming the server
(exit 2), and a run it had open is ended or spilled (:mod:`verlflow.tracking.tracking`). Nothing is interrupted
from outside: a Ctrl-C during the wait is the stop handler's (:mod:`verlflow.stopping`).

Artifact transfers (a model upload of minutes) make progress; each of their reads is bounded by the same
timeout. Training's own writes go through the metric writer process, which never blocks the trainer.
"""

from __future__ import annotations

import os

from verlflow.util import env_number, exception_chain, first_line

DEADLINE_S = env_number("VERLFLOW_TRACKING_DEADLINE_S", 180.0, minimum=1)
# MLflow's defaults are 120 s and 7 retries; these keep one unanswered call near a minute at most.
MAX_TIMEOUT_S = 20
DEFAULT_RETRIES = 2
# How a request that ran out of time reads in MLflow's error (requests' and urllib3's words, any MLflow 3.x).
_TIMEOUT_WORDS = ("timed out", "timeout exception", "connecttimeout", "readtimeout")
_bound: dict[str, object] = {}  # the tracking URI bounded, and one call's longest wait in seconds


class TrackingDeadline(BaseException):
    """A wait on the tracking server past the deadline (see :func:`as_deadline`).

    A ``BaseException`` (as ``KeyboardInterrupt``) so that an ``except Exception`` that retries or logs a store
    error on the way up does not turn it into one more wait.
    """

    def __init__(self, uri: str, waited_s: float):
        super().__init__(f"tracking server {uri} did not answer for {waited_s:.0f} s "
                         f"(VERLFLOW_TRACKING_DEADLINE_S={DEADLINE_S:g}): check that it is up and not overloaded, "
                         "then run the step again")
        self.uri, self.waited_s = uri, waited_s


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it wraps) is a request that ran out of time, not one refused or failed."""
    return any(word in str(error).lower() for error in exception_chain(exc) for word in _TIMEOUT_WORDS)


def as_deadline(exc: BaseException) -> TrackingDeadline | None:
    """``exc`` as a :class:`TrackingDeadline` when it is an MLflow request to the bounded server that ran out of
    time (after its tries); None for any other error, or before :func:`bound_tracking`."""
    if isinstance(exc, TrackingDeadline):
        return exc
    if not _bound or not (type(exc).__module__.startswith("mlflow") and str(exc).startswith("API request to ")):
        return None
    if not timed_out(exc):
        return None
    return TrackingDeadline(str(_bound["uri"]), float(_bound["waited_s"]))


def server_failure(exc: BaseException) -> str | None:
    """One line for an MLflow request that failed at the server after its retries (500s, timeouts), else None.

    MLflow words these ``API request to <url> failed with …``; any other error is not the server's and keeps
    its traceback. A request that ran out of time is the deadline's line (:func:`as_deadline`).
    """
    from verlflow.outage.auth_errors import auth_failure

    if (refused := auth_failure(exc)) is not None:  # 401/403: the user's permission, not the server's health
        return refused
    if (late := as_deadline(exc)) is not None:
        return str(late)
    if type(exc).__module__.startswith("mlflow") and str(exc).startswith("API request to "):
        url = str(exc).removeprefix("API request to ").removeprefix("endpoint ").split()[0]
        return f"the tracking server failed a request to {url} after its retries ({first_line(exc)[:200]}): " \
               "check the server's health, then run the step again"
    return None


def bound_tracking(uri: str, deadline_s: float = DEADLINE_S) -> None:
    """Bound each MLflow request to ``uri`` so that one call with all its tries ends within ``deadline_s``.

    Called once per step, before anything reaches the tracking store; settings the user made are kept.
    """
    if not os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "").strip():
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(DEFAULT_RETRIES)
    tries = 1 + max(int(_number("MLFLOW_HTTP_REQUEST_MAX_RETRIES", DEFAULT_RETRIES)), 0)
    if not os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "").strip():
        # whole seconds: MLflow reads the setting as an int
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, int(min(MAX_TIMEOUT_S, deadline_s / tries))))
    _bound.update(uri=uri, waited_s=_number("MLFLOW_HTTP_REQUEST_TIMEOUT", MAX_TIMEOUT_S) * tries)


def _number(name: str, default: float) -> float:
    """MLflow's own numeric setting ``name`` (``default`` when unset or not a number: MLflow's to complain)."""
    try:
        return float(os.environ.get(name, ""))
    except ValueError:
        return default
