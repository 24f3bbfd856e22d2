"""A step that dies hard (a C++ std::bad_alloc abort, a segfault, SIGKILL) still ends with one verlflow line and its
run FAILED with the cause (issue 45: ``ulimit -v`` 1 GB gave ``std::bad_alloc``, rc 134, no verlflow line, the run
RUNNING until a later step reaped it). Real processes: the fault is real (tests/fault_cli.py, tests/faults.py:
libstdc++'s own ``operator new`` throwing, a read of address 0, SIGKILL), in a real step with a real SQLite store.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow  # each test is a real step process that dies
FAULT_CLI = Path(__file__).with_name("fault_cli.py")


def _step(argv: list[str], cwd, fault: str, *, stderr_file=None, address_space: int | None = None, env=None):
    """Run ``verlflow <argv>`` with the fault (tests/fault_cli.py); returns (returncode, stderr). Waits for stderr's
    end, which the step's watcher holds until it has said its line."""
    def limit() -> None:
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, resource.RLIM_INFINITY))

    full_env = {**os.environ, **(env or {})}
    command = [sys.executable, str(FAULT_CLI), fault, *argv]
    if stderr_file is None:
        done = subprocess.run(command, cwd=cwd, env=full_env, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit, timeout=600)
        return done.returncode, done.stderr
    with open(stderr_file, "w") as err:  # a log file: the watcher reads the C++ runtime's words back from it
        proc = subprocess.Popen(command, cwd=cwd, env=full_env,
                                stdout=subprocess.DEVNULL, stderr=err, preexec_fn=limit)
        rc = proc.wait(timeout=600)
    wait_until(lambda: "verlflow " in stderr_file.read_text().splitlines()[-1], 120, "the watcher's line")
    return rc, stderr_file.read_text()


def _only_run(step: str):
    client = MlflowClient()
    ids = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(ids, f"tags.`verlflow.step` = '{step}'")
    return run


@pytest.mark.slow
def test_a_bad_alloc_abort_in_training_is_one_out_of_memory_line_and_the_run_ends_failed(tmp_path, tracking_uri,
                                                                                          tiny_workdir):
    rc, err = _step(["train", "--recipe", "tiny", "--device", "cpu", "--data_dir", str(tiny_workdir / "data")],
                    tmp_path, "bad_alloc@run:3", stderr_file=tmp_path / "train.log",
                    env={"VERLFLOW_CACHE": str(tiny_workdir / "cache")})
    assert rc == -signal.SIGABRT, err[-3000:]  # the shell's 134: the process itself cannot change how it died
    assert "terminate called after throwing an instance of 'std::bad_alloc'" in err
    assert "Fatal Python error: Aborted" in err  # faulthandler's stack, passed on by the watcher
    line = err.strip().splitlines()[-1]
    assert line.startswith("verlflow train: error: out of memory in train (std::bad_alloc: the process aborted, "
                           "SIGABRT) with data.train_batch_size=4, actor_rollout_ref.rollout.n=4, "), line
    assert 'e.g. -P overrides="data.train_batch_size=2"' in line
    assert sum(text.startswith("verlflow ") for text in err.splitlines()) == 1
    run = _only_run("train")
    assert run.info.status == "FAILED"
    assert run.data.tags["verlflow.error"] == "SIGABRT: " + line.removeprefix("verlflow train: error: ")
    assert run.data.tags["verlflow.exit_code"] == "134"


def test_an_abort_under_an_address_space_limit_is_named_out_of_memory_without_readable_output(tmp_path,
                                                                                              tracking_uri):
    rc, err = _step(["preprocess", "--source", "synthetic", "--output_dir", str(tmp_path / "data")], tmp_path,
                    "abort@run", address_space=64 * 2**30)
    assert rc == -signal.SIGABRT, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("verlflow preprocess: error: out of memory in preprocess (the process aborted, SIGABRT, "
                           "under an address-space limit"), line
    assert "the process may use 64.0 GiB of address space (ulimit -v)" in line
    run = _only_run("preprocess")
    assert run.info.status == "FAILED" and run.data.tags["verlflow.error"].startswith("SIGABRT: out of memory")


def test_a_segfault_names_the_signal_and_where_python_was_and_the_run_ends_failed(tmp_path, tracking_uri):
    rc, err = _step(["preprocess", "--source", "synthetic", "--output_dir", str(tmp_path / "data")], tmp_path,
                    "segv@run")
    assert rc == -signal.SIGSEGV, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("verlflow preprocess: error: the step's process crashed in native code: SIGSEGV in "
                           "string_at ("), line
    assert "out of memory" not in line
    run = _only_run("preprocess")
    assert run.info.status == "FAILED" and run.data.tags["verlflow.exit_code"] == "139"


def test_a_sigkill_is_one_line_and_the_run_ends_failed_at_once(tmp_path, tracking_uri):
    rc, err = _step(["preprocess", "--source", "synthetic", "--output_dir", str(tmp_path / "data")], tmp_path,
                    "kill@run")
    assert rc == -signal.SIGKILL, err[-3000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(
        "verlflow preprocess: error: the step's process was killed by a signal it cannot catch (SIGKILL")
    run = _only_run("preprocess")
    assert run.info.status == "FAILED" and "SIGKILL" in run.data.tags["verlflow.error"]


def test_a_step_that_ends_in_order_leaves_no_watcher_line(tmp_path, tracking_uri):
    """A refusal (exit 2) and a finished step print what they printed before: the watcher says nothing."""
    done = subprocess.run([sys.executable, "-m", "verlflow.cli", "preprocess", "--source", "synthetic",
                           "--output_dir", str(tmp_path / "data"), "--limit", "-3"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=600)
    assert done.returncode == 2
    assert [line for line in done.stderr.splitlines() if line.startswith("verlflow ")] == [
        done.stderr.strip().splitlines()[-1]]
    assert done.stderr.strip().splitlines()[-1].startswith("verlflow preprocess: error: limit must be ")


def test_out_of_memory_under_mlflow_run_names_the_run_failed_not_refused(tmp_path, tracking_uri):
    """An out-of-memory error is a failure of good input: the run ``mlflow run`` made is named "failed", and a bad
    input keeps "refused" (tests/test_mlflow_conventions.py)."""
    from verlflow.tracking.naming import is_generated_name

    run = MlflowClient().create_run("0")  # as mlflow run creates it: no name given, MLflow makes one up
    assert is_generated_name(run.info.run_name)
    done = subprocess.run([sys.executable, str(FAULT_CLI), "memory", "preprocess", "--source", "synthetic",
                           "--output_dir", str(tmp_path / "data")], cwd=tmp_path, text=True, capture_output=True,
                          timeout=600, env={**os.environ, "MLFLOW_RUN_ID": run.info.run_id})  # a real MemoryError
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("verlflow preprocess: error: out of memory in preprocess; ")
    named = MlflowClient().get_run(run.info.run_id)
    assert named.info.run_name.startswith("preprocess · failed: out of memory in preprocess"), named.info.run_name
    assert named.data.tags["verlflow.error"].startswith("out of memory in preprocess; ")
