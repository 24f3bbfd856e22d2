"""Is a challenger better than the champion beyond the evaluation's noise? A paired test on the same problems.

    python -c "from verlflow.models.promotion_noise import paired_gain; print(paired_gain([1,1,0,1], [0,1,0,0]))"

Two versions evaluated on the same GSM8K problems (``evaluate`` logs every problem's strict score in
``eval/gsm8k_predictions.json`` and names its run on the version, tag ``eval.run_id``) are compared problem by
problem: the gain is the mean of the per-problem differences and its standard error their standard deviation
over sqrt(n) (a paired z-test, which for right/wrong scores is McNemar's test up to continuity). ``promote``
moves the alias only when the whole 95 % interval of the gain is above zero. 9 more problems right out of 512
(0.441 → 0.459) is inside that noise; the guide's model gaining 30 points is far outside it.

When the two were not evaluated on the same problems (or the tables are gone), the two accuracies are compared
as independent proportions over their ``eval.gsm8k.num_samples``; a metric with neither (a training curve's
last value) has no noise estimate, and then any gain counts, as the reason says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.models.evaluate import PREDICTIONS_TABLE

# Two-sided 95 %: the interval's half-width in standard errors.
Z_95 = 1.959964
# Fewest problems in common for the paired test; fewer and the versions count as evaluated apart.
MIN_PAIRED_PROBLEMS = 20
EVAL_RUN_TAG = "eval.run_id"
NUM_SAMPLES_TAG = "eval.gsm8k.num_samples"


@dataclass(frozen=True)
class Gain:
    """The challenger's gain over the holder, its 95 % interval, and how it was measured."""

    gain: float
    low: float
    high: float
    problems: int
    method: str  # "paired" (same problems) | "unpaired" (two independent proportions)

    @property
    def beyond_noise(self) -> bool:
        """The whole interval is above zero."""
        return self.low > 0

    def describe(self) -> str:
        """``+1.8 points, 95% interval [-0.9, +4.5] over 512 paired problems``."""
        where = "paired problems" if self.method == "paired" else "problems each, evaluated apart"
        return (f"{100 * self.gain:+.1f} points, 95% interval [{100 * self.low:+.1f}, {100 * self.high:+.1f}] "
                f"over {self.problems} {where}")


def paired_gain(challenger: Sequence[float], holder: Sequence[float]) -> Gain:
    """The gain of ``challenger`` over ``holder`` scored on the same problems, in the same order."""
    diffs = [c - h for c, h in zip(challenger, holder, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    variance = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    half = Z_95 * math.sqrt(variance / n)
    return Gain(mean, mean - half, mean + half, n, "paired")


def unpaired_gain(challenger: float, n_challenger: int, holder: float, n_holder: int) -> Gain:
    """The gain of one accuracy over another measured on different problems (independent proportions)."""
    se = math.sqrt(challenger * (1 - challenger) / n_challenger + holder * (1 - holder) / n_holder)
    gain = challenger - holder
    return Gain(gain, gain - Z_95 * se, gain + Z_95 * se, min(n_challenger, n_holder), "unpaired")


def _scores(client: MlflowClient, version: ModelVersion) -> dict[str, float] | None:
    """Each problem's strict score from the version's evaluation run, by question; None when not at hand."""
    import mlflow

    run_id = version.tags.get(EVAL_RUN_TAG)
    if not run_id:
        return None
    try:
        table = mlflow.load_table(PREDICTIONS_TABLE, run_ids=[run_id])
    except (MlflowException, OSError, KeyError):
        return None
    if not {"question", "correct"} <= set(table.columns):
        return None
    return {str(q): float(bool(c)) for q, c in zip(table["question"], table["correct"], strict=True)}


def measure_gain(client: MlflowClient, metric: str, challenger: ModelVersion, challenger_value: float,
                 holder: ModelVersion, holder_value: float) -> Gain | None:
    """The challenger's gain with its noise: paired where both were scored on the same problems, else as
    independent accuracies; None when the metric has no per-problem or sample-count record to measure it."""
    if metric != "eval/gsm8k/accuracy":
        return None
    mine, theirs = _scores(client, challenger), _scores(client, holder)
    if mine and theirs:
        common = sorted(set(mine) & set(theirs))
        if len(common) >= MIN_PAIRED_PROBLEMS:
            return paired_gain([mine[q] for q in common], [theirs[q] for q in common])
    try:
        n_mine, n_theirs = int(challenger.tags[NUM_SAMPLES_TAG]), int(holder.tags[NUM_SAMPLES_TAG])
    except (KeyError, ValueError):
        return None
    if n_mine < 1 or n_theirs < 1:
        return None
    return unpaired_gain(challenger_value, n_mine, holder_value, n_theirs)
