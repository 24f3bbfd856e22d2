"""The arithmetic and the Markdown of the §6 comparison: versions, time ratios, the guide's claims, the sections.

    python -c "from verlflow.compare.report import mean_relative_difference as m; print(m([1, 2], [1.01, 2]))"

Everything here works on :class:`RunSnapshot` objects (what :mod:`verlflow.compare.comparison` read from the
tracking store in one pass per run), so it is plain computation: no MLflow calls, no files. The curves' parity
(rows, margins, summary) is :mod:`verlflow.compare.parity`, re-exported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from verlflow import names
from verlflow.compare.diff import ConfigDiff
from verlflow.compare.parity import (  # noqa: F401 - re-exported: compare's modules read them from here
    CURVES,
    DEFAULT_EPS,
    DEFAULT_PARITY_THRESHOLD,
    REWARD_MARGIN,
    ParityRow,
    curve_margin,
    describe_steps,
    mean_relative_difference,
    parity_row,
    parity_rows,
    parity_summary,
    percent,
    without_verdict,
)
from verlflow.compare.snapshot import MISSING, RunSnapshot, same_device_profile
from verlflow.names import BACKEND_TAG, PROFILE_TAG, RECIPE_TAG, VERSION_TAG
from verlflow.platforms import tags as device_tags

# The guide's §6.3 as it states it: ratios only, A3 relative to H20 (no seconds, no seeds). Quoted as its claims.
GUIDE_RATIOS = {names.TIMING_E2E: 1.58, f"{names.TIMING_MEAN_PREFIX}gen": 0.80,
                f"{names.TIMING_MEAN_PREFIX}update_actor": 2.35, f"{names.TIMING_MEAN_PREFIX}step": 1.53}
# The pair the guide measured, (baseline, candidate) as record names, and how close "reproduced" must be: each
# ratio's 95% interval inside ±5% of the guide's claim.
GUIDE_SIDES = ("H20", "A3")
GUIDE_TOLERANCE = 0.05
# A run whose figures were made up to give a result (a test fixture) carries this tag, saying how.
CONSTRUCTED_TAG = "verlflow.constructed"

# §6.1 of the guide, row by row: (tag, label). The guide's own words are kept in brackets.
VERSION_ROWS: list[tuple[str, str]] = [
    (device_tags.TYPE_TAG, "device type"),
    (device_tags.NAME_TAG, "machine / device"),
    (device_tags.COUNT_TAG, "devices (as verl counts them: an A3 die is one)"),
    (device_tags.MEMORY_TAG, "memory per device (GiB)"),
    (device_tags.MODEL_TAG, "accelerator (profile's record)"),
    (device_tags.NODE_TAG, "node (profile's record)"),
    (device_tags.DEVICES_PER_NODE_TAG, "devices per node (profile's record)"),
    (device_tags.PEAK_TFLOPS_TAG, "peak dense TFLOPS per device (profile's record)"),
    (device_tags.INTERCONNECT_TAG, "interconnect (profile's record)"),
    (device_tags.STACK_TAG, "expected stack (config/stacks)"),
    (device_tags.DRIVER_TAG, "driver (HDK)"),
    (device_tags.FIRMWARE_TAG, "firmware"),
    (device_tags.CANN_TAG, "CANN"),
    (device_tags.CUDA_TAG, "CUDA"),
    ("host.arch", "host arch"),
    ("host.cpu", "host CPU"),
    ("sw.python", "python"),
    ("sw.torch", "torch"),
    ("sw.torch_npu", "torch-npu"),
    ("sw.transformers", "transformers"),
    ("sw.vllm", "vllm"),
    ("sw.vllm_ascend", "vllm_ascend"),
    ("sw.ray", "ray"),
    ("sw.verl", "verl"),
    ("sw.mlflow", "mlflow"),
    (VERSION_TAG, "verlflow"),
]

# §6.3 of the guide: the four figures it reports, then every other timing_s_mean/*. Labels are English with
# verl's terms (the guide's 平均演员更新时间 translates verl's "actor" as a stage actor: it is the policy update).
GUIDE_TIMINGS: list[tuple[str, str]] = [
    (names.TIMING_E2E, "end-to-end time"),
    (f"{names.TIMING_MEAN_PREFIX}gen", "mean generation (rollout) time"),
    (f"{names.TIMING_MEAN_PREFIX}update_actor", "mean actor (policy) update time"),
    (f"{names.TIMING_MEAN_PREFIX}step", "mean step time"),
]

# Where the report's curve images sit, relative to the report: the grid and one file per curve.
GRID_IMAGE = "curves.png"
CURVE_DIR = "curves"


def curve_filename(key: str) -> str:
    """File name of one metric's plot: ``critic/score/mean`` → ``critic_score_mean.png``."""
    return key.replace("/", "_").replace(" ", "_") + ".png"


