"""The units of compare's efficiency figures on constructed runs: per step vs per token, fractional chips,
unknown inputs, active parameters of an MoE model, generation's bandwidth, the prices template.

Pure arithmetic on in-memory snapshots (what compare reads from the store); the store round trip is
tests/test_compare_efficiency.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verlflow.compare import efficiency
from verlflow.compare.model_size import model_size
from verlflow.compare.prices import Price, read_prices
from verlflow.compare.snapshot import RunSnapshot

ROOT = Path(__file__).parents[1]
MOE_MODEL = Path(__file__).parent / "fixtures" / "compare" / "qwen3-30b-a3b"
H20_PEAK, A3_PEAK = 148e12, 376e12  # per device, the h20 and a3 profiles' records


def _run(role: str, profile: str, *, devices: int = 8, step_s: float = 240.0, tokens: float = 1.28e6,
         model: str = "/weights/Qwen3-4B", drop: tuple[str, ...] = (), **extra) -> RunSnapshot:
    params = {"trainer/n_gpus_per_node": str(devices), "trainer/nnodes": "1", "data/train_batch_size": "512",
              "actor_rollout_ref/rollout/n": "5", "actor_rollout_ref/actor/ppo_epochs": "1",
              "actor_rollout_ref/model/path": model, **extra.pop("params", {})}
    metrics = {"timing_s_mean/step": step_s, "timing_s_mean/gen": step_s / 2, "timing_s_mean/update_actor":
               step_s / 3, "timing_s/e2e": step_s * 100, "perf/total_num_tokens": tokens, **extra.pop("metrics", {})}
    for key in drop:
        params.pop(key, None)
    return RunSnapshot(role, f"{role}-id", role, "FINISHED", {"verlflow.profile": profile, **extra.pop("tags", {})},
                       params, metrics)


def test_per_step_and_per_token_figures_are_each_labelled_when_steps_differ():
    # The case: the candidate's step takes 1.33x as long but carries 1/1.2 of the tokens: per token 1.60x
    base_tokens, cand_tokens = 1.28e6, 1.28e6 / 1.2
    base = efficiency.efficiency_of(_run("baseline", "h20", step_s=240.0, tokens=base_tokens))
    cand = efficiency.efficiency_of(_run("candidate", "h20", step_s=320.0, tokens=cand_tokens))
    per_step = 320.0 / 240.0
    per_token = (320.0 / cand_tokens) / (240.0 / base_tokens)
    assert efficiency.step_time_ratios(base, cand)["chip"] == pytest.approx(per_step)
    assert efficiency.work_time_ratios(base, cand)["chip"] == pytest.approx(per_token)
    section = efficiency.render_section(base, cand, prices_given=False)
    assert f"Hardware-time per training step, candidate / baseline: per chip {per_step:.2f}×" in section
    assert f"Hardware-time per token (the same work), candidate / baseline: per chip {per_token:.2f}×" in section
    assert f"| chip-seconds per training step | {240 * 8:,} | {320 * 8:,} | {per_step:.2f}× |" in section
    assert "per training step and per token disagree" in section
    chip_line = efficiency.first_screen_lines(base, cand, False, "h20", "h20b")[0]
    assert f"h20b needs {per_token:.2f}× the chip-time per token" in chip_line
    assert f"per training step candidate / baseline is {per_step:.2f}×" in chip_line


def test_with_equal_tokens_per_step_the_step_ratio_is_the_answer():
    base = efficiency.efficiency_of(_run("baseline", "h20", step_s=240.0))
    cand = efficiency.efficiency_of(_run("candidate", "a3", devices=16, step_s=367.2))
    line = efficiency.first_screen_lines(base, cand, False, "h20", "a3")[0]
    assert line.startswith(f"- per chip: h20 is faster: a3 needs {367.2 / 240:.2f}× the chip-time per training step")
    assert "per token" not in line


@pytest.mark.parametrize("dies", [1, 3])
def test_a_part_of_an_a3_chip_is_a_fraction_of_a_chip(dies):
    eff = efficiency.efficiency_of(_run("candidate", "a3", devices=dies), {"a3": Price(3.0, "chip_hour")})
    assert eff.hardware.chips == dies / 2  # two dies per 910C chip: 0.5 and 1.5 chips, not 1
    assert eff.tokens_per_s("chip") == pytest.approx(1.28e6 / 240.0 / (dies / 2))
    assert eff.price_per_hour == pytest.approx(3.0 * dies / 2)
    assert eff.price_text == f"3 per chip-hour × {dies / 2:g} chips"


def test_a_missing_param_makes_its_figures_unknown_not_a_default_of_one():
    base = efficiency.efficiency_of(_run("baseline", "h20", drop=("data/train_batch_size",)),
                                    {"h20": Price(20.0, "node_hour")})
    cand = efficiency.efficiency_of(_run("candidate", "h20", drop=("actor_rollout_ref/actor/ppo_epochs",
                                                                   "trainer/n_gpus_per_node")))
    assert base.samples_per_step is None and base.cost_per_1k_samples is None
    assert base.cost_per_step == pytest.approx(20.0 * 240.0 / 3600)  # what does not need the batch still stands
    assert cand.mfu["update_actor"][0] is None and cand.hardware.devices is None
    assert cand.tokens_per_s("chip") is None and cand.tokens_per_s("node") == pytest.approx(1.28e6 / 240.0)
    section = efficiency.render_section(base, cand, prices_given=True)
    assert "| samples per device-hour | unknown | unknown | unknown |" in section
    assert "the baseline run has no param data/train_batch_size" in section
    assert "the candidate run has no param trainer/n_gpus_per_node, actor_rollout_ref/actor/ppo_epochs" in section
    assert "| devices as verl counts them | 8 devices | unknown |" in section


def test_an_moe_models_mfu_counts_the_parameters_a_token_passes_through():
    snap = _run("candidate", "h20", model=str(MOE_MODEL), params={"actor_rollout_ref/actor/ppo_epochs": "2"})
    size = model_size(snap)
    # Qwen3-30B-A3B's config.json: per layer attention q,o (32 heads) and k,v (4 heads) of 128 on hidden 2048;
    # 128 experts of 3 matrices 2048 x 768, 8 of them per token, and a 2048 x 128 router; 48 layers;
    # embedding and output head 151936 x 2048 each (untied).
    attention = 2048 * 128 * (2 * 32 + 2 * 4)
    expert, router, embeddings = 3 * 2048 * 768, 2048 * 128, 2 * 151936 * 2048
    assert size.total == 48 * (attention + 128 * expert + router) + embeddings  # ~30.5 B, the model card's
    assert size.active == 48 * (attention + 8 * expert + router) + embeddings  # ~3.35 B, "3.3 B activated"
    eff = efficiency.efficiency_of(snap)
    update_s = 240.0 / 3
    assert eff.mfu["update_actor"][0] == pytest.approx(6 * size.active * 1.28e6 * 2 / (update_s * 8 * H20_PEAK))
    assert eff.mfu["gen"][0] == pytest.approx(2 * size.active * 1.28e6 / (120.0 * 8 * H20_PEAK))


def test_without_a_config_json_the_names_active_size_is_used():
    size = model_size(_run("baseline", "h20", model="/nowhere/Qwen3-30B-A3B"))
    assert (size.total, size.active) == (30e9, 3e9)


def test_generation_is_judged_by_the_records_memory_bandwidth():
    bandwidth_gbs, response_tokens, tp = 4000.0, 600.0, 2
    snap = _run("baseline", "h20", tags={"device.hbm_gbps": f"{bandwidth_gbs:g}"},
                metrics={"response_length/mean": response_tokens},
                params={"actor_rollout_ref/rollout/tensor_model_parallel_size": str(tp),
                        "actor_rollout_ref/rollout/dtype": "bfloat16"})
    eff = efficiency.efficiency_of(snap)
    weights = 4e9 * 2  # Qwen3-4B by its name, two bytes per bf16 parameter
    assert eff.gen_bandwidth == pytest.approx(response_tokens * weights / (120.0 * tp * bandwidth_gbs * 1e9))
    without = efficiency.efficiency_of(_run("baseline", "cpu"))
    assert without.gen_bandwidth is None
    assert without.gen_bandwidth_note.startswith("unknown (missing: HBM bandwidth in the hardware record")


def test_the_prices_template_reads_and_names_the_a3_device_a_die():
    template = ROOT / "docs" / "prices-template.yaml"
    prices = read_prices(str(template))
    assert prices["a3"] == Price(3.0, "chip_hour") and prices["h20"] == Price(20.0, "node_hour")
    assert "On an A3 a device is ONE DIE" in template.read_text(encoding="utf-8")
