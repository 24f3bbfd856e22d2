"""Model versions as ``evaluate`` leaves them, for the registry tests (promote, champion notes)."""

from __future__ import annotations

import mlflow
from mlflow.tracking import MlflowClient

from verlflow.models import registry


def evaluated_version(client: MlflowClient, name: str, right: list[bool], *, described: bool = False) -> str:
    """A real version of ``name`` whose evaluation run logged every problem's score (``right``), as ``evaluate``
    does; ``described``: its description written as ``register`` writes it. Returns the version."""
    with mlflow.start_run() as run:
        mlflow.log_table({"question": [f"problem {i}" for i in range(len(right))], "correct": right},
                         artifact_file="eval/gsm8k_predictions.json")
    tags = {"source_run_id": run.info.run_id, "eval.run_id": run.info.run_id,
            "eval.gsm8k.accuracy": str(sum(right) / len(right)), "eval.gsm8k.num_samples": str(len(right))}
    mv = client.create_model_version(name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id,
                                     tags=tags)
    if described:
        registry.describe_version(client, name, str(mv.version))
    return str(mv.version)
