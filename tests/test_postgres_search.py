"""The team setup on a real PostgreSQL: an ``mlflow server`` backed by it, two search workers sharing an
Optuna study stored in it. All trials complete, none runs twice, nothing is left RUNNING. Two workers logging the
same dataset at once both end with it as their input (one of them met the other's insert).

PostgreSQL comes from the ``pgserver`` wheel (dev extra: it ships the server binaries and runs as root
too), started in the test's folder on a Unix socket and stopped afterwards.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading

import optuna
import pytest
from conftest import MlflowServer, wait_until
from mlflow.tracking import MlflowClient
from test_search_workers import _short_search_config

from verlflow.data import gsm8k

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    """A throwaway PostgreSQL (socket folder kept short: Unix socket paths must stay < 108 characters)."""
    try:
        import pgserver
    except ImportError:  # a failure, not a skip: the PostgreSQL path would go untested without anyone seeing it
        pytest.fail("pgserver is not installed: it is part of the dev extra, pip install -e '.[dev]'")
    folder = tmp_path_factory.mktemp("pg")
    server = pgserver.get_server(str(folder), cleanup_mode="stop")
    for database in ("tracking", "optuna", "lineage"):
        server.psql(f"create database {database};")
    yield folder
    server.cleanup()


def test_two_workers_on_postgres_complete_every_trial_once(postgres, tmp_path, tiny_workdir, monkeypatch):
    # No worker dies here: a grace period of 120 s, not the 3 s a killed worker's test needs (under CI's load a
    # heartbeat thread can starve past 3 s, and the other worker then fails a trial that is still training).
    # psycopg2 (dev extra) named explicitly: SQLAlchemy 2.1 would pick psycopg 3 for plain postgresql://.
    tracking_db = f"postgresql+psycopg2://postgres@/tracking?host={postgres}"
    storage = f"postgresql+psycopg2://postgres@/optuna?host={postgres}"
    # The tiny model built once per session, and the 64 synthetic rows per split the workers train on (no trained
    # store needed: the smoke store's two trainings are not read here).
    data_dir = tmp_path / "data"
    gsm8k.preprocess("synthetic", data_dir, 64, log_to_mlflow=False)
    server = MlflowServer(tmp_path, backend_store_uri=tracking_db)
    server.start()
    url = server.url
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME")}
        env.update({"MLFLOW_TRACKING_URI": url, "VERLFLOW_CACHE": str(tiny_workdir / "cache")})
        args = ["search", "--recipe", "tiny", "--device", "cpu", "--n_trials", "1", "--study_name", "pg",
                "--storage", storage, "--pruner", "none", "--data_dir", str(data_dir),
                "--search_config", str(_short_search_config(tmp_path, grace_period=120))]
        workers = [subprocess.Popen([sys.executable, "-m", "verlflow.cli", *args], cwd=tmp_path, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
        outputs = [w.communicate(timeout=900)[0] for w in workers]
        assert [w.returncode for w in workers] == [0, 0], [o[-2000:] for o in outputs]

        study = optuna.load_study(study_name="pg", storage=storage)
        assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "COMPLETE"], [o[-3000:] for o in outputs]
        client = MlflowClient(tracking_uri=url)
        experiments = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(experiments, max_results=1000)
        trials = [r for r in runs if r.data.tags.get("optuna.study_name") == "pg"
                  and r.data.tags.get("verlflow.step") == "train"]
        assert sorted(int(r.data.tags["optuna.trial_number"]) for r in trials) == [0, 1]  # each trial once
        assert [r.info.run_id for r in runs if r.info.status == "RUNNING"] == []
        assert all("password" not in str(v).lower() for r in runs for v in r.data.params.values())
    finally:
        server.stop()


def test_a_dataset_another_worker_inserted_first_is_linked_not_a_failed_trial(postgres, tmp_path, monkeypatch,
                                                                              request):
    # CI, two search workers on Postgres: both trials' train runs logged gsm8k-train at once; MLflow looks the
    # dataset up, then inserts it, and the later insert met the other's row (duplicate key): one trial FAILED.
    # Made certain here: another connection inserts the same dataset and holds its transaction open, so this run's
    # insert waits on the unique index; committed, the insert is refused as it was in CI.
    import mlflow
    import psycopg2

    from verlflow.data.checks import read_rows
    from verlflow.data.lineage import log_split_inputs, rows_digest

    data_dir = tmp_path / "data"
    gsm8k.preprocess("synthetic", data_dir, 8, log_to_mlflow=False)
    uri = f"postgresql+psycopg2://postgres@/lineage?host={postgres}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # Set for this process too: an earlier test's mlflow.set_tracking_uri would win over the environment.
    request.addfinalizer(functools.partial(mlflow.set_tracking_uri, mlflow.get_tracking_uri()))
    mlflow.set_tracking_uri(uri)
    experiment_id = mlflow.create_experiment("race")
    run_id = mlflow.MlflowClient().create_run(experiment_id).info.run_id
    digest = rows_digest(read_rows(data_dir / "train.parquet"))

    other = psycopg2.connect(dbname="lineage", user="postgres", host=str(postgres))
    watcher = psycopg2.connect(dbname="lineage", user="postgres", host=str(postgres))
    watcher.autocommit = True
    with other.cursor() as cursor:  # psycopg2 opens a transaction here and keeps it until commit
        cursor.execute("INSERT INTO datasets (dataset_uuid, experiment_id, name, digest, dataset_source_type, "
                       "dataset_source) VALUES ('other-worker', %s, 'gsm8k-train', %s, 'local', 'elsewhere')",
                       (int(experiment_id), digest))
    errors: list[BaseException] = []

    def log() -> None:
        try:
            with mlflow.start_run(run_id=run_id):
                log_split_inputs(data_dir, {"train": "training"})
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    logging_thread = threading.Thread(target=log)
    logging_thread.start()

    def insert_waits() -> bool:
        with watcher.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE datname = 'lineage' AND wait_event_type = 'Lock'")
            return cursor.fetchone()[0] > 0

    try:
        wait_until(insert_waits, 120, "this run's dataset insert waiting on the other worker's")
    finally:
        other.commit()
        logging_thread.join(timeout=300)
    other.close()
    watcher.close()

    assert errors == []
    inputs = mlflow.MlflowClient().get_run(run_id).inputs.dataset_inputs
    linked = [(i.dataset.name, i.dataset.digest, i.dataset.source) for i in inputs]
    assert linked == [("gsm8k-train", digest, "elsewhere")]
