"""`compare` on real train-shaped runs in a real SQLite store: ratios, versions, config diff, parity, files.

The runs are logged the way a train run logs (verl-flattened params of a really composed config,
verl metric names per step, the end-of-run summaries of verlflow.tracking.tracking, device tags), with
timings chosen so that the candidate/baseline ratios are the guide's §6.3 figures.
"""

from __future__ import annotations

import functools
import time

import mlflow
import pytest
from conftest import fresh_store, isolated_store
from matplotlib.image import imread
from mlflow.tracking import MlflowClient

from verlflow import config
from verlflow.compare.comparison import compare_runs
from verlflow.tracking import tracking

H20_TAGS = {
    "device.type": "gpu", "device.name": "NVIDIA H20", "device.count": "8", "device.memory_gb": "95.6",
    "device.driver": "550.127.08", "device.cuda": "12.6", "host.arch": "x86_64", "sw.python": "3.10.18",
    "sw.torch": "2.7.1+cu126", "sw.ray": "2.50.0", "sw.transformers": "4.53.0", "sw.vllm": "0.9.2",
    "sw.verl": "0.5.0", "sw.mlflow": "3.17.2", "env.VLLM_USE_V1": "1",
}
A3_TAGS = {
    "device.type": "npu", "device.name": "Ascend910_9392", "device.count": "16", "device.memory_gb": "64",
    "device.driver": "25.2.0", "device.firmware": "25.2.0", "device.cann": "8.2.RC1", "host.arch": "aarch64",
    "sw.python": "3.10.18", "sw.torch": "2.5.1", "sw.torch_npu": "2.5.1.post1", "sw.ray": "2.49.1",
    "sw.transformers": "4.52.4", "sw.vllm": "0.9.1", "sw.vllm_ascend": "0.9.1", "sw.verl": "0.5.0",
    "sw.mlflow": "3.17.2", "env.VLLM_USE_V1": "1", "env.TASK_QUEUE_ENABLE": "2", "env.CPU_AFFINITY_CONF": "1",
}

# Per-step timings (4 steps). Means: gen 10 → 8 (0.80×), update_actor 4 → 9.4 (2.35×), step 20 → 30.6 (1.53×),
# reward 1 → 1.5 (1.50×); e2e 100 → 158 (1.58×): the guide's §6.3, A3 relative to H20.
H20_TIMINGS = {"gen": [9, 11, 10, 10], "update_actor": [4] * 4, "step": [19, 21, 20, 20], "reward": [1] * 4}
A3_TIMINGS = {"gen": [7, 9, 8, 8], "update_actor": [9.4] * 4, "step": [30.6] * 4, "reward": [1.5] * 4}
SCORE = [0.1, 0.2, 0.3, 0.4]
CONSTRUCTED = {"verlflow.constructed": "timings chosen to give the guide's section 6.3 ratios"}
PG_LOSS = [0.5, 0.4, 0.3, 0.2]


@functools.cache
def resolved_config(recipe: str, profile: str, overrides: str = "") -> dict:
    """The resolved verl config a train run of ``recipe`` on ``profile`` logs as params (composed once)."""
    return config.compose(recipe, profile, overrides).to_container()


def log_train_run(
    name: str,
    *,
    recipe: str,
    profile: str,
    device_tags: dict[str, str],
    timings: dict[str, list[float]],
    curves: dict[str, list[float | None]],
    e2e: float,
    overrides: str = "",
    extra_tags: dict[str, str] | None = None,
) -> str:
    """Log one run exactly as a train run does: params, tags, per-step metrics, end-of-run summaries."""
    started = time.time() - e2e
    extra_tags = extra_tags or {}
    tags = {**tracking.standard_tags(backend="verl", recipe=recipe, profile=profile), **extra_tags}
    with tracking.tracked_run(run_name=name, tags={**tags, "verlflow.step": "train", **device_tags}) as run:
        tracking.log_verl_params(resolved_config(recipe, profile, overrides))
        for i in range(len(next(iter(timings.values())))):
            step_metrics = {f"timing_s/{k}": v[i] for k, v in timings.items()}
            step_metrics.update({k: v[i] for k, v in curves.items() if i < len(v) and v[i] is not None})
            tracking.log_metrics(step_metrics, step=i + 1)
        tracking.log_run_summaries(run.info.run_id, started, ended_at=started + e2e)
    return run.info.run_id


def h20_curves() -> dict[str, list[float | None]]:
    return {
        "critic/score/mean": SCORE,
        "actor/pg_loss": PG_LOSS,
        "actor/entropy": [1.5, 1.4, 1.3, 1.2],
        "actor/kl_loss": [0.0, 0.001, 0.002, 0.003],
        "actor/grad_norm": [2.0, 1.8, 1.6, 1.4],
        "response_length/mean": [200, 210, 220, 230],
        # logged raw, as verl names it: the '@' becomes '_at_' on the way in
        "val-core/openai/gsm8k/reward/mean@1": [None, 0.30, None, 0.40],
    }


