"""GSM8K accuracy of a trained model, scored with verl's GSM8K scorer and logged as an MLflow run.

    mlflow run . --env-manager local -e evaluate -P model_uri=models:/tiny-qwen3-gsm8k-smoke@champion
    verlflow evaluate --model_uri ./checkpoints/hf --data_dir ../shared/data/gsm8k --limit 32

The model is a registered version (``models:/<name>@<alias>``, ``models:/<name>/<version>``), a run's
artifact (``runs:/<run_id>/<path>``; ``runs:/<run_id>`` alone means the run's final checkpoint, tag
``verlflow.checkpoint_dir``) or a local Hugging Face folder. Each problem is prompted exactly as in
training (the parquet's prompt messages through the tokenizer's chat template) and answered greedily,
batched with a KV cache through transformers (left padding), or through vLLM when it is installed
(:mod:`verlflow.models.generate`; a batch that runs out of memory is halved and tried again).

Logged: ``eval/gsm8k/accuracy`` (strict ``#### <n>`` extraction), ``eval/gsm8k/accuracy_flexible``
(last number), ``eval/gsm8k/num_samples``, ``eval/gsm8k/response_length_mean`` and the table
``eval/gsm8k_predictions.json`` of every prediction. A registered version also gets the tag
``eval.gsm8k.accuracy``, which ``promote`` ranks versions by: its headline, the evaluation on the most
problems of the test split. A smaller or train-split evaluation never replaces it (a 200-problem look at
``@challenger`` would otherwise make promote compare 512 problems with 200); it is kept beside it, named by
its split and size (``eval.gsm8k.test.n200.accuracy``). The run links to the model's training run through
the tag ``verlflow.source_run_id``.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow import names
from verlflow.data.lineage import log_split_inputs
from verlflow.errors import VerlflowError
from verlflow.models.generate import DEFAULT_BATCH_SIZE, accelerator, generate_hf, generate_vllm
from verlflow.models.model_uri import SOURCE_RUN_TAG, ResolvedModel, resolve_model
from verlflow.names import MODEL_NAME_TAG, MODEL_URI_TAG, MODEL_VERSION_TAG, STEP_TAG
from verlflow.outage.deadline import TrackingDeadline
from verlflow.outage.store_retry import LockRetryingClient, retry_on_lock
from verlflow.tracking import tracking

__all__ = ["EvalResult", "ResolvedModel", "SOURCE_RUN_TAG", "VERSION_ACCURACY_TAG", "resolve_model", "evaluate_model",
           "score", "tag_version", "load_problems", "choose_backend", "max_new_tokens_for"]

log = logging.getLogger(__name__)

BACKENDS = ("auto", "hf", "vllm")
# Used when the model's training run does not say (a bare folder): the guide's max_response_length.
DEFAULT_MAX_NEW_TOKENS = 1024
PREDICTIONS_TABLE = "eval/gsm8k_predictions.json"
# Version tags written after an evaluation; promote reads VERSION_ACCURACY_TAG.
VERSION_ACCURACY_TAG = "eval.gsm8k.accuracy"
EVAL_INPUT_CONTEXT = "evaluation"  # the MLflow dataset input context of the evaluated split


@dataclass
class EvalResult:
    """What an evaluation measured, and where it was logged."""

    run_id: str
    model_uri: str
    accuracy: float
    accuracy_flexible: float
    num_samples: int
    response_length_mean: float
    backend: str
    max_new_tokens: int
    source_run_id: str | None = None
    model_name: str | None = None
    model_version: str | None = None
    split: str = "test"


def max_new_tokens_for(source_run_id: str | None) -> int:
    """The response budget of the model's recipe (param ``data/max_response_length``), else the default."""
    if source_run_id:
        try:
            value = MlflowClient().get_run(source_run_id).data.params.get("data/max_response_length")
        except MlflowException:
            value = None
        if value and value.isdigit() and int(value) > 0:
            return int(value)
    return DEFAULT_MAX_NEW_TOKENS


