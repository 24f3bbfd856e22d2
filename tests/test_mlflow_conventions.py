"""Runs read like MLflow's own: a named training experiment, dataset inputs, telling names, a tidy registry.

`main` twice on the tiny recipe (the second reuses preprocess, the base evaluation and train) and a 2-trial
search, in process on one real server (the session's tiny chain, tests/tiny_chain.py), then what a user opening
the MLflow UI would see.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from conftest import cli_in_process
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from verlflow.compat import mlflow as compat_mlflow
from verlflow.errors import VerlflowError
from verlflow.models.registry import check_alias
from verlflow.models.weights_digest import weights_digest
from verlflow.names import CHECKPOINT_DIGEST_PARAM, CHECKPOINT_DIR_TAG
from verlflow.steps import main as pipeline
from verlflow.tracking import experiments, naming
from verlflow.tracking.naming import is_generated_name, short_overrides, train_run_description, train_run_name

MODEL_NAME = "tiny-qwen3-gsm8k-tiny"  # the tiny recipe's verlflow.model_name


def _all_runs(client: MlflowClient, filter_string: str = ""):
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids, filter_string, max_results=500)


def _inputs(run) -> dict[str, tuple[str, str]]:
    """A run's dataset inputs: name → (context, digest)."""
    found = {}
    for item in run.inputs.dataset_inputs:
        context = next((t.value for t in item.tags if t.key == "mlflow.data.context"), "")
        found[item.dataset.name] = (context, item.dataset.digest)
    return found


