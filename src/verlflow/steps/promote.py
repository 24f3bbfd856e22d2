"""Step ``promote``: move an alias (``champion``) to the best version when it is better beyond the
evaluation's noise (a paired test on the same problems).

    mlflow run . --env-manager local -e promote -P model_name=verlflow-smoke
"""

from __future__ import annotations

from verlflow.step_requests import PromoteRequest


def run_promote(request: PromoteRequest, *, run_id: str | None = None):
    """Decide and move the request's alias; ``run_id``: a ``promote`` run already created (``main``'s child)."""
    from verlflow.models.registry import promote_best

    return promote_best(request.model_name, request.metric, request.alias, request.force, run_id=run_id)
