"""Where a test run's time goes: a pytest plugin that records wall and CPU seconds by test file, by fixture set-up
and by subprocess launched, one JSON line per event, for ``bench/test_time.py`` to add up and print.

Loaded by tests/conftest.py when pytest is given ``--time-record DIR``; each process (an xdist worker, or the one
process without xdist) writes ``DIR/<worker>.jsonl``. Nothing here changes what a test does: it reads clocks and,
for the subprocesses, asks the kernel for a reaped child's CPU seconds (``os.wait4`` in place of ``os.waitpid``,
which returns the same pid and status).

CPU seconds of a test are this process's (every thread) plus the children it reaped during the test; a
grandchild's are counted when its parent reaped it. A fixture's set-up is charged to the file of the test that
first asked for it: a session fixture shows where it was first built.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest


def _cpu_now() -> float:
    """CPU seconds used so far by this process and its reaped children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _short_args(args) -> str:
    """A launch's command line in a few words: the program and what it was asked to do."""
    words = [str(a) for a in args] if isinstance(args, list | tuple) else str(args).split()
    names = [Path(w).name if "/" in w and not w.startswith("-") else w for w in words]
    return " ".join(" ".join(names[:6]).split())[:100]  # a `python -c` program's lines on one line


class TimeRecorder:
    """The plugin: appends one JSON object per test, fixture set-up, subprocess and collection to its file."""

    def __init__(self, folder: Path):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        folder.mkdir(parents=True, exist_ok=True)
        self._out = open(folder / f"{worker}.jsonl", "a", buffering=1)  # noqa: SIM115 (open for the session)
        self._current_file = "(collection)"
        self._launched: dict[int, tuple[str, float]] = {}
        self._watch_subprocesses()

    def _write(self, **event) -> None:
        self._out.write(json.dumps(event) + "\n")

    def _watch_subprocesses(self) -> None:
        """Record each child a ``subprocess.Popen`` started: its command, wall seconds, CPU seconds when reaped."""
        recorder, real_init = self, subprocess.Popen.__init__

        def init(popen, *args, **kwargs):
            real_init(popen, *args, **kwargs)
            recorder._launched[popen.pid] = (_short_args(popen.args), time.monotonic())

        def waitpid(pid, options):
            got_pid, status, usage = os.wait4(pid, options)
            launched = recorder._launched.pop(got_pid, None) if got_pid else None
            if launched is not None:
                recorder._write(kind="subprocess", file=recorder._current_file, args=launched[0],
                                wall=time.monotonic() - launched[1], cpu=usage.ru_utime + usage.ru_stime)
            return got_pid, status

        subprocess.Popen.__init__ = init
        os.waitpid = waitpid
        poll = subprocess.Popen._internal_poll  # binds os.waitpid as a default argument at import
        names = poll.__code__.co_varnames[:poll.__code__.co_argcount]
        defaults = list(poll.__defaults__)
        first_default = len(names) - len(defaults)
        if "_waitpid" in names:
            defaults[names.index("_waitpid") - first_default] = waitpid
            poll.__defaults__ = tuple(defaults)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_collection(self, session):
        wall, cpu = time.monotonic(), _cpu_now()
        yield
        self._write(kind="collection", file="(collection)", wall=time.monotonic() - wall, cpu=_cpu_now() - cpu)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self._current_file = item.nodeid.split("::", 1)[0]
        wall, cpu = time.monotonic(), _cpu_now()
        yield
        slow = item.get_closest_marker("slow") is not None
        self._write(kind="test", file=self._current_file, test=item.nodeid, slow=slow,
                    wall=time.monotonic() - wall, cpu=_cpu_now() - cpu)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        wall, cpu = time.monotonic(), _cpu_now()
        yield
        took = time.monotonic() - wall
        if took >= 0.05:  # the many millisecond fixtures would only crowd the file
            self._write(kind="fixture", file=self._current_file, fixture=fixturedef.argname, scope=fixturedef.scope,
                        wall=took, cpu=_cpu_now() - cpu)

    def pytest_unconfigure(self, config):
        self._out.close()
