"""The arithmetic and the Markdown of the §6 comparison: versions, time ratios, parity.

    python -c "from verlflow.compare.report import mean_relative_difference as m; print(m([1, 2], [1.01, 2]))"

Everything here works on :class:`RunSnapshot` objects (what :mod:`verlflow.compare.comparison` read from the
tracking store in one pass per run), so it is plain computation: no MLflow calls, no files.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from verlflow import names
from verlflow.compare.diff import ConfigDiff
from verlflow.compare.snapshot import MISSING, RunSnapshot, same_device_profile
from verlflow.names import BACKEND_TAG, PROFILE_TAG, RECIPE_TAG, VERSION_TAG

# verl's NPU/GPU precision-alignment rule (docs/ascend_tutorial): a loss curve on Ascend is accepted
# when its mean relative error to the GPU curve is at most 2% (GRPO rewards: 4%).
DEFAULT_PARITY_THRESHOLD = 0.02
DEFAULT_EPS = 1e-8

# §6.1 of the guide, row by row: (tag, label). The guide's own words are kept in brackets.
VERSION_ROWS: list[tuple[str, str]] = [
    ("device.type", "device type"),
    ("device.name", "machine / device"),
    ("device.count", "devices (as verl counts them: an A3 die is one)"),
    ("device.memory_gb", "memory per device (GiB)"),
    ("device.model", "accelerator (profile's record)"),
    ("device.node", "node (profile's record)"),
    ("device.devices_per_node", "devices per node (profile's record)"),
    ("device.peak_tflops", "peak dense TFLOPS per device (profile's record)"),
    ("device.interconnect", "interconnect (profile's record)"),
    ("device.stack", "expected stack (config/stacks)"),
    ("device.driver", "driver (HDK)"),
    ("device.firmware", "firmware"),
    ("device.cann", "CANN"),
    ("device.cuda", "CUDA"),
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
    # The largest difference between two runs of one side (None: one run per side, the threshold judges).
    noise_floor: float | None = None


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
        return ParityRow(key, title, [], None, None, None, f"not logged by the {' and '.join(missing)}")
    b_map, c_map = dict(b_hist), dict(c_hist)
    steps = sorted(s for s in set(b_map) & set(c_map) if math.isfinite(b_map[s]) and math.isfinite(c_map[s]))
    if not steps:
        return ParityRow(key, title, [], None, None, None, "no common step with finite values")
    base, cand = [b_map[s] for s in steps], [c_map[s] for s in steps]
    mrd = mean_relative_difference(base, cand, eps)
    max_abs = max(abs(c - b) for b, c in zip(base, cand, strict=True))
    note = ""
    if len(steps) < max(len(b_map), len(c_map)):
        note = (
            f"baseline logged {len(b_map)} steps, candidate {len(c_map)}; compared the {len(steps)} in common"
        )
    return ParityRow(key, title, steps, mrd, max_abs, mrd <= threshold, note)


def without_verdict(rows: Sequence[ParityRow]) -> list[ParityRow]:
    """The same differences with no PASS/FAIL: for runs of different recipes, where parity means nothing."""
    return [dataclasses.replace(r, passed=None) for r in rows]


def parity_rows(
    baseline: RunSnapshot,
    candidate: RunSnapshot,
    threshold: float = DEFAULT_PARITY_THRESHOLD,
    eps: float = DEFAULT_EPS,
) -> list[ParityRow]:
    """The parity verdict of every §6.2 curve."""
    return [parity_row(key, title, baseline, candidate, threshold, eps) for key, title in CURVES]


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


def _percent(value: float | None) -> str:
    if value is None:
        return MISSING
    return "<0.01%" if 0 < value < 1e-4 else f"{value:.2%}"


def _verdict(row: ParityRow) -> str:
    if row.passed is None:
        return "n/a"
    return "PASS" if row.passed else "FAIL"


def parity_summary(rows: Sequence[ParityRow], threshold: float, *, judged: bool = True,
                   reason: str = "the runs differ in recipe settings") -> str:
    """One line: how many comparable curves are within the noise floor or the threshold (or why not judged)."""
    if not judged:
        return f"parity: not judged ({reason}: a plain run-vs-run comparison)"
    compared = [r for r in rows if r.passed is not None]
    passed = [r for r in compared if r.passed]
    if not compared:
        return "parity: no curve could be compared"
    word = "PASS" if len(passed) == len(compared) else "FAIL"
    if any(r.noise_floor is not None for r in compared):
        return (f"parity {word}: {len(passed)}/{len(compared)} curves within the seed-to-seed noise floor "
                f"(a device effect on {len(compared) - len(passed)})")
    return (f"parity {word}: {len(passed)}/{len(compared)} curves within {threshold:.0%} mean relative difference "
            "(one run per side: verl's 2% rule; the noise between seeds was not measured)")


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
    where = baseline.tags.get(PROFILE_TAG) or baseline.tags.get("device.name") or baseline.tags.get("device.type")
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
) -> str:
    """The whole report as Markdown: the answer in words (``first_screen``), warning, runs, the sections made
    elsewhere (``sections_after_runs``: several runs, efficiency), §6.1, §6.3, §6.2 with parity, §6.4
    (``utilisation``, rendered by :mod:`verlflow.compare.utilisation`), config diff.

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
        _timings_section(timings, judged),
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
    ratios = ("- ratios are candidate / baseline (the guide's §6.3 reads A3 relative to H20: >1 means slower)"
              if not warning else "- ratios are candidate / baseline (>1: the candidate took longer)")
    return out + [
        f"- {parity_summary(parity, threshold, judged=not warning, reason=not_judged_reason(diff))}",
        f"- tracking store: `{tracking_uri}`",
        *([f"- side by side in MLflow: {compare_link}"] if compare_link else []),
        ratios,
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


def _timings_section(timings: Sequence[TimingRow], judged: bool = True) -> list[str]:
    """§6.3: each timing figure of both runs and their ratio."""
    rows = [(r.label, f"`{r.key}`", _fmt_seconds(r.baseline),
             _fmt_seconds(r.candidate), _ratio(r)) for r in timings]
    return ["## 6.3 Performance (seconds)" if judged else "## Performance (seconds)", "",
            table(["figure", "metric", "baseline", "candidate", "candidate / baseline"], rows), ""]


def _curves_section(parity: Sequence[ParityRow], threshold: float, grid_image: str | None,
                    images: Mapping[str, str], judged: bool = True) -> list[str]:
    """§6.2: the curves image and the parity verdict of each curve (only their differences when not judged)."""
    out = ["## 6.2 Curves and precision parity" if judged else "## Curves", ""]
    if grid_image:
        out += [f"![curves]({grid_image})", ""]
    if not judged:
        rows = [(r.title, f"[`{r.key}`]({images[r.key]})" if r.key in images else f"`{r.key}`",
                 describe_steps(r.steps), _percent(r.mean_relative_difference), _fmt_number(r.max_absolute_difference),
                 r.note) for r in parity]
        header = ["curve", "metric", "steps compared", "mean rel. diff", "max abs. diff", "note"]
        return out + ["Differences per curve over the common steps: mean of |candidate − baseline| / "
                      "max(|baseline|, ε), and the largest |candidate − baseline|.", "", table(header, rows), ""]
    if any(r.noise_floor is not None for r in parity):
        out += ["Verdict per curve: the mean relative difference of the two sides' mean curves against the noise "
                "floor, the largest difference between two runs of one side; a device effect (FAIL) only beyond it.",
                ""]
        rows = [(r.title, f"[`{r.key}`]({images[r.key]})" if r.key in images else f"`{r.key}`",
                 describe_steps(r.steps), _percent(r.mean_relative_difference), _percent(r.noise_floor),
                 "n/a" if r.passed is None else "within noise" if r.passed else "device effect", r.note)
                for r in parity]
        header = ["curve", "metric", "steps compared", "mean rel. diff", "noise floor", "verdict", "note"]
        return out + [table(header, rows), ""]
    out += [
        f"Verdict per curve (one run per side, so the noise between seeds is not measured): mean over the common "
        f"steps of |candidate − baseline| / max(|baseline|, ε), PASS at or under {threshold:.0%} (verl's NPU/GPU "
        f"precision-alignment rule: loss ≤ 2%, GRPO reward ≤ 4%).",
        "",
    ]
    rows = [(r.title, f"[`{r.key}`]({images[r.key]})" if r.key in images else f"`{r.key}`", describe_steps(r.steps),
             _percent(r.mean_relative_difference), _fmt_number(r.max_absolute_difference), _verdict(r), r.note)
            for r in parity]
    header = ["curve", "metric", "steps compared", "mean rel. diff", "max abs. diff", "verdict", "note"]
    return out + [table(header, rows), ""]


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
