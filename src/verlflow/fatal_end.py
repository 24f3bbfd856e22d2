"""What the watcher of :mod:`verlflow.fatal_watch` does once its step died hard: name the cause, end the runs FAILED.

The cause is read from what the dying process left: faulthandler's report (which fatal signal, where Python was),
the end of stderr when it is a file (``std::bad_alloc``, an allocator's words), the address-space limit the step
ran under, and the cgroup's OOM-kill count. Memory is named when that evidence says so, with the settings that size
the work read from the run's params (:func:`verlflow.out_of_memory.sizing_settings`). The runs the dead process
still held RUNNING (``verlflow.pid``) end FAILED with the line in ``verlflow.error`` and the shell's status in
``verlflow.exit_code``; ``mlflow run``'s own run is named "<step> · failed: …" when the step never named it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import resource
import signal
import sys
from dataclasses import dataclass

from verlflow.out_of_memory import OOM_TEXT, memory_limit, out_of_memory_error, sizing_settings

log = logging.getLogger(__name__)

# faulthandler's header for each fatal signal it handles ("Fatal Python error: Aborted", CPython 3.x).
_FAULTS = {"Aborted": signal.SIGABRT, "Segmentation fault": signal.SIGSEGV, "Bus error": signal.SIGBUS,
           "Floating-point exception": signal.SIGFPE, "Floating point exception": signal.SIGFPE,
           "Illegal instruction": signal.SIGILL}
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)', re.MULTILINE)


@dataclass(frozen=True)
class Death:
    """How the step's process died: the signal, the shell's status for it, why memory is blamed (or '')."""

    signum: int
    memory: str
    where: str

    @property
    def status(self) -> int:
        """What a shell reports for the death (128 + the signal)."""
        return 128 + self.signum

    @property
    def name(self) -> str:
        """The signal's name (SIGABRT)."""
        return signal.Signals(self.signum).name


def how_it_died(dump: str, tail: str, oom_kills_before: int | None, oom_kills_now: int | None) -> Death:
    """Read the cause from faulthandler's report ``dump``, the end of stderr ``tail`` and the OOM-kill counts."""
    header = re.search(r"Fatal Python error: ([^\n]+)", dump)
    signum = _FAULTS.get(header.group(1).strip(), signal.SIGABRT) if header else signal.SIGKILL
    frame = _FRAME.search(dump)
    where = f" in {frame.group(3)} ({frame.group(1)}:{frame.group(2)})" if frame else ""
    memory = ""
    if signum == signal.SIGKILL:
        if None not in (oom_kills_before, oom_kills_now) and oom_kills_now > oom_kills_before:
            memory = "killed by the kernel's OOM killer, SIGKILL"
    elif signum == signal.SIGABRT:
        said = OOM_TEXT.search(tail)
        if said:
            memory = f"{said.group(0)}: the process aborted, SIGABRT"
        elif resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
            memory = "the process aborted, SIGABRT, under an address-space limit, as a failed C++ allocation does"
    return Death(signum, memory, where)


def death_line(step: str, death: Death, params: dict[str, str]) -> str:
    """The one line for ``death``: out of memory with the sizing settings, or the signal and where Python was."""
    if death.memory:
        return str(out_of_memory_error(f"in {step} ({death.memory})", sizing_settings(params)))
    if death.signum == signal.SIGKILL:
        return (f"the step's process was killed by a signal it cannot catch (SIGKILL: `kill -9`, or the kernel's OOM "
                f"killer; {memory_limit()})")
    return f"the step's process crashed in native code: {death.name}{death.where}; its Python stack is above"


def report_death(step: str, pid: int, dump: str, tail: str, oom_kills: tuple[int | None, int | None]) -> None:
    """End the dead step's RUNNING runs FAILED with its one line, then print its stack and the line on stderr.

    ``dump``: faulthandler's report; ``tail``: the end of stderr ('' when unreadable); ``oom_kills``: the cgroup's
    OOM-kill count when the step started and now."""
    death = how_it_died(dump, tail, *oom_kills)
    runs = _held_runs(pid)
    params = {key: value for run in runs for key, value in run.data.params.items()}  # main's train child included
    line = death_line(step, death, params)
    _end_failed(step, runs, line, death)  # first: a reader that sees the line finds the run ended
    if dump.strip():
        sys.stderr.write(dump if dump.endswith("\n") else dump + "\n")
    print(f"verlflow {step}: error: {line}", file=sys.stderr, flush=True)


def _held_runs(pid: int) -> list:
    """The runs process ``pid`` still held RUNNING (the step's own first); [] when the store does not answer."""
    from verlflow.outage.metric_buffer import WRITER_HTTP_KNOBS, bounded_http
    from verlflow.outage.store_retry import LockRetryingClient

    try:
        with bounded_http(WRITER_HTTP_KNOBS):
            client = LockRetryingClient()
            ids = [e.experiment_id for e in client.search_experiments()]
            found = client.search_runs(ids, f"tags.`verlflow.pid` = '{int(pid)}' and attributes.status = 'RUNNING'",
                                       max_results=100, order_by=["attributes.start_time ASC"]) if ids else []
    except Exception as exc:  # the line matters more than the bookkeeping; the next step reaps what is left
        log.debug("could not read the runs of process %d: %s", pid, exc)
        return []
    return list(found)


def _end_failed(step: str, runs: list, line: str, death: Death) -> None:
    from verlflow.names import ERROR_TAG, EXIT_CODE_TAG, REAPED_TAG
    from verlflow.outage.metric_buffer import WRITER_HTTP_KNOBS, bounded_http
    from verlflow.outage.store_retry import LockRetryingClient
    from verlflow.secrets import mask_text
    from verlflow.tracking.naming import name_refused_run
    from verlflow.tracking.writes import end_failed

    reason = mask_text(f"{death.name}: {line}")[:5000]
    with bounded_http(WRITER_HTTP_KNOBS):
        client = LockRetryingClient()
        for run in runs:
            with contextlib.suppress(Exception):
                end_failed(client, run.info.run_id, {ERROR_TAG: reason, EXIT_CODE_TAG: str(death.status),
                                                     REAPED_TAG: f"process died of {death.name}"})
    name_refused_run(step, line, "failed")
