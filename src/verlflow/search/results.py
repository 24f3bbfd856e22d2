"""What a search leaves on its run: the best trial, trial counts and table, Optuna's plots, the best model registered.

    python -c "from verlflow.search.results import PLOTS; print(PLOTS)"

The search step (:mod:`verlflow.steps.search`) calls :func:`summarize` once its trials are done. The best
trial's checkpoint is evaluated (a child run ``evaluate · search-best``) and registered through
:func:`verlflow.models.registry.register_checkpoint` with the score on the version and the search's own
alias ``search-best``.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import optuna
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from verlflow import names
from verlflow.outage.store_retry import LockRetryingClient, retry_on_lock
from verlflow.search.search_config import SearchConfig
from verlflow.search.study import RUN_ID_ATTR
from verlflow.tracking import tracking

log = logging.getLogger(__name__)

PLOTS = ("optimization_history", "parallel_coordinate", "param_importances", "intermediate_values")
# The one interactive page holding every plot (plotly inlined once, so it renders offline).
INTERACTIVE_PAGE = "search/plots/interactive.html"
# Fewest finished trials whose parameter importances are shown (fewer: a fit on noise, e.g. 0.33 each).
IMPORTANCE_MIN_TRIALS = 6


@dataclass
class SearchResult:
    """What a search worker leaves behind (the study may hold more trials from other workers)."""

    study_name: str
    storage: str
    parent_run_id: str
    # Trials of the whole study by state name (COMPLETE, PRUNED, FAIL, …).
    trial_counts: dict[str, int]
    best_value: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    best_run_id: str | None = None
    best_trial_number: int | None = None
    plots: list[str] = field(default_factory=list)
    registered: Any = None


def summarize(study: optuna.Study, run_id: str, search: SearchConfig, storage: str, *,
              data_dir: str = "") -> SearchResult:
    """Log the study's best trial, trial counts, trials table and plots on the search run; evaluate the best
    trial on ``data_dir``'s test split and register it."""
    client = LockRetryingClient()
    trials = study.get_trials(deepcopy=False)
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    metrics = {f"search/trials_{state.name.lower()}": float(counts.get(state.name, 0))
               for state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                             optuna.trial.TrialState.FAIL)}
    metrics["search/trials_total"] = float(len(trials))
    result = SearchResult(study_name=study.study_name, storage=storage, parent_run_id=run_id,
                          trial_counts=counts)
    if counts.get("COMPLETE"):
        best = study.best_trial
        result.best_value, result.best_params = best.value, dict(best.params)
        result.best_trial_number, result.best_run_id = best.number, best.user_attrs.get(RUN_ID_ATTR)
        metrics[f"best/{tracking.sanitize_metric_key(search.metric)}"] = float(best.value)
        client.set_tag(run_id, "best_trial_number", str(best.number))
        if result.best_run_id:
            client.set_tag(run_id, "best_run_id", result.best_run_id)
        for key, value in best.params.items():
            client.set_tag(run_id, f"best.param.{key}", str(value))
    retry_on_lock(mlflow.log_metrics, metrics)
    with tempfile.TemporaryDirectory(prefix="verlflow-search-") as tmp:
        table = Path(tmp) / "trials.csv"
        study.trials_dataframe().to_csv(table, index=False)
        client.log_artifact(run_id, str(table), "search")
    result.plots = log_plots(study, run_id)
    if result.best_run_id:
        result.registered = register_best(result.best_run_id, run_id, data_dir=data_dir)
    return result


def readable_study(study: optuna.Study) -> optuna.Study:
    """An in-memory copy of the study whose parameters carry short labels (``actor_rollout_ref.actor.optim.lr``
    → ``lr``, more key segments where two would read alike), so plot axes show names, not ``actor_rollout_ref…``."""
    from verlflow.tracking.naming import short_overrides

    keys = sorted({key for t in study.get_trials(deepcopy=False) for key in t.params})
    labels = dict(zip(keys, (short.split("=", 1)[0] for short in short_overrides(" ".join(f"{k}=" for k in keys))),
                      strict=True))
    quiet = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory": a copy, for plots
    try:
        copy = optuna.create_study(directions=study.directions, study_name=study.study_name)
    finally:
        optuna.logging.set_verbosity(quiet)
    for trial in study.get_trials(deepcopy=True):
        trial.params = {labels[k]: v for k, v in trial.params.items()}
        trial.distributions = {labels[k]: d for k, d in trial.distributions.items()}
        copy.add_trial(trial)
    return copy


