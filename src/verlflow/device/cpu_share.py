"""CPU training on a machine it shares: as many torch threads as the cores others leave free.

    python -c "from verlflow.device.cpu_share import free_cores; print(free_cores(0.5))"

torch's CPU kernels run on an OpenMP pool whose threads meet at a barrier after every parallel region. Alone, two
threads on two cores are fastest; beside other work a thread waits for a core at each barrier, and a fixed two
threads took 3.7-5.8x as long beside two busy loops as alone (40 smoke steps, `bench/cpu_shared_speed.py --threads 2`).
:class:`ThreadGovernor` (the local trainer, between steps; the CPU verl plugin once per worker) sets torch's thread
count to the cores the other processes leave free (read from ``/proc/stat`` minus this process's own CPU time,
``os.getloadavg`` where there is no ``/proc``), never above the profile's ``OMP_NUM_THREADS``.

OpenMP's wait policy is left to OpenMP (unless the user set ``OMP_WAIT_POLICY``): libgomp's default spins a few
milliseconds at a barrier, then sleeps. Both forced policies lost on the bench: ``PASSIVE`` (sleep at once) made
training alone 1.3x slower (up to 2x at hours when the host wakes sleepers late), ``ACTIVE`` (spin without end)
kept an idle pool thread spinning beside one working thread, 1.4x slower beside the busy loops.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# Seconds between two looks at the machine's load during training (a look is two small /proc reads).
RECHECK_S = 2.0


def usable_cores() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _busy_ticks(cores: list[int]) -> int | None:
    """Busy clock ticks of ``cores`` since boot (all processes), None without ``/proc/stat``."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted, busy = {f"cpu{core}" for core in cores}, 0
    for line in lines:
        name, *fields = line.split()
        if name in wanted:
            ticks = [int(x) for x in fields[:8]]
            busy += sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    return busy


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system


class _Sample:
    """The machine's busy ticks and this process's CPU seconds at one moment."""

    def __init__(self, cores: list[int]):
        self.at, self.busy, self.own = time.monotonic(), _busy_ticks(cores), _own_seconds()


def others_busy(since: _Sample, cores: list[int]) -> float:
    """Cores' worth of CPU that other processes used since ``since`` (load average where there is no /proc)."""
    now = _Sample(cores)
    elapsed = now.at - since.at
    if now.busy is None or since.busy is None or elapsed <= 0:
        return max(os.getloadavg()[0] - 1.0, 0.0) if hasattr(os, "getloadavg") else 0.0
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return max((now.busy - since.busy) / tick - (now.own - since.own), 0.0) / elapsed


def threads_for(others: float, cores: int, limit: int | None) -> int:
    """Threads for the cores ``others`` leave free: at least one, at most ``limit`` (or every core)."""
    free = round(cores - others)
    return max(1, min(limit or cores, free))


def free_cores(sample_s: float = 0.25) -> int:
    """The cores other processes leave free, measured over ``sample_s`` seconds (at least one)."""
    cores = usable_cores()
    start = _Sample(cores)
    time.sleep(sample_s)
    return threads_for(others_busy(start, cores), len(cores), None)


class ThreadGovernor:
    """torch's intra-op threads following the free cores, checked every :data:`RECHECK_S` at the caller's
    safe points (between steps): at most ``limit`` threads (the profile's ``OMP_NUM_THREADS``)."""

    def __init__(self, limit: int | None):
        self.cores = usable_cores()
        self.limit = limit
        self.since = _Sample(self.cores)

    def adjust(self) -> int | None:
        """Set torch's thread count for the load seen since the last look; the count set, None when not due."""
        if time.monotonic() - self.since.at < RECHECK_S:
            return None
        import torch

        threads = threads_for(others_busy(self.since, self.cores), len(self.cores), self.limit)
        self.since = _Sample(self.cores)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        return threads
