"""A deleted registered model or version is named so in one line by promote, evaluate and register (issue 45).

Before: promote against a model whose versions were deleted said "evaluate a version first", and evaluate of a
deleted version said only that it had no such version. Real SQLite store, real register of the tiny model.
"""

from __future__ import annotations

import os
import re

import mlflow
import pytest
from conftest import CliResult, cli_in_process, isolated_store
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.models import registry
from verlflow.models.model_uri import resolve_model


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One real SQLite store for the module; artifacts beside it."""
    with isolated_store(tmp_path_factory.mktemp("deleted-store")) as uri:
        yield uri


@pytest.fixture(scope="module")
def train_run(store) -> str:
    """A FINISHED run carrying a train run's tags, its checkpoint the tiny model."""
    from verlflow.models.model_path import resolve_model_path

    tags = {"verlflow.step": "train", "verlflow.recipe": "smoke", "verlflow.backend": "local",
            "verlflow.checkpoint_dir": resolve_model_path("tiny-qwen3")}
    with mlflow.start_run(tags=tags) as run:
        mlflow.log_param("data/max_response_length", "16")
    return run.info.run_id


def _running() -> int:
    return len(mlflow.search_runs(search_all_experiments=True, filter_string="attributes.status = 'RUNNING'"))


def _cli(*args: str) -> CliResult:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
    return cli_in_process([*args], env=env)


def test_deleted_versions_and_models_are_named_by_promote_evaluate_and_register(store, train_run, capsys):
    client = MlflowClient()
    registry.register_checkpoint(train_run, "gone")
    client.set_model_version_tag("gone", "1", "eval.gsm8k.accuracy", "0.5")
    client.delete_model_version("gone", "1")

    no_versions = "registered model 'gone' has no versions (version 1 was deleted): register a train run again"
    promote = _cli("promote", "--model_name", "gone")
    assert promote.returncode == 2 and "Traceback" not in promote.stderr
    assert promote.stderr.strip().splitlines()[-1].startswith(f"verlflow promote: error: {no_versions}")
    assert "evaluate a version first" not in promote.stderr
    for uri in ("models:/gone/1", "models:/gone@challenger"):
        with pytest.raises(VerlflowError, match="^" + re.escape(no_versions)):
            resolve_model(uri)

    capsys.readouterr()
    again = registry.register_checkpoint(train_run, "gone")
    assert str(again.version) == "2"
    assert "(registered again: its version 1 was deleted)" in capsys.readouterr().out
    with pytest.raises(VerlflowError, match=r"^version 1 of registered model 'gone' was deleted: its versions are 2$"):
        resolve_model("models:/gone/1")
    with pytest.raises(VerlflowError, match=r"^version 7 of registered model 'gone' does not exist"):
        resolve_model("models:/gone/7")

    client.delete_registered_model("gone")
    deleted = r"^registered model 'gone' was deleted \(register run \w+ made its version 2\): register a train run"
    for uri in ("models:/gone@champion", "models:/gone/2"):
        with pytest.raises(VerlflowError, match=deleted):
            resolve_model(uri)
    with pytest.raises(VerlflowError, match=deleted):
        registry.promote_best("gone", "eval/gsm8k/accuracy", "champion", False)
    with pytest.raises(VerlflowError, match=r"^no registered model 'never-made' in the tracking store"):
        resolve_model("models:/never-made@champion")
    assert _running() == 0


def test_a_version_deleted_while_promote_decides_is_named(store):
    client = MlflowClient()
    client.create_registered_model("racing")
    with mlflow.start_run() as source:
        pass
    for accuracy in ("0.2", "0.6"):
        client.create_model_version("racing", source=f"{source.info.artifact_uri}/model", run_id=source.info.run_id,
                                    tags={"eval.gsm8k.accuracy": accuracy})

    def delete_the_best() -> None:  # another user deletes version 2 between promote's read and its write
        client.delete_model_version("racing", "2")

    with pytest.raises(VerlflowError, match=r"^version 2 of registered model 'racing' was deleted while promote ran"):
        registry.promote_alias(client, "racing", "eval/gsm8k/accuracy", "champion", False,
                               before_write=delete_the_best)
    assert _running() == 0
