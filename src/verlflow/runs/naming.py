"""Runs that read well side by side in the MLflow UI: descriptive train run names, compare-runs links.

    python -c "from verlflow.runs.naming import train_run_name; print(train_run_name('qwen3-4b-gsm8k-grpo', 'a3'))"

A train run is named ``<recipe> · <profile> · <MMDD-HHMM>`` (``qwen3-4b-gsm8k-grpo · a3 · 1202-1416``)
unless someone named it: ``mlflow run --run-name`` (MLflow sets the name tag itself, before or after
the step starts — either way a real name is kept) or a caller such as a search trial. Only the names
MLflow makes up (``bold-cat-123``) and the pipeline's bare step name ``train`` are replaced.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Sequence

from mlflow.utils.name_utils import _GENERATOR_NOUNS, _GENERATOR_PREDICATES

from verlflow.runs.store_retry import LockRetryingClient

SEPARATOR = " · "
# The name the main pipeline gives its train child run (verlflow.pipeline creates it with the step name).
STEP_PLACEHOLDERS = {"train"}


def train_run_name(recipe: str, profile: str, started_at: float | None = None) -> str:
    """``<recipe> · <profile> · <MMDD-HHMM>`` in local time; recipe/profile paths shortened to their stem."""
    stamp = time.strftime("%m%d-%H%M", time.localtime(started_at))
    return SEPARATOR.join((_stem(recipe), _stem(profile), stamp))


def _stem(name: str) -> str:
    tail = name.replace("\\", "/").rsplit("/", 1)[-1]
    return tail.rsplit(".", 1)[0] if tail.endswith((".yaml", ".yml")) else tail


def is_generated_name(name: str | None) -> bool:
    """Whether ``name`` is one MLflow made up for an unnamed run (``<predicate>-<noun>-<number>``)."""
    if not name:
        return True
    parts = name.split("-")
    return (len(parts) == 3 and parts[0] in _GENERATOR_PREDICATES and parts[1] in _GENERATOR_NOUNS
            and parts[2].isdigit())


def name_train_run(run_id: str, recipe: str, profile: str, started_at: float | None = None) -> str:
    """Give a train run its descriptive name unless it already has a real one; return the name it has."""
    client = LockRetryingClient()
    current = client.get_run(run_id).info.run_name
    if not (is_generated_name(current) or current in STEP_PLACEHOLDERS):
        return current
    name = train_run_name(recipe, profile, started_at)
    client.update_run(run_id, name=name)
    return name


def compare_runs_link(tracking_uri: str, experiment_ids: Sequence[str], run_ids: Sequence[str]) -> str:
    """Where MLflow's compare-runs page for ``run_ids`` is, for a reader of the report.

    An http(s) tracking server: the page's URL. Any other store (SQLite file, folder): the
    ``mlflow ui --backend-store-uri …`` command to start, then the path to open on it.
    """
    # The UI builds this route as ?runs=<JSON list>&experiments=<JSON list>; quoted so terminals link it whole.
    query = urllib.parse.urlencode({
        "runs": json.dumps(list(run_ids), separators=(",", ":")),
        "experiments": json.dumps(list(dict.fromkeys(experiment_ids)), separators=(",", ":")),
    })
    page = f"#/compare-runs?{query}"
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/{page}"
    return f"mlflow ui --backend-store-uri '{tracking_uri}', then open http://127.0.0.1:5000/{page}"
