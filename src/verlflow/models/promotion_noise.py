"""Is a challenger better than the champion beyond the evaluation's noise? An exact paired test on the same problems.

    python -c "from verlflow.models.promotion_noise import paired_gain; print(paired_gain([1,1,0,1], [0,1,0,0]))"

Two versions evaluated on the same GSM8K problems (``evaluate`` logs every problem's strict score in
``eval/gsm8k_predictions.json`` and names its run on the version, tag ``eval.run_id``) are compared problem by
problem with :func:`verlflow.compare.stats.promotion_gain`: exact McNemar on the problems only one of them got right,
one-sided at 2.5 %, divided by the number of candidates the challenger was picked from (``promote`` picks the best of
every version with a score, and a search's version is already the best of its trials on the same problems), with the
Clopper-Pearson interval of the gain at that level. ``promote`` moves the alias only when the interval is above zero.
9 more problems right out of 512 (0.441 → 0.459) is inside that noise; the guide's model gaining 30 points is far
outside it. The tables are read by run (the run's artifact), so the test is paired whatever experiment is active.

When the two were not evaluated on the same problems (or the tables are gone), the two accuracies are compared
as independent proportions over their ``eval.gsm8k.num_samples`` (a score interval at the same corrected level); a
metric with neither (a training curve's last value) has no noise estimate, and then any gain counts, as the reason
says.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.compare.stats import promotion_gain
from verlflow.models.evaluate import PREDICTIONS_TABLE

# The test's level: two-sided 5 %, of which promotion uses the upper side (2.5 %), before the correction.
ALPHA = 0.05
# Fewest problems in common for the paired test; fewer and the versions count as evaluated apart.
MIN_PAIRED_PROBLEMS = 20
EVAL_RUN_TAG = "eval.run_id"
NUM_SAMPLES_TAG = "eval.gsm8k.num_samples"
SEARCH_STEP = "search"
# What a search logs on its run: its trials by state (verlflow.search.results.summarize).
SEARCH_TRIAL_METRICS = ("search/trials_complete", "search/trials_pruned")


@dataclass(frozen=True)
class Gain:
    """The challenger's gain over the holder, its interval, and how it was measured."""

    gain: float
    low: float
    high: float
    problems: int
    method: str  # "paired" (same problems, exact McNemar) | "unpaired" (two independent proportions)
    comparisons: int = 1  # candidates the challenger was the best of
    p_value: float | None = None  # one-sided, Bonferroni-corrected (paired only)
    won: int | None = None  # problems right only for the challenger (paired only)
    lost: int | None = None  # problems right only for the holder (paired only)

    @property
    def beyond_noise(self) -> bool:
        """The whole interval is above zero."""
        return self.low > 0

    @property
    def confidence(self) -> float:
        """The interval's level: 95 % for one comparison, 1 − 0.05 / k for the best of k."""
        return 1 - ALPHA / self.comparisons

    def describe(self) -> str:
        """``+1.8 points, 95% interval [-0.9, +4.5] over 512 paired problems (won 40, lost 31, …)``."""
        where = "paired problems" if self.method == "paired" else "problems each, evaluated apart"
        level = f"{100 * self.confidence:.3g}%"
        text = (f"{100 * self.gain:+.1f} points, {level} interval [{100 * self.low:+.1f}, {100 * self.high:+.1f}] "
                f"over {self.problems} {where}")
        details = []
        if self.won is not None:
            details.append(f"won {self.won}, lost {self.lost}, exact McNemar p = {self.p_value:.2g}")
        if self.comparisons > 1:
            details.append(f"corrected for the best of {self.comparisons} candidates")
        return text + (f" ({'; '.join(details)})" if details else "")


def paired_gain(challenger: Sequence[float], holder: Sequence[float], comparisons: int = 1) -> Gain:
    """The gain of ``challenger`` over ``holder`` scored on the same problems, in the same order (exact test)."""
    g = promotion_gain(challenger, holder, comparisons=comparisons, alpha=ALPHA)
    return Gain(g.gain, g.low, g.high, g.problems, "paired", comparisons, g.p_value, g.won, g.lost)


