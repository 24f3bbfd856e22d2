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

from verlflow.names import RUN_ID_TAG
from verlflow.tracking import lookups, writes
from verlflow.util import filter_quote


def link_rollout_traces(run_id: str, *, since_ms: int) -> int:
    """Link this launch's rollout traces to ``run_id`` and tag them; how many. Never fails the run."""
    run = lookups.run_by_id(run_id)
    name = filter_quote(run.info.run_name or run_id)
    query = f"tags.experiment_name = '{name}' AND timestamp_ms >= {int(since_ms)}"
    return writes.link_traces(run_id, run.info.experiment_id, query, tag=(RUN_ID_TAG, run_id))
