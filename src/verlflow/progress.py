"""Progress bars that stay readable in a terminal and in a log file.

    python -c "from verlflow.progress import progress_bar; b = progress_bar(3, 'demo'); b.update(3); b.close()"

In a terminal a bar redraws in place, as tqdm does. When the stream is not a terminal (``mlflow run … > log``,
CI, a scheduler's log file) tqdm's carriage returns would make the whole run one endless line, so the bar
writes one plain line per update instead, at most every ``VERLFLOW_PROGRESS_S`` seconds (default 30) plus
its last one. Library bars (transformers' "Loading weights") are switched off in that case.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

# Seconds between two plain progress lines when the output is not a terminal.
PLAIN_INTERVAL_ENV = "VERLFLOW_PROGRESS_S"
PLAIN_INTERVAL_S = 30.0
# A plain line: what a bar shows, without the bar.
PLAIN_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def is_terminal(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default stderr, where bars go) is an interactive terminal."""
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _PlainLines:
    """A file for tqdm that turns each redraw (``\\r`` + status) into one line of its own."""

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def plain_interval() -> float:
    """Seconds between plain progress lines (``VERLFLOW_PROGRESS_S``, default 30)."""
    try:
        return max(0.0, float(os.environ.get(PLAIN_INTERVAL_ENV, PLAIN_INTERVAL_S)))
    except ValueError:
        return PLAIN_INTERVAL_S


def progress_bar(total: int, desc: str, unit: str = "it", *, stream: IO[str] | None = None, **kwargs: Any):
    """A tqdm bar on ``stream`` (default stderr): redrawn in a terminal, plain periodic lines otherwise."""
    from tqdm import tqdm

    stream = stream or sys.stderr
    if is_terminal(stream):
        return tqdm(total=total, desc=desc, unit=unit, file=stream, **{"dynamic_ncols": True, **kwargs})
    interval = plain_interval()
    return tqdm(total=total, desc=desc, unit=unit, file=_PlainLines(stream), bar_format=PLAIN_FORMAT,
                mininterval=interval, maxinterval=max(interval, 10.0), **kwargs)


def quiet_library_bars() -> None:
    """Switch off the Hugging Face libraries' own bars (weight loading, downloads) when stderr is no terminal,
    and MLflow's artifact-download bars always.

    Through the environment (``HF_HUB_DISABLE_PROGRESS_BARS``, read when transformers is imported), so it
    costs no import and reaches the processes a step starts; a value the user set is kept.
    """
    if not is_terminal():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # MLflow draws a bar for each artifact it downloads: the steps read only small tables (a rerun of main
    # showed four "Downloading artifacts" bars for the promote's per-problem scores), never worth a bar.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def say(line: str) -> None:
    """Print ``line`` on stdout above any open bar (in a terminal the bar is cleared and redrawn below it), so a
    message in the middle of training does not land on the bar's line."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