def log_plots(study: optuna.Study, run_id: str) -> list[str]:
    """Log Optuna's plots with short parameter labels: each as a PNG (matplotlib), and all of them on one
    interactive page, ``search/plots/interactive.html`` (plotly), that renders offline.

    MLflow's ``log_figure`` writes a plotly figure as HTML that loads plotly from a CDN, which an air-gapped
    cluster cannot reach (the page stays blank); here plotly is inlined, once for all the plots (~5 MB).
    A plot Optuna cannot draw, or that the study cannot support yet (importances, see
    :func:`importances_unsupported`), is skipped with its reason in the tag ``search.plots_skipped``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna import visualization as interactive
    from optuna.visualization import matplotlib as ovm

    client, logged, skipped, pages = LockRetryingClient(), [], [], {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = readable_study(study)
    for name in PLOTS:
        if name == "param_importances" and (why := importances_unsupported(study)):
            skipped.append(f"{name}: {why}")
            continue
        for kind, draw in (("png", getattr(ovm, f"plot_{name}")), ("html", getattr(interactive, f"plot_{name}"))):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    drawn = draw(study)
                if kind == "html":
                    pages[name] = drawn
                    continue
                drawn = (drawn.flat[0] if hasattr(drawn, "flat") else drawn).figure
                drawn.set_size_inches(10, 6)
                drawn.tight_layout()
                path = f"search/plots/{name}.png"
                client.log_figure(run_id, drawn, path)
                logged.append(path)
            except Exception as exc:  # noqa: BLE001 - Optuna raises several kinds for a study it cannot plot
                reason = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
                skipped.append(f"{name}.{kind}: {reason}"[:200])
                log.warning("search: plot %s.%s skipped: %s", name, kind, reason)
            finally:
                plt.close("all")
    if pages:
        client.log_text(run_id, offline_page(study.study_name, pages), INTERACTIVE_PAGE)
        logged.append(INTERACTIVE_PAGE)
    if skipped:
        client.set_tag(run_id, "search.plots_skipped", "; ".join(skipped)[:5000])
    return logged


def importances_unsupported(study: optuna.Study) -> str:
    """Why parameter importances would mislead for this study ('' when they can be shown): they need at least
    :data:`IMPORTANCE_MIN_TRIALS` finished trials, and two per parameter, whose objective values differ."""
    done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    needed = max(IMPORTANCE_MIN_TRIALS, 2 * len({k for t in done for k in t.params}))
    if len(done) < needed:
        return f"{len(done)} finished trials, importances need at least {needed}"
    if len({t.value for t in done}) < 2:
        return "every finished trial has the same objective value"
    return ""


def offline_page(title: str, figures: dict[str, Any]) -> str:
    """One HTML page holding plotly figures, with plotly's JavaScript inlined once (no script from the web)."""
    import html

    parts = []
    for i, (name, figure) in enumerate(figures.items()):
        parts.append(f"<h2>{html.escape(name.replace('_', ' '))}</h2>")
        parts.append(figure.to_html(full_html=False, include_plotlyjs=i == 0, default_height="520px"))
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head>"
            f"<body style=\"font-family: sans-serif\">\n{chr(10).join(parts)}\n</body></html>\n")


def register_best(best_run_id: str, run_id: str, *, data_dir: str = "") -> Any:
    """Evaluate the best trial's checkpoint (on ``data_dir``'s test split, when given), register it with
    alias ``search-best`` and its score on the version; tag the outcome on the search run ``run_id``."""
    from verlflow.models.evaluate import evaluate_model, tag_version
    from verlflow.models.registry import SEARCH_BEST, describe_version, register_checkpoint

    client = LockRetryingClient()
    # Workers of one study each summarise at their end: register the best run once, not once per worker.
    try:
        existing = client.search_model_versions(f"tags.source_run_id = '{best_run_id}'")
    except MlflowException:
        existing = []
    if existing:
        version = existing[0]
        client.set_tag(run_id, "search.registered", f"version {version.version} (already registered)")
        return version
    evaluation = None
    if data_dir:  # a trial's short training is measured like main's model before it enters the registry
        evaluation = evaluate_model(model_uri=f"runs:/{best_run_id}", data_dir=data_dir, split="test", limit=0,
                                    backend="auto", run_name=f"evaluate · {SEARCH_BEST}")
    registered = register_checkpoint(best_run_id, "", alias=SEARCH_BEST)
    version = getattr(registered, "version", None)
    if evaluation is not None:  # the best model's full evaluation, on the search's own run too
        client.log_metric(run_id, names.EVAL_ACCURACY, evaluation.accuracy)
        client.log_metric(run_id, names.EVAL_NUM_SAMPLES, evaluation.num_samples)
        client.set_tag(run_id, MLFLOW_RUN_NOTE, (
            f"Best trial's model (run {best_run_id}): accuracy {evaluation.accuracy:.4f} on "
            f"{evaluation.num_samples} test problems; registered as {getattr(registered, 'name', '')} "
            f"version {version} (alias {SEARCH_BEST})."))
    if evaluation is not None and version is not None:
        tag_version(registered.name, str(version), evaluation)
        describe_version(client, registered.name, str(version))
    if version is not None:
        kept = keep_first_registration(client, registered, best_run_id)
        if kept.version != version:
            client.set_tag(run_id, "search.registered", f"version {kept.version} (registered concurrently)")
            return kept
    client.set_tag(run_id, "search.registered", f"version {version}" if version is not None else "true")
    return registered


def keep_first_registration(client: MlflowClient, mine: Any, best_run_id: str) -> Any:
    """Two workers that summarise together may both register the best run: the lowest version stays.

    Each worker deletes its own version when a lower one of the same run exists, so however the
    registrations interleave exactly one version is left, and the search-best alias points at it.
    """
    from verlflow.models.registry import SEARCH_BEST, point_alias

    versions = client.search_model_versions(f"tags.source_run_id = '{best_run_id}'")
    first = min((v for v in versions if v.name == mine.name), key=lambda v: int(v.version), default=mine)
    if int(first.version) < int(mine.version):
        log.warning("search: run %s was registered concurrently as version %s; removing duplicate version %s",
                    best_run_id, first.version, mine.version)
        with contextlib.suppress(MlflowException):
            client.delete_model_version(mine.name, mine.version)
        aliases = client.get_registered_model(mine.name).aliases
        if SEARCH_BEST not in aliases:
            point_alias(client, mine.name, SEARCH_BEST, first.version)
    return first
