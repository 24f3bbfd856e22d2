"""Which MLflow experiment a training step logs into, and marking it as a model-training experiment.

    python -c "from verlflow.tracking.experiments import recipe_experiment; print(recipe_experiment('smoke'))"

``train``, ``main`` and ``search`` log into ``verlflow/<recipe>`` (created on first use) unless the caller
chose an experiment: ``MLFLOW_EXPERIMENT_NAME`` / ``MLFLOW_EXPERIMENT_ID``, or ``mlflow run`` (which creates
the run first, in ``--experiment-name``/``--experiment-id`` or Default, and hands the step ``MLFLOW_RUN_ID``).
A plain ``mlflow run . -e main`` therefore cannot land in ``verlflow/<recipe>``: MLflow's project runner
creates the run before the entry point starts, MLproject has no experiment field, and MLflow has no public
way to move a run to another experiment. The step stays in the run it was given (its children with it) and
says, once, to pass ``--experiment-name verlflow/<recipe>``.
Whatever experiment a training run lands in gets the tag ``mlflow.experimentKind`` =
``custom_model_development`` when it has no kind yet, so the MLflow UI opens its model-training view
instead of guessing the GenAI one.
"""

from __future__ import annotations

import logging
import os

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.tracking.default_experiment import DEFAULT_EXPERIMENT_ID
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from verlflow.util import first_line

log = logging.getLogger(__name__)

PREFIX = "verlflow/"
# The experiment tag the MLflow 3 UI reads to choose an experiment's view, and its model-training value.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
# Environment variables through which a caller (or `mlflow run`) chose the experiment or the run itself.
CHOSEN_BY = ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")


def recipe_experiment(recipe: str) -> str:
    """``verlflow/<recipe>``; a recipe given as a path is named by its file stem."""
    tail = recipe.replace("\\", "/").rsplit("/", 1)[-1]
    stem = tail.rsplit(".", 1)[0] if tail.endswith((".yaml", ".yml")) else tail
    return f"{PREFIX}{stem}"


def chosen_by_caller() -> bool:
    """Whether the environment already says where runs go (a named experiment or an existing run)."""
    return any(os.environ.get(name) for name in CHOSEN_BY)


def enter(name: str) -> str | None:
    """The id of experiment ``name`` (created when missing) for the step's run, or None when the caller chose.

    Not ``mlflow.set_experiment``: that would change the process's active experiment for every later run,
    also of callers that run steps in process.
    """
    if chosen_by_caller():
        _hint_when_in_default(name)
        return None
    client = MlflowClient()
    if (found := client.get_experiment_by_name(name)) is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
    except MlflowException:  # another worker created it in between
        if (found := client.get_experiment_by_name(name)) is not None:
            return found.experiment_id
        raise


_HINTED: set[str] = set()


def _hint_when_in_default(name: str) -> None:
    """Name the flag that files a ``mlflow run`` run with its recipe's runs when MLflow put it in Default."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id or os.environ.get("MLFLOW_EXPERIMENT_NAME") or run_id in _HINTED:
        return
    _HINTED.add(run_id)  # once per run: main's train step enters the experiment again
    try:
        run = MlflowClient().get_run(run_id)
    except MlflowException:  # the run's own step reports a missing run; a hint is never worth failing for
        return
    # A nested run (a search trial, in its own process) follows its parent, whose step said it already.
    if run.info.experiment_id == DEFAULT_EXPERIMENT_ID and MLFLOW_PARENT_RUN_ID not in run.data.tags:
        log.warning("run %s is in MLflow's Default experiment, where `mlflow run` puts it without "
                    "--experiment-name; pass --experiment-name %s to keep it with the recipe's runs", run_id, name)


def mark_training(experiment_id: str, client: MlflowClient | None = None) -> None:
    """Tag the experiment as model training when it has no kind yet (a user's choice of kind is kept)."""
    client = client or MlflowClient()
    try:
        experiment = client.get_experiment(experiment_id)
        if not experiment.tags.get(EXPERIMENT_KIND_TAG):
            client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    except MlflowException as exc:  # a view hint only: never fail a run over it
        log.warning("could not mark experiment %s as model training: %s", experiment_id, first_line(exc))
