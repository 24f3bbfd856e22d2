"""The table of steps and their parameters: the user-facing contract in one place.

``MLproject`` declares the same entry points and parameters (tests/test_project_contract.py keeps the two
equal), the README's entry-point table is :func:`steps_markdown`, and :mod:`verlflow.cli` builds its parser
from :data:`STEPS`. Each step names the ``module:function`` that runs it; nothing here imports those modules.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        Step("preprocess", "verlflow.data.step:run_preprocess", "GSM8K → verl parquet, logged as dataset inputs", (
            Param("source", "openai/gsm8k", "openai/gsm8k (hub) | a folder of train/test jsonl or parquet | synthetic"),
            Param("output_dir", "", "where train.parquet and test.parquet are written ('' = data/<source>)"),
            Param("limit", "0", "rows per split, 0 = all", "int"),
        )),
        Step("train", "verlflow.train:run_train", "GRPO training through verl (npu/gpu) or the local trainer", (
            _RECIPE_AUTO,
            _DEVICE,
            Param("profile", "auto", "device profile name or .yaml path (auto: a3 on npu, h20 on gpu, cpu on cpu)"),
            Param("data_dir", "", "folder with train.parquet and test.parquet ('' = the recipe's: data/<data_source>)"),
            Param("model", "", "HF folder or hub id ('' = the recipe's model path)"),
            Param("overrides", "", "verl-style overrides, space separated: key=value key2=value2"),
            Param("backend", "auto", "auto | verl | local (auto: verl on npu/gpu, local on cpu)"),
            Param("dry_run", "false", "verl backend: compose, validate, log and print the command only", "bool"),
            Param("ray_address", "", "submit to this Ray cluster as a Ray job ('' = run locally)"),
            Param("resume", "", "continue this train run from its last checkpoint ('' = a new run)"),
        )),
        Step("evaluate", "verlflow.models.evaluate:run_evaluate", "GSM8K accuracy of a model", (
            Param("model_uri", None,
                  "runs:/<id>/<path> | models:/<name>@<alias> | models:/<name>/<version> | folder | hub id"),
            Param("data_dir", "", "folder with the preprocessed split ('' = the data the model trained on)"),
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
            Param("data_dir", "", "folder with train.parquet and test.parquet ('' = the recipe's, as for train)"),
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
