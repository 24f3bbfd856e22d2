"""Each claim of compare's first screen tested on the quantity it names (issue 55 item 1), in a real SQLite store.

Two H20 nodes (16 GPUs, ~200 s a step) against one A3 node (8 chips, ~400 s), three seeds a side of the same work:
the H20 steps are twice as fast, yet each run's chip-seconds and node-seconds per step are the same on both sides.
The step time may be called different; per chip and per node nobody is faster. The runs are logged the way a train
run logs (tests/test_compare_report.py's ``log_train_run``).
"""

from __future__ import annotations

import mlflow
import pytest
from conftest import fresh_store
from test_compare_report import A3_TAGS, H20_TAGS, h20_curves, log_train_run

from verlflow.compare.comparison import compare_runs

RECIPE = "qwen3-4b-gsm8k-grpo"
# Mean step seconds per seed: chip-seconds per step 16 × h20 = 8 × a3 (within the seed noise), node-seconds 2 × h20 = a3
H20_STEPS = (199.0, 200.5, 200.0)
A3_STEPS = (401.0, 397.0, 400.5)


def _timings(step: float) -> dict[str, list[float]]:
    return {"gen": [step / 2] * 4, "update_actor": [step / 4] * 4, "step": [step] * 4, "reward": [1.0] * 4}


@pytest.fixture(scope="module")
def equal_chip_time(tmp_path_factory):
    """The comparison of 3 seeds of two H20 nodes (baseline) against 3 of one A3 node (candidate)."""
    root = tmp_path_factory.mktemp("claims")
    with pytest.MonkeyPatch.context() as mp:
        uri = fresh_store(root)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mlflow.set_tracking_uri(uri)
        ids = {}
        for side, tags, steps, nodes in (("h20", H20_TAGS, H20_STEPS, 2), ("a3", A3_TAGS, A3_STEPS, 1)):
            for seed, step in enumerate(steps, 1):
                ids[side, seed] = log_train_run(
                    f"{side} · seed={seed}", recipe=RECIPE, profile=side, device_tags=tags, timings=_timings(step),
                    curves=h20_curves(), e2e=step * 4 + 10, overrides=f"data.seed={seed} trainer.nnodes={nodes}")
        yield compare_runs(",".join(ids["h20", s] for s in (1, 2, 3)), ",".join(ids["a3", s] for s in (1, 2, 3)))


def test_equal_chip_and_node_time_name_no_winner_per_chip_or_per_node(equal_chip_time):
    first = equal_chip_time.report.split("## Runs")[0]
    lines = {line.split(":")[0]: line for line in first.splitlines() if line.startswith("- per ")}
    assert "is faster" not in lines["- per chip"] and "is faster" not in lines["- per node"]
    assert lines["- per chip"].startswith("- per chip: no chip-time difference shown per training step "
                                          "(candidate / baseline 1.00× per training step")
    assert lines["- per node"].startswith("- per node: no node-time difference shown per training step")
    # each line carries its own test, in the unit it names
    assert "p = " in lines["- per chip"] and " chip-s" in lines["- per chip"]
    assert "p = " in lines["- per node"] and " node-s" in lines["- per node"]
    # the step time itself does differ (16 GPUs against 8 chips): that is the only claim made
    assert "mean step time candidate / baseline 2.00×: a device effect" in first


def test_the_first_screen_states_one_error_rate_for_the_report(equal_chip_time):
    first = equal_chip_time.report.split("## Runs")[0]
    assert first.count("- error rate: ") == 1
    tested = [f for f in equal_chip_time.figures if f.effect.p_value is not None]
    assert f"- error rate: the {len(tested) + 2} differences this report tests" in first  # + per chip, per node
    assert all(f.effect.family == len(tested) + 2 for f in tested)
