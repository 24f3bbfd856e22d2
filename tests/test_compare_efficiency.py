"""`compare`'s efficiency and cost section against hand arithmetic on the recorded runs in tests/fixtures/compare/.

The H20 and A3 runs of tests/fixtures/compare/guide-6.3-runs.json (the guide's §6.3 ratios, one node each: 8 H20
GPUs, 8 × 910C = 16 dies) are logged into a real SQLite store the way a train run logs and compared with prices.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import mlflow
import pytest
from conftest import isolated_store
from mlflow.tracking import MlflowClient

from verlflow import cli
from verlflow.compare.comparison import compare_runs
from verlflow.errors import EXIT_BAD_INPUT, VerlflowError
from verlflow.tracking import tracking

FIXTURE = Path(__file__).parent / "fixtures" / "compare" / "guide-6.3-runs.json"
TOKENS, SAMPLES = 1.28e6, 512 * 5  # per step, both runs
H20_STEP, A3_STEP = 240.0, 367.2
H20_E2E, A3_E2E = 52000.0, 82160.0


def _log(run: dict) -> str:
    started = time.time() - run["e2e_s"]
    with tracking.tracked_run(run_name=run["name"], tags=run["tags"]) as active:
        mlflow.log_params(run["params"])
        for key, points in run["histories"].items():
            for step, value in points:
                tracking.log_metrics({key: value}, step=step)
        tracking.log_run_summaries(active.info.run_id, started, ended_at=started + run["e2e_s"])
    return active.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The two recorded runs in a real store, a prices file (H20 per node-hour, A3 per device-hour)."""
    root = tmp_path_factory.mktemp("efficiency")
    with isolated_store(root):
        h20, a3 = (_log(run) for run in json.loads(FIXTURE.read_text())["runs"])
        prices = root / "prices.yaml"
        prices.write_text("h20: {node_hour: 20.0}\na3: {device_hour: 1.5}\n")
        yield {"h20": h20, "a3": a3, "prices": str(prices), "root": root}


@pytest.fixture(scope="module")
def priced(store):
    """H20 (baseline) against A3 (candidate) with prices."""
    return compare_runs(store["h20"], store["a3"], prices=store["prices"])


def test_throughput_per_device_chip_and_node_is_the_hand_arithmetic(priced):
    h20, a3 = priced.efficiency
    assert (h20.hardware.devices, h20.hardware.chips, h20.hardware.nodes) == (8, 8, 1)
    assert (a3.hardware.devices, a3.hardware.chips, a3.hardware.nodes) == (16, 8, 1)  # two dies per 910C
    assert a3.hardware.record == "profile a3's hardware record"  # recorded before device.dies_per_chip was tagged
    assert h20.tokens_per_s("device") == pytest.approx(TOKENS / H20_STEP / 8)
    assert h20.tokens_per_s("chip") == pytest.approx(TOKENS / H20_STEP / 8)
    assert h20.tokens_per_s("node") == pytest.approx(TOKENS / H20_STEP)
    assert a3.tokens_per_s("device") == pytest.approx(TOKENS / A3_STEP / 16)
    assert a3.tokens_per_s("chip") == pytest.approx(TOKENS / A3_STEP / 8)
    assert a3.tokens_per_s("node") == pytest.approx(TOKENS / A3_STEP)
    # verl's perf/throughput is per die on an A3: per chip is twice it
    assert a3.tokens_per_s("device") == pytest.approx(a3.verl_throughput)
    assert a3.tokens_per_s("chip") == pytest.approx(2 * a3.verl_throughput)
    assert h20.per_hour(h20.samples_per_step, "device") == pytest.approx(SAMPLES / H20_STEP * 3600 / 8)  # 4800
    assert a3.per_hour(a3.samples_per_step, "node") == pytest.approx(SAMPLES / A3_STEP * 3600)
    assert a3.per_hour(a3.tokens_per_step, "device") == pytest.approx(TOKENS / A3_STEP * 3600 / 16)


def test_the_guides_end_to_end_ratio_is_reproduced_per_chip_and_per_node(priced):
    from verlflow.compare.efficiency import run_hour_ratios, work_time_ratios

    whole = run_hour_ratios(*priced.efficiency)
    assert whole["node"] == pytest.approx(1.58) and whole["chip"] == pytest.approx(1.58)
    assert whole["device"] == pytest.approx(2 * 1.58)  # per die, an A3 looks twice as slow
    step = work_time_ratios(*priced.efficiency)
    assert step["chip"] == pytest.approx(A3_STEP / H20_STEP) and step["device"] == pytest.approx(2 * 1.53)
    report = priced.report
    assert "## Efficiency per device, per chip and per node" in report
    assert "per chip 1.58×, per node 1.58×, per device 3.16×" in report


def test_mfu_per_phase_uses_each_profiles_own_peak_beside_verls(priced):
    h20, a3 = priced.efficiency
    assert h20.params_count == 4e9 and "Qwen3-4B" in h20.params_source
    # 6 N tokens / (time × devices × peak): H20 148 TFLOPS bf16 per GPU, A3 376 TFLOPS fp16 per die
    assert h20.mfu["update_actor"][0] == pytest.approx(6 * 4e9 * TOKENS / (80 * 8 * 148e12))
    assert a3.mfu["update_actor"][0] == pytest.approx(6 * 4e9 * TOKENS / (188 * 16 * 376e12))
    assert h20.mfu["gen"][0] == pytest.approx(2 * 4e9 * TOKENS / (120 * 8 * 148e12))
    assert (h20.mfu["update_actor"][1], a3.mfu["update_actor"][1]) == (pytest.approx(0.35), pytest.approx(0.031))
    assert "354 TFLOPS for every Ascend 910 model" in priced.report


