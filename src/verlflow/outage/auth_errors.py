"""A tracking server that refuses the user (HTTP 401/403): one line naming the server, the user, the operation
refused and the permission it needs — never the password, never "check the server's health".

    python -c "from verlflow.outage.auth_errors import operation_of; print(operation_of('/api/2.0/mlflow/runs/create'))"

MLflow words these ``API request to endpoint <path> failed with error code 403 != 200. Response body: '…'``
(basic auth: ``You are not authenticated…`` for a wrong password, ``Permission denied`` for a user without the
permission). The permissions are MLflow's own (READ < EDIT < MANAGE, per experiment and per registered model;
any signed-in user may create an experiment or a registered model).
"""

from __future__ import annotations

import os
import re

from verlflow.secrets import mask_url_password

_REFUSED = re.compile(r"API request to (?:endpoint )?(\S+) failed with error code (401|403)\b")
# (path pattern, operation in words, permission it needs), first match wins.
_OPERATIONS = (
    (r"/experiments/create$", "create an experiment", "a signed-in user (any permission)"),
    (r"/experiments/(?:delete|restore)$", "delete or restore an experiment", "MANAGE on the experiment"),
    (r"/experiments/", "change an experiment", "EDIT on the experiment"),
    (r"/runs/create$", "create a run", "EDIT on the run's experiment"),
    (r"/runs/(?:delete|restore)$", "delete or restore a run", "MANAGE on the run's experiment"),
    (r"/(?:runs/(?:update|log-\w+|set-tag|delete-tag|outputs)|logged-models|mlflow-artifacts/)",
     "write to a run (its status, metrics, params, tags or artifacts)", "EDIT on the run's experiment"),
    (r"/registered-models/create$", "create a registered model", "a signed-in user (any permission)"),
    (r"/registered-models/delete$", "delete a registered model", "MANAGE on the registered model"),
    (r"/(?:model-versions/create|registered-models/(?:alias|update|set-tag|delete-tag)|model-versions/)",
     "register a model version or move an alias", "EDIT on the registered model"),
)
_READS = re.compile(r"/(?:get|search|get-by-name|get-history|list|get-latest-versions)(?:$|[/?-])")


def operation_of(path: str, method: str = "") -> tuple[str, str]:
    """What the request at ``path`` does, in words, and the MLflow permission it needs."""
    if _READS.search(path) or method.upper() == "GET":
        return "read runs, experiments or models", "READ on that experiment or registered model"
    for pattern, operation, permission in _OPERATIONS:
        if re.search(pattern, path):
            return operation, permission
    return f"call {path}", "a permission this user lacks"


def auth_failure(exc: BaseException, tracking_uri: str | None = None) -> str | None:
    """One line for an MLflow request the server refused for authentication or permission, else None."""
    found = _REFUSED.search(str(exc)) if type(exc).__module__.startswith("mlflow") else None
    if found is None:
        return None
    import mlflow

    path, code = found.group(1), found.group(2)
    server = mask_url_password(tracking_uri or mlflow.get_tracking_uri())
    user = os.environ.get("MLFLOW_TRACKING_USERNAME", "").strip()
    who = f"user '{user}'" if user else "no user (MLFLOW_TRACKING_USERNAME is not set)"
    operation, permission = operation_of(path)
    if code == "401":
        return (f"the tracking server {server} did not accept {who} (HTTP 401, not authenticated) to {operation} "
                f"({path}): check MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (password not shown)")
    return (f"the tracking server {server} refused {who} (HTTP 403, permission denied) to {operation} ({path}): "
            f"that needs {permission}; ask the server's admin to grant it, or run as a user who has it")


__all__ = ["auth_failure", "operation_of"]
