"""`compare` of sets of real local CPU runs: intervals, tests against the seed-to-seed noise, verdicts; determinism.

Six tiny-recipe runs of the local trainer in one real SQLite store (about 6 s each on 2 cores): two seeds on
the ``cpu`` profile, two seeds on a second CPU profile (``cpu-b``, a copy with one thread), and two runs of one
seed with ``verlflow.deterministic=true``. Issues 35 (sets, noise, determinism) and 36 (a parity verdict only
between two device profiles).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import mlflow
import pytest
import yaml
from conftest import fresh_store, slow_setup
from mlflow.tracking import MlflowClient
from scipy.stats import t, ttest_ind

from verlflow.compare.comparison import compare_runs
from verlflow.config.loading import PROFILES_DIR
from verlflow.step_requests import TrainRequest
from verlflow.steps.train import run_train

QUIET = "verlflow.system_metrics_interval=0"
# Metrics that measure time: two bit-identical runs still take different wall-clock times.
TIME_PREFIXES = ("timing_s", "timing_per_token_ms/", "perf/throughput", "perf/time_per_step", "attempt/")


def _train(profile: str, data_dir: Path, overrides: str) -> str:
    request = TrainRequest(recipe="tiny", device="cpu", profile=profile, data_dir=str(data_dir),
                           overrides=f"{QUIET} {overrides}")
    run_train(request)
    client = MlflowClient()
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, order_by=["attributes.start_time DESC"], max_results=1)
    assert runs[0].info.status == "FINISHED"
    return runs[0].info.run_id


@pytest.fixture(scope="module")
@slow_setup
def runs(tmp_path_factory, tiny_workdir):
    """Run ids: cpu seeds 1 and 2, cpu-b seeds 1 and 2, and two deterministic runs of seed 1 on cpu."""
    root = tmp_path_factory.mktemp("run-sets")
    profile_b = root / "cpu-b.yaml"
    record = yaml.safe_load((PROFILES_DIR / "cpu.yaml").read_text())
    record.update(description="CPU, one thread (a second device profile for tests)", env={"OMP_NUM_THREADS": "1"})
    profile_b.write_text(yaml.safe_dump(record))
    with pytest.MonkeyPatch.context() as mp:
        uri = fresh_store(root)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))
        mp.delenv("MLFLOW_RUN_ID", raising=False)
        mp.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        mp.chdir(root)
        mlflow.set_tracking_uri(uri)
        data = tiny_workdir / "data"
        ids = {
            "a1": _train("cpu", data, "actor_rollout_ref.rollout.seed=1"),
            "a2": _train("cpu", data, "actor_rollout_ref.rollout.seed=2"),
            "b1": _train(str(profile_b), data, "actor_rollout_ref.rollout.seed=1"),
            "b2": _train(str(profile_b), data, "actor_rollout_ref.rollout.seed=2"),
            "d1": _train("cpu", data, "actor_rollout_ref.rollout.seed=1 verlflow.deterministic=true"),
            "d2": _train("cpu", data, "actor_rollout_ref.rollout.seed=1 verlflow.deterministic=true"),
        }
        yield {**ids, "profile_b": str(profile_b)}


@pytest.fixture(scope="module")
def sets(runs):
    """cpu seeds {1, 2} (a comma list) against cpu-b seeds {1, 2} (a tag filter selecting both)."""
    return compare_runs(f"{runs['a1']},{runs['a2']}", f"tags.`verlflow.profile` = '{runs['profile_b']}'")


@pytest.mark.slow
def test_two_sets_of_seeds_on_two_profiles_get_intervals_tests_and_a_verdict(runs, sets):
    assert [s.run_id for s in sets.baseline_runs] == [runs["a1"], runs["a2"]]
    assert {s.run_id for s in sets.candidate_runs} == {runs["b1"], runs["b2"]}
    assert sets.judged  # two device profiles: a parity verdict
    client = MlflowClient()
    figures = {f.key: f for f in sets.figures}
    for key in ("critic/score/mean", "timing_s/e2e", "timing_s_mean/gen", "timing_s_mean/update_actor"):
        row = figures[key]
        base = [client.get_run(runs[r]).data.metrics[key] for r in ("a1", "a2")]
        cand = [client.get_run(runs[r]).data.metrics[key] for r in ("b1", "b2")]
        # hand arithmetic: mean, Student's t 95% half-width with one degree of freedom
        assert row.baseline.mean == pytest.approx(statistics.fmean(base))
        assert row.baseline.half_width == pytest.approx(t.ppf(0.975, 1) * abs(base[0] - base[1]) / 2)
        assert row.candidate.mean == pytest.approx(statistics.fmean(cand))
        # Welch's test as scipy computes it, and the verdict it gives with the figure's threshold
        welch = ttest_ind(cand, base, equal_var=False)
        if math.isnan(welch.pvalue):  # every run of both sides gave one value (the tiny model's reward: 0)
            assert row.effect.p_value is None and row.verdict == "noise not measured", key
            continue
        assert row.effect.p_value == pytest.approx(welch.pvalue)
        assert row.effect.low < row.difference < row.effect.high
        big_enough = abs(row.difference) >= row.effect.threshold
        # decided with the report's other verdicts (Holm): significant only when the adjusted p is under 0.05
        assert row.effect.family_p >= row.effect.p_value and row.effect.family > 1
        # two profiles of one CPU are one accelerator: beyond the noise, never a device effect
        expected = ("beyond noise" if big_enough else "significant but below the threshold") \
            if row.effect.family_p < 0.05 else "within noise"
        assert row.verdict == expected, key
    # curves: tested for equivalence within verl's margins on the runs' curves, not against a noise floor
    tested = [r for r in sets.parity if r.passed is not None and r.equivalence.tested]
    assert tested
    for r in tested:
        assert r.passed == (-r.margin < r.equivalence.low and r.equivalence.high < r.margin)
    report = sets.report
    assert "## Several runs: means, 95% intervals and tests" in report
    assert "curves shown equivalent within verl's margins" in report and "noise floor" not in report
    assert "the baseline was not deterministic" in report  # its runs did not set verlflow.deterministic
    assert "differ in settings beyond their seeds" not in report
    # the first screen: every verdict with its p-value, interval and threshold; no speed claim on one machine
    first = report.split("## Runs")[0]
    assert "- speed: no speed claim: both sides ran on one accelerator" in first and "is faster" not in first
    assert "accuracy (final validation accuracy): candidate" in first and "threshold 1 point" in first
    assert "  - mean step time, run vs run: " in first and "p = " in first and "% interval [" in first
    logged = client.get_run(sets.run_id).data
    assert logged.tags["compare.baseline_run_ids"] == f"{runs['a1']},{runs['a2']}"
    assert logged.metrics["compare/p_value/timing_s/e2e"] == pytest.approx(figures["timing_s/e2e"].effect.p_value)


@pytest.mark.slow
def test_single_runs_on_two_profiles_say_the_noise_was_not_measured(runs):
    result = compare_runs(runs["a1"], runs["b1"])
    assert result.judged
    assert "**The noise could not be measured: a side has one run.**" in result.report
    assert all(f.verdict in ("noise not measured", "not comparable") for f in result.figures)
    assert "(a side has one run: verl's single-run rule, no p-value or interval" in result.report
    assert "| PASS |" in result.report or "| FAIL |" in result.report


@pytest.mark.slow
def test_two_deterministic_local_runs_are_bit_identical_on_every_metric(runs):
    client = MlflowClient()
    first, second = client.get_run(runs["d1"]), client.get_run(runs["d2"])
    assert first.data.tags["verlflow.deterministic"] == second.data.tags["verlflow.deterministic"] == "true"
    keys = [k for k in first.data.metrics if not k.startswith(TIME_PREFIXES)]
    assert set(keys) == {k for k in second.data.metrics if not k.startswith(TIME_PREFIXES)}
    assert "actor/pg_loss" in keys and "actor/entropy" in keys and "actor/grad_norm" in keys
    for key in keys:
        history = [[(m.step, m.value) for m in client.get_metric_history(run, key)] for run in (runs["d1"], runs["d2"])]
        assert sorted(history[0]) == sorted(history[1]), key  # exact float equality, every step


@pytest.mark.slow
def test_identical_settings_on_one_profile_get_no_parity_verdict(runs, capsys):
    result = compare_runs(runs["d1"], runs["d2"])
    printed = capsys.readouterr().out
    assert printed.startswith("SAME DEVICE PROFILE: both sides ran on cpu")
    assert not result.judged and all(r.passed is None for r in result.parity)
    assert "parity: not judged (both sides ran on one device profile" in result.report
    assert "PASS" not in result.report and "FAIL" not in result.report
    assert "was not deterministic" not in result.report
    entropy = next(r for r in result.parity if r.key == "actor/entropy")
    assert entropy.mean_relative_difference == 0  # bit-identical curves