def a3_curves() -> dict[str, list[float | None]]:
    curves = h20_curves()
    curves["critic/score/mean"] = [v * 1.01 for v in SCORE]  # 1% off: within 2%
    curves["actor/pg_loss"] = [v * 1.10 for v in PG_LOSS]  # 10% off: fails
    curves["actor/grad_norm"] = [2.0, 1.8, 1.6]  # one step fewer
    return curves


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real SQLite store with an H20 run and an A3 run of the guide's recipe, and one smoke run on cpu."""
    root = tmp_path_factory.mktemp("compare")
    with isolated_store(root) as uri:
        recipe = "qwen3-4b-gsm8k-grpo"
        h20 = log_train_run("grpo-h20", recipe=recipe, profile="h20", device_tags=H20_TAGS,
                            timings=H20_TIMINGS, curves=h20_curves(), e2e=100.0, extra_tags=CONSTRUCTED)
        a3 = log_train_run("grpo-a3", recipe=recipe, profile="a3", device_tags=A3_TAGS,
                           timings=A3_TIMINGS, curves=a3_curves(), e2e=158.0, extra_tags=CONSTRUCTED)
        cpu_tags = {"device.type": "cpu", "device.name": "test CPU", "env.OMP_NUM_THREADS": "2"}
        smoke = log_train_run("smoke-cpu", recipe="smoke", profile="cpu", device_tags=cpu_tags,
                              timings=H20_TIMINGS, curves=h20_curves(), e2e=50.0)
        yield {"uri": uri, "root": root, "h20": h20, "a3": a3, "smoke": smoke}


@pytest.fixture(scope="module")
def result(store):
    """One comparison H20 (baseline) → A3 (candidate), by run id, with the files kept in a folder."""
    return compare_runs(store["h20"], store["a3"], str(store["root"] / "out"))


def test_time_ratios_are_the_runs_own_metrics_divided(store, result):
    client = MlflowClient()
    base, cand = client.get_run(store["h20"]).data.metrics, client.get_run(store["a3"]).data.metrics
    rows = {r.key: r for r in result.timings}
    for key, expected in [("timing_s/e2e", 1.58), ("timing_s_mean/gen", 0.80),
                          ("timing_s_mean/update_actor", 2.35), ("timing_s_mean/step", 1.53),
                          ("timing_s_mean/reward", 1.50)]:
        assert rows[key].baseline == pytest.approx(base[key])
        assert rows[key].candidate == pytest.approx(cand[key])
        assert rows[key].ratio == pytest.approx(cand[key] / base[key])
        assert rows[key].ratio == pytest.approx(expected, rel=1e-3)
    # the guide's four rows first, in its words, then every other timing_s_mean/*
    assert [r.key for r in result.timings][:4] == ["timing_s/e2e", "timing_s_mean/gen",
                                                   "timing_s_mean/update_actor", "timing_s_mean/step"]
    for words in ("end-to-end time", "mean generation (rollout) time", "mean actor (policy) update time",
                  "mean step time"):
        assert words in result.report
    assert not _has_cjk(result.report)  # English labels: the guide's 演员 ("stage actor") mistranslates verl's actor
    assert "| 0.80× |" in result.report and "| 1.58× |" in result.report
    # the guide's ratios are quoted as its claims; constructed seconds reproduce nothing (issue 42 item 8)
    assert "| end-to-end time | `timing_s/e2e` | 100.00 | 158.00 | 1.58× | 1.58× |" in result.report
    assert "The guide's §6.3 claims, as it states them (ratios only" in result.report
    assert "**These runs' seconds are constructed**" in result.report and "reproduce them" not in result.report
    assert result.report.count("constructed figures, not measurements") == 1  # on the first screen


def test_the_first_screen_names_each_side_once_and_tests_before_it_claims_speed(result):
    first = result.report.split("\n\n")[1]
    assert first.startswith("**The answer** — baseline: h20 (`grpo-h20`); candidate: a3 (`grpo-a3`):")
    assert "the baseline (" not in first  # issue 46: "baseline the baseline (cpu)"
    # one run per side: a difference, labelled per step / per token / end to end, but no "faster" claim
    assert "is faster" not in first and "h20 took less chip-time in these runs, not shown to be faster" in first
    assert "1.53× per training step" in first and "1.58× end to end" in first
    assert "the noise could not be measured" in first and "threshold of 1 s" in first


