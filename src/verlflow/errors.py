"""The errors that reach a user as lines, not tracebacks, and the exit codes they end with.

Every check on user input raises :class:`VerlflowError` with a message that names the bad value and what
would be valid; the CLI prints it as ``verlflow <step>: error: <message>`` and exits :data:`EXIT_BAD_INPUT`
without a traceback. Anything else is a bug and keeps its traceback.

A check that can find several mistakes in one pass (the preflight, override parsing) collects
:class:`Problem` objects and calls :func:`raise_problems`, so a user fixes everything in one round instead of
one mistake per cluster queue slot. One problem stays one line; several are a header line and one indented
line each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # SIGINT; a run stopped by signal N exits 128 + N (SIGTERM: 143), as a shell reports it


class VerlflowError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class StepFailed(VerlflowError):
    """Good input whose work the machine could not finish (a full disk, out of memory), told as one line with exit 2
    like a refusal; the step's run is named "<step> · failed: …" where it had no name of its own, not "refused"."""

# The value of a problem that has none to show (``~key`` deletes a key).
NO_VALUE = "<no value>"


@dataclass(frozen=True)
class Problem:
    """One mistake: the dotted key, the value found, and what would fix it."""

    key: str
    value: Any
    fix: str

    def line(self) -> str:
        """``key=value: fix`` — the value shown as the user would type it."""
        if self.value is NO_VALUE:
            return f"{self.key}: {self.fix}"
        from verlflow.secrets import mask_value

        return f"{self.key}={_show(mask_value(self.key, self.value))}: {self.fix}"


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_show(v) for v in value) + "]"
    return str(value)


class ProblemsError(VerlflowError):
    """A :class:`VerlflowError` that carries the problems it lists (tests and callers may inspect them)."""

    def __init__(self, problems: list[Problem], what: str):
        self.problems = list(problems)
        if len(problems) == 1:
            text = problems[0].line()
        else:
            text = f"{len(problems)} problems in {what}:\n" + "\n".join(f"  {p.line()}" for p in problems)
        super().__init__(text)


def raise_problems(problems: list[Problem], what: str = "the config") -> None:
    """Raise :class:`ProblemsError` listing ``problems`` (each once, in order); nothing when there are none."""
    unique = list({p.line(): p for p in problems}.values())
    if unique:
        raise ProblemsError(unique, what)
