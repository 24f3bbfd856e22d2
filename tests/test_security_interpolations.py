"""What an interpolation reads from the environment is resolved in the process only, never logged.

``+trainer.exfil=${oc.env:DB_CONN}`` resolved into ``config/resolved.yaml``, the dry run's ``config/verl_job.yaml``
and the local trainer's params, in clear whenever the variable's name did not look secret. Planted: a variable
with a plain name, read by one override and copied by another (``${trainer.exfil}``).
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from conftest import cli_in_process
from mlflow.tracking import MlflowClient

VALUE = "plain-conn-value-4242"
READS = "+trainer.exfil=${oc.env:DB_CONN} +trainer.copied=${trainer.exfil}"


@pytest.fixture
def tiny_model(tiny_workdir) -> Path:
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    return Path(resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache"))


def _everything_logged(run_id: str, store: str) -> tuple[dict, bytes]:
    client = MlflowClient()
    artifacts = b"".join(Path(client.download_artifacts(run_id, item.path)).read_bytes()
                         for item in client.list_artifacts(run_id, "config"))
    return client.get_run(run_id).data.params, artifacts + Path(store.removeprefix("sqlite:///")).read_bytes()


def test_a_dry_run_logs_the_environment_read_unresolved(tracking_uri, tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("DB_CONN", VALUE)
    done = cli_in_process(["train", "--recipe", "tiny", "--device", "gpu", "--backend", "verl", "--dry_run", "true",
                           "--model", str(tiny_model), "--data_dir", str(tmp_path / "data"), "--overrides",
                           f"{READS} verlflow.skip_preflight=true trainer.n_gpus_per_node=1 "
                           "actor_rollout_ref.rollout.tensor_model_parallel_size=1"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    _, logged = _everything_logged(run.info.run_id, tracking_uri)
    assert b"${oc.env:DB_CONN}" in logged
    assert VALUE.encode() not in logged and VALUE not in done.stdout + done.stderr


@pytest.mark.slow
def test_the_local_trainer_logs_params_with_the_environment_read_unresolved(tracking_uri, tmp_path, tiny_model,
                                                                             monkeypatch):
    monkeypatch.setenv("DB_CONN", VALUE)
    done = cli_in_process(["train", "--recipe", "tiny", "--device", "cpu", "--model", str(tiny_model),
                           "--overrides", f"{READS} trainer.total_training_steps=1"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    run = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`verlflow.step` = 'train'",
                             output_format="list")[0]
    params, logged = _everything_logged(run.info.run_id, tracking_uri)
    assert params["trainer/exfil"] == "${oc.env:DB_CONN}" and params["trainer/copied"] == "***"
    assert VALUE.encode() not in logged
