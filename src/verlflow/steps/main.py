"""Step ``main``: preprocess → evaluate the starting model → train → register → evaluate → promote.

    mlflow run . --env-manager local --experiment-name verlflow/smoke   # embedded default: smoke recipe, CPU
    mlflow run . --env-manager local -P device=npu      # the same chain with the guide's recipe on A3
    verlflow main --recipe smoke --device cpu           # the same without `mlflow run` (in verlflow/smoke)

The chain logs into the recipe's experiment ``verlflow/<recipe>`` unless the caller chose one
(:mod:`verlflow.runs.experiments`; under ``mlflow run``, its ``--experiment-name``, else Default).
The starting model is evaluated on the same test split as the trained one (a child run ``evaluate · base``
tagged ``verlflow.eval_role=base``, reused like preprocess; the trained model's is ``evaluate · trained``),
so the parent carries ``eval/gsm8k/accuracy`` of the
trained model, ``eval/gsm8k/accuracy_base`` and ``eval/gsm8k/accuracy_gain``, and the last line says both.

Each step is a child run of the parent (tag ``mlflow.parentRunId``). A preprocess or train run that
FINISHED earlier with the same step parameters (compared as strings, as MLflow's multistep example
does) and the same code version (tag ``verlflow.code_version``: the git commit of the package, plus a
hash of uncommitted changes; the package version outside git) is reused instead of redone; the parent
then carries ``verlflow.reused_run_id.<step>`` and the log says so. Train runs are matched on their
data's digest as well, so new data means a new training. register, evaluate and promote always run:
they are cheap and act on the registry as it is now (a reused train run keeps the version it was
registered as, no duplicate; promote moves ``champion`` only to a strictly better version).

Steps run **in this process**, not as ``mlflow run -e <step>`` subprocesses. Each child run is created
the way ``mlflow run`` creates one (parent link, step parameters logged as params, tags), then the
step is called with its request and that run's id, and attaches to it as it does to the run ``mlflow run
-e <step>`` creates. So a
child looks the same as a standalone step run and either can be reused, while the chain saves the
~10 s of interpreter, torch and verl start-up per step and passes results (data folder, run ids, the
registered version) as Python values read back from the runs' tags. The training itself still runs
in a subprocess where the backend needs one (verl under Ray).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Param, Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from verlflow import __version__, config, names
from verlflow.config import Device, VerlflowBlock
from verlflow.errors import VerlflowError
from verlflow.models.registry import CHAMPION, PromotionDecision
from verlflow.names import (
    CHAMPION_VERSION_TAG,
    CHECKPOINT_DIR_TAG,
    CODE_VERSION_TAG,
    DATA_DIGEST_TAG,
    DATA_DIR_TAG,
    DATA_RUN_ID_TAG,
    ERROR_TAG,
    EVAL_ROLE_TAG,
    MODEL_NAME_TAG,
    MODEL_VERSION_TAG,
    RECIPE_TAG,
    REUSED_TAG_PREFIX,
    STEP_RUN_TAG_PREFIX,
    STEP_TAG,
)
from verlflow.runs import tracking
from verlflow.runs.experiments import recipe_experiment
from verlflow.runs.store_retry import LockRetryingClient
from verlflow.step_requests import (
    EvaluateRequest,
    MainRequest,
    PreprocessRequest,
    PromoteRequest,
    RegisterRequest,
    TrainRequest,
    as_params,
    as_text,
)
from verlflow.util import filter_quote

log = logging.getLogger(__name__)

# The steps the chain runs, in order (the starting model's evaluation, BASE_EVAL, comes before train).
CHAIN = ("preprocess", "train", "register", "evaluate", "promote")
PROMOTE_METRIC = names.EVAL_ACCURACY
# The starting model's evaluation: an ``evaluate`` run with this role tag, named by BASE_EVAL in the parent.
BASE_EVAL = "evaluate_base"
# What each link of the chain does, printed as it starts (the long ones would otherwise be silent for minutes).
PHASES = {
    "preprocess": "preparing the data",
    BASE_EVAL: "evaluating the starting model",
    "train": "training",
    "register": "registering the trained checkpoint",
    "evaluate": "evaluating the trained model",
    "promote": "deciding the champion",
}
# What the UI shows for the two evaluations: which model each one measured.
BASE_EVAL_RUN_NAME = "evaluate · base"
TRAINED_EVAL_RUN_NAME = "evaluate · trained"


@dataclass
class PipelineResult:
    """The parent run, each step's run (reused or new), and what the chain produced."""

    parent_run_id: str
    step_run_ids: dict[str, str]
    reused: dict[str, str] = field(default_factory=dict)
    model_name: str = ""
    model_version: str = ""
    accuracy: float | None = None
    # The starting model's accuracy on the same problems (None when it could not be evaluated here).
    accuracy_base: float | None = None
    promotion: PromotionDecision | None = None


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The code a step ran with: git commit of the package (+ hash of uncommitted edits), else its version."""
    package_dir = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(package_dir), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=20)
        if head.returncode != 0:
            return f"verlflow-{__version__}"
        diff = subprocess.run(["git", "-C", str(package_dir), "diff", "HEAD", "--", "."],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return f"verlflow-{__version__}"
    commit = head.stdout.strip()
    if diff.returncode == 0 and diff.stdout:
        return f"{commit}+{hashlib.sha256(diff.stdout.encode()).hexdigest()[:12]}"
    return commit


@dataclass
class Plan:
    """Everything the chain needs, resolved and checked before any run is opened."""

    recipe: str
    device: Device
    source: str
    model_name: str
    overrides: str
    data_dir: Path
    # The recipe's starting model (actor_rollout_ref.model.path after overrides) and response budget.
    start_model: str = ""
    max_response_length: int = 0


def make_plan(request: MainRequest) -> Plan:
    """Resolve defaults (the recipe's data source and model name, the device) and fail fast on bad input."""
    from verlflow.backends.train_setup import choose_train_setup

    recipe, source, model_name, overrides = request.recipe, request.source, request.model_name, request.overrides
    _, dev, profile, _ = choose_train_setup(recipe, request.device, "auto", "auto")
    composed = config.compose(recipe, profile, overrides)  # an unknown override key fails here, not later
    # An empty data_source in a recipe means the default, as an absent one does.
    source = source or composed.verlflow.data_source or VerlflowBlock.data_source
    name = model_name or composed.verlflow.model_name
    if not name:
        raise VerlflowError(f"recipe '{recipe}' names no verlflow.model_name: pass -P model_name=<name>")
    from verlflow.models.registry import check_model_name

    check_model_name(name)  # before preprocess and train, not minutes later at register
    from verlflow.data.recipe_data import default_data_dir

    resolved = composed.resolved
    return Plan(recipe=recipe, device=dev, source=source, model_name=name, overrides=overrides,
                data_dir=default_data_dir(source).resolve(), start_model=str(resolved.actor_rollout_ref.model.path),
                max_response_length=int(resolved.data.max_response_length))


class StepRunner:
    """Runs steps as child runs of one parent, reusing a matching FINISHED run where allowed."""

    def __init__(self, client: MlflowClient, parent: Run):
        self.client = client
        self.parent_id = parent.info.run_id
        self.experiment_id = parent.info.experiment_id
        self.code = code_version()
        self.runs: dict[str, str] = {}
        self.reused: dict[str, str] = {}

    def find_reusable(self, step: str, params: dict[str, str], match_tags: dict[str, str],
                      still_valid: Callable[[Run], bool]) -> Run | None:
        """The newest FINISHED run of ``step`` with these params (as strings), code version and tags."""
        query = (f"tags.`{STEP_TAG}` = '{step}' and attributes.status = 'FINISHED' "
                 f"and tags.`{CODE_VERSION_TAG}` = '{self.code}'")
        candidates = self.client.search_runs([self.experiment_id], query, order_by=["attributes.start_time DESC"],
                                             max_results=200)
        for run in candidates:
            if run.info.run_id == self.parent_id:
                continue
            same_params = all(run.data.params.get(k) == v for k, v in params.items())
            same_tags = all(run.data.tags.get(k) == v for k, v in match_tags.items())
            if same_params and same_tags and still_valid(run):
                return run
        return None

    def run(self, step: str, request: Any, call: Callable[..., Any], *, reusable: bool = False,
            match_tags: dict[str, str] | None = None, still_valid: Callable[[Run], bool] = lambda run: True,
            tags: dict[str, str] | None = None, name: str = "", run_name: str = "",
            extra_params: dict[str, Any] | None = None) -> tuple[Run, Any]:
        """Reuse or run one step; returns its (ended) run and, when it ran, what the step returned.

        The child run logs the request's parameters (plus ``extra_params``) as ``mlflow run`` would, and
        ``call(request, run_id=<child>)`` runs the step in it. ``name`` tells apart two runs of one step in
        the chain (parent tags, log; default ``step``); ``run_name`` is what the MLflow UI shows (default ``name``).
        """
        params = {**as_params(request), **{k: as_text(v) for k, v in (extra_params or {}).items()}}
        match_tags = match_tags or {}
        name = name or step
        if reusable and (found := self.find_reusable(step, params, match_tags, still_valid)):
            run_id = found.info.run_id
            print(f"main: {name}: reusing FINISHED run {run_id} (same parameters and code version)")
            self.client.set_tag(self.parent_id, f"{REUSED_TAG_PREFIX}{name}", run_id)
            self.client.set_tag(self.parent_id, f"{STEP_RUN_TAG_PREFIX}{name}", run_id)
            self.runs[name], self.reused[name] = run_id, run_id
            return found, None
        child = self.client.create_run(self.experiment_id, run_name=run_name or name, tags={
            MLFLOW_PARENT_RUN_ID: self.parent_id, STEP_TAG: step, CODE_VERSION_TAG: self.code,
            **match_tags, **(tags or {}),
        })
        run_id = child.info.run_id
        self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
        self.client.set_tag(self.parent_id, f"{STEP_RUN_TAG_PREFIX}{name}", run_id)
        self.runs[name] = run_id
        print(f"main: {name}: run {run_id}: {PHASES.get(name, step)} …", flush=True)
        with _ended(self.client, run_id):
            value = call(request, run_id=run_id)
        return self.client.get_run(run_id), value


@contextlib.contextmanager
def _ended(client: MlflowClient, run_id: str) -> Iterator[None]:
    """Never leave the step's run RUNNING: a step that failed before it opened the run did not end it."""
    error: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        error = exc
        raise
    finally:
        with contextlib.suppress(MlflowException):
            if client.get_run(run_id).info.status == "RUNNING":
                client.set_terminated(run_id, tracking.end_status(error))
                if error is not None:
                    client.set_tag(run_id, ERROR_TAG, f"{type(error).__name__}: {error}"[:500])


def _data_present(run: Run) -> bool:
    folder = run.data.tags.get(DATA_DIR_TAG)
    return bool(folder) and all((Path(folder) / f"{s}.parquet").is_file() for s in ("train", "test"))


def _checkpoint_current(client: MlflowClient, experiment_id: str) -> Callable[[Run], bool]:
    """A train run's checkpoint is still its own: present, and no later run wrote the same folder."""

    def check(run: Run) -> bool:
        folder = run.data.tags.get(CHECKPOINT_DIR_TAG)
        if not folder or not (Path(folder) / "config.json").is_file():
            return False
        escaped = filter_quote(folder)
        newest = client.search_runs([experiment_id], f"tags.`{CHECKPOINT_DIR_TAG}` = '{escaped}'",
                                    order_by=["attributes.start_time DESC"], max_results=1)
        return bool(newest) and newest[0].info.run_id == run.info.run_id

    return check


def run_main(request: MainRequest) -> PipelineResult:
    """Chain preprocess → evaluate the starting model → train → register → evaluate → promote under one parent
    run (step ``main``)."""
    from verlflow.models.evaluate import evaluate_model
    from verlflow.steps.preprocess import run_preprocess
    from verlflow.steps.promote import run_promote
    from verlflow.steps.register import run_register
    from verlflow.steps.train import run_train

    plan = make_plan(request)
    client = LockRetryingClient()
    parent_tags = {STEP_TAG: "main", RECIPE_TAG: plan.recipe, MODEL_NAME_TAG: plan.model_name,
                   CODE_VERSION_TAG: code_version()}
    with tracking.tracked_run(run_name="main", tags=parent_tags, experiment=recipe_experiment(plan.recipe)) as active:
        runner = StepRunner(client, client.get_run(active.info.run_id))

        pre, _ = runner.run(
            "preprocess", PreprocessRequest(source=plan.source, output_dir=str(plan.data_dir), limit=0),
            run_preprocess, reusable=True, still_valid=_data_present,
        )
        data_dir = pre.data.tags[DATA_DIR_TAG]
        base_accuracy = _evaluate_start_model(runner, plan, data_dir, pre.data.tags.get(DATA_DIGEST_TAG, ""))

        train, _ = runner.run(
            "train", TrainRequest(recipe=plan.recipe, device=plan.device, data_dir=data_dir, overrides=plan.overrides),
            run_train, reusable=True, match_tags={DATA_DIGEST_TAG: pre.data.tags.get(DATA_DIGEST_TAG, "")},
            still_valid=_checkpoint_current(client, runner.experiment_id),
            tags={DATA_RUN_ID_TAG: pre.info.run_id},
        )

        reg, _ = runner.run("register", RegisterRequest(run_id=train.info.run_id, model_name=plan.model_name),
                            run_register)
        version = reg.data.tags[MODEL_VERSION_TAG]

        model_uri = f"models:/{plan.model_name}/{version}"
        _, result = runner.run(
            "evaluate", EvaluateRequest(model_uri=model_uri, data_dir=data_dir),
            lambda req, run_id: evaluate_model(req.model_uri, req.data_dir, req.split, req.limit, req.backend,
                                               run_name=TRAINED_EVAL_RUN_NAME, run_id=run_id),
            tags={EVAL_ROLE_TAG: "trained"}, run_name=TRAINED_EVAL_RUN_NAME,
        )

        _, decision = runner.run(
            "promote", PromoteRequest(model_name=plan.model_name, metric=PROMOTE_METRIC, alias=CHAMPION),
            run_promote,
        )
        client.set_tag(active.info.run_id, MODEL_VERSION_TAG, version)
        client.set_tag(active.info.run_id, CHAMPION_VERSION_TAG, decision.version or "")
        outcome = {names.EVAL_ACCURACY: result.accuracy}
        if base_accuracy is not None:
            outcome |= {names.EVAL_ACCURACY_BASE: base_accuracy,
                        names.EVAL_ACCURACY_GAIN: result.accuracy - base_accuracy}
        for key, value in outcome.items():
            client.log_metric(active.info.run_id, key, value)

    reused = ", ".join(runner.reused) or "none"
    print(f"main: done (parent run {active.info.run_id}): {plan.model_name} version {version}: "
          f"{_accuracy_line(base_accuracy, result.accuracy, result.num_samples)}; "
          f"champion = version {decision.version}; reused steps: {reused}")
    return PipelineResult(
        parent_run_id=active.info.run_id, step_run_ids=dict(runner.runs), reused=dict(runner.reused),
        model_name=plan.model_name, model_version=version, accuracy=result.accuracy, accuracy_base=base_accuracy,
        promotion=decision,
    )


def _evaluate_start_model(runner: StepRunner, plan: Plan, data_dir: str, data_digest: str) -> float | None:
    """Evaluate the recipe's starting model on the test split once (reused after); its accuracy, or None.

    A hub id is evaluated from Hugging Face's cache (downloaded into it first, as verl does for training).
    """
    from verlflow.models import evaluate, model_path

    print(f"main: starting model: {plan.start_model}", flush=True)
    folder = model_path.resolve_model_path(plan.start_model)
    run, result = runner.run(
        "evaluate", EvaluateRequest(model_uri=folder, data_dir=data_dir),
        lambda req, run_id: evaluate.evaluate_model(req.model_uri, req.data_dir, req.split, req.limit, req.backend,
                                                    max_new_tokens=plan.max_response_length,
                                                    run_name=BASE_EVAL_RUN_NAME, run_id=run_id),
        reusable=True, match_tags={EVAL_ROLE_TAG: "base", DATA_DIGEST_TAG: data_digest}, name=BASE_EVAL,
        run_name=BASE_EVAL_RUN_NAME, extra_params={"max_new_tokens": plan.max_response_length},
    )
    return result.accuracy if result is not None else run.data.metrics.get(names.EVAL_ACCURACY)


def _accuracy_line(base: float | None, trained: float, problems: int) -> str:
    """``accuracy 0.1270 → 0.4219 (+29.5 points) on 512 test problems`` (without base: the trained one only)."""
    if base is None:
        return f"accuracy {trained:.4f} on {problems} test problems"
    return (f"accuracy {base:.4f} → {trained:.4f} ({100 * (trained - base):+.1f} points) on {problems} test "
            "problems (starting model → trained)")
