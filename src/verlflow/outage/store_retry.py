"""Writes to a tracking store shared by several processes ride out another writer's lock instead of failing.

    python -c "from verlflow.outage.store_retry import LockRetryingClient as C; print(C().search_experiments())"

SQLite lets one process write at a time. MLflow asks SQLite to wait for a lock up to 20 s
(``PRAGMA busy_timeout = 20000`` on every session, in ``mlflow/store/db/utils.py``; it replaces any
``?timeout=`` of the URI, and MLflow offers no setting for it), but two cases still end in
``database is locked``: a holder that keeps the lock longer (a nice-19 metric writer descheduled while
two trainers use the cores), and two transactions that both read and then want to write, where SQLite
refuses one at once instead of waiting (it would deadlock). Either way MLflow rolled the transaction
back, so the whole call can be made again: :func:`retry_on_lock` does that with back-off, for up to
``VERLFLOW_STORE_LOCK_WAIT_S`` seconds, and :class:`LockRetryingClient` is an ``MlflowClient`` whose
writes all do. Other errors (an outage, a bad request) are raised at once, as before.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from mlflow.tracking import MlflowClient

from verlflow.util import env_number, exception_chain, first_line, free_space

log = logging.getLogger(__name__)

LOCK_WAIT_S = env_number("VERLFLOW_STORE_LOCK_WAIT_S", 600.0, minimum=0)
_FIRST_PAUSE_S, _MAX_PAUSE_S = 0.05, 2.0
# SQLite's words for SQLITE_BUSY / SQLITE_LOCKED, as sqlite3 and MLflow's wrapper of it report them.
_LOCK_WORDS = ("database is locked", "database table is locked", "database schema is locked")
T = TypeVar("T")


def is_lock_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is SQLite refusing a lock another process holds."""
    return any(any(word in str(error).lower() for word in _LOCK_WORDS) for error in exception_chain(exc))


# SQLite's words for a write the disk refused (SQLITE_IOERR under a full disk or ``ulimit -f``, SQLITE_FULL).
_SPACE_WORDS = ("disk i/o error", "database or disk is full")


def store_write_failure(exc: BaseException) -> str | None:
    """One line for a SQLite tracking store that could not be written for space (its disk full, a file-size limit):
    the store's file and the free space there; None for any other error."""
    import mlflow

    current = next((error for error in exception_chain(exc)
                    if any(word in str(error).lower() for word in _SPACE_WORDS)), None)
    uri = mlflow.get_tracking_uri()
    if current is None or not uri.startswith("sqlite:///"):
        return None
    store = Path(uri.removeprefix("sqlite:///").split("?")[0]).absolute()
    return (f"the tracking store {store} could not be written ({first_line(current, 80)}; {free_space(store.parent)}): "
            "free space there (or raise the file-size limit, ulimit -f), or point MLFLOW_TRACKING_URI at a store on "
            "another disk, then run the step again")


# A database's words for an insert that met a row another writer inserted first (PostgreSQL, SQLite, MySQL).
_DUPLICATE_WORDS = ("duplicate key value violates unique constraint", "unique constraint failed", "duplicate entry")
# Writes that set a value by key, or link a row they create when missing (a dataset input: MLflow looks the dataset
# up, then inserts it): made again after another writer inserted the same key first, they update or link that row.
_KEYED_WRITES = ("set_tag", "set_experiment_tag", "set_model_version_tag", "set_registered_model_tag",
                 "log_inputs", "log_input")


def is_concurrent_insert(exc: BaseException) -> bool:
    """Whether ``exc`` is a store refusing an insert because another writer inserted the same key at the same time
    (MLflow's tag writes read, then insert: two workers tagging one model version race on Postgres)."""
    return any(any(word in str(error).lower() for word in _DUPLICATE_WORDS) for error in exception_chain(exc))


