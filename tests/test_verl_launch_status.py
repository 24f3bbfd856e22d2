"""The verl launch path's failure cases, through the CLI, with a stand-in in place of verl's main module.

The success path runs real verl on the CPU (tests/test_verl_cpu_launch.py). What real verl cannot be made to
do cheaply and on cue stays here: fail *after* logging metrics, and wait to be signalled. The stand-in
(tests/standins/verl_main_standin.py) takes verl's command line, logs through verl's real ``Tracking`` into
our run, and then succeeds (saving an FSDP checkpoint), fails, or waits to be signalled.
It is chosen with the launcher's own option ``verlflow.launch_module``; ``verlflow.skip_preflight=true``
lets the gpu profile run on this CPU machine (the stand-in needs no device). The step runs in this process
(``cli_in_process``; the stand-in is a real process) except where its process is signalled.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_in_process
from mlflow.tracking import MlflowClient

STANDIN = Path(__file__).parent / "standins" / "verl_main_standin.py"


@pytest.fixture(scope="module")
def tiny_model(tiny_workdir) -> Path:
    """The tiny recipe's model, from conftest's session cache (the stand-in only reads it)."""
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    return Path(resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache"))


def _train_args(tmp_path: Path, model: Path) -> list[str]:
    """``verlflow train`` of the tiny recipe on the gpu profile, with the stand-in in place of verl's main module."""
    # One device, rollout TP 1: the tiny recipe's 4 x 4 responses split over the h20 profile's 8 GPUs would leave a
    # per-device mini-batch (2) that its micro-batch (4) cannot divide, which the preflight refuses.
    overrides = (f"verlflow.launch_module={STANDIN} verlflow.skip_preflight=true trainer.n_gpus_per_node=1 "
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=1 "
                 f"verlflow.output_dir={tmp_path / 'outputs'} verlflow.system_metrics_interval=1")
    return ["train", "--recipe", "tiny", "--device", "gpu", "--backend", "verl", "--model", str(model),
            "--data_dir", str(tmp_path / "data"), "--overrides", overrides]


def _train(tmp_path: Path, model: Path, mode: str) -> subprocess.Popen:
    """The train step as a process of its own (for a signal), output piped."""
    return subprocess.Popen([sys.executable, "-m", "verlflow.cli", *_train_args(tmp_path, model)],
                            env={**os.environ, "VERLFLOW_STANDIN_MODE": mode}, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _train_in_process(tmp_path: Path, model: Path, mode: str) -> tuple[int, str]:
    """The train step in this process (what it does with verl's exit is tested, not its process): exit status and
    output (stdout, then stderr)."""
    done = cli_in_process(_train_args(tmp_path, model), env={**os.environ, "VERLFLOW_STANDIN_MODE": mode},
                          cwd=tmp_path)
    return done.returncode, done.stdout + done.stderr


def _only_run():
    client = MlflowClient()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    return runs[0]


def _assert_standin_metrics(run) -> None:
    assert run.data.metrics["critic/score/mean"] == pytest.approx(0.2)
    assert run.data.metrics["val-core/openai/gsm8k/reward/mean_at_1"] == 0.5
    assert run.data.params["actor_rollout_ref/actor/optim/lr"] == "0.001"  # logged by verl's Tracking


@pytest.mark.slow
def test_nonzero_exit_fails_the_run_and_keeps_its_metrics(tracking_uri, tmp_path, tiny_model):
    returncode, out = _train_in_process(tmp_path, tiny_model, "fail")
    assert returncode == 2
    assert "verl exited with status 3: RuntimeError: stand-in failure after step 2" in out
    run = _only_run()
    assert run.info.status == "FAILED"
    assert "status 3" in run.data.tags["verlflow.error"]
    _assert_standin_metrics(run)
    assert "verlflow.checkpoint_dir" not in run.data.tags


@pytest.mark.slow
def test_a_checkpoint_write_that_fails_for_space_names_the_folder_and_its_free_space(tracking_uri, tmp_path,
                                                                                      tiny_model):
    returncode, out = _train_in_process(tmp_path, tiny_model, "file_limit")
    assert returncode == 2, out[-3000:]
    error = next(line for line in out.splitlines() if line.startswith("verlflow train: error:"))
    print(error)
    # verl's checkpoint manager's error (torch's zip writer: "unexpected pos"), not the store's that follows it
    assert "verl exited with status" in error and "unexpected pos" in error, error
    assert re.search(r"a write failed for space in \S+/checkpoints\S* \(\d+ MiB free there\)", error), error
    run = _only_run()
    assert run.info.status == "FAILED"
    _assert_standin_metrics(run)  # what it logged before the checkpoint stays


@pytest.mark.slow
def test_sigterm_is_forwarded_to_verl_and_the_run_is_killed(tracking_uri, tmp_path, tiny_model):
    proc = _train(tmp_path, tiny_model, "hang")
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("STANDIN_WAITING"):
            break
    else:
        pytest.fail("the stand-in never started:\n" + "".join(seen[-50:]))
    standin_pid = int(line.split("pid=")[1])
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]
    with pytest.raises(ProcessLookupError):
        os.kill(standin_pid, 0)  # verl's process got the signal too, and is gone
    run = _only_run()
    assert run.info.status == "KILLED"
    _assert_standin_metrics(run)


def test_verls_error_is_the_exception_line_not_hydras_trailer_after_it():
    from verlflow.backends.verl.output_watch import OutputWatch

    watch = OutputWatch("0" * 32)
    # The end of a real verl 0.9.1 launch whose Ray could not start (recorded here under `ulimit -f 1500`).
    for line in ("  File \".../ray/_private/node.py\", line 440, in __init__",
                 "    raise Exception(",
                 "Exception: The current node timed out during startup. This could happen because some of the "
                 "raylet failed to startup or the GCS has become overloaded.",
                 "",
                 "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
                 "Error executing job with overrides: ['algorithm.adv_estimator=grpo']"):
        watch(line + "\n")
    assert watch.reason().startswith("Exception: The current node timed out during startup.")
