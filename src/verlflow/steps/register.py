"""Step ``register``: a train run's final checkpoint becomes a model version (alias ``challenger``).

    mlflow run . --env-manager local -e register -P run_id=<train run id>
"""

from __future__ import annotations

from verlflow.step_requests import RegisterRequest


def run_register(request: RegisterRequest, *, run_id: str | None = None):
    """Register the request's train run; ``run_id``: a ``register`` run already created for it (``main``'s child)."""
    from verlflow.models.registry import register_checkpoint

    version = register_checkpoint(request.run_id, request.model_name, step_run_id=run_id)
    if run_id is None:  # main's register child: main prints the links
        from verlflow.tracking import tracking, ui_links

        source = tracking.get_run(version.run_id or request.run_id)
        ui_links.print_links("register", [
            (f"{version.name} v{version.version}", ui_links.model_version_route(version.name, version.version)),
            ("its train run", ui_links.run_route(source.info.experiment_id, source.info.run_id)),
        ])
    return version
