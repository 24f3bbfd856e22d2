"""Links to the MLflow UI pages a step's result is on, printed where the step ends.

    python -c "from verlflow.runs.ui_links import ui_address; print(ui_address('sqlite:///mlflow.db'))"

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
command that serves that store, and the URLs are those it serves (127.0.0.1, port 5000, which the command
names).
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Sequence

import mlflow

from verlflow.secrets import mask_url_password

# The query that opens the Model-training view whatever the browser chose last.
TRAINING_VIEW = "workflowType=machine_learning"
# MLflow's switch for its own run/experiment links on stdout.
MLFLOW_LINKS_OFF = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
# Where `mlflow ui` serves a local store (its defaults, also named in the printed command).
LOCAL_UI = "http://127.0.0.1:5000"


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
    return f"/compare-runs?{query}"


def model_version_route(name: str, version: str | int) -> str:
    """A registered model version's page (its source run, aliases, tags)."""
    return f"/models/{urllib.parse.quote(name, safe='')}/versions/{version}"


def ui_address(tracking_uri: str | None = None) -> tuple[str, str | None]:
    """The UI's base URL for this store, and the command that starts a UI on it (None: a server already does)."""
    uri = tracking_uri or mlflow.get_tracking_uri()
    if uri.startswith(("http://", "https://")):
        return mask_url_password(uri).rstrip("/"), None
    return LOCAL_UI, f"mlflow ui --backend-store-uri '{mask_url_password(uri)}' --port 5000"


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
