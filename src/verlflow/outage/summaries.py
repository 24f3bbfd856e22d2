"""A run's end-of-run timing figures, from the per-step timings its writer saw (or its history in the store).

    verlflow train --device cpu        # logs them at the end of training (verlflow.tracking.tracking.log_run_summaries)

``timing_s/e2e`` and ``timing_s_mean/<name>`` (the mean over steps of every per-step ``timing_s/<name>``),
logged at step 0. :func:`verlflow.tracking.tracking.log_run_summaries` calls it at the end of training; the metric
writer (or the spill file's upload) calls it when the server was away then. The local trainer's buffer hands
over the sums of the steps it logged (:class:`TimingSums`), so the end's replay writes them in one call instead
of reading one history per key; only the steps of an earlier attempt (a resumed run) are read back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlflow.entities import Metric

from verlflow.names import TIMING_E2E, TIMING_MEAN_PREFIX, TIMING_PREFIX


@dataclass
class TimingSums:
    """Sums and counts of the per-step ``timing_s/*`` points one process logged, from ``from_step`` on."""

    sums: dict[str, list[float]] = field(default_factory=dict)  # key -> [sum, count]
    from_step: int | None = None

    def add(self, metrics: dict[str, float], step: int) -> None:
        """Count one step's timing points (the others of ``metrics`` are ignored)."""
        for key, value in metrics.items():
            if key.startswith(TIMING_PREFIX) and key != TIMING_E2E:
                total = self.sums.setdefault(key, [0.0, 0])
                total[0], total[1] = total[0] + value, total[1] + 1
                self.from_step = step if self.from_step is None else min(self.from_step, step)

    def as_record(self) -> dict[str, Any]:
        """What a spill record carries of them (JSON)."""
        return {"sums": self.sums, "from_step": self.from_step}

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> TimingSums | None:
        """The sums a spill record carries; None for a record written before they were carried."""
        if not record or "sums" not in record:
            return None
        return cls({k: list(v) for k, v in record["sums"].items()}, record.get("from_step"))

    @property
    def complete(self) -> bool:
        """Whether they cover the run from its first step (nothing earlier to read back)."""
        return self.from_step is not None and self.from_step <= 1


def log_timing_summaries(client, run_id: str, started_at: float, ended_at: float,
                         known: TimingSums | None = None) -> dict[str, float]:
    """Log and return ``timing_s/e2e`` (= ``ended_at - started_at``) and the ``timing_s_mean/*`` of ``run_id``.

    With ``known`` sums that cover the run this is one write; otherwise the steps before ``known.from_step``
    (all of them without ``known``) are read from the run's history, one read per timing key."""
    totals = {k: list(v) for k, v in (known.sums if known else {}).items()}
    if known is None or not known.complete:
        before = known.from_step if known and known.from_step is not None else None
        for key in (k for k in client.get_run(run_id).data.metrics if k.startswith(TIMING_PREFIX)):
            if key == TIMING_E2E:
                continue
            history = [m.value for m in client.get_metric_history(run_id, key) if before is None or m.step < before]
            total = totals.setdefault(key, [0.0, 0])
            total[0], total[1] = total[0] + sum(history), total[1] + len(history)
    summaries = {f"{TIMING_MEAN_PREFIX}{key.removeprefix(TIMING_PREFIX)}": total / count
                 for key, (total, count) in totals.items() if count}
    summaries[TIMING_E2E] = ended_at - started_at
    at = int(ended_at * 1000)  # the end's own time, not the upload's: a second upload of it is recognised
    client.log_batch(run_id, metrics=[Metric(key=k, value=float(v), timestamp=at, step=0)
                                      for k, v in summaries.items()])
    return summaries
