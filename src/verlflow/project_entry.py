"""What the MLproject's entry-point files call: ``verlflow.cli.main``, with Ctrl-C covered from the first line.

    mlflow run . --env-manager local -e train     # entry_points/train.py → main(["train", ...])

The step's own imports (MLflow, torch, verl) take a second or two, and a Ctrl-C to ``mlflow run``'s process
group in that window raised ``KeyboardInterrupt`` out of ``import verlflow.cli``: a traceback, and the run
the launcher had opened left to its FAILED. This module imports nothing heavy itself, so it can catch that
interrupt and end the launcher's run KILLED, as an interrupt anywhere later does.
"""

from __future__ import annotations

import signal
import sys


def main(argv: list[str]) -> None:
    """Run the step ``argv[0]`` as ``verlflow <step> …`` does; an interrupt while it loads is one line, exit 130.

    Imports only ``signal`` and ``sys`` before it has its handlers: whatever loads before them is a window in which a
    Ctrl-C is still Python's own.

    From the first line on, SIGINT and SIGTERM raise ``KeyboardInterrupt`` once: MLflow's launcher answers a
    Ctrl-C with a SIGTERM to the step right after it, and the default SIGTERM would kill the step mid-import
    with nothing said and the run left as the launcher left it.
    """
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, _raise_once)
    try:
        from verlflow.cli import main as cli_main
    except KeyboardInterrupt as exc:
        stop_interrupted(argv[0], exc)
    cli_main(argv)


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
        from verlflow.runs.processes import LAUNCHER_RUN_ID, watch_launcher

        watch_launcher(LAUNCHER_RUN_ID, interrupted_by=signal.Signals(signum).name)
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
    print(f"verlflow {step}: interrupted", file=sys.stderr)
    sys.exit(128 + signum)