def retry_on_lock(call: Callable[..., T], *args: Any, wait_s: float | None = None, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, made again with growing pauses while it fails on a SQLite lock.

    Gives up after ``wait_s`` seconds (default ``VERLFLOW_STORE_LOCK_WAIT_S``) and raises the last lock
    error; any other error is raised at once.
    """
    def say() -> None:
        log.info("tracking store is locked by another process; %s waits for it", getattr(call, "__name__", "a write"))

    return _retried(lambda: call(*args, **kwargs), LOCK_WAIT_S if wait_s is None else wait_s, say)


def _retried(call: Callable[[], T], wait_s: float, say: Callable[[], None]) -> T:
    deadline = time.monotonic() + wait_s
    pause, said = _FIRST_PAUSE_S, False
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_lock_error(exc) or time.monotonic() + pause > deadline:
                raise
            if not said:
                say()
                said = True
        time.sleep(pause * (0.5 + random.random()))  # jitter: two waiting processes do not retry in step
        pause = min(pause * 2, _MAX_PAUSE_S)


@contextlib.contextmanager
def _migration_lines_dropped() -> Iterator[None]:
    """MLflow < 3.9 reruns its schema migrations at each first open of a store in a process and logs them at INFO
    (alembic): dropped while the step opens its store, before it has said anything of its own."""
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def open_store(uri: str, wait_s: float | None = None) -> None:
    """Open a SQLite tracking store and its model registry before a step uses them, waiting out another process's
    write lock with one line instead of failing: MLflow reads the store's tables when it first builds each (its
    ``_all_tables_exist``), outside any retry, and a lock held there was a traceback after ~10 s. MLflow keeps
    the stores it built, so the step's own calls find them open. Past the wait, one line (:class:`VerlflowError`).
    """
    from verlflow.errors import VerlflowError

    if not uri.startswith("sqlite:"):
        return
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    store = uri.removeprefix("sqlite:///").split("?")[0]

    def say() -> None:
        print(f"verlflow: the tracking store {store} is locked by another process: waiting for it (up to "
              f"{wait_s:g} s, VERLFLOW_STORE_LOCK_WAIT_S)", file=sys.stderr, flush=True)

    try:  # the client builds the tracking store, its first registry call the registry's
        with _migration_lines_dropped():
            _retried(lambda: MlflowClient(uri).search_experiments(max_results=1), wait_s, say)
            _retried(lambda: MlflowClient(uri).search_registered_models(max_results=1), wait_s, say)
    except Exception as exc:
        if not is_lock_error(exc):
            raise
        raise VerlflowError(f"the tracking store {store} stayed locked by another process for {wait_s:g} s "
                            "(VERLFLOW_STORE_LOCK_WAIT_S): end that process (verlflow runs lists a store's runs), "
                            "or raise the wait") from None


def retrying_on_lock(func: Callable[..., T]) -> Callable[..., T]:
    """Decorator form of :func:`retry_on_lock`; a keyed write (:data:`_KEYED_WRITES`) that lost an insert race to
    another writer is made once more, which then updates the row."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return retry_on_lock(func, *args, **kwargs)
        except Exception as exc:
            if func.__name__ not in _KEYED_WRITES or not is_concurrent_insert(exc):
                raise
        return retry_on_lock(func, *args, **kwargs)

    return wrapper


# MlflowClient's methods that write to the tracking store or the model registry.
WRITE_METHODS = (
    "create_run", "set_terminated", "update_run", "delete_run", "log_batch", "log_metric", "log_param",
    "set_tag", "delete_tag", "log_inputs", "create_experiment", "set_experiment_tag",
    "create_registered_model", "create_model_version", "set_registered_model_alias",
    "delete_registered_model_alias", "set_model_version_tag", "set_registered_model_tag",
)


class LockRetryingClient(MlflowClient):
    """An ``MlflowClient`` whose store writes (:data:`WRITE_METHODS`) wait out a SQLite lock."""


for _name in WRITE_METHODS:
    setattr(LockRetryingClient, _name, retrying_on_lock(getattr(MlflowClient, _name)))
