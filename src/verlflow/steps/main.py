"""Step ``main``: preprocess → evaluate the starting model → train → register → evaluate → promote.

    mlflow run . --env-manager local --experiment-name verlflow/smoke   # embedded default: smoke recipe, CPU
    mlflow run . --env-manager local -P device=npu      # the same chain with the guide's recipe on A3
    verlflow main --recipe smoke --device cpu           # the same without `mlflow run` (in verlflow/smoke)

The chain logs into the recipe's experiment ``verlflow/<recipe>`` unless the caller chose one
(:mod:`verlflow.tracking.experiments`; under ``mlflow run``, its ``--experiment-name``, else Default).
The starting model is evaluated on the same test split as the trained one (a child run ``evaluate · base``
tagged ``verlflow.eval_role=base``, reused like preprocess; the trained model's is ``evaluate · trained``),
so the parent carries ``eval/gsm8k/accuracy`` of the
trained model, ``eval/gsm8k/accuracy_base`` and ``eval/gsm8k/accuracy_gain``, and the last line says both.

Each step is a child run of the parent (tag ``mlflow.parentRunId``). A preprocess or train run that
FINISHED earlier with the same step parameters (compared as strings, as MLflow's multistep example
does) and the same code version (tag ``verlflow.code_version``: the git commit of the package, plus a
hash of uncommitted changes; the package version outside git) is reused instead of redone; the parent
then carries ``verlflow.reused_run_id.<step>`` and the log says so. Train runs are matched on their
data's digest as well, so new data means a new training; the trained model's evaluation on the trained
version's source run (an unchanged model is not measured again). Runs are matched in every experiment of the
store, so a rerun filed in another experiment (``--experiment-name``) redoes nothing. register and promote
always run: they are cheap and act on the registry as it is now (a reused train run keeps the version it was
registered as, no duplicate; promote moves ``champion`` only to a version better beyond the evaluation's
noise), and the last line says which version is champion and why.

The reuse engine (child runs, what counts as the same run, what must still exist) is
:mod:`verlflow.tracking.reuse`; this module only chains the steps.

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

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verlflow import config, names
from verlflow.config import VerlflowBlock
from verlflow.errors import VerlflowError
from verlflow.models.registry import CHAMPION, PromotionDecision, describe_version
from verlflow.names import (
    CHAMPION_VERSION_TAG,
    CHECKPOINT_DIR_TAG,
    CODE_VERSION_TAG,
    DATA_DIGEST_TAG,
    DATA_DIR_TAG,
    DATA_RUN_ID_TAG,
    EVAL_ROLE_TAG,
    MODEL_NAME_TAG,
    MODEL_VERSION_TAG,
    RECIPE_TAG,
    SOURCE_RUN_TAG,
    STEP_TAG,
)
from verlflow.outage.store_retry import LockRetryingClient
from verlflow.platforms import Device
from verlflow.step_requests import (
    EvaluateRequest,
    MainRequest,
    PreprocessRequest,
    PromoteRequest,
    RegisterRequest,
    TrainRequest,
)
from verlflow.tracking import naming as run_names
from verlflow.tracking import tracking, ui_links, writes
from verlflow.tracking.experiments import recipe_experiment
from verlflow.tracking.reuse import StepRunner, checkpoint_current, code_version, data_present

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
    from verlflow.backends.train_setup import choose_train_setup, settle_device

    recipe, source, model_name, overrides = request.recipe, request.source, request.model_name, request.overrides
    _, dev, profile, _ = choose_train_setup(recipe, request.device, "auto", "auto")
    settle_device(dev, recipe, profile, overrides, dry_run=None)  # no NPU/GPU here: said before the data's download
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


def run_main(request: MainRequest) -> PipelineResult:
    """Chain preprocess → evaluate the starting model → train → register → evaluate → promote under one parent
    run (step ``main``)."""
    from verlflow.steps.preprocess import run_preprocess
    from verlflow.steps.promote import run_promote
    from verlflow.steps.register import run_register
    from verlflow.steps.train import run_train

    plan = make_plan(request)
    client = LockRetryingClient()
    parent_tags = {STEP_TAG: "main", RECIPE_TAG: plan.recipe, MODEL_NAME_TAG: plan.model_name,
                   CODE_VERSION_TAG: code_version()}
    with tracking.tracked_run(run_name=run_names.main_run_name(plan.model_name), tags=parent_tags,
                              experiment=recipe_experiment(plan.recipe)) as active:
        runner = StepRunner(client, client.get_run(active.info.run_id), PHASES)

        pre, _ = runner.run(
            "preprocess", PreprocessRequest(source=plan.source, output_dir=str(plan.data_dir), limit=0),
            run_preprocess, reusable=True, still_valid=data_present,
        )
        data_dir = pre.data.tags[DATA_DIR_TAG]
        base_accuracy = _evaluate_start_model(runner, plan, data_dir, pre.data.tags.get(DATA_DIGEST_TAG, ""))

        train, _ = runner.run(
            "train", TrainRequest(recipe=plan.recipe, device=plan.device, data_dir=data_dir, overrides=plan.overrides),
            run_train, reusable=True, match_tags={DATA_DIGEST_TAG: pre.data.tags.get(DATA_DIGEST_TAG, "")},
            still_valid=_intact_checkpoint(client, runner.experiment_id),
            tags={DATA_RUN_ID_TAG: pre.info.run_id},
        )

        reg, _ = runner.run("register", RegisterRequest(run_id=train.info.run_id, model_name=plan.model_name),
                            run_register)
        version = reg.data.tags[MODEL_VERSION_TAG]

        accuracy, num_samples = _evaluate_trained(runner, plan, version, data_dir, train.info.run_id)

        _, decision = runner.run(
            "promote", PromoteRequest(model_name=plan.model_name, metric=PROMOTE_METRIC, alias=CHAMPION),
            run_promote,
        )
        _record_outcome(client, active.info.run_id, plan, version, (base_accuracy, accuracy, num_samples), decision,
                        pre.data.tags.get(DATA_DIGEST_TAG, "?"))
    reused = ", ".join(runner.reused) or "none"
    print(f"main: done (parent run {active.info.run_id}): {plan.model_name} version {version}: "
          f"{_accuracy_line(base_accuracy, accuracy, num_samples)}; "
          f"{_champion_line(decision)}; reused steps: {reused}")
    _print_links(client, runner, active.info.run_id, train, plan.model_name, version)
    return PipelineResult(
        parent_run_id=active.info.run_id, step_run_ids=dict(runner.runs), reused=dict(runner.reused),
        model_name=plan.model_name, model_version=version, accuracy=accuracy, accuracy_base=base_accuracy,
        promotion=decision,
    )


def _evaluate_trained(runner: StepRunner, plan: Plan, version: str, data_dir: str,
                      train_run_id: str) -> tuple[float, int]:
    """The trained version's accuracy and number of problems (its evaluation reused when it exists)."""
    from verlflow.models.evaluate import evaluate_model

    model_uri = f"models:/{plan.model_name}/{version}"
    # The same version (same train run) on the same data with the same code: its evaluation is reused.
    evaluation, result = runner.run(
        "evaluate", EvaluateRequest(model_uri=model_uri, data_dir=data_dir),
        lambda req, run_id: evaluate_model(req.model_uri, req.data_dir, req.split, req.limit, req.backend,
                                           run_name=TRAINED_EVAL_RUN_NAME, run_id=run_id),
        reusable=True, match_tags={EVAL_ROLE_TAG: "trained", SOURCE_RUN_TAG: train_run_id},
        run_name=TRAINED_EVAL_RUN_NAME,
    )
    accuracy = result.accuracy if result is not None else evaluation.data.metrics[names.EVAL_ACCURACY]
    num_samples = (result.num_samples if result is not None
                   else int(evaluation.data.metrics.get(names.EVAL_NUM_SAMPLES, 0)))
    return accuracy, num_samples


