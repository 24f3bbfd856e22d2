"""A SQLite store another process holds locked is waited for, with one line, from a step's first touch of it.

A second real process takes SQLite's write lock (``BEGIN EXCLUSIVE``) on the test's store and holds it until the
test lets go. Before: MLflow read the store's tables when it first built the store (``_all_tables_exist``),
outside any retry, and ``verlflow runs`` or a step ended ~10 s later in a "database is locked" traceback, rc 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import wait_until

ROOT = Path(__file__).resolve().parents[1]

_HOLDER = textwrap.dedent("""
    import sqlite3, sys, time
    from pathlib import Path
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
    db.execute("COMMIT")
""")


@pytest.fixture
def held_lock(tracking_uri, tmp_path):
    """The store's write lock, held by another process; touch the returned file to release it."""
    release = tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, tracking_uri.removeprefix("sqlite:///"), str(release)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    try:
        yield release
    finally:
        release.touch()
        holder.wait(timeout=60)


@pytest.mark.parametrize("command", [["runs"], ["preprocess", "--source", "synthetic", "--limit", "8"]],
                         ids=["verlflow runs", "a step"])
def test_a_locked_store_is_waited_for_with_one_line(held_lock, tmp_path, command):
    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "verlflow.cli", *command], cwd=tmp_path, stderr=stderr,
                                stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        wait_until(lambda: "is locked by another process: waiting" in err.read_text(), 300,
                   "the step's line saying it waits for the lock", watch=[proc], detail=err.read_text)
        assert proc.poll() is None  # still waiting, not failed
        held_lock.touch()
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and text.count("is locked by another process") == 1, text[-3000:]
    if command == ["runs"]:
        assert "runs: 0 RUNNING" in out
