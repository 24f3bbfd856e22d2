"""Efficiency and cost of a run on its hardware, in the units a buyer prices in: the comparison's section and
its first-screen lines.

    verlflow compare --baseline <h20 run> --candidate <a3 run> --prices prices.yaml

Every row names its unit: per device as verl counts them (on an A3 a die, said so), per chip (fractional where a
run booked part of a chip), per node; per training step or per token; a price per chip-, node- or device-hour.
A figure whose input is missing reads "unknown". The arithmetic is :mod:`.efficiency_figures`'s (its
names are importable from here too); units and prices for users: docs/compare-costs.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from verlflow.compare.efficiency_figures import (  # noqa: F401 - the section's figures, importable from here
    PER,
    PHASE_FLOPS,
    TOKENS_KEY,
    UNKNOWN,
    Efficiency,
    Hardware,
    efficiency_of,
    hardware_of,
    read_prices,
    run_hour_ratios,
    side_name,
    step_time_ratios,
    work_time_ratios,
)
from verlflow.compare.report import GUIDE_SIDES, table

# Tokens per step that differ by more than this make per-step and per-token ratios worth telling apart.
TOKENS_DIFFER = 0.005


def _num(value: float | None, digits: int = 4) -> str:
    if value is None:
        return UNKNOWN
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"


def _pct(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.2%}"


def _ratio(base: float | None, cand: float | None) -> str:
    return UNKNOWN if base is None or cand is None or base == 0 else f"{cand / base:.2f}×"


def _ratios_text(ratios: Mapping[str, float | None]) -> str:
    return ", ".join(f"per {per} " + (f"{ratios[per]:.2f}×" if ratios[per] else UNKNOWN)
                     for per in ("chip", "node", "device"))


def tokens_differ(base: Efficiency, cand: Efficiency) -> bool:
    """Whether the two runs' training steps carry different numbers of tokens (per step ≠ per token)."""
    b, c = base.tokens_per_step, cand.tokens_per_step
    return bool(b and c and abs(c / b - 1) > TOKENS_DIFFER)


def _devices_text(e: Efficiency) -> str:
    hw = e.hardware
    if hw.devices is None:
        return UNKNOWN
    return f"{hw.devices} dies ({hw.dies_per_chip} per chip)" if hw.device_word == "die" else f"{hw.devices} devices"


def _hardware_table(base: Efficiency, cand: Efficiency) -> str:
    rows = [("devices as verl counts them", _devices_text(base), _devices_text(cand)),
            ("chips", _num(base.hardware.chips), _num(cand.hardware.chips)),
            ("nodes", _num(base.hardware.nodes), _num(cand.hardware.nodes)),
            ("peak TFLOPS per device (profile's record)", _num(base.hardware.peak_tflops),
             _num(cand.hardware.peak_tflops)),
            ("HBM bandwidth per device, GB/s (record)", _num(base.hardware.hbm_bandwidth_gbs),
             _num(cand.hardware.hbm_bandwidth_gbs)),
            ("record", base.hardware.record, cand.hardware.record)]
    return table(["", base.role, cand.role], rows)


def _die_note(base: Efficiency, cand: Efficiency) -> list[str]:
    sides = [f"{e.role} ({e.hardware.name or 'its record'}: {e.hardware.dies_per_chip} dies per chip)"
             for e in (base, cand) if e.hardware.device_word == "die"]
    if not sides:
        return []
    return [f"On the {' and the '.join(sides)} a device as verl counts it is one die: its per-device figures "
            "are per die, and a chip is that many devices.", ""]


def _throughput_rows(base: Efficiency, cand: Efficiency) -> list[tuple[str, ...]]:
    rows = [(f"tokens/s per {per}", _num(base.tokens_per_s(per)), _num(cand.tokens_per_s(per)),
             _ratio(base.tokens_per_s(per), cand.tokens_per_s(per))) for per in PER]
    rows.append(("verl's perf/throughput (tokens/s per verl device)", _num(base.verl_throughput),
                 _num(cand.verl_throughput), _ratio(base.verl_throughput, cand.verl_throughput)))
    for per in PER:
        for what, amount in (("samples", "samples_per_step"), ("tokens", "tokens_per_step")):
            b, c = base.per_hour(getattr(base, amount), per), cand.per_hour(getattr(cand, amount), per)
            rows.append((f"{what} per {per}-hour", _num(b), _num(c), _ratio(b, c)))
    return rows


