"""Precision parity of the §6.2 curves: verl's single-run rule, its margins, and the one-line summary.

    python -c "from verlflow.compare.parity import mean_relative_difference as m; print(m([1, 2], [1.01, 2]))"

verl's NPU/GPU alignment rule compares two curves by their mean relative difference (2 % for loss, 4 % for the
GRPO reward); with two runs or more per side :func:`verlflow.compare.run_sets.judged_by_test` replaces it by an
equivalence test of the same measure (:func:`verlflow.compare.stats.curves_equivalent`: the mean |difference| over
windows of steps, on an absolute margin where a curve comes near zero). Plain computation on
:class:`RunSnapshot` objects.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from verlflow import names
from verlflow.compare.snapshot import RunSnapshot
from verlflow.compare.stats import Parity

# verl's NPU/GPU precision-alignment rule (docs/ascend_tutorial): a loss curve on Ascend is accepted
# when its mean relative error to the GPU curve is at most 2% (GRPO rewards: 4%).
DEFAULT_PARITY_THRESHOLD = 0.02
REWARD_MARGIN = 0.04
DEFAULT_EPS = 1e-8


# §6.2 of the guide: the curves, with a title a reader knows them by.
CURVES: list[tuple[str, str]] = [
    (names.SCORE_MEAN, "reward (mean score)"),
    (names.VAL_ACCURACY, "validation accuracy"),
    ("response_length/mean", "response length (tokens)"),
    ("actor/entropy", "entropy"),
    ("actor/kl_loss", "KL loss"),
    ("actor/grad_norm", "grad norm"),
    ("actor/pg_loss", "policy-gradient loss"),
]


@dataclass
class ParityRow:
    """The parity verdict of one curve over the steps both runs logged."""

    key: str
    title: str
    steps: list[int]
    mean_relative_difference: float | None
    max_absolute_difference: float | None
    passed: bool | None  # None: not comparable (missing in a run, or no common step)
    note: str = ""
    margin: float = DEFAULT_PARITY_THRESHOLD  # verl's: 2% loss and other curves, 4% GRPO reward
    # The equivalence test of the runs' curves (None: a side has one run, verl's single-run rule judges).
    equivalence: Parity | None = None


def mean_relative_difference(base: Sequence[float], cand: Sequence[float], eps: float = DEFAULT_EPS) -> float:
    """mean over steps of |c - b| / max(|b|, eps): verl's precision-alignment measure for two curves."""
    if len(base) != len(cand) or not base:
        raise ValueError("need two curves of the same, non-zero length")
    return sum(abs(c - b) / max(abs(b), eps) for b, c in zip(base, cand, strict=True)) / len(base)


def describe_steps(steps: Sequence[int]) -> str:
    """``1–4 (4 steps)`` for a contiguous range, else the steps themselves (shortened past ten)."""
    if not steps:
        return "none"
    n = len(steps)
    if steps[-1] - steps[0] + 1 == n and n > 2:
        return f"{steps[0]}–{steps[-1]} ({n} steps)"
    shown = ", ".join(str(s) for s in steps[:10]) + (", …" if n > 10 else "")
    return f"{shown} ({n} step{'s' if n != 1 else ''})"


def parity_row(
    key: str,
    title: str,
    baseline: RunSnapshot,
    candidate: RunSnapshot,
    threshold: float = DEFAULT_PARITY_THRESHOLD,
    eps: float = DEFAULT_EPS,
) -> ParityRow:
    """The parity verdict of one curve: mean relative difference over common finite steps vs ``threshold``."""
    b_hist, c_hist = baseline.histories.get(key), candidate.histories.get(key)
    missing = [r.role for r, h in ((baseline, b_hist), (candidate, c_hist)) if not h]
    if missing:
        return ParityRow(key, title, [], None, None, None, f"not logged by the {' and '.join(missing)}",
                         margin=threshold)
    b_map, c_map = dict(b_hist), dict(c_hist)
    steps = sorted(s for s in set(b_map) & set(c_map) if math.isfinite(b_map[s]) and math.isfinite(c_map[s]))
    if not steps:
        return ParityRow(key, title, [], None, None, None, "no common step with finite values", margin=threshold)
    base, cand = [b_map[s] for s in steps], [c_map[s] for s in steps]
    mrd = mean_relative_difference(base, cand, eps)
    max_abs = max(abs(c - b) for b, c in zip(base, cand, strict=True))
    note = ""
    if len(steps) < max(len(b_map), len(c_map)):
        note = (
            f"baseline logged {len(b_map)} steps, candidate {len(c_map)}; compared the {len(steps)} in common"
        )
    return ParityRow(key, title, steps, mrd, max_abs, mrd <= threshold, note, margin=threshold)


