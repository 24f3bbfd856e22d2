"""No run stays RUNNING after its process is gone: runs carry host/pid, and dead ones are reaped FAILED."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
from mlflow.tracking import MlflowClient

from verlflow import cli, names
from verlflow.process import lifecycle
from verlflow.tracking.tracking import tracked_run

SLEEPER = textwrap.dedent(
    """
    import signal, mlflow
    from verlflow.tracking.tracking import tracked_run
    with tracked_run(run_name="doomed") as run:
        mlflow.log_metric("timing_s/step", 2.0, step=1)
        print(run.info.run_id, flush=True)
        signal.pause()  # until the test's SIGKILL
    """
)


def _sigkilled_run() -> str:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    run_id = proc.stdout.readline().strip()
    proc.kill()
    proc.wait(timeout=30)
    assert MlflowClient().get_run(run_id).info.status == "RUNNING"  # what SIGKILL leaves behind
    return run_id


def test_a_run_carries_its_host_and_pid(tracking_uri):
    with tracked_run(run_name="alive") as run:
        tags = MlflowClient().get_run(run.info.run_id).data.tags
        assert tags[names.HOST_TAG] == socket.gethostname()
        assert tags[names.PID_TAG] == str(os.getpid())
        assert tags[names.HEARTBEAT_TAG].isdigit()
        assert lifecycle.reap() == []  # a live run is never reaped


def test_sigkilled_run_is_reaped_failed_by_the_runs_command(tracking_uri, capsys):
    run_id = _sigkilled_run()
    cli.main(["runs", "--reap"])
    run = MlflowClient().get_run(run_id)
    assert run.info.status == "FAILED"
    assert "is gone" in run.data.tags[names.REAPED_TAG]
    assert run.data.metrics["timing_s/step"] == 2.0  # what it logged is kept
    assert f"reaped {run_id}" in capsys.readouterr().out


def test_the_next_step_reaps_its_experiment_at_start(tracking_uri):
    run_id = _sigkilled_run()
    with tracked_run(run_name="next"):
        pass
    assert MlflowClient().get_run(run_id).info.status == "FAILED"


def test_a_run_of_another_host_is_reaped_only_when_its_heartbeat_is_stale(tracking_uri):
    client = MlflowClient()
    fresh = client.create_run("0", tags={names.HOST_TAG: "elsewhere", names.PID_TAG: "4242",
                                         names.HEARTBEAT_TAG: "9999999999"})
    stale = client.create_run("0", tags={names.HOST_TAG: "elsewhere", names.PID_TAG: "4242",
                                         names.HEARTBEAT_TAG: "1000"})
    foreign = client.create_run("0")  # not a verlflow run: no pid tag, left alone
    reaped = lifecycle.reap(["0"])
    assert [r.run_id for r in reaped] == [stale.info.run_id]
    assert client.get_run(fresh.info.run_id).info.status == "RUNNING"
    assert client.get_run(foreign.info.run_id).info.status == "RUNNING"
    assert "no heartbeat" in client.get_run(stale.info.run_id).data.tags[names.REAPED_TAG]


def test_attaching_again_clears_the_error_of_the_earlier_attempt(tracking_uri, monkeypatch):
    with pytest.raises(RuntimeError), tracked_run() as run:
        raise RuntimeError("first attempt broke")
    assert "verlflow.error" in MlflowClient().get_run(run.info.run_id).data.tags
    monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)
    with tracked_run():
        pass
    again = MlflowClient().get_run(run.info.run_id)
    assert again.info.status == "FINISHED" and "verlflow.error" not in again.data.tags


def test_the_launcher_is_found_through_a_shell(tmp_path):
    """A child of ``bash -c`` under a process named ``mlflow run`` finds that process as its launcher."""
    fake_mlflow = tmp_path / "mlflow"
    fake_mlflow.write_text(textwrap.dedent(
        """
        import subprocess, sys
        probe = "from verlflow.process import lifecycle; print(lifecycle.find_launcher())"
        subprocess.run(["bash", "-c", f"{sys.executable} -c '{probe}'; true"])
        """))
    out = subprocess.run([sys.executable, str(fake_mlflow), "run", "."], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip().isdigit(), out.stderr[-2000:]