def test_versions_come_side_by_side_from_the_tags(result):
    rows = {label: (b, c) for label, b, c in result.versions}
    assert rows["torch-npu"] == ("-", "2.5.1.post1")
    assert rows["CANN"] == ("-", "8.2.RC1")
    assert rows["CUDA"] == ("12.6", "-")
    assert rows["devices (as verl counts them: an A3 die is one)"] == ("8", "16")
    assert rows["vllm"] == ("0.9.2", "0.9.1")
    assert "| torch-npu | - | 2.5.1.post1 |" in result.report


def test_profile_differences_are_separated_and_the_recipe_is_the_same(result):
    profile = {r.key: (r.baseline, r.candidate) for r in result.diff.profile}
    assert profile["trainer/n_gpus_per_node"] == ("8", "16")
    assert profile["trainer/device"] == ("cuda", "npu")
    assert profile["tag verlflow.profile"] == ("h20", "a3")
    assert profile["tag env.TASK_QUEUE_ENABLE"] == ("-", "2")
    assert result.diff.recipe == []
    assert not result.recipes_differ
    assert "RECIPES DIFFER" not in result.report


def test_parity_verdict_per_curve_over_the_common_steps(result):
    rows = {r.key: r for r in result.parity}
    score = rows["critic/score/mean"]
    assert score.steps == [1, 2, 3, 4]
    assert score.mean_relative_difference == pytest.approx(0.01)
    assert score.passed is True
    pg = rows["actor/pg_loss"]
    assert pg.mean_relative_difference == pytest.approx(0.10) and pg.passed is False
    assert rows["actor/grad_norm"].steps == [1, 2, 3]
    assert "compared the 3 in common" in rows["actor/grad_norm"].note
    assert rows["val-core/openai/gsm8k/reward/mean_at_1"].steps == [2, 4]
    assert rows["actor/entropy"].mean_relative_difference == 0
    assert not result.parity_passed
    assert "parity FAIL: 6/7 curves within verl's margins: 2% loss and other curves, 4% GRPO reward" in result.report
    assert "worst: policy-gradient loss 10.00% against ±2%" in result.report
    assert rows["critic/score/mean"].margin == 0.04 and pg.margin == 0.02


def test_report_files_are_written_and_logged_on_a_finished_comparison_run(store, result):
    out = store["root"] / "out"
    for name in ("report.md", "comparison.json", "curves.png", "curves/critic_score_mean.png",
                 "curves/val-core_openai_gsm8k_reward_mean_at_1.png", "curves/actor_pg_loss.png"):
        assert (out / name).is_file(), name
    height, width, _ = imread(out / "curves.png").shape
    assert width > 1000 and height > 1000  # a 2 x 4 grid, readable at a glance
    assert (out / "report.md").read_text(encoding="utf-8") == result.report

    client = MlflowClient()
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["verlflow.step"] == "compare"
    assert run.data.tags["compare.baseline_run_id"] == store["h20"]
    assert run.data.tags["compare.candidate_run_id"] == store["a3"]
    assert run.data.metrics["compare/ratio/timing_s_mean/gen"] == pytest.approx(0.8)
    assert run.data.metrics["compare/ratio/timing_s/e2e"] == pytest.approx(1.58)
    assert run.data.metrics["compare/parity/critic/score/mean"] == pytest.approx(0.01)
    assert run.data.metrics["compare/parity_pass/actor/pg_loss"] == 0
    logged = {f.path for f in client.list_artifacts(result.run_id, "compare")}
    assert {"compare/report.md", "compare/comparison.json", "compare/curves.png", "compare/curves"} <= logged
    curves = {f.path for f in client.list_artifacts(result.run_id, "compare/curves")}
    assert "compare/curves/critic_score_mean.png" in curves and len(curves) == 7


def test_runs_are_found_by_name_and_by_tag_filter(store, capsys):
    by_filter = compare_runs("tags.device.type = 'gpu'", "tags.`device.type` = 'npu'")
    assert (by_filter.baseline.run_id, by_filter.candidate.run_id) == (store["h20"], store["a3"])
    by_name = compare_runs("grpo-h20", "grpo-a3")
    assert (by_name.baseline.run_id, by_name.candidate.run_id) == (store["h20"], store["a3"])
    assert by_name.output_dir == ""  # no folder asked for: artifacts only
    assert "## 6.3 Performance" in capsys.readouterr().out