def candidate_over_baseline(baseline: float | None, candidate: float | None) -> float | None:
    """The ratio every §6 table shows; None when either figure is missing or the baseline is 0."""
    if baseline is None or candidate is None or baseline == 0:
        return None
    return candidate / baseline


@dataclass
class TimingRow:
    """One §6.3 line: a timing figure of both runs and candidate / baseline."""

    key: str
    label: str
    baseline: float | None
    candidate: float | None

    @property
    def ratio(self) -> float | None:
        """candidate / baseline (the guide's "1.58倍"), None when either is missing or baseline is 0."""
        return candidate_over_baseline(self.baseline, self.candidate)


def _fmt_number(value: float | None) -> str:
    if value is None:
        return MISSING
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return MISSING
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3g}"


def version_rows(baseline: RunSnapshot, candidate: RunSnapshot) -> list[tuple[str, str, str]]:
    """§6.1: (label, baseline value, candidate value) from the runs' tags, ``-`` when absent.

    Software tags beyond the guide's list (``sw.<other>``) follow, so nothing recorded is hidden.
    """
    rows = [
        (label, baseline.tags.get(tag, MISSING), candidate.tags.get(tag, MISSING))
        for tag, label in VERSION_ROWS
    ]
    known = {tag for tag, _ in VERSION_ROWS}
    extra = sorted(
        {k for r in (baseline, candidate) for k in r.tags if k.startswith("sw.") and k not in known}
    )
    rows += [
        (key.removeprefix("sw."), baseline.tags.get(key, MISSING), candidate.tags.get(key, MISSING))
        for key in extra
    ]
    return rows


def timing_label(key: str) -> str:
    """The guide's words for a timing key, or ``mean <name> time`` for the other ``timing_s_mean/*``."""
    for guide_key, label in GUIDE_TIMINGS:
        if key == guide_key:
            return label
    return f"mean {key.removeprefix(names.TIMING_MEAN_PREFIX).replace('_', ' ')} time"


def timing_keys(baseline: RunSnapshot, candidate: RunSnapshot) -> list[str]:
    """The guide's four timing keys, then every other ``timing_s_mean/*`` either run has, sorted."""
    guide = [key for key, _ in GUIDE_TIMINGS]
    others = sorted(
        {
            k
            for r in (baseline, candidate)
            for k in r.metrics
            if k.startswith(names.TIMING_MEAN_PREFIX) and k not in guide
        }
    )
    return guide + others


def timing_rows(baseline: RunSnapshot, candidate: RunSnapshot) -> list[TimingRow]:
    """§6.3: every timing figure of both runs with the ratio candidate / baseline."""
    return [
        TimingRow(key, timing_label(key), baseline.metrics.get(key), candidate.metrics.get(key))
        for key in timing_keys(baseline, candidate)
    ]


# ----------------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------------


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table (pipes in cells escaped)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _ratio(row: TimingRow) -> str:
    return MISSING if row.ratio is None else f"{row.ratio:.2f}×"


def _verdict(row: ParityRow) -> str:
    if row.passed is None:
        return "n/a"
    return "PASS" if row.passed else "FAIL"


def recipe_warning(diff: ConfigDiff, limit: int = 5) -> str | None:
    """The loud first line when settings outside the device profile differ, else None."""
    if not diff.recipes_differ:
        return None
    shown = "; ".join(f"{r.key}: {r.baseline} → {r.candidate}" for r in diff.recipe[:limit])
    more = f"; … {len(diff.recipe) - limit} more" if len(diff.recipe) > limit else ""
    return (
        f"⚠ RECIPES DIFFER: {len(diff.recipe)} setting(s) outside the device profile differ "
        f"({shown}{more}): a plain run-vs-run comparison follows (curves and differences), no parity verdict — "
        "parity is judged only between runs of one recipe on two device profiles."
    )


def same_device_warning(baseline: RunSnapshot, candidate: RunSnapshot) -> str | None:
    """The first line when both sides ran on one device profile (a rerun, another seed), else None."""
    if not same_device_profile(baseline, candidate):
        return None
    where = (baseline.tags.get(PROFILE_TAG) or baseline.tags.get(device_tags.NAME_TAG)
             or baseline.tags.get(device_tags.TYPE_TAG))
    return (f"SAME DEVICE PROFILE: both sides ran on {where or 'the same device'}: a run-vs-run comparison follows "
            "(curves and differences), no parity verdict — parity is judged only between two device profiles.")


