"""The steps of verlflow behind one command line, shared by ``mlflow run`` and the console script.

    verlflow train --device cpu            # same as: mlflow run . --env-manager local -e train -P device=cpu
    verlflow --help

:data:`verlflow.steps.STEPS` is the single table of steps and parameters: ``MLproject`` declares the same
ones (a test keeps the two equal), each ``entry_points/<step>.py`` forwards to :func:`main`, and each step
calls one ``run_<step>`` function of its package (``verlflow.train``, ``verlflow.data.step``, …). A
:class:`~verlflow.errors.VerlflowError` becomes one line on stderr and exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import logging
import math
import sys
from collections.abc import Sequence

from verlflow.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, VerlflowError
from verlflow.steps import STEPS, Param, Step
from verlflow.util import check_env_numbers, gc_paused

# When the process ends, spare the interpreter's last collection passes over every object (~0.8 s once
# MLflow and SQLAlchemy are loaded). Registered on import, before any of them is imported, so it runs
# after every exit hook they register.
atexit.register(gc.freeze)


def _parse_value(param: Param, raw: str):
    if param.kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise VerlflowError(f"--{param.name} must be an integer, got '{raw}'") from None
    if param.kind == "float":
        try:
            value = float(raw)
        except ValueError:
            raise VerlflowError(f"--{param.name} must be a number, got '{raw}'") from None
        if not math.isfinite(value):
            raise VerlflowError(f"--{param.name} must be a finite number, got '{raw}'")
        return value
    if param.kind == "bool":
        lowered = raw.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no", ""):
            return False
        raise VerlflowError(f"--{param.name} must be true or false, got '{raw}'")
    return raw


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
    from verlflow.runs.command import add_runs_parser

    add_runs_parser(subs)
    return parser


def resolve_target(step: Step):
    """Import a step's function (``module:function``) only when that step runs, so ``--help`` stays fast."""
    module_name, _, func_name = step.target.partition(":")
    return getattr(importlib.import_module(module_name), func_name)


def run_step(name: str, values: dict[str, str]):
    """Run one step with its raw string parameters (as ``mlflow run`` passes them)."""
    with gc_paused():  # start-up: the step's imports
        from verlflow import known_warnings, progress
        from verlflow.runs import lifecycle, probe

        step = STEPS[name]
        kwargs = {p.name: _parse_value(p, values[p.name]) for p in step.params}
        target = resolve_target(step)
    check_env_numbers()  # settings read at import: a bad one is one line here, before any run opens
    known_warnings.install()
    progress.quiet_library_bars()
    probe.check_tracking_server()
    lifecycle.die_with_launcher()
    return target(**kwargs)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: ``verlflow <step> --param value …``; exits 2 with one line on bad input."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with gc_paused():
        args = build_parser().parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k != "step"}
    try:
        if args.step == "runs":
            from verlflow.runs.command import run_runs

            check_env_numbers()
            run_runs(**values)
        else:
            run_step(args.step, values)
    except VerlflowError as exc:
        print(f"verlflow {args.step}: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt as exc:
        print(f"verlflow {args.step}: interrupted", file=sys.stderr)
        sys.exit(128 + exc.signum if isinstance(getattr(exc, "signum", None), int) else EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
