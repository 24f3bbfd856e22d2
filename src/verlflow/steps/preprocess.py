"""Step ``preprocess``: GSM8K (hub, local files or synthetic) → verl's parquet, inside a tracked run.

    mlflow run . --env-manager local -e preprocess -P source=synthetic     # → data/synthetic
"""

from __future__ import annotations

from verlflow.step_requests import PreprocessRequest


def run_preprocess(request: PreprocessRequest, *, run_id: str | None = None):
    """Preprocess the request's source into its folder (``data/<source>`` when ''); ``run_id``: ``main``'s child."""
    from verlflow.data.preprocess_run import preprocess_in_run

    return preprocess_in_run(request.source, request.output_dir, request.limit, run_id=run_id)
