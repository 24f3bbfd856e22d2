"""A dry run never passes for a real run: its name says so first, and compare's run selection leaves it out."""

from __future__ import annotations

import os

import pytest
from conftest import CliResult, cli_in_process
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError


def _cli(args: list[str], cwd, env) -> CliResult:
    return cli_in_process([*args], env=env, cwd=cwd)


def _train_runs(client: MlflowClient) -> list:
    return client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`verlflow.step` = 'train'", order_by=["attributes.start_time ASC"])


@pytest.mark.slow
def test_a_dry_run_then_a_real_run_compare_filters_pick_the_real_one(tracking_uri, tiny_workdir, tmp_path):
    from verlflow.compare.reading import resolve_runs

    env = {**os.environ, "VERLFLOW_CACHE": str(tiny_workdir / "cache")}
    data = str(tiny_workdir / "data")
    dry = _cli(["train", "--device", "cpu", "--backend", "verl", "--recipe", "tiny", "--data_dir", data,
                "--dry_run", "true"], tmp_path, env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    real = _cli(["train", "--device", "cpu", "--recipe", "tiny", "--data_dir", data,
                 "--overrides", "trainer.total_training_steps=2"], tmp_path, env)
    assert real.returncode == 0, real.stderr[-3000:]

    client = MlflowClient()
    dry_run, trained = _train_runs(client)
    assert dry_run.info.run_name == "dry run · tiny · cpu-verl" and dry_run.info.status == "FINISHED"
    assert dry_run.data.tags["mlflow.note.content"].startswith("Dry run (")
    assert not trained.info.run_name.startswith("dry run") and trained.data.tags["verlflow.dry_run"] == "false"
    # A filter matching both (the recipe): the real run only.
    assert [r.info.run_id for r in resolve_runs("tags.verlflow.recipe = 'tiny'")] == [trained.info.run_id]
    # A filter matching only the dry run, or the dry run by id: one line saying so and what to select.
    with pytest.raises(VerlflowError, match="matches only dry runs"):
        resolve_runs("tags.verlflow.profile = 'cpu-verl'", "baseline")
    refused = _cli(["compare", "--baseline", dry_run.info.run_id, "--candidate", trained.info.run_id], tmp_path, env)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert "is a dry run (nothing trained)" in line and "tags.verlflow.profile = 'cpu-verl'" in line
