"""Reading the runs a comparison names: references (id, name, comma list, filter) to runs, runs to snapshots.

    python -c "from verlflow.compare.reading import is_filter; print(is_filter(\"tags.device.type = 'npu'\"))"

Histories are read with MLflow's public client (``get_metric_history``), only for the curves the report needs.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Sequence

import mlflow
from mlflow.entities import Run, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.compare import efficiency
from verlflow.compare.report import CURVES
from verlflow.compare.snapshot import RunSnapshot
from verlflow.compare.utilisation import needed_keys
from verlflow.errors import VerlflowError
from verlflow.names import (
    DRY_RUN_TAG,
    PROFILE_TAG,
    TIMING_E2E,
    TIMING_MEAN_PREFIX,
    TIMING_PREFIX,
    canonical_metrics,
    metric_names,
)
from verlflow.tracking import tracking

# A reference is a filter string when it holds a comparison operator (run ids and names do not).
_FILTER_RE = re.compile(r"(=|!=|<|>|\s(i?like|in)\s)", re.IGNORECASE)
# A tag filter naming a side selects at most this many runs.
MAX_RUNS_PER_SIDE = 50


# ----------------------------------------------------------------------------------------------
# finding the runs
# ----------------------------------------------------------------------------------------------


def is_filter(ref: str) -> bool:
    """Whether a run reference is an MLflow filter string (``tags.device.type = 'npu'``)."""
    return bool(_FILTER_RE.search(ref))


def resolve_run(ref: str, role: str = "run") -> Run:
    """The run a run id or run name means (a filter string is :func:`resolve_runs`' to read)."""
    ref = (ref or "").strip()
    if not ref:
        raise VerlflowError(
            f"{role} is empty: give a run id, a run name, or a filter such as \"tags.device.type = 'npu'\""
        )
    run = tracking.get_run(ref)
    experiment = MlflowClient().get_experiment(run.info.experiment_id)
    if "deleted" in (run.info.lifecycle_stage, experiment.lifecycle_stage):
        raise VerlflowError(f"{role} run '{run.info.run_name}' ({run.info.run_id}) is deleted (or its experiment is): "
                            "restore it (mlflow runs restore / mlflow experiments restore) or give another run")
    return run


def _warn_unfinished(snap: RunSnapshot) -> None:
    """One line for a run that has not finished (still RUNNING, FAILED, KILLED): its figures may be partial."""
    if snap.status != "FINISHED":
        print(f"verlflow compare: warning: {snap.role} run '{snap.name}' ({snap.run_id}) is {snap.status}, not "
              "FINISHED: its figures cover the steps it logged so far", file=sys.stderr, flush=True)


def _is_dry(run: Run) -> bool:
    return run.data.tags.get(DRY_RUN_TAG) == "true"


def refuse_dry_run(run: Run, role: str) -> Run:
    """A run named on its own that is a dry run: one line saying so and how to select train runs."""
    if _is_dry(run):
        profile = run.data.tags.get(PROFILE_TAG, "<profile>")
        raise VerlflowError(
            f"{role} run '{run.info.run_name}' ({run.info.run_id}) is a dry run (nothing trained): name a train run, "
            f"or a filter such as \"tags.verlflow.profile = '{profile}'\" (dry runs are left out of filters)")
    return run


def resolve_runs(ref: str, role: str = "run") -> list[Run]:
    """The runs a side names: a run id or name, a comma list of them, or a filter string (every run it matches,
    dry runs left out)."""
    ref = (ref or "").strip()
    if ref and not is_filter(ref) and "," in ref:
        return [refuse_dry_run(resolve_run(part, role), role) for part in ref.split(",") if part.strip()]
    if not ref or not is_filter(ref):
        return [refuse_dry_run(resolve_run(ref, role), role)]
    client = MlflowClient()
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    try:
        runs = client.search_runs(experiments, filter_string=ref, max_results=MAX_RUNS_PER_SIDE,
                                  order_by=["attributes.start_time ASC"])
    except MlflowException as exc:
        first = (str(exc.message).strip().splitlines() or ["(no detail)"])[0]
        raise VerlflowError(f'{role} filter "{ref}" is not a valid MLflow filter: {first}') from None
    if runs and all(_is_dry(r) for r in runs):
        raise VerlflowError(f'{role} filter "{ref}" matches only dry runs (nothing trained): train a run with it first')
    runs = [r for r in runs if not _is_dry(r)]
    if not runs:
        raise VerlflowError(
            f'{role} filter "{ref}" matches no run in the tracking store {mlflow.get_tracking_uri()}'
        )
    # A filter may also match runs that trained nothing (evaluate, register, an earlier compare): a side is its
    # train runs, as long as it has any (else read_runs names the run without timings).
    trained = [r for r in runs if any(k == TIMING_E2E or k.startswith(TIMING_PREFIX) for k in r.data.metrics)]
    return trained or list(runs)


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


def read_runs(baseline: Sequence[Run], candidate: Sequence[Run]) -> tuple[list[RunSnapshot], list[RunSnapshot]]:
    """Every run of both sides as snapshots, with the §6.2 curve histories the report needs."""
    sides = ([snapshot(r, "baseline") for r in baseline], [snapshot(r, "candidate") for r in candidate])
    snaps = [*sides[0], *sides[1]]
    runs = [*baseline, *candidate]
    for snap in snaps:
        _warn_unfinished(snap)
        if not _has_timing(snap):
            raise VerlflowError(
                f"{snap.role} run '{snap.name}' ({snap.run_id}) has no timing metrics "
                f"({TIMING_E2E}, {TIMING_MEAN_PREFIX}*): compare needs train runs"
            )
    present = {k for s in snaps for k in s.metrics}
    # A curve is read under every verl version's name for it, and kept under its canonical name.
    logged = {k for run in runs for k in run.data.metrics}
    keys = [name for k, _ in CURVES if k in present for name in metric_names(k) if name in logged]
    keys += [efficiency.TOKENS_KEY] if efficiency.TOKENS_KEY in logged else []
    # Per-step timings only where a run lacks the end-of-run summaries (a run cut short).
    for snap in snaps:
        if not any(k.startswith(TIMING_MEAN_PREFIX) for k in snap.metrics):
            keys += [
                k for k in snap.metrics if k.startswith(TIMING_PREFIX) and k != TIMING_E2E and k not in keys
            ]
    # §6.4: device utilisation, memory and power, host CPU and memory (system/*), when a run has them.
    keys += [k for snap in snaps for k in needed_keys(snap) if k not in keys]
    histories = fetch_histories([s.run_id for s in snaps], keys)
    for snap, run in zip(snaps, runs, strict=True):
        snap.histories = canonical_metrics(histories[snap.run_id])
        _fill_timing_summaries(snap, run)
    return sides
