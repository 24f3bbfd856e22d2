"""evaluate: GSM8K accuracy of a registered version, a run's checkpoint or a folder, logged as a run."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from conftest import cli_in_process, isolated_store
from mlflow.tracking import MlflowClient

from verlflow import names as metrics
from verlflow.errors import VerlflowError
from verlflow.models import evaluate

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "tiny-eval"


def _train_like_run(checkpoint: str, *, status: str = "FINISHED", max_response_length: int = 16) -> str:
    """A real run carrying what a finished train run carries (tags, the recipe's response budget)."""
    with mlflow.start_run(tags={
        "verlflow.step": "train", "verlflow.checkpoint_dir": checkpoint, "verlflow.recipe": "smoke",
        "verlflow.backend": "local", "verlflow.profile": "cpu", "device.type": "cpu", "device.name": "test cpu",
        "data.digest": "d1g35t",
    }) as run:
        mlflow.log_param("data/max_response_length", str(max_response_length))
    if status != "FINISHED":
        MlflowClient().set_terminated(run.info.run_id, status)
    return run.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite store (artifacts beside it) holding one registered version of the tiny model."""
    from verlflow.models import registry
    from verlflow.models.model_path import resolve_model_path

    root = tmp_path_factory.mktemp("eval-store")
    with isolated_store(root) as uri:
        checkpoint = resolve_model_path("tiny-qwen3")
        train_run = _train_like_run(checkpoint)
        version = registry.register_checkpoint(train_run, MODEL_NAME)
        yield {"uri": uri, "root": root, "checkpoint": checkpoint, "train_run": train_run,
               "version": str(version.version)}


@pytest.fixture
def synthetic_data(store):
    from verlflow.data import gsm8k

    out = store["root"] / "data"
    if not (out / "test.parquet").is_file():
        gsm8k.preprocess("synthetic", out, 8, log_to_mlflow=False)
    return out


@pytest.mark.slow
def test_registered_version_on_real_gsm8k_is_scored_logged_and_tagged(store, fixtures_dir):
    gsm8k = fixtures_dir / "gsm8k"  # the first rows of the real splits (tests/fixtures/gsm8k/README.md)
    result = evaluate.evaluate_model(f"models:/{MODEL_NAME}@challenger", str(gsm8k), "test", 32, "auto")

    client = MlflowClient()
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics[metrics.EVAL_NUM_SAMPLES] == 32
    assert 0.0 <= run.data.metrics[metrics.EVAL_ACCURACY] <= run.data.metrics[metrics.EVAL_ACCURACY_FLEXIBLE] <= 1
    assert 0 < run.data.metrics[metrics.EVAL_RESPONSE_LENGTH] <= 16  # the source run's max_response_length
    # The eval run links to the training run behind the version; the version carries the score.
    assert run.data.tags["verlflow.source_run_id"] == store["train_run"]
    version = client.get_model_version(MODEL_NAME, store["version"])
    assert float(version.tags["eval.gsm8k.accuracy"]) == pytest.approx(result.accuracy, abs=1e-6)
    # Every prediction is in the table, with the real questions and their ground truths.
    table = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=result.run_id, artifact_path=evaluate.PREDICTIONS_TABLE)).read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    assert len(rows) == 32
    assert rows[0]["question"].startswith("Janet’s ducks lay 16 eggs")
    assert rows[0]["ground_truth"] == "18"
    assert {"response", "extracted_answer", "correct"} <= set(rows[0])


@pytest.mark.slow
def test_a_smaller_evaluation_never_replaces_a_versions_headline(store, capsys):
    """The README's `evaluate -P limit=200` of @challenger after main's 512: the 512 stays what promote ranks by."""
    from verlflow.data import gsm8k
    from verlflow.models import registry

    data = store["root"] / "data-512"
    gsm8k.preprocess("synthetic", data, 512, log_to_mlflow=False)
    version = registry.register_checkpoint(_train_like_run(store["checkpoint"]), "tiny-eval-headline")
    uri = f"models:/tiny-eval-headline/{version.version}"
    full = evaluate.evaluate_model(uri, str(data), "test", 512, "auto")
    small = evaluate.evaluate_model(uri, str(data), "test", 200, "auto")
    on_train = evaluate.evaluate_model(uri, str(data), "train", 64, "auto")

    tags = MlflowClient().get_model_version("tiny-eval-headline", version.version).tags
    assert tags["eval.gsm8k.num_samples"] == "512" and tags["eval.run_id"] == full.run_id
    assert float(tags["eval.gsm8k.accuracy"]) == pytest.approx(full.accuracy, abs=1e-6)
    # Kept beside it, named by split and size.
    assert float(tags["eval.gsm8k.test.n200.accuracy"]) == pytest.approx(small.accuracy, abs=1e-6)
    assert tags["eval.gsm8k.test.n200.run_id"] == small.run_id
    assert tags["eval.gsm8k.train.n64.run_id"] == on_train.run_id
    out = capsys.readouterr().out
    assert "keeps its headline accuracy" in out and "on 512 test problems; this 200-problem test evaluation" in out
    # An evaluation on as many problems again is the newer headline.
    again = evaluate.evaluate_model(uri, str(data), "test", 512, "auto")
    tags = MlflowClient().get_model_version("tiny-eval-headline", version.version).tags
    assert tags["eval.run_id"] == again.run_id


def test_score_uses_verl_strict_and_flexible_extraction():
    scored = evaluate.score(["so #### 1,234", "the answer is 42", "#### 7"], ["1234", "42", "8"])
    assert [s["correct"] for s in scored] == [True, False, False]
    # flexible takes the last number as written: verl does not strip its commas (training rewards the same)
    assert [s["correct_flexible"] for s in scored] == [False, True, False]
    assert scored[0]["extracted_answer"] == "1234"


def test_train_run_checkpoint_and_folder_can_be_evaluated(store, synthetic_data):
    by_run = evaluate.evaluate_model(f"runs:/{store['train_run']}", str(synthetic_data), "test", 4, "hf",
                                   max_new_tokens=4)
    by_folder = evaluate.evaluate_model(store["checkpoint"], str(synthetic_data), "test", 4, "hf", max_new_tokens=4)
    assert by_run.source_run_id == store["train_run"]
    assert by_folder.source_run_id is None
    # Same weights, same prompts, greedy: the same answers.
    assert (by_run.accuracy_flexible, by_run.response_length_mean) == (
        by_folder.accuracy_flexible, by_folder.response_length_mean)
    assert MlflowClient().get_run(by_run.run_id).data.tags["eval.max_new_tokens"] == "4"


@pytest.mark.parametrize("uri, message", [
    ("models:/nope@champion", "no registered model 'nope'"),
    (f"models:/{MODEL_NAME}@champion", f"'{MODEL_NAME}' has no alias 'champion'"),
    (f"models:/{MODEL_NAME}/99", f"version 99 of registered model '{MODEL_NAME}' does not exist: its versions are "),
    ("runs:/0123456789abcdef0123456789abcdef", "no run '0123456789abcdef0123456789abcdef'"),
    ("no/such/folder", "neither an existing folder nor a model URI"),
])
def test_bad_model_uri_is_one_line_and_opens_no_run(store, synthetic_data, uri, message):
    before = len(mlflow.search_runs(search_all_experiments=True))
    with pytest.raises(VerlflowError, match=message) as info:
        evaluate.evaluate_model(uri, str(synthetic_data), "test", 2, "auto")
    assert "\n" not in str(info.value)
    assert len(mlflow.search_runs(search_all_experiments=True)) == before


def test_cli_reports_missing_model_in_one_line(store, synthetic_data):
    proc = cli_in_process(["evaluate", "--model_uri", "models:/nope@champion", "--data_dir", str(synthetic_data),
                           "--limit", "2"],
                          env={**_env(), "MLFLOW_TRACKING_URI": store["uri"]}, cwd=store["root"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("verlflow evaluate: error: no registered model 'nope'")
    assert "Traceback" not in proc.stderr
    assert mlflow.search_runs(search_all_experiments=True, filter_string="attributes.status = 'RUNNING'").empty


def test_unknown_backend_is_refused():
    with pytest.raises(VerlflowError, match="unknown evaluate backend 'tpu'"):
        evaluate.choose_backend("tpu")


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
