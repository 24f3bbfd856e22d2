"""The steps of verlflow behind one command line, shared by ``mlflow run`` and the console script.

    verlflow train --device cpu            # same as: mlflow run . --env-manager local -e train -P device=cpu
    verlflow --help

:data:`verlflow.steps.STEPS` is the single table of steps, each with its typed request
(:mod:`verlflow.step_requests`): ``MLproject`` declares the same parameters (a test keeps the two equal),
each ``entry_points/<step>.py`` forwards to :func:`main`, and each step is one ``run_<step>`` function of
``verlflow.steps.<step>``, called with the request parsed from the command line. A
:class:`~verlflow.errors.VerlflowError` becomes one line on stderr and exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import sys
from collections.abc import Sequence

from verlflow import fatal_watch, stopping
from verlflow.errors import EXIT_BAD_INPUT, StepFailed, VerlflowError
from verlflow.out_of_memory import hold_reserve, is_out_of_memory, out_of_memory_error
from verlflow.outage.deadline import TrackingDeadline, server_failure
from verlflow.outage.store_retry import store_write_failure
from verlflow.processes import watch_after_end
from verlflow.secrets import mask_text
from verlflow.step_requests import parse_request
from verlflow.steps import STEPS
from verlflow.stopping import stop_interrupted
from verlflow.util import check_env_numbers, gc_paused

# When the process ends, spare the interpreter's last collection passes over every object (~0.8 s once
# MLflow and SQLAlchemy are loaded). Registered on import, before any of them is imported, so it runs
# after every exit hook they register.
atexit.register(gc.freeze)


def build_parser() -> argparse.ArgumentParser:
    """The ``verlflow`` argument parser: one sub-command per step."""
    parser = argparse.ArgumentParser(prog="verlflow", description=__doc__.splitlines()[0])
    subs = parser.add_subparsers(dest="step", required=True, metavar="STEP")
    for step in STEPS.values():
        sub = subs.add_parser(step.name, help=step.help, description=step.help)
        for p in step.params:
            default = "required" if p.default is None else repr(p.default)
            sub.add_argument(f"--{p.name}", required=p.default is None, default=p.default,
                             help=f"{p.help} (default: {default})".replace("%", "%%"))
    from verlflow.steps.runs import add_runs_parser

    add_runs_parser(subs)
    return parser


def run_step(name: str, values: dict[str, str]):
    """Run one step with its raw string parameters (as ``mlflow run`` passes them)."""
    with gc_paused():  # start-up: the step's imports
        from verlflow import known_warnings, progress
        from verlflow.compat import mlflow as compat_mlflow
        from verlflow.outage import deadline, probe
        from verlflow.process import lifecycle
        from verlflow.tracking import lookups, ui_links

        step = STEPS[name]
        request = parse_request(step.request, values)
    check_env_numbers()  # settings read at import: a bad one is one line here, before any run opens
    known_warnings.install()
    progress.quiet_library_bars()
    ui_links.replace_mlflow_links()
    if step.tracks:  # a step that only looks at the machine (doctor) leaves no mlflow.db behind
        probe.use_default_store()
        probe.check_tracking_server()
        if (uri := lookups.tracking_uri()).startswith(("http://", "https://")):
            deadline.bound_tracking(uri)
            compat_mlflow.http_retries_end_at(stopping.STOP)  # a stop ends a hung request after its try under way
    with stopping.installed():  # a SIGTERM before or after the step's run is one line, exit 143, too
        lifecycle.die_with_launcher()
        stopping.stop_point()  # a stop taken while the step loaded and checked its inputs
        stopping.tell_stand(None)  # where a stop leaves this step's work: told by the work itself
        try:
            result = step.run(request)
        except (Exception, deadline.TrackingDeadline):  # after a stop: a call that failed riding out its timeout
            stopping.stop_point()
            raise
        if (keep_end := watch_after_end()) is not None:  # a stop from here on finds no safe point
            stopping.after_last_safe_point(keep_end)
        stopping.stop_point()  # a stop taken after the step's last run ended: the step still says it stopped
        return result


def main(argv: Sequence[str] | None = None, *, own_process: bool | None = None) -> None:
    """Console entry point: ``verlflow <step> --param value …``; exits 2 with one line on bad input.

    ``own_process`` (default: when ``argv`` is read from the command line): the step is this process's whole life,
    so a watcher (:mod:`verlflow.fatal_watch`) is left to report a hard death; a caller running steps inside a
    longer-lived process (a test) gets none."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    hold_reserve()  # memory for the line if the step runs out of it
    with gc_paused():
        args = build_parser().parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k != "step"}
    launched_run = os.environ.get("MLFLOW_RUN_ID")  # mlflow run's; MLflow unsets the variable when the run ends
    if args.step != "runs" and (own_process if own_process is not None else argv is None):
        fatal_watch.start(args.step)  # an abort, a segfault or the OOM killer still gets its line and a FAILED run
    try:
        if args.step == "runs":
            from verlflow.steps.runs import run_runs

            check_env_numbers()
            run_runs(**values)
        else:
            run_step(args.step, values)
    except VerlflowError as exc:
        message = mask_text(str(exc))
        print(f"verlflow {args.step}: error: {message}", file=sys.stderr)
        if args.step != "runs":
            from verlflow.tracking.naming import name_refused_run

            name_refused_run(args.step, message, "failed" if isinstance(exc, StepFailed) else "refused", launched_run)
        sys.exit(EXIT_BAD_INPUT)
    except TrackingDeadline as exc:
        print(f"verlflow {args.step}: error: {mask_text(str(exc))}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except Exception as exc:
        memory = is_out_of_memory(exc)
        if memory:  # one that no step named with its settings
            line = str(out_of_memory_error(f"in {args.step}", {}))
        elif (line := server_failure(exc) or store_write_failure(exc)) is None:
            raise
        line = mask_text(line)
        print(f"verlflow {args.step}: error: {line}", file=sys.stderr)
        if memory and args.step != "runs":
            from verlflow.tracking.naming import name_refused_run

            name_refused_run(args.step, line, "failed", launched_run)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt as exc:
        stop_interrupted(args.step, exc)


if __name__ == "__main__":
    main()