# --- data ---------------------------------------------------------------------------------------


def default_eval_data(model: ResolvedModel, split: str) -> str:
    """The data an evaluation with no ``data_dir`` uses: the folder the model trained on, else its recipe's.

    The train run's ``data/<train|val>_files`` param names the folder; when that is gone (or the model is a
    bare folder), the recipe's data folder is used (the train run's recipe, else the default one), made
    here when it can be (:func:`verlflow.data.recipe_data.step_data_dir`).
    """
    from verlflow.config import default_recipe
    from verlflow.data import recipe_data
    from verlflow.device.detect import detect_device
    from verlflow.names import RECIPE_TAG

    recipe = ""
    if model.source_run_id:
        try:
            run = MlflowClient().get_run(model.source_run_id)
        except MlflowException:
            run = None
        if run is not None:
            files = run.data.params.get("data/val_files" if split == "test" else "data/train_files", "")
            if files and Path(files).is_file():
                return str(Path(files).parent)
            recipe = run.data.tags.get(RECIPE_TAG, "")
    recipe = recipe or default_recipe(detect_device("auto"))
    return recipe_data.step_data_dir("", recipe_data.recipe_source(recipe), splits=(split,))


def load_problems(data_dir: str, split: str, limit: int) -> list[dict[str, Any]]:
    """Rows in verl's GSM8K schema: the preprocessed parquet, or a raw GSM8K folder (jsonl/parquet)."""
    from verlflow.data import gsm8k

    if limit < 0:
        raise VerlflowError(f"limit must be 0 (all problems) or a positive count, got {limit}")
    if (Path(data_dir) / f"{split}.parquet").is_file() or not Path(data_dir).is_dir():
        if (Path(data_dir) / f"{split}.parquet").is_file():
            from verlflow.data.checks import check_parquet_split

            check_parquet_split(Path(data_dir) / f"{split}.parquet", required=("prompt", "reward_model"))
        rows = gsm8k.read_split(data_dir, split).to_dict("records")
        return rows[:limit] if limit else rows
    # A raw folder (e.g. ../shared/data/gsm8k): convert with the same code preprocess uses.
    return gsm8k.to_verl_rows(gsm8k.load_examples(data_dir, split, limit), split)


# --- generation ---------------------------------------------------------------------------------


def choose_backend(backend: str) -> str:
    """``auto`` → vllm when it is installed and an accelerator is present, else transformers (hf)."""
    if backend not in BACKENDS:
        raise VerlflowError(f"unknown evaluate backend '{backend}': use one of {', '.join(BACKENDS)}")
    has_vllm = importlib.util.find_spec("vllm") is not None
    if backend == "vllm" and not has_vllm:
        raise VerlflowError("backend 'vllm' needs the vllm package, which is not installed: use backend=hf")
    if backend == "auto":
        return "vllm" if has_vllm and accelerator().is_accelerator else "hf"
    return backend


# --- scoring ------------------------------------------------------------------------------------


def score(responses: list[str], ground_truths: list[str]) -> list[dict[str, Any]]:
    """Per-problem strict and flexible scores with verl's GSM8K scorer (what training rewards)."""
    from verl.utils.reward_score import gsm8k

    scored = []
    for response, truth in zip(responses, ground_truths, strict=True):
        scored.append({
            "extracted_answer": gsm8k.extract_solution(response, method="strict"),
            "extracted_flexible": gsm8k.extract_solution(response, method="flexible"),
            "correct": bool(gsm8k.compute_score(response, truth)),
            "correct_flexible": bool(gsm8k.compute_score(response, truth, method="flexible")),
        })
    return scored


