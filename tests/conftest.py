"""Shared fixtures: the files kept with the tests (tests/fixtures), a fresh SQLite tracking store per test, and
the set-ups several modules need (a tiny-model cache with synthetic GSM8K, a real ``mlflow server``, a local Ray
cluster's teardown).

The README runs the suite on both cores with pytest-xdist (``-n 2 --dist loadfile``: a module's tests, and so its
module-scoped set-up, stay on one worker). Each test process gets its own Ray temp dir (:func:`pytest_configure`),
so a ``ray.init()`` without an address never joins another worker's cluster, and the session set-ups that are
caches (the tiny models, verl 0.5.0) are built once under a file lock and shared by the workers
(:func:`built_once`).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
from filelock import FileLock
from mlflow.tracking import MlflowClient

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--time-record DIR``: where the time goes, by file, fixture set-up and subprocess (bench/test_time.py)."""
    parser.addoption("--time-record", metavar="DIR", default=None,
                     help="write wall and CPU seconds by file, fixture set-up and subprocess to DIR/<worker>.jsonl")


def pytest_configure(config: pytest.Config) -> None:
    """Give this test process (an xdist worker, or the one process without xdist) a Ray of its own, and OpenMP
    threads that yield the cores they do not use.

    Ray finds "the latest cluster started on this machine" through ``<RAY_TMPDIR>/ray/ray_current_cluster``, and
    verl's ``ray.init()`` joins it when there is no ``RAY_ADDRESS``: with one ``RAY_TMPDIR`` per worker (inherited by
    every subprocess a test starts) a worker's verl launch starts its own local cluster, and the clusters a worker
    starts on purpose are found by their explicit addresses only. Ray's token, made by the first cluster on a new
    machine, is made here once, before the workers start, so that two first clusters cannot write two tokens.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if config.getoption("--time-record"):
        from time_record import TimeRecorder

        config.pluginmanager.register(TimeRecorder(Path(config.getoption("--time-record"))), "time-record")
    # OpenMP threads that sleep when idle instead of spinning: the suite runs trainers, writers, servers and verl's
    # processes side by side on 2 cores all the time, and not every torch call in it follows the free cores as the
    # trainer's steps do (a step alone leaves the policy to OpenMP: verlflow.device.cpu_share). Read by libgomp
    # when torch loads, so set before any test runs.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.pop("RAY_ADDRESS", None)
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix=f"vfray-{worker}-", dir="/tmp")  # short: Ray's socket paths
    if worker == "main":
        _ray_token_made_once()


# What a fixture calls to open a tracking store (a SQLite file or a real server) for the test that uses it.
_STORE_MAKERS = ("fresh_store(", "isolated_store(", "serving(", "MlflowServer(")


def _opens_a_store(fixturedef) -> bool:
    try:
        source = inspect.getsource(fixturedef.func)
    except (OSError, TypeError):  # a fixture of pytest's own
        return False
    return any(maker in source for maker in _STORE_MAKERS)


def _imports_mlflow(item: pytest.Item) -> bool:
    """The test's module imports mlflow (or a name from it), or the test itself does."""
    if any(getattr(value, "__name__", "").startswith("mlflow") or getattr(value, "__module__", "").startswith("mlflow")
           for value in vars(item.module).values()):
        return True
    try:
        body = inspect.getsource(item.function)
    except (OSError, TypeError, AttributeError):
        return False
    return "import mlflow" in body or "from mlflow" in body


def slow_setup(func):
    """Mark a fixture as a set-up as slow as a slow test (a training, a session of steps on a server, a pip install):
    every test that uses it, directly or through another fixture, is marked ``slow`` at collection, so the
    change-by-change run (``-m "not slow"``) never pays for it. Put it under ``@pytest.fixture``."""
    func.slow_setup = True
    return func


# What a fixture calls to start a server (an ``mlflow server``, PostgreSQL): a set-up of seconds to tens of seconds.
_SERVER_STARTERS = ("serving(", "MlflowServer(", "pgserver.", "AuthServer(")


