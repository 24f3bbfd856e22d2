"""Out of memory, told as one line naming the limit and the settings that would make the work fit.

A process that runs out of memory fails in many voices: ``MemoryError``, torch's ``RuntimeError:
[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory``, ``torch.OutOfMemoryError`` on
an accelerator, a shared library that "failed to map segment" while importing, protobuf's "out of memory".
:func:`is_out_of_memory` recognises them anywhere in an exception's chain; :func:`out_of_memory_error` turns one
into a :class:`~verlflow.errors.VerlflowError`, which the CLI prints as one line (exit 2) after the step's run
has ended FAILED with the metrics it logged.

Printing needs memory too, so the entry holds a small reserve (:func:`hold_reserve`) that is given back the
moment out-of-memory is recognised. What cannot be caught: an allocation that fails inside C++ code with no
Python frame to return to (``std::bad_alloc`` thrown where nothing catches it) ends the process with SIGABRT
before any Python code runs; :func:`hold_reserve` also turns on :mod:`faulthandler`, so such a death at least
prints where Python was, and the next step's start ends the run it left RUNNING (process/lifecycle).
"""

from __future__ import annotations

import faulthandler
import re
import resource
import sys

from verlflow.errors import VerlflowError

_RESERVE_BYTES = 16 * 1024 * 1024
_reserve: bytearray | None = None

# What allocators say when they fail (torch CPU / CUDA / NPU, libc, the dynamic loader, protobuf, C++).
_OOM_TEXT = re.compile(
    r"DefaultCPUAllocator: (can't allocate memory|not enough memory)|out of memory|Cannot allocate memory|"
    r"failed to map segment from shared object|std::bad_alloc",
    re.IGNORECASE,
)


def hold_reserve() -> None:
    """Keep a little memory aside for the error line, and let a fatal signal print Python's stack."""
    global _reserve
    if _reserve is None:
        _reserve = bytearray(_RESERVE_BYTES)
    if not faulthandler.is_enabled():
        faulthandler.enable(file=sys.__stderr__, all_threads=False)


def release_reserve() -> None:
    """Give the reserve back (out of memory was seen): the line, the run's end and its upload need it."""
    global _reserve
    _reserve = None


def is_out_of_memory(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from or while handling, is an allocation that failed."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
            release_reserve()
            return True
        if isinstance(exc, (RuntimeError, OSError, ImportError, TypeError)) and _OOM_TEXT.search(str(exc)):
            release_reserve()
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def memory_limit() -> str:
    """The address-space limit the process runs under (``ulimit -v``), or what the machine has."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        return f"the process may use {soft / 2**30:.1f} GiB of address space (ulimit -v)"
    try:
        with open("/sys/fs/cgroup/memory.max") as handle:
            cap = handle.read().strip()
        if cap.isdigit():
            return f"its container may use {int(cap) / 2**30:.1f} GiB (cgroup memory.max)"
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as handle:
            total = next(line for line in handle if line.startswith("MemTotal:"))
        return f"the machine has {int(total.split()[1]) / 2**20:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        return "memory ran out"


def out_of_memory_error(where: str, settings: dict[str, int], fix: str = "") -> VerlflowError:
    """The one line: where memory ran out, the settings that size the work, the one to lower first.

    ``settings``: key → value, the first to lower first (suggested at half its value, when above 1).
    """
    shown = ", ".join(f"{key}={value}" for key, value in settings.items())
    lever = next(((k, v) for k, v in settings.items() if isinstance(v, int) and v > 1), None)
    suggestion = f"lower one of them, e.g. -P overrides=\"{lever[0]}={lever[1] // 2}\"" if lever else ""
    advice = ", ".join(part for part in (fix or suggestion, "or give the process more memory") if part)
    sized = f" with {shown}" if shown else ""
    return VerlflowError(f"out of memory {where}{sized}; {memory_limit()}: {advice}")
