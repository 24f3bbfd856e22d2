"""Step ``evaluate``: GSM8K accuracy of a model, logged as an MLflow run.

    mlflow run . --env-manager local -e evaluate -P model_uri=models:/verlflow-smoke@champion
"""

from __future__ import annotations

from verlflow.step_requests import EvaluateRequest


def run_evaluate(request: EvaluateRequest, *, run_id: str | None = None):
    """Evaluate the request's model on its split; ``run_id``: a run already created for it (``main``'s child)."""
    from verlflow.models.evaluate import evaluate_model

    return evaluate_model(request.model_uri, request.data_dir, request.split, request.limit, request.backend,
                          run_id=run_id)
