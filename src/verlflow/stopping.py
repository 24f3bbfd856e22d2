"""How this process stops on SIGINT/SIGTERM: one handler records the signal and sets :data:`STOP`.

- :func:`install` is the only place that sets a SIGINT/SIGTERM handler: the entry calls it from its first line
  (:mod:`verlflow.project_entry`), a block run without an entry through :func:`installed` (a run in a test, a
  script), and a library that replaced it (``ray.init`` sets ``sys.exit`` for SIGTERM) calls it again.
- The handler records every stop signal (:func:`received`) and sets :data:`STOP`. Inside :func:`checked` that is
  all it does: the block looks at :data:`STOP` at its own safe points (the verl launch's wait forwards the
  signal to verl, a node sampler stops, a run's end runs out its bounded tries). Elsewhere (the entry's
  imports, a step's code without safe points) the first signal raises :class:`RunInterrupted` where the main
  thread is; later ones are only recorded: a second Ctrl-C, or the launcher's SIGTERM after the terminal's
  SIGINT, arrives while the run ends, and raising again there cut its end short.
- :func:`stop_point` is a safe point: it raises :class:`RunInterrupted` once a stop has come (the trainer's step
  loop, the search's trial loop, the launch once verl has exited).

It imports only ``signal``, ``sys`` and ``threading`` at load, so an entry point has it before MLflow, torch or
verl start loading. :func:`stop_interrupted` is the exit of an interrupted step.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

STOPS = (signal.SIGINT, signal.SIGTERM)
STOP = threading.Event()  # set by the first stop signal; cleared only by the block that installed the handler
_received: list[int] = []  # every stop signal since the handler was installed, in order
_state = {"checked": 0, "raised": False}
# Called with (signum, frame) before a raise: True when it took the signal over (it will be raised later).
_defer: list[Callable[[int, object], bool]] = []


class RunInterrupted(KeyboardInterrupt):
    """A stop signal, raised in the main thread (a :class:`KeyboardInterrupt`, so a step's run ends KILLED)."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def install() -> None:
    """Make this module's handler the SIGINT/SIGTERM handler (again after a library replaced it)."""
    _set_handlers(dict.fromkeys(STOPS, _on_stop))


def is_installed() -> bool:
    """Whether this module's handler takes SIGINT and SIGTERM now."""
    return all(signal.getsignal(stop) is _on_stop for stop in STOPS)


def _set_handlers(handlers: dict) -> None:
    """The one place that sets a stop signal's handler: the main thread's (Python's rule)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for stop, handler in handlers.items():
        if signal.getsignal(stop) is not handler:
            signal.signal(stop, handler if handler is not None else signal.SIG_DFL)


def raise_stops_once() -> None:
    """The entry's first line: from now on a stop signal is this module's (see the module's docstring)."""
    install()


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The handler for the block's duration when no entry installed it (a run in a test or a script): the
    handlers before it come back afterwards and the block's stop is forgotten, so a process can stop again."""
    on_main = threading.current_thread() is threading.main_thread()
    previous = {stop: signal.getsignal(stop) for stop in STOPS} if on_main else {}
    owner = on_main and not any(handler is _on_stop for handler in previous.values())
    install()
    try:
        yield
    finally:
        if owner:
            _set_handlers(previous)
            reset()


@contextlib.contextmanager
def handlers_kept() -> Iterator[None]:
    """The stop signals' handlers as they were before the block, whatever a library in it installed (``ray.init``
    replaces SIGTERM's with ``sys.exit``, which would bypass verlflow's handling of a stopped run). Only the main
    thread may change a handler; elsewhere the block changes nothing."""
    on_main = threading.current_thread() is threading.main_thread()
    previous = {stop: signal.getsignal(stop) for stop in STOPS} if on_main else {}
    try:
        yield
    finally:
        _set_handlers(previous)


@contextlib.contextmanager
def sigint_ignored_by_children() -> Iterator[None]:
    """Children started in the block ignore SIGINT from their first instruction (an ignored signal stays ignored
    across exec, and Python then installs no KeyboardInterrupt handler): a Ctrl-C to the process group while a
    metric writer's interpreter was starting killed it with a traceback. A Ctrl-C to this process in the block is
    ignored too (the block only starts a process). Only the main thread may change a handler; elsewhere a no-op."""
    previous = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
    _set_handlers({signal.SIGINT: signal.SIG_IGN})
    try:
        yield
    finally:
        _set_handlers(previous)


def reset() -> None:
    """Forget the stop this process took (the block that installed the handler ended)."""
    STOP.clear()
    _received.clear()
    _state["raised"] = False


def received() -> list[int]:
    """The stop signals received so far, first first."""
    return list(_received)


def stop_signal() -> int | None:
    """The signal this process is stopping for, None while none came."""
    return _received[0] if _received else None


@contextlib.contextmanager
def checked() -> Iterator[None]:
    """A stop signal only sets :data:`STOP` while the block runs: the block checks it at its safe points, or is
    short and bounded (ending a run, the exit's one line)."""
    _state["checked"] += 1
    try:
        yield
    finally:
        _state["checked"] -= 1


def interrupted() -> RunInterrupted:
    """The :class:`RunInterrupted` for the stop that came, marked raised (a later signal raises nothing)."""
    _state["raised"] = True
    return RunInterrupted(stop_signal() or signal.SIGTERM)


def stop_point() -> None:
    """A safe point: raise :class:`RunInterrupted` when a stop has come."""
    if STOP.is_set():
        raise interrupted()


def raise_again() -> None:
    """The raise for this stop was lost (Python cannot raise in a finalizer): the next signal raises again."""
    _state["raised"] = False


@contextlib.contextmanager
def deferring(defer: Callable[[int, object], bool]) -> Iterator[None]:
    """``defer(signum, frame)`` is asked before each raise while the block runs; True: not raised now."""
    _defer.append(defer)
    try:
        yield
    finally:
        _defer.remove(defer)


def _on_stop(signum: int, frame) -> None:
    if not _received or _state["raised"] or _state["checked"]:
        _received.append(signum)  # a re-sent one (a deferral) is the same stop, not a second signal
    STOP.set()
    if _state["checked"] or _state["raised"]:
        return
    if any(defer(signum, frame) for defer in _defer):
        return
    raise interrupted()


def stop_interrupted(step: str, exc: KeyboardInterrupt) -> None:
    """Exit the interrupted ``step``: one line, the status a shell expects (128 + the signal), and, under ``mlflow
    run``, a watcher that ends the launcher's run KILLED if the step never did (:mod:`verlflow.runs.launcher_status`).
    Imports nothing that an interrupted import could have left half made."""
    signum = exc.signum if isinstance(getattr(exc, "signum", None), int) else signal.SIGINT
    _state["raised"] = True
    with checked():  # a second Ctrl-C meanwhile must not end this in a traceback
        from verlflow.processes import LAUNCHER_RUN_ID, watch_launcher

        watch_launcher(LAUNCHER_RUN_ID, interrupted_by=signal.Signals(signum).name)
    print(f"verlflow {step}: interrupted", file=sys.stderr)
    sys.exit(128 + signum)