def test_different_recipes_are_flagged_first_and_the_report_goes_on(store, capsys):
    result = compare_runs(store["smoke"], store["a3"])
    printed = capsys.readouterr().out
    assert printed.startswith("⚠ RECIPES DIFFER")
    assert result.recipes_differ
    recipe = {r.key: (r.baseline, r.candidate) for r in result.diff.recipe}
    assert recipe["tag verlflow.recipe"] == ("smoke", "qwen3-4b-gsm8k-grpo")
    assert recipe["data/train_batch_size"] == ("8", "512")
    assert "actor_rollout_ref/actor/optim/lr" in recipe
    # the warning is the report's first statement, and the other parts follow
    first_paragraph = result.report.split("\n\n")[1]
    assert first_paragraph.startswith("**⚠ RECIPES DIFFER") and "tag verlflow.recipe" in first_paragraph
    for part in ("## Versions", "## Performance", "## Curves", "## Config diff"):
        assert part in result.report
    assert MlflowClient().get_run(result.run_id).data.tags["compare.recipes_differ"] == "true"
    # no speed claim across different work (issue 46): what differs, then run-vs-run figures with their units
    assert "is faster" not in result.report and "took less" not in result.report
    assert "- speed: no speed claim: the work differs (recipe smoke vs qwen3-4b-gsm8k-grpo; model tiny-qwen3-sft vs " \
        "Qwen3-4B; batch 8 vs 512" in result.report
    assert "run vs run, candidate / baseline: time per training step 1.53×" in result.report


def _has_cjk(text: str) -> bool:
    return any("\u3000" <= ch <= "\u9fff" for ch in text)


def test_two_seeds_of_one_recipe_get_a_plain_comparison_without_a_parity_verdict(store):
    """The same recipe and profile, another data.seed: differences are reported, nothing is judged (issue 36)."""
    recipe = "qwen3-4b-gsm8k-grpo"
    seed2 = log_train_run("grpo-a3 · seed=2", recipe=recipe, profile="a3", device_tags=A3_TAGS,
                          timings=A3_TIMINGS, curves=h20_curves(), e2e=150.0, overrides="data.seed=2")
    result = compare_runs(store["a3"], seed2)

    assert [(r.key, r.baseline, r.candidate) for r in result.diff.seeds] == [("data/seed", "None", "2")]
    assert result.diff.recipe == [] and not result.judged
    first_paragraph = result.report.split("\n\n")[1]
    assert first_paragraph.startswith("**SAME DEVICE PROFILE: both sides ran on a3")
    assert "no parity verdict" in first_paragraph
    assert "parity: not judged (both sides ran on one device profile" in result.report
    assert "PASS" not in result.report and "FAIL" not in result.report and not _has_cjk(result.report)
    assert all(r.passed is None for r in result.parity) and not result.parity_passed
    assert "- speed: no speed claim: both sides ran on one accelerator (Ascend910_9392)" in result.report
    assert "is faster" not in result.report
    # the differences themselves are still there, curve by curve
    rows = {r.key: r for r in result.parity}
    assert rows["actor/pg_loss"].mean_relative_difference == pytest.approx(0.10 / 1.10)
    run = MlflowClient().get_run(result.run_id)
    assert run.data.tags["compare.parity"].startswith("parity: not judged")
    assert not any(k.startswith("compare/parity") for k in run.data.metrics)
    assert "compare/mean_rel_diff/actor/pg_loss" in run.data.metrics


def test_one_recipe_on_two_profiles_keeps_the_parity_verdict(result):
    assert not result.recipes_differ
    assert "parity FAIL: 6/7" in result.report and "| PASS |" in result.report
    assert "no parity verdict" not in result.report


def test_two_seeds_on_two_accelerators_get_a_tested_speed_claim(tmp_path, monkeypatch):
    """Two seeds a side of the same work on H20 and A3: Welch's test on the step times, then "faster" (issue 42)."""
    uri = fresh_store(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    recipe = "qwen3-4b-gsm8k-grpo"
    ids = {}
    for side, profile, tags, timings, shift, e2e in (("h20", "h20", H20_TAGS, H20_TIMINGS, 0.4, 100.0),
                                                     ("a3", "a3", A3_TAGS, A3_TIMINGS, 0.5, 158.0)):
        for seed in (1, 2):
            moved = {k: [v + shift * (seed - 1) for v in values] for k, values in timings.items()}
            ids[side, seed] = log_train_run(f"{side} · seed={seed}", recipe=recipe, profile=profile, device_tags=tags,
                                            timings=moved, curves=h20_curves(), e2e=e2e + seed,
                                            overrides=f"data.seed={seed}")
    result = compare_runs(f"{ids['h20', 1]},{ids['h20', 2]}", f"{ids['a3', 1]},{ids['a3', 2]}")
    first = result.report.split("## Runs")[0]
    assert "- speed (two accelerators, the same work): mean step time candidate / baseline 1.53×: " \
           "a device effect (p = " in first
    assert "% interval [" in first and "threshold 1.01 s" in first and "Holm-adjusted p = " in first
    assert "- per chip: h20 is faster: a3 needs 1.53× the chip-time per training step" in first
    assert "1.57× end to end" in first
    step = next(f for f in result.figures if f.key == "timing_s_mean/step")
    assert step.verdict == "device effect" and step.effect.low > 0
