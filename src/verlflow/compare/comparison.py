"""Comparing two runs: the guide's §6 (versions, curves, time ratios) and a precision-parity verdict.

    mlflow run . --env-manager local -e compare -P baseline=<h20 run> -P candidate=<a3 run>
    verlflow compare --baseline "tags.device.type = 'gpu'" --candidate "tags.device.type = 'npu'"

A run is given by id, by run name, or by an MLflow filter string that selects exactly one run. The
report (``report.md``, ``comparison.json``, ``curves.png``, ``curves/<metric>.png``) is printed and
logged under ``compare/`` of a comparison run tagged with both run ids; its figures are also metrics of
that run (``compare/ratio/timing_s_mean/gen``, ``compare/parity/critic/score/mean`` …).

Histories are read with MLflow's public client (``get_metric_history``), only for the curves the report needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import mlflow
from mlflow.entities import Run, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.compare.diff import (
    ConfigDiff,
    config_diff,
    launch_param_names,
    profile_param_keys,
)
from verlflow.compare.plot_worker import CurvePlotter
from verlflow.compare.report import (
    CURVE_DIR,
    CURVES,
    DEFAULT_EPS,
    DEFAULT_PARITY_THRESHOLD,
    GRID_IMAGE,
    ParityRow,
    TimingRow,
    curve_filename,
    parity_rows,
    parity_summary,
    plain_label,
    recipe_warning,
    render_markdown,
    timing_rows,
    version_rows,
    without_verdict,
)
from verlflow.compare.report_html import report_page
from verlflow.compare.snapshot import RunSnapshot
from verlflow.compare.utilisation import (
    needed_keys,
    plot_utilisation,
    render_section,
    run_utilisation,
    utilisation_rows,
)
from verlflow.errors import VerlflowError
from verlflow.names import (
    PROFILE_TAG,
    STEP_TAG,
    TIMING_E2E,
    TIMING_MEAN_PREFIX,
    TIMING_PREFIX,
    canonical_metrics,
    metric_names,
)
from verlflow.runs import naming as run_names
from verlflow.runs import tracking
from verlflow.util import check_output_dir, gc_paused

ARTIFACT_DIR = "compare"
UTILISATION_IMAGE = "utilisation.png"
COMPARE_LINK_TAG = "compare.mlflow_compare_runs"
# A reference is a filter string when it holds a comparison operator (run ids and names do not).
_FILTER_RE = re.compile(r"(=|!=|<|>|\s(i?like|in)\s)", re.IGNORECASE)
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

    @property
    def recipes_differ(self) -> bool:
        """Whether settings outside the device profile differ (the report then opens with a warning)."""
        return self.diff.recipes_differ

    @property
    def parity_passed(self) -> bool:
        """Whether every comparable curve is within the threshold (False when not judged: recipes differ)."""
        return not self.recipes_differ and all(r.passed for r in self.parity if r.passed is not None)


# ----------------------------------------------------------------------------------------------
# finding the runs
# ----------------------------------------------------------------------------------------------


def is_filter(ref: str) -> bool:
    """Whether a run reference is an MLflow filter string (``tags.device.type = 'npu'``)."""
    return bool(_FILTER_RE.search(ref))


def resolve_run(ref: str, role: str = "run") -> Run:
    """The run a reference means: a run id, a run name, or a filter string matching exactly one run."""
    ref = (ref or "").strip()
    if not ref:
        raise VerlflowError(
            f"{role} is empty: give a run id, a run name, or a filter such as \"tags.device.type = 'npu'\""
        )
    if not is_filter(ref):
        return tracking.get_run(ref)
    client = MlflowClient()
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    try:
        runs = client.search_runs(
            experiments, filter_string=ref, max_results=3, order_by=["attributes.start_time DESC"]
        )
    except MlflowException as exc:
        first = (str(exc.message).strip().splitlines() or ["(no detail)"])[0]
        raise VerlflowError(f'{role} filter "{ref}" is not a valid MLflow filter: {first}') from None
    if not runs:
        raise VerlflowError(
            f'{role} filter "{ref}" matches no run in the tracking store {mlflow.get_tracking_uri()}'
        )
    if len(runs) > 1:
        names = ", ".join(f"{r.info.run_name} ({r.info.run_id})" for r in runs[:2])
        raise VerlflowError(
            f'{role} filter "{ref}" matches several runs ({names}, …): add a condition '
            "(e.g. and tags.verlflow.step = 'train') or give a run id"
        )
    return runs[0]


# ----------------------------------------------------------------------------------------------
# reading histories in bulk
# ----------------------------------------------------------------------------------------------


def fetch_histories(
    run_ids: Sequence[str], keys: Iterable[str], client: MlflowClient | None = None
) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Histories of ``keys`` for every run: {run_id: {key: [(step, value)] sorted by step}}.

    Read with MLflow's public ``get_metric_history``, one request per run and key (MLflow's bulk-interval
    read has no public client call). Where a step was logged twice, the later value wins, as the MLflow UI
    shows it.
    """
    client = client or MlflowClient()
    out: dict[str, dict[str, list[tuple[int, float]]]] = {rid: {} for rid in run_ids}
    for key in keys:
        for rid in run_ids:
            points = [(m.step, m.value, m.timestamp) for m in client.get_metric_history(rid, key)]
            if points:
                latest = {step: value for step, value, _ in sorted(points, key=lambda p: (p[0], p[2]))}
                out[rid][key] = sorted(latest.items())
    return out