@pytest.mark.slow
def test_main_twice_and_a_search_land_in_one_training_experiment_with_lineage(tiny_chain):
    first, second = tiny_chain.results["main"], tiny_chain.results["main_again"]
    client = MlflowClient(tiny_chain.server.url)

    # One experiment, the recipe's, opened by the UI in its model-training view.
    experiment = client.get_experiment_by_name("verlflow/tiny")
    assert experiment.tags[experiments.EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert {r.info.experiment_id for r in _all_runs(client)} == {experiment.experiment_id}

    runs = {name: client.get_run(run_id) for name, run_id in first.step_run_ids.items()}
    train, preprocess = runs["train"], runs["preprocess"]
    # Names that say what each run is: the evaluated model, the overrides of the recipe.
    assert runs[pipeline.BASE_EVAL].info.run_name == "evaluate · base"
    assert runs["evaluate"].info.run_name == "evaluate · trained"
    assert train.info.run_name == "seed=2 · tiny · cpu"  # what tells it apart first
    assert "- `data.seed=2`" in train.data.tags[MLFLOW_RUN_NOTE]

    # The datasets preprocess produced are the train and evaluate runs' inputs (same names and digests).
    produced = _inputs(preprocess)
    assert produced["gsm8k-train"][0] == "training" and produced["gsm8k-test"][0] == "evaluation"
    assert _inputs(train) == {"gsm8k-train": ("training", produced["gsm8k-train"][1]),
                              "gsm8k-test": ("validation", produced["gsm8k-test"][1])}
    for evaluation in (runs[pipeline.BASE_EVAL], runs["evaluate"]):
        assert _inputs(evaluation) == {"gsm8k-test": ("evaluation", produced["gsm8k-test"][1])}

    # The rerun reused the train run, so its registration is the same version, not a copy (the registry as the
    # two mains left it, before the chain's later steps registered more).
    assert second.reused["train"] == train.info.run_id
    # ... whose checkpoint is vouched for by the weights digest it recorded when it trained (an immutable param).
    assert train.data.params[CHECKPOINT_DIGEST_PARAM] == weights_digest(train.data.tags[CHECKPOINT_DIR_TAG])
    assert second.model_version == first.model_version
    versions = tiny_chain.versions_after_mains
    assert [str(v.version) for v in versions] == [first.model_version]
    assert versions[0].tags["source_run_id"] == train.info.run_id
    # ... made from the train run's own LoggedModel, whose evaluation metrics are linked to it.
    (model,) = client.search_logged_models(experiment_ids=[experiment.experiment_id],
                                           filter_string=f"source_run_id = '{train.info.run_id}'")
    assert versions[0].run_id == train.info.run_id and versions[0].source == model.model_uri
    linked = {(m.key, m.run_id) for m in client.get_logged_model(model.model_id).metrics}
    assert ("eval/gsm8k/accuracy", runs["evaluate"].info.run_id) in linked

    # A search evaluates its best trial, registers it under its own alias and leaves main's aliases alone.
    result = tiny_chain.results["search"]
    aliases_after = tiny_chain.aliases_after_search
    assert {a: v for a, v in aliases_after.items() if a != "search-best"} == tiny_chain.aliases_before_search
    best = client.get_model_version_by_alias(MODEL_NAME, "search-best")
    assert best.tags["source_run_id"] == result.best_run_id and "eval.gsm8k.accuracy" in best.tags
    (search_eval,) = _all_runs(client, f"tags.`mlflow.parentRunId` = '{result.parent_run_id}' "
                                       "and tags.`verlflow.step` = 'evaluate'")
    assert search_eval.info.run_name == "evaluate · search-best"
    assert best.tags["eval.run_id"] == search_eval.info.run_id
    trial = client.get_run(result.best_run_id)
    assert set(_inputs(trial)) == {"gsm8k-train", "gsm8k-test"}
    assert {r.info.experiment_id for r in _all_runs(client)} == {experiment.experiment_id}
    assert _all_runs(client, "attributes.status = 'RUNNING'") == []


def test_an_experiment_the_caller_names_is_kept(tracking_uri, monkeypatch):
    MlflowClient().create_experiment("my-team")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "my-team")
    assert experiments.enter(experiments.recipe_experiment("smoke")) is None
    with mlflow.start_run() as run:
        experiments.mark_training(run.info.experiment_id)
    experiment = MlflowClient().get_experiment_by_name("my-team")
    assert run.info.experiment_id == experiment.experiment_id
    assert experiment.tags[experiments.EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert MlflowClient().get_experiment_by_name("verlflow/smoke") is None


def test_a_recipe_experiment_is_created_as_model_training_without_changing_the_active_one(tracking_uri):
    experiment_id = experiments.enter("verlflow/smoke")
    assert experiments.enter("verlflow/smoke") == experiment_id  # found, not created twice
    created = MlflowClient().get_experiment(experiment_id)
    assert created.name == "verlflow/smoke"
    assert created.tags[experiments.EXPERIMENT_KIND_TAG] == "custom_model_development"
    with mlflow.start_run() as run:  # a plain run of the process still goes where it went before
        pass
    assert run.info.experiment_id == "0"


MINI_PROJECT_STEP = """
import mlflow
from verlflow.tracking import experiments

chosen = experiments.enter(experiments.recipe_experiment("smoke"))
with mlflow.start_run(experiment_id=chosen) as run:  # what a training step does (verlflow.tracking)
    experiments.mark_training(run.info.experiment_id)
experiments.enter(experiments.recipe_experiment("smoke"))  # as main's train step enters it again
"""


def _mlflow_run_mini_project(tmp_path: Path, *flags: str) -> tuple[object, str]:
    """``mlflow run`` a one-step project whose step enters the recipe experiment as train does: run, stderr."""
    project = tmp_path / f"project{len(flags)}"
    project.mkdir()
    (project / "MLproject").write_text("name: mini\nentry_points:\n  main:\n    command: python step.py\n")
    (project / "step.py").write_text(MINI_PROJECT_STEP)
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    done = subprocess.run([str(mlflow_cli), "run", str(project), "--env-manager", "local", *flags],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = _all_runs(MlflowClient())
    return run, done.stderr


@pytest.mark.slow
def test_plain_mlflow_run_stays_in_default_and_names_the_flag_that_files_it_with_the_recipe(tmp_path,
                                                                                           tracking_uri):
    """MLflow's project runner creates the run before the step starts (Default without --experiment-name)
    and cannot move it: the step keeps that run and says which flag files it under ``verlflow/<recipe>``."""
    run, stderr = _mlflow_run_mini_project(tmp_path)
    assert run.info.experiment_id == "0" and run.info.status == "FINISHED"
    assert stderr.count("pass --experiment-name verlflow/smoke to keep it with the recipe's runs") == 1
    assert MlflowClient().get_experiment_by_name("verlflow/smoke") is None  # no half-filled second experiment

    for existing in _all_runs(MlflowClient()):
        MlflowClient().delete_run(existing.info.run_id)
    run, stderr = _mlflow_run_mini_project(tmp_path, "--experiment-name", "verlflow/smoke")
    experiment = MlflowClient().get_experiment_by_name("verlflow/smoke")
    assert run.info.experiment_id == experiment.experiment_id
    assert experiment.tags[experiments.EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert "--experiment-name" not in stderr


def test_an_experiment_kind_the_user_chose_is_kept(tracking_uri):
    client = MlflowClient()
    experiment_id = client.create_experiment("chat", tags={experiments.EXPERIMENT_KIND_TAG: "genai_development"})
    experiments.mark_training(experiment_id)
    assert client.get_experiment(experiment_id).tags[experiments.EXPERIMENT_KIND_TAG] == "genai_development"


def test_names_put_what_tells_runs_apart_first():
    from verlflow.search.trial import pruned_name, trial_run_name
    from verlflow.tracking.naming import evaluate_run_name, model_ref

    assert evaluate_run_name("models:/m@challenger", 200) == "evaluate · @challenger · 200"
    assert [model_ref(u) for u in ("models:/m/3", "runs:/5d1e0a2b99/model", "/ckpt/hf/", "Qwen/Qwen3-4B")] == \
        ["v3", "run 5d1e0a2b", "hf", "Qwen3-4B"]
    name = trial_run_name("smoke-default", 3, {"actor_rollout_ref.actor.optim.lr": 3.2e-06,
                                               "actor_rollout_ref.rollout.n": 8})
    assert name == "t3 · lr=3.2e-06 n=8 · smoke-default"
    assert pruned_name(name) == "t3 pruned · lr=3.2e-06 n=8 · smoke-default" == pruned_name(pruned_name(name))
    assert train_run_name("tiny", "cpu-verl", dry_run=True) == "dry run · tiny · cpu-verl"


def test_train_run_names_carry_the_overrides_in_short_and_the_description_in_full():
    assert train_run_name("smoke", "cpu", overrides="data.seed=2") == "seed=2 · smoke · cpu"
    assert train_run_name("recipes/smoke.yaml", "a3", overrides="") == "smoke · a3"
    long = train_run_name("smoke", "cpu", overrides=" ".join(f"data.k{i}={'x' * 20}" for i in range(20)))
    assert len(long) == naming.MAX_NAME_CHARS and long.endswith("… · smoke · cpu")  # overrides cut, not these
    # Keys that would read alike keep one more segment; Hydra's prefixes stay.
    assert short_overrides("actor_rollout_ref.rollout.n=4 algorithm.x.n=3 actor_rollout_ref.actor.optim.lr=1e-6 "
                           "+trainer.foo=1 ~data.seed") == ["rollout.n=4", "x.n=3", "lr=1e-6", "+foo=1", "~seed"]
    described = train_run_description("smoke", "cpu", "data.seed=2 actor_rollout_ref.actor.optim.lr=1e-6")
    assert "- `data.seed=2`" in described and "- `actor_rollout_ref.actor.optim.lr=1e-6`" in described
    assert train_run_description("smoke", "cpu", "").endswith("no overrides.")


def test_search_plots_are_logged_as_png_and_one_offline_page_with_short_parameter_labels(tracking_uri):
    import optuna

    from verlflow.search.results import INTERACTIVE_PAGE, log_plots

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def objective(t):
        return (t.suggest_float("actor_rollout_ref.actor.optim.lr", 1e-6, 1e-4, log=True)
                + t.suggest_categorical("actor_rollout_ref.rollout.n", [2, 4]))

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(objective, n_trials=6)
    with mlflow.start_run() as run:
        pass
    logged = log_plots(study, run.info.run_id)
    assert {"search/plots/parallel_coordinate.png", "search/plots/param_importances.png", INTERACTIVE_PAGE} <= set(
        logged)
    page = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=INTERACTIVE_PAGE))
    html = page.read_text()
    assert '"lr"' in html and '"n"' in html and "actor_rollout_ref" not in html
    # plotly inlined once, nothing loaded from the web: the page renders on an air-gapped cluster.
    assert not re.search(r"<script[^>]*\bsrc=", html) and html.count("<h2>") == 4

    # Two trials cannot say which parameter matters: no importances, and the run says why.
    few = optuna.create_study(direction="maximize")
    few.optimize(objective, n_trials=2)
    with mlflow.start_run() as run:
        pass
    assert not any("param_importances" in path for path in log_plots(few, run.info.run_id))
    skipped = MlflowClient().get_run(run.info.run_id).data.tags["search.plots_skipped"]
    assert "param_importances: 2 finished trials, importances need at least 6" in skipped


def test_the_private_mlflow_rules_verlflow_leans_on_are_in_this_mlflow(tracking_uri):
    """Alias-name rules and made-up run names are MLflow-private (no public check exists); verlflow guards
    both, and this fails in either CI venv (lowest and newest MLflow) the day a release moves them."""
    with pytest.raises(VerlflowError, match="alias 'latest' is rejected by MLflow"):
        check_alias("latest")  # reserved
    with pytest.raises(VerlflowError, match="alias 'v3' is rejected by MLflow"):
        check_alias("v3")  # reads as a version
    check_alias("search-best")
    assert compat_mlflow.generated_name_words() is not None
    with mlflow.start_run() as run:  # no name given: MLflow makes one up
        pass
    assert is_generated_name(run.info.run_name)
    assert not is_generated_name("team-baseline-2")  # user-chosen, though shaped like one


def test_a_refusal_under_mlflow_run_leaves_a_run_named_for_its_step_and_reason(tracking_uri, tmp_path):
    """`mlflow run` opens the run before the step starts (MLFLOW_RUN_ID); a step that refuses its input leaves it
    named for the step and why, never as `skittish-sow-161`."""
    import os

    run = MlflowClient().create_run("0")  # as mlflow run creates it: no name given, MLflow makes one up
    assert is_generated_name(run.info.run_name)
    (tmp_path / "empty").mkdir()
    done = cli_in_process(["train", "--recipe", "tiny", "--device", "cpu", "--data_dir", "empty"],
                          env={**os.environ, "MLFLOW_RUN_ID": run.info.run_id}, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    named = MlflowClient().get_run(run.info.run_id)
    assert named.info.run_name == "train · refused: data_dir 'empty' has no train.parquet"
    assert named.data.tags["verlflow.error"].startswith("data_dir 'empty' has no train.parquet: run `mlflow run")

    # A refusal inside the step's own run (a source folder without train data, found once the run is open): MLflow
    # unsets MLFLOW_RUN_ID when that run ends, and the run kept its made-up name before.
    run = MlflowClient().create_run("0")
    done = cli_in_process(["preprocess", "--source", "empty"], env={**os.environ, "MLFLOW_RUN_ID": run.info.run_id},
                          cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    named = MlflowClient().get_run(run.info.run_id).info.run_name
    assert named == "preprocess · refused: no train data in folder 'empty'"
