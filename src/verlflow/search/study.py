"""The Optuna side of a search: storage with heartbeats, a per-trial seeded sampler, pruners, the study.

    python -c "from verlflow.search.study import open_storage as o; print(o('', 'demo', 30, 120, 2))"

Storage (``-P storage=``):

| value                          | storage                                                           |
| ------------------------------ | ----------------------------------------------------------------- |
| '' (default)                   | journal file ``optuna/<study>.journal`` in the working directory  |
| a file path                    | that journal file (shared folder = several workers, one machine or NFS) |
| ``postgresql://…``, any RDB URL | Optuna's RDBStorage (PostgreSQL for workers on several machines)  |

SQLite (``sqlite:///…``) works for one worker only: it locks under parallel writers. Both kinds record a
heartbeat for each running trial; a trial whose worker died (no heartbeat for ``grace_period`` seconds)
is marked failed by the next worker that starts a trial, its MLflow runs are closed, and its params are
queued again (Optuna's retry callback). Both also record each trial's worker (host, pid, process start): a
trial whose worker ran on this host and is gone (a search SIGKILLed and resumed at once) is failed the same way
without waiting for the grace period.
Optuna's journal storage has no heartbeat of its own:
:class:`HeartbeatJournalStorage` adds one, stored as a trial system attribute.
"""

from __future__ import annotations

import logging
import os
import random
import re
import socket
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.samplers import BaseSampler, TPESampler
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from verlflow.compat import optuna as compat_optuna
from verlflow.compat.optuna import BaseHeartbeat  # Optuna's private heartbeat base (see compat.optuna)
from verlflow.errors import VerlflowError
from verlflow.names import SPACE_TAG
from verlflow.outage.store_retry import LockRetryingClient
from verlflow.processes import process_alive, process_start
from verlflow.search.journal_repair import set_aside_torn_tail
from verlflow.search.storage_url import storage_url_with_password
from verlflow.tracking import writes
from verlflow.util import first_line

log = logging.getLogger(__name__)

HEARTBEAT_ATTR = "verlflow:heartbeat"
WORKER_ATTR = "verlflow:worker"
# Trial user attributes that tie an Optuna trial to its MLflow runs.
RUN_ID_ATTR = "mlflow_run_id"
PARENT_RUN_ID_ATTR = "mlflow_parent_run_id"
DEFAULT_JOURNAL_DIR = "optuna"


class _StoppedTrialLine(logging.Filter):
    """Optuna's record of a trial the search's own stop ended (SIGTERM / SIGINT reach the objective as
    :class:`~verlflow.stopping.RunInterrupted`, a ``KeyboardInterrupt``) kept as its one line, without the traceback
    of where the stop was taken: the step's own line says it was interrupted."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_stopped_trials() -> None:
    """Put :class:`_StoppedTrialLine` on Optuna's optimize-loop logger (idempotent)."""
    logger = logging.getLogger(compat_optuna.OPTIMIZE_LOGGER)
    if not any(isinstance(f, _StoppedTrialLine) for f in logger.filters):
        logger.addFilter(_StoppedTrialLine())


def _retry_callback(max_retry: int):
    """Optuna's retry-on-stale-heartbeat callback (renamed in Optuna 4.9; both names work)."""
    retry_cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry_cls is None:
        retry_cls = optuna.storages.RetryFailedTrialCallback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return retry_cls(max_retry=max_retry)


class StaleTrialHandler:
    """Called for each trial whose worker died: close its MLflow runs, then queue its params again."""

    def __init__(self, max_retry: int, grace_period: int):
        self._retry = _retry_callback(max_retry)
        self._grace_period = grace_period

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Mark the lost trial's child run failed (parent run killed) when still RUNNING, and retry it."""
        reason = f"worker lost: no heartbeat for {self._grace_period} s (trial {trial.number} retried)"
        log.warning("search: trial %d of study %s lost its worker; failing and retrying it",
                    trial.number, study.study_name)
        client = LockRetryingClient()
        for attr, status in ((RUN_ID_ATTR, "FAILED"), (PARENT_RUN_ID_ATTR, "KILLED")):
            run_id = trial.user_attrs.get(attr)
            if not run_id:
                continue
            writes.end_lost_run(client, run_id, status, reason,
                                mark={"optuna.state": "FAIL"} if attr == RUN_ID_ATTR else {})
        self._retry(study, trial)


