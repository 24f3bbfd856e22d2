"""A step that dies hard still gets its one line, and its run ends FAILED with the cause, by a watcher that outlives it.

    verlflow train …    # std::bad_alloc → abort (rc 134), a segfault (rc 139), the OOM killer (SIGKILL, rc 137)

What kills a process from C code runs no Python after it: an uncaught ``std::bad_alloc`` aborts, a bad pointer
segfaults, the kernel's OOM killer sends SIGKILL. :func:`start` (called by the CLI before a step's heavy imports)
forks a small watcher that holds a pipe from the step and an anonymous file (``memfd``) that :mod:`faulthandler`
writes Python's stack into. A step that ends in any ordinary way (return, error line, SIGTERM/SIGINT stop, even
``sys.exit``) writes a clean-exit byte at exit; the watcher then leaves at once, saying nothing. A step that is gone
without it died hard: the watcher prints faulthandler's stack and one verlflow line naming the cause (out of memory
with the settings that size the work, when the evidence says memory: ``std::bad_alloc`` in the output it can read,
an abort under an address-space limit, a rise of the cgroup's OOM-kill count), and ends the step's RUNNING runs
FAILED with that line in ``verlflow.error`` (:mod:`.fatal_end`). It never takes a stop signal (a Ctrl-C reaches the
whole process group; the step stops and exits cleanly, and the watcher follows).

Cost: one ``fork`` before the step imports MLflow or torch (a millisecond, no new interpreter), one pipe, one memfd;
the watcher sleeps in ``select`` and imports MLflow only after a hard death. Kept free of heavy imports.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import select
import signal

# How often the watcher also checks that its step is still its parent (a forked grandchild can hold the pipe open).
POLL_S = 1.0
_CLEAN = b"x"
_started: list[int] = []  # the pid of the step this process started a watcher for


def start(step: str) -> int | None:
    """Fork the watcher of this step's process and route faulthandler into it; returns the watcher's pid, None when
    one is running already or the platform has no fork/memfd (then faulthandler keeps writing to stderr)."""
    if _started or not hasattr(os, "memfd_create") or os.environ.get("VERLFLOW_FATAL_WATCH") == "0":
        return None
    try:
        dump = os.memfd_create("verlflow-fatal", 0)
        read_end, write_end = os.pipe()
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:  # the watcher: never returns into the step's code
        os.close(write_end)
        _watch_and_exit(step, read_end, dump)
    os.close(read_end)
    me = os.getpid()
    _started.append(me)
    faulthandler.enable(file=dump, all_threads=False)
    atexit.register(_clean_exit, me, write_end)
    return pid


def _clean_exit(owner: int, write_end: int) -> None:
    if os.getpid() == owner:  # a forked child runs no atexit of ours, but one that did must not speak for the step
        try:
            os.write(write_end, _CLEAN)
        except OSError:
            pass


def _watch_and_exit(step: str, read_end: int, dump: int) -> None:
    code = 0
    try:
        from verlflow import stopping

        stopping.set_handlers({signum: signal.SIG_IGN for signum in stopping.STOPS})
        _quiet_stdio()
        parent = os.getppid()
        oom_kills = oom_kill_count()
        if not _ended_cleanly(read_end, parent):
            from verlflow.fatal_end import report_death

            report_death(step, parent, _read_all(dump), stderr_tail(), (oom_kills, oom_kill_count()))
    except BaseException:  # the watcher must never print a traceback of its own into the step's output
        code = 1
    finally:
        os._exit(code)


def _quiet_stdio() -> None:
    """Keep only stderr (the line goes there): holding the step's stdout open would keep a reader of it waiting."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    os.close(null)


def _ended_cleanly(read_end: int, parent: int) -> bool:
    """Wait until the step is gone; whether it said it ended in order."""
    while True:
        ready, _, _ = select.select([read_end], [], [], POLL_S)
        if ready:
            data = os.read(read_end, 64)
            if _CLEAN in data:
                return True
            if not data:  # every holder of the write end is gone
                return False
        elif os.getppid() != parent:  # the step is gone; a forked grandchild of it still holds the pipe
            return False


def _read_all(fd: int) -> str:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 65536, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks).decode(errors="replace")


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup (v2 ``memory.events``,
    v1 ``memory.oom_control``), None where the count cannot be read."""
    try:
        with open("/proc/self/cgroup") as handle:
            lines = [line.rstrip("\n").split(":", 2) for line in handle]
    except OSError:
        return None
    candidates = []
    for _, controllers, path in lines:
        if controllers == "":
            candidates.append(f"/sys/fs/cgroup{path.rstrip('/')}/memory.events")
        elif "memory" in controllers.split(","):
            candidates += [f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.oom_control",
                           "/sys/fs/cgroup/memory/memory.oom_control"]
    for name in candidates:
        try:
            with open(name) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit():
                        return int(value)
        except OSError:
            continue
    return None


def stderr_tail(limit: int = 16384) -> str:
    """The end of what was written to stderr, when stderr is a file that can be read back (a log); else ''."""
    try:
        if not os.path.isfile("/proc/self/fd/2"):
            return ""
        with open("/proc/self/fd/2", "rb") as handle:  # opened anew for reading: stderr itself is write-only
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


__all__ = ["start", "oom_kill_count", "stderr_tail"]
