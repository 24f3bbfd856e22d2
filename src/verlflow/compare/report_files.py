"""The comparison's files, computed from the two sides' snapshots: report.md, comparison.json and the images.

    python -c "from verlflow.compare.report_files import build_report; help(build_report)"

:func:`build_report` takes the snapshots :mod:`verlflow.compare.reading` read (one run or a set of runs per
side), judges them (:mod:`.report`, :mod:`.parity`, :mod:`.run_sets`), adds the efficiency, utilisation and
profile sections, and writes ``report.md``, ``comparison.json`` (the same tables and verdicts as data, for
scripts) and the PNGs (the curves drawn in :mod:`.plot_worker`'s process meanwhile) into a folder. It opens no
run: logging them on the comparison run is :mod:`verlflow.compare.comparison`'s.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from verlflow.compare import efficiency, profiles, run_sets
from verlflow.compare.diff import ConfigDiff, config_diff, launch_param_names, profile_param_keys
from verlflow.compare.first_screen import first_screen, hardware_effects, same_accelerator
from verlflow.compare.plot_worker import CurvePlotter
from verlflow.compare.report import (
    CURVE_DIR,
    CURVES,
    DEFAULT_EPS,
    DEFAULT_PARITY_THRESHOLD,
    GRID_IMAGE,
    GUIDE_RATIOS,
    GuideCheck,
    ParityRow,
    TimingRow,
    comparison_warning,
    curve_filename,
    parity_rows,
    render_markdown,
    timing_rows,
    version_rows,
    without_verdict,
)
from verlflow.compare.snapshot import RunSnapshot
from verlflow.compare.utilisation import (
    UtilisationRow,
    plot_utilisation,
    render_section,
    run_utilisation,
    utilisation_rows,
)
from verlflow.names import PROFILE_TAG
from verlflow.tracking import lookups
from verlflow.tracking import naming as run_names

UTILISATION_IMAGE = "utilisation.png"


def curve_images() -> dict[str, str]:
    """Each curve's image, relative to the report's folder: metric key → ``curves/<file>.png``."""
    return {key: f"{CURVE_DIR}/{curve_filename(key)}" for key, _ in CURVES}


def report_images() -> list[str]:
    """Every image the report shows, relative to its folder (what report.html embeds)."""
    return [GRID_IMAGE, UTILISATION_IMAGE, *curve_images().values()]


def compare_link(baseline: RunSnapshot, candidate: RunSnapshot) -> str:
    """MLflow's compare-runs page for the two runs on this tracking store (or how to open it with mlflow ui)."""
    return run_names.compare_runs_link(lookups.tracking_uri(), [baseline.experiment_id, candidate.experiment_id],
                                       [baseline.run_id, candidate.run_id])


@dataclass
class ReportParts:
    """What :func:`build_report` computed besides the Markdown: the tables, the verdicts and the figures."""

    report: str
    versions: list[tuple[str, str, str]]
    timings: list[TimingRow]
    diff: ConfigDiff
    parity: list[ParityRow]
    figures: list[run_sets.FigureRow]
    judged: bool
    efficiency: tuple[efficiency.Efficiency, efficiency.Efficiency] | None = None


def build_report(
    baseline: Sequence[RunSnapshot] | RunSnapshot,
    candidate: Sequence[RunSnapshot] | RunSnapshot,
    out_dir: Path,
    *,
    threshold: float = DEFAULT_PARITY_THRESHOLD,
    eps: float = DEFAULT_EPS,
    plotter: CurvePlotter | None = None,
    prices: dict[str, tuple[float, str]] | None = None,
    step_profiles: tuple[profiles.Summary, profiles.Summary] = ({}, {}),
) -> ReportParts:
    """Compute every part and write ``report.md``, ``comparison.json`` and the PNGs into ``out_dir``.

    ``baseline`` / ``candidate``: one run or the runs of a side. ``plotter`` draws the curves in its worker
    process while the rest is computed (a new one when None). ``prices``: :func:`efficiency.read_prices`.
    ``step_profiles``: both sides' profiled steps (:func:`verlflow.tracking.profiling.read_step_summaries`).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    base_set = [baseline] if isinstance(baseline, RunSnapshot) else list(baseline)
    cand_set = [candidate] if isinstance(candidate, RunSnapshot) else list(candidate)
    with contextlib.nullcontext(plotter) if plotter else CurvePlotter() as plotter:
        return _write_report(base_set, cand_set, out_dir, threshold, eps, plotter, prices, step_profiles)


def _plot_note(row: ParityRow) -> str:
    """The verdict written on a curve's plot."""
    if row.equivalence is not None and row.equivalence.tested:
        test = row.equivalence
        return (f"|diff| {test.shown(test.relative_difference)} "
                + ("equivalent" if test.equivalent else "not shown equivalent"))
    return f"{row.mean_relative_difference:.2%} " + ("mean rel. diff" if row.passed is None
                                                     else "PASS" if row.passed else "FAIL")