def _this_worker() -> str:
    """This process as a trial's worker: ``host pid start`` (the start tells a reused pid)."""
    return f"{socket.gethostname()} {os.getpid()} {process_start(os.getpid())}"


def _worker_gone(worker: str | None) -> bool:
    """Whether the worker recorded on a trial ran on this host and no longer does."""
    if not worker:
        return False
    host, pid, start = (worker.split(" ") + ["", "", ""])[:3]
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    return not process_alive(int(pid), None if start == "None" else start)


def _gone_workers_trials(storage: BaseStorage, study_id: int) -> list[int]:
    """RUNNING trials of the study whose recorded worker ran on this host and is gone."""
    running = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
    return [compat_optuna.trial_id(trial) for trial in running if _worker_gone(trial.system_attrs.get(WORKER_ATTR))]


class HeartbeatRDBStorage(RDBStorage):
    """Optuna's RDBStorage whose trials also record their worker, so a trial of a search killed and resumed at
    once is failed by the resumed search, not only once its heartbeat is older than the grace period."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._stamped: set[int] = set()  # trials whose worker this process has recorded

    def record_heartbeat(self, trial_id: int) -> None:
        """Optuna's heartbeat, and on the first beat the worker (host, pid, process start) as a system attr."""
        if trial_id not in self._stamped:
            self.set_trial_system_attr(trial_id, WORKER_ATTR, _this_worker())
            self._stamped.add(trial_id)
        super().record_heartbeat(trial_id)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        """Optuna's stale trials (no heartbeat for the grace period) and those whose worker on this host is gone."""
        stale = compat_optuna.rdb_stale_trial_ids(self, study_id)
        return stale + [t for t in _gone_workers_trials(self, study_id) if t not in stale]


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """Optuna's journal storage with heartbeats, so trials of a killed worker are found and retried."""

    def __init__(self, path: str, heartbeat_interval: int, grace_period: int,
                 stale_callback: Callable[[optuna.Study, FrozenTrial], None] | None):
        super().__init__(JournalFileBackend(path))
        self.path = path
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self._stale_callback = stale_callback
        self._stamped: set[int] = set()  # trials whose worker this process has recorded

    def record_heartbeat(self, trial_id: int) -> None:
        """Stamp the trial with the current time (called every ``heartbeat_interval`` s while it runs), and with
        the worker running it on its first beat (host, pid, process start), so a dead worker is seen at once."""
        if trial_id not in self._stamped:
            self.set_trial_system_attr(trial_id, WORKER_ATTR, _this_worker())
            self._stamped.add(trial_id)
        self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        """RUNNING trials without a heartbeat for ``grace_period`` s, or whose worker on this host is gone (a
        search killed and resumed at once: before, its trial stayed RUNNING for good when the resumed search
        ended within the grace period)."""
        now = time.time()
        stale = []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = trial.system_attrs.get(HEARTBEAT_ATTR)
            if beat is None and trial.datetime_start is not None:
                beat = trial.datetime_start.timestamp()
            if (beat is not None and now - float(beat) > self.grace_period) or _worker_gone(
                    trial.system_attrs.get(WORKER_ATTR)):
                stale.append(self.get_trial_id_from_study_id_trial_number(study_id, trial.number))
        return stale

    def get_heartbeat_interval(self) -> int | None:
        """Seconds between heartbeats."""
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        """What runs for each stale trial once it is failed (retry)."""
        return self._stale_callback

    # Optuna < 4.9 asks for the callback under this name.
    def get_failed_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        """What runs for each stale trial once it is failed (retry), Optuna < 4.9 name."""
        return self._stale_callback