def _hardware_time_rows(base: Efficiency, cand: Efficiency) -> list[tuple[str, ...]]:
    rows = []
    for per in PER:
        b, c = base.step_hardware_s(per), cand.step_hardware_s(per)
        rows.append((f"{per}-seconds per training step", _num(b), _num(c), _ratio(b, c)))
    for per in PER:
        b, c = base.token_hardware_s(per), cand.token_hardware_s(per)
        b, c = (b * 1000 if b else None), (c * 1000 if c else None)
        rows.append((f"{per}-seconds per 1k tokens", _num(b), _num(c), _ratio(b, c)))
    return rows


def _missing_lines(base: Efficiency, cand: Efficiency) -> list[str]:
    lacking = [f"the {e.role} run has no param {', '.join(e.missing)}" for e in (base, cand) if e.missing]
    return [f"Unknown where an input is missing: {'; '.join(lacking)} (no default is assumed).", ""] if lacking else []


def _mfu_lines(base: Efficiency, cand: Efficiency) -> list[str]:
    phases = [p for p in PHASE_FLOPS if p in base.mfu or p in cand.mfu]
    if not phases:
        return []
    rows = [(f"`timing_s_mean/{p}`", *(_pct(e.mfu.get(p, (None, None))[i]) for e in (base, cand) for i in (0, 1)))
            for p in phases]
    sizes = " / ".join(f"{_billions(e.params_count)} active of {_billions(e.model.total)} "
                       f"({e.params_source})" for e in (base, cand))
    epochs = " / ".join(_num(e.ppo_epochs) for e in (base, cand))
    return ["### MFU per phase", "",
            "Ours: FLOPs per token of the parameters a token passes through (forward phases 2 N, the actor update "
            f"6 N × `ppo_epochs`: {epochs}) × `perf/total_num_tokens` / (phase time × devices × the profile's own "
            f"peak); N, active of total: {sizes}. verl's `perf/mfu/*` differ because verl uses one peak per device "
            "family (354 TFLOPS for every Ascend 910 model, 148 for H20), counts attention FLOPs and divides by its "
            "own device count.", "",
            table(["phase", f"{base.role} (ours)", f"{base.role} (verl)", f"{cand.role} (ours)",
                   f"{cand.role} (verl)"], rows), "",
            "Generation is bound by memory bandwidth at small batch as much as by compute: HBM bandwidth "
            "utilisation of `timing_s_mean/gen` (a lower bound: weights read once per response token, KV cache "
            "not counted; bandwidth from the hardware record):", "",
            table(["side", "bandwidth utilisation", "from"],
                  [(e.role, _pct(e.gen_bandwidth), e.gen_bandwidth_note) for e in (base, cand)]), ""]


def _billions(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value / 1e9:.3g} B"


def _cost_lines(base: Efficiency, cand: Efficiency, prices_given: bool) -> list[str]:
    out = ["### Cost", ""]
    if not prices_given:
        return out + ["No prices given: add `-P prices=prices.yaml` with one price per profile, per chip-hour, "
                      "node-hour or device-hour (a device as verl counts it: an A3 die), e.g. "
                      "`h20: {node_hour: 20.0}` and `a3: {chip_hour: 3.0}` (docs/prices-template.yaml).", ""]
    rows = [(e.role, e.price_text or "no price for this profile", _num(e.cost_per_step), _num(e.cost_per_1m_tokens),
             _num(e.cost_per_1k_samples), _num(e.run_cost), _num(e.cost_per_accuracy_point)) for e in (base, cand)]
    return out + [table(["side", "price", "per training step", "per 1M tokens", "per 1k samples", "whole run (e2e)",
                         "per validation-accuracy point gained"], rows), ""]


