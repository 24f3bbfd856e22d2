"""verl's output read as it is printed: the line that says why a launch failed, and what the script reports.

The launch (:mod:`.backend`) hands every line of verl's output to an :class:`OutputWatch`. It keeps the last
lines, so a failed launch is one line naming verl's own error (its last exception line, a Ray worker's without
its ``(pid=…)`` prefix, a write that failed for space before whatever failed after it), and it tags the run's
``verlflow.jemalloc`` from the launch script's preload line.
"""

from __future__ import annotations

import collections
import re

from verlflow.backends.verl.command import JEMALLOC_ENABLED_LINE, JEMALLOC_MISSING_LINE
from verlflow.backends.writable import OUT_OF_SPACE
from verlflow.names import JEMALLOC_TAG
from verlflow.tracking import writes


class OutputWatch:
    """Remembers the last lines of verl's output and tags what the launch script reports."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        # The first error that says a write failed for space: later errors (the store on the same full disk)
        # would otherwise hide it, and may push it out of the tail.
        self.out_of_space: str | None = None

    def __call__(self, line: str) -> None:
        if line.strip():
            self.tail.append(line.strip())
            if self.out_of_space is None and EXCEPTION_LINE.match(_plain(line)) and OUT_OF_SPACE.search(line):
                self.out_of_space = _plain(line)[:300]
        if line.strip() in (JEMALLOC_ENABLED_LINE, JEMALLOC_MISSING_LINE):
            state = "enabled" if line.strip() == JEMALLOC_ENABLED_LINE else "missing"
            writes.set_run_tag(self.run_id, JEMALLOC_TAG, state)

    def reason(self) -> str:
        """verl's error: the last exception line it printed (a Ray worker's, without its ``(pid=…)`` prefix).

        A warning that names an error (``UserWarning: … ModuleNotFoundError``), printed by a worker after the
        failure, is not the reason; a write that failed for space is, whatever failed after it.
        """
        if self.out_of_space:
            return self.out_of_space
        lines = [_plain(ln) for ln in self.tail]
        raised = [ln for ln in lines if EXCEPTION_LINE.match(ln)]
        errors = [ln for ln in lines if ("Error" in ln or "error:" in ln) and "Warning" not in ln]
        return (raised or errors or lines or ["no output"])[-1][:300]


# ``ValueError: …``, ``torch.OutOfMemoryError: …``, ``ray.exceptions.RayTaskError(ValueError): …``, and Ray's bare
# ``Exception: …`` (not Hydra's ``Error executing job with overrides: …`` printed after it).
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?\w*(?:Error|Exception)(?:\([\w.]+\))?: ")
# Ray's colour codes and the ``(pid=123)`` / ``(TaskRunner pid=123, ip=…)`` prefix of a worker's lines.
RAY_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)?\([^)]*pid=\d+[^)]*\)(?:\x1b\[0m)?\s*")
RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")  # torch.distributed's prefix of a rank's traceback lines
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _plain(line: str) -> str:
    return RANK_PREFIX.sub("", ANSI.sub("", RAY_PREFIX.sub("", line)).strip())
