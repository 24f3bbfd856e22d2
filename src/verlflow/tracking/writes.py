"""What a step writes into a run, in verlflow's words: into its own (active) run — tags, params, text, files,
metrics — or into a run named by id — a tag, its note, traces linked to it, the end of a run whose process died.

    python -c "from verlflow.tracking import writes; help(writes.log_file)"

The MLflow calls stay here, so the modules that record something do not bind to MLflow's API. MLflow is imported
inside each function: importing this module does not load MLflow.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from verlflow.util import first_line

log = logging.getLogger(__name__)


def set_tag(key: str, value: Any) -> None:
    """Tag the active run."""
    import mlflow

    mlflow.set_tag(key, value)


def set_tags(tags: Mapping[str, Any]) -> None:
    """Tag the active run with every key of ``tags`` (one request)."""
    import mlflow

    mlflow.set_tags(tags)


def log_params(params: Mapping[str, Any]) -> None:
    """Log ``params`` on the active run (one request; MLflow refuses a param whose value changed)."""
    import mlflow

    mlflow.log_params(params)


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log ``metrics`` on the active run as they are (no key sanitising: see ``tracking.log_metrics`` for that)."""
    import mlflow

    mlflow.log_metrics(metrics, step=step)


def log_text(text: str, artifact_file: str) -> None:
    """Write ``text`` as the artifact ``artifact_file`` of the active run."""
    import mlflow

    mlflow.log_text(text, artifact_file)


def log_dict(data: Mapping[str, Any], artifact_file: str) -> None:
    """Write ``data`` as the JSON or YAML artifact ``artifact_file`` (by its suffix) of the active run."""
    import mlflow

    mlflow.log_dict(data, artifact_file)


def log_file(path: str, artifact_dir: str | None = None) -> None:
    """Copy the file ``path`` into the active run's artifacts, under ``artifact_dir`` (None: at their root)."""
    import mlflow

    mlflow.log_artifact(path, artifact_dir)


def log_folder(path: str, artifact_dir: str | None = None) -> None:
    """Copy the folder ``path``'s contents into the active run's artifacts, under ``artifact_dir``."""
    import mlflow

    mlflow.log_artifacts(path, artifact_dir)


def set_run_tag(run_id: str, key: str, value: str) -> None:
    """Tag run ``run_id`` (not necessarily this process's active run)."""
    from mlflow.tracking import MlflowClient

    MlflowClient().set_tag(run_id, key, value)


def set_note(client: Any, run_id: str, text: str) -> None:
    """Make ``text`` the description the MLflow UI shows for run ``run_id`` (written through ``client``)."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    client.set_tag(run_id, MLFLOW_RUN_NOTE, text)


def end_failed(client: Any, run_id: str, tags: Mapping[str, str]) -> None:
    """Tag run ``run_id`` with ``tags`` (one request) and end it FAILED, through ``client``."""
    from mlflow.entities import RunTag

    client.log_batch(run_id, tags=[RunTag(key, value) for key, value in tags.items()])
    client.set_terminated(run_id, "FAILED")


# MLflow links at most this many traces to a run per request.
LINK_BATCH = 100


def link_traces(run_id: str, experiment_id: str, query: str, *, tag: tuple[str, str]) -> int:
    """Link every trace of ``experiment_id`` that matches the filter ``query`` to run ``run_id`` (its *Traces*
    tab) and set ``tag`` on each; how many matched. A store that refuses is a warning, never an error."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    trace_ids: list[str] = []
    try:
        token = None
        while True:
            page = client.search_traces(locations=[experiment_id], filter_string=query,
                                        max_results=500, page_token=token, include_spans=False)
            trace_ids += [trace.info.trace_id for trace in page]
            token = page.token
            if not token:
                break
        for start in range(0, len(trace_ids), LINK_BATCH):
            client.link_traces_to_run(trace_ids[start:start + LINK_BATCH], run_id)
        for trace_id in trace_ids:
            client.set_trace_tag(trace_id, *tag)
    except MlflowException as exc:
        log.warning("rollout traces not linked to run %s: %s", run_id, first_line(exc, 200))
    return len(trace_ids)


def end_lost_run(client: Any, run_id: str, status: str, reason: str, *, mark: Mapping[str, str]) -> None:
    """Tag run ``run_id`` with ``mark``, then, when it is still RUNNING (its process is gone), with ``reason`` as
    its error, and end it ``status``; through ``client``. A store that refuses (the run deleted) is ignored."""
    from mlflow.exceptions import MlflowException

    from verlflow.names import ERROR_TAG
    from verlflow.secrets import mask_text

    with contextlib.suppress(MlflowException):
        for key, value in mark.items():
            client.set_tag(run_id, key, value)
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_tag(run_id, ERROR_TAG, mask_text(reason))
            client.set_terminated(run_id, status)
