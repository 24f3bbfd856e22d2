"""A SIGTERM that lands inside a finalizer is not lost: the step still stops (before: trained on to FINISHED).

Python cannot raise from a finalizer ("Exception ignored in …"): a signal handled there swallowed the step's
RunInterrupted, and under ``mlflow run`` 1 SIGTERM in 10 let the run finish. The signal is sent again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = textwrap.dedent(
    """
    import os, signal, threading, time
    from verlflow.runs import tracking

    class Slow:
        def __del__(self):
            landed.set()
            time.sleep(0.5)  # the SIGTERM is handled here, where Python cannot raise

    landed = threading.Event()
    try:
        with tracking.signals_raise():
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
            slow = Slow()
            del slow
            assert landed.is_set()
            for _ in range(600):
                time.sleep(0.05)
            print("trained on")
    except tracking.RunInterrupted as exc:
        print("stopped:", exc)
    """
)


def test_a_sigterm_handled_inside_a_finalizer_still_stops_the_step():
    done = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.stdout.strip() == "stopped: interrupted by SIGTERM", done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr


LOGGED = textwrap.dedent(
    """
    import logging, os, signal, threading, time
    logging.basicConfig(level=logging.INFO)
    from verlflow.runs import tracking

    pool = logging.getLogger("sqlalchemy.pool.impl.QueuePool")
    try:
        with tracking.signals_raise():
            try:
                threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
                for _ in range(600):
                    time.sleep(0.05)
            except BaseException:  # what SQLAlchemy's pool does when the signal lands in its finalizer
                pool.error("Exception during reset or similar", exc_info=True)
                try:  # and when closing a cursor fails while it handles the interrupt
                    raise RuntimeError("Cannot operate on a closed cursor")
                except RuntimeError:
                    pool.error("Error closing cursor", exc_info=True)
                raise
    except tracking.RunInterrupted as exc:
        print("stopped:", exc)
    pool.error("a later error of the library")
    """
)


def test_a_library_logging_the_steps_own_interrupt_prints_no_traceback():
    done = subprocess.run([sys.executable, "-c", LOGGED], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.stdout.strip() == "stopped: interrupted by SIGINT", done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Exception during reset" not in done.stderr, done.stderr
    assert "Error closing cursor" not in done.stderr, done.stderr
    assert "a later error of the library" in done.stderr  # only the interrupt's own record is dropped


IN_A_WRITE = textwrap.dedent(
    """
    import os, signal, sqlite3, sys, time
    from mlflow.tracking import MlflowClient
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from verlflow.runs import tracking

    db = sys.argv[1]
    client = MlflowClient(f"sqlite:///{db}")
    run_id = client.create_run("0").info.run_id
    sent = []

    @event.listens_for(Engine, "before_cursor_execute")
    def signal_mid_write(conn, cursor, statement, *args):
        if not sent and statement.lstrip().upper().startswith("INSERT INTO TAGS"):
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # handled here, inside SQLAlchemy's session, with a write open
            time.sleep(0.3)

    try:
        with tracking.signals_raise():
            client.set_tag(run_id, "written", "yes")
            for _ in range(600):
                time.sleep(0.05)
    except tracking.RunInterrupted as exc:
        print("stopped:", exc)
    other = sqlite3.connect(db, timeout=0)  # another process's write must not wait on this one's lock
    other.execute("BEGIN IMMEDIATE")
    other.rollback()
    print("tag:", client.get_run(run_id).data.tags.get("written"))
    """
)


def test_an_interrupt_during_a_sql_store_write_waits_for_the_write_and_leaves_no_lock(tmp_path):
    # Before: raised inside SQLAlchemy, it skipped MLflow's rollback; the step's dead session kept SQLite's write
    # lock, and the run's end, its metric writer and the launcher each waited 20 s per try on it.
    done = subprocess.run([sys.executable, "-c", IN_A_WRITE, str(tmp_path / "mlflow.db")], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.stdout.split("\n")[-3:-1] == ["stopped: interrupted by SIGINT", "tag: yes"], done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
