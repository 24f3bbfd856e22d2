"""Rollout traces written as records of a run's metric writer, so that an outage keeps them like its metrics.

    verlflow train --device cpu --overrides "verlflow.rollout_traces=4"   # 4 traces per logged step

The local trainer hands a step's sampled completions to its buffer (:func:`verlflow.outage.metric_buffer.log_traces`)
as one ``traces`` record ``{"step", "rows": [{"prompt", "response", "reward"}, ...]}``; the writer process (or the
spill file's upload, after an outage) makes them traces of the run with :func:`write_traces`: one root span each
(its response in a fenced code block, so the trace viewer shows it as written),
verl's tags (``step``, ``sample_index``, ``validate``), linked to the run. MLflow's exporter only logs a failed
send, so the traces are searched for afterwards: those missing raise (the record is retried, or kept in the spill
file), and those already there are not made twice.
"""

from __future__ import annotations

import inspect
from typing import Any

from verlflow.text_safety import markdown_verbatim


class TracesNotStored(OSError):
    """The tracking server did not store some of a step's traces (its exporter only logged why)."""


def _stored(client, experiment_id: str, run_id: str, step: str) -> set[str]:
    """The ``sample_index`` tags of the run's traces of ``step`` the server holds."""
    import mlflow

    if hasattr(mlflow, "flush_trace_async_logging"):  # MLflow's exporter may send in a thread of its own
        mlflow.flush_trace_async_logging()
    # Newer MLflow names the experiments `locations` (and warns on `experiment_ids`); an older one knows only those.
    where = "locations" if "locations" in inspect.signature(client.search_traces).parameters else "experiment_ids"
    found, token = set(), None
    while True:
        page = client.search_traces(run_id=run_id, include_spans=False, filter_string=f"tags.step = '{int(step)}'",
                                    page_token=token, **{where: [experiment_id]})
        found |= {trace.info.tags.get("sample_index") for trace in page}
        token = page.token
        if not token:
            return found


def write_traces(client, run_id: str, record: dict[str, Any]) -> int:
    """Make the record's rows traces of ``run_id`` (those it lacks); returns how many were made.

    Raises :class:`TracesNotStored` when the server holds fewer than the record's rows afterwards."""
    experiment_id = client.get_run(run_id).info.experiment_id
    step = str(int(record["step"]))
    have = _stored(client, experiment_id, run_id, step)
    takes_run = "run_id" in inspect.signature(client.start_trace).parameters
    made = []
    for index, row in enumerate(record["rows"]):
        if str(index) in have:
            continue
        tags = {"step": step, "sample_index": str(index), "validate": "false"}
        span = client.start_trace("rollout", span_type="LLM", inputs={"prompt": row["prompt"]},
                                  attributes={"step": int(step), "sample_index": index}, tags=tags,
                                  experiment_id=experiment_id, **({"run_id": run_id} if takes_run else {}))
        # As written: MLflow's trace viewer renders a string as Markdown ("#### 40" would read as a bold "40").
        outputs = {"response": markdown_verbatim(row["response"]), "reward": row["reward"]}
        client.end_trace(span.trace_id, outputs=outputs)
        made.append(span.trace_id)
    if made and not takes_run:
        client.link_traces_to_run(made, run_id)
    missing = len(record["rows"]) - len(_stored(client, experiment_id, run_id, step) & {
        str(i) for i in range(len(record["rows"]))})
    if missing:
        raise TracesNotStored(f"the tracking server did not store {missing} rollout traces of step {step}")
    return len(made)
