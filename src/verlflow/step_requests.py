"""One typed request per step: its parameters, written once, with their defaults and help.

    python -c "from verlflow.step_requests import TrainRequest as t, params_of; print([p.name for p in params_of(t)])"

Each request is a frozen dataclass whose fields are the step's parameters in ``MLproject`` order; the
command-line parser, ``MLproject`` (tests/test_project_contract.py), the README's table and the params a
``main`` child run logs are all read from these fields; :data:`verlflow.steps.STEPS` pairs each with its
step. It sits below every package (like :mod:`verlflow.names`), so ``tracking.resume`` and ``compare`` read
requests too. :func:`parse_request` turns the strings that ``mlflow run`` and the command line pass into a
request, with one line naming a bad value.
"""

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from verlflow.errors import VerlflowError

_HELP = "help"


def _param(help_text: str, default: Any = dataclasses.MISSING) -> Any:
    """A request field: its default (none: required) and the help the parser and the README show."""
    return dataclasses.field(default=default, metadata={_HELP: help_text})


_DEVICE = "auto | npu | gpu | cpu (auto: what this machine has)"
_RECIPE_AUTO = "recipe name or .yaml path (auto: the guide's on npu/gpu, smoke on cpu)"
_OVERRIDES = "verl-style overrides, space separated: key=value key2=value2"


@dataclass(frozen=True)
class MainRequest:
    """``main``: preprocess → evaluate the starting model → train → register → evaluate → promote."""

    recipe: str = _param("recipe name or .yaml path", "smoke")
    device: str = _param(_DEVICE, "auto")
    source: str = _param("GSM8K source for preprocess ('' = the recipe's data_source)", "")
    model_name: str = _param("registered model name ('' = the recipe's model_name)", "")
    overrides: str = _param(_OVERRIDES, "")


@dataclass(frozen=True)
class PreprocessRequest:
    """``preprocess``: GSM8K → verl parquet."""

    source: str = _param("openai/gsm8k (hub) | a folder of train/test jsonl or parquet | synthetic", "openai/gsm8k")
    output_dir: str = _param("where train.parquet and test.parquet are written ('' = data/<source>)", "")
    limit: int = _param("rows per split, 0 = all", 0)


@dataclass(frozen=True)
class TrainRequest:
    """``train``: GRPO training."""

    recipe: str = _param(_RECIPE_AUTO, "auto")
    device: str = _param(_DEVICE, "auto")
    profile: str = _param(
        "device profile name or .yaml path (auto: the record of the accelerator npu-smi/nvidia-smi list; cpu)", "auto")
    data_dir: str = _param("folder with train.parquet and test.parquet ('' = the recipe's: data/<data_source>)", "")
    model: str = _param("HF folder or hub id ('' = the recipe's model path)", "")
    overrides: str = _param(_OVERRIDES, "")
    backend: str = _param("auto | verl | local (auto: verl on npu/gpu, local on cpu)", "auto")
    dry_run: bool = _param("verl backend: compose, validate, log and print the command only", False)
    ray_address: str = _param("Ray job to http://<head>:8265, every node sampled ('' = run locally)", "")
    resume: str = _param("continue this train run from its last checkpoint ('' = a new run)", "")


@dataclass(frozen=True)
class EvaluateRequest:
    """``evaluate``: GSM8K accuracy of a model."""

    model_uri: str = _param("runs:/<id>/<path> | models:/<name>@<alias> | models:/<name>/<version> | folder | hub id")
    data_dir: str = _param("folder with the preprocessed split ('' = the data the model trained on)", "")
    split: str = _param("train | test", "test")
    limit: int = _param("problems to evaluate, 0 = all", 0)
    backend: str = _param("auto | hf | vllm", "auto")


@dataclass(frozen=True)
class RegisterRequest:
    """``register``: a train run's final checkpoint as a model version."""

    run_id: str = _param("the train run")
    model_name: str = _param("registered model name ('' = the run's recipe model_name)", "")