def default_journal_path(study_name: str, workdir: Path | None = None) -> Path:
    """Where the default storage of a study lives: ``optuna/<study>.journal`` under the working directory."""
    return (workdir or Path.cwd()) / DEFAULT_JOURNAL_DIR / f"{study_name}.journal"


def is_rdb_url(storage: str) -> bool:
    """Whether a storage value is a database URL (``dialect[+driver]://…``) rather than a journal file."""
    return "://" in storage


def describe_storage(storage: str, study_name: str) -> str:
    """The storage as shown in tags and logs: the journal path, or the URL with its password hidden."""
    if not storage:
        return str(default_journal_path(study_name))
    if is_rdb_url(storage):
        from sqlalchemy.engine import make_url

        try:
            return make_url(storage).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - an unparsable URL is reported by open_storage
            return storage.split("@")[-1]
    return str(Path(storage).resolve())


def open_storage(storage: str, study_name: str, heartbeat_interval: int, grace_period: int,
                 max_retry: int) -> BaseStorage:
    """Open the study's storage (see the module table) with heartbeats and retry of lost trials."""
    handler = StaleTrialHandler(max_retry, grace_period)
    if not is_rdb_url(storage):
        path = Path(storage) if storage else default_journal_path(study_name)
        if path.is_dir():
            raise VerlflowError(f"storage '{storage}' is a folder: give a journal file path "
                                f"(e.g. {path}/study.journal)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            set_aside_torn_tail(path)  # a worker killed mid-write: resume from the operations before it
            return HeartbeatJournalStorage(str(path), heartbeat_interval, grace_period, handler)
        except OSError as exc:  # a read-only file system, no permission, a file where a folder should be
            raise VerlflowError(f"storage '{path}' cannot be written ({exc.strerror or first_line(exc)}): give "
                                "a journal file path in a writable folder") from None
    if storage.startswith("sqlite"):
        log.warning("search: SQLite storage serves one worker; use a journal file or PostgreSQL for several")
    kwargs: dict[str, Any] = {"heartbeat_interval": heartbeat_interval, "grace_period": grace_period}
    if storage.startswith(("postgresql", "mysql")):  # both drivers take connect_timeout in seconds
        kwargs["engine_kwargs"] = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    import inspect

    if "heartbeat_stale_trial_callback" in inspect.signature(RDBStorage).parameters:
        kwargs["heartbeat_stale_trial_callback"] = handler
    else:
        kwargs["failed_trial_callback"] = handler
    try:
        return _rdb_storage(storage_url_with_password(storage), kwargs)
    except ImportError as exc:
        raise VerlflowError(f"storage '{describe_storage(storage, study_name)}' needs a database driver: "
                            f"{exc} (PostgreSQL: pip install psycopg2-binary)") from None
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's errors for a bad URL or an unreachable server
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        shown = describe_storage(storage, study_name)
        raise VerlflowError(f"cannot open storage '{shown}': {first}") from None


# What two workers creating Optuna's tables at once see; only these are retried.
_RACE = re.compile(r"already exists|duplicate|unique constraint|database is locked", re.IGNORECASE)
# Seconds a database server may take to accept a connection (the OS default is over two minutes).
CONNECT_TIMEOUT_S = 10


def _rdb_storage(url: str, kwargs: dict[str, Any], attempts: int = 3) -> HeartbeatRDBStorage:
    """Open an RDB storage; retried a few times because workers that start together on a fresh database race
    to create Optuna's tables (one sees "already exists" while the other's CREATE commits). The last
    attempt's error (and a missing driver's at once) is the caller's to report."""

    def attempt() -> HeartbeatRDBStorage:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return HeartbeatRDBStorage(url, **kwargs)

    for _ in range(attempts - 1):
        try:
            return attempt()
        except ImportError:
            raise
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy's errors of a racing schema creation, among others
            if not _RACE.search(str(exc)):
                raise  # a wrong path, host or login does not get better by waiting
            time.sleep(1.0 + random.random())
    return attempt()


class TrialSeededSampler(BaseSampler):
    """TPE whose random draws for trial k are seeded with ``seed + k``.

    A single seeded TPESampler makes every worker of a parallel study draw the *same* startup points
    (each worker holds its own copy of the seed). Seeding by trial number keeps a search reproducible
    and makes concurrent trials distinct. ``constant_liar`` lets TPE account for running trials.
    """

    def __init__(self, seed: int, n_startup_trials: int):
        self._seed = seed
        self._n_startup_trials = n_startup_trials
        self._by_trial: dict[int, TPESampler] = {}

    def _tpe(self, trial: FrozenTrial) -> TPESampler:
        sampler = self._by_trial.get(trial.number)
        if sampler is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                sampler = TPESampler(seed=self._seed + trial.number, n_startup_trials=self._n_startup_trials,
                                     constant_liar=True)
            self._by_trial[trial.number] = sampler
        return sampler

    def infer_relative_search_space(self, study, trial):
        """TPE's relative space (empty: TPE samples independently unless multivariate)."""
        return self._tpe(trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        """TPE's relative sample for this trial."""
        return self._tpe(trial).sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        """TPE's draw for one parameter, from this trial's seeded generator."""
        return self._tpe(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial):
        """Create the trial's seeded TPE."""
        self._tpe(trial).before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        """Let TPE see the result, then drop the trial's sampler."""
        self._tpe(trial).after_trial(study, trial, state, values)
        self._by_trial.pop(trial.number, None)

    def reseed_rng(self) -> None:
        """Nothing to reseed: every trial's generator is seeded from its number."""


def make_pruner(name: str, settings: dict[str, dict[str, Any]]) -> optuna.pruners.BasePruner:
    """Optuna's MedianPruner, HyperbandPruner or NopPruner, with the search config's settings."""
    try:
        if name == "median":
            return optuna.pruners.MedianPruner(**settings.get("median", {}))
        if name == "hyperband":
            return optuna.pruners.HyperbandPruner(**settings.get("hyperband", {}))
    except (TypeError, ValueError) as exc:
        raise VerlflowError(f"pruner '{name}' rejects its settings in the search config: {exc}") from None
    if name == "none":
        return optuna.pruners.NopPruner()
    raise VerlflowError(f"unknown pruner '{name}': use median, hyperband or none")


def open_study(*, study_name: str, storage: BaseStorage, direction: str, sampler: BaseSampler,
               pruner: optuna.pruners.BasePruner, identity: dict[str, str]) -> optuna.Study:
    """Create the study, or load it when it exists (same name = resume), refusing a different search.

    ``identity`` (recipe, objective metric, space fingerprint) is stored on the study when it is created;
    a worker that brings other values gets one line instead of a study mixing two searches.
    """
    try:
        study = optuna.create_study(study_name=study_name, storage=storage, sampler=sampler, pruner=pruner,
                                    direction=direction, load_if_exists=True)
    except ValueError as exc:
        raise VerlflowError(f"study '{study_name}' cannot be resumed as asked: {exc}") from None
    if study.direction.name.lower() != direction:
        raise VerlflowError(f"study '{study_name}' was created to {study.direction.name.lower()}, not to "
                            f"{direction}: give another study_name")
    existing = study.user_attrs
    for key, value in identity.items():
        if key not in existing:
            study.set_user_attr(key, value)
        elif existing[key] != value:
            what = "search space" if key == SPACE_TAG else key
            raise VerlflowError(f"study '{study_name}' was created with another {what} "
                                f"({str(existing[key])[:80]}): give another study_name to start a new study")
    return study
