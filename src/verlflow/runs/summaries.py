"""A run's end-of-run timing figures, taken from its per-step history in the tracking store.

    verlflow train --device cpu        # logs them at the end of training (verlflow.runs.tracking.log_run_summaries)

``timing_s/e2e`` and ``timing_s_mean/<name>`` (the mean over steps of every per-step ``timing_s/<name>``),
logged at step 0. :func:`verlflow.runs.tracking.log_run_summaries` calls it at the end of training; the metric
writer (or the spill file's upload) calls it when the server was away then.
"""

from __future__ import annotations

from mlflow.entities import Metric

from verlflow.names import TIMING_E2E, TIMING_MEAN_PREFIX, TIMING_PREFIX


def log_timing_summaries(client, run_id: str, started_at: float, ended_at: float) -> dict[str, float]:
    """Log and return ``timing_s/e2e`` (= ``ended_at - started_at``) and the ``timing_s_mean/*`` of ``run_id``."""
    keys = [k for k in client.get_run(run_id).data.metrics if k.startswith(TIMING_PREFIX)]
    summaries: dict[str, float] = {}
    for key in keys:
        if key == TIMING_E2E:
            continue
        history = client.get_metric_history(run_id, key)
        if history:
            name = key.removeprefix(TIMING_PREFIX)
            summaries[f"{TIMING_MEAN_PREFIX}{name}"] = sum(m.value for m in history) / len(history)
    summaries[TIMING_E2E] = ended_at - started_at
    at = int(ended_at * 1000)  # the end's own time, not the upload's: a second upload of it is recognised
    client.log_batch(run_id, metrics=[Metric(key=k, value=float(v), timestamp=at, step=0)
                                      for k, v in summaries.items()])
    return summaries
