"""The tiny recipe's chain of steps, run once per test session on a real ``mlflow server`` and read by three files.

    main (tiny, data.seed=2) → main again (reuses) → train (2 steps) → search (2 trials) → compare → register →
    evaluate @challenger → promote

Each step runs in this process (its step function, as ``verlflow <step>`` calls it), in one working folder and
with no ``data_dir``, so every step after ``main`` finds ``main``'s data (tests/test_step_data_defaults.py); what
each step printed is kept, and its links are checked against the server (tests/test_ui_links.py); the runs, the
registry and a snapshot of it taken between the steps show the conventions a user sees in the UI
(tests/test_mlflow_conventions.py). These three files each ran a chain of their own before: one is enough, and
tests only read it (the server stays up for the session).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from conftest import MlflowServer

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "tiny-qwen3-gsm8k-tiny"  # the tiny recipe's verlflow.model_name
MAIN_OVERRIDES = "data.seed=2"  # an override main's train run is named after
STUDY = "links"


@dataclass
class TinyChain:
    """What the chain left: the server holding its store, each step's return value and what it printed."""

    server: MlflowServer
    root: Path  # the working folder every step ran in (data/synthetic is main's data)
    printed: dict[str, str] = field(default_factory=dict)  # step → its stdout ("main_again": the rerun's)
    results: dict[str, object] = field(default_factory=dict)  # step → its step function's return value
    # The registry between steps: the model's versions after both mains, its aliases just before and after search.
    versions_after_mains: list = field(default_factory=list)
    aliases_before_search: dict[str, str] = field(default_factory=dict)
    aliases_after_search: dict[str, str] = field(default_factory=dict)


def short_search_config(folder: Path) -> Path:
    """The default search config with each trial cut to 2 steps (validated after each), group sizes the tiny
    recipe's batch takes."""
    data = yaml.safe_load((REPO / "src/verlflow/config/search/default.yaml").read_text())
    data["trial"] = {"overrides": {"trainer.total_training_steps": 2, "trainer.total_epochs": 2,
                                   "trainer.test_freq": 1}, "poll_interval": 1, "stop_timeout": 300}
    data["space"]["actor_rollout_ref.rollout.n"]["choices"] = [2, 4]
    path = folder / "short.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run_steps(chain: TinyChain) -> None:
    """Every step of the chain, in order, against the server (this process is set up for it by the caller)."""
    from mlflow.tracking import MlflowClient

    from verlflow.step_requests import (
        CompareRequest,
        EvaluateRequest,
        MainRequest,
        PromoteRequest,
        RegisterRequest,
        SearchRequest,
        TrainRequest,
    )
    from verlflow.steps.compare import run_compare
    from verlflow.steps.evaluate import run_evaluate
    from verlflow.steps.main import run_main
    from verlflow.steps.promote import run_promote
    from verlflow.steps.register import run_register
    from verlflow.steps.search import run_search
    from verlflow.steps.train import run_train

    def step(name: str, call) -> object:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            chain.results[name] = call()
        chain.printed[name] = buffer.getvalue()
        return chain.results[name]

    client = MlflowClient()
    first = step("main", lambda: run_main(MainRequest("tiny", "cpu", "", "", MAIN_OVERRIDES)))
    step("main_again", lambda: run_main(MainRequest("tiny", "cpu", "", "", MAIN_OVERRIDES)))
    chain.versions_after_mains = client.search_model_versions(f"name='{MODEL_NAME}'")
    standalone = step("train", lambda: run_train(TrainRequest("tiny", "cpu",
                                                              overrides="trainer.total_training_steps=2")))
    chain.aliases_before_search = dict(client.get_registered_model(MODEL_NAME).aliases)
    step("search", lambda: run_search(SearchRequest("tiny", "cpu", 2, study_name=STUDY,
                                                    storage=str(chain.root / "study.journal"), pruner="none",
                                                    search_config=str(short_search_config(chain.root)))))
    chain.aliases_after_search = dict(client.get_registered_model(MODEL_NAME).aliases)
    step("compare", lambda: run_compare(CompareRequest(first.step_run_ids["train"], standalone.run_id)))
    version = step("register", lambda: run_register(RegisterRequest(run_id=standalone.run_id)))
    step("evaluate", lambda: run_evaluate(EvaluateRequest(f"models:/{version.name}@challenger", limit=16)))
    step("promote", lambda: run_promote(PromoteRequest(version.name)))


@contextlib.contextmanager
def served_tiny_chain(root: Path, cache: Path):
    """A :class:`TinyChain` run in ``root`` with the tiny model of ``cache``, its server stopped afterwards."""
    import mlflow

    from verlflow.tracking import ui_links

    server = MlflowServer(root)
    server.start()
    chain = TinyChain(server=server, root=root)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(root)
            patch.setenv("MLFLOW_TRACKING_URI", server.url)
            patch.setenv("VERLFLOW_CACHE", str(cache))
            patch.setenv(ui_links.MLFLOW_LINKS_OFF, "true")  # as every step started by the CLI does
            for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
                patch.delenv(name, raising=False)
            mlflow.set_tracking_uri(server.url)
            try:
                _run_steps(chain)
            finally:
                while mlflow.active_run():
                    mlflow.end_run()
                mlflow.set_tracking_uri(None)
        yield chain
    finally:
        server.stop()
