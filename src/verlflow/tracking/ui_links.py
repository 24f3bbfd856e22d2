"""Links to the MLflow UI pages a step's result is on, printed where the step ends.

    python -c "from verlflow.tracking.ui_links import ui_address; print(ui_address('sqlite:///mlflow.db'))"

Every link opens the UI's *Model training* view: the MLflow 3 UI remembers one GenAI / Model-training choice
per browser (GenAI on a new one) and lets it win over the experiment's ``mlflow.experimentKind`` tag, so an
experiment page without ``?workflowType=machine_learning`` may open on the GenAI *Overview* (traces, token
usage) instead of the runs table. The routes are the UI's own (its ``Routes`` in the JS bundle):
``#/experiments/<id>/runs``, ``#/experiments/<id>/runs/<run>``, ``#/compare-runs?runs=[…]&experiments=[…]``,
``#/models/<name>/versions/<n>``.

MLflow itself prints ``View run … at`` / ``View experiment at`` for every run that ends on a tracking server:
two lines per child run, to pages without the view, so the experiment opens on the GenAI *Overview*. A step
prints its own links instead (:func:`replace_mlflow_links`, called when a step starts).

On an http(s) tracking server the links are full URLs on the server's address (any password in it masked).
On any other store (the SQLite default) nothing serves the UI yet: the lines start with the ``mlflow ui``
command that serves that store, and the URLs are those it serves: 127.0.0.1 on the port the command names,
``VERLFLOW_UI_PORT`` when set, else 5000 when nothing listens there yet, else a free port (a UI or another
server already on 5000 would otherwise answer the links with the wrong store, or the command would fail).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import urllib.parse
from collections.abc import Sequence

import mlflow

from verlflow.secrets import mask_url_password

# The query that opens the Model-training view whatever the browser chose last.
TRAINING_VIEW = "workflowType=machine_learning"
# MLflow's switch for its own run/experiment links on stdout.
MLFLOW_LINKS_OFF = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
# Where `mlflow ui` serves a local store: its host, and its default port unless taken or VERLFLOW_UI_PORT says.
LOCAL_HOST = "127.0.0.1"
DEFAULT_UI_PORT = 5000
UI_PORT_ENV = "VERLFLOW_UI_PORT"


def experiment_route(experiment_id: str) -> str:
    """The experiment's runs table, in the Model-training view."""
    return f"/experiments/{experiment_id}/runs?{TRAINING_VIEW}"


def run_route(experiment_id: str, run_id: str) -> str:
    """One run's page (overview, metrics, artifacts)."""
    return f"/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW}"


def compare_route(experiment_ids: Sequence[str], run_ids: Sequence[str]) -> str:
    """MLflow's compare-runs page for these runs (the UI parses both lists as JSON)."""
    query = urllib.parse.urlencode({
        "runs": json.dumps(list(run_ids), separators=(",", ":")),
        "experiments": json.dumps(list(dict.fromkeys(experiment_ids)), separators=(",", ":")),
    })
    return f"/compare-runs?{query}&{TRAINING_VIEW}"


def model_version_route(name: str, version: str | int) -> str:
    """A registered model version's page (its source run, aliases, tags), in the Model-training view."""
    return f"/models/{urllib.parse.quote(name, safe='')}/versions/{version}?{TRAINING_VIEW}"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOCAL_HOST, port))
        except OSError:
            return False
    return True


def local_ui_port() -> int:
    """The port a printed ``mlflow ui`` command names: ``VERLFLOW_UI_PORT``, else 5000 if free, else a free one."""
    given = os.environ.get(UI_PORT_ENV, "").strip()
    if given.isdigit() and 0 < int(given) < 65536:
        return int(given)
    if _port_free(DEFAULT_UI_PORT):
        return DEFAULT_UI_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOCAL_HOST, 0))
        return probe.getsockname()[1]


def ui_address(tracking_uri: str | None = None, port: int | None = None) -> tuple[str, str | None]:
    """The UI's base URL for this store, and the command that starts a UI on it (None: a server already does).

    ``port``: for a store no server serves, the port to name (default :func:`local_ui_port`).
    """
    uri = tracking_uri or mlflow.get_tracking_uri()
    if uri.startswith(("http://", "https://")):
        return mask_url_password(uri).rstrip("/"), None
    port = port or local_ui_port()
    store = shlex.quote(mask_url_password(uri))
    return f"http://{LOCAL_HOST}:{port}", f"mlflow ui --backend-store-uri {store} --port {port}"


def link_lines(step: str, pages: Sequence[tuple[str, str]], tracking_uri: str | None = None) -> list[str]:
    """``<step>: <what>: <URL>`` for each (what, route), after the line that starts the UI where one is needed."""
    base, start = ui_address(tracking_uri)
    lines = [f"{step}: open in the MLflow UI after starting it with: {start}"] if start else []
    width = max((len(label) for label, _ in pages), default=0)
    lines += [f"{step}: {label + ':':<{width + 1}} {base}/#{route}" for label, route in pages]
    return lines


def print_links(step: str, pages: Sequence[tuple[str, str]], tracking_uri: str | None = None) -> None:
    """Print :func:`link_lines` (what a step ends with, so a user can open its result)."""
    for line in link_lines(step, pages, tracking_uri):
        print(line, flush=True)


def replace_mlflow_links() -> None:
    """Stop MLflow printing its own run and experiment links (they open the GenAI view), unless the user set
    the switch; the step prints :func:`link_lines` instead."""
    os.environ.setdefault(MLFLOW_LINKS_OFF, "true")