def test_cost_per_1k_samples_and_per_accuracy_point_follow_the_prices(priced):
    h20, a3 = priced.efficiency
    assert h20.cost_per_1k_samples == pytest.approx(20 * H20_STEP / 3600 / SAMPLES * 1000)
    assert a3.cost_per_1k_samples == pytest.approx(1.5 * 16 * A3_STEP / 3600 / SAMPLES * 1000)
    assert h20.run_cost == pytest.approx(20 * H20_E2E / 3600)
    assert h20.cost_per_accuracy_point == pytest.approx(20 * H20_E2E / 3600 / 18)  # 0.70 → 0.88
    assert a3.cost_per_accuracy_point == pytest.approx(24 * A3_E2E / 3600 / 17)


def test_the_first_screen_says_the_answer_in_words(priced):
    head = priced.report.split("## Runs")[0]
    assert "**The answer** — baseline: h20 (`grpo-h20`); candidate: a3 (`grpo-a3`):" in head
    # one run per side: the difference, labelled by unit, but no "faster" before a test could show it (issue 42)
    assert "- per chip: h20 took less chip-time in these runs, not shown to be faster (no noise measured): " \
           "candidate / baseline 1.53× per training step, 1.53× per token, 1.58× end to end" in head
    assert "- per node: h20 took less node-time in these runs" in head and "is faster" not in head
    assert "- cost per 1k samples: h20 0.5208 (at 20 per node-hour × 1 node), a3 0.9562 (at 1.5 per device-hour " \
           "(one A3 device = one die) × 16 dies)" in head
    assert "validation accuracy): candidate -1.00 points vs baseline: the noise could not be measured" in head
    assert "constructed figures, not measurements" in head  # the fixture's seconds were chosen, not measured


def test_without_prices_the_section_says_how_to_add_them(store):
    report = compare_runs(store["h20"], store["a3"]).report
    assert "No prices given: add `-P prices=prices.yaml`" in report
    assert "- cost per 1k samples: no prices given" in report


@pytest.mark.parametrize(("text", "expected"), [
    ("a3: {node_hour: -1}\n", "profile 'a3' has {'node_hour': -1}: give one positive price"),
    ("a3: {per_hour: 2}\n", "profile 'a3' has {'per_hour': 2}"),
    ("- a3\n", "expected a mapping of profile"),
])
def test_a_bad_prices_file_is_one_line_and_opens_no_run(store, text, expected):
    bad = store["root"] / "bad-prices.yaml"
    bad.write_text(text)
    with pytest.raises(VerlflowError) as info:
        compare_runs(store["h20"], store["a3"], prices=str(bad))
    assert expected in str(info.value) and "\n" not in str(info.value)
    client = MlflowClient()
    experiments = [e.experiment_id for e in client.search_experiments()]
    assert not client.search_runs(experiments, "tags.verlflow.step = 'compare' and attributes.status = 'RUNNING'")


def test_the_cli_refuses_a_missing_prices_file_with_exit_2(store, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["compare", "--baseline", store["h20"], "--candidate", store["a3"],
                  "--prices", str(store["root"] / "nope.yaml")])
    assert info.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "prices=" in err[0] and "no such file" in err[0]


def test_an_a3_price_per_chip_hour_gives_the_hand_computed_cost(store):
    prices = store["root"] / "chip-prices.yaml"
    prices.write_text("h20: {node_hour: 20.0}\na3: {chip_hour: 3.0}\n")
    h20, a3 = compare_runs(store["h20"], store["a3"], prices=str(prices)).efficiency
    a3_chips = 16 / 2  # trainer.n_gpus_per_node = 16 dies, two per 910C chip
    a3_per_hour = 3.0 * a3_chips  # 24.0 an hour for the node's 8 chips
    assert a3.price_per_hour == pytest.approx(a3_per_hour)
    assert a3.cost_per_1k_samples == pytest.approx(a3_per_hour * A3_STEP / 3600 / SAMPLES * 1000)
    assert a3.cost_per_step == pytest.approx(a3_per_hour * A3_STEP / 3600)
    assert a3.cost_per_1m_tokens == pytest.approx(a3_per_hour * A3_STEP / 3600 / TOKENS * 1e6)
    assert a3.run_cost == pytest.approx(a3_per_hour * A3_E2E / 3600)
    # 3.0 per chip-hour is 1.5 per die-hour: the same cost as the device_hour price of the `priced` report
    assert a3.cost_per_1k_samples == pytest.approx(1.5 * 16 * A3_STEP / 3600 / SAMPLES * 1000)
    assert a3.price_text == "3 per chip-hour × 8 chips"
    assert h20.price_text == "20 per node-hour × 1 node"


def test_a_device_hour_price_on_an_a3_says_a_device_is_a_die(priced):
    _, a3 = priced.efficiency
    assert a3.price_text == "1.5 per device-hour (one A3 device = one die) × 16 dies"
    assert "| devices as verl counts them | 8 devices | 16 dies (2 per chip) |" in priced.report
    assert "On the candidate (A3: 2 dies per chip) a device as verl counts it is one die" in priced.report


@pytest.mark.parametrize("page", ["README.md", "docs/compare.md"])
def test_the_readme_and_compare_guide_show_this_comparisons_first_screen(priced, page):
    guide = (Path(__file__).parents[1] / page).read_text(encoding="utf-8")
    shown = guide.split("opens with the answer")[1].split("```")[1].strip().splitlines()
    assert shown[0].startswith("**The answer**") and len(shown) >= 6
    for line in shown:
        assert line in priced.report.splitlines(), line
