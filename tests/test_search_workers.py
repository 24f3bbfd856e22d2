"""Searches that run the real train step (local trainer, tiny recipe, synthetic data).

- Two workers started at once on one journal study each run their own trial, with distinct params; a
  worker killed mid-trial leaves its trial failed (its training stops with it), and the next worker
  retries it with the same params; the study resumes and the best trial is recorded and registered.
- A trial the median pruner stops is ended promptly, its run KILLED and tagged.

Trials are cut to 2 training steps (validation after each) by the test's search config: 15-60 s each
on 2 cores, mostly start-up. The file takes about 2-3 minutes (plus the shared smoke_store fixture).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import cli_in_process, process_running, wait_until
from mlflow.tracking import MlflowClient
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState, create_trial

from verlflow import config
from verlflow.search.search_config import load_search_config
from verlflow.search.space import distributions

REPO = Path(__file__).resolve().parents[1]
METRIC = "val-core/openai/gsm8k/reward/mean_at_1"
DEFAULT = yaml.safe_load((REPO / "src/verlflow/config/search/default.yaml").read_text())
pytestmark = pytest.mark.slow


def _short_search_config(tmp_path: Path, steps: int = 2, grace_period: int = 3, **pruner) -> Path:
    data = yaml.safe_load(yaml.safe_dump(DEFAULT))
    overrides = {"trainer.total_training_steps": steps, "trainer.total_epochs": steps, "trainer.test_freq": 1}
    data["trial"] = {"overrides": overrides, "poll_interval": 1, "stop_timeout": 300}
    data["storage"] = {"heartbeat_interval": 1, "grace_period": grace_period, "max_retry": 2}
    data["space"]["actor_rollout_ref.rollout.n"]["choices"] = [2, 4]
    data["pruner"]["median"] = pruner or data["pruner"]["median"]
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def project(tmp_path, smoke_store) -> Path:
    """The MLflow project with the smoke store's synthetic data where the tiny recipe looks (data/synthetic)."""
    root = tmp_path / "project"
    root.mkdir()
    for name in ("MLproject", "conda.yaml"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "entry_points", root / "entry_points")
    (root / "data").mkdir()
    (root / "data" / "synthetic").symlink_to(smoke_store.data_dir)
    return root


def _env(tracking_uri: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME")}
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    return env


def _mlflow_worker(project: Path, env, **params) -> subprocess.Popen:
    args = [f"-P{k}={v}" for k, v in params.items()]
    return subprocess.Popen([sys.executable, "-m", "mlflow", "run", str(project), "--env-manager", "local",
                             "-e", "search", *args], cwd=project, env=env)


def _runs(client: MlflowClient, filter_string: str):
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, filter_string=filter_string, max_results=100)


def _child_pids(pid: int) -> list[int]:
    """Processes started by ``pid`` (Linux /proc)."""
    pids = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        pids += [int(p) for p in task.read_text().split()]
    return pids



