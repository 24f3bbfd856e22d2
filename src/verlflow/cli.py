"""The steps of verlflow behind one command line, shared by ``mlflow run`` and the console script.

    verlflow train --device cpu            # same as: mlflow run . --env-manager local -e train -P device=cpu
    verlflow --help

``STEPS`` is the single table of steps and parameters: ``MLproject`` declares the same ones (a test keeps
the two equal), each ``entry_points/<step>.py`` forwards to :func:`main`, and each step calls one
``run_<step>`` function of the package. A :class:`~verlflow.errors.VerlflowError` becomes one line on
stderr and exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from verlflow.errors import VerlflowError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # SIGINT; a run stopped by signal N exits 128 + N (SIGTERM: 143), as a shell reports it


@dataclass(frozen=True)
class Param:
    """One step parameter; ``default=None`` means required. ``kind``: str, int, float or bool."""

    name: str
    default: str | None
    help: str
    kind: str = "str"


@dataclass(frozen=True)
class Step:
    """A step: its parameters and the ``module:function`` that runs it."""

    name: str
    target: str
    help: str
    params: tuple[Param, ...]


_DEVICE = Param("device", "auto", "auto | npu | gpu | cpu (auto: what this machine has)")
_RECIPE_AUTO = Param("recipe", "auto", "recipe name or .yaml path (auto: the guide's on npu/gpu, smoke on cpu)")

STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step("main", "verlflow.pipeline:run_main", "preprocess → train → register → evaluate → promote", (
            Param("recipe", "smoke", "recipe name or .yaml path"),
            _DEVICE,
            Param("source", "", "GSM8K source for preprocess ('' = the recipe's data_source)"),
            Param("model_name", "", "registered model name ('' = the recipe's model_name)"),
            Param("overrides", "", "verl-style overrides, space separated: key=value key2=value2"),
        )),
        Step("preprocess", "verlflow.steps:run_preprocess", "GSM8K → verl parquet, logged as dataset inputs", (
            Param("source", "openai/gsm8k", "openai/gsm8k (hub) | a folder of train/test jsonl or parquet | synthetic"),
            Param("output_dir", "data/gsm8k", "where train.parquet and test.parquet are written"),
            Param("limit", "0", "rows per split, 0 = all", "int"),
        )),
        Step("train", "verlflow.steps:run_train", "GRPO training through verl (npu/gpu) or the local trainer", (
            _RECIPE_AUTO,
            _DEVICE,
            Param("profile", "auto", "device profile name or .yaml path (auto: a3 on npu, h20 on gpu, cpu on cpu)"),
            Param("data_dir", "data/gsm8k", "folder with train.parquet and test.parquet"),
            Param("model", "", "HF folder or hub id ('' = the recipe's model path)"),
            Param("overrides", "", "verl-style overrides, space separated: key=value key2=value2"),
            Param("backend", "auto", "auto | verl | local (auto: verl on npu/gpu, local on cpu)"),
            Param("dry_run", "false", "verl backend: compose, validate, log and print the command only", "bool"),
            Param("ray_address", "", "submit to this Ray cluster as a Ray job ('' = run locally)"),
            Param("resume", "", "continue this train run from its last checkpoint ('' = a new run)"),
        )),
        Step("evaluate", "verlflow.models.evaluate:run_evaluate", "GSM8K accuracy of a model", (
            Param("model_uri", None, "runs:/<id>/<path> | models:/<name>@<alias> | models:/<name>/<version> | folder"),
            Param("data_dir", "data/gsm8k", "folder with the preprocessed split"),
            Param("split", "test", "train | test"),
            Param("limit", "0", "problems to evaluate, 0 = all", "int"),
            Param("backend", "auto", "auto | hf | vllm"),
        )),
        Step("register", "verlflow.models.registry:run_register", "register a train run's final checkpoint", (
            Param("run_id", None, "the train run"),
            Param("model_name", "", "registered model name ('' = the run's recipe model_name)"),
        )),
        Step("promote", "verlflow.models.registry:run_promote", "move an alias to the best version", (
            Param("model_name", None, "registered model name"),
            Param("metric", "eval/gsm8k/accuracy", "metric to maximise (version tag or source-run metric)"),
            Param("alias", "champion", "alias to move"),
            Param("force", "false", "move even when not strictly better", "bool"),
        )),
        Step("search", "verlflow.search.step:run_search", "Optuna search over lr, KL coefficient and group size", (
            _RECIPE_AUTO,
            _DEVICE,
            Param("n_trials", "20", "trials this worker runs", "int"),
            Param("data_dir", "data/gsm8k", "folder with train.parquet and test.parquet (as for train)"),
            Param("study_name", "", "Optuna study name ('' = derived from the recipe); same name resumes"),
            Param("storage", "", "Optuna storage URL or journal file ('' = a local file store)"),
            Param("pruner", "median", "median | hyperband | none"),
            Param("search_config", "default", "search config name or .yaml path"),
        )),
        Step("compare", "verlflow.compare.step:run_compare", "A3-vs-H20 report from two runs (the guide's §6)", (
            Param("baseline", None, "run id, run name or tag filter (e.g. the H20 run)"),
            Param("candidate", None, "run id, run name or tag filter (e.g. the A3 run)"),
            Param("output_dir", "", "also write the report here ('' = only as run artifacts)"),
            Param("threshold", "0.02", "parity threshold: mean relative difference of curves, 0.02 = 2%", "float"),
        )),
        Step("doctor", "verlflow.device.doctor:run_doctor",
             "can verl launch here? this machine against the guide's stack", (
            _DEVICE,
            Param("profile", "auto", "device profile name or .yaml path (auto: a3 on npu, h20 on gpu)"),
        )),
    )
}


def steps_markdown() -> str:
    """The entry-point table of the README: every step and parameter with its default."""
    lines = ["| entry point | parameter | default | meaning |", "| --- | --- | --- | --- |"]
    for step in STEPS.values():
        for i, p in enumerate(step.params):
            name = f"`{step.name}`" if i == 0 else ""
            default = "*required*" if p.default is None else f"`{p.default}`" if p.default else '`""`'
            lines.append(f"| {name} | `{p.name}` | {default} | {p.help.replace('|', '/')} |")
    return "\n".join(lines)


def _parse_value(param: Param, raw: str):
    if param.kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise VerlflowError(f"--{param.name} must be an integer, got '{raw}'") from None
    if param.kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise VerlflowError(f"--{param.name} must be a number, got '{raw}'") from None
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
    """Import a step's function; a step whose code is not there yet says so in one line."""
    module_name, _, func_name = step.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise VerlflowError(f"step '{step.name}' is not implemented yet") from None
    func = getattr(module, func_name, None)
    if func is None:
        raise VerlflowError(f"step '{step.name}' is not implemented yet")
    return func


def run_step(name: str, values: dict[str, str]):
    """Run one step with its raw string parameters (as ``mlflow run`` passes them)."""
    from verlflow.runs import lifecycle, probe

    step = STEPS[name]
    kwargs = {p.name: _parse_value(p, values[p.name]) for p in step.params}
    target = resolve_target(step)
    probe.check_tracking_server()
    lifecycle.die_with_launcher()
    return target(**kwargs)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: ``verlflow <step> --param value …``; exits 2 with one line on bad input."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k != "step"}
    try:
        if args.step == "runs":
            from verlflow.runs.command import run_runs

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