def comparison_warning(diff: ConfigDiff, baseline: RunSnapshot, candidate: RunSnapshot) -> str | None:
    """Why no parity verdict is given (recipes differ, or one device profile on both sides); None: judged."""
    return recipe_warning(diff) or same_device_warning(baseline, candidate)


def not_judged_reason(diff: ConfigDiff) -> str:
    """The reason :func:`parity_summary` gives when a comparison is not judged."""
    return "the runs differ in recipe settings" if diff.recipes_differ else "both sides ran on one device profile"


def render_markdown(
    *,
    baseline: RunSnapshot,
    candidate: RunSnapshot,
    timings: Sequence[TimingRow],
    diff: ConfigDiff,
    parity: Sequence[ParityRow],
    threshold: float,
    tracking_uri: str,
    grid_image: str | None = None,
    curve_images: Mapping[str, str] | None = None,
    utilisation: str = "",
    compare_link: str = "",
    first_screen: Sequence[str] = (),
    sections_after_runs: Sequence[str] = (),
    guide: GuideCheck | None = None,
) -> str:
    """The whole report as Markdown: the answer in words (``first_screen``), warning, runs, the sections made
    elsewhere (``sections_after_runs``: several runs, efficiency), §6.1, §6.3, §6.2 with parity, §6.4
    (``utilisation``, rendered by :mod:`verlflow.compare.utilisation`), config diff. ``guide``: the sides'
    accelerators and ratio intervals the guide's §6.3 claims are held against (None: they are not compared).

    When the recipes differ or both sides ran on one device profile it is a plain run-vs-run report: the same
    parts without the guide's numbering, and curve differences without a parity verdict.
    """
    warning = comparison_warning(diff, baseline, candidate)
    judged = warning is None
    sections = [
        _header(baseline, candidate, diff, parity, threshold, tracking_uri, compare_link, first_screen),
        _runs_section(baseline, candidate),
        [part.rstrip() + "\n" for part in sections_after_runs if part],
        ["## 6.1 Versions" if judged else "## Versions", "",
         table(["component", baseline.label, candidate.label], version_rows(baseline, candidate)), ""],
        _timings_section(timings, judged, constructed(baseline, candidate), guide),
        _curves_section(parity, threshold, grid_image, curve_images or {}, judged),
        [utilisation.rstrip(), ""] if utilisation else [],
        _diff_section(diff),
    ]
    return "\n".join(line for section in sections for line in section).rstrip() + "\n"


def _header(baseline: RunSnapshot, candidate: RunSnapshot, diff: ConfigDiff, parity: Sequence[ParityRow],
            threshold: float, tracking_uri: str, compare_link: str, first_screen: Sequence[str]) -> list[str]:
    """Title, the loud warning when parity is not judged, the answer in words, the verdict, where the runs live."""
    out = [f"# Comparison: {candidate.name} vs {baseline.name}", ""]
    warning = comparison_warning(diff, baseline, candidate)
    if warning:
        out += [f"**{warning}**", ""]
    if first_screen:
        out += [*first_screen, ""]
    return out + [
        f"- {parity_summary(parity, threshold, judged=not warning, reason=not_judged_reason(diff))}",
        f"- tracking store: `{tracking_uri}`",
        *([f"- side by side in MLflow: {compare_link}"] if compare_link else []),
        "- ratios are candidate / baseline (>1: the candidate took longer)",
        "",
    ]


def _runs_section(baseline: RunSnapshot, candidate: RunSnapshot) -> list[str]:
    """Which two runs: names, ids, status, recipe, profile, backend; a note when one did not finish."""
    rows = [("run name", baseline.name, candidate.name),
            ("run id", f"`{baseline.run_id}`", f"`{candidate.run_id}`"),
            ("status", baseline.status, candidate.status)]
    rows += [(label, baseline.tags.get(tag, MISSING), candidate.tags.get(tag, MISSING))
             for label, tag in (("recipe", RECIPE_TAG), ("profile", PROFILE_TAG), ("backend", BACKEND_TAG))]
    out = ["## Runs", "", table(["", "baseline", "candidate"], rows), ""]
    unfinished = [r for r in (baseline, candidate) if r.status != "FINISHED"]
    if unfinished:
        out += [f"Note: {', '.join(f'{r.role} is {r.status}' for r in unfinished)}; its figures may be partial.", ""]
    return out


