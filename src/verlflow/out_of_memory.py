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
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from verlflow.errors import StepFailed

_RESERVE_BYTES = 16 * 1024 * 1024
# The settings that size a GRPO step's memory, as verl names them: the batch levers (largest first when shown), then
# the micro batches, the rollout engine's share of an accelerator, and the offloads that move weights to the host.
BATCH_KEYS = ("data.train_batch_size", "actor_rollout_ref.rollout.n")
SIZING_KEYS = (*BATCH_KEYS, "data.max_response_length",
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
               "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
               "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
               "actor_rollout_ref.rollout.gpu_memory_utilization",
               "actor_rollout_ref.actor.fsdp_config.param_offload",
               "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
               "actor_rollout_ref.ref.fsdp_config.param_offload")
_reserve: bytearray | None = None
# Where the kernel names this process's cgroups, and where cgroup file systems are mounted.
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
# A v1 limit this large is "none": the kernel shows no limit as 2^63 rounded down to a page (9223372036854771712).
UNLIMITED_CGROUP_BYTES = 2**62

# What allocators say when they fail (torch CPU / CUDA / NPU, libc, the dynamic loader, protobuf, C++).
OOM_TEXT = re.compile(
    r"DefaultCPUAllocator: (can't allocate memory|not enough memory)|out of memory|Cannot allocate memory|"
    r"failed to map segment from shared object|std::bad_alloc",
    re.IGNORECASE,
)


class OutOfMemory(StepFailed):
    """Out of memory told as one line: a failure of good input (the run ends FAILED, ``mlflow run``'s run is named
    "failed", not "refused"), still printed as one line with exit 2."""


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
        if isinstance(exc, (RuntimeError, OSError, ImportError, TypeError)) and OOM_TEXT.search(str(exc)):
            release_reserve()
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def memory_limit() -> str:
    """The address-space limit the process runs under (``ulimit -v``), its cgroup's memory limit, or what the
    machine has."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        return f"the process may use {soft / 2**30:.1f} GiB of address space (ulimit -v)"
    if cgroup := cgroup_memory_limit():
        size, file = cgroup
        shown = f"{size / 2**20:.0f} MiB" if size < 2**30 else f"{size / 2**30:.1f} GiB"
        return f"its cgroup may use {shown} ({file})"
    try:
        with open("/proc/meminfo") as handle:
            total = next(line for line in handle if line.startswith("MemTotal:"))
        return f"the machine has {int(total.split()[1]) / 2**20:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        return "memory ran out"


def cgroup_memory_limit(proc_cgroup: str = "", root: str = "") -> tuple[int, str] | None:
    """This process's cgroup memory limit in bytes, and the file that sets it; None without one.

    The smallest over its cgroup and every ancestor (a limit on a parent bounds the children: ``systemd-run -p
    MemoryMax=450M`` limits a scope under a slice that has none, and a container's limit sits above the process's
    own cgroup), read where ``/proc/self/cgroup`` puts the process: v2 ``memory.max``, v1
    ``memory/…/memory.limit_in_bytes``. ``proc_cgroup`` and ``root`` default to :data:`PROC_CGROUP` and
    :data:`CGROUP_ROOT` (tests point them at recorded files).
    """
    root_path = Path(root or CGROUP_ROOT)
    try:
        lines = Path(proc_cgroup or PROC_CGROUP).read_text().splitlines()
    except OSError:
        return None
    files = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            base, name = root_path, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = root_path / "memory", "memory.limit_in_bytes"
        else:
            continue
        cgroup = PurePosixPath(path if path.startswith("/") else "/")
        files += [base / folder.relative_to("/") / name for folder in (cgroup, *cgroup.parents)]
    limits = []
    for file in files:
        try:
            text = file.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < UNLIMITED_CGROUP_BYTES:
            limits.append((int(text), str(file)))
    return min(limits) if limits else None


def sizing_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The sizing settings (:data:`SIZING_KEYS`) found in ``values`` (dotted keys, or ``a/b/c`` as MLflow params
    are logged), numbers read as numbers, the batch levers largest first: what an out-of-memory line names."""
    flat = {str(key).replace("/", "."): value for key, value in values.items()}
    found = {key: _number(flat[key]) for key in SIZING_KEYS if key in flat and flat[key] not in (None, "None")}
    batch = sorted(((k, v) for k, v in found.items() if k in BATCH_KEYS), key=lambda kv: -_size(kv[1]))
    return {**dict(batch), **{k: v for k, v in found.items() if k not in BATCH_KEYS}}


def _number(value: Any) -> Any:
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return value


def _size(value: Any) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def out_of_memory_error(where: str, settings: Mapping[str, Any], fix: str = "", limit: str = "") -> OutOfMemory:
    """The one line: where memory ran out, the settings that size the work, the one to lower first.

    ``settings``: key → value, the first to lower first (suggested at half its value, when above 1). ``limit``: what
    bounded the memory, when not this process's host memory (:func:`memory_limit`).
    """
    shown = ", ".join(f"{key}={value}" for key, value in settings.items())
    lever = next(((k, v) for k, v in settings.items() if type(v) is int and v > 1), None)
    suggestion = f"lower one of them, e.g. -P overrides=\"{lever[0]}={lever[1] // 2}\"" if lever else ""
    advice = ", ".join(part for part in (fix or suggestion, "or give the process more memory") if part)
    sized = f" with {shown}" if shown else ""
    return OutOfMemory(f"out of memory {where}{sized}; {limit or memory_limit()}: {advice}")
