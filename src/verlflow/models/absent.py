"""Why a registered model, version or alias is not there: deleted, or never made, said in one line.

MLflow forgets a deleted registered model entirely and hides a deleted version from every read, so "not found"
alone cannot tell a typo from a deletion. verlflow's register runs remember what they made (tags
``verlflow.model_name`` and ``verlflow.model_version``), and MLflow numbers a model's versions 1, 2, 3 …, so a
number below the newest that no longer answers was deleted. These functions build the error a step raises:

    registered model 'gsm8k' was deleted (register run 5d1e… made its version 3): register a train run again …
    version 2 of registered model 'gsm8k' was deleted: its versions are 1, 3
    registered model 'gsm8k' has no versions (1, 2 were deleted): register a train run again …
"""

from __future__ import annotations

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.names import MODEL_NAME_TAG, MODEL_VERSION_TAG, SOURCE_RUN_TAG, STEP_TAG
from verlflow.util import filter_quote

_REGISTER_AGAIN = "register a train run again (verlflow register --run_id <train run>)"


def registered_by_runs(client: MlflowClient, name: str) -> dict[int, str]:
    """The versions of ``name`` verlflow's register runs made, each with the register run's id."""
    query = (f"tags.`{STEP_TAG}` = 'register' and tags.`{MODEL_NAME_TAG}` = '{filter_quote(name)}'")
    try:
        experiments = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(experiments, query, max_results=200) if experiments else []
    except MlflowException:
        return {}
    made = {}
    for run in runs:
        version = run.data.tags.get(MODEL_VERSION_TAG, "")
        if version.isdigit():
            made.setdefault(int(version), run.info.run_id)
    return made


def deleted_from_run(client: MlflowClient, name: str, run_id: str) -> list[int]:
    """Versions of ``name`` that register runs made from train run ``run_id`` and that were deleted since."""
    query = (f"tags.`{STEP_TAG}` = 'register' and tags.`{MODEL_NAME_TAG}` = '{filter_quote(name)}' "
             f"and tags.`{SOURCE_RUN_TAG}` = '{filter_quote(run_id)}'")
    try:
        experiments = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(experiments, query, max_results=50) if experiments else []
    except MlflowException:
        return []
    made = {int(v) for r in runs if (v := r.data.tags.get(MODEL_VERSION_TAG, "")).isdigit()}
    return sorted(made - set(live_versions(client, name)))


def live_versions(client: MlflowClient, name: str) -> list[int]:
    """The version numbers of ``name`` MLflow still answers for (deleted ones are hidden), ascending."""
    try:
        return sorted(int(mv.version) for mv in client.search_model_versions(f"name='{filter_quote(name)}'"))
    except MlflowException:
        return []


def deleted_versions(client: MlflowClient, name: str) -> list[int]:
    """Versions of ``name`` that existed and were deleted: gaps below the newest, and ones register runs made."""
    live = live_versions(client, name)
    known = set(registered_by_runs(client, name)) | set(range(1, max(live, default=0)))
    return sorted(known - set(live))


def _numbers(versions: list[int]) -> str:
    return ", ".join(str(v) for v in versions)


def missing_model(client: MlflowClient, name: str) -> VerlflowError:
    """No registered model has this name: deleted (a register run made a version of it) or never made."""
    try:
        known = sorted(m.name for m in client.search_registered_models(max_results=20))
    except MlflowException:
        known = []
    have = f"registered models: {', '.join(known)}" if known else "the registry is empty"
    made = registered_by_runs(client, name)
    if made:
        version, run_id = max(made.items())
        return VerlflowError(f"registered model '{name}' was deleted (register run {run_id} made its version "
                             f"{version}): {_REGISTER_AGAIN}, or give another model; {have}")
    if not known:
        have += " (run register first)"
    return VerlflowError(f"no registered model '{name}' in the tracking store {mlflow.get_tracking_uri()}: {have}")


def no_versions(client: MlflowClient, name: str) -> VerlflowError:
    """The model exists but has no version left (every version deleted, or none registered yet)."""
    gone = deleted_versions(client, name)
    why = f"version {_numbers(gone)} was deleted" if len(gone) == 1 else (
        f"versions {_numbers(gone)} were deleted" if gone else "none was registered")
    return VerlflowError(f"registered model '{name}' has no versions ({why}): {_REGISTER_AGAIN}")


def missing_version(client: MlflowClient, name: str, version: str) -> VerlflowError:
    """Version ``version`` of an existing model does not answer: deleted, or a number never made."""
    live = live_versions(client, name)
    if not live:
        return no_versions(client, name)
    deleted = version.isdigit() and int(version) in deleted_versions(client, name)
    what = "was deleted" if deleted else "does not exist"
    return VerlflowError(f"version {version} of registered model '{name}' {what}: its versions are {_numbers(live)}")


def missing_alias(client: MlflowClient, name: str, alias: str) -> VerlflowError:
    """No version holds ``alias``: every version deleted (aliases go with them), or the alias never set."""
    if not live_versions(client, name):
        return no_versions(client, name)
    try:
        aliases = sorted(client.get_registered_model(name).aliases)
    except MlflowException:
        return missing_model(client, name)
    have = f"its aliases are {', '.join(aliases)}" if aliases else "it has no aliases yet (run promote)"
    gone = deleted_versions(client, name)
    deleted = f" (deleted versions lose their aliases: {_numbers(gone)} were deleted)" if gone else ""
    return VerlflowError(f"registered model '{name}' has no alias '{alias}'{deleted}: {have}")


def model_exists(client: MlflowClient, name: str) -> bool:
    """Whether the registry still has a model of this name (a read that fails counts as yes: not our call)."""
    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        return exc.error_code != "RESOURCE_DOES_NOT_EXIST"
    return True
