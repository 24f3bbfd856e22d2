"""CPU training beside other work takes only the cores left free, and its OpenMP threads sleep while they wait.

The figures (40 smoke steps alone and beside two busy loops) are bench/cpu_shared_speed.py's, never asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verlflow.device import cpu_share

BUSY = "while True: pass"


@pytest.mark.skipif(not (Path("/proc/stat").is_file() and hasattr(os, "sched_setaffinity")), reason="Linux only")
def test_busy_loops_on_every_core_leave_the_trainer_one_thread(monkeypatch):
    import torch

    original, threads = os.sched_getaffinity(0), torch.get_num_threads()
    cores = cpu_share.usable_cores()[:2]
    os.sched_setaffinity(0, cores)
    loops = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in cores]  # they inherit the affinity
    try:
        governor = cpu_share.ThreadGovernor(limit=2)
        assert cpu_share.free_cores(1.0) == 1  # measured over a second of the loops
        monkeypatch.setattr(cpu_share, "RECHECK_S", 0.0)
        assert governor.adjust() == 1 and torch.get_num_threads() == 1
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        os.sched_setaffinity(0, original)
        torch.set_num_threads(threads)