def evaluate_model(
    model_uri: str,
    data_dir: str,
    split: str,
    limit: int,
    backend: str,
    *,
    max_new_tokens: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    run_name: str | None = None,
    run_id: str | None = None,
) -> EvalResult:
    """Measure GSM8K accuracy of a model and log it as an MLflow run (what step ``evaluate`` does).

    Everything the user gave is checked before a run is opened, so bad input leaves no run behind.
    ``data_dir=""``: the data the model trained on (:func:`default_eval_data`).
    ``max_new_tokens`` defaults to the training recipe's ``data/max_response_length``. The evaluated split
    is logged as the run's dataset input (context ``evaluation``), the same dataset preprocess logged.
    ``run_id``: the run to log into, already created (by ``main``). ``run_name``: default
    ``evaluate · <model> · <problems>`` (:func:`verlflow.tracking.naming.evaluate_run_name`).
    """
    from verlflow.tracking.naming import evaluate_run_name

    engine = choose_backend(backend)
    model = None if data_dir else resolve_model(model_uri)  # no data_dir: the model says which data
    data_dir = data_dir or default_eval_data(model, split)
    problems = load_problems(data_dir, split, limit)
    if not problems:
        raise VerlflowError(f"split '{split}' in {data_dir} has no problems to evaluate")
    model = model or resolve_model(model_uri)
    budget = max_new_tokens or max_new_tokens_for(model.source_run_id)
    tags = {STEP_TAG: "evaluate", MODEL_URI_TAG: model_uri, "eval.backend": engine,
            "eval.max_new_tokens": str(budget), "eval.split": split}
    if model.source_run_id:
        tags[SOURCE_RUN_TAG] = model.source_run_id
    if model.registered_name:
        tags.update({MODEL_NAME_TAG: model.registered_name, MODEL_VERSION_TAG: model.version})

    run_name = run_name or (None if run_id else evaluate_run_name(model_uri, len(problems)))
    beside = None if run_id or mlflow.active_run() else _experiment_of(model.source_run_id)
    with tracking.tracked_run(run_name=run_name, tags=tags, run_id=run_id, experiment=beside) as run:
        log_split_inputs(data_dir, {split: EVAL_INPUT_CONTEXT})
        prompts = [list(p["prompt"]) for p in problems]
        log.info("evaluating %s on %d %s problems (%s, max %d new tokens)", model_uri, len(problems), split,
                 engine, budget)
        if engine == "vllm":
            answers = generate_vllm(model, prompts, budget)
        else:
            answers = generate_hf(model, prompts, budget, batch_size)
        result = _score_and_log(problems, answers, run_id=run.info.run_id, model_uri=model_uri, model=model,
                                engine=engine, budget=budget)
        result.split = split
        if model.registered_name:
            tag_version(model.registered_name, model.version, result)
    where = f"{model.registered_name} v{model.version}" if model.registered_name else model_uri
    print(f"evaluate: {where}: accuracy {result.accuracy:.4f} (flexible {result.accuracy_flexible:.4f}) on "
          f"{result.num_samples} {split} problems, mean response {result.response_length_mean:.1f} tokens "
          f"(run {result.run_id})")
    return result


def _experiment_of(run_id: str | None) -> str | None:
    """The experiment a standalone evaluation is filed in (unless the caller chose one): its model's train run's,
    not Default among nothing it relates to."""
    if not run_id:
        return None
    try:
        client = MlflowClient()
        return client.get_experiment(client.get_run(run_id).info.experiment_id).name
    except MlflowException:
        return None