# ----------------------------------------------------------------------------------------------
# snapshots
# ----------------------------------------------------------------------------------------------


def _datasets(run: Run) -> dict[str, str]:
    found = {}
    for item in getattr(run.inputs, "dataset_inputs", None) or []:
        context = next((t.value for t in item.tags if t.key == "mlflow.data.context"), "")
        found[f"{item.dataset.name} ({context})" if context else item.dataset.name] = item.dataset.digest
    return found


def snapshot(run: Run, role: str) -> RunSnapshot:
    """A run's identity, tags, params and latest metrics (histories are added by :func:`read_runs`)."""
    return RunSnapshot(
        role=role,
        run_id=run.info.run_id,
        name=run.info.run_name or run.info.run_id,
        status=run.info.status,
        tags=dict(run.data.tags),
        params=dict(run.data.params),
        metrics=canonical_metrics(run.data.metrics),
        datasets=_datasets(run),
        experiment_id=run.info.experiment_id,
    )


def _fill_timing_summaries(snap: RunSnapshot, run: Run) -> None:
    """A run that logged per-step ``timing_s/*`` but no summaries (it ended early) gets them computed."""
    for key, points in list(snap.histories.items()):
        if key.startswith(TIMING_PREFIX) and key != TIMING_E2E:
            mean_key = f"{TIMING_MEAN_PREFIX}{key.removeprefix(TIMING_PREFIX)}"
            values = [v for _, v in points if math.isfinite(v)]
            if values and mean_key not in snap.metrics:
                snap.metrics[mean_key] = sum(values) / len(values)
    if TIMING_E2E not in snap.metrics and run.info.end_time and run.info.start_time:
        snap.metrics[TIMING_E2E] = (run.info.end_time - run.info.start_time) / 1000


def _has_timing(snap: RunSnapshot) -> bool:
    return any(k == TIMING_E2E or k.startswith((TIMING_MEAN_PREFIX, TIMING_PREFIX)) for k in snap.metrics)


def read_runs(baseline: Run, candidate: Run) -> tuple[RunSnapshot, RunSnapshot]:
    """Both runs as snapshots, with the §6.2 curve histories the report needs."""
    snaps = (snapshot(baseline, "baseline"), snapshot(candidate, "candidate"))
    for snap in snaps:
        if not _has_timing(snap):
            raise VerlflowError(
                f"{snap.role} run '{snap.name}' ({snap.run_id}) has no timing metrics "
                f"({TIMING_E2E}, {TIMING_MEAN_PREFIX}*): compare needs train runs"
            )
    present = {k for s in snaps for k in s.metrics}
    # A curve is read under every verl version's name for it, and kept under its canonical name.
    logged = {k for run in (baseline, candidate) for k in run.data.metrics}
    keys = [name for k, _ in CURVES if k in present for name in metric_names(k) if name in logged]
    # Per-step timings only where a run lacks the end-of-run summaries (a run cut short).
    for snap in snaps:
        if not any(k.startswith(TIMING_MEAN_PREFIX) for k in snap.metrics):
            keys += [
                k for k in snap.metrics if k.startswith(TIMING_PREFIX) and k != TIMING_E2E and k not in keys
            ]
    # §6.4: device utilisation, memory and power, host CPU and memory (system/*), when a run has them.
    keys += [k for snap in snaps for k in needed_keys(snap) if k not in keys]
    histories = fetch_histories([s.run_id for s in snaps], keys)
    for snap, run in zip(snaps, (baseline, candidate), strict=True):
        snap.histories = canonical_metrics(histories[snap.run_id])
        _fill_timing_summaries(snap, run)
    return snaps