def _write_report(
    base_set: list[RunSnapshot], cand_set: list[RunSnapshot], out_dir: Path, threshold: float, eps: float,
    plotter: CurvePlotter, prices: dict[str, tuple[float, str]] | None = None,
    step_profiles: tuple[profiles.Summary, profiles.Summary] = ({}, {}),
) -> ReportParts:
    baseline, candidate = run_sets.mean_snapshot(base_set), run_sets.mean_snapshot(cand_set)
    extra_profiles = {
        r.tags[PROFILE_TAG] for r in (baseline, candidate) if r.tags.get(PROFILE_TAG)
    }
    diff = config_diff(baseline, candidate, profile_param_keys(extra_profiles), launch_param_names())
    judged = comparison_warning(diff, baseline, candidate) is None
    parity = parity_rows(baseline, candidate, threshold, eps)
    # one device profile, or different recipes: their differences, never a parity verdict
    parity = run_sets.judged_by_test(parity, base_set, cand_set) if judged else without_verdict(parity)
    notes = {r.key: _plot_note(r) for r in parity if r.mean_relative_difference is not None}
    plotter.submit(CURVES, baseline, candidate, out_dir, notes)
    versions = version_rows(baseline, candidate)
    timings = timing_rows(baseline, candidate)
    # a difference is a device's doing only between two accelerators (two profiles of one CPU are one device)
    device_judged = judged and not same_accelerator(baseline, candidate)
    figures = run_sets.figure_rows(base_set, cand_set, [(r.key, r.label) for r in timings], device_judged)
    effs = (efficiency.efficiency_of(baseline, prices), efficiency.efficiency_of(candidate, prices))
    # every verdict the report prints, decided together: one stated error rate (issue 55)
    figures, hardware = run_sets.one_family(figures, hardware_effects(base_set, cand_set, effs), device_judged)
    used = (run_utilisation(baseline, baseline.histories), run_utilisation(candidate, candidate.histories))
    both = used[0] is not None and used[1] is not None
    util_rows = utilisation_rows(*used) if both else []
    util_image = plot_utilisation(baseline, candidate, used, out_dir / UTILISATION_IMAGE) if both else None
    link = compare_link(baseline, candidate)
    report = render_markdown(
        baseline=baseline,
        candidate=candidate,
        timings=timings,
        diff=diff,
        parity=parity,
        threshold=threshold,
        tracking_uri=lookups.tracking_uri(),
        grid_image=GRID_IMAGE,
        curve_images=curve_images(),
        utilisation=render_section(baseline, candidate, used, util_rows, util_image.name if util_image else None),
        compare_link=link,
        sections_after_runs=[run_sets.render_section(base_set, cand_set, figures),
                             efficiency.render_section(*effs, prices is not None),
                             profiles.render_section(*step_profiles)],
        first_screen=first_screen(base_set, cand_set, baseline, candidate, effs, figures, judged, prices is not None,
                                  hardware),
        guide=guide_check(base_set, cand_set, effs),
    )
    (out_dir / "report.md").write_text(report, encoding="utf-8")
    parts = ReportParts(report, versions, timings, diff, parity, figures, judged, effs)
    summary = _comparison_json(base_set, cand_set, parts, threshold, step_profiles, util_rows, link)
    (out_dir / "comparison.json").write_text(json.dumps(_json_ready(summary), indent=1, ensure_ascii=False))
    plotter.wait()
    return parts