@pytest.mark.timeout(1200)  # three workers one after the other on a busy 2-core machine
def test_parallel_workers_share_a_study_and_a_killed_workers_trial_is_retried(tmp_path, project,
                                                                             tracking_uri):
    client = MlflowClient()
    env = _env(tracking_uri)
    journal = tmp_path / "study.journal"
    params = {"recipe": "tiny", "device": "cpu", "n_trials": 1, "study_name": "s", "storage": journal,
              "pruner": "none", "search_config": _short_search_config(tmp_path)}
    # Worker A: the search step itself (so that SIGKILL hits the worker); worker B through `mlflow run`.
    cli_args = [arg for k, v in params.items() for arg in (f"--{k}", str(v))]
    worker_a = subprocess.Popen([sys.executable, "-m", "verlflow.cli", "search", *cli_args], cwd=project,
                                env=env)
    worker_b = _mlflow_worker(project, env, **params)

    def a_trial_started():
        parents = [r for r in _runs(client, "tags.`verlflow.step` = 'search'")
                   if "mlflow.project.entryPoint" not in r.data.tags]
        children = parents and _runs(client, f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
        training = _child_pids(worker_a.pid)
        return (parents[0], children[0], training) if children and training else None

    # Killed while its trial's train step starts (imports alone take seconds, so this cannot miss).
    parent_a, child_a, training = wait_until(a_trial_started, 400, "worker A's trial to start", poll_s=0.2)
    worker_a.send_signal(signal.SIGKILL)
    worker_a.wait(timeout=30)
    # Its training dies with it (the kernel sends it SIGTERM): no orphan keeps training.
    wait_until(lambda: not any(process_running(pid) for pid in training), 60, "A's training to stop")

    assert worker_b.wait(timeout=500) == 0
    # Worker C in this process (its own process is not what is tested: B's is): the grace period (3 s) is long over,
    # so it retries A's trial.
    worker_c = cli_in_process(["search", *cli_args], env=env, cwd=project)
    assert worker_c.returncode == 0, worker_c.stderr[-3000:]

    study = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(journal))))
    trials = sorted(study.trials, key=lambda t: t.number)
    assert sorted(t.state.name for t in trials) == ["COMPLETE", "COMPLETE", "FAIL"]
    lost = next(t for t in trials if t.state == TrialState.FAIL)
    # The first worker to start a trial after A's heartbeat went stale runs the retry: B when its start-up
    # outlasted the grace period, C otherwise. Either way exactly one trial retries A's, with A's params.
    retries = [t for t in trials if "failed_trial" in t.system_attrs]
    assert len(retries) == 1, [t.system_attrs for t in trials]
    retried = retries[0]
    assert retried.system_attrs["failed_trial"] == lost.number and retried.params == lost.params
    fresh = next(t for t in trials if t.number not in (lost.number, retried.number))
    assert fresh.params != lost.params, "two workers drew the same point"

    # Every trial ran exactly once, as one child run of its worker's search run.
    children = _runs(client, "tags.`optuna.study_name` = 's' and tags.`verlflow.step` = 'train'")
    assert sorted(int(r.data.tags["optuna.trial_number"]) for r in children) == [t.number for t in trials]
    parents = {r.info.run_id: r for r in _runs(client, "tags.`verlflow.step` = 'search'")}
    assert len(parents) == 3 and all(r.data.tags["mlflow.parentRunId"] in parents for r in children)
    by_number = {int(r.data.tags["optuna.trial_number"]): r for r in children}
    assert by_number[retried.number].data.tags["optuna.retry_of"] == str(lost.number)
    assert by_number[lost.number].data.tags["optuna.state"] == "FAIL"
    assert client.get_run(child_a.info.run_id).info.status in ("KILLED", "FAILED")
    # Closed by whoever found it first: the retrying worker (KILLED) or a step's reaper (FAILED, its pid is gone).
    closed = client.get_run(parent_a.info.run_id)
    assert closed.info.status in ("KILLED", "FAILED") and closed.data.tags.get("verlflow.error")
    for number, run in by_number.items():
        n = trials[number].params["actor_rollout_ref.rollout.n"]
        assert run.data.tags["optuna.param.actor_rollout_ref.rollout.n"] == str(n)

    # The last worker's run carries the study's best, its plots, and the best trial registered as search-best.
    last_worker = max(parents.values(), key=lambda r: r.info.end_time or 0)
    final = client.get_run(last_worker.info.run_id)
    assert final.info.status == "FINISHED"
    best_run_id = final.data.tags["best_run_id"]
    assert best_run_id in {r.info.run_id for r in children}
    assert f"best/{METRIC}" in final.data.metrics and final.data.metrics["search/trials_complete"] == 2
    assert any(k.startswith("best.param.") for k in final.data.tags)
    plots = {Path(a.path).stem for a in client.list_artifacts(final.info.run_id, "search/plots")}
    skipped = final.data.tags.get("search.plots_skipped", "")
    assert "optimization_history" in plots
    assert all(name in plots or name in skipped for name in
               ("parallel_coordinate", "param_importances", "intermediate_values"))
    versions = client.search_model_versions(f"tags.source_run_id = '{best_run_id}'")
    assert len(versions) == 1, "the best trial is registered once, however many workers summarise"
    assert "search-best" in client.get_registered_model(versions[0].name).aliases


def test_pruned_trial_is_stopped_promptly_and_tagged(tmp_path, monkeypatch, tracking_uri, smoke_store, capfd):
    from verlflow.step_requests import SearchRequest
    from verlflow.steps.search import run_search

    # 200 steps, validated after each: a trial that is not stopped runs for minutes.
    search_config = _short_search_config(tmp_path, steps=200, n_startup_trials=2, n_warmup_steps=0)
    journal = tmp_path / "study.journal"
    # Two earlier trials that validated at 1.0 (every answer right) at both steps: any real trial of the
    # tiny model is below their median at its first validation and is pruned there.
    search = load_search_config(str(search_config))
    dists = distributions(search, config.compose("tiny", "cpu"))
    earlier = optuna.create_study(study_name="p", direction="maximize",
                                  storage=JournalStorage(JournalFileBackend(str(journal))))
    for n in (2, 4):
        values = {"actor_rollout_ref.actor.optim.lr": 1e-3, "actor_rollout_ref.actor.kl_loss_coef": 1e-3,
                  "actor_rollout_ref.rollout.n": n}
        earlier.add_trial(create_trial(params=values, distributions=dists, value=1.0,
                                       intermediate_values={1: 1.0, 2: 1.0}))

    monkeypatch.chdir(tmp_path)
    result = run_search(SearchRequest("tiny", "cpu", 1, study_name="p", storage=str(journal), pruner="median",
                                      search_config=str(search_config), data_dir=str(smoke_store.data_dir)))
    assert result.trial_counts == {"COMPLETE": 2, "PRUNED": 1}
    client = MlflowClient()
    (child,) = _runs(client, f"tags.`mlflow.parentRunId` = '{result.parent_run_id}' and "
                             "tags.`verlflow.step` = 'train'")
    # Pruning is the search working: FINISHED (no red cross), tagged, and its name says so first.
    assert child.info.status == "FINISHED"
    assert child.data.tags["optuna.pruned"] == "true" and child.data.tags["optuna.state"] == "PRUNED"
    assert re.match(r"t\d+ pruned · \S+=", child.info.run_name), child.info.run_name
    # Pruned at its first validation and stopped soon after, far from its 200 steps.
    steps = [m.step for m in client.get_metric_history(child.info.run_id, METRIC)]
    assert steps[0] == 1 and max(steps) < 100, steps
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["search/trials_pruned"] == 1
    # On the console too: the trial's own exit line says the pruner stopped it, not "interrupted".
    printed = capfd.readouterr().out
    assert "verlflow train: stopped by the search's pruner (not a failure)" in printed
    assert "verlflow train: interrupted" not in printed
