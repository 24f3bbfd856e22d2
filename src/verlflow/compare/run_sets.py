"""Several runs per side: each side's mean and 95% interval, and a test of each difference against the seed noise.

    python -c "from verlflow.compare.run_sets import interval; print(interval([0.41, 0.45, 0.43]))"

Two identically configured runs on one machine already differ (multi-threaded float reductions, amplified by
GRPO's sampling), so a device comparison of one run per side cannot tell a device effect from that noise. With two
or more runs (seeds) on each side, every end-of-run figure is tested with Welch's t
(:func:`verlflow.compare.stats.device_effect`) and counts as a device effect only when significant *and* at least
the figure's practical threshold (:data:`THRESHOLDS`), significance decided for the report's verdicts together
(:func:`one_family`: Holm, one error rate for the report, stated on its first screen); the curves are tested for
equivalence within verl's margins (:func:`verlflow.compare.stats.curves_equivalent`). With one run on a side the
noise is not measured: nothing is called a device effect, the report says how many seeds would decide it, and the
curves get verl's single-run rule, labelled as such. Plain computation on :class:`RunSnapshot` objects: no MLflow calls.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from verlflow import names
from verlflow.compare.diff import BACKEND_PARAMS, LOCATION_PARAMS, SEED_PARAMS
from verlflow.compare.report import ParityRow, table
from verlflow.compare.snapshot import MISSING, RunSnapshot
from verlflow.compare.stats import Effect, curves_equivalent, device_effect, holm, scaled
from verlflow.names import DETERMINISTIC_TAG

# The end-of-run figures whose mean and interval the report gives, with a label, before the timing figures.
OUTCOME_FIGURES = (
    ("eval/gsm8k/accuracy", "final test accuracy (evaluate)"),
    (names.VAL_ACCURACY, "final validation accuracy"),
    (names.SCORE_MEAN, "final reward (mean score)"),
)
WITHIN_NOISE = "within noise"
DEVICE_EFFECT = "device effect"
# The same verdict where both sides ran on one device profile: beyond the noise, but not a device's doing.
BEYOND_NOISE = "beyond noise"
BELOW_THRESHOLD = "significant but below the threshold"
NOT_MEASURED = "noise not measured"
NOT_COMPARABLE = "not comparable"


@dataclass(frozen=True)
class Threshold:
    """The smallest difference of a figure that matters: absolute, or relative to the baseline's mean."""

    value: float
    relative: bool
    why: str

    def of(self, baseline_mean: float) -> float:
        """The threshold in the figure's own unit."""
        return self.value * abs(baseline_mean) if self.relative else self.value


# Practical thresholds per figure (Deliver 2 of issue 42): a significant difference smaller than these is
# "significant but below the threshold", never a device effect.
ACCURACY_THRESHOLD = Threshold(0.01, False, "1 accuracy point")
THRESHOLDS = {
    "eval/gsm8k/accuracy": ACCURACY_THRESHOLD,
    names.VAL_ACCURACY: ACCURACY_THRESHOLD,
    names.SCORE_MEAN: Threshold(0.04, True, "4% of the baseline, verl's GRPO reward margin"),
}
# Every timing figure: a time within 5% does not change what hardware is worth buying.
TIME_THRESHOLD = Threshold(0.05, True, "5% of the baseline's time")


def threshold_for(key: str) -> Threshold:
    """The practical threshold of a figure (:data:`THRESHOLDS`, else the timing one)."""
    return THRESHOLDS.get(key, TIME_THRESHOLD)


