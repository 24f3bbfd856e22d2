"""Only the modules listed here import MLflow; everything else asks ``verlflow.tracking`` in verlflow's words.

Talking to the store is the business of ``tracking/`` (runs as the steps see them, lookups, writes, the
system-metrics bridge), ``outage/`` (a store that is slow or away), ``process/`` (which process owns a run),
``compat/`` (MLflow's private names) and of the modules whose job is an MLflow object (the registry, a dataset,
a comparison's reading). A module elsewhere that needs a tag read or written calls a named function of
``verlflow.tracking`` instead of binding to MLflow's client. The list is a ratchet: a new importer fails, and
so does an entry whose module stopped importing MLflow (delete the entry: the list only shrinks).

Reads every module's syntax tree (nothing is imported); an import inside a function counts like one at the top.

    python tests/test_mlflow_imports.py [SRC]   # lists every module under SRC that imports MLflow, and where
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Module (path under src/verlflow) → why it talks to MLflow itself.
ALLOWED = {
    # tracking/: the package that owns runs as the steps see them
    "tracking/tracking.py": "opens and ends runs, logs params and metrics as verl does",
    "tracking/lookups.py": "what verlflow reads from the store: a run's params, a metric's steps, experiment names",
    "tracking/writes.py": "what a step writes into a run: tags, params, text, files, notes, linked traces, ends",
    "tracking/system_metrics.py": "the system-metrics bridge: MLflow's SystemMetricsMonitor and the samplers in it",
    "tracking/run_logger.py": "the run-logger interface's direct implementation (an MlflowClient per run)",
    "tracking/experiments.py": "which experiment a step logs into; the model-training experiment type",
    "tracking/naming.py": "run names and notes, set on the run",
    "tracking/profiling.py": "profiled steps' traces and summary tables logged to and read from the run",
    "tracking/resume.py": "a resumed run's attempts and metric history",
    "tracking/reuse.py": "the pipeline's child runs: searched, created, reused",
    "tracking/ui_links.py": "the store's URI behind the MLflow UI links a step prints",
    # outage/: a store that is slow, locked, refusing or away
    "outage/auth_errors.py": "a 401/403 from the server, said in one line",
    "outage/logged_models.py": "a run's checkpoints as MLflow LoggedModels, replayed after an outage",
    "outage/metric_writer.py": "the writer process: metrics written into the store in order",
    "outage/probe.py": "the default store and a server that does not answer",
    "outage/rollout_traces.py": "rollout traces flushed as records of the metric writer",
    "outage/spill.py": "spill files: metrics and tags kept on disk, uploaded later",
    "outage/store_retry.py": "the client whose writes ride out another writer's SQLite lock",
    "outage/summaries.py": "end-of-run timing metrics",
    "outage/writer_handle.py": "the trainer's side of the writer process (the child imports MLflow early)",
    # process/: which process owns a run
    "process/launcher_status.py": "keeps a run mlflow run's launcher marked FAILED as KILLED",
    "process/lease.py": "one resume at a time: a lease is a compare-and-swap on a run's tag",
    "process/lifecycle.py": "pids and heartbeats on runs, reaping dead processes' runs",
    # compat/: other libraries' private names and hooks
    "compat/mlflow.py": "MLflow's private names, each with its checked versions and fallback",
    "compat/verl_traces.py": "the root span of verl's rollout traces, written in verl's processes",
    # models/: the model registry is its job
    "models/absent.py": "a deleted model, version or alias, told apart from one never made",
    "models/aliases.py": "alias writes that ride out a racing writer",
    "models/evaluate.py": "an evaluation is a run with metrics and a results table",
    "models/model_uri.py": "models:/ and runs:/ URIs resolved to folders and training runs",
    "models/one_version.py": "two registers at once leave one model version",
    "models/promotion.py": "promote: an alias moved between model versions",
    "models/promotion_noise.py": "the paired test reads the evaluations of two versions",
    "models/registry.py": "register: a model version with its lineage",
    # the few modules elsewhere whose job is an MLflow object
    "compare/reading.py": "a comparison's references (ids, names, filters) resolved to runs and read",
    "data/lineage.py": "a split as an MLflow dataset, logged as a run input",
    "search/results.py": "the search's run: best trial, trial table, plots, the best model registered",
    "search/trial.py": "a trial is a child run created, watched (metric history) and closed by the search",
}


def mlflow_imports(source: str) -> list[int]:
    """The lines of ``source`` that import MLflow or one of its modules, anywhere (functions included)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == "mlflow" or name.startswith("mlflow.") for name in names):
            lines.append(node.lineno)
    return lines


def importers(src: Path = SRC) -> dict[str, list[int]]:
    """Every module under ``src/verlflow`` that imports MLflow → the lines, keyed as :data:`ALLOWED` is."""
    package = src / "verlflow"
    found = {}
    for path in sorted(package.rglob("*.py")):
        if lines := mlflow_imports(path.read_text(encoding="utf-8")):
            found[path.relative_to(package).as_posix()] = lines
    return found


def test_only_the_listed_modules_import_mlflow():
    unlisted = {module: lines for module, lines in importers().items() if module not in ALLOWED}
    assert not unlisted, (
        "these modules import mlflow; call a named function of verlflow.tracking (lookups, writes, "
        "system_metrics) instead, or list the module in ALLOWED with why talking to MLflow is its job: "
        + ", ".join(f"src/verlflow/{module} (line {', '.join(map(str, lines))})" for module, lines in unlisted.items()))


def test_every_listed_module_still_imports_mlflow():
    stale = sorted(set(ALLOWED) - set(importers()))
    assert not stale, f"these modules no longer import mlflow: delete their entries from ALLOWED: {stale}"


def test_the_check_sees_every_form_of_import():
    source = ("import os\nimport mlflowish\n"  # a name that only starts like it is not MLflow
              "import mlflow\n"
              "def f():\n    from mlflow.tracking import MlflowClient\n    return MlflowClient\n"
              "class C:\n    def g(self):\n        import mlflow.data as d, json\n")
    assert mlflow_imports(source) == [3, 5, 9]
    assert mlflow_imports("from . import mlflow\nfrom verlflow.compat import mlflow\n") == []


if __name__ == "__main__":
    for module, lines in importers(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC).items():
        print(f"{module}: line {', '.join(map(str, lines))}" + ("" if module in ALLOWED else "  (not allowed)"))
