"""``verlflow runs``: list RUNNING runs with whether their process lives; ``--reap`` ends the dead ones;
``upload-spill`` writes a spill file into its runs.

    verlflow runs                    # RUNNING runs of every experiment, alive or dead
    verlflow runs --reap             # mark the dead ones FAILED (tag verlflow.reaped says why)
    verlflow runs upload-spill FILE  # write a spill file (what a tracking outage kept) into its runs

A plain command, not an MLflow entry point: it looks after runs and must not open one itself (under
``mlflow run`` it would be a RUNNING run of its own in the list it is cleaning). ``upload-spill`` is the upload
command that a step prints when the tracking server did not take everything: a console command, so that one
printed before an upgrade still runs after it.
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
    actions = sub.add_subparsers(dest="action", metavar="ACTION")
    upload = actions.add_parser(
        "upload-spill", help="write a spill file into its runs (the command a step prints after an outage)",
        description="Write a spill file (metric points, tables, tags and the final status a tracking outage kept) "
                    "into its runs on MLFLOW_TRACKING_URI; renamed <file>.uploaded once done, so a second run says so.")
    upload.add_argument("spill_file", help="the metrics.spill.jsonl or <run_id>.spill.jsonl file the step printed")


def run_runs(reap: bool, experiment: str, stale_after_s: float, action: str | None = None,
             spill_file: str | None = None) -> list[lifecycle.Reaped]:
    """List RUNNING runs with their liveness, or reap the dead ones; prints one line per run. With ``action``
    ``upload-spill``, upload ``spill_file`` instead (:func:`upload_spill`)."""
    probe.use_default_store()
    if action == "upload-spill":
        upload_spill(spill_file)
        return []
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
        verdict = (lifecycle.why_dead(tags, stale_after_s=stale_after_s, started_ms=run.info.start_time)
                   or "alive (or not a verlflow process)")
        where = f"{tags.get(HOST_TAG, '?')}:{tags.get(PID_TAG, '?')}"
        print(f"{run.info.run_id} {tags.get('verlflow.step', '-'):10} {where:24} {verdict}")
    print(f"runs: {len(running)} RUNNING")
    return []


def upload_spill(path: str) -> None:
    """``verlflow runs upload-spill <file>``: upload a spill file (:func:`verlflow.outage.metric_buffer.main` says
    each outcome in one line); exits with its status when that is not 0 (1: not all written, 2: not a spill file)."""
    from verlflow.outage import metric_buffer

    code = metric_buffer.main(path)
    if code:
        raise SystemExit(code)