def interval(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% interval (Student's t, n - 1 degrees of freedom); None below 2 values."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    from scipy.stats import t

    return mean, float(t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))


@dataclass
class SideFigure:
    """One figure over the runs of one side: the values, their mean and 95% interval half-width."""

    values: list[float]
    mean: float
    half_width: float | None

    @property
    def spread(self) -> float | None:
        """Largest minus smallest value: how far two runs of this side fell apart (None for one run)."""
        return max(self.values) - min(self.values) if len(self.values) > 1 else None


def side_figure(snaps: Sequence[RunSnapshot], key: str) -> SideFigure | None:
    """``key``'s end-of-run value in every run of a side that logged it; None when none did."""
    values = [s.metrics[key] for s in snaps if key in s.metrics and math.isfinite(s.metrics[key])]
    if not values:
        return None
    mean, half = interval(values)
    return SideFigure(values, mean, half)


@dataclass
class FigureRow:
    """One end-of-run figure of both sides, their difference and its test against the seed noise."""

    key: str
    label: str
    baseline: SideFigure | None
    candidate: SideFigure | None
    effect: Effect
    threshold: Threshold
    verdict: str  # device effect | beyond noise | significant but below the threshold | within noise | …

    @property
    def difference(self) -> float | None:
        """candidate mean - baseline mean."""
        if self.baseline is None or self.candidate is None:
            return None
        return self.candidate.mean - self.baseline.mean


def effect_verdict(effect: Effect, judged: bool = True) -> str:
    """The verdict word of a tested difference (``judged``: two device profiles, so a device's doing)."""
    if effect.difference is None:
        return NOT_COMPARABLE
    if effect.p_value is None:
        return NOT_MEASURED
    if effect.shown:
        return DEVICE_EFFECT if judged else BEYOND_NOISE
    return BELOW_THRESHOLD if effect.significant else WITHIN_NOISE


def figure_rows(base: Sequence[RunSnapshot], cand: Sequence[RunSnapshot],
                timing_keys: Sequence[tuple[str, str]], judged: bool = True) -> list[FigureRow]:
    """Accuracy, reward and every timing figure: both sides' means and intervals, Welch's test, verdict.

    ``judged``: the sides ran on two device profiles; otherwise a difference beyond the noise is not called a
    device effect.
    """
    rows = []
    for key, label in [*OUTCOME_FIGURES, *timing_keys]:
        b, c = side_figure(base, key), side_figure(cand, key)
        if b is None and c is None:
            continue
        threshold = threshold_for(key)
        effect = device_effect(b.values if b else [], c.values if c else [],
                               threshold=threshold.of(b.mean) if b else None,
                               unit=" s" if threshold is TIME_THRESHOLD else "")
        rows.append(FigureRow(key, label, b, c, effect, threshold, effect_verdict(effect, judged)))
    return rows


def one_family(rows: Sequence[FigureRow], others: Mapping[str, Effect],
               judged: bool = True) -> tuple[list[FigureRow], dict[str, Effect]]:
    """The report's verdicts decided as one family (:func:`verlflow.compare.stats.holm`): every figure's test and
    the first screen's own tests (``others``: per chip, per node), so the report as a whole calls a difference
    where there is none at most 5 % of the time. ``judged`` as for :func:`figure_rows`."""
    decided = holm([*(r.effect for r in rows), *others.values()])
    figures = [dataclasses.replace(r, effect=e, verdict=effect_verdict(e, judged))
               for r, e in zip(rows, decided, strict=False)]
    return figures, dict(zip(others, decided[len(figures):], strict=True))


def family_line(figures: Sequence[FigureRow], others: Mapping[str, Effect]) -> str:
    """The first screen's one statement of the report's error rate: how many verdicts, decided how."""
    tested = [e for e in (*(f.effect for f in figures), *others.values()) if e.p_value is not None]
    if not tested:
        return ("- error rate: no difference was tested (a side has one run), so none is shown; parity, where judged, "
                "is verl's single-run rule")
    alpha = tested[0].alpha
    if len(tested) == 1:
        return f"- error rate: one difference tested, at {alpha:.0%}"
    return (f"- error rate: the {len(tested)} differences this report tests (its figures, and per chip and per node "
            f"where claimed) are decided as one family: at most {alpha:.0%} chance that any of them is shown where "
            "nothing differs (Holm's correction; each p is given with its Holm-adjusted value, each interval at the "
            "level it was tested at)")


def mean_snapshot(snaps: Sequence[RunSnapshot]) -> RunSnapshot:
    """A side as one run: the first run's identity, tags and params; every metric and curve averaged.

    A curve is averaged over the steps every run of the side logged; a metric over the runs that have it.
    """
    first = snaps[0]
    if len(snaps) == 1:
        return first
    metrics = {}
    for key in {k for s in snaps for k in s.metrics}:
        values = [s.metrics[key] for s in snaps if key in s.metrics]
        metrics[key] = statistics.fmean(values)
    histories = {}
    for key in {k for s in snaps for k in s.histories}:
        maps = [dict(s.histories[key]) for s in snaps if key in s.histories]
        if len(maps) != len(snaps):
            continue
        steps = sorted(set.intersection(*(set(m) for m in maps)))
        histories[key] = [(step, statistics.fmean(m[step] for m in maps)) for step in steps]
    names_shown = f"{first.name} + {len(snaps) - 1} more" if len(snaps) > 1 else first.name
    return dataclasses.replace(first, name=f"{names_shown} (mean of {len(snaps)} runs)", metrics=metrics,
                               histories=histories)


def _run_curves(snaps: Sequence[RunSnapshot], key: str, steps: Sequence[int]) -> list[list[float]] | None:
    """Each run's values of ``key`` at ``steps``; None when a run lacks one of them."""
    curves = []
    for snap in snaps:
        points = dict(snap.histories.get(key, []))
        values = [points.get(step, math.nan) for step in steps]
        if not all(math.isfinite(v) for v in values):
            return None
        curves.append(values)
    return curves


def judged_by_test(rows: Sequence[ParityRow], base: Sequence[RunSnapshot],
                   cand: Sequence[RunSnapshot]) -> list[ParityRow]:
    """The curves' rows tested for equivalence within their margins when both sides have two runs or more.

    ``rows`` compare the two sides' mean curves (verl's single-run rule); with two runs or more on each side a row
    passes only when :func:`verlflow.compare.stats.curves_equivalent` proves the sides equal within its margin.
    """
    if min(len(base), len(cand)) < 2:
        return list(rows)
    out = []
    for row in rows:
        steps = [s for s in row.steps if all(s in dict(r.histories.get(row.key, [])) for r in (*base, *cand))]
        b, c = _run_curves(base, row.key, steps), _run_curves(cand, row.key, steps)
        if not steps or b is None or c is None:
            out.append(dataclasses.replace(row, passed=None, note=row.note or "not logged by every run at a step"))
            continue
        parity = curves_equivalent(b, c, margin=row.margin)
        if parity.relative_difference is None:  # a baseline level of 0: no relative difference to judge
            out.append(dataclasses.replace(row, passed=None, note=parity.message, equivalence=parity))
            continue
        out.append(dataclasses.replace(row, passed=parity.equivalent, equivalence=parity))
    return out


def seeds_of(snaps: Sequence[RunSnapshot]) -> list[str]:
    """Each run's seeds as ``data/seed=1 rollout/seed=2`` (what tells the runs of a side apart); '' without."""
    return [" ".join(f"{k.rsplit('/', 2)[-2]}/seed={s.params[k]}" for k in SEED_PARAMS if k in s.params)
            for s in snaps]


def unlike_settings(snaps: Sequence[RunSnapshot]) -> list[str]:
    """Params in which the runs of one side differ beyond seeds, paths and names (a set should be one setting)."""
    ignored = {*SEED_PARAMS, *LOCATION_PARAMS, *BACKEND_PARAMS}
    keys = {k for s in snaps for k in s.params if k not in ignored and "/" in k}
    return sorted(k for k in keys if len({s.params.get(k) for s in snaps}) > 1)


def not_deterministic(snaps: Sequence[RunSnapshot]) -> list[RunSnapshot]:
    """The runs that did not run with ``verlflow.deterministic=true`` (a rerun of them may differ)."""
    return [s for s in snaps if s.tags.get(DETERMINISTIC_TAG) != "true"]


def _fmt(value: float, sign: str = "") -> str:
    return f"{value:{sign},.1f}" if abs(value) >= 1000 else f"{value:{sign}.4g}"


def _with_interval(figure: SideFigure | None) -> str:
    if figure is None:
        return MISSING
    shown = _fmt(figure.mean)
    if figure.half_width is not None:
        low, high = figure.mean - figure.half_width, figure.mean + figure.half_width
        shown += f" ± {_fmt(figure.half_width)} [{_fmt(low)}, {_fmt(high)}]"
    return f"{shown} (n={len(figure.values)})"


def _signed(value: float | None) -> str:
    return MISSING if value is None else _fmt(value, "+")


def _difference_interval(effect: Effect) -> str:
    if effect.low is None:
        return MISSING
    return f"[{_fmt(effect.low, '+')}, {_fmt(effect.high, '+')}] ({effect.level * 100:.3g}%)"


def _threshold_cell(row: FigureRow) -> str:
    if row.effect.threshold is None:
        return MISSING
    return f"{_fmt(row.effect.threshold)} ({row.threshold.why})"


def render_section(base: Sequence[RunSnapshot], cand: Sequence[RunSnapshot], rows: Sequence[FigureRow]) -> str:
    """Markdown: the runs of each side, then every figure's mean ± 95% interval per side and its test."""
    out = ["## Several runs: means, 95% intervals and tests", ""]
    for role, snaps in (("baseline", base), ("candidate", cand)):
        seeds = ", ".join(f"`{s.run_id[:8]}` {seed}".rstrip() for s, seed in zip(snaps, seeds_of(snaps), strict=True))
        out.append(f"- {role}: {len(snaps)} run(s): {seeds}")
        unlike = unlike_settings(snaps)
        if unlike:
            shown = ", ".join(f"`{k}`" for k in unlike[:5]) + (" …" if len(unlike) > 5 else "")
            out.append(f"  - ⚠ the {role}'s runs differ in settings beyond their seeds ({shown}): their spread is "
                       "not only seed-to-seed noise")
        loose = not_deterministic(snaps)
        if loose:
            out.append(f"  - the {role} was not deterministic ({len(loose)} of {len(snaps)} run(s) without "
                       "`verlflow.deterministic=true`): a rerun of one seed on the same device may differ")
    out.append("")
    if min(len(base), len(cand)) >= 2:
        out += ["Each difference (candidate − baseline) is tested with Welch's t on the runs' values (Hsu's degrees "
                "of freedom where the sides have different numbers of runs), and the report's tests are decided "
                "together: Holm's correction keeps the chance of any false verdict in the report at 5%. A device "
                "effect needs a Holm-adjusted p < 0.05 *and* a difference at least the figure's practical threshold; "
                "a significant difference under it is \"significant but below the threshold\". Each interval is at "
                "the level Holm tested it at. Error rates: `verlflow/compare/stats.py`.", ""]
    else:
        out += ["**The noise could not be measured: a side has one run.** Give each side two or more runs (a comma "
                "list of runs, or a tag filter matching several seeds) to learn how far reruns on one device fall "
                "apart; until then no difference is called a device effect and the curves are judged by verl's "
                "single-run rule.", ""]
    header = ["figure", "metric", "baseline", "candidate", "difference", "interval (level)", "p", "Holm p",
              "threshold", "verdict"]
    body = [(r.label, f"`{r.key}`", _with_interval(r.baseline), _with_interval(r.candidate), _signed(r.difference),
             _difference_interval(r.effect), MISSING if r.effect.p_value is None else f"{r.effect.p_value:.2g}",
             MISSING if r.effect.family_p is None else f"{r.effect.family_p:.2g}", _threshold_cell(r), r.verdict)
            for r in rows]
    return "\n".join([*out, table(header, body), ""])


def accuracy_line(rows: Sequence[FigureRow], judged: bool) -> str:
    """The first screen's accuracy sentence: the difference in points, its test, interval and threshold."""
    row = next((r for r in rows if r.key in (OUTCOME_FIGURES[0][0], OUTCOME_FIGURES[1][0])
                and r.difference is not None), None)
    if row is None:
        return "- accuracy: not compared (no run logged a validation or test accuracy)"
    text = f"- accuracy ({row.label}): candidate {row.difference * 100:+.2f} points vs baseline"
    if row.effect.p_value is None:  # untested: the message of why, in points
        points = device_effect([v * 100 for v in row.baseline.values], [v * 100 for v in row.candidate.values],
                               threshold=row.threshold.of(row.baseline.mean) * 100, unit=" points")
    else:  # the verdict the report's family decided, in points
        points = scaled(row.effect, 100, " points")
    words = points.message.replace(" 1 points", " 1 point")
    if points.shown and not judged:
        words = words.replace("a device effect", "beyond the noise (not a device question: parity is not judged here)")
    return f"{text}: {words}"
