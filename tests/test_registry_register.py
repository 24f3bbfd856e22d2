"""register: a finished train run's checkpoint becomes a model version with lineage, aliased challenger."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from conftest import cli_in_process, isolated_store
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.models import registry
from verlflow.models.weights_digest import weights_digest

ROOT = Path(__file__).resolve().parents[1]


def _train_like_run(checkpoint: str | None, *, status: str = "FINISHED", experiment_id: str | None = None,
                    **extra_tags: str) -> str:
    """A real run carrying the tags a train run of the smoke recipe carries."""
    tags = {"verlflow.step": "train", "verlflow.recipe": "smoke", "verlflow.backend": "local",
            "verlflow.profile": "cpu", "device.type": "cpu", "device.name": "test cpu", "data.digest": "d1g35t",
            **extra_tags}
    if checkpoint:
        tags["verlflow.checkpoint_dir"] = checkpoint
    with mlflow.start_run(tags=tags, experiment_id=experiment_id) as run:
        mlflow.log_param("data/max_response_length", "16")
    if status != "FINISHED":
        MlflowClient().set_terminated(run.info.run_id, status)
    return run.info.run_id


def _running_runs() -> int:
    return len(mlflow.search_runs(search_all_experiments=True, filter_string="attributes.status = 'RUNNING'"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One real SQLite store for the module (creating one costs seconds); artifacts go beside it."""
    root = tmp_path_factory.mktemp("register-store")
    with isolated_store(root) as uri:
        yield uri


@pytest.fixture(scope="module")
def checkpoint() -> str:
    from verlflow.models.model_path import resolve_model_path

    return resolve_model_path("tiny-qwen3")


