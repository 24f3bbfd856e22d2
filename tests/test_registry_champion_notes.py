"""The registry says which version holds champion, since when and why, after every promote."""

from __future__ import annotations

import mlflow
import pytest
from conftest import isolated_store
from mlflow.tracking import MlflowClient

from verlflow.models import registry

NAME = "noted"


@pytest.fixture
def client(tmp_path) -> MlflowClient:
    with isolated_store(tmp_path):
        c = MlflowClient()
        c.create_registered_model(NAME)
        yield c


def _evaluated_version(client: MlflowClient, right: list[bool]) -> str:
    """A real version whose evaluation run logged every problem's score, as ``evaluate`` does."""
    with mlflow.start_run() as run:
        mlflow.log_table({"question": [f"problem {i}" for i in range(len(right))], "correct": right},
                         artifact_file="eval/gsm8k_predictions.json")
    tags = {"source_run_id": run.info.run_id, "eval.run_id": run.info.run_id,
            "eval.gsm8k.accuracy": str(sum(right) / len(right)), "eval.gsm8k.num_samples": str(len(right))}
    mv = client.create_model_version(NAME, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id,
                                     tags=tags)
    registry.describe_version(client, NAME, str(mv.version))
    return str(mv.version)


def _promote() -> str:
    return registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False).version


def test_every_promote_says_on_the_model_and_its_versions_who_holds_champion_since_when_and_why(client):
    first = _evaluated_version(client, [True] * 40 + [False] * 60)
    assert _promote() == first
    model = client.get_registered_model(NAME).description
    assert model.startswith(f"`champion` = version {first} since ") and "no version held it" in model

    better = _evaluated_version(client, [True] * 80 + [False] * 20)
    assert _promote() == better
    model = client.get_registered_model(NAME).description
    assert model.startswith(f"`champion` = version {better} since ")
    assert "beyond the noise" in model and "95% interval" in model and "over 100 paired problems" in model
    holder = client.get_model_version(NAME, better).description
    assert holder.startswith("accuracy 0.8000 on 100 test problems") and "Holds `champion` since " in holder
    assert f"`champion` is on version {better}" in client.get_model_version(NAME, first).description
    since = client.get_registered_model(NAME).tags["verlflow.champion.since"]

    # Within the noise: champion stays, since when stays, and the latest decision is said too.
    _evaluated_version(client, [True] * 81 + [False] * 19)
    assert _promote() == better
    model = client.get_registered_model(NAME).description
    assert model.startswith(f"`champion` = version {better} since {since}: ")
    assert "Latest promote, " in model and "within the noise" in model
    # main describes the version again after promote: the note stays on it.
    registry.describe_version(client, NAME, better)
    assert "Holds `champion` since " in client.get_model_version(NAME, better).description