# ----------------------------------------------------------------------------------------------
# the step
# ----------------------------------------------------------------------------------------------


def _metric_values(
    timings: Sequence[TimingRow], parity: Sequence[ParityRow], diff: ConfigDiff
) -> dict[str, float]:
    values: dict[str, float] = {}
    for row in timings:
        for prefix, value in (("baseline", row.baseline), ("candidate", row.candidate), ("ratio", row.ratio)):
            if value is not None:
                values[f"compare/{prefix}/{row.key}"] = value
    for row in parity:
        if row.mean_relative_difference is None:
            continue
        if diff.recipes_differ:  # a difference between unlike runs, not a parity figure
            values[f"compare/mean_rel_diff/{row.key}"] = row.mean_relative_difference
            continue
        values[f"compare/parity/{row.key}"] = row.mean_relative_difference
        values[f"compare/parity_pass/{row.key}"] = float(bool(row.passed))
    values["compare/config_diff/recipe"] = len(diff.recipe)
    values["compare/config_diff/profile"] = len(diff.profile)
    return {tracking.sanitize_metric_key(k): float(v) for k, v in values.items()}


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


def compare_link(baseline: RunSnapshot, candidate: RunSnapshot) -> str:
    """MLflow's compare-runs page for the two runs on this tracking store (or how to open it with mlflow ui)."""
    return run_names.compare_runs_link(mlflow.get_tracking_uri(), [baseline.experiment_id, candidate.experiment_id],
                                       [baseline.run_id, candidate.run_id])


def build_report(
    baseline: RunSnapshot,
    candidate: RunSnapshot,
    out_dir: Path,
    *,
    threshold: float = DEFAULT_PARITY_THRESHOLD,
    eps: float = DEFAULT_EPS,
    plotter: CurvePlotter | None = None,
) -> tuple[str, list[tuple[str, str, str]], list[TimingRow], ConfigDiff, list[ParityRow]]:
    """Compute every part and write ``report.md``, ``comparison.json`` and the PNGs into ``out_dir``.

    ``plotter`` draws the curves in its worker process while the rest is computed (a new one when None).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext(plotter) if plotter else CurvePlotter() as plotter:
        return _write_report(baseline, candidate, out_dir, threshold, eps, plotter)


def _write_report(
    baseline: RunSnapshot, candidate: RunSnapshot, out_dir: Path, threshold: float, eps: float,
    plotter: CurvePlotter,
) -> tuple[str, list[tuple[str, str, str]], list[TimingRow], ConfigDiff, list[ParityRow]]:
    extra_profiles = {
        r.tags[PROFILE_TAG] for r in (baseline, candidate) if r.tags.get(PROFILE_TAG)
    }
    diff = config_diff(baseline, candidate, profile_param_keys(extra_profiles), launch_param_names())
    parity = parity_rows(baseline, candidate, threshold, eps)
    if diff.recipes_differ:  # runs of different recipes: their differences, never a parity verdict
        parity = without_verdict(parity)
    notes = {
        r.key: f"{r.mean_relative_difference:.2%} " + ("mean rel. diff" if r.passed is None
                                                       else "PASS" if r.passed else "FAIL")
        for r in parity
        if r.mean_relative_difference is not None
    }
    plotter.submit(CURVES, baseline, candidate, out_dir, notes)
    versions = version_rows(baseline, candidate)
    timings = timing_rows(baseline, candidate)
    if diff.recipes_differ:
        versions = [(plain_label(label), b, c) for label, b, c in versions]
        timings = [dataclasses.replace(r, label=plain_label(r.label)) for r in timings]
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
        tracking_uri=mlflow.get_tracking_uri(),
        grid_image=GRID_IMAGE,
        curve_images={key: f"{CURVE_DIR}/{curve_filename(key)}" for key, _ in CURVES},
        utilisation=render_section(baseline, candidate, used, util_rows, util_image.name if util_image else None),
        compare_link=link,
    )
    (out_dir / "report.md").write_text(report, encoding="utf-8")
    summary = {
        "baseline": {"run_id": baseline.run_id, "name": baseline.name},
        "candidate": {"run_id": candidate.run_id, "name": candidate.name},
        "versions": versions,
        "timings": [{**asdict(r), "ratio": r.ratio} for r in timings],
        "config_diff": asdict(diff),
        "recipes_differ": diff.recipes_differ,
        "parity": [asdict(r) for r in parity],
        "threshold": threshold,
        "utilisation": [{**asdict(r), "ratio": r.ratio} for r in util_rows],
        "mlflow_compare": link,
    }
    (out_dir / "comparison.json").write_text(json.dumps(_json_ready(summary), indent=1, ensure_ascii=False))
    plotter.wait()
    return report, versions, timings, diff, parity


def _checked_runs(baseline: str, candidate: str, output_dir: str, threshold: float) -> tuple[Run, Run]:
    """The two runs the user named, after the parameters were checked: one line for any mistake."""
    if not 0 < threshold < 1:
        raise VerlflowError(f"parity threshold must be a fraction between 0 and 1 (0.02 = 2%), got {threshold}")
    if output_dir:
        check_output_dir(output_dir, "output_dir")
    base_run, cand_run = resolve_run(baseline, "baseline"), resolve_run(candidate, "candidate")
    if base_run.info.run_id == cand_run.info.run_id:
        raise VerlflowError(f"baseline and candidate are the same run ({base_run.info.run_id}): give two runs")
    return base_run, cand_run


def _log_comparison(out_dir: Path, report: str, link: str, timings: list[TimingRow], diff: ConfigDiff,
                    parity: list[ParityRow], threshold: float) -> None:
    """The comparison on its own run: verdict tags, the report as the run's note, files, ratio metrics."""
    note = report if len(report) <= NOTE_LIMIT else report[:NOTE_LIMIT] + "\n\n… full report: compare/report.md"
    mlflow.set_tags({
        "compare.recipes_differ": str(diff.recipes_differ).lower(),
        "compare.parity": parity_summary(parity, threshold, judged=not diff.recipes_differ),
        NOTE_TAG: note,
        COMPARE_LINK_TAG: link,
    })
    for name in ("report.md", "comparison.json", GRID_IMAGE, UTILISATION_IMAGE):
        if (out_dir / name).is_file():
            mlflow.log_artifact(str(out_dir / name), ARTIFACT_DIR)
    mlflow.log_text(report_page(report, out_dir, "compare"), f"{ARTIFACT_DIR}/report.html")  # images embedded
    mlflow.log_artifacts(str(out_dir / CURVE_DIR), f"{ARTIFACT_DIR}/{CURVE_DIR}")
    mlflow.log_metrics(_metric_values(timings, parity, diff), step=0)


