"""A train run's checkpoint is taken only while it is the one the run recorded when it trained.

The folder a run names is a tag (``verlflow.checkpoint_dir``) anyone with EDIT on its experiment can rewrite, on a
disk others may write. A trainer logs the weights' digest as the immutable param ``verlflow.checkpoint_sha256``
(tests/test_mlflow_conventions.py and tests/test_verl_cpu_launch.py check both trainers do); here ``register``,
``evaluate runs:/<id>`` and ``main``'s reuse refuse a replaced folder and a rewritten tag, on a real SQLite store,
with a run recorded by the function the trainers call (:func:`verlflow.models.checkpoint_record.record_digest`).
"""

from __future__ import annotations

import getpass
import shutil
from pathlib import Path

import pytest
from conftest import cli_in_process
from mlflow.entities import Param
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.models.checkpoint_record import record_digest
from verlflow.models.model_uri import resolve_model
from verlflow.names import CHECKPOINT_DIGEST_PARAM, CHECKPOINT_DIR_TAG, CODE_VERSION_TAG, STEP_TAG
from verlflow.steps.main import _intact_checkpoint
from verlflow.tracking.reuse import StepRunner, code_version

PARAMS = {"recipe": "tiny", "overrides": ""}


@pytest.fixture(scope="module")
def tiny_model(tiny_workdir) -> Path:
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    return Path(resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache"))


def _trained_run(client: MlflowClient, folder: Path, *, record: bool = True) -> str:
    """A FINISHED train run whose final checkpoint is ``folder``, recorded as a trainer records it."""
    experiment_id = client.get_experiment_by_name("Default").experiment_id
    run_id = client.create_run(experiment_id, tags={"mlflow.user": getpass.getuser(), STEP_TAG: "train",
                                                    CODE_VERSION_TAG: code_version(),
                                                    "verlflow.model_name": "tiny-digest"}).info.run_id
    client.log_batch(run_id, params=[Param(k, v) for k, v in PARAMS.items()])
    if record:
        record_digest(run_id, folder, lambda p: client.log_batch(run_id, params=[Param(k, v) for k, v in p.items()]))
    client.set_tag(run_id, CHECKPOINT_DIR_TAG, str(folder))
    client.set_terminated(run_id, "FINISHED")
    return run_id


def _checkpoint(tiny_model: Path, folder: Path) -> Path:
    shutil.copytree(tiny_model, folder)
    return folder


def _tamper(folder: Path) -> None:
    """Other weights in the same folder (one byte of the tensor data changed, the file still well formed)."""
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))


def test_register_takes_an_intact_checkpoint_and_refuses_a_replaced_one(tracking_uri, tiny_model, tmp_path):
    client = MlflowClient()
    intact = _trained_run(client, _checkpoint(tiny_model, tmp_path / "intact"))
    assert client.get_run(intact).data.params[CHECKPOINT_DIGEST_PARAM]
    done = cli_in_process(["register", "--run_id", intact])
    assert done.returncode == 0, done.stderr

    replaced_folder = _checkpoint(tiny_model, tmp_path / "replaced")
    replaced = _trained_run(client, replaced_folder)
    _tamper(replaced_folder)
    refused = cli_in_process(["register", "--run_id", replaced])
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    (line,) = [ln for ln in refused.stderr.splitlines() if "not the one run" in ln]
    assert str(replaced_folder) in line and CHECKPOINT_DIGEST_PARAM in line
    registered = {v.tags.get("source_run_id") for v in client.search_model_versions("name='tiny-digest'")}
    assert registered == {intact}
    assert [r.info.run_id for r in client.search_runs(["0"], "attributes.status = 'RUNNING'")] == []


def test_a_rewritten_checkpoint_tag_is_refused_by_register_and_evaluate(tracking_uri, tiny_model, tmp_path):
    client = MlflowClient()
    run_id = _trained_run(client, _checkpoint(tiny_model, tmp_path / "own"))
    planted = _checkpoint(tiny_model, tmp_path / "planted")
    _tamper(planted)
    client.set_tag(run_id, CHECKPOINT_DIR_TAG, str(planted))  # what EDIT on the experiment allows

    refused = cli_in_process(["register", "--run_id", run_id])
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "verlflow.checkpoint_dir rewritten" in refused.stderr
    with pytest.raises(VerlflowError, match="not the one run"):
        resolve_model(f"runs:/{run_id}")


def test_main_reuses_only_a_run_whose_checkpoint_is_the_one_it_recorded(tracking_uri, tiny_model, tmp_path, capsys):
    import mlflow

    client = MlflowClient()
    parent = mlflow.start_run(experiment_id=client.create_experiment("mine"))
    runner = StepRunner(client, client.get_run(parent.info.run_id))
    valid = _intact_checkpoint(client, runner.experiment_id)

    unrecorded = _trained_run(client, _checkpoint(tiny_model, tmp_path / "unrecorded"), record=False)
    assert not valid(client.get_run(unrecorded))  # trained before the record: trained again, not trusted
    replaced_folder = _checkpoint(tiny_model, tmp_path / "replaced")
    replaced = _trained_run(client, replaced_folder)
    _tamper(replaced_folder)
    assert runner.find_reusable("train", PARAMS, {}, valid) is None
    assert f"not reusing run {replaced}" in capsys.readouterr().out

    intact = _trained_run(client, _checkpoint(tiny_model, tmp_path / "intact"))
    assert runner.find_reusable("train", PARAMS, {}, valid).info.run_id == intact
    mlflow.end_run()