def constructed(*snaps: RunSnapshot) -> str | None:
    """How a run's figures were made up, when a run says so (tag ``verlflow.constructed``); None for real runs."""
    said = [s.tags.get(CONSTRUCTED_TAG) for s in snaps]
    if said and all(said) and len(set(said)) == 1:
        return f"every run: {said[0]}"
    return "; ".join(f"{s.role} `{s.name}`: {text}" for s, text in zip(snaps, said, strict=True) if text) or None


@dataclass(frozen=True)
class GuideCheck:
    """What the guide's §6.3 ratios can be held against here: each side's accelerator record and, per guide figure,
    the 95% interval of candidate / baseline over the sides' runs (None: one run on a side, no interval)."""

    sides: tuple[str, str] = ("", "")  # the records' names ("H20", "A3"); "" where a side's record is unknown
    intervals: Mapping[str, tuple[float, float] | None] = dataclasses.field(default_factory=dict)

    @property
    def applies(self) -> bool:
        """Whether this is the guide's pair: an H20 baseline against an A3 candidate (its ratios are A3 / H20)."""
        return self.sides == GUIDE_SIDES


def _interval_text(low: float, high: float) -> str:
    return f"[{low:.2f}, {high:.2f}]"


def guide_claim_note(timings: Sequence[TimingRow], made_up: str | None, guide: GuideCheck | None = None) -> str:
    """What the guide's §6.3 ratios say about these sides: nothing unless the baseline is an H20 set and the
    candidate an A3 set; "reproduced" only when each ratio's 95% interval lies inside ±5% of the guide's claim (one
    run on a side has no interval, so it reproduces nothing)."""
    guide = guide or GuideCheck()
    if not guide.applies:
        named = " against ".join(side or "an unknown accelerator" for side in guide.sides)
        swap = " (swap the sides: its ratios are A3 / H20)" if guide.sides == GUIDE_SIDES[::-1] else ""
        return (f"The guide's §6.3 ratios (A3 relative to H20) are not compared here: this is {named}{swap}; they "
                "are held only against an H20 baseline and an A3 candidate.")
    claims = ", ".join(f"{r.label} {GUIDE_RATIOS[r.key]:.2f}×" for r in timings if r.key in GUIDE_RATIOS)
    quoted = (f"The guide's §6.3 claims, as it states them (ratios only, A3 relative to H20, one run each, no "
              f"seconds): {claims}.")
    if made_up:
        return f"{quoted} **These runs' seconds are constructed** ({made_up}): they reproduce nothing."
    rows = [r for r in timings if r.key in GUIDE_RATIOS]
    found = {r.key: guide.intervals.get(r.key) for r in rows}
    if not rows or any(interval is None for interval in found.values()):
        return (f"{quoted} Whether these runs reproduce them cannot be told: a ratio with one run on a side (or a "
                "figure missing) has no interval; give each side 2 seeds or more.")
    shown = "; ".join(f"{r.label} {_interval_text(*found[r.key])}" for r in rows)
    inside = all(GUIDE_RATIOS[key] * (1 - GUIDE_TOLERANCE) <= low and high <= GUIDE_RATIOS[key] * (1 + GUIDE_TOLERANCE)
                 for key, (low, high) in found.items())
    if inside:
        return (f"{quoted} These sets reproduce them: each ratio's 95% interval lies inside ±5% of the guide's "
                f"({shown}).")
    return (f"{quoted} These sets do not reproduce them: not every ratio's 95% interval lies inside ±5% of the "
            f"guide's ({shown}).")


def _timings_section(timings: Sequence[TimingRow], judged: bool = True, made_up: str | None = None,
                     guide: GuideCheck | None = None) -> list[str]:
    """§6.3: each timing figure of both runs, their ratio, and the guide's claim beside its four figures (only
    between an H20 baseline and an A3 candidate, the pair it measured)."""
    claim = guide is not None and guide.applies
    rows = [(r.label, f"`{r.key}`", _fmt_seconds(r.baseline), _fmt_seconds(r.candidate), _ratio(r),
             *([f"{GUIDE_RATIOS[r.key]:.2f}×" if r.key in GUIDE_RATIOS else ""] if claim else [])) for r in timings]
    out = ["## 6.3 Performance (seconds)" if judged else "## Performance (seconds)", ""]
    if made_up:
        out += [f"⚠ Constructed figures, not measurements: {made_up}.", ""]
    header = ["figure", "metric", "baseline", "candidate", "candidate / baseline"]
    out += [table([*header, *(["the guide's claim (A3 / H20)"] if claim else [])], rows), ""]
    return out + [guide_claim_note(timings, made_up, guide), ""] if judged else out