@pytest.mark.slow
def test_registered_version_has_lineage_and_champion_loads_as_a_generating_pipeline(store, checkpoint, tmp_path):
    run_id = _train_like_run(checkpoint)
    mv = registry.register_checkpoint(run_id, "")  # '' → the recipe's model name

    client = MlflowClient()
    name = "tiny-qwen3-gsm8k-smoke"
    assert mv.name == name
    version = client.get_model_version(name, mv.version)
    assert version.tags == {
        "source_run_id": run_id, "device.type": "cpu", "device.name": "test cpu", "verlflow.recipe": "smoke",
        "verlflow.profile": "cpu", "verlflow.backend": "local", "data.digest": "d1g35t",
        "weights.digest": weights_digest(checkpoint),
    }
    assert client.get_model_version_by_alias(name, "challenger").version == mv.version
    # The version is made from a LoggedModel of the train run itself: its source run is the train run.
    assert version.run_id == run_id
    (model,) = client.search_logged_models(experiment_ids=[client.get_run(run_id).info.experiment_id],
                                           filter_string=f"source_run_id = '{run_id}'")
    assert version.source == model.model_uri and model.status == "READY"
    (register_run,) = client.search_runs([client.get_run(run_id).info.experiment_id],
                                         "tags.`verlflow.step` = 'register'")
    assert register_run.info.status == "FINISHED"
    assert register_run.data.tags["verlflow.source_run_id"] == run_id
    # Registering the same train run again returns its version: no copy, no new version.
    assert registry.register_checkpoint(run_id, "").version == mv.version
    assert len(client.search_model_versions(f"name='{name}'")) == 1
    # Another train run, in another experiment, that ended with the same weights (in its own folder) is that
    # version too: the registry holds one copy of a model, whichever experiment its runs were filed in.
    twin = tmp_path / "twin"
    shutil.copytree(checkpoint, twin)
    elsewhere = _train_like_run(str(twin), experiment_id=client.create_experiment("another-experiment"))
    assert registry.register_checkpoint(elsewhere, "").version == mv.version
    assert len(client.search_model_versions(f"name='{name}'")) == 1
    requirements = mlflow.pyfunc.get_model_dependencies(f"models:/{name}/{mv.version}")
    pinned = open(requirements).read()
    assert "transformers==" in pinned and "torch==" in pinned

    client.set_model_version_tag(name, mv.version, "eval.gsm8k.accuracy", "0.5")
    registry.promote_best(name, "eval/gsm8k/accuracy", "champion", False)
    pipe = mlflow.transformers.load_model(f"models:/{name}@champion")
    out = pipe("Ava has 3 apples.", max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"].startswith("Ava has 3 apples.")
    assert len(out[0]["generated_text"]) > len("Ava has 3 apples.")


@pytest.mark.parametrize("status", ["FAILED", "KILLED"])
def test_a_train_run_that_did_not_finish_is_refused(store, checkpoint, status):
    run_id = _train_like_run(checkpoint, status=status)
    with pytest.raises(VerlflowError, match=f"run {run_id} is {status}, not FINISHED") as info:
        registry.register_checkpoint(run_id, "m")
    assert "\n" not in str(info.value)
    assert not MlflowClient().search_registered_models(filter_string="name = 'm'")
    assert _running_runs() == 0


def test_a_run_without_checkpoint_is_refused(store):
    run_id = _train_like_run(None)
    with pytest.raises(VerlflowError, match="has no final checkpoint"):
        registry.register_checkpoint(run_id, "m")
    assert _running_runs() == 0


def test_a_checkpoint_folder_that_is_gone_is_refused(store, tmp_path):
    run_id = _train_like_run(str(tmp_path / "deleted"))
    with pytest.raises(VerlflowError, match="checkpoint of run .* is missing"):
        registry.register_checkpoint(run_id, "m")


def test_cli_refuses_a_run_id_that_does_not_exist(store, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
    proc = cli_in_process(["register", "--run_id", "0123456789abcdef0123456789abcdef"], env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"verlflow register: error: no run with id or name '0123456789abcdef0123456789abcdef' in the tracking "
        f"store {store}"
    )
    assert "Traceback" not in proc.stderr
    assert _running_runs() == 0


def test_model_name_comes_from_the_run_tag_before_the_recipe(store):
    with mlflow.start_run(tags={"verlflow.model_name": "from-tag", "verlflow.recipe": "smoke"}) as run:
        pass
    assert registry.model_name_for(MlflowClient().get_run(run.info.run_id), "") == "from-tag"
    assert registry.model_name_for(MlflowClient().get_run(run.info.run_id), "given") == "given"


def test_data_digest_falls_back_to_the_preprocess_run_that_wrote_the_data(store, tmp_path):
    data_dir = tmp_path / "data"
    with mlflow.start_run(tags={"verlflow.step": "preprocess", "verlflow.data_dir": str(data_dir),
                                "data.digest": "fromprep"}):
        pass
    with mlflow.start_run() as train:
        mlflow.log_param("data/train_files", str(data_dir / "train.parquet"))
    assert registry.data_digest_of(MlflowClient().get_run(train.info.run_id)) == "fromprep"


@pytest.mark.slow
def test_two_registers_of_one_run_at_once_leave_one_version(store, checkpoint, tmp_path):
    run_id = _train_like_run(checkpoint)
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}, "PYTHONPATH": str(ROOT / "src")}
    procs = [subprocess.Popen([sys.executable, "-m", "verlflow.cli", "register", "--run_id", run_id, "--model_name",
                               "race-model"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in outputs]

    client = MlflowClient()
    versions = client.search_model_versions(f"name='race-model' and tags.source_run_id = '{run_id}'")
    assert len(versions) == 1, [v.version for v in versions]
    assert str(client.get_registered_model("race-model").aliases["challenger"]) == str(versions[0].version)
    assert _running_runs() == 0


def test_a_version_whose_artifacts_were_removed_is_named_so(tracking_uri):
    from mlflow.entities import LoggedModelStatus

    from verlflow.models.model_uri import resolve_model

    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    model = client.create_logged_model(experiment_id="0", name="model", source_run_id=run_id)
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)  # its artifacts removed: none left
    client.create_registered_model("emptied")
    client.create_model_version("emptied", source=f"models:/{model.model_id}", run_id=run_id, model_id=model.model_id)
    # Before: "model folder '/tmp/tmpXXXX' has no config.json", a temp folder the user never gave.
    with pytest.raises(VerlflowError, match=r"model 'models:/emptied/1' has no files in the artifact store"):
        resolve_model("models:/emptied/1")
