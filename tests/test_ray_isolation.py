"""The suite's parallel workers cannot reach each other's Ray (tests/conftest.py's ``pytest_configure``).

A real pytest session of two xdist workers runs tests/ray_isolation/probe_own_cluster.py: each worker starts a
Ray cluster as verl does (no address), both at once, and checks that verlflow's node listing and a job
submission reach its own cluster only. Without the per-worker Ray temp dir the second ``ray.init()`` joins the
first worker's cluster ("the latest cluster started on this machine") and its listing names the other worker.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT


@pytest.mark.slow
def test_two_workers_each_start_and_reach_only_their_own_ray_cluster(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_TMPDIR", "RAY_ADDRESS", "PYTEST_XDIST_WORKER")}
    env.update(VERLFLOW_PROBE_DIR=str(tmp_path), RAY_AUTH_MODE="token")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "load", "-p", "no:cacheprovider", "-q",
         "--basetemp", str(tmp_path / "inner"), str(REPO_ROOT / "tests" / "ray_isolation" / "probe_own_cluster.py")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout
    # Each probe ran on its own worker, and the two clusters were different clusters.
    assert sorted(p.name for p in tmp_path.glob("done-*")) == ["done-gw0", "done-gw1"]
    addresses = {p.read_text() for p in tmp_path.glob("up-*")}
    assert len(addresses) == 2, addresses