def _is_slow_setup(fixturedef) -> bool:
    """A fixture marked :func:`slow_setup`, or one that starts a server."""
    func = fixturedef.func
    if getattr(func, "slow_setup", False) or getattr(getattr(func, "__wrapped__", None), "slow_setup", False):
        return True
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):  # a fixture of pytest's own
        return False
    return any(starter in source for starter in _SERVER_STARTERS)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``mlflow_api`` each test that reaches MLflow's API: its module uses mlflow, or a fixture it uses opens a
    tracking store. scripts/test_lowest_mlflow.sh runs these again at the lowest MLflow verlflow supports.

    Mark ``slow`` each test that uses a :func:`slow_setup` fixture or a fixture that starts a server: the marker
    follows the set-up's cost, not only the test body's."""
    for item in items:
        fixturedefs = [d for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs] \
            if hasattr(item, "_fixtureinfo") else []
        if _imports_mlflow(item) or any(_opens_a_store(d) for d in fixturedefs):
            item.add_marker(pytest.mark.mlflow_api)
        if any(_is_slow_setup(d) for d in fixturedefs) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove this process's Ray temp dir (every cluster in it was stopped by the test that started it)."""
    folder = os.environ.get("RAY_TMPDIR", "")
    if Path(folder).name.startswith("vfray-"):
        shutil.rmtree(folder, ignore_errors=True)


def _ray_token_made_once() -> None:
    """Ray's token-auth key (``~/.ray/auth_token``), made now when missing (Ray makes it on a first start)."""
    try:
        from ray._private.authentication import authentication_token_setup as token_setup
    except ImportError:  # a Ray without token auth: nothing to share
        return
    if not token_setup._get_default_token_path().is_file():
        token_setup.generate_and_save_token()


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build) -> Path:
    """The folder ``name`` shared by every worker of this test session, made by ``build(folder)`` the first time.

    For session set-ups that are caches, read and never changed by the tests (a tiny model, a verl install): the
    first worker to ask builds it under a file lock while the other waits, then both use it. Without xdist the
    folder is in this session's temp root. A build that fails leaves no folder, so the next asker tries again.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' basetemps are siblings in the session's root
    folder = root / f"shared-{name}"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not folder.is_dir():
            staging = root / f".shared-{name}-building"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            build(staging)
            staging.rename(folder)
    return folder


@pytest.fixture
def fixtures_dir() -> Path:
    """tests/fixtures: real device samples, a real GSM8K slice and the reference guide (READMEs give sources)."""
    return FIXTURES


# An empty MLflow SQLite store made once per session (conftest._store_template); a test's store is a copy.
_TEMPLATE: dict[str, Path] = {}


def fresh_store(root: Path) -> str:
    """A new, empty MLflow SQLite store at ``root / "mlflow.db"``; returns its tracking URI.

    MLflow creates a store's tables through its schema migrations on first use, seconds each on 2 busy cores
    (tens under load), for every test. The store here is a file copy of one created that way once per session,
    with its Default experiment's artifacts in ``root / "mlruns"``: the same empty store, made in milliseconds.
    """
    return _store_copy(root / "mlflow.db", str(root / "mlruns" / "0"))


def _store_copy(target: Path, default_artifacts: str) -> str:
    """The session's empty store copied to ``target`` (unless it exists), its Default experiment's artifacts at
    ``default_artifacts``; returns its tracking URI."""
    template = _TEMPLATE.get("db")
    if template is not None and not target.exists():
        shutil.copyfile(template, target)
        with contextlib.closing(sqlite3.connect(target)) as db, db:
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (default_artifacts,))
    return f"sqlite:///{target}"


@contextlib.contextmanager
def _logging_kept(quiet: bool = True):
    """Logging as it was before the block: MLflow < 3.9 runs alembic's ``fileConfig`` when it creates a store's
    tables, which puts an INFO-level alembic logger and a stderr handler on the root logger for the rest of the
    session (every later store open then prints alembic lines into the output a test reads) and disables loggers.
    The store is made during the first test's set-up, whose captured output that test may read."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    loggers = {name: (lg.level, lg.disabled, list(lg.handlers), lg.propagate)
               for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    if quiet:
        logging.disable(logging.INFO)  # nor do its INFO lines land in the output the test reads
    try:
        yield
    finally:
        if quiet:
            logging.disable(logging.NOTSET)
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, lg in logging.Logger.manager.loggerDict.items():
            if not isinstance(lg, logging.Logger):
                continue
            if name in loggers:
                lg.level, lg.disabled, lg.handlers[:], lg.propagate = loggers[name]
            elif name.startswith(("alembic", "sqlalchemy")):
                lg.setLevel(logging.NOTSET)
                lg.handlers[:] = []