def render_section(base: Efficiency, cand: Efficiency, prices_given: bool) -> str:
    """Markdown: what was booked, throughput and hardware-time per step and per token, MFU, bandwidth, cost."""
    step, token = step_time_ratios(base, cand), work_time_ratios(base, cand)
    differ = ([f"The runs' steps carry different tokens ({_num(base.tokens_per_step)} and "
               f"{_num(cand.tokens_per_step)} per step): per training step and per token disagree, and only per "
               "token compares the same work.", ""] if tokens_differ(base, cand) else [])
    out = ["## Efficiency per device, per chip and per node", "", _hardware_table(base, cand), "",
           *_die_note(base, cand), *_missing_lines(base, cand),
           "Throughput at the mean step time (`timing_s_mean/step`, `perf/total_num_tokens`); a sample is one "
           "generated response (`data.train_batch_size` × `rollout.n` per step).", "",
           table(["figure", base.role, cand.role, "candidate / baseline"], _throughput_rows(base, cand)), "",
           "Hardware-time: the mean step time × what was booked, per training step and per 1k tokens.", "",
           table(["figure", base.role, cand.role, "candidate / baseline"], _hardware_time_rows(base, cand)), "",
           *differ,
           f"Hardware-time per training step, candidate / baseline: {_ratios_text(step)}.", "",
           f"Hardware-time per token (the same work), candidate / baseline: {_ratios_text(token)}.", "",
           f"Hardware-hours of the whole run (end-to-end time × what was booked), candidate / baseline: "
           f"{_ratios_text(run_hour_ratios(base, cand))}{_guide_reading(base, cand)}.", ""]
    out += _mfu_lines(base, cand) + _cost_lines(base, cand, prices_given)
    return "\n".join(out)


def _guide_reading(base: Efficiency, cand: Efficiency) -> str:
    """How to read the guide's end-to-end 1.58× beside these figures: only for its pair, an H20 baseline and an A3
    candidate ('' otherwise: the guide says nothing about other accelerators)."""
    if (base.hardware.name, cand.hardware.name) != GUIDE_SIDES:
        return ""
    return (" (the guide's §6.3 end-to-end 1.58× is the per-node and per-chip figure of two runs of the same steps on "
            "one node of eight chips; per device an A3 counts each die)")


def _speed_line(per: str, base: Efficiency, cand: Efficiency, names: tuple[str, str]) -> str:
    step, token = step_time_ratios(base, cand)[per], work_time_ratios(base, cand)[per]
    whole = run_hour_ratios(base, cand)[per]
    if step is None or token is None:
        return f"- per {per}: unknown (no `perf/total_num_tokens`, step time or device count)"
    judged = token if tokens_differ(base, cand) else step
    if abs(judged - 1) < 0.005:
        return f"- per {per}: {names[1]} and {names[0]} are equally fast"
    faster, slower, factor = (names[0], names[1], judged) if judged > 1 else (names[1], names[0], 1 / judged)
    end_to_end = f" ({whole:.2f}× {per}-hours end to end, candidate / baseline)" if whole else ""
    if not tokens_differ(base, cand):
        return f"- per {per}: {faster} is faster: {slower} needs {factor:.2f}× the {per}-time per training step" \
               f"{end_to_end}"
    return (f"- per {per}: {faster} is faster per token: {slower} needs {factor:.2f}× the {per}-time per token; "
            f"per training step candidate / baseline is {step:.2f}× (the candidate's steps carry "
            f"{cand.tokens_per_step / base.tokens_per_step:.2f}× the tokens){end_to_end}")


def first_screen_lines(base: Efficiency, cand: Efficiency, prices_given: bool, baseline_name: str,
                       candidate_name: str) -> list[str]:
    """The answer in words: who is faster per chip and per node, by how much, and the cost per 1k samples."""
    out = [_speed_line(per, base, cand, (baseline_name, candidate_name)) for per in ("chip", "node")]
    if prices_given:
        costs = ", ".join(f"{name} {_num(e.cost_per_1k_samples)}" for name, e in
                          ((baseline_name, base), (candidate_name, cand)))
        out.append(f"- cost per 1k samples: {costs}")
    else:
        out.append("- cost per 1k samples: no prices given (`-P prices=prices.yaml`, see Efficiency)")
    return out