def _curves_section(parity: Sequence[ParityRow], threshold: float, grid_image: str | None,
                    images: Mapping[str, str], judged: bool = True) -> list[str]:
    """§6.2: the curves image and the parity verdict of each curve (only their differences when not judged)."""
    out = ["## 6.2 Curves and precision parity" if judged else "## Curves", ""]
    if grid_image:
        out += [f"![curves]({grid_image})", ""]
    if not judged:
        rows = [(r.title, f"[`{r.key}`]({images[r.key]})" if r.key in images else f"`{r.key}`",
                 describe_steps(r.steps), percent(r.mean_relative_difference), _fmt_number(r.max_absolute_difference),
                 r.note) for r in parity]
        header = ["curve", "metric", "steps compared", "mean rel. diff", "max abs. diff", "note"]
        return out + ["Differences per curve over the common steps: mean of |candidate − baseline| / "
                      "max(|baseline|, ε), and the largest |candidate − baseline|.", "", table(header, rows), ""]
    if any(r.equivalence is not None and r.equivalence.tested for r in parity):
        out += ["Verdict per curve, verl's measure step by step: the common steps cut into up to 10 windows; in each, "
                "|candidate − baseline| of the sides' mean levels relative to the baseline's; its mean over the "
                "windows, so a curve that learns slower and then overshoots fails as a constant bias does. Equivalent "
                "when the upper end of its 90% interval (Welch's t on each run's own score) is under the curve's "
                "margin (verl's: loss and other curves 2%, GRPO reward 4%; p < 0.05). A curve whose baseline comes "
                "near zero (a window under a tenth of its largest) is judged on an absolute margin: the margin × "
                "its largest level, in the curve's unit, printed in the margin column. Parity passes only when every "
                "curve is shown equivalent, each at 5%: a false pass at most 5%.", ""]
        rows = [(r.title, f"[`{r.key}`]({images[r.key]})" if r.key in images else f"`{r.key}`",
                 describe_steps(r.steps), *_tested_cells(r), r.note) for r in parity]
        header = ["curve", "metric", "steps compared", "mean abs. difference", "90% interval", "p", "margin",
                  "verdict", "note"]
        return out + [table(header, rows), ""]
    out += [
        "Verdict per curve (a side has one run, so the noise between seeds is not measured: no p-value or interval): "
        "mean over the common steps of |candidate − baseline| / max(|baseline|, ε), PASS at or under the curve's "
        f"margin (verl's NPU/GPU precision-alignment rule: loss and other curves {threshold:.0%}, GRPO reward "
        f"{REWARD_MARGIN:.0%}).",
        "",
    ]
    rows = [(r.title, f"[`{r.key}`]({images[r.key]})" if r.key in images else f"`{r.key}`", describe_steps(r.steps),
             percent(r.mean_relative_difference), _fmt_number(r.max_absolute_difference), f"{r.margin:.0%}",
             _verdict(r), r.note) for r in parity]
    header = ["curve", "metric", "steps compared", "mean rel. diff", "max abs. diff", "margin", "verdict", "note"]
    return out + [table(header, rows), ""]


def _tested_cells(row: ParityRow) -> tuple[str, str, str, str, str]:
    """Mean |difference|, its 90% interval, p, margin and verdict of a tested curve."""
    test = row.equivalence
    if test is None or not test.tested:
        return (percent(row.mean_relative_difference), MISSING, MISSING, f"±{row.margin:.0%}",
                "n/a" if row.passed is None else "PASS (single-run rule)" if row.passed else "FAIL (single-run rule)")
    return (test.shown(test.relative_difference), f"[{test.shown(test.low)}, {test.shown(test.high)}]",
            f"{test.p_value:.2g}", test.margin_text, "equivalent" if test.equivalent else "not shown equivalent")


def _diff_section(diff: ConfigDiff) -> list[str]:
    """The settings that differ, grouped by what a difference means."""
    out = ["## Config diff", ""]
    groups = [
        ("Recipe (outside the device profile — should be empty)", diff.recipe),
        ("Device profile (expected to differ)", diff.profile),
        ("Seeds (what tells two runs of one setting apart)", diff.seeds),
        ("Paths and names (machine-specific)", diff.locations),
        ("Launch parameters", diff.launch),
    ]
    for title, rows in groups:
        body = (table(["key", "baseline", "candidate"], [(f"`{r.key}`", r.baseline, r.candidate) for r in rows])
                if rows else "no difference")
        out += [f"### {title}", "", body, ""]
    return out
