"""What the MLproject's entry-point files call: ``verlflow.cli.main``, with Ctrl-C covered from the first line.

    mlflow run . --env-manager local -e train     # entry_points/train.py → main(["train", ...])

The step's own imports (MLflow, torch, verl) take a second or two, and a Ctrl-C to ``mlflow run``'s process
group in that window raised ``KeyboardInterrupt`` out of ``import verlflow.cli``: a traceback, and the run
the launcher had opened left to its FAILED. This module imports nothing heavy itself, so it can catch that
interrupt and end the launcher's run KILLED, as an interrupt anywhere later does.
"""

from __future__ import annotations


def main(argv: list[str]) -> None:
    """Run the step ``argv[0]`` as ``verlflow <step> …`` does; an interrupt while it loads is one line, exit 130.

    The stop handler (:mod:`verlflow.stopping`, which loads only ``signal`` and ``sys``) comes first: whatever
    loads before it is a window in which a Ctrl-C is still Python's own. While the step's imports load (no safe
    point in them) the first signal raises; from the step's first line on a signal only sets
    :data:`verlflow.stopping.STOP`, and the step ends at its next safe point.
    """
    from verlflow.stopping import raising_while_loading, stop_interrupted

    try:
        with raising_while_loading():
            from verlflow.cli import main as cli_main
    except KeyboardInterrupt as exc:
        stop_interrupted(argv[0], exc)
    cli_main(argv, own_process=True)

