"""Comparing two runs: the guide's §6 (versions, curves, time ratios) and a precision-parity verdict.

    mlflow run . --env-manager local -e compare -P baseline=<h20 run> -P candidate=<a3 run>
    verlflow compare --baseline "tags.device.type = 'gpu'" --candidate "tags.device.type = 'npu'"

A side is one run or a set of runs: a run id or name, a comma list of them, or an MLflow filter string (every
run it matches). With two or more runs (seeds) on a side, the report gives each figure's mean and 95% interval
and judges differences against the seed-to-seed noise (:mod:`verlflow.compare.run_sets`). The
report (``report.md``, ``comparison.json``, ``curves.png``, ``curves/<metric>.png``) is printed and
logged under ``compare/`` of a comparison run tagged with both run ids; its figures are also metrics of
that run (``compare/ratio/timing_s_mean/gen``, ``compare/parity/critic/score/mean`` …). The runs are read by
:mod:`.reading` and the report's files written by :mod:`.report_files`; the efficiency and cost section is
:mod:`.efficiency`, profiled steps :mod:`.profiles`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verlflow.compare import efficiency, run_sets
from verlflow.compare.diff import ConfigDiff
from verlflow.compare.plot_worker import CurvePlotter
from verlflow.compare.reading import read_runs, resolve_runs
from verlflow.compare.report import (
    CURVE_DIR,
    DEFAULT_PARITY_THRESHOLD,
    GRID_IMAGE,
    ParityRow,
    TimingRow,
    comparison_warning,
    not_judged_reason,
    parity_summary,
)
from verlflow.compare.report_files import UTILISATION_IMAGE, ReportParts, build_report, compare_link, report_images
from verlflow.compare.report_html import log_report
from verlflow.compare.snapshot import RunSnapshot
from verlflow.errors import VerlflowError
from verlflow.names import STEP_TAG
from verlflow.text_safety import terminal_text
from verlflow.tracking import lookups, profiling, tracking, writes
from verlflow.util import check_output_dir, gc_paused

ARTIFACT_DIR = "compare"
COMPARE_LINK_TAG = "compare.mlflow_compare_runs"
# The run's description in the MLflow UI; tag values are capped at 8000 characters.
NOTE_TAG = "mlflow.note.content"
NOTE_LIMIT = 7800


@dataclass
class ComparisonResult:
    """Everything the report shows, plus where it went (the comparison run and the local folder)."""

    run_id: str
    baseline: RunSnapshot
    candidate: RunSnapshot
    versions: list[tuple[str, str, str]]
    timings: list[TimingRow]
    diff: ConfigDiff
    parity: list[ParityRow]
    threshold: float
    report: str
    output_dir: str
    # every run of each side (one each for a plain two-run comparison); ``baseline`` / ``candidate`` are their means
    baseline_runs: list[RunSnapshot] = dataclasses.field(default_factory=list)
    candidate_runs: list[RunSnapshot] = dataclasses.field(default_factory=list)
    # accuracy, reward and timing figures per side: mean, 95% interval, noise floor, verdict
    figures: list[run_sets.FigureRow] = dataclasses.field(default_factory=list)
    judged: bool = True
    # both sides' throughput per device / chip / node, MFU per phase and cost
    efficiency: tuple[efficiency.Efficiency, efficiency.Efficiency] | None = None

    @property
    def recipes_differ(self) -> bool:
        """Whether settings outside the device profile differ (the report then opens with a warning)."""
        return self.diff.recipes_differ

    @property
    def parity_passed(self) -> bool:
        """Whether every comparable curve is within the noise floor or threshold (False when not judged)."""
        return self.judged and all(r.passed for r in self.parity if r.passed is not None)


# ----------------------------------------------------------------------------------------------
# the step
# ----------------------------------------------------------------------------------------------


def _metric_values(
    timings: Sequence[TimingRow], parity: Sequence[ParityRow], diff: ConfigDiff, judged: bool,
    figures: Sequence[run_sets.FigureRow] = (),
) -> dict[str, float]:
    values: dict[str, float] = {}
    for row in timings:
        for prefix, value in (("baseline", row.baseline), ("candidate", row.candidate), ("ratio", row.ratio)):
            if value is not None:
                values[f"compare/{prefix}/{row.key}"] = value
    for row in parity:
        if row.mean_relative_difference is None:
            continue
        if not judged:  # a difference between unlike runs (or one device), not a parity figure
            values[f"compare/mean_rel_diff/{row.key}"] = row.mean_relative_difference
            continue
        values[f"compare/parity/{row.key}"] = row.mean_relative_difference
        values[f"compare/parity_pass/{row.key}"] = float(bool(row.passed))
        if row.equivalence is not None and row.equivalence.p_value is not None:
            values[f"compare/parity_p/{row.key}"] = row.equivalence.p_value
    for fig in figures:
        if fig.difference is not None:
            values[f"compare/difference/{fig.key}"] = fig.difference
        if fig.effect.p_value is not None:
            values[f"compare/p_value/{fig.key}"] = fig.effect.p_value
            values[f"compare/holm_p/{fig.key}"] = fig.effect.family_p  # over the report's family of verdicts
            values[f"compare/difference_low/{fig.key}"] = fig.effect.low
            values[f"compare/difference_high/{fig.key}"] = fig.effect.high
    values["compare/config_diff/recipe"] = len(diff.recipe)
    values["compare/config_diff/profile"] = len(diff.profile)
    return {tracking.sanitize_metric_key(k): float(v) for k, v in values.items()}


def _checked_runs(baseline: str, candidate: str, output_dir: str,
                  threshold: float) -> tuple[list[Any], list[Any]]:
    """The runs of both sides the user named, after the parameters were checked: one line for any mistake."""
    if not 0 < threshold < 1:
        raise VerlflowError(f"parity threshold must be a fraction between 0 and 1 (0.02 = 2%), got {threshold}")
    if output_dir:
        check_output_dir(output_dir, "output_dir")
    base_runs, cand_runs = resolve_runs(baseline, "baseline"), resolve_runs(candidate, "candidate")
    both = {r.info.run_id for r in base_runs} & {r.info.run_id for r in cand_runs}
    if both:
        raise VerlflowError(f"baseline and candidate share run(s) {', '.join(sorted(both))}: "
                            "give each side its own runs")
    return base_runs, cand_runs


def _log_comparison(out_dir: Path, link: str, parts: ReportParts, threshold: float) -> None:
    """The comparison on its own run: verdict tags, the report as the run's note, files, ratio metrics."""
    report, diff, parity = parts.report, parts.diff, parts.parity
    note = report if len(report) <= NOTE_LIMIT else report[:NOTE_LIMIT] + "\n\n… full report: compare/report.md"
    writes.set_tags({
        "compare.recipes_differ": str(diff.recipes_differ).lower(),
        "compare.judged": str(parts.judged).lower(),
        "compare.parity": parity_summary(parity, threshold, judged=parts.judged, reason=not_judged_reason(diff)),
        NOTE_TAG: note,
        COMPARE_LINK_TAG: link,
    })
    for name in ("comparison.json", GRID_IMAGE, UTILISATION_IMAGE):
        if (out_dir / name).is_file():
            writes.log_file(str(out_dir / name), ARTIFACT_DIR)
    log_report(report, out_dir, ARTIFACT_DIR, report_images())  # .md + .html
    writes.log_folder(str(out_dir / CURVE_DIR), f"{ARTIFACT_DIR}/{CURVE_DIR}")
    writes.log_metrics(_metric_values(parts.timings, parity, diff, parts.judged, parts.figures), step=0)


