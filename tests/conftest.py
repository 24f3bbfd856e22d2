"""Shared fixtures: the files kept with the tests (tests/fixtures), and a fresh SQLite tracking store per test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    """tests/fixtures: real device samples, a real GSM8K slice and the reference guide (READMEs give sources)."""
    return FIXTURES


@contextlib.contextmanager
def isolated_store(root: Path):
    """Work in ``root`` with MLflow (this process and its subprocesses) on a SQLite store there.

    For module-scoped stores: creating a store costs seconds, so a test module may share one.
    """
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.delenv("MLFLOW_RUN_ID", raising=False)
        mlflow.set_tracking_uri(uri)
        yield uri


def wait_for_http(url: str, proc: subprocess.Popen, timeout_s: float, poll_s: float = 0.5) -> bool:
    """Poll ``url`` until it answers; False when ``proc`` exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            return True
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(poll_s)


def every_experiment(client: MlflowClient | None = None) -> list[str]:
    """Every experiment's id: train runs land in ``verlflow/<recipe>``, ``mlflow run``'s in Default."""
    return [e.experiment_id for e in (client or MlflowClient()).search_experiments()]


def stop_process_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """End a server started with ``start_new_session=True``: SIGTERM its group, SIGKILL it after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch) -> str:
    """A real MLflow SQLite store in tmp_path, set for this process and for subprocesses."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    mlflow.set_tracking_uri(uri)
    # The store's tables now, in set-up: MLflow < 3.9's schema migration reconfigures the root logger (alembic's
    # fileConfig), which would drop the test's own log capture if it ran during the test.
    MlflowClient().search_experiments()
    yield uri
    while mlflow.active_run():
        mlflow.end_run()


@dataclass
class SmokeStore:
    """A tracking store holding two real tiny-recipe train runs that differ only in their CPU thread count."""

    tracking_uri: str
    run_ids: list[str]
    data_dir: Path
    workdir: Path


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "verlflow.cli", *args], env=env, cwd=cwd,
                            capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"verlflow {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


@pytest.fixture(scope="session")
def smoke_store(tmp_path_factory) -> SmokeStore:
    """Preprocess synthetic data, then train the tiny recipe twice on the cpu profile (1 and 2 threads).

    Built once per test session through the real CLI in subprocesses (about a minute on 2 cores) and
    shared by the tests that need finished train runs: registry, evaluate, compare.
    """
    workdir = tmp_path_factory.mktemp("smoke_store")
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME")}
    env["MLFLOW_TRACKING_URI"] = uri
    env["VERLFLOW_CACHE"] = str(workdir / "cache")
    data_dir = workdir / "data"
    _cli(["preprocess", "--source", "synthetic", "--output_dir", str(data_dir), "--limit", "64"], env, workdir)
    for threads in (1, 2):
        overrides = f"profile.env.OMP_NUM_THREADS={threads}"
        _cli(["train", "--recipe", "tiny", "--device", "cpu", "--data_dir", str(data_dir), "--overrides", overrides],
             env, workdir)
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`verlflow.step` = 'train'", order_by=["attributes.start_time ASC"])
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    return SmokeStore(tracking_uri=uri, run_ids=[r.info.run_id for r in runs], data_dir=data_dir, workdir=workdir)


@pytest.fixture(scope="session")
def warm_model_cache(tmp_path_factory) -> Path:
    """A verlflow cache holding the smoke recipe's warm-started tiny Qwen3, built once per test session.

    The tests of the recipe that learns (main, search) point ``VERLFLOW_CACHE`` here instead of paying the
    build (about a minute on 2 cores) each; the build itself is tested in tests/test_tiny_model_sft.py.
    """
    from verlflow.models.model_path import SFT_SENTINEL, resolve_model_path

    cache = tmp_path_factory.mktemp("verlflow-cache")
    resolve_model_path(SFT_SENTINEL, cache)
    return cache


# The verl the reference guide ran (its §6.1 stacks); the newest is the one installed in this environment.
GUIDE_VERL = "0.5.0"


@pytest.fixture(scope="session")
def guide_verl(request) -> Path:
    """verl 0.5.0 without dependencies in a cached folder (fails loudly when the registry is unreachable).

    Put it first on a subprocess's ``PYTHONPATH`` to run verlflow against the guide's verl.
    """
    target = Path(request.config.cache.mkdir(f"verl-{GUIDE_VERL}"))
    if not (target / "verl" / "__init__.py").is_file():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target",
                               str(target), f"verl=={GUIDE_VERL}"], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.fail(f"cannot install verl=={GUIDE_VERL} from the registry: {done.stderr[-1500:]}")
    return target
