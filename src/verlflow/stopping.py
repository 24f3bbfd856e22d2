"""How this process stops on SIGINT/SIGTERM: a stop is an event, checked at safe points.

The contract:

- :func:`install` is the only place that sets a SIGINT/SIGTERM handler: the entry (:mod:`verlflow.project_entry`)
  through :func:`raising_while_loading`, a block run without an entry through :func:`installed` (a step under the
  console script, a run in a test or a script), and a library that replaced it (``ray.init`` sets ``sys.exit`` for
  SIGTERM) is undone by :func:`handlers_kept`. Any other handler a process needs (the metric writer's child) is set
  here too, through :func:`set_handlers`.
- The handler records the signal (:func:`received`) and sets :data:`STOP`. It never raises, except while the entry
  imports (:func:`raising_while_loading`: MLflow, torch and verl take seconds to load and have no safe point): there
  the first signal raises :class:`RunInterrupted`, once.
- Every long-running place checks :data:`STOP` at its safe points and ends there: :func:`stop_point` raises
  :class:`RunInterrupted` in verlflow's own code, between library calls, so the run it is in ends KILLED
  (:func:`verlflow.tracking.tracking.tracked_run`). Safe points: the trainer's step loop and its sampling per token,
  evaluate per batch and per generated token, the search's trial loop, the verl launch's and Ray job's waits (which
  pass the signal on to verl first), promote's rounds, the end of every run's body and of every step. A blocking
  call in between (a store request, a model load) is bounded by its own timeout, never interrupted from outside, so
  a stop never lands inside SQLAlchemy, a finalizer or a library's logging.
- The end of a stopped run is short and bounded (one try at the server, see :mod:`verlflow.tracking.tracking`); a second
  signal meanwhile is only recorded.
- After the step's last safe point nothing checks :data:`STOP`: a stop then runs, in the handler, the one action the
  step left for it (:func:`after_last_safe_point`: the watcher that keeps a finished run FINISHED past ``mlflow
  run``'s launcher, which the same Ctrl-C makes mark it FAILED).

It imports only ``os``, ``signal``, ``sys`` and ``threading`` at load, so an entry point has it before MLflow, torch or
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
_state = {"raising": False}  # True only while the entry imports (raising_while_loading)
_safe_point_hooks: list[Callable[[], bool]] = []  # called at each safe point until each returns True
_stand: list[str] = []  # where the stopped work stands (its last checkpoint, or why none): the stop line's end
_after_end: list = []  # what a stop after the step's last safe point runs, once (after_last_safe_point)


class RunInterrupted(KeyboardInterrupt):
    """A stop, raised at a safe point (a :class:`KeyboardInterrupt`, so a step's run ends KILLED)."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def install() -> None:
    """Make this module's handler the SIGINT/SIGTERM handler (again after a library replaced it)."""
    set_handlers(dict.fromkeys(STOPS, _on_stop))


def is_installed() -> bool:
    """Whether this module's handler takes SIGINT and SIGTERM now."""
    return all(signal.getsignal(stop) is _on_stop for stop in STOPS)


def set_handlers(handlers: dict) -> None:
    """The one place that sets a signal's handler (None: the default); only the main thread may (Python's rule),
    elsewhere nothing changes. Used by :func:`install` and by a child process with its own (the metric writer)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, handler in handlers.items():
        if signal.getsignal(signum) is not handler:
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def raising_while_loading() -> Iterator[None]:
    """The entry's first block: the handler is installed and the first stop signal in the block raises
    :class:`RunInterrupted` (the step's imports have no safe point). Once the block is left it never raises."""
    install()
    _state["raising"] = True
    try:
        yield
    finally:
        _state["raising"] = False


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
            set_handlers(previous)
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
        set_handlers(previous)


@contextlib.contextmanager
def sigint_held_for_children() -> Iterator[None]:
    """Children started in the block begin with SIGINT blocked: a Ctrl-C to the process group while a child's
    interpreter starts stays pending in it until the child sets its own disposition (:func:`ignore_held_sigint`)
    instead of killing it with a traceback. This thread holds SIGINT only until the block ends, so a Ctrl-C
    meanwhile still reaches the step's handler (an ignored one was lost: the step trained on until the launcher's
    SIGTERM). A helper process that the start itself launches and that unblocks SIGINT as it does
    (multiprocessing's resource tracker) must be running before the block. No-op where there is no signal mask."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_child(process) -> None:
    """Start the multiprocessing ``process`` with SIGINT held (:func:`sigint_held_for_children`); its target calls
    :func:`ignore_held_sigint` first. multiprocessing's resource tracker is started before the block: the first
    spawn starts it, and it unblocks SIGINT in this thread as it does."""
    import multiprocessing.resource_tracker

    multiprocessing.resource_tracker.ensure_running()
    with sigint_held_for_children():
        process.start()


def ignore_held_sigint() -> None:
    """A child of :func:`sigint_held_for_children` ignores SIGINT from here on, a Ctrl-C held since its start
    included (setting SIG_IGN discards a pending one), and stops holding it."""
    set_handlers({signal.SIGINT: signal.SIG_IGN})
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def reset() -> None:
    """Forget the stop this process took (the block that installed the handler ended)."""
    STOP.clear()
    _received.clear()
    _after_end.clear()


def after_last_safe_point(action) -> None:
    """The step has passed its last safe point (it only exits from here): a stop signal now runs ``action()`` once,
    in the handler, instead of waiting for a safe point that never comes. A stop already taken is the caller's next
    :func:`stop_point`'s. ``action`` is short and made ready beforehand (it starts a process, nothing more)."""
    _after_end[:] = [action]


def received() -> list[int]:
    """The stop signals received so far, first first."""
    return list(_received)


def stop_signal() -> int | None:
    """The signal this process is stopping for, None while none came."""
    return _received[0] if _received else None


def interrupted() -> RunInterrupted:
    """The :class:`RunInterrupted` for the stop that came (SIGTERM when :data:`STOP` was set without a signal)."""
    return RunInterrupted(stop_signal() or signal.SIGTERM)


def tell_stand(text: str | None) -> None:
    """Say where the work being stopped stands, for the step's stop line (:func:`stop_interrupted`): its last
    checkpoint and how to continue after it, or that it has none and why. ``None`` forgets it (a step starts)."""
    _stand[:] = [text] if text else []


def stop_point() -> None:
    """A safe point: raise :class:`RunInterrupted` when a stop has come (the run ends KILLED)."""
    for hook in list(_safe_point_hooks):
        if hook():
            _safe_point_hooks.remove(hook)
    if STOP.is_set():
        raise interrupted()


def on_safe_point(hook: Callable[[], bool]) -> None:
    """Call ``hook()`` at each safe point (:func:`stop_point`) until it returns True: for a harness that must act
    where a step can stop cleanly (the tests suffer their real faults there, tests/fault_cli.py)."""
    _safe_point_hooks.append(hook)


def _on_stop(signum: int, frame) -> None:
    _received.append(signum)
    STOP.set()
    if _state["raising"]:  # the entry still imports: only there, and only the first signal, raises
        _state["raising"] = False
        raise RunInterrupted(signum)
    while _after_end:
        action = _after_end.pop()
        with contextlib.suppress(Exception):  # a handler never raises into the code it interrupted (a fork refused)
            action()


def stop_interrupted(step: str, exc: KeyboardInterrupt) -> None:
    """Exit the interrupted ``step``: one line (with where its work stands, :func:`tell_stand`), the status a shell
    expects (128 + the signal), and, under ``mlflow run``, a watcher that ends the launcher's run KILLED if the step
    never did (:mod:`verlflow.process.launcher_status`). Imports nothing that an interrupted import could have left
    half made."""
    signum = exc.signum if isinstance(getattr(exc, "signum", None), int) else signal.SIGINT
    _state["raising"] = False
    from verlflow.processes import LAUNCHER_RUN_ID, watch_launcher

    watch_launcher(LAUNCHER_RUN_ID, interrupted_by=signal.Signals(signum).name)
    stand = f"; {_stand.pop()}" if _stand else ""
    print(f"verlflow {step}: interrupted{stand}", file=sys.stderr)
    sys.exit(128 + signum)
