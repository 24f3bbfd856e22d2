"""A stop is an event (:mod:`verlflow.stopping`): a signal never raises where it lands, the step ends at its next
safe point, in its own code.

Each test is a place where raising from any bytecode went wrong before, and the behaviour kept:
- a signal handled inside a finalizer ("Exception ignored", the stop lost: 1 SIGTERM in 10 trained on to FINISHED)
  still stops the step (was: the ``sys.unraisablehook`` swap and the process re-sending the signal to itself);
- a library that catches and logs exceptions while the signal comes prints no traceback of the step's stop (was:
  log filters dropping the step's own interrupt);
- a signal inside a SQL store's write lets the write finish and leaves no lock (was: SQLAlchemy frame sniffing
  that deferred the raise), and a SIGTERM while a long ``log_batch`` loop runs ends the run KILLED, no traceback.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
STEP = textwrap.dedent(
    """
    import os, signal, threading
    from verlflow import stopping

    class Slow:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next instruction: here, where Python cannot raise
            landed.set()

    landed = threading.Event()
    try:
        with stopping.installed():
            slow = Slow()
            del slow
            assert landed.is_set()
            for _ in range(600):  # the step's safe points
                stopping.STOP.wait(0.05)
                stopping.stop_point()
            print("trained on")
    except stopping.RunInterrupted as exc:
        print("stopped:", exc)
    """
)


def test_a_sigterm_handled_inside_a_finalizer_still_stops_the_step():
    done = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True, timeout=120, env=ENV)
    assert done.stdout.strip() == "stopped: interrupted by SIGTERM", done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr


LOGGED = textwrap.dedent(
    """
    import logging, os, signal
    logging.basicConfig(level=logging.INFO)
    from verlflow import stopping

    pool = logging.getLogger("sqlalchemy.pool.impl.QueuePool")

    def library_call():  # what SQLAlchemy's pool does around its work: log what it catches, raise it on
        try:
            os.kill(os.getpid(), signal.SIGINT)  # handled at the next instruction: inside the library's work
            sum(range(1000))
        except BaseException:
            pool.error("Exception during reset or similar", exc_info=True)
            try:
                raise RuntimeError("Cannot operate on a closed cursor")
            except RuntimeError:
                pool.error("Error closing cursor", exc_info=True)
            raise

    try:
        with stopping.installed():
            library_call()
            for _ in range(600):
                stopping.STOP.wait(0.05)
                stopping.stop_point()
    except stopping.RunInterrupted as exc:
        print("stopped:", exc)
    pool.error("a later error of the library")
    """
)


def test_a_library_logging_what_it_catches_prints_no_traceback_of_the_stop():
    done = subprocess.run([sys.executable, "-c", LOGGED], capture_output=True, text=True, timeout=120, env=ENV)
    assert done.stdout.strip() == "stopped: interrupted by SIGINT", done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Exception during reset" not in done.stderr, done.stderr
    assert "Error closing cursor" not in done.stderr, done.stderr
    assert "a later error of the library" in done.stderr  # the library's own errors still print


IN_A_WRITE = textwrap.dedent(
    """
    import os, signal, sqlite3, sys
    from mlflow.tracking import MlflowClient
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from verlflow import stopping

    db = sys.argv[1]
    client = MlflowClient(f"sqlite:///{db}")
    run_id = client.create_run("0").info.run_id
    sent = []

    @event.listens_for(Engine, "before_cursor_execute")
    def signal_mid_write(conn, cursor, statement, *args):
        if not sent and statement.lstrip().upper().startswith("INSERT INTO TAGS"):
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # handled at the next instruction: inside SQLAlchemy's session,
            sent.append(True)                     # with a write open

    try:
        with stopping.installed():
            client.set_tag(run_id, "written", "yes")
            for _ in range(600):
                stopping.STOP.wait(0.05)
                stopping.stop_point()
    except stopping.RunInterrupted as exc:
        print("stopped:", exc)
    other = sqlite3.connect(db, timeout=0)  # another process's write must not wait on this one's lock
    other.execute("BEGIN IMMEDIATE")
    other.rollback()
    print("tag:", client.get_run(run_id).data.tags.get("written"))
    """
)


def test_an_interrupt_during_a_sql_store_write_lets_the_write_finish_and_leaves_no_lock(tmp_path):
    # Before: raised inside SQLAlchemy, it skipped MLflow's rollback; the step's dead session kept SQLite's write
    # lock, and the run's end, its metric writer and the launcher each waited 20 s per try on it.
    done = subprocess.run([sys.executable, "-c", IN_A_WRITE, str(tmp_path / "mlflow.db")], capture_output=True,
                          text=True, timeout=300, env=ENV)
    assert done.stdout.split("\n")[-3:-1] == ["stopped: interrupted by SIGINT", "tag: yes"], done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr


LOG_BATCHES = textwrap.dedent(
    """
    import time
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient
    from verlflow import stopping
    from verlflow.tracking.tracking import tracked_run

    client = MlflowClient()
    try:  # as verlflow.cli runs a step
        with tracked_run(run_name="writing") as run:
            for step in range(100_000):  # a store call at a time, a safe point between them
                now = int(time.time() * 1000)
                client.log_batch(run.info.run_id, metrics=[Metric(f"m/{k}", float(k), now, step) for k in range(500)])
                if step == 1:
                    print(run.info.run_id, flush=True)
                stopping.stop_point()
    except KeyboardInterrupt as exc:
        stopping.stop_interrupted("write", exc)
    """
)


def test_a_sigterm_during_a_long_log_batch_loop_ends_the_run_killed_without_traceback_or_lock(tracking_uri, tmp_path):
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    proc = subprocess.Popen([sys.executable, "-c", LOG_BATCHES], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**ENV, "MLFLOW_TRACKING_URI": tracking_uri})
    run_id = proc.stdout.readline().strip()  # two batches are in: it is in its loop of store calls
    assert run_id, proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err
    run = MlflowClient().get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.metrics["m/499"] == 499.0  # what it wrote is kept
    other = sqlite3.connect(db, timeout=0)  # no lock left behind: another writer gets in at once
    other.execute("BEGIN IMMEDIATE")
    other.rollback()


CHILD_STARTED = textwrap.dedent(
    """
    import multiprocessing, os, signal
    from verlflow import stopping

    with stopping.installed():
        child = multiprocessing.get_context("spawn").Process(target=stopping.ignore_held_sigint)
        stopping.start_child(child)  # the first spawn of this process: the resource tracker starts too
        os.kill(child.pid, signal.SIGINT)  # lands while the child's interpreter starts
        child.join(60)
        print("child exit code", child.exitcode)
        with stopping.sigint_held_for_children():
            os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C while a child is being started
        print("stop seen", stopping.STOP.wait(60))
    """
)


def test_a_ctrl_c_while_a_child_starts_neither_kills_the_child_nor_is_lost_to_the_step():
    """The metric writer's start: a Ctrl-C to the group killed a starting writer with a traceback, and once the
    step ignored SIGINT while starting it, the step's own Ctrl-C was lost (it trained on until SIGTERM)."""
    done = subprocess.run([sys.executable, "-c", CHILD_STARTED], capture_output=True, text=True, timeout=180, env=ENV)
    assert done.stdout.splitlines() == ["child exit code 0", "stop seen True"], done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
