"""Registering one train run twice at the same moment leaves one model version, not two.

    verlflow register --run_id <train run> & verlflow register --run_id <train run>   # → one version

``register`` returns the version a train run already has, but two registers started together both find none
and both create one (versions 2 and 3 of the same checkpoint). :func:`keep_one_version` runs after creation,
with the train run as the idempotency key (the ``source_run_id`` tag, set in the same call that creates the
version): the lowest version of that run wins, and a register holding a higher one deletes its own and
returns the winner, so however two registers interleave exactly one version is left.
"""

from __future__ import annotations

import logging

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.outage.store_retry import retry_on_lock
from verlflow.util import filter_quote

log = logging.getLogger(__name__)
# The lineage tag register sets on a version when it creates it: the train run the checkpoint came from.
VERSION_SOURCE_TAG = "source_run_id"


def keep_one_version(client: MlflowClient, mine: ModelVersion, run_id: str) -> ModelVersion:
    """The one version of ``mine``'s model that train run ``run_id`` keeps: the lowest; a higher ``mine`` is deleted."""
    query = f"name='{filter_quote(mine.name)}' and tags.{VERSION_SOURCE_TAG} = '{filter_quote(run_id)}'"
    try:
        first = min(client.search_model_versions(query), key=lambda mv: int(mv.version), default=None)
        if first is None or int(first.version) >= int(mine.version):
            return mine
        log.warning("register: run %s was registered concurrently as %s version %s; removing duplicate version %s",
                    run_id, mine.name, first.version, mine.version)
        retry_on_lock(client.delete_model_version, mine.name, mine.version)
    except MlflowException as exc:  # the check is a courtesy: the version made stands
        log.warning("register: could not check %s for a concurrent registration: %s", mine.name, exc)
        return mine
    return first
