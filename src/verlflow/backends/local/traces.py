"""The local trainer's sampled completions as MLflow traces of its run, as verl >= 0.9 traces its rollouts.

    verlflow train --device cpu --overrides "verlflow.rollout_traces=4"   # 4 traces per logged step (0 = off)

Each step that logs its samples table (``samples/step_<N>.json``) also records its first
``verlflow.rollout_traces`` rows as traces, one span each (inputs: the prompt; outputs: the response and its
reward), created while the train run is active, so MLflow links them to it and the run's *Traces* tab shows
them. The tags are verl's own (``step``, ``sample_index``, ``validate``), so ``tags.step = '10'`` finds a
step's completions whichever backend trained. A store that cannot take traces costs the traces, never the
training.
"""

from __future__ import annotations

import logging
from typing import Any

from mlflow.exceptions import MlflowException

from verlflow.util import first_line

log = logging.getLogger(__name__)


def trace_samples(samples: dict[str, list[Any]], step: int, limit: int, run_id: str | None = None) -> int:
    """Record the first ``limit`` rows of a step's samples table as traces of the active run; how many.

    With ``run_id``'s metric buffer open they go to its writer process like the metrics (kept in the spill file
    during an outage, sent on replay or upload: :mod:`verlflow.outage.rollout_traces`)."""
    import mlflow

    from verlflow.outage import metric_buffer

    count = min(max(limit, 0), len(samples.get("response", [])))
    rows = [{key: samples[key][index] for key in ("prompt", "response", "reward")} for index in range(count)]
    if count and run_id is not None and metric_buffer.log_traces(run_id, step, rows):
        return count
    try:
        for index in range(count):
            with mlflow.start_span(name="rollout", span_type="LLM") as span:
                span.set_inputs({"prompt": samples["prompt"][index]})
                span.set_outputs({"response": samples["response"][index], "reward": samples["reward"][index]})
                span.set_attributes({"step": step, "sample_index": index})
            mlflow.MlflowClient().set_trace_tag(span.trace_id, "step", str(step))
            mlflow.MlflowClient().set_trace_tag(span.trace_id, "sample_index", str(index))
            mlflow.MlflowClient().set_trace_tag(span.trace_id, "validate", "false")
    except (MlflowException, OSError) as exc:
        log.warning("samples of step %d not traced (%s); training goes on", step, first_line(exc, 200))
        return 0
    return count
