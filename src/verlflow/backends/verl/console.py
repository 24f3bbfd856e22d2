"""What of verl's output the console shows: all of it but verl's resolved-config dump, which only the log keeps.

verl's trainer prints its whole resolved config before it trains (``pprint`` of the dict: 929 of the 1,055 lines a
CPU launch of the tiny recipe printed). The run keeps that config as ``config/verl_job.yaml`` and ``logs/verl.log``
keeps the dump verbatim, so the console gets one line in its place and the lines that matter stay on screen. Only
a dump that parses whole as a Python literal is replaced; anything else, and a dump cut short, is printed as it came.
"""

from __future__ import annotations

import ast
import re

from verlflow.backends.verl.output_watch import RAY_PREFIX

# A Ray worker's prefix ("(TaskRunner pid=123) ", "(TaskRunner pid=123, ip=10.0.0.2) ", in colour or not) when
# verl runs in one: the same pattern the output watch strips.
_PREFIX = re.compile(rf"^((?:{RAY_PREFIX.pattern.removeprefix('^')})?)(.*)$", re.DOTALL)
# pprint sorts a dict's keys: verl's config dump opens on its first key.
_DUMP_START = "{'actor_rollout_ref':"
_MAX_HELD = 20_000  # lines: beyond this it is not the config, print what was held


class ConsoleFilter:
    """Feed each output line; get back the lines to print now (the dump's lines are held until it ends)."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        self.source: str | None = None  # whose dump is held (its Ray prefix, "" for verl's own process), or None
        self.held: list[str] = []  # the lines as they came
        self.text: list[str] = []  # the same lines without their prefix

    def __call__(self, line: str) -> list[str]:
        """The lines to print for ``line`` (with its newline, as read)."""
        prefix, plain = _PREFIX.match(line).groups()
        source = prefix.strip()
        if self.source is None:
            if not plain.startswith(_DUMP_START):
                return [line]
            self.source = source
        elif source != self.source:
            return [line]  # another process's line in the middle of the dump
        self.held.append(line)
        self.text.append(plain)
        if plain.rstrip().endswith("}") and _whole_literal(self.text):
            return [self._summary(prefix)]
        if len(self.held) > _MAX_HELD:
            return self.flush()
        return []

    def flush(self) -> list[str]:
        """Whatever is held, to print as it came (the stream ended inside what looked like a dump)."""
        held = self.held
        self.source, self.held, self.text = None, [], []
        return held

    def _summary(self, prefix: str) -> str:
        count = len(self.held)
        self.flush()
        lead = f"{prefix.rstrip()} " if prefix.strip() else ""
        return (f"{lead}verlflow: verl's resolved config ({count} lines) is in {self.log_path} and the run's "
                "config/verl_job.yaml\n")


def _whole_literal(text: list[str]) -> bool:
    """Whether the held lines, prefixes removed, are one complete Python literal (the dump has ended)."""
    try:
        ast.literal_eval("".join(text))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False
    return True