def _wilson(p: float, n: int, z: float) -> tuple[float, float]:
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def unpaired_gain(challenger: float, n_challenger: int, holder: float, n_holder: int,
                  comparisons: int = 1) -> Gain:
    """The gain of one accuracy over another measured on different problems: Newcombe's interval from two Wilson
    score intervals, at 1 − 0.05 / ``comparisons``."""
    from scipy.stats import norm

    z = float(norm.ppf(1 - ALPHA / comparisons / 2))
    (l1, u1), (l2, u2) = _wilson(challenger, n_challenger, z), _wilson(holder, n_holder, z)
    gain = challenger - holder
    low = gain - math.sqrt((challenger - l1) ** 2 + (u2 - holder) ** 2)
    high = gain + math.sqrt((u1 - challenger) ** 2 + (holder - l2) ** 2)
    return Gain(gain, low, high, min(n_challenger, n_holder), "unpaired", comparisons)


def _scores(client: MlflowClient, version: ModelVersion) -> dict[str, float] | None:
    """Each problem's strict score from the version's evaluation run, by question; None when not at hand.

    Read from the run's own artifact, so whatever experiment is active (``mlflow.load_table`` searches only the
    active one).
    """
    run_id = version.tags.get(EVAL_RUN_TAG)
    if not run_id:
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="verlflow-promote-") as tmp:
            local = client.download_artifacts(run_id, PREDICTIONS_TABLE, tmp)
            table = json.loads(Path(local).read_text(encoding="utf-8"))
    except (MlflowException, OSError, ValueError):
        return None
    columns = table.get("columns", []) if isinstance(table, dict) else []
    if not {"question", "correct"} <= set(columns):
        return None
    q, c = columns.index("question"), columns.index("correct")
    return {str(row[q]): float(bool(row[c])) for row in table.get("data", [])}


def candidates_behind(client: MlflowClient, version: ModelVersion) -> int:
    """How many models ``version`` was picked from before promote saw it: a search's trials, else 1.

    A search's best trial was chosen on its validation reward, which verl computes on the same test split the
    version is then evaluated on: that selection is a best of k on these problems too.
    """
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    from verlflow.names import STEP_TAG

    run_id = version.tags.get("source_run_id") or version.run_id
    try:
        parent_id = client.get_run(run_id).data.tags.get(MLFLOW_PARENT_RUN_ID) if run_id else None
        parent = client.get_run(parent_id) if parent_id else None
    except MlflowException:
        return 1
    if parent is None or parent.data.tags.get(STEP_TAG) != SEARCH_STEP:
        return 1
    trials = sum(int(parent.data.metrics.get(key, 0)) for key in SEARCH_TRIAL_METRICS)
    return max(1, trials)


def measure_gain(client: MlflowClient, metric: str, challenger: ModelVersion, challenger_value: float,
                 holder: ModelVersion, holder_value: float, comparisons: int = 1) -> Gain | None:
    """The challenger's gain with its noise: paired where both were scored on the same problems, else as
    independent accuracies; None when the metric has no per-problem or sample-count record to measure it.

    ``comparisons``: how many candidates the challenger was the best of (the test is corrected for it).
    """
    if metric != "eval/gsm8k/accuracy":
        return None
    mine, theirs = _scores(client, challenger), _scores(client, holder)
    if mine and theirs:
        common = sorted(set(mine) & set(theirs))
        if len(common) >= MIN_PAIRED_PROBLEMS:
            return paired_gain([mine[q] for q in common], [theirs[q] for q in common], comparisons)
    try:
        n_mine, n_theirs = int(challenger.tags[NUM_SAMPLES_TAG]), int(holder.tags[NUM_SAMPLES_TAG])
    except (KeyError, ValueError):
        return None
    if n_mine < 1 or n_theirs < 1:
        return None
    return unpaired_gain(challenger_value, n_mine, holder_value, n_theirs, comparisons)
