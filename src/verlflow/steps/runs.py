"""``verlflow runs``: list RUNNING runs with whether their process lives; ``--reap`` ends the dead ones.

    verlflow runs                    # RUNNING runs of every experiment, alive or dead
    verlflow runs --reap             # mark the dead ones FAILED (tag verlflow.reaped says why)

A plain command, not an MLflow entry point: it looks after runs and must not open one itself (under
``mlflow run`` it would be a RUNNING run of its own in the list it is cleaning).
"""

from __future__ import annotations

from verlflow.names import HOST_TAG, PID_TAG
from verlflow.outage import probe
from verlflow.process import lifecycle


def add_runs_parser(subs) -> None:
    """Add the ``runs`` sub-command to the ``verlflow`` parser."""
    sub = subs.add_parser("runs", help="list RUNNING runs; --reap marks those without a live process FAILED",
                          description=__doc__.splitlines()[0])
    sub.add_argument("--reap", action="store_true", help="mark RUNNING runs whose process is gone as FAILED")
    sub.add_argument("--experiment", default="", help="experiment name ('' = every experiment)")
    sub.add_argument("--stale_after_s", type=float, default=lifecycle.STALE_AFTER_S,
                     help="a run of another host is dead after this long without a heartbeat")


def run_runs(reap: bool, experiment: str, stale_after_s: float) -> list[lifecycle.Reaped]:
    """List RUNNING runs with their liveness, or reap the dead ones; prints one line per run."""
    probe.use_default_store()
    probe.check_tracking_server()
    ids = lifecycle.experiment_ids_named(experiment)
    if reap:
        reaped = lifecycle.reap(ids, stale_after_s=stale_after_s)
        for item in reaped:
            print(f"reaped {item.run_id}: {item.reason}")
        print(f"runs: {len(reaped)} dead RUNNING run(s) marked FAILED")
        return reaped
    running = lifecycle.running_runs(ids)
    for run in running:
        tags = run.data.tags
        verdict = lifecycle.why_dead(tags, stale_after_s=stale_after_s) or "alive (or not a verlflow process)"
        where = f"{tags.get(HOST_TAG, '?')}:{tags.get(PID_TAG, '?')}"
        print(f"{run.info.run_id} {tags.get('verlflow.step', '-'):10} {where:24} {verdict}")
    print(f"runs: {len(running)} RUNNING")
    return []
