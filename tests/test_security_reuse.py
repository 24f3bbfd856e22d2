"""``main`` reuses a finished step from another experiment only when it is its own user's run.

Reuse looks in every experiment of the store, so a FINISHED run planted in another experiment, with the same
params, code version and data digest and a checkpoint folder on a shared disk, could have become the victim's
registered and promoted model. Checked on a real SQLite store with the reuse engine ``main`` uses.
"""

from __future__ import annotations

import getpass

import mlflow
from mlflow.entities import Param
from mlflow.tracking import MlflowClient

from verlflow.names import CODE_VERSION_TAG, STEP_TAG
from verlflow.tracking.reuse import StepRunner, code_version

PARAMS = {"recipe": "tiny", "overrides": ""}


def _finished_step(client: MlflowClient, experiment_id: str, user: str) -> str:
    run_id = client.create_run(experiment_id, tags={"mlflow.user": user, STEP_TAG: "train",
                                                    CODE_VERSION_TAG: code_version()}).info.run_id
    client.log_batch(run_id, params=[Param(k, v) for k, v in PARAMS.items()])
    client.set_terminated(run_id, "FINISHED")
    return run_id


def _runner(client: MlflowClient) -> StepRunner:
    parent = mlflow.start_run(experiment_id=client.create_experiment("mine"))
    return StepRunner(client, client.get_run(parent.info.run_id))


def test_a_run_of_another_user_in_another_experiment_is_not_reused(tracking_uri):
    client = MlflowClient()
    _finished_step(client, client.create_experiment("planted"), "mallory")
    assert _runner(client).find_reusable("train", PARAMS, {}, lambda run: True) is None


def test_an_own_run_in_another_experiment_is_reused(tracking_uri):
    client = MlflowClient()
    own = _finished_step(client, client.create_experiment("earlier"), getpass.getuser())
    assert _runner(client).find_reusable("train", PARAMS, {}, lambda run: True).info.run_id == own
