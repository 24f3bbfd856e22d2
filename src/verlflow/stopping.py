"""How a step stops on SIGINT/SIGTERM outside its run: once, in one line, with ``mlflow run``'s run ended KILLED.

The step's run itself stops through :func:`verlflow.runs.tracking.signals_raise`; this module covers the rest of
the process, from its first line (:mod:`verlflow.project_entry`) to its exit (``verlflow.cli.main``). It imports
only ``signal`` and ``sys`` at load, so an entry point has it before MLflow, torch or verl start loading.
"""

from __future__ import annotations

import signal
import sys


def raise_stops_once() -> None:
    """From now on the first SIGINT or SIGTERM raises ``KeyboardInterrupt`` (with its ``signum``); later ones are
    ignored. MLflow's launcher answers a Ctrl-C with a SIGTERM to the step right after it, and the default SIGTERM
    killed the step mid-import with nothing said and the run left as the launcher left it."""
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, _raise_once)


_stopped: list[int] = []  # the stop signal this process took, here or in the step's own handler


def note_stopping(signum: int) -> None:
    """The step's own handler (``verlflow.runs.tracking.signals_raise``) took a stop signal: one that arrives after
    it gave its handlers back (the step's exit) is not raised again, as that handler would not either."""
    _stopped.append(signum)


def _raise_once(signum: int, _frame) -> None:
    if _stopped:
        return
    _stopped.append(signum)
    interrupt = KeyboardInterrupt(f"interrupted by {signal.Signals(signum).name}")
    interrupt.signum = signum
    raise interrupt


def stop_interrupted(step: str, exc: KeyboardInterrupt) -> None:
    """Exit the interrupted ``step``: one line, the status a shell expects (128 + the signal), and, under ``mlflow
    run``, a watcher that ends the launcher's run KILLED if the step never did (:mod:`verlflow.runs.launcher_status`).
    Imports nothing that an interrupted import could have left half made."""
    signum = exc.signum if isinstance(getattr(exc, "signum", None), int) else signal.SIGINT
    previous = {stop: signal.signal(stop, signal.SIG_IGN) for stop in (signal.SIGINT, signal.SIGTERM)}
    try:  # a second Ctrl-C meanwhile must not end this in a traceback
        from verlflow.processes import LAUNCHER_RUN_ID, watch_launcher

        watch_launcher(LAUNCHER_RUN_ID, interrupted_by=signal.Signals(signum).name)
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
    print(f"verlflow {step}: interrupted", file=sys.stderr)
    sys.exit(128 + signum)
