"""The tests behind every verdict of ``compare`` and ``promote``: pure functions on numbers, with measured error rates.

    python -c "from verlflow.compare.stats import device_effect as d; print(d([41.0, 43.0, 42.0], [45.0, 46.5, 44.0]))"

- :func:`device_effect`: one figure (final accuracy, a timing) measured once per seed on each side. Welch's t-test
  (unequal variances) on candidate − baseline, with Hsu's degrees of freedom (the smaller side's runs − 1) where the
  sides have different numbers of runs; ``Effect.low`` / ``Effect.high`` is its 95 % interval. A difference is
  *shown* only when it is significant (p < alpha) and at least the figure's practical threshold; a significant
  difference under the threshold is "significant but below the threshold". With fewer than 2 values on a side the
  noise is not measured and nothing is shown: the message says how many seeds per side would detect the threshold
  at the spread seen (80 % power).
- :func:`holm`: the verdicts one report prints, decided as one family. Holm's step-down correction bounds the
  chance that *any* of them shows a difference where none is at alpha; each keeps its own p, gets its adjusted p
  (``Effect.family_p``) and an interval at the level Holm tested it at, which excludes zero exactly when the verdict
  is significant. :func:`scaled` prints the same verdict in another unit (points).
- :func:`curves_equivalent`: two sets of training curves, compared as verl's alignment rule compares two curves: the
  per-step relative difference, averaged as an absolute value over the curve (here over up to 10 windows of
  steps), against verl's margins (2 % loss, 4 % GRPO reward). A shape difference (slower, then overshooting) fails
  as a constant bias does. It is the difference of each run's score (its window levels signed by the observed
  difference), so Welch's one-sided test of "at least the margin" carries the runs' own noise, autocorrelation
  included. Where the baseline comes near zero (a window under a tenth of its largest level) the margin is
  absolute: the margin × that largest level. Equivalence must be *proved*: more seeds make a real difference
  easier to detect and a real match easier to prove.
- :func:`promotion_gain`: two models' 0/1 scores on the same problems. Exact McNemar (a binomial test on the
  problems only one model got right), one-sided, at alpha/2 (the old 95 % interval's lower bound) divided by the
  number of models the challenger was picked from (Bonferroni; Holm's first step is the same); the interval of the
  gain is the Clopper-Pearson interval of the discordant split at that level, so ``low > 0`` exactly when the test
  passes.

Error rates measured by simulation (``python tests/test_compare_stats.py``: 4,000 seeded draws per cell, alpha 0.05,
no threshold; the tests assert the same at 1,000–2,000 draws):

- ``device_effect``, no effect, normal noise: shown in 2.4 % (2 seeds per side), 3.4 % (3) and 4.6 % (5) of draws;
  a 2-sd effect at 10 seeds per side: shown in 98.6 %. A practical threshold only lowers the false rate. 2 seeds
  against 7 (either way round, spreads equal or 2× apart): 0.0–0.1 % (Welch's own degrees of freedom: 8.3–12.5 %;
  on a log scale no better); 3 against 7: 0.3–1.8 %; right-skewed step times (lognormal, log-sd 0.5), 7 against 2:
  0.0 % (Welch: 8.1 %).
- A report of 12 figures, none differing, decided by :func:`holm`: at least one shown in 1.6 % / 2.4 % / 3.7 % of
  reports at 2 / 3 / 5 seeds per side, 0.0 % at 2 against 7 and at skewed 7 against 2 (each verdict at 5 % on its
  own: 35 % at 3 seeds, 63 % at 2 against 7). Where one side's spread is twice the other's: 1.7 / 3.3 / 4.7 /
  5.2 % at 2 / 3 / 5 / 10 seeds per side; four times: 3.1 / 6.9 / 7.5 / 5.4 % (Welch's t at equal counts is a
  little liberal when the spreads differ that much; 20,000 draws).
- ``curves_equivalent``, reward margin 4 %, a curve rising 0.2 → 0.6 over 20 steps with 1 % run-to-run and 1 %
  step-to-step noise: a 6 % bias is not equivalent in 99.9 % / 100 % / 100 % of draws at 2 / 3 / 5 seeds per side;
  identical curves are equivalent in 65.8 % / 95.9 % / 100 %. Slower then overshooting by 6.5 % (mean |relative
  difference|) at an equal mean level: not equivalent in 100 % at 3 / 5 / 10 seeds (the old level test: 0 % at
  5). A loss curve crossing zero (−0.01 → 0.03), margin 2 %, noise 1 % of its largest level per step and 0.5 % per
  run: identical curves equivalent in 95.0 % / 99.9 % / 100 % at 3 / 5 / 10 seeds (1 % per run: 51 / 78 / 98 %); a
  relative margin never proved it. AR(1) step noise (ρ 0.8) with 1 % run-level noise, identical reward curves
  equivalent: stationary step sd 1 %: 90.7 % / 99.9 % / 100 % at 3 / 5 / 10 seeds; 2 %: 73.8 / 95.8 / 100 %;
  3 %: 42.6 / 80.4 / 98.8 % (1,000 draws); a 6 % bias stays not equivalent in at least 99 %.
- ``promotion_gain``: 4 problems right only for the challenger and 0 only for the holder (of 1,319): p = 0.0625,
  not beyond the noise. Five challengers exactly as good as the holder (1,319 problems at 60 %, agreeing with it on
  about 76 %), the best of them tested: false promotions in 9.7 % of draws with ``comparisons=1`` and 2.4 % with
  ``comparisons=5`` (nominal 2.5 %).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special
from scipy import stats as sp

# Power at which "seeds needed" is computed: the usual 80 %.
POWER = 0.8
MAX_SEEDS = 1000
# Parity: curves are cut into this many windows of consecutive steps (or one per step when shorter).
WINDOWS = 10
# A curve whose baseline window level falls under this share of its largest one is judged on an absolute margin.
NEAR_ZERO = 0.1


@dataclass(frozen=True)
class Effect:
    """Whether one figure differs between the sides beyond the seed-to-seed noise and the practical threshold."""

    difference: float | None  # candidate mean − baseline mean; None when a side has no value
    p_value: float | None  # the figure's own two-sided p (Welch); None when the noise could not be measured
    low: float | None  # interval of candidate − baseline at ``level`` (95 % alone; Holm's step level in a family)
    high: float | None
    threshold: float | None  # the practical threshold in the figure's unit; None: any significant difference
    shown: bool  # significant and at least the threshold: a device effect on the first screen
    significant: bool  # family_p < alpha, whatever the size
    message: str  # the verdict in words
    family_p: float | None = None  # Holm-adjusted p over the report's verdicts (:func:`holm`); p_value alone
    family: int = 1  # how many tested verdicts the family holds
    level: float = 0.95  # the interval's confidence
    se: float | None = None  # standard error of the difference and its degrees of freedom: what :func:`holm`
    df: float | None = None  # and :func:`scaled` re-decide the verdict from
    unit: str = ""
    alpha: float = 0.05

    @property
    def below_threshold(self) -> bool:
        """Significant, but smaller than the practical threshold: never a device effect on the first screen."""
        return self.significant and not self.shown


@dataclass(frozen=True)
class Parity:
    """Whether two sets of curves match within the margin, proved by a one-sided test of their mean |difference|."""

    relative_difference: float | None  # mean over windows of |candidate − baseline| / the baseline's size (≥ 0)
    low: float | None  # the (1 − 2·alpha) interval of that mean difference (90 % at alpha 0.05)
    high: float | None
    margin: float
    p_value: float | None  # p of "the mean |difference| is at least the margin"; None when noise was not measured
    equivalent: bool  # proved under the margin
    tested: bool  # both sides had two runs or more (else verl's single-run rule is all there is)
    message: str
    windows: int = 0  # how many windows of steps the curves were cut into
    # Where the baseline's level comes near zero the margin is absolute: ``margin`` × this size (the largest |level|
    # of the baseline's windows), in the curve's own unit; None: relative, window by window.
    absolute_size: float | None = None

    @property
    def absolute(self) -> bool:
        """Whether the curve was judged against an absolute margin (its level comes near zero)."""
        return self.absolute_size is not None

    def shown(self, value: float | None) -> str:
        """A difference of this test as the report prints it: a percentage, or the curve's unit when absolute."""
        if value is None:
            return "-"
        return f"{value * self.absolute_size:.3g}" if self.absolute_size is not None else f"{value:.2%}"

    @property
    def margin_text(self) -> str:
        """``±4%`` or, for a curve near zero, ``±0.0006 (absolute: 2% of its largest level 0.03)``."""
        if self.absolute_size is None:
            return f"±{self.margin:.0%}"
        return (f"±{self.margin * self.absolute_size:.3g} (absolute: {self.margin:.0%} of its largest level "
                f"{self.absolute_size:.3g}, as its level comes near zero)")


