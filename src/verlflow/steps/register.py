"""Step ``register``: a train run's final checkpoint becomes a model version (alias ``challenger``).

    mlflow run . --env-manager local -e register -P run_id=<train run id>
"""

from __future__ import annotations

from verlflow.step_requests import RegisterRequest


def run_register(request: RegisterRequest, *, run_id: str | None = None):
    """Register the request's train run; ``run_id``: a ``register`` run already created for it (``main``'s child)."""
    from verlflow.models.registry import register_checkpoint

    return register_checkpoint(request.run_id, request.model_name, step_run_id=run_id)
