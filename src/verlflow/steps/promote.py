"""Step ``promote``: move an alias (``champion``) to the best version when it is better beyond the
evaluation's noise (a paired test on the same problems).

    mlflow run . --env-manager local -e promote -P model_name=verlflow-smoke
"""

from __future__ import annotations

from verlflow.step_requests import PromoteRequest


def run_promote(request: PromoteRequest, *, run_id: str | None = None):
    """Decide and move the request's alias; ``run_id``: a ``promote`` run already created (``main``'s child)."""
    from verlflow.models.promotion import promote_best

    decision = promote_best(request.model_name, request.metric, request.alias, request.force, run_id=run_id)
    if run_id is None and decision.run_id:  # main's promote child: main prints the links
        from verlflow.tracking import tracking, ui_links

        run = tracking.get_run(decision.run_id)
        pages = [("this promotion", ui_links.run_route(run.info.experiment_id, decision.run_id))]
        if decision.version:
            pages.append((f"{decision.model_name} v{decision.version} (@{decision.alias})",
                          ui_links.model_version_route(decision.model_name, decision.version)))
        ui_links.print_links("promote", pages)
    return decision
