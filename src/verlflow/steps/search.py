"""Step ``search``: an Optuna study over lr, KL coefficient and group size, one nested MLflow run per trial.

    mlflow run . --env-manager local -e search -P n_trials=4 -P recipe=smoke   # data: data/synthetic-easy
    # a second worker on the same study, from another shell or machine (same storage):
    mlflow run . --env-manager local -e search -P n_trials=4 -P recipe=smoke \
        -P storage=optuna/smoke-default.journal

Setup → trials → summary:
1. Load and check the search config (:mod:`verlflow.search.search_config`), compose the recipe, check every
   choice against verl's batch rules: any problem is one line before a trial runs.
2. Open (or resume: same ``study_name``) the study in its storage (:mod:`verlflow.search.study`), then
   run ``n_trials`` trials in this worker (:mod:`verlflow.search.trial`), each a child of this run.
3. Log on this run: ``best/<objective metric>``, tags ``best_run_id``, ``best_trial_number``,
   ``best.param.<key>``, trial counts ``search/trials_<state>``, Optuna's plots under
   ``search/plots/`` (``*.png`` and interactive ``*.html``, short parameter labels), the trials table
   ``search/trials.csv``; evaluate the best trial's checkpoint (a child run ``evaluate · search-best``),
   then register it with the score on the version and the search's own alias ``search-best``
   (:mod:`verlflow.search.results`). ``challenger`` and ``champion`` stay where ``main`` / ``register`` /
   ``promote`` put them.
"""

from __future__ import annotations

import logging
import shlex
import warnings
from typing import TYPE_CHECKING, Any

from verlflow import config
from verlflow.backends.registry import get_backend
from verlflow.backends.train_setup import choose_train_setup, compose_train_config, settle_device
from verlflow.errors import VerlflowError
from verlflow.names import OBJECTIVE_TAG, RECIPE_TAG, SPACE_TAG, STEP_TAG
from verlflow.outage.store_retry import retry_on_lock
from verlflow.step_requests import SearchRequest
from verlflow.tracking import lookups, tracking, ui_links, writes
from verlflow.tracking.experiments import recipe_experiment
from verlflow.util import check_name_inside

if TYPE_CHECKING:  # Optuna is imported when a search runs, not for `verlflow --help`
    import optuna

    from verlflow.search.results import SearchResult
    from verlflow.search.search_config import SearchConfig

log = logging.getLogger(__name__)

def run_search(request: SearchRequest) -> SearchResult:
    """Run ``n_trials`` trials of the study in this worker, then record the study's best (step ``search``).

    ``data_dir=""``: the recipe's data, where ``main`` puts it (prepared first when it can be made here).
    """
    import optuna

    from verlflow.data import recipe_data
    from verlflow.search.results import summarize
    from verlflow.search.space import check_trial_configs, distributions, space_fingerprint, suggest
    from verlflow.search.study import describe_storage, quiet_stopped_trials
    from verlflow.search.trial import TrialFailed, TrialRunner

    n_trials, study_name, storage, pruner = request.n_trials, request.study_name, request.storage, request.pruner
    if study_name:  # a name that becomes the journal's and the checkpoints' folder: checked before any work
        check_name_inside(study_name, "study_name", "optuna")
    search = _checked_search(n_trials, pruner, storage, request.search_config)
    recipe, dev, profile, backend = choose_train_setup(request.recipe, request.device, "auto", "auto")
    # No NPU/GPU here: said before anything about the data.
    settle_device(dev, recipe, profile, shlex.join(config.hydra_overrides(search.trial_overrides)), dry_run=None)
    data_dir = recipe_data.step_data_dir(request.data_dir, recipe_data.recipe_source(recipe))

    def compose_trial(values: dict[str, Any]) -> config.ComposedConfig:
        merged = {**search.trial_overrides, **values}
        overrides = shlex.join(config.hydra_overrides(merged))
        return compose_train_config(recipe, profile, data_dir, "", overrides)

    base = compose_trial({})
    dists = distributions(search, base)
    check_trial_configs(search, dists, compose_trial, backend_check=get_backend(backend).check_config)
    study_name = check_name_inside(study_name or f"{base.recipe_name}-{search.name}", "study_name", "optuna")
    pruner_name = pruner or search.pruner_default
    study = _open_search_study(search, study_name, storage, pruner_name, base.recipe_name,
                               space_fingerprint(dists))
    shown_storage = describe_storage(storage, study_name)
    tags = {
        **tracking.standard_tags(backend=backend, recipe=base.recipe_name, profile=profile),
        **_search_tags(search, study, shown_storage, pruner_name),
    }
    with tracking.tracked_run(run_name=f"search-{study_name}", tags=tags,
                              experiment=recipe_experiment(base.recipe_name)) as run:
        parent_id = run.info.run_id
        retry_on_lock(writes.log_text, search.path.read_text(), "search/config.yaml")
        retry_on_lock(writes.log_dict, {k: optuna.distributions.distribution_to_json(v) for k, v in dists.items()},
                        "search/space.json")
        runner = TrialRunner(
            recipe=recipe, device=dev, data_dir=data_dir, parent_run_id=parent_id,
            experiment_id=run.info.experiment_id, study_name=study_name, metric=search.metric,
            tracking_uri=lookups.tracking_uri(), fixed_overrides=search.trial_overrides,
            checkpoint_root=_checkpoint_root(base), poll_interval=search.poll_interval,
            stop_timeout=search.stop_timeout,
        )
        quiet_stopped_trials()  # a SIGTERM is the step's "interrupted" line, not Optuna's traceback of the trial
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.optimize(lambda trial: runner(trial, suggest(trial, dists)), n_trials=n_trials,
                           catch=(TrialFailed,), gc_after_trial=False)
        result = summarize(study, parent_id, search, shown_storage, data_dir=data_dir)
    _print_result(result, search)
    return result


