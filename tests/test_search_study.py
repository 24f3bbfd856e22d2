"""The Optuna side of a search, on real Optuna with tiny objectives: storage, heartbeats, retries, seeding.

These test our wiring of Optuna (journal heartbeats, retry of a lost trial, per-trial seeding, resume
checks); the searches that run the real train step are in tests/test_search_workers.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from conftest import wait_until
from mlflow.tracking import MlflowClient
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from verlflow import config
from verlflow.errors import VerlflowError
from verlflow.search.search_config import load_search_config
from verlflow.search.space import distributions
from verlflow.search.study import (
    PARENT_RUN_ID_ATTR,
    RUN_ID_ATTR,
    TrialSeededSampler,
    describe_storage,
    make_pruner,
    open_storage,
    open_study,
)

SPACE = {"x": FloatDistribution(0.0, 1.0), "y": FloatDistribution(1e-4, 1e-1, log=True)}
IDENTITY = {"verlflow.recipe": "smoke", "verlflow.objective": "m", "verlflow.space": "xy"}


def _study(storage_value: str, *, grace: int = 1, identity=IDENTITY, seed: int = 7) -> optuna.Study:
    return open_study(study_name="s", storage=open_storage(storage_value, "s", 1, grace, 2),
                      direction="maximize", sampler=TrialSeededSampler(seed, n_startup_trials=10),
                      pruner=make_pruner("none", {}), identity=identity)


def _objective(trial: optuna.Trial) -> float:
    return trial.suggest_float("x", 0.0, 1.0) + trial.suggest_float("y", 1e-4, 1e-1, log=True)


def test_relative_ranges_follow_the_recipe():
    search = load_search_config("default")
    smoke = distributions(search, config.compose("smoke", "cpu"))  # lr 1e-4: 0.2x to 5x
    guide = distributions(search, config.compose("qwen3-4b-gsm8k-grpo", "a3"))
    lr = "actor_rollout_ref.actor.optim.lr"
    assert (smoke[lr].low, smoke[lr].high) == pytest.approx((2e-5, 5e-4))
    assert (guide[lr].low, guide[lr].high) == pytest.approx((1e-7, 2.5e-6))
    assert guide[lr].log and guide["actor_rollout_ref.actor.kl_loss_coef"].low == pytest.approx(1e-4)
    assert list(guide["actor_rollout_ref.rollout.n"].choices) == [4, 5, 8]


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_trial_of_a_dead_worker_is_failed_closed_and_retried(tmp_path, tracking_uri, kind):
    storage = str(tmp_path / "s.journal") if kind == "journal" else f"sqlite:///{tmp_path / 'optuna.db'}"
    client = MlflowClient()
    parent = client.create_run("0", tags={"verlflow.step": "search"})
    child = client.create_run("0", tags={"mlflow.parentRunId": parent.info.run_id})

    # A worker starts a trial, beats once, and dies: its trial and MLflow runs stay RUNNING.
    dead = _study(storage)
    trial = dead.ask(SPACE)
    trial.set_user_attr(RUN_ID_ATTR, child.info.run_id)
    trial.set_user_attr(PARENT_RUN_ID_ATTR, parent.info.run_id)
    dead._storage.record_heartbeat(trial._trial_id)

    # The next worker (a fresh storage object, as another process has) fails it and runs it again, once its
    # heartbeat is older than the grace period (1 s).
    worker = _study(storage)
    wait_until(lambda: trial._trial_id in worker._storage._get_stale_trial_ids(worker._study_id), 60,
               "the dead worker's trial seen as stale")
    worker.optimize(_objective, n_trials=1)
    lost, retried = worker.trials
    assert (lost.state, retried.state) == (TrialState.FAIL, TrialState.COMPLETE)
    assert retried.params == lost.params
    assert retried.system_attrs["failed_trial"] == 0  # Optuna's retry record
    assert client.get_run(child.info.run_id).info.status == "FAILED"
    assert client.get_run(child.info.run_id).data.tags["optuna.state"] == "FAIL"
    assert "no heartbeat" in client.get_run(parent.info.run_id).data.tags["verlflow.error"]
    assert client.get_run(parent.info.run_id).info.status == "KILLED"


def test_a_running_trial_with_heartbeats_is_left_alone(tmp_path, tracking_uri):
    storage = str(tmp_path / "s.journal")
    alive = _study(storage, grace=30)
    trial = alive.ask(SPACE)
    alive._storage.record_heartbeat(trial._trial_id)
    other = _study(storage, grace=30)
    other.optimize(_objective, n_trials=1)
    assert [t.state for t in other.trials] == [TrialState.RUNNING, TrialState.COMPLETE]


WORKER = textwrap.dedent("""
    import sys, time
    from optuna.pruners import NopPruner
    from verlflow.search.study import TrialSeededSampler, open_storage, open_study
    study = open_study(study_name="s", storage=open_storage(sys.argv[1], "s", 1, 30, 2), direction="maximize",
                       sampler=TrialSeededSampler(7, 10), pruner=NopPruner(), identity={})
    def objective(trial):
        deadline = time.monotonic() + 120  # the first two trials wait until both workers hold one: they overlap
        while trial.number < 2 and len(trial.study.get_trials(deepcopy=False)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        return trial.suggest_float("x", 0.0, 1.0) + trial.suggest_float("y", 1e-4, 1e-1, log=True)
    study.optimize(objective, n_trials=3)
""")


def test_two_workers_share_a_study_without_repeating_a_trial(tmp_path):
    storage = str(tmp_path / "s.journal")
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, storage], env=dict(os.environ))
               for _ in range(2)]
    assert [w.wait(timeout=120) for w in workers] == [0, 0]
    trials = _study(storage).trials
    assert sorted(t.number for t in trials) == list(range(6))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 6

    # Trial k draws from seed + k: one worker alone draws the very same points (startup trials).
    alone = optuna.create_study(direction="maximize", sampler=TrialSeededSampler(7, n_startup_trials=10))
    alone.optimize(_objective, n_trials=6)
    assert [t.params for t in alone.trials] == [t.params for t in sorted(trials, key=lambda t: t.number)]


def test_resuming_a_study_with_another_space_is_refused(tmp_path):
    storage = str(tmp_path / "s.journal")
    _study(storage).optimize(_objective, n_trials=1)
    assert len(_study(storage).trials) == 1  # same name, same search: resumed
    with pytest.raises(VerlflowError, match="another search space"):
        _study(storage, identity={**IDENTITY, "verlflow.space": "other"})


def test_a_journal_whose_last_line_was_torn_resumes_and_keeps_the_tear(tmp_path):
    journal = tmp_path / "s.journal"
    _study(str(journal)).optimize(_objective, n_trials=2)
    whole = journal.read_bytes()
    torn = whole[whole.rfind(b"\n", 0, len(whole) - 1) + 1:][:20]  # a worker killed while appending its next line
    journal.write_bytes(whole + torn)

    study = _study(str(journal))  # before: JSONDecodeError, and the next append landed on the torn line
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    assert (tmp_path / "s.journal.torn").read_bytes() == torn + b"\n"
    study.optimize(_objective, n_trials=1)
    assert len(_study(str(journal)).trials) == 3  # the next append is whole: later resumes read it


def test_default_storage_is_a_journal_in_the_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _study("").optimize(_objective, n_trials=1)
    assert (tmp_path / "optuna" / "s.journal").is_file()
    assert describe_storage("", "s") == str(tmp_path / "optuna" / "s.journal")


def test_storage_url_is_shown_without_its_password():
    shown = describe_storage("postgresql://optuna:s3cret@db.example:5432/studies", "s")
    assert "s3cret" not in shown and "db.example" in shown


def test_unreachable_database_is_one_line():
    with pytest.raises(VerlflowError) as exc_info:
        open_storage("postgresql://nobody@127.0.0.1:1/none", "s", 1, 2, 0)
    assert len(str(exc_info.value).splitlines()) == 1


def test_bad_pruner_is_one_line():
    with pytest.raises(VerlflowError, match="use median, hyperband or none"):
        make_pruner("asha", {})
    hyperband = make_pruner("hyperband", {"hyperband": {"min_resource": 1}})
    assert isinstance(hyperband, optuna.pruners.HyperbandPruner)


def test_journal_path_that_is_a_folder_is_refused(tmp_path: Path):
    with pytest.raises(VerlflowError, match="is a folder"):
        open_storage(str(tmp_path), "s", 1, 2, 0)


KILLED_WORKER = textwrap.dedent("""
    import signal, sys
    from optuna.pruners import NopPruner
    from verlflow.search.study import TrialSeededSampler, open_storage, open_study
    study = open_study(study_name="s", storage=open_storage(sys.argv[1], "s", 1, 600, 2), direction="maximize",
                       sampler=TrialSeededSampler(7, 10), pruner=NopPruner(), identity={})
    def objective(trial):
        trial.suggest_float("x", 0.0, 1.0)
        trial.suggest_float("y", 1e-4, 1e-1, log=True)
        signal.pause()  # until SIGKILLed
    study.optimize(objective, n_trials=1)
""")


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_trial_of_a_search_killed_and_resumed_at_once_is_failed_and_retried(tmp_path, kind):
    """Journal and RDB storage alike (SQLite stands for PostgreSQL: both are Optuna's RDBStorage)."""
    storage = str(tmp_path / "s.journal") if kind == "journal" else f"sqlite:///{tmp_path / 'optuna.db'}"
    worker = subprocess.Popen([sys.executable, "-c", KILLED_WORKER, storage], env=dict(os.environ))
    try:
        wait_until(lambda: [t for t in _study(storage, grace=600).trials
                            if t.state is TrialState.RUNNING and len(t.params) == 2],
                   120, "the killed worker's trial running", watch=[worker])
    finally:
        worker.kill()
        worker.wait(timeout=60)
    resumed = _study(storage, grace=600)  # at once: its heartbeat is seconds old, the grace period 10 minutes
    resumed.optimize(_objective, n_trials=1)
    lost, retried = sorted(resumed.trials, key=lambda t: t.number)
    assert (lost.state, retried.state) == (TrialState.FAIL, TrialState.COMPLETE)  # before: RUNNING for good
    assert retried.params == lost.params
    assert not [t for t in resumed.trials if t.state is TrialState.RUNNING]