def compare_runs(
    baseline: str,
    candidate: str,
    output_dir: str = "",
    *,
    threshold: float = DEFAULT_PARITY_THRESHOLD,
    prices: str = "",
) -> ComparisonResult:
    """Compare two runs or two sets of runs (step ``compare``): print the report, log it under ``compare/``.

    ``baseline`` / ``candidate``: a run id or name, a comma list of them, or a filter string (every run it
    matches). ``output_dir`` also keeps the files locally ('' = only as artifacts). A recipe difference outside
    the device profile, or one device profile on both sides, is said first, and the report goes on without a
    parity verdict. ``prices``: a YAML of prices per profile (:func:`efficiency.read_prices`; '' = no cost figures).
    """
    price_table = efficiency.read_prices(prices) if prices else None
    # Started first: the worker loads matplotlib while the store opens and the runs are read.
    with CurvePlotter() as plotter:
        return _compare(baseline, candidate, output_dir, threshold, plotter, price_table)


def _compare(baseline: str, candidate: str, output_dir: str, threshold: float,
             plotter: CurvePlotter, prices: dict[str, tuple[float, str]] | None) -> ComparisonResult:
    with gc_paused():  # opening the store imports SQLAlchemy's and MLflow's store modules
        base_runs, cand_runs = _checked_runs(baseline, candidate, output_dir, threshold)
        base_set, cand_set = read_runs(base_runs, cand_runs)
        # a side's first run stands for it in the profile tables
        step_profiles = (profiling.read_step_summaries(base_set[0].run_id),
                         profiling.read_step_summaries(cand_set[0].run_id))
    tags = {
        STEP_TAG: "compare",
        "compare.baseline_run_id": base_set[0].run_id,
        "compare.candidate_run_id": cand_set[0].run_id,
        "compare.baseline_run_ids": ",".join(s.run_id for s in base_set)[:5000],
        "compare.candidate_run_ids": ",".join(s.run_id for s in cand_set)[:5000],
    }
    with tempfile.TemporaryDirectory(prefix="verlflow-compare-") as tmp:
        out_dir = Path(output_dir) if output_dir else Path(tmp)
        parts = build_report(base_set, cand_set, out_dir, threshold=threshold, plotter=plotter, prices=prices,
                             step_profiles=step_profiles)
        base, cand = run_sets.mean_snapshot(base_set), run_sets.mean_snapshot(cand_set)
        # Filed with the runs it compares (unless the caller chose an experiment), not in Default.
        beside = lookups.experiment_name(cand.experiment_id) if cand.experiment_id else None
        with tracking.tracked_run(run_name=f"compare {cand.name} vs {base.name}", tags=tags,
                                  experiment=beside) as run:
            warning = comparison_warning(parts.diff, base, cand)
            if warning:
                print(terminal_text(warning))
            print(terminal_text(parts.report))
            link = compare_link(base, cand)
            print(f"MLflow compare-runs page: {link}")
            _log_comparison(out_dir, link, parts, threshold)
        return ComparisonResult(
            run_id=run.info.run_id,
            baseline=base,
            candidate=cand,
            versions=parts.versions,
            timings=parts.timings,
            diff=parts.diff,
            parity=parts.parity,
            threshold=threshold,
            report=parts.report,
            output_dir=str(out_dir.resolve()) if output_dir else "",
            baseline_runs=base_set,
            candidate_runs=cand_set,
            figures=parts.figures,
            judged=parts.judged,
            efficiency=parts.efficiency,
        )