def without_verdict(rows: Sequence[ParityRow]) -> list[ParityRow]:
    """The same differences with no PASS/FAIL: for runs of different recipes, where parity means nothing."""
    return [dataclasses.replace(r, passed=None) for r in rows]


def parity_rows(
    baseline: RunSnapshot,
    candidate: RunSnapshot,
    threshold: float = DEFAULT_PARITY_THRESHOLD,
    eps: float = DEFAULT_EPS,
) -> list[ParityRow]:
    """The parity verdict of every §6.2 curve, each at its margin (:func:`curve_margin`)."""
    return [parity_row(key, title, baseline, candidate, curve_margin(key, threshold), eps) for key, title in CURVES]


def curve_margin(key: str, threshold: float = DEFAULT_PARITY_THRESHOLD) -> float:
    """verl's alignment margin of a curve: 4% for the GRPO reward curves, ``threshold`` (2%: loss) for the others."""
    return REWARD_MARGIN if key in (names.SCORE_MEAN, names.VAL_ACCURACY) else threshold


def margins_text(threshold: float) -> str:
    """verl's margins as the report names them."""
    return f"verl's margins: {threshold:.0%} loss and other curves, {REWARD_MARGIN:.0%} GRPO reward"


def _worst(compared: Sequence[ParityRow]) -> str:
    """The failing (else the closest) curve with its test: relative difference, interval, p-value, margin."""
    row = min(compared, key=lambda r: (bool(r.passed), -(abs(r.equivalence.relative_difference or 0) if r.equivalence
                                                         else r.mean_relative_difference or 0) / r.margin))
    if row.equivalence is not None and row.equivalence.tested:
        return f"{'worst' if not row.passed else 'closest to its margin'}: {row.title} {row.equivalence.message}"
    return (f"{'worst' if not row.passed else 'closest to its margin'}: {row.title} "
            f"{percent(row.mean_relative_difference)} against ±{row.margin:.0%}")


def parity_summary(rows: Sequence[ParityRow], threshold: float, *, judged: bool = True,
                   reason: str = "the runs differ in recipe settings") -> str:
    """One line: how many comparable curves match within their margins, by a test or by verl's single-run rule."""
    if not judged:
        return f"parity: not judged ({reason}: a plain run-vs-run comparison)"
    compared = [r for r in rows if r.passed is not None]
    passed = [r for r in compared if r.passed]
    if not compared:
        return "parity: no curve could be compared"
    if any(r.equivalence is not None and r.equivalence.tested for r in compared):
        word = "PASS" if len(passed) == len(compared) else "NOT SHOWN"
        return (f"parity {word}: {len(passed)}/{len(compared)} curves shown equivalent within {margins_text(threshold)}"
                f" (each curve's mean |difference| over the steps, tested on the runs' curves; a curve not shown "
                f"equivalent has a bias, a different shape or too few seeds to prove a match); {_worst(compared)}")
    word = "PASS" if len(passed) == len(compared) else "FAIL"
    return (f"parity {word}: {len(passed)}/{len(compared)} curves within {margins_text(threshold)}, mean relative "
            f"difference (a side has one run: verl's single-run rule, no p-value or interval, the noise between seeds "
            f"was not measured); {_worst(compared)}")


def percent(value: float | None) -> str:
    """A fraction as a percentage for the tables (``-`` when missing)."""
    if value is None:
        return "-"
    return "<0.01%" if 0 < value < 1e-4 else f"{value:.2%}"
