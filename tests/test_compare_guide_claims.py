"""The guide's §6.3 ratios (A3 relative to H20: 1.58× end to end, 0.80× generation, 2.35× update, 1.53× step) are
held only against an H20 baseline and an A3 candidate, and "reproduced" only when each ratio's 95 % interval lies
inside ±5 % of the claim: one run a side has no interval. Made-up runs, logged as train runs log, in a real SQLite
store (tests/test_compare_report.py's ``log_train_run``); none is tagged constructed, so the report judges them.
"""

from __future__ import annotations

import pytest
from conftest import isolated_store
from test_compare_report import A3_TAGS, H20_TAGS, h20_curves, log_train_run

from verlflow.compare.comparison import compare_runs
from verlflow.compare.report_files import ratio_interval

GUIDE = "qwen3-4b-gsm8k-grpo"
H100_TAGS = {"device.type": "gpu", "device.name": "NVIDIA H100 80GB HBM3", "device.count": "8",
             "device.memory_gb": "79.6"}
H200_TAGS = {"device.type": "gpu", "device.name": "NVIDIA H200", "device.count": "8", "device.memory_gb": "140.4"}
# Per-step timings whose means give the guide's ratios, candidate / baseline (see test_compare_report.py).
BASE_TIMINGS = {"gen": [10.0] * 4, "update_actor": [4.0] * 4, "step": [20.0] * 4}
CAND_TIMINGS = {"gen": [8.0] * 4, "update_actor": [9.4] * 4, "step": [30.6] * 4}
SENTENCE = "the guide's §6.3 end-to-end 1.58×"


def _scaled(timings: dict[str, list[float]], factor: float) -> dict[str, list[float]]:
    return {key: [value * factor for value in values] for key, values in timings.items()}


def _side(name: str, profile: str, tags: dict[str, str], timings: dict[str, list[float]], e2e: float,
          noise: tuple[float, ...] = (1.0,)) -> str:
    """Runs of one side (one per factor in ``noise``, each a run's seconds × that factor), as a comma list."""
    return ",".join(log_train_run(f"{name}-{i}", recipe=GUIDE, profile=profile, device_tags=tags,
                                  timings=_scaled(timings, factor), curves=h20_curves(), e2e=e2e * factor)
                    for i, factor in enumerate(noise))


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    """One H100 and one H200 run, one and three H20 and A3 runs, all with the guide's ratios between the sides."""
    root = tmp_path_factory.mktemp("guide-claims")
    seeds = (0.995, 1.0, 1.005)  # three runs a side, 0.5 % apart: each ratio's interval about ±1 %
    with isolated_store(root):
        yield {
            "h100": _side("h100", "h100", H100_TAGS, BASE_TIMINGS, 100.0),
            "h200": _side("h200", "h200", H200_TAGS, CAND_TIMINGS, 158.0),
            "h20": _side("h20", "h20", H20_TAGS, BASE_TIMINGS, 100.0),
            "a3": _side("a3", "a3", A3_TAGS, CAND_TIMINGS, 158.0),
            "h20 set": _side("h20-seed", "h20", H20_TAGS, BASE_TIMINGS, 100.0, seeds),
            "a3 set": _side("a3-seed", "a3", A3_TAGS, CAND_TIMINGS, 158.0, seeds),
            "a3 slower set": _side("a3-slow", "a3", A3_TAGS, _scaled(CAND_TIMINGS, 1.08), 158.0 * 1.08, seeds),
        }


def test_an_h100_against_an_h200_with_the_guides_ratios_reproduces_no_guide_claim(sides):
    report = compare_runs(sides["h100"], sides["h200"]).report
    assert "| 1.58× |" in report  # the same ratios as the guide's
    assert "reproduce them" not in report and "the guide's claim (A3 / H20)" not in report
    assert "The guide's §6.3 ratios (A3 relative to H20) are not compared here: this is H100 against H200" in report
    assert SENTENCE not in report


def test_an_h20_against_an_h20_prints_no_sentence_about_the_guides_ratio(sides):
    report = compare_runs(sides["h20"], sides["h20 set"].split(",")[0]).report
    assert SENTENCE not in report and "1.58" not in report


def test_one_h20_run_against_one_a3_run_cannot_reproduce_the_guide(sides):
    report = compare_runs(sides["h20"], sides["a3"]).report
    assert "| end-to-end time | `timing_s/e2e` | 100.00 | 158.00 | 1.58× | 1.58× |" in report
    assert "Whether these runs reproduce them cannot be told: a ratio with one run on a side" in report
    assert "These sets reproduce them" not in report
    assert SENTENCE in report  # the pair the guide measured: its 1.58× read per node and per chip


def test_three_h20_runs_against_three_a3_runs_reproduce_the_guide_when_every_interval_is_inside_5_percent(sides):
    report = compare_runs(sides["h20 set"], sides["a3 set"]).report
    assert "These sets reproduce them: each ratio's 95% interval lies inside ±5% of the guide's" in report
    slower = compare_runs(sides["h20 set"], sides["a3 slower set"]).report  # every ratio 8 % above the guide's
    assert "These sets do not reproduce them" in slower and "end-to-end time [1.6" in slower


def test_the_sides_swapped_are_not_the_guides_pair(sides):
    report = compare_runs(sides["a3"], sides["h20"]).report
    assert "this is A3 against H20 (swap the sides: its ratios are A3 / H20)" in report
    assert "reproduce them" not in report


def test_a_ratios_interval_needs_two_runs_a_side():
    assert ratio_interval([100.0], [158.0, 159.0]) is None  # one run on a side: no interval
    low, high = ratio_interval([99.5, 100.0, 100.5], [157.2, 158.0, 158.8])
    assert low < 1.58 < high and high - low < 0.05
