""""The same work" is one declared set (verlflow.compare.same_work: recipe, model, batch, rollout n, ppo_epochs,
response length limits, steps): a side that differs in any of them gets no speed verdict, the first screen's first
line names what differs, and the config diff lists another model. Made-up runs logged as train runs log, in a real
SQLite store (tests/test_compare_report.py's ``log_train_run``), H20 against A3 with the guide's timings.
"""

from __future__ import annotations

import pytest
from conftest import isolated_store
from test_compare_report import A3_TAGS, A3_TIMINGS, H20_TAGS, H20_TIMINGS, a3_curves, h20_curves, log_train_run

from verlflow.compare.comparison import compare_runs

GUIDE = "qwen3-4b-gsm8k-grpo"
SAME_WORK_SPEED = "speed (two accelerators, the same work)"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An H20 run of Qwen3-4B, an A3 run of Qwen3-30B-A3B, and an A3 run of Qwen3-4B with ppo_epochs=2."""
    root = tmp_path_factory.mktemp("same-work")
    with isolated_store(root):
        def a3(name: str, overrides: str) -> str:
            return log_train_run(name, recipe=GUIDE, profile="a3", device_tags=A3_TAGS, timings=A3_TIMINGS,
                                 curves=a3_curves(), e2e=158.0, overrides=overrides)

        yield {
            "4b on h20": log_train_run("qwen3-4b-h20", recipe=GUIDE, profile="h20", device_tags=H20_TAGS,
                                       timings=H20_TIMINGS, curves=h20_curves(), e2e=100.0,
                                       overrides="actor_rollout_ref.model.path=/models/Qwen3-4B"),
            "30b on a3": a3("qwen3-30b-a3", "actor_rollout_ref.model.path=/data/Qwen/Qwen3-30B-A3B"),
            "4b on a3, 2 epochs": a3("qwen3-4b-a3-2-epochs", "actor_rollout_ref.actor.ppo_epochs=2"),
            "4b on a3": a3("qwen3-4b-a3", ""),
        }


def _first_line(report: str) -> str:
    return next(line for line in report.splitlines() if line.startswith("**The answer**"))


def test_qwen3_4b_against_qwen3_30b_is_not_the_same_work_and_the_diff_lists_the_model(runs):
    report = compare_runs(runs["4b on h20"], runs["30b on a3"]).report
    assert _first_line(report).endswith("— not the same work: model Qwen3-4B vs Qwen3-30B-A3B:")
    assert SAME_WORK_SPEED not in report and "is faster" not in report
    assert "- speed: no speed claim: the work differs (model Qwen3-4B vs Qwen3-30B-A3B)" in report
    assert "| `model` | Qwen3-4B | Qwen3-30B-A3B |" in report  # in the recipe group of the config diff
    assert "RECIPES DIFFER" in report


def test_ppo_epochs_1_against_2_is_not_the_same_work(runs):
    report = compare_runs(runs["4b on h20"], runs["4b on a3, 2 epochs"]).report
    assert _first_line(report).endswith("— not the same work: ppo_epochs 1 vs 2:")
    assert SAME_WORK_SPEED not in report and "is faster" not in report


def test_one_model_under_two_paths_is_the_same_work(runs):
    report = compare_runs(runs["4b on h20"], runs["4b on a3"]).report  # /models/Qwen3-4B and Qwen/Qwen3-4B
    assert _first_line(report).endswith("(`qwen3-4b-a3`):")
    assert SAME_WORK_SPEED in report and "| `model` |" not in report


def test_verlflows_tiny_model_is_one_model_by_its_name_or_the_folder_it_was_built_into():
    # The local trainer logs the model as asked (tiny-qwen3), verl the folder it was built into: one model.
    from verlflow.compare.same_work import MODEL_PATH_PARAM, model_name
    from verlflow.compare.snapshot import RunSnapshot

    def snap(path: str) -> RunSnapshot:
        return RunSnapshot(role="baseline", run_id="r", name="r", status="FINISHED", tags={},
                           params={MODEL_PATH_PARAM: path}, metrics={})

    assert model_name(snap("tiny-qwen3")) == model_name(snap("/cache/verlflow/tiny-qwen3-v1-seed0")) == "tiny-qwen3"
    assert model_name(snap("/cache/tiny-qwen3-sft-v1-seed0")) == "tiny-qwen3-sft" != model_name(snap("tiny-qwen3"))
