"""What verlflow reads from the tracking store, in its own words: the store's address, the run this process is
logging into, a run's params, the steps a metric reached, an experiment's name, the newest runs that match.

    python -c "from verlflow.tracking import lookups; print(lookups.tracking_uri())"

The MLflow calls (and the MLflow errors a lookup may meet) stay here, so the modules that need an answer do not
bind to MLflow's client. MLflow is imported inside each function: a module that imports this one at start-up
does not load MLflow before it needs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def tracking_uri() -> str:
    """The tracking store this process logs to (``MLFLOW_TRACKING_URI``, ``mlflow.set_tracking_uri``, the default)."""
    import mlflow

    return mlflow.get_tracking_uri()


def active_run_id() -> str | None:
    """The id of the run this process is logging into (the step's own run), or None outside one."""
    import mlflow

    run = mlflow.active_run()
    return run.info.run_id if run else None


def launched_run_id() -> str | None:
    """The run ``mlflow run`` made for this step (``MLFLOW_RUN_ID``), or None outside ``mlflow run``."""
    from mlflow.environment_variables import MLFLOW_RUN_ID

    return MLFLOW_RUN_ID.get()


def keep_launched_run(run_id: str) -> None:
    """Point ``MLFLOW_RUN_ID`` at ``run_id`` again: MLflow's ``end_run`` of a nested run unsets it, and a step
    without it would open a new run instead of attaching to the one ``mlflow run`` made."""
    from mlflow.environment_variables import MLFLOW_RUN_ID

    MLFLOW_RUN_ID.set(run_id)


def run_by_id(run_id: str) -> Any:
    """Run ``run_id`` as the store has it (its info, params, tags, latest metrics); raises when there is none."""
    from mlflow.tracking import MlflowClient

    return MlflowClient().get_run(run_id)


def experiment_name(experiment_id: str) -> str:
    """The name of experiment ``experiment_id`` (raises when the store does not answer or has no such one)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient().get_experiment(experiment_id).name


def active_run_params() -> dict[str, str]:
    """The params of the run this process logs into; {} outside a run (raises when the store does not answer)."""
    from mlflow.tracking import MlflowClient

    run_id = active_run_id()
    return dict(MlflowClient().get_run(run_id).data.params) if run_id else {}


def metric_steps(run_id: str, names: Iterable[str]) -> set[int]:
    """The steps logged under the first of ``names`` that run ``run_id`` has a history of; empty when none.

    A name the store refuses to read is skipped, as one the run does not have.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    for name in names:
        try:
            history = client.get_metric_history(run_id, name)
        except MlflowException:
            continue
        if history:
            return {m.step for m in history}
    return set()


def newest_runs(query: str, *, max_results: int) -> list[Any]:
    """Runs of the experiment this step logs into that match the filter ``query``, newest first; [] when the
    experiment does not exist yet or the store refuses the search."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from verlflow.process.lifecycle import current_experiment_ids

    client = MlflowClient()
    try:
        if not (experiments := current_experiment_ids(client)):
            return []
        return list(client.search_runs(experiments, query, order_by=["attributes.start_time DESC"],
                                       max_results=max_results))
    except MlflowException:
        return []
