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
@pytest.mark.slow
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


def test_a_tag_write_that_lost_an_insert_race_is_told_apart_from_other_store_errors(tmp_path):
    # Two search workers tagging one model version on Postgres: one insert meets the row the other inserted first
    # (a unique-key violation); LockRetryingClient makes such a keyed write once more, which then updates the row.
    import sqlite3

    from verlflow.outage.store_retry import is_concurrent_insert

    db = sqlite3.connect(tmp_path / "race.db")
    db.execute("CREATE TABLE model_version_tags (name TEXT, version INT, key TEXT, value TEXT, "
               "PRIMARY KEY (name, version, key))")
    db.execute("INSERT INTO model_version_tags VALUES ('m', 1, 'eval.gsm8k.accuracy', '0')")
    with pytest.raises(sqlite3.IntegrityError) as lost:
        db.execute("INSERT INTO model_version_tags VALUES ('m', 1, 'eval.gsm8k.accuracy', '0')")
    assert is_concurrent_insert(lost.value)
    assert not is_concurrent_insert(RuntimeError("database is locked"))
    assert not is_concurrent_insert(RuntimeError("RESOURCE_DOES_NOT_EXIST: Registered Model with name=m not found"))
