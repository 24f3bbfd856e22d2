"""This process's ``mlflow run`` launcher, and whether a process still runs, read from ``/proc``; no MLflow.

Kept free of heavy imports: a step interrupted while it still loads MLflow (:mod:`verlflow.project_entry`)
uses it to start the launcher watcher (:mod:`verlflow.process.launcher_status`) that ends the launcher's run KILLED.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# The launcher's run, as this process started (MLflow's end_run unsets MLFLOW_RUN_ID from the environment).
LAUNCHER_RUN_ID = os.environ.get("MLFLOW_RUN_ID")
_watching: set[str] = set()  # the runs this process has started a launcher watcher for
_ended: dict[str, str] = {}  # the launcher's run → the status this process ended it with


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux /proc), None when no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 of stat(5); the name before ')' may hold blanks


def process_alive(pid: int, start: str | None = None) -> bool:
    """Whether ``pid`` runs, and is still the process that started at ``start`` when that is given."""
    if Path("/proc").is_dir():
        current = process_start(pid)
        return current is not None and (start is None or current == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _is_mlflow_run(argv: list[str]) -> bool:
    """``…/mlflow run …`` or ``python -m mlflow run …``."""
    return any(os.path.basename(arg) == "mlflow" and argv[i + 1:i + 2] == ["run"] for i, arg in enumerate(argv))


def find_launcher(max_depth: int = 3) -> int | None:
    """The pid of the ``mlflow run`` process this one was started by (through a shell), if any."""
    pid = os.getpid()
    for _ in range(max_depth):
        parent = _parent(pid)
        if not parent or parent <= 1:
            return None
        if _is_mlflow_run(_cmdline(parent)):
            return parent
        pid = parent
    return None


# MLflow's launcher ends its run with ``_maybe_set_run_terminated(run, "FAILED")`` (mlflow/projects/__init__.py),
# which asks ``RunStatus.is_terminated`` about the run's status *string* where it takes the enum's number, so it
# always overwrites: a run the step ended KILLED turns FAILED. Checked present in MLflow 3.5.1 and 3.17.2 (every
# version pyproject.toml admits); re-check when raising MLflow's cap, and move this bound to the first fixed one.
LAUNCHER_BUG_BELOW = (3, 18)


def launcher_overwrites_end(mlflow_version: str | None = None) -> bool:
    """Whether this MLflow's ``mlflow run`` launcher turns a run the step ended KILLED into FAILED (the bug above);
    an MLflow whose version cannot be read is taken to have it."""
    if mlflow_version is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            mlflow_version = version("mlflow")
        except PackageNotFoundError:
            return True
    try:
        major, minor = (int(part) for part in mlflow_version.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) < LAUNCHER_BUG_BELOW


def watch_launcher(run_id: str | None, *, interrupted_by: str | None = None) -> bool:
    """Leave a watcher (:mod:`verlflow.process.launcher_status`) that keeps the step's end of ``run_id`` (KILLED, or
    FINISHED: :func:`launcher_run_ended`) past the ``mlflow run`` launcher's FAILED (:func:`launcher_overwrites_end`),
    when ``run_id`` is that launcher's run; once per run. ``interrupted_by`` (a signal name): the step stopped before
    it ended the run itself, so the watcher ends it KILLED (whatever the MLflow: the launcher leaves such a run FAILED
    with no reason, or RUNNING)."""
    argv = _watcher_argv(run_id, interrupted_by)
    if argv is None:
        return False
    _start_watcher(run_id, argv)
    return True


def _watcher_argv(run_id: str | None, interrupted_by: str | None) -> list[str] | None:
    """The watcher's command for ``run_id``, None when no watcher is to be left (:func:`watch_launcher`)."""
    if not run_id or run_id != LAUNCHER_RUN_ID or run_id in _watching:
        return None
    if interrupted_by is None and not launcher_overwrites_end():
        return None
    launcher = find_launcher()
    if launcher is None:
        return None
    return [sys.executable, "-m", "verlflow.process.launcher_status", run_id, str(launcher),
            process_start(launcher) or "", *(["--interrupted", interrupted_by] if interrupted_by else []),
            *(["--ended", _ended[run_id]] if run_id in _ended else [])]


def _start_watcher(run_id: str, argv: list[str]) -> None:
    if run_id in _watching:
        return
    subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, close_fds=True)
    _watching.add(run_id)


def launcher_run_ended(run_id: str, status: str) -> None:
    """Note that this step ended ``run_id`` with ``status`` when it is the launcher's run: a watcher left after a
    signal then puts that end back over the launcher's FAILED (:mod:`verlflow.process.launcher_status`)."""
    if run_id == LAUNCHER_RUN_ID:
        _ended[run_id] = status


def watch_after_end() -> Callable[[], None] | None:
    """What a stop signal after the step's last safe point must do, made ready now (the step is then exiting, with
    nothing left that ends a run): when the step ended the launcher's run FINISHED, start the watcher that keeps
    it FINISHED past the launcher's FAILED, which the same Ctrl-C brings. None when there is nothing to keep."""
    if LAUNCHER_RUN_ID is None or _ended.get(LAUNCHER_RUN_ID) != "FINISHED":
        return None
    argv = _watcher_argv(LAUNCHER_RUN_ID, None)
    return None if argv is None else functools.partial(_start_watcher, LAUNCHER_RUN_ID, argv)
