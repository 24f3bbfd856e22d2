"""Fail fast on a tracking server that cannot be reached, before a step opens a run.

    MLFLOW_TRACKING_URI=http://127.0.0.1:9 verlflow preprocess --source synthetic   # one line, exit 2

MLflow's client retries a dead server for minutes (backoff over several attempts), then prints a
traceback. One ``GET /health`` with a short timeout answers the same question in seconds. Only
``http(s)`` URIs are probed; a SQLite or file store costs nothing extra.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
import urllib.error
import urllib.request

import mlflow

from verlflow.errors import VerlflowError

PROBE_TIMEOUT_S = float(os.environ.get("VERLFLOW_PROBE_TIMEOUT_S", "5"))
PROBE_ATTEMPTS = 2
PROBE_PAUSE_S = 1.0


def _ssl_context() -> ssl.SSLContext | None:
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        return ssl._create_unverified_context()
    if cert := os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"):
        return ssl.create_default_context(cafile=cert)
    return None


def _probe_once(url: str, timeout_s: float) -> str | None:
    """None when the server answered (any HTTP status); else why not. Bounded also for DNS lookups."""
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(url, timeout=timeout_s, context=_ssl_context()).close()
            outcome.append(None)
        except urllib.error.HTTPError:
            outcome.append(None)  # it answered: authentication and the rest are MLflow's to report
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            outcome.append(str(reason).splitlines()[0] if str(reason) else type(exc).__name__)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s + 1)
    return outcome[0] if outcome else f"no answer within {timeout_s:.0f} s"


def check_tracking_server(uri: str | None = None, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise a one-line :class:`VerlflowError` when an http(s) tracking URI does not answer (about 2 x timeout)."""
    uri = uri or mlflow.get_tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return
    url = uri.rstrip("/") + "/health"
    for attempt in range(PROBE_ATTEMPTS):
        reason = _probe_once(url, timeout_s)
        if reason is None:
            return
        if attempt + 1 < PROBE_ATTEMPTS:
            time.sleep(PROBE_PAUSE_S)
    raise VerlflowError(f"tracking server {uri} cannot be reached ({reason}): start it, or point "
                        "MLFLOW_TRACKING_URI at a running one (unset = sqlite:///mlflow.db here)")