def ratio_interval(baseline: Sequence[float], candidate: Sequence[float],
                   level: float = 0.95) -> tuple[float, float] | None:
    """The ``level`` interval of candidate / baseline from one value per run: Welch's interval of the difference of
    the sides' mean log values, exponentiated (a ratio of geometric means; times are positive and skewed, a ratio
    lives on the log scale). None with fewer than 2 positive values on a side or no spread: no interval."""
    from scipy import stats as sp

    base = [math.log(v) for v in baseline if v > 0 and math.isfinite(v)]
    cand = [math.log(v) for v in candidate if v > 0 and math.isfinite(v)]
    if len(base) < 2 or len(cand) < 2 or len(base) < len(baseline) or len(cand) < len(candidate):
        return None
    vb, vc = statistics.variance(base) / len(base), statistics.variance(cand) / len(cand)
    if not vb + vc > 0:
        return None
    df = (vb + vc) ** 2 / (vb**2 / (len(base) - 1) + vc**2 / (len(cand) - 1))
    centre = statistics.fmean(cand) - statistics.fmean(base)
    half = float(sp.t.ppf(0.5 + level / 2, df)) * math.sqrt(vb + vc)
    return math.exp(centre - half), math.exp(centre + half)


def guide_check(base_set: Sequence[RunSnapshot], cand_set: Sequence[RunSnapshot],
                effs: tuple[efficiency.Efficiency, efficiency.Efficiency]) -> GuideCheck:
    """Each side's accelerator record and, for the guide's four §6.3 figures, the interval of their ratio."""
    intervals = {}
    for key in GUIDE_RATIOS:
        base, cand = run_sets.side_figure(base_set, key), run_sets.side_figure(cand_set, key)
        intervals[key] = ratio_interval(base.values, cand.values) if base and cand else None
    return GuideCheck((effs[0].hardware.name, effs[1].hardware.name), intervals)


def _comparison_json(base_set: list[RunSnapshot], cand_set: list[RunSnapshot], parts: ReportParts,
                     threshold: float, step_profiles: tuple[profiles.Summary, profiles.Summary],
                     util_rows: list[UtilisationRow], link: str) -> dict[str, object]:
    """comparison.json: the report's tables and verdicts as data, for scripts."""
    baseline, candidate = base_set[0], cand_set[0]  # a side's identity is its first run's (mean_snapshot)
    effs = parts.efficiency or ()
    return {
        "baseline": {"run_id": baseline.run_id, "name": baseline.name, "runs": [s.run_id for s in base_set]},
        "candidate": {"run_id": candidate.run_id, "name": candidate.name, "runs": [s.run_id for s in cand_set]},
        "versions": parts.versions,
        "timings": [{**asdict(r), "ratio": r.ratio} for r in parts.timings],
        "config_diff": asdict(parts.diff),
        "recipes_differ": parts.diff.recipes_differ,
        "judged": parts.judged,
        "parity": [asdict(r) for r in parts.parity],
        "figures": [{**asdict(r), "difference": r.difference} for r in parts.figures],
        "threshold": threshold,
        "efficiency": {e.role: {**asdict(e), "tokens_per_s_per_device": e.tokens_per_s("device"),
                                "tokens_per_s_per_chip": e.tokens_per_s("chip"),
                                "tokens_per_s_per_node": e.tokens_per_s("node"),
                                "cost_per_1k_samples": e.cost_per_1k_samples} for e in effs},
        "work_time_ratios": efficiency.work_time_ratios(*effs),
        "profiles": {"baseline": step_profiles[0], "candidate": step_profiles[1]},
        "utilisation": [{**asdict(r), "ratio": r.ratio} for r in util_rows],
        "mlflow_compare": link,
    }


def _json_ready(result_parts: dict) -> dict:
    def clean(obj):
        if isinstance(obj, float) and not math.isfinite(obj):
            return None
        if isinstance(obj, dict):
            return {k: clean(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [clean(v) for v in obj]
        return obj

    return clean(result_parts)