def _record_outcome(client: LockRetryingClient, run_id: str, plan: Plan, version: str,
                    accuracies: tuple[float | None, float, int], decision: PromotionDecision,
                    data_digest: str) -> None:
    """The pipeline's run: its version and champion tags, accuracy metrics, and a note saying the outcome."""
    base_accuracy, accuracy, num_samples = accuracies
    client.set_tag(run_id, MODEL_VERSION_TAG, version)
    client.set_tag(run_id, CHAMPION_VERSION_TAG, decision.version or "")
    outcome = {names.EVAL_ACCURACY: accuracy}
    if base_accuracy is not None:
        outcome |= {names.EVAL_ACCURACY_BASE: base_accuracy,
                    names.EVAL_ACCURACY_GAIN: accuracy - base_accuracy}
    for key, value in outcome.items():
        client.log_metric(run_id, key, value)
    describe_version(client, plan.model_name, version)
    writes.set_note(client, run_id, (
        f"{plan.model_name} v{version}: {_accuracy_line(base_accuracy, accuracy, num_samples)}; "
        f"{_champion_line(decision)}. Data {data_digest} ({plan.source}), "
        f"device {plan.device}, recipe {plan.recipe}."))


def _print_links(client: LockRetryingClient, runner: StepRunner, run_id: str, train: Any, model_name: str,
                 version: str) -> None:
    """The MLflow UI pages of the pipeline: its experiment, its run, its train run and the version."""
    experiment = client.get_experiment(runner.experiment_id)
    ui_links.print_links("main", [
        (f"runs of {experiment.name}", ui_links.experiment_route(runner.experiment_id)),
        ("this pipeline", ui_links.run_route(runner.experiment_id, run_id)),
        ("its train run", ui_links.run_route(train.info.experiment_id, train.info.run_id)),
        (f"{model_name} v{version}", ui_links.model_version_route(model_name, version)),
    ])


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


def _champion_line(decision: PromotionDecision) -> str:
    """``champion = version 2 (kept: …)`` / ``(moved from version 1: …)``: which version holds it and why."""
    if decision.moved:
        before = f"from version {decision.previous_version}" if decision.previous_version else "to it"
        return f"champion = version {decision.version} (moved {before}: {decision.reason})"
    return f"champion = version {decision.version} (kept: {decision.reason})"


def _accuracy_line(base: float | None, trained: float, problems: int) -> str:
    """``accuracy 0.1270 → 0.4219 (+29.5 points) on 512 test problems`` (without base: the trained one only)."""
    if base is None:
        return f"accuracy {trained:.4f} on {problems} test problems"
    return (f"accuracy {base:.4f} → {trained:.4f} ({100 * (trained - base):+.1f} points) on {problems} test "
            "problems (starting model → trained)")


def _intact_checkpoint(client: Any, experiment_id: str) -> Any:
    """A train run is reusable while its checkpoint is its own (no later run wrote the folder) and still has the
    weights digest the run recorded; a run that recorded none (trained before the record) is trained again."""
    from verlflow.models.checkpoint_record import recorded_digest, replaced_checkpoint

    current = checkpoint_current(client, experiment_id)

    def check(run) -> bool:
        if not current(run) or recorded_digest(run) is None:
            return False
        if (why := replaced_checkpoint(run, run.data.tags[CHECKPOINT_DIR_TAG])) is not None:
            print(f"main: train: not reusing run {run.info.run_id}: {why}")
            return False
        return True

    return check

