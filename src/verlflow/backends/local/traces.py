"""The local trainer's sampled completions as MLflow traces of its run, as verl >= 0.9 traces its rollouts.

    verlflow train --device cpu --overrides "verlflow.rollout_traces=4"   # 4 traces per logged step (0 = off)

Each step that logs its samples table (``samples/step_<N>.json``) also records its first
``verlflow.rollout_traces`` rows as traces through the run's logger, one span each (inputs: the prompt; outputs:
the response and its reward), linked to the run, so the run's *Traces* tab shows them. The tags are verl's own
(``step``, ``sample_index``, ``validate``), so ``tags.step = '10'`` finds a step's completions whichever backend
trained. The train step's logger queues them to its writer process like the metrics (kept in the spill file
during an outage: :mod:`verlflow.outage.rollout_traces`); a store that cannot take traces costs the traces,
never the training.
"""

from __future__ import annotations

import logging
from typing import Any

from verlflow.tracking.run_logger import RunLogger, store_errors
from verlflow.util import first_line

log = logging.getLogger(__name__)


def trace_samples(samples: dict[str, list[Any]], step: int, limit: int, logger: RunLogger) -> int:
    """Record the first ``limit`` rows of a step's samples table as traces of ``logger``'s run; how many."""
    count = min(max(limit, 0), len(samples.get("response", [])))
    rows = [{key: samples[key][index] for key in ("prompt", "response", "reward")} for index in range(count)]
    if not rows:
        return 0
    try:
        logger.log_traces(step, rows)
    except store_errors() as exc:
        log.warning("samples of step %d not traced (%s); training goes on", step, first_line(exc, 200))
        return 0
    return count