@pytest.fixture(autouse=True)
def _logging_of_each_test_its_own():
    """Undo, after each test, the logging set-up a store opened during it put in place (MLflow < 3.9, see
    :func:`_logging_kept`): its stderr handler would write into the next tests' closed capture streams."""
    with _logging_kept(quiet=False):
        yield


@pytest.fixture(scope="session", autouse=True)
def _store_template(tmp_path_factory) -> None:
    """Create the empty store :func:`fresh_store` copies: MLflow's own migrations, once per session."""
    folder = tmp_path_factory.mktemp("store-template")
    with _logging_kept():
        MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
    _TEMPLATE["db"] = folder / "mlflow.db"
    yield
    _TEMPLATE.clear()


@contextlib.contextmanager
def isolated_store(root: Path):
    """Work in ``root`` with MLflow (this process and its subprocesses) on a SQLite store there.

    For module-scoped stores: a test module may share one. No run or experiment of the surrounding environment
    is used (``MLFLOW_RUN_ID``, ``MLFLOW_EXPERIMENT_NAME`` unset), and a run left active is ended on the way out.
    """
    uri = fresh_store(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.delenv("MLFLOW_RUN_ID", raising=False)
        mp.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        mlflow.set_tracking_uri(uri)
        try:
            yield uri
        finally:
            while mlflow.active_run():
                mlflow.end_run()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def paused(pid: int):
    """Hold process ``pid`` still (SIGSTOP) for the block, and let it go on after (SIGCONT).

    For a fault injected mid-run (a server stopped, a writer killed): the run cannot finish its remaining steps
    while the fault is being set up, however fast the host, so the fault always lands while steps remain.
    """
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def process_running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie nobody has reaped yet has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # gone, or going while its stat is read
        return False


def _listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def file_size_limit(size: int):
    """Writes past ``size`` bytes fail with EFBIG in this process, as on a full disk, until the block ends (Python
    ignores SIGXFSZ, so the write fails instead of the process dying)."""
    import resource

    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def wait_until(condition, timeout_s: float, what: str, poll_s: float = 0.05, watch: Iterable[subprocess.Popen] = (),
               detail=None):
    """Poll ``condition`` until it returns something truthy, and return that; fail naming ``what`` after ``timeout_s``,
    or at once when a process in ``watch`` (one the condition depends on) has exited.

    For waits on something another thread or process does: the deadline is generous (for a loaded machine),
    the poll short, so the test goes on as soon as the condition holds instead of after a fixed sleep.
    ``detail()``, when given, is added to the failure (a log's tail, say).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        got = condition()
        if got:
            return got
        dead = [proc.args for proc in watch if proc.poll() is not None]
        more = f"\n{detail()}" if detail is not None and (dead or time.monotonic() > deadline) else ""
        if dead:
            pytest.fail(f"{what}: not before {dead} exited{more}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:.0f} s{more}")
        time.sleep(poll_s)


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


def _group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` still runs (zombies nobody has reaped yet have ended)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):  # gone while being read
            continue
        if state != "Z" and int(group) == pgid:
            return True
    return False


def stop_process_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """End a server started with ``start_new_session=True``: SIGTERM its group, SIGKILL it after ``grace_s``.

    Returns once every process of the group has ended, not only ``proc``: a server's children (``mlflow server``'s
    uvicorn) would otherwise go on answering on connections they hold after the test took the server as stopped.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (proc.poll() is None or _group_alive(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if proc.poll() is None or _group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_until(lambda: not _group_alive(proc.pid), 60, f"process group {proc.pid} gone after SIGKILL")


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch) -> str:
    """A real MLflow SQLite store in tmp_path, set for this process and for subprocesses."""
    uri = fresh_store(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    mlflow.set_tracking_uri(uri)
    # The store's tables now, in set-up: MLflow < 3.9's schema migration reconfigures the root logger (alembic's
    # fileConfig), which would drop the test's own log capture if it ran during the test. MLflow 3.5's table check
    # wants exactly its own list of tables, so it runs that migration (and prints about it) on every first open of a
    # store in a process, copies of the template included: kept out of the output the test reads.
    with _logging_kept():
        MlflowClient().search_experiments()
    yield uri
    while mlflow.active_run():
        mlflow.end_run()


@dataclass
class CliResult:
    """What a ``verlflow`` command did: its exit status and what it printed (as ``subprocess.run`` reports it)."""

    returncode: int
    stdout: str
    stderr: str


def cli_in_process(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> CliResult:
    """``verlflow ARGV`` run by ``cli.main`` in this process, as a new process would run it, without its start-up.

    For the tests of what a step does, not of the process around it (a signal, a hard death, ``mlflow run``'s
    launcher keep their real process): a new Python process costs seconds of imports (torch, verl, MLflow) on a
    busy 2-core host, this call milliseconds. ``env`` is the whole environment of the call (as ``subprocess.run``
    takes it; default: this process's), ``cwd`` its working directory (default: a new empty folder, so a step
    that falls back on ``./mlflow.db`` never writes one into the checkout); both, MLflow's tracking URI and active
    experiment are put back afterwards, and a run the step left active is ended. An exception no step turned
    into its line is printed as the process would (a traceback on stderr, exit 1).
    """
    import traceback

    import mlflow.tracking.fluent as fluent

    from verlflow import cli

    saved_env, saved_cwd, saved_experiment = dict(os.environ), os.getcwd(), fluent._active_experiment_id
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.chdir(cwd if cwd is not None else tempfile.mkdtemp(prefix="verlflow-cli-"))
        mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI"))
        fluent._active_experiment_id = None
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                cli.main(list(argv))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        while mlflow.active_run():
            mlflow.end_run()
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        mlflow.set_tracking_uri(saved_env.get("MLFLOW_TRACKING_URI"))
        fluent._active_experiment_id = saved_experiment
    return CliResult(code, stdout.getvalue(), stderr.getvalue())


@dataclass
class SmokeStore:
    """A tracking store holding two real tiny-recipe train runs that differ only in their CPU thread count."""

    tracking_uri: str
    run_ids: list[str]
    data_dir: Path
    workdir: Path
    cache: Path  # VERLFLOW_CACHE of the runs (the tiny model)


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> None:
    result = cli_in_process(args, env=env, cwd=cwd)
    if result.returncode != 0:
        raise RuntimeError(f"verlflow {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


@pytest.fixture(scope="session")
@slow_setup
def smoke_store(tmp_path_factory, tiny_workdir) -> SmokeStore:
    """Preprocess synthetic data, then train the tiny recipe twice on the cpu profile (1 and 2 threads).

    Built once per test session for both workers (:func:`built_once`; the CLI in process, half a minute on 2 cores)
    and shared by the tests that need finished train runs: registry, evaluate, compare. They only read it; a test
    that writes into a store works on a copy.
    """
    def build(marker: Path) -> None:
        # The store's paths (artifacts, data) are absolute: it is built where it stays, not in built_once's
        # staging folder; the marker folder (made last) says it is complete.
        workdir = marker.parent / "smoke-store"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME")}
        env["MLFLOW_TRACKING_URI"] = fresh_store(workdir)
        env["VERLFLOW_CACHE"] = str(tiny_workdir / "cache")
        data_dir = workdir / "data"
        _cli(["preprocess", "--source", "synthetic", "--output_dir", str(data_dir), "--limit", "64"], env, workdir)
        for threads in (1, 2):
            overrides = f"profile.env.OMP_NUM_THREADS={threads}"
            _cli(["train", "--recipe", "tiny", "--device", "cpu", "--data_dir", str(data_dir),
                  "--overrides", overrides], env, workdir)

    workdir = built_once(tmp_path_factory, "smoke-store-built", build).parent / "smoke-store"
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`verlflow.step` = 'train'", order_by=["attributes.start_time ASC"])
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    return SmokeStore(tracking_uri=uri, run_ids=[r.info.run_id for r in runs], data_dir=workdir / "data",
                      workdir=workdir, cache=tiny_workdir / "cache")


@pytest.fixture(scope="session")
@slow_setup
def warm_model_cache(tmp_path_factory) -> Path:
    """A verlflow cache holding the smoke recipe's warm-started tiny Qwen3, built once per test session.

    The tests of the recipe that learns (main, search) point ``VERLFLOW_CACHE`` here instead of paying the
    build (about a minute on 2 cores) each; the build itself is tested in tests/test_tiny_model_sft.py.
    """
    from verlflow.models.model_path import SFT_SENTINEL, resolve_model_path

    return built_once(tmp_path_factory, "verlflow-cache", lambda cache: resolve_model_path(SFT_SENTINEL, cache))


@pytest.fixture(scope="session")
@slow_setup
def tiny_chain(tmp_path_factory, tiny_workdir):
    """The tiny recipe's main → train → search → compare → register → evaluate → promote, run once per session on
    a real server that stays up (tests/tiny_chain.py); the tests of links, data defaults and conventions read it."""
    from tiny_chain import served_tiny_chain

    with served_tiny_chain(tmp_path_factory.mktemp("tiny-chain"), tiny_workdir / "cache") as chain:
        yield chain


# The verl the reference guide ran (its §6.1 stacks); the newest is the one installed in this environment.
GUIDE_VERL = "0.5.0"


@pytest.fixture(scope="session")
def guide_verl(request) -> Path:
    """verl 0.5.0 without dependencies in a cached folder (fails loudly when the registry is unreachable).

    Put it first on a subprocess's ``PYTHONPATH`` to run verlflow against the guide's verl.
    """
    target = Path(request.config.cache.mkdir(f"verl-{GUIDE_VERL}"))
    with FileLock(f"{target}.lock"):  # the xdist workers share pytest's cache folder
        if not (target / "verl" / "__init__.py").is_file():
            done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target",
                                   str(target), f"verl=={GUIDE_VERL}"], capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                pytest.fail(f"cannot install verl=={GUIDE_VERL} from the registry: {done.stderr[-1500:]}")
    return target


@pytest.fixture(scope="session")
def tiny_workdir(tmp_path_factory) -> Path:
    """A verlflow cache holding the tiny recipe's model (``cache``) and synthetic GSM8K parquet (``data``).

    Built once per session for the tests that train the tiny recipe in process; point ``VERLFLOW_CACHE`` at
    ``tiny_workdir / "cache"`` so the model is not built again.
    """
    from verlflow.data import gsm8k
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    def build(root: Path) -> None:
        resolve_model_path(TINY_SENTINEL, root / "cache")
        gsm8k.preprocess("synthetic", root / "data", 0, log_to_mlflow=False)

    return built_once(tmp_path_factory, "tiny-workdir", build)


def _served_store(path: Path) -> str:
    """The SQLite store a server in the tests starts on: a copy of the session's empty store (its tables made by
    MLflow's own migrations once), its Default experiment's artifacts where a server with proxied artifacts puts
    them. A server on a new file would run every migration at start, seconds on a busy host, for every server."""
    return _store_copy(path, "mlflow-artifacts:/0")


class MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 (SQLite backend, proxied artifacts, requests logged to ``log``) in its
    own process group, that can be stopped and started again on the same port and store.

    ``backend_store_uri`` replaces the SQLite file in ``root`` (a PostgreSQL database, say).
    """

    def __init__(self, root: Path, backend_store_uri: str | None = None):
        self.root, self.port = root, free_port()
        self.backend_store_uri = backend_store_uri or _served_store(root / "server.db")
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the server and wait until it answers; fail (leaving no server behind) when it never does."""
        cmd = [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port",
               str(self.port), "--workers", "1", "--backend-store-uri", self.backend_store_uri,
               "--artifacts-destination", str(self.root / "artifacts")]
        # No job runner: it starts eight more Python processes per server (MLflow's GenAI jobs), which no test uses
        # and which take the cores the tests' trainers need.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.root, env=env,
                                         start_new_session=True)
        if not wait_for_http(f"{self.url}/health", self.proc, timeout_s=120):
            self.stop()  # a server that never answered must not outlive the test
            pytest.fail(f"mlflow server did not start: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """Stop the server's whole process group, and return once its port refuses connections."""
        stop_process_group(self.proc)
        wait_until(lambda: not _listening(self.port), 60, f"port {self.port} closed after the server stopped")


def serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]):
    """A started :class:`MlflowServer` as this test's tracking URI (with ``env`` set), stopped afterwards.

    The body of a test module's ``server`` fixture: ``yield from serving(tmp_path, monkeypatch, {...})``.
    """
    server = MlflowServer(tmp_path)
    server.start()
    try:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
        mlflow.set_tracking_uri(server.url)
        yield server
    finally:
        while mlflow.active_run():
            mlflow.end_run()
        if server.proc.poll() is None:
            server.stop()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    """A real :class:`MlflowServer` shared by one test module's tests (started once: seconds each on a loaded host)."""
    server = MlflowServer(tmp_path_factory.mktemp("server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fault_proxy(module_server):
    """The module's server behind this test's own fault proxy (tests/fault_proxy.py: outages, hangs, slowness)."""
    from fault_proxy import FaultProxy

    proxy = FaultProxy(module_server.url).start()
    yield proxy
    proxy.stop()


# MLflow's HTTP client failing fast in this process: no retries (an outage is noticed at once), 30 s per request.
FAIL_FAST_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def tracking_at(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point this test's MLflow (the environment its child processes inherit, and this process's client) at
    ``url``, its HTTP failing fast (:data:`FAIL_FAST_HTTP`)."""
    for key, value in {**FAIL_FAST_HTTP, "MLFLOW_TRACKING_URI": url}.items():
        monkeypatch.setenv(key, value)
    mlflow.set_tracking_uri(url)


@pytest.fixture
def proxied_server(fault_proxy, monkeypatch):
    """This test's tracking URI is the fault proxy in front of the module's server: an outage is
    ``proxied_server.error_every = 1`` (every request answered 500), over with ``heal()``."""
    tracking_at(fault_proxy.url, monkeypatch)
    return fault_proxy


@contextlib.contextmanager
def local_ray(prefix: str):
    """Room for a local Ray cluster started by a test: ``(temp_dir, procs)``, torn down afterwards.

    Ray >= 2.5x starts a local head with token auth and its clients send the token only when told, so
    ``RAY_AUTH_MODE=token`` is set for this process (and restored after). ``temp_dir`` is short, as Ray's
    socket paths must stay < 108 characters. Every ``ray start --block`` process the caller appends to
    ``procs`` (started with ``start_new_session=True``) has its whole process group killed afterwards: Ray's
    daemons share it, and a graceful stop takes half a minute on 2 cores.
    """
    previous_auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "token"
    temp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    procs: list[subprocess.Popen] = []
    try:
        yield temp, procs
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)
        if previous_auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = previous_auth
