"""Point a resumed verl run at its newest checkpoint whose step reached the MLflow run, so no step is lost.

    verlflow train --resume <run_id>          # a verl run: relaunched from the checkpoint chosen here

verl saves ``global_step_N`` *before* it logs step N's metrics, and resumes at step N+1 after loading
``global_step_N``: a run stopped between the two would lose step N for good. So the resume point is the
newest complete checkpoint whose step has ``timing_s/step`` in the run; the steps after it run again.

verl is pointed there through its own tracker file (``latest_checkpointed_iteration.txt``, read by verl's
``resume_mode=auto``), not by ``trainer.resume_mode=resume_path``: verl's MLflow logger logs the whole
config as params when it attaches, and MLflow refuses a param whose value changed, so a relaunch with
another ``resume_mode`` or ``resume_from_path`` than the first attempt's would lose MLflow logging (verl 0.9
goes on without it, verl 0.5.0 fails). verl 0.5.0 and 0.9 read the tracker file the same way
(``verl.utils.checkpoint.checkpoint_manager.find_latest_ckpt_path``).

A Ray job is pointed where its checkpoints are, on the cluster: its entrypoint runs
``python3 -m verlflow.backends.verl.resume <checkpoint dir>`` (:func:`job_resume_line`) on the head before
verl starts, attached to the run through the job's runtime env; a run that cannot resume fails the job
with the same one line as a local resume.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verlflow.backends.layout import TRACKER_FILE, complete_steps, step_dir, write_tracker
from verlflow.errors import VerlflowError
from verlflow.names import RESUMED_FROM_TAG, TIMING_STEP, metric_names
from verlflow.tracking import lookups, writes

JOB_MODULE = "verlflow.backends.verl.resume"


@dataclass
class ResumePoint:
    """Where a resumed verl attempt starts: after ``step`` (0 = from the start), from ``folder``."""

    step: int
    folder: Path | None
    # Steps whose checkpoint exists but whose metrics never reached the run: run again.
    rerun: list[int]


def complete_checkpoints(root: str | Path) -> list[int]:
    """Steps with a complete verl checkpoint under ``root`` (actor shards' config written, tracker reached)."""
    steps = complete_steps(root, lambda folder: (folder / "actor" / "fsdp_config.json").is_file())
    tracker = Path(root) / TRACKER_FILE
    text = tracker.read_text().strip() if tracker.is_file() else ""
    # verl writes the tracker after a whole save: a folder past it was being written when the run stopped.
    return [s for s in steps if s <= int(text)] if text.isdigit() else steps


def logged_steps(run_id: str) -> set[int]:
    """The training steps whose metrics reached the run (its ``timing_s/step`` history, any verl's name)."""
    return lookups.metric_steps(run_id, metric_names(TIMING_STEP))


def choose_resume_point(run_id: str, checkpoint_dir: str | Path) -> ResumePoint:
    """The newest complete checkpoint whose step is in the run; a clear line when the run cannot resume."""
    checkpoints = complete_checkpoints(checkpoint_dir)
    logged = logged_steps(run_id)
    usable = [s for s in checkpoints if s in logged]
    if usable:
        step = usable[-1]
        return ResumePoint(step, step_dir(checkpoint_dir, step), [s for s in checkpoints if s > step])
    if not logged:  # stopped within its first step: starting over loses nothing and repeats nothing
        return ResumePoint(0, None, checkpoints)
    raise VerlflowError(
        f"resume: run {run_id} logged steps up to {max(logged)} but has no verl checkpoint of a logged step under "
        f"{checkpoint_dir} (trainer.save_freq was -1?): it cannot resume; start a new run with "
        "trainer.save_freq=<N> (and trainer.max_actor_ckpt_to_keep=<K> to bound the disk it takes)")


def stop_stand(run_id: str, checkpoint_dir: str | Path) -> str | None:
    """Where a stopped verl run stands, for its stop line: the checkpoint ``--resume`` continues after, or why there
    is none (:func:`choose_resume_point`'s own reasons); None when the store cannot say (the stop goes on)."""
    resume = f"`verlflow train --resume {run_id}` (-P resume={run_id})"
    try:
        point = choose_resume_point(run_id, checkpoint_dir)
    except VerlflowError as exc:
        return f"no checkpoint to continue from: {str(exc).removeprefix('resume: ')}"
    except Exception:  # noqa: BLE001 - a store that does not answer now costs the line's end, never the stop
        return None
    if point.folder is None:
        return f"no checkpoint: no step had reached the run; {resume} starts it from step 1"
    return f"last checkpoint: step {point.step}, {point.folder}; {resume} continues after it"


def trained_through(checkpoint_dir: str | Path, total_steps: object) -> int | None:
    """The last step, when verl's tracker under ``checkpoint_dir`` already points at it; None while steps remain.

    verl resumed at its last step still trains one more (verl 0.9.1's ``fit`` adds one to the loaded step before
    it checks for the end), so a run whose every step reached it before it was stopped (verl finishes the step it
    is in, and often the next, while a SIGTERM takes effect) is not relaunched. ``total_steps``: the resolved
    ``trainer.total_training_steps`` (None when verl derives it from the data: then verl decides).
    """
    if not isinstance(total_steps, int) or isinstance(total_steps, bool) or total_steps < 1:
        return None
    tracker = Path(checkpoint_dir) / TRACKER_FILE
    text = tracker.read_text().strip() if tracker.is_file() else ""
    return total_steps if text.isdigit() and int(text) >= total_steps else None


def point_verl_at(point: ResumePoint, checkpoint_dir: str | Path) -> None:
    """Make verl's ``resume_mode=auto`` load ``point`` (or start from scratch when it is step 0)."""
    if point.folder is not None:
        write_tracker(checkpoint_dir, point.step)
    else:
        (Path(checkpoint_dir) / TRACKER_FILE).unlink(missing_ok=True)


def record_resume_point(run_id: str, point: ResumePoint) -> None:
    """Record on the run where this attempt continues (metric ``attempt/resumed_from_step``, tag), and say so."""
    from verlflow.tracking import resume as resuming

    resuming.log_resumed_from(run_id, point.step)
    if point.folder is not None:
        writes.set_run_tag(run_id, RESUMED_FROM_TAG, str(point.folder))
    again = f"; step(s) {', '.join(map(str, point.rerun))} checkpointed but never logged run again" \
        if point.rerun else ""
    start = f"after {point.folder}" if point.folder is not None else "from step 1 (no step had reached the run)"
    print(f"verlflow: resume: run {run_id} continues {start}{again}", flush=True)


def job_resume_line(python: str, checkpoint_dir: str) -> str:
    """The Ray job entrypoint's line that points verl at the run's resume point, or ends the job when there is none."""
    return f"{shlex.quote(python)} -m {JOB_MODULE} {shlex.quote(str(checkpoint_dir))} || exit $?"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verlflow.backends.verl.resume <checkpoint dir>``: resume the job's run (``MLFLOW_RUN_ID``) there."""
    parser = argparse.ArgumentParser(prog=f"python -m {JOB_MODULE}", description=main.__doc__)
    parser.add_argument("checkpoint_dir", help="the run's trainer.default_local_dir, as this machine sees it")
    args = parser.parse_args(argv)
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        print("verlflow: error: resume: MLFLOW_RUN_ID is not set (the job's runtime env names the run)",
              file=sys.stderr, flush=True)
        return 2
    try:
        point = choose_resume_point(run_id, args.checkpoint_dir)
    except VerlflowError as exc:
        print(f"verlflow: error: {exc}", file=sys.stderr, flush=True)
        return 2
    point_verl_at(point, args.checkpoint_dir)
    record_resume_point(run_id, point)
    return 0


if __name__ == "__main__":
    sys.exit(main())