@dataclass(frozen=True)
class PromoteRequest:
    """``promote``: move an alias to the best version."""

    model_name: str = _param("registered model name")
    metric: str = _param("metric to maximise (version tag or source-run metric)", "eval/gsm8k/accuracy")
    alias: str = _param("alias to move", "champion")
    force: bool = _param("move even when not better beyond the noise", False)


@dataclass(frozen=True)
class SearchRequest:
    """``search``: an Optuna search worker."""

    recipe: str = _param(_RECIPE_AUTO, "auto")
    device: str = _param(_DEVICE, "auto")
    n_trials: int = _param("trials this worker runs", 20)
    data_dir: str = _param("folder with train.parquet and test.parquet ('' = the recipe's, as for train)", "")
    study_name: str = _param("Optuna study name ('' = derived from the recipe); same name resumes", "")
    storage: str = _param("Optuna storage URL or journal file ('' = a local file store)", "")
    pruner: str = _param("median | hyperband | none", "median")
    search_config: str = _param("search config name or .yaml path", "default")


@dataclass(frozen=True)
class CompareRequest:
    """``compare``: the A3-vs-H20 report from two runs."""

    baseline: str = _param("run id or name, a comma list of runs, or a tag filter (every run it matches; e.g. H20)")
    candidate: str = _param("run id or name, a comma list of runs, or a tag filter (every run it matches; e.g. A3)")
    output_dir: str = _param("also write the report here ('' = only as run artifacts)", "")
    threshold: float = _param("parity threshold: mean relative difference of curves, 0.02 = 2%", 0.02)
    prices: str = _param(
        "YAML of prices per profile, per node_hour, chip_hour or device_hour, e.g. a3: {chip_hour: 3} ('' = none)", "")


@dataclass(frozen=True)
class DoctorRequest:
    """``doctor``: this machine against the guide's stack."""

    device: str = _param(_DEVICE, "auto")
    profile: str = _param(
        "device profile name or .yaml path (auto: the record of the accelerator npu-smi / nvidia-smi list)", "auto")


REQUEST_TYPES = (MainRequest, PreprocessRequest, TrainRequest, EvaluateRequest, RegisterRequest, PromoteRequest,
                 SearchRequest, CompareRequest, DoctorRequest)


@dataclass(frozen=True)
class Param:
    """One step parameter as ``MLproject`` and the command line show it: ``default=None`` means required."""

    name: str
    default: str | None
    help: str
    kind: type


def as_text(value: Any) -> str:
    """A parameter value as ``mlflow run`` writes and logs it (``false``, not ``False``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def params_of(request_type: type) -> tuple[Param, ...]:
    """The parameters of a request type, in order, with their defaults as ``MLproject`` writes them."""
    return tuple(
        Param(f.name, None if f.default is dataclasses.MISSING else as_text(f.default), f.metadata[_HELP], f.type)
        for f in dataclasses.fields(request_type)
    )


def as_params(request: Any) -> dict[str, str]:
    """A request's parameters as the strings ``mlflow run`` logs as run params."""
    return {f.name: as_text(getattr(request, f.name)) for f in dataclasses.fields(request)}


def parse_request(request_type: type, values: dict[str, str]):
    """Build a request from the strings of the command line; a bad number or flag is one line naming it."""
    return request_type(**{p.name: _parse_value(p, values[p.name]) for p in params_of(request_type)})


def _parse_value(param: Param, raw: str):
    if param.kind is int:
        try:
            return int(raw)
        except ValueError:
            raise VerlflowError(f"--{param.name} must be an integer, got '{raw}'") from None
    if param.kind is float:
        try:
            value = float(raw)
        except ValueError:
            raise VerlflowError(f"--{param.name} must be a number, got '{raw}'") from None
        if not math.isfinite(value):
            raise VerlflowError(f"--{param.name} must be a finite number, got '{raw}'")
        return value
    if param.kind is bool:
        lowered = raw.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no", ""):
            return False
        raise VerlflowError(f"--{param.name} must be true or false, got '{raw}'")
    return raw
