"""verl's rollout traces, found after a launch and linked to the run that launched it.

verl's tracer (``verl.utils.rollout_trace``, ``backend=mlflow``) writes from its agent-loop workers, where no
MLflow run is active, so MLflow records no source run. Each trace does carry verl's tags ``step``,
``sample_index``, ``rollout_n``, ``validate`` and ``experiment_name`` (``trainer.experiment_name``: the
run's name, which :mod:`.command` forces). After the launch, :func:`link_rollout_traces` finds the
traces of this launch (that tag, created since it started) and links them to the run — they then show in
the run's *Traces* tab — and tags each with ``verlflow.run_id``, so a step's prompts and responses are one
filter away: ``tags.step = '3'``.
"""

from __future__ import annotations

import logging

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.names import RUN_ID_TAG
from verlflow.util import filter_quote, first_line

log = logging.getLogger(__name__)

# MLflow links at most this many traces to a run per request.
LINK_BATCH = 100


def link_rollout_traces(client: MlflowClient, run_id: str, *, since_ms: int) -> int:
    """Link this launch's rollout traces to ``run_id`` and tag them; how many. Never fails the run."""
    run = client.get_run(run_id)
    name = filter_quote(run.info.run_name or run_id)
    query = f"tags.experiment_name = '{name}' AND timestamp_ms >= {int(since_ms)}"
    trace_ids: list[str] = []
    try:
        token = None
        while True:
            page = client.search_traces(locations=[run.info.experiment_id], filter_string=query,
                                        max_results=500, page_token=token, include_spans=False)
            trace_ids += [trace.info.trace_id for trace in page]
            token = page.token
            if not token:
                break
        for start in range(0, len(trace_ids), LINK_BATCH):
            client.link_traces_to_run(trace_ids[start:start + LINK_BATCH], run_id)
        for trace_id in trace_ids:
            client.set_trace_tag(trace_id, RUN_ID_TAG, run_id)
    except MlflowException as exc:
        log.warning("rollout traces not linked to run %s: %s", run_id, first_line(exc, 200))
    return len(trace_ids)