def _score_and_log(problems: list[dict[str, Any]], answers: list[tuple[str, int]], *, run_id: str, model_uri: str,
                   model: ResolvedModel, engine: str, budget: int) -> EvalResult:
    """Score the answers with verl's scorer; log the accuracy metrics and a table of every prediction."""
    responses = [text for text, _ in answers]
    truths = [str(p["reward_model"]["ground_truth"]) for p in problems]
    scored = score(responses, truths)
    n = len(problems)
    result = EvalResult(
        run_id=run_id, model_uri=model_uri,
        accuracy=sum(s["correct"] for s in scored) / n,
        accuracy_flexible=sum(s["correct_flexible"] for s in scored) / n,
        num_samples=n, response_length_mean=sum(length for _, length in answers) / n,
        backend=engine, max_new_tokens=budget, source_run_id=model.source_run_id,
        model_name=model.registered_name, model_version=model.version,
    )
    metrics = {
        names.EVAL_ACCURACY: result.accuracy,
        names.EVAL_ACCURACY_FLEXIBLE: result.accuracy_flexible,
        names.EVAL_NUM_SAMPLES: n,
        names.EVAL_RESPONSE_LENGTH: result.response_length_mean,
    }
    try:  # also on the LoggedModel measured, where there is one (its page shows them)
        retry_on_lock(mlflow.log_metrics, metrics, model_id=model.model_id)
    except (MlflowException, TrackingDeadline):
        tracking.spill_metrics(run_id, metrics)  # the measurement is not lost: uploaded with the run's end
        raise
    retry_on_lock(mlflow.log_table, {
        "question": [_question(p) for p in problems],
        "response": responses,
        "extracted_answer": [s["extracted_answer"] or "" for s in scored],
        "ground_truth": truths,
        "correct": [s["correct"] for s in scored],
        "correct_flexible": [s["correct_flexible"] for s in scored],
        "response_length": [length for _, length in answers],
    }, artifact_file=PREDICTIONS_TABLE)
    return result


def _question(problem: dict[str, Any]) -> str:
    info = problem.get("extra_info") or {}
    return str(info.get("question") or problem["prompt"][-1]["content"])


# The split whose largest evaluation is a version's headline score (the one training never saw).
HEADLINE_SPLIT = "test"
VERSION_NUM_SAMPLES_TAG = "eval.gsm8k.num_samples"


def side_tag_prefix(split: str, num_samples: int) -> str:
    """Where an evaluation that is not the headline is kept on the version: ``eval.gsm8k.test.n200``."""
    return f"eval.gsm8k.{split}.n{num_samples}"


def is_headline(current_tags: dict[str, str], result: EvalResult) -> bool:
    """Whether ``result`` becomes the version's headline: on the test split and on at least as many problems."""
    if result.split != HEADLINE_SPLIT:
        return False
    current = current_tags.get(VERSION_NUM_SAMPLES_TAG, "")
    return not current.isdigit() or result.num_samples >= int(current)


def tag_version(name: str, version: str, result: EvalResult) -> str:
    """Put the score on a registered version, where promote and the registry UI see it; returns the tag prefix.

    The headline tags (``eval.gsm8k.accuracy`` …) take it only when :func:`is_headline`; otherwise it is
    kept beside the headline under :func:`side_tag_prefix`, and a line says which score stays the headline.
    """
    client = LockRetryingClient()  # two search workers may tag one version at once
    try:
        current = client.get_model_version(name, version).tags
    except MlflowException:
        raise VerlflowError(f"version {version} of registered model '{name}' was deleted while it was evaluated: "
                            f"the result is kept in run {result.run_id} only") from None
    headline = is_headline(current, result)
    prefix = "eval.gsm8k" if headline else side_tag_prefix(result.split, result.num_samples)
    values = {"accuracy": f"{result.accuracy:.6g}", "accuracy_flexible": f"{result.accuracy_flexible:.6g}",
              "num_samples": str(result.num_samples), "run_id": result.run_id}
    tags = {f"{prefix}.{key}": value for key, value in values.items()}
    if headline:
        tags = {**tags, "eval.run_id": tags.pop("eval.gsm8k.run_id"), "eval.gsm8k.split": result.split}
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    if not headline:
        kept = (f"keeps its headline accuracy {float(current[VERSION_ACCURACY_TAG]):.4f} on "
                f"{current.get(VERSION_NUM_SAMPLES_TAG, '?')} {HEADLINE_SPLIT} problems"
                if current.get(VERSION_ACCURACY_TAG)
                else f"has no headline yet (an evaluation of the {HEADLINE_SPLIT} split)")
        print(f"evaluate: {name} v{version} {kept}; this {result.num_samples}-problem {result.split} evaluation "
              f"is kept beside it as tag {prefix}.accuracy", flush=True)
    return prefix
