"""Several runs per side: each side's mean and 95% interval, the seed-to-seed noise, and a verdict against it.

    python -c "from verlflow.compare.run_sets import interval; print(interval([0.41, 0.45, 0.43]))"

Two identically configured runs on one machine already differ (multi-threaded float reductions, amplified by
GRPO's sampling), so a device comparison of one run per side cannot tell a device effect from that noise. With
two or more runs (seeds) on a side, the largest difference between two runs of one side is the *noise floor*,
and a difference between the sides counts as a device effect only beyond it. With one run per side the noise is
not measured and verl's 2% alignment rule stays, labelled as such. Plain computation on
:class:`RunSnapshot` objects: no MLflow calls.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from verlflow import names
from verlflow.compare.diff import BACKEND_PARAMS, LOCATION_PARAMS, SEED_PARAMS
from verlflow.compare.report import ParityRow, mean_relative_difference, table
from verlflow.compare.snapshot import MISSING, RunSnapshot
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
    """One end-of-run figure of both sides, their difference and the verdict against the noise floor."""

    key: str
    label: str
    baseline: SideFigure | None
    candidate: SideFigure | None
    noise_floor: float | None  # the larger within-side spread; None when no side has two runs
    verdict: str  # device effect | within noise | noise not measured | not comparable

    @property
    def difference(self) -> float | None:
        """candidate mean - baseline mean."""
        if self.baseline is None or self.candidate is None:
            return None
        return self.candidate.mean - self.baseline.mean


def noise_verdict(difference: float | None, floor: float | None) -> str:
    """``device effect`` only when the difference exceeds the noise floor; what is missing otherwise."""
    if difference is None:
        return "not comparable"
    if floor is None:
        return "noise not measured"
    return DEVICE_EFFECT if abs(difference) > floor else WITHIN_NOISE


def figure_rows(base: Sequence[RunSnapshot], cand: Sequence[RunSnapshot],
                timing_keys: Sequence[tuple[str, str]], judged: bool = True) -> list[FigureRow]:
    """Accuracy, reward and every timing figure: both sides' means and intervals, noise floor, verdict.

    ``judged``: the sides ran on two device profiles; otherwise a difference beyond the noise is not called a
    device effect.
    """
    rows = []
    for key, label in [*OUTCOME_FIGURES, *timing_keys]:
        b, c = side_figure(base, key), side_figure(cand, key)
        if b is None and c is None:
            continue
        spreads = [f.spread for f in (b, c) if f is not None and f.spread is not None]
        floor = max(spreads) if spreads else None
        row = FigureRow(key, label, b, c, floor, "")
        row.verdict = noise_verdict(row.difference, floor)
        if not judged and row.verdict == DEVICE_EFFECT:
            row.verdict = BEYOND_NOISE
        rows.append(row)
    return rows


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


def curve_noise_floor(snaps: Sequence[RunSnapshot], key: str) -> float | None:
    """The largest mean relative difference between two runs of one side on ``key`` (their common steps)."""
    found = []
    for a, b in itertools.combinations(snaps, 2):
        ma, mb = dict(a.histories.get(key, [])), dict(b.histories.get(key, []))
        steps = sorted(s for s in set(ma) & set(mb) if math.isfinite(ma[s]) and math.isfinite(mb[s]))
        if steps:
            found.append(mean_relative_difference([ma[s] for s in steps], [mb[s] for s in steps]))
    return max(found) if found else None


def judged_by_noise(rows: Sequence[ParityRow], base: Sequence[RunSnapshot],
                    cand: Sequence[RunSnapshot]) -> list[ParityRow]:
    """The curves' rows judged against the noise floor when a side has two runs or more (else unchanged).

    ``rows`` compare the two sides' mean curves; a row passes when that difference is within the largest
    difference between two runs of one side.
    """
    if max(len(base), len(cand)) < 2:
        return list(rows)
    out = []
    for row in rows:
        floors = [f for f in (curve_noise_floor(base, row.key), curve_noise_floor(cand, row.key)) if f is not None]
        floor = max(floors) if floors else None
        passed = None if row.mean_relative_difference is None or floor is None \
            else row.mean_relative_difference <= floor
        out.append(dataclasses.replace(row, passed=passed, noise_floor=floor))
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


def render_section(base: Sequence[RunSnapshot], cand: Sequence[RunSnapshot], rows: Sequence[FigureRow]) -> str:
    """Markdown: the runs of each side, then every figure's mean ± 95% interval per side, noise floor, verdict."""
    noise = max(len(base), len(cand)) >= 2
    out = ["## Several runs: means, 95% intervals and the noise floor", ""]
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
    if noise:
        out += ["Noise floor: the largest spread (max − min) between runs of one side; a difference between the "
                "sides is a device effect only beyond it. Intervals: mean ± Student's t 95% half-width.", ""]
    else:
        out += ["**The noise could not be measured: one run per side.** Give a side two or more runs (a comma list "
                "of runs, or a tag filter matching several seeds) to learn how far reruns on one device fall apart; "
                "until then the curves are judged by verl's 2% rule.", ""]
    header = ["figure", "metric", "baseline", "candidate", "difference", "noise floor", "verdict"]
    body = [(r.label, f"`{r.key}`", _with_interval(r.baseline), _with_interval(r.candidate), _signed(r.difference),
             MISSING if r.noise_floor is None else _fmt(r.noise_floor), r.verdict) for r in rows]
    return "\n".join([*out, table(header, body), ""])


def accuracy_line(rows: Sequence[FigureRow], judged: bool) -> str:
    """The first screen's accuracy sentence: the difference in points and whether it exceeds the noise."""
    row = next((r for r in rows if r.key in (OUTCOME_FIGURES[0][0], OUTCOME_FIGURES[1][0])
                and r.difference is not None), None)
    if row is None:
        return "- accuracy: not compared (no run logged a validation or test accuracy)"
    points = row.difference * 100
    text = f"- accuracy ({row.label}): candidate {points:+.2f} points vs baseline"
    if row.noise_floor is None:
        return text + ": the noise could not be measured (one run per side: give two seeds or more per side)"
    beyond = row.verdict in (DEVICE_EFFECT, BEYOND_NOISE)
    where = "beyond the noise floor" if beyond else "within the noise floor"
    what = f"{where} of {row.noise_floor * 100:.2f} points"
    if not judged:
        return text + f": {what} (not a device question: parity is not judged here)"
    return text + f": {what}" + (" — a device effect" if beyond else " — no device effect shown")