@dataclass(frozen=True)
class Gain:
    """A challenger's gain over the holder on the same problems, with an exact test corrected for selection."""

    gain: float  # (won − lost) / problems
    low: float  # interval of the gain at 1 − alpha / comparisons (95 % for one comparison)
    high: float
    p_value: float  # one-sided exact McNemar, times comparisons (Bonferroni), at most 1
    problems: int
    won: int  # right only for the challenger
    lost: int  # right only for the holder
    comparisons: int
    alpha: float
    beyond_noise: bool  # p_value < alpha / 2 (the lower bound of the interval above zero)

    @property
    def confidence(self) -> float:
        """The interval's level: 1 − alpha / comparisons."""
        return 1 - self.alpha / self.comparisons


def _fmt(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 1000 else f"{value:.3g}"


def seeds_needed(sd: float, threshold: float, alpha: float = 0.05, power: float = POWER) -> int | None:
    """Seeds per side for a two-sided t-test at ``alpha`` to detect ``threshold`` with ``power`` at spread ``sd``.

    Noncentral t; None when there is no spread or no threshold to detect, or more than :data:`MAX_SEEDS`.
    """
    if not sd > 0 or not threshold > 0:
        return None
    for n in range(2, MAX_SEEDS + 1):
        df = 2 * n - 2
        critical = sp.t.ppf(1 - alpha / 2, df)
        if sp.nct.sf(critical, df, threshold / (sd * math.sqrt(2 / n))) >= power:
            return n
    return None


def _welch(base: np.ndarray, cand: np.ndarray) -> tuple[float, float, float]:
    """Difference of means, its standard error and the degrees of freedom of its t (:func:`degrees_of_freedom`)."""
    vb, vc = base.var(ddof=1) / base.size, cand.var(ddof=1) / cand.size
    se = math.sqrt(vb + vc)
    df = degrees_of_freedom(base, cand) if se > 0 else float("nan")
    return float(cand.mean() - base.mean()), se, df


def degrees_of_freedom(base: np.ndarray, cand: np.ndarray) -> float:
    """Welch-Satterthwaite's degrees of freedom when both sides have as many runs; Hsu's min(n) − 1 when they differ.

    Welch's estimate trusts a variance measured on few runs: with 2 runs against 7 its false rate reaches
    7–11 % at a nominal 5 %. Hsu's smaller count keeps the rate at or under nominal whatever the two variances
    (measured: the module's docstring), at the cost of power on the side with few runs.
    """
    if base.size != cand.size:
        return float(min(base.size, cand.size) - 1)
    vb, vc = base.var(ddof=1) / base.size, cand.var(ddof=1) / cand.size
    return (vb + vc) ** 2 / (vb**2 / (base.size - 1) + vc**2 / (cand.size - 1))


def _not_measured(base: np.ndarray, cand: np.ndarray, threshold: float | None, alpha: float, unit: str = "") -> str:
    """Why the noise is unknown, and how many seeds would tell a ``threshold`` apart at the spread seen."""
    counts = f"{base.size} run(s) on the baseline, {cand.size} on the candidate"
    goal = f" to test it against the threshold of {_fmt(threshold)}{unit}" if threshold else ""
    spreads = [a.std(ddof=1) for a in (base, cand) if a.size >= 2]
    if spreads and not max(spreads) > 0:
        return (f"the noise could not be measured ({counts}): every run of a side gave the same value, no spread "
                "to measure (reruns of one seed, or a figure that did not move)"
                + (f"; threshold {_fmt(threshold)}{unit}" if threshold else ""))
    if not spreads:
        return f"the noise could not be measured ({counts}): give each side 2 seeds or more{goal}"
    sd = max(spreads)
    n = seeds_needed(sd, threshold, alpha) if threshold else None
    if n is None:
        return f"the noise could not be measured ({counts}): give each side 2 seeds or more{goal}"
    return (f"the noise could not be measured ({counts}): at the spread seen (sd {_fmt(sd)}{unit}), {n} seeds per "
            f"side would detect a difference of {_fmt(threshold)}{unit}")


def device_effect(baseline: Sequence[float], candidate: Sequence[float], *, alpha: float = 0.05,
                  threshold: float | None = None, unit: str = "") -> Effect:
    """Whether a figure differs between the sides: Welch's t on per-seed values, then the practical threshold.

    ``baseline`` / ``candidate``: one value per run (seed) of each side. ``threshold``: the smallest difference
    that matters, in the figure's unit (None: every significant difference is shown); ``unit``: how the message
    names that unit (``" points"``). Alone it is one verdict at ``alpha``; a report decides its verdicts together
    (:func:`holm`).
    """
    base, cand = np.asarray(baseline, float), np.asarray(candidate, float)
    if base.size == 0 or cand.size == 0:
        return Effect(None, None, None, None, threshold, False, False, "not comparable: a side has no value")
    difference = float(cand.mean() - base.mean())
    if base.size < 2 or cand.size < 2:
        return Effect(difference, None, None, None, threshold, False, False,
                      _not_measured(base, cand, threshold, alpha, unit))
    diff, se, df = _welch(base, cand)
    if not se > 0:
        return Effect(diff, None, None, None, threshold, False, False,
                      _not_measured(base, cand, threshold, alpha, unit))
    p = float(2 * special.stdtr(df, -abs(diff) / se))  # Student's t tail: scipy.stats.t.sf without its overhead
    return _decided(diff, se, df, p, threshold=threshold, unit=unit, alpha=alpha, family_p=p, family=1,
                    level=1 - alpha)


def _decided(diff: float, se: float, df: float, p: float, *, threshold: float | None, unit: str, alpha: float,
             family_p: float, family: int, level: float) -> Effect:
    """The verdict of a tested difference: significant when ``family_p`` < ``alpha``, its interval at ``level``."""
    half = float(special.stdtrit(df, 1 - (1 - level) / 2)) * se
    significant = family_p < alpha
    shown = significant and (threshold is None or abs(diff) >= threshold)
    tested = f"p = {p:.2g}" + (f", Holm-adjusted p = {family_p:.2g} over {family} verdicts" if family > 1 else "")
    where = f"{tested}, {level * 100:.3g}% interval [{_fmt(diff - half)}, {_fmt(diff + half)}]{unit}"
    limit = f", threshold {_fmt(threshold)}{unit}" if threshold is not None else ""
    if shown:
        text = f"a device effect ({where}{limit})"
    elif significant:
        text = f"significant but below the threshold ({where}{limit})"
    else:
        text = f"within the noise ({where}{limit})"
    return Effect(diff, p, diff - half, diff + half, threshold, shown, significant, text, family_p, family, level,
                  se, df, unit, alpha)


def holm(effects: Sequence[Effect]) -> list[Effect]:
    """The verdicts of one report decided as one family: Holm's step-down correction across the tested ones.

    The chance that any verdict of the family calls a difference where there is none stays at or under
    ``alpha``, whatever the dependence between the figures. Each tested effect gets its Holm-adjusted p (the
    smallest family-wise level at which it would be shown) and an interval at the level Holm tested it at
    (1 − alpha / (m − rank) up to the first verdict not shown, that one's level after it), so an interval
    excludes zero exactly when the verdict is significant. Untested effects (one run on a side) pass unchanged.
    """
    tested = sorted((i for i, e in enumerate(effects) if e.p_value is not None and e.se),
                    key=lambda i: effects[i].p_value)
    out, count = list(effects), len(tested)
    adjusted, stopped = 0.0, None
    for rank, i in enumerate(tested):
        e = effects[i]
        adjusted = max(adjusted, min(1.0, (count - rank) * e.p_value))
        if stopped is None and not adjusted < e.alpha:
            stopped = rank
        level = 1 - e.alpha / (count - (rank if stopped is None else stopped))
        out[i] = _decided(e.difference, e.se, e.df, e.p_value, threshold=e.threshold, unit=e.unit, alpha=e.alpha,
                          family_p=adjusted, family=count, level=level)
    return out


def scaled(effect: Effect, factor: float, unit: str) -> Effect:
    """The same verdict in another unit (a fraction as points: ``factor`` 100): difference, interval, threshold."""
    if effect.p_value is None or effect.se is None or effect.difference is None:
        raise ValueError("only a tested effect can be rescaled")
    threshold = None if effect.threshold is None else effect.threshold * factor
    return _decided(effect.difference * factor, effect.se * abs(factor), effect.df, effect.p_value,
                    threshold=threshold, unit=unit, alpha=effect.alpha, family_p=effect.family_p, family=effect.family,
                    level=effect.level)


def _windows(curves: Sequence[Sequence[float]], length: int, count: int) -> np.ndarray:
    """runs × windows: each run's mean over each of ``count`` runs of consecutive steps (its first ``length``)."""
    values = np.asarray([np.asarray(c[:length], float) for c in curves], float)
    return np.stack([values[:, part].mean(axis=1) for part in np.array_split(np.arange(length), count)], axis=1)


def curves_equivalent(baseline: Sequence[Sequence[float]], candidate: Sequence[Sequence[float]], *, margin: float,
                      alpha: float = 0.05, windows: int = WINDOWS) -> Parity:
    """Whether the candidate's curves match the baseline's within ``margin``, step by step as verl means it.

    ``baseline`` / ``candidate``: one curve (per-step values over the same steps) per run. The steps are cut into
    ``windows`` windows; in each, the relative difference of the sides' mean levels; the statistic is its mean
    absolute value over the windows, so a curve that learns slower and then overshoots fails as a constant bias
    does. It is the difference of each run's score (its window levels, signed by the observed difference,
    relative to the baseline's), so Welch's test on those scores carries the runs' own noise, autocorrelated
    steps included; equivalent when the one-sided upper bound is under the margin (p < ``alpha``). Where a baseline
    window's level is under :data:`NEAR_ZERO` of its largest, a relative difference there means nothing: the
    margin is ``margin`` × that largest level, absolute. With one run on a side ``tested`` is False and ``equivalent``
    is verl's single-run rule on the same statistic.
    """
    if not baseline or not candidate or min(len(c) for c in (*baseline, *candidate)) == 0:
        return Parity(None, None, None, margin, None, False, False, "not comparable: a side has no curve")
    length = min(len(c) for c in (*baseline, *candidate))
    count = min(windows, length)
    base, cand = _windows(baseline, length, count), _windows(candidate, length, count)
    level = base.mean(axis=0)
    size = float(np.abs(level).max())
    if not size > 0:
        return Parity(None, None, None, margin, None, False, False, "not comparable: the baseline's level is 0")
    near_zero = bool(np.abs(level).min() < NEAR_ZERO * size)
    scale = size if near_zero else np.abs(level)
    base, cand = base / scale, cand / scale
    signs = np.where(cand.mean(axis=0) - base.mean(axis=0) >= 0, 1.0, -1.0)
    base_scores, cand_scores = (base * signs).mean(axis=1), (cand * signs).mean(axis=1)
    mean_abs = float(cand_scores.mean() - base_scores.mean())
    found = Parity(mean_abs, None, None, margin, None, False, False, "", count, size if near_zero else None)
    if base.shape[0] < 2 or cand.shape[0] < 2:
        return dataclasses.replace(found, equivalent=mean_abs <= margin, message=(
            f"one run on a side: mean |difference| {found.shown(mean_abs)} over {count} windows against "
            f"{found.margin_text} by verl's single-run rule (the noise between seeds was not measured; give each side "
            "3 seeds or more to test it)"))
    _, se, df = _welch(base_scores, cand_scores)
    if not se > 0:
        return dataclasses.replace(found, low=mean_abs, high=mean_abs, equivalent=mean_abs <= margin, message=(
            f"mean |difference| {found.shown(mean_abs)} against {found.margin_text}: the runs of a side are "
            "identical, no noise measured"))
    p = float(special.stdtr(df, (mean_abs - margin) / se))
    half = float(special.stdtrit(df, 1 - alpha)) * se
    tested = dataclasses.replace(found, low=mean_abs - half, high=mean_abs + half, p_value=p, equivalent=p < alpha,
                                 tested=True)
    where = (f"mean |difference| {tested.shown(mean_abs)} over {count} windows, {1 - 2 * alpha:.0%} interval "
             f"[{tested.shown(tested.low)}, {tested.shown(tested.high)}], p = {p:.2g}")
    word = "equivalent" if tested.equivalent else "not shown equivalent"
    return dataclasses.replace(tested, message=f"{word} within {tested.margin_text} ({where})")


def promotion_gain(challenger: Sequence[float], holder: Sequence[float], *, comparisons: int = 1,
                   alpha: float = 0.05) -> Gain:
    """The challenger's gain over the holder, scored 0/1 on the same problems in the same order.

    Exact McNemar, one-sided (is the challenger better?) at ``alpha`` / 2 / ``comparisons``: ``comparisons`` is
    how many models the challenger was picked from on these scores (best of k: k).
    """
    if comparisons < 1:
        raise ValueError(f"comparisons must be at least 1, got {comparisons}")
    mine, theirs = np.asarray(challenger, float) > 0.5, np.asarray(holder, float) > 0.5
    if mine.shape != theirs.shape or mine.size == 0:
        raise ValueError("need the scores of both models on the same, non-empty list of problems")
    won, lost, n = int(np.sum(mine & ~theirs)), int(np.sum(theirs & ~mine)), int(mine.size)
    discordant = won + lost
    if discordant == 0:
        return Gain(0.0, 0.0, 0.0, 1.0, n, 0, 0, comparisons, alpha, False)
    p_one = float(sp.binom.sf(won - 1, discordant, 0.5))  # P(X >= won) when neither model is better
    p = min(1.0, p_one * comparisons)
    level = 1 - alpha / comparisons
    tail = (1 - level) / 2  # Clopper-Pearson: the exact interval of the share of discordant problems won
    share_low = float(sp.beta.ppf(tail, won, lost + 1)) if won else 0.0
    share_high = float(sp.beta.ppf(1 - tail, won + 1, lost)) if lost else 1.0
    low, high = (discordant / n * (2 * share - 1) for share in (share_low, share_high))
    return Gain((won - lost) / n, low, high, p, n, won, lost, comparisons, alpha, p < alpha / 2)
