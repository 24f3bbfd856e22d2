"""Shared fixtures: the ../shared folder beside the checkout, and a fresh SQLite tracking store per test."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


@pytest.fixture
def shared_dir() -> Path:
    """The ../shared folder (real GSM8K, device fixtures, the guide); skips where a clone has none."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (a user's clone): this test needs the shared reference material")
    return SHARED


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch) -> str:
    """A real MLflow SQLite store in tmp_path, set for this process and for subprocesses."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    mlflow.set_tracking_uri(uri)
    yield uri
    while mlflow.active_run():
        mlflow.end_run()
