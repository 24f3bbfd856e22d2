"""Step ``evaluate``: GSM8K accuracy of a model, logged as an MLflow run.

    mlflow run . --env-manager local -e evaluate -P model_uri=models:/verlflow-smoke@champion
"""

from __future__ import annotations

from verlflow.step_requests import EvaluateRequest


def run_evaluate(request: EvaluateRequest, *, run_id: str | None = None):
    """Evaluate the request's model on its split; ``run_id``: a run already created for it (``main``'s child)."""
    from verlflow.models.evaluate import evaluate_model

    result = evaluate_model(request.model_uri, request.data_dir, request.split, request.limit, request.backend,
                            run_id=run_id)
    if run_id is None:  # main's evaluate children: main prints the links
        from verlflow.tracking import tracking, ui_links

        run = tracking.get_run(result.run_id)
        pages = [("this evaluation", ui_links.run_route(run.info.experiment_id, result.run_id)),
                 ("runs of its experiment", ui_links.experiment_route(run.info.experiment_id))]
        if result.model_name and result.model_version:
            pages.append((f"{result.model_name} v{result.model_version}",
                          ui_links.model_version_route(result.model_name, result.model_version)))
        ui_links.print_links("evaluate", pages)
    return result
