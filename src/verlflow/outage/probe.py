"""Fail fast on a tracking server that cannot be reached, before a step opens a run.

    MLFLOW_TRACKING_URI=http://127.0.0.1:9 verlflow preprocess --source synthetic   # one line, exit 2

MLflow's client retries a dead server for minutes (backoff over several attempts), then prints a
traceback. One GET of a real API endpoint (``experiments/search``) with a short timeout answers the same
question in seconds, and also tells a wrong path (``http://host:5000/nope``: a 404 there, where
``/health`` would answer from the server's root) from an MLflow server. Only ``http(s)`` URIs are probed;
a ``file:`` store is refused (MLflow keeps it in maintenance mode) and a URI holding a password is refused
before it is used or logged.
"""

from __future__ import annotations

import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow

from verlflow.errors import VerlflowError
from verlflow.outage.store_retry import open_store
from verlflow.secrets import url_secret
from verlflow.util import env_number

PROBE_TIMEOUT_S = env_number("VERLFLOW_PROBE_TIMEOUT_S", 5.0, minimum=0)
PROBE_ATTEMPTS = 2
PROBE_PAUSE_S = 1.0
# An endpoint every MLflow tracking server answers with 200 (GET allowed, cheap, no side effect).
API_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"


# The embedded default store, as MLflow >= 3.7 chooses it when nothing names one: a SQLite file in the working folder.
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def use_default_store() -> None:
    """Name the embedded default store, ``sqlite:///mlflow.db``, when nothing names a store, at every MLflow.

    MLflow 3.5 and 3.6 (which verlflow supports) fall back to a ``./mlruns`` file store that MLflow 3 no longer
    supports, where 3.7 and later fall back to this SQLite file: without it, every step on those releases was
    refused until MLFLOW_TRACKING_URI was set. Set in the environment, so verl and the metric writer see it too.
    When that file does not exist yet, one line on stderr says so first (:func:`new_store_line`).
    """
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return
    if mlflow.get_tracking_uri() == (Path.cwd() / "mlruns").as_uri():  # MLflow's own fall-back, not a choice
        os.environ["MLFLOW_TRACKING_URI"] = DEFAULT_TRACKING_URI
        mlflow.set_tracking_uri(DEFAULT_TRACKING_URI)
    here = Path.cwd() / "mlflow.db"  # MLflow >= 3.7 names it by its absolute path
    if mlflow.get_tracking_uri() in (DEFAULT_TRACKING_URI, f"sqlite:///{here}") and not here.exists():
        print(new_store_line(), file=sys.stderr, flush=True)


def new_store_line() -> str:
    """The line a step says before MLflow creates ``./mlflow.db``, the store nothing named: which store it is, that it
    is new (empty: a registry, runs and data made from another folder are not in it), and the checkout's own store
    when there is one elsewhere, so a step started in the wrong folder says so instead of "run register first"."""
    import verlflow

    here = Path.cwd() / "mlflow.db"
    line = f"verlflow: no MLFLOW_TRACKING_URI set: using {DEFAULT_TRACKING_URI}, a new, empty store at {here}"
    project = Path(verlflow.__file__).resolve().parents[2]  # the checkout of an editable install
    theirs = project / "mlflow.db"
    if (project / "MLproject").is_file() and theirs.is_file() and theirs.resolve() != here.resolve():
        return f"{line}; the project's store is {theirs}: set MLFLOW_TRACKING_URI=sqlite:///{theirs} to use it"
    return f"{line}; set MLFLOW_TRACKING_URI to use another"


def check_tracking_uri(uri: str) -> None:
    """A tracking URI verlflow can use: no secret in it (it is printed in commands and logs) and not ``file:``.

    MLflow 3 keeps the ``file:`` store in maintenance mode and fails on it with a traceback; a password in
    the URI would reach the logs of every run that prints its upload command.
    """
    if where := url_secret(uri):
        raise VerlflowError(f"MLFLOW_TRACKING_URI holds a secret ({where}): drop it from the URI and set "
                            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead")
    if uri.startswith(("file:", "/", "./", "../", "~")):
        raise VerlflowError(f"MLFLOW_TRACKING_URI={uri} is a file store, which MLflow no longer supports: use "
                            "sqlite:///mlflow.db (a file here) or a tracking server http://host:5000")


def _ssl_context() -> ssl.SSLContext | None:
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        return ssl._create_unverified_context()
    if cert := os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"):
        return ssl.create_default_context(cafile=cert)
    return None


def _probe_once(url: str, timeout_s: float) -> str | None:
    """None when the MLflow API answered; else why not. Bounded also for DNS lookups."""
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(url, timeout=timeout_s, context=_ssl_context()).close()
            outcome.append(None)
        except urllib.error.HTTPError as exc:
            # 404/405: something answers there, but no MLflow API under this path. Anything else (401,
            # 403, 5xx) came from the API: authentication and the rest are MLflow's to report.
            outcome.append(f"HTTP {exc.code} from {url}: no MLflow API at this path"
                           if exc.code in (404, 405) else None)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            outcome.append(str(reason).splitlines()[0] if str(reason) else type(exc).__name__)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s + 1)
    return outcome[0] if outcome else f"no answer within {timeout_s:.0f} s"


def check_tracking_server(uri: str | None = None, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise a one-line :class:`VerlflowError` when the tracking URI cannot be used: it holds a password, it is
    a ``file:`` store, or an http(s) server does not answer its API (about 2 x timeout at most). A SQLite store
    is opened here, waiting for another process's write lock (:func:`~verlflow.outage.store_retry.open_store`)."""
    uri = uri or mlflow.get_tracking_uri()
    check_tracking_uri(uri)
    if not uri.startswith(("http://", "https://")):
        open_store(uri)  # a SQLite store another process holds locked: one line, then a wait
        return
    url = uri.rstrip("/") + API_PROBE
    for attempt in range(PROBE_ATTEMPTS):
        reason = _probe_once(url, timeout_s)
        if reason is None:
            return
        if reason.startswith("HTTP "):
            raise VerlflowError(f"tracking URI {uri} is not an MLflow server ({reason}): give the server's "
                                "root, e.g. http://127.0.0.1:5000")
        if attempt + 1 < PROBE_ATTEMPTS:
            time.sleep(PROBE_PAUSE_S)
    raise VerlflowError(f"tracking server {uri} cannot be reached ({reason}): start it, or point "
                        "MLFLOW_TRACKING_URI at a running one (unset = sqlite:///mlflow.db here)")