def _open_search_study(search: SearchConfig, study_name: str, storage: str, pruner_name: str, recipe_name: str,
                       fingerprint: str) -> Any:
    """The Optuna study of this search, on its storage (created, or resumed when its identity matches)."""
    from verlflow.search.study import TrialSeededSampler, make_pruner, open_storage, open_study

    return open_study(
        study_name=study_name,
        storage=open_storage(storage, study_name, search.heartbeat_interval, search.grace_period,
                             search.max_retry),
        direction=search.direction,
        sampler=TrialSeededSampler(search.seed, search.n_startup_trials),
        pruner=make_pruner(pruner_name, search.pruner_settings),
        identity={RECIPE_TAG: recipe_name, OBJECTIVE_TAG: search.metric, SPACE_TAG: fingerprint},
    )


def _checkpoint_root(base: config.ComposedConfig) -> str:
    """Where trials keep their checkpoints: the recipe's ``trainer.default_local_dir``."""
    from omegaconf import OmegaConf

    return str(OmegaConf.select(base.resolved, "trainer.default_local_dir") or "checkpoints")


def _checked_search(n_trials: int, pruner: str, storage: str, search_config: str) -> SearchConfig:
    """The search config, after every step parameter was checked: one line for any mistake, before a trial."""
    from verlflow.search.search_config import PRUNERS, load_search_config
    from verlflow.search.space import check_space_keys
    from verlflow.search.storage_url import check_storage_url

    if n_trials < 1:
        raise VerlflowError(f"n_trials must be at least 1, got {n_trials}")
    if pruner and pruner not in PRUNERS:
        raise VerlflowError(f"unknown pruner '{pruner}': use one of {', '.join(PRUNERS)} ('' = the search config's)")
    check_storage_url(storage)
    search = load_search_config(search_config)
    check_space_keys(search)
    return search


def _search_tags(search: SearchConfig, study: optuna.Study, storage: str, pruner_name: str) -> dict[str, str]:
    """Tags of the search's parent run: the study, where it is stored, and what it optimises."""
    return {
        STEP_TAG: "search",
        "optuna.study_name": study.study_name,
        "optuna.storage": storage,
        "search.config": search.name,
        "search.objective": search.metric,
        "search.direction": search.direction,
        "search.pruner": pruner_name,
        "optuna.trials_at_start": str(len(study.trials)),
    }


def _print_result(result: SearchResult, search: SearchConfig) -> None:
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(result.trial_counts.items()))
    print(f"search {result.study_name}: {counts} (storage {result.storage})")
    if result.best_value is not None:
        params = " ".join(f"{k}={v}" for k, v in result.best_params.items())
        print(f"best {search.metric}={result.best_value:g}: trial {result.best_trial_number}, "
              f"run {result.best_run_id}, {params}")
    print(f"search run: {result.parent_run_id}")
    parent = tracking.get_run(result.parent_run_id)
    experiment_id = parent.info.experiment_id
    pages = [("runs of its experiment", ui_links.experiment_route(experiment_id)),
             ("the search (trials as child runs)", ui_links.run_route(experiment_id, result.parent_run_id))]
    if result.best_run_id:
        pages.append(("its best trial", ui_links.run_route(experiment_id, result.best_run_id)))
    if result.registered is not None:
        mv = result.registered
        pages.append((f"{mv.name} v{mv.version}", ui_links.model_version_route(mv.name, mv.version)))
    ui_links.print_links("search", pages)