def compare_runs(
    baseline: str,
    candidate: str,
    output_dir: str = "",
    *,
    threshold: float = DEFAULT_PARITY_THRESHOLD,
) -> ComparisonResult:
    """Compare two runs (what step ``compare`` does): print the §6 report, log it under ``compare/`` of a new run.

    ``baseline`` / ``candidate``: run id, run name or a filter string selecting one run. ``output_dir``
    also keeps the files locally ('' = only as artifacts). A recipe difference outside the device
    profile is reported first and loudly, and the report still goes on.
    """
    # Started first: the worker loads matplotlib while the store opens and the runs are read.
    with CurvePlotter() as plotter:
        return _compare(baseline, candidate, output_dir, threshold, plotter)


def _compare(baseline: str, candidate: str, output_dir: str, threshold: float,
             plotter: CurvePlotter) -> ComparisonResult:
    with gc_paused():  # opening the store imports SQLAlchemy's and MLflow's store modules
        base_run, cand_run = _checked_runs(baseline, candidate, output_dir, threshold)
        base, cand = read_runs(base_run, cand_run)
    tags = {
        STEP_TAG: "compare",
        "compare.baseline_run_id": base.run_id,
        "compare.candidate_run_id": cand.run_id,
    }
    with tempfile.TemporaryDirectory(prefix="verlflow-compare-") as tmp:
        out_dir = Path(output_dir) if output_dir else Path(tmp)
        report, versions, timings, diff, parity = build_report(base, cand, out_dir, threshold=threshold,
                                                               plotter=plotter)
        # Filed with the runs it compares (unless the caller chose an experiment), not in Default.
        beside = MlflowClient().get_experiment(cand.experiment_id).name if cand.experiment_id else None
        with tracking.tracked_run(run_name=f"compare {cand.name} vs {base.name}", tags=tags,
                                  experiment=beside) as run:
            warning = recipe_warning(diff)
            if warning:
                print(warning)
            print(report)
            link = compare_link(base, cand)
            print(f"MLflow compare-runs page: {link}")
            _log_comparison(out_dir, report, link, timings, diff, parity, threshold)
        return ComparisonResult(
            run_id=run.info.run_id,
            baseline=base,
            candidate=cand,
            versions=versions,
            timings=timings,
            diff=diff,
            parity=parity,
            threshold=threshold,
            report=report,
            output_dir=str(out_dir.resolve()) if output_dir else "",
        )
