"""A real verl run on the CPU, stopped after its second checkpoint and resumed: every step logged exactly once.

verl saves ``global_step_N`` before it logs step N, so a run stopped right after a checkpoint may hold a
checkpoint whose step never reached MLflow; ``verlflow train --resume`` must start after the newest
checkpoint whose step *is* in the run (here step 1, 2, 3 or 4, depending on where the SIGTERM takes effect),
never from step 1, in the same MLflow run. verl finishes the step it is in, and on a quiet host the next ones
too (about a second each), while the SIGTERM reaches its Ray workers: a run whose every step reached MLflow
that way is not relaunched (verl would train a step past its last), only ended. Each launch takes about two
minutes on 2 cores (Ray and worker start-up). The first attempt is a real ``verlflow train`` process (the SIGTERM
is what it is there for); the resume runs in this process (verl's processes stay real).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_in_process, every_experiment, wait_until
from mlflow.tracking import MlflowClient
from verl_cpu_run import launch_env, synthetic_data

from verlflow.names import RESUMED_FROM_TAG, TIMING_STEP
from verlflow.tracking.resume import ATTEMPT_METRIC, RESUMED_FROM_STEP_METRIC

STEPS = 4
OVERRIDES = f"trainer.total_training_steps={STEPS} trainer.save_freq=1 trainer.test_freq=-1"


def _wait_for_checkpoint(outputs: Path, step: int, proc: subprocess.Popen, log: Path, deadline_s: float) -> None:
    """Poll until verl's tracker file under ``outputs`` says ``step`` (a complete save of that step)."""

    def saved() -> bool:
        texts = [t.read_text().strip() for t in outputs.glob("*/checkpoints/latest_checkpointed_iteration.txt")]
        return any(text.isdigit() and int(text) >= step for text in texts)

    wait_until(saved, deadline_s, f"verl's checkpoint of step {step}", poll_s=0.5, watch=[proc],
               detail=lambda: log.read_text()[-4000:])


@pytest.mark.slow
@pytest.mark.timeout(2400)  # two verl launches on a busy 2-core machine
def test_a_stopped_verl_run_resumes_from_its_checkpoint_with_every_step_once(tmp_path, tiny_workdir):
    env = launch_env(tmp_path, tiny_workdir / "cache")
    data_dir = synthetic_data(env, tmp_path)
    outputs = tmp_path / "outputs"
    log = tmp_path / "first_attempt.log"
    with log.open("w") as out:
        first = subprocess.Popen(
            [sys.executable, "-m", "verlflow.cli", "train", "--recipe", "tiny", "--device", "cpu", "--backend", "verl",
             "--data_dir", str(data_dir), "--overrides", f"{OVERRIDES} verlflow.output_dir={outputs}"],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            _wait_for_checkpoint(outputs, 2, first, log, deadline_s=1200)
            first.send_signal(signal.SIGTERM)
            assert first.wait(timeout=300) == 128 + signal.SIGTERM
        finally:
            if first.poll() is None:
                first.kill()

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs(every_experiment(client), filter_string="tags.`verlflow.step` = 'train'")
    assert run.info.status == "KILLED"
    run_id = run.info.run_id

    resumed = cli_in_process(["train", "--resume", run_id], env=env, cwd=tmp_path)  # its process is not tested

    assert resumed.returncode == 0, f"{resumed.stdout[-4000:]}\n{resumed.stderr[-4000:]}"
    runs = client.search_runs(every_experiment(client), filter_string="tags.`verlflow.step` = 'train'")
    assert [r.info.run_id for r in runs] == [run_id]  # one MLflow run for both attempts
    assert client.get_run(run_id).info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(run_id, TIMING_STEP))
    assert steps == list(range(1, STEPS + 1))  # every step exactly once
    [resumed_from] = client.get_metric_history(run_id, RESUMED_FROM_STEP_METRIC)
    assert resumed_from.step == 2  # the second attempt
    assert resumed_from.value in range(1, STEPS + 1)  # from a checkpoint, not from step 1
    assert f"global_step_{int(resumed_from.value)}" in client.get_run(run_id).data.tags[RESUMED_FROM_TAG]
    printed = resumed.stdout + resumed.stderr
    if resumed_from.value < STEPS:  # verl loaded the checkpoint and trained the steps after it
        assert f"Resuming from {client.get_run(run_id).data.tags[RESUMED_FROM_TAG]}" in printed
    else:  # verl had trained every step while the SIGTERM took effect: only the run's end was left to do
        assert f"every step up to {STEPS} is in the run already; verl is not launched again" in printed
    assert client.get_run(run_id).data.tags["verlflow.checkpoint_source"].endswith(f"global_step_{STEPS}/actor")
    assert [m.step for m in client.get_metric_history(run_id, ATTEMPT_METRIC)] == [1, 2]


def _checkpoints(root: Path, steps: list[int], tracker: int | None) -> None:
    for step in steps:
        (root / f"global_step_{step}" / "actor").mkdir(parents=True)
        (root / f"global_step_{step}" / "actor" / "fsdp_config.json").write_text("{}")
    if tracker is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(str(tracker))


def _run_logging(steps: list[int]) -> str:
    client = MlflowClient()
    run_id = client.create_run("0").info.run_id
    for step in steps:
        client.log_metric(run_id, TIMING_STEP, 1.0, step=step)
    return run_id


def test_the_resume_point_is_the_newest_checkpoint_whose_step_reached_the_run(tracking_uri, tmp_path):
    from verlflow.backends.verl.resume import choose_resume_point, point_verl_at

    # Steps 1-3 saved (3 was saved but stopped before its metrics were logged); 4 was being written.
    _checkpoints(tmp_path, [1, 2, 3, 4], tracker=3)
    point = choose_resume_point(_run_logging([1, 2]), tmp_path)
    assert (point.step, point.folder, point.rerun) == (2, tmp_path / "global_step_2", [3])
    point_verl_at(point, tmp_path)
    # verl's own reader now loads global_step_2 (resume_mode=auto), so it continues with step 3
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    assert find_latest_ckpt_path(str(tmp_path)) == str(tmp_path / "global_step_2")


def test_a_run_trained_through_its_last_step_is_not_relaunched(tmp_path):
    from verlflow.backends.verl.resume import trained_through

    _checkpoints(tmp_path, [3, 4], tracker=4)
    assert trained_through(tmp_path, 4) == 4  # verl resumed there would train a step 5
    assert trained_through(tmp_path, 5) is None
    assert trained_through(tmp_path, None) is None  # the total comes from the data: verl decides
    assert trained_through(tmp_path / "fresh", 4) is None


def test_a_run_stopped_in_its_first_step_starts_over_and_one_without_checkpoints_is_refused(tracking_uri, tmp_path):
    from verlflow.backends.verl.resume import choose_resume_point, point_verl_at
    from verlflow.errors import VerlflowError

    _checkpoints(tmp_path, [1], tracker=1)
    point = choose_resume_point(_run_logging([]), tmp_path)
    assert (point.step, point.folder) == (0, None)
    point_verl_at(point, tmp_path)
    assert not (tmp_path / "latest_checkpointed_iteration.txt").exists()  # verl trains from scratch

    with pytest.raises(VerlflowError, match="no verl checkpoint of a logged step .* trainer.max_actor_ckpt_to_keep"):
        choose_resume_point(_run_logging([1, 2]), tmp_path / "empty")
