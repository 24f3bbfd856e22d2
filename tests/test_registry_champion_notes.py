"""The registry says which version holds champion, since when and why, after every promote."""

from __future__ import annotations

import pytest
from conftest import isolated_store
from mlflow.tracking import MlflowClient
from registry_versions import evaluated_version

from verlflow.models import registry

NAME = "noted"


@pytest.fixture
def client(tmp_path) -> MlflowClient:
    with isolated_store(tmp_path):
        c = MlflowClient()
        c.create_registered_model(NAME)
        yield c


def _promote() -> str:
    return registry.promote_best(NAME, "eval/gsm8k/accuracy", "champion", False).version


def test_every_promote_says_on_the_model_and_its_versions_who_holds_champion_since_when_and_why(client):
    first = evaluated_version(client, NAME, [True] * 40 + [False] * 60, described=True)
    assert _promote() == first
    model = client.get_registered_model(NAME).description
    assert model.startswith(f"`champion` = version {first} since ") and "no version held it" in model

    better = evaluated_version(client, NAME, [True] * 80 + [False] * 20, described=True)
    assert _promote() == better
    model = client.get_registered_model(NAME).description
    assert model.startswith(f"`champion` = version {better} since ")
    assert "beyond the noise" in model and "95% interval" in model and "over 100 paired problems" in model
    holder = client.get_model_version(NAME, better).description
    assert holder.startswith("accuracy 0.8000 on 100 test problems") and "Holds `champion` since " in holder
    assert f"`champion` is on version {better}" in client.get_model_version(NAME, first).description
    since = client.get_registered_model(NAME).tags["verlflow.champion.since"]

    # Within the noise: champion stays, since when stays, and the latest decision is said too.
    evaluated_version(client, NAME, [True] * 81 + [False] * 19, described=True)
    assert _promote() == better
    model = client.get_registered_model(NAME).description
    assert model.startswith(f"`champion` = version {better} since {since}: ")
    assert "Latest promote, " in model and "within the noise" in model
    # main describes the version again after promote: the note stays on it.
    registry.describe_version(client, NAME, better)
    assert "Holds `champion` since " in client.get_model_version(NAME, better).description
