"""The report's first screen: the answer in words, each verdict with its p-value, interval and threshold.

    python -c "from verlflow.compare.first_screen import header; help(header)"

A speed claim ("faster") is made only between two accelerators on the same work (:mod:`.same_work`: recipe,
model, batch, rollout n, ppo_epochs, response length limits, steps; a difference is named on the first line), and
each claim only as far as its own test shows it (:func:`verlflow.compare.stats.device_effect`): the step time on
the runs' step times, per chip and per node on each run's chip- and node-seconds per training step (per token where
the sides' steps carry different tokens), all decided with the report's other verdicts as one family
(:func:`verlflow.compare.run_sets.one_family`: Holm), whose error rate the screen states once. Otherwise the screen
says what differs and gives the run-vs-run figures, each labelled with its unit (per training step, per token, end
to end), so no two of them read as a contradiction. Plain computation on :class:`RunSnapshot` objects and
:class:`~verlflow.compare.efficiency.Efficiency` figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from verlflow import names
from verlflow.compare import efficiency_figures, run_sets
from verlflow.compare.efficiency import Efficiency, tokens_differ
from verlflow.compare.report import constructed
from verlflow.compare.same_work import steps as _steps
from verlflow.compare.same_work import work_differences
from verlflow.compare.snapshot import RunSnapshot
from verlflow.compare.stats import Effect, device_effect
from verlflow.device import identity
from verlflow.platforms import tags as device_tags

STEP_KEY = f"{names.TIMING_MEAN_PREFIX}step"


def side_names(baseline: RunSnapshot, candidate: RunSnapshot) -> tuple[str, str]:
    """How the lines name the sides: their profiles (``h20``, ``a3``), or the roles when both are one profile."""
    named = [s.tags.get(names.PROFILE_TAG) or s.tags.get(device_tags.NAME_TAG) or s.role for s in (baseline, candidate)]
    return (named[0], named[1]) if named[0] != named[1] else ("the baseline", "the candidate")


def header(baseline: RunSnapshot, candidate: RunSnapshot) -> str:
    """The first line: each side named once, with its profile and runs."""
    def one(snap: RunSnapshot) -> str:
        where = snap.tags.get(names.PROFILE_TAG) or snap.tags.get(device_tags.NAME_TAG) or "?"
        return f"{where} (`{snap.name}`)"
    return f"**The answer** — baseline: {one(baseline)}; candidate: {one(candidate)}"


def same_accelerator(baseline: RunSnapshot, candidate: RunSnapshot) -> bool:
    """Whether both sides ran on one accelerator: identity's judgement from device type and name, whatever profile
    file described it; the device type and profile where a run names no device."""
    if identity.accelerator_key(baseline.tags) is not None and identity.accelerator_key(candidate.tags) is not None:
        return identity.same_accelerator(baseline.tags, candidate.tags)
    return all(baseline.tags.get(t) == candidate.tags.get(t) for t in (device_tags.TYPE_TAG, names.PROFILE_TAG))


def _ratio(base: float | None, cand: float | None) -> float | None:
    return cand / base if base and cand and math.isfinite(base) and math.isfinite(cand) else None


def _x(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f}×"


def step_time_effect(base_set: Sequence[RunSnapshot], cand_set: Sequence[RunSnapshot]) -> Effect:
    """Welch's test of the runs' mean step times, at the timing threshold (5% of the baseline's)."""
    b = [s.metrics[STEP_KEY] for s in base_set if STEP_KEY in s.metrics]
    c = [s.metrics[STEP_KEY] for s in cand_set if STEP_KEY in s.metrics]
    threshold = run_sets.TIME_THRESHOLD.of(sum(b) / len(b)) if b else None
    return device_effect(b, c, threshold=threshold, unit=" s")


def _per_hardware(base: Efficiency, cand: Efficiency, per: str) -> tuple[float | None, float | None, float | None]:
    """Hardware-time candidate / baseline per training step, per token and end to end, per ``chip`` / ``node``."""
    def booked(e: Efficiency, seconds: float | None) -> float | None:  # unknown when the run's counts are
        count = e.hardware.chips if per == "chip" else e.hardware.nodes
        return seconds * count if seconds and count else None
    per_step = _ratio(booked(base, base.step_s), booked(cand, cand.step_s))
    per_token = None
    if per_step is not None and base.tokens_per_step and cand.tokens_per_step:
        per_token = per_step * base.tokens_per_step / cand.tokens_per_step
    whole = _ratio(booked(base, base.e2e_s), booked(cand, cand.e2e_s))
    return per_step, per_token, whole


def claims_speed(baseline: RunSnapshot, candidate: RunSnapshot) -> bool:
    """Whether the first screen may say who is faster: two accelerators doing the same work."""
    return not same_accelerator(baseline, candidate) and not work_differences(baseline, candidate)


def _hardware_seconds(snap: RunSnapshot, per: str, per_token: bool) -> float | None:
    """One run's ``chip``- or ``node``-seconds per training step (per 1k tokens when ``per_token``); None: unknown."""
    count, step = efficiency_figures.hardware_of(snap).count(per), snap.metrics.get(STEP_KEY)
    if not count or step is None or not math.isfinite(step) or step <= 0:
        return None
    if not per_token:
        return step * count
    tokens = efficiency_figures.mean_tokens_per_step(snap)
    return step * count / tokens * 1000 if tokens and math.isfinite(tokens) else None


def hardware_effects(base_set: Sequence[RunSnapshot], cand_set: Sequence[RunSnapshot],
                     effs: Sequence[Efficiency]) -> dict[str, Effect]:
    """Per chip and per node, each tested on what it names: every run's chip- (node-) seconds per training step, or
    per 1k tokens where the sides' steps carry different tokens, Welch's test at the timing threshold.

    Empty where no speed is claimed (one accelerator, or different work): those lines are no verdicts.
    """
    if not claims_speed(base_set[0], cand_set[0]):
        return {}
    per_token = tokens_differ(*effs)
    out = {}
    for per in ("chip", "node"):
        b, c = ([v for s in snaps if (v := _hardware_seconds(s, per, per_token)) is not None]
                for snaps in (base_set, cand_set))
        threshold = run_sets.TIME_THRESHOLD.of(sum(b) / len(b)) if b else None
        out[per] = device_effect(b, c, threshold=threshold, unit=f" {per}-s" + (" per 1k tokens" if per_token else ""))
    return out


def _hardware_line(per: str, effect: Effect | None, effs: Sequence[Efficiency], side: tuple[str, str]) -> str:
    """One per-chip or per-node line: a claim only where its own test (in the report's family) shows it."""
    step, token, whole = _per_hardware(*effs, per)
    if step is None or effect is None or effect.difference is None:
        return f"- per {per}: not measured (no step time, or no {per} count)"
    figures = f"candidate / baseline {_x(step)} per training step, {_x(token)} per token, {_x(whole)} end to end"
    per_token = tokens_differ(*effs)
    judged = token if per_token and token else step
    unit = "token" if per_token else "training step"
    if effect.p_value is None:
        faster = side[0] if judged > 1 else side[1]
        return (f"- per {per}: {faster} took less {per}-time in these runs, not shown to be faster (no noise "
                f"measured): {figures}")
    if not effect.shown:
        return f"- per {per}: no {per}-time difference shown per {unit} ({figures}): {effect.message}"
    faster, slower = (side[0], side[1]) if effect.difference > 0 else (side[1], side[0])
    times = max(judged, 1 / judged)
    return (f"- per {per}: {faster} is faster: {slower} needs {times:.2f}× the {per}-time per {unit} ({figures}): "
            f"{effect.message}")


def speed_lines(base_set: Sequence[RunSnapshot], cand_set: Sequence[RunSnapshot], effs: Sequence[Efficiency],
                side: tuple[str, str], step_effect: Effect | None = None,
                hardware: Mapping[str, Effect] | None = None) -> list[str]:
    """The speed part: a tested claim between two accelerators on the same work, else what differs and the
    run-vs-run figures with their units. ``step_effect`` / ``hardware``: the step time's and the per-chip and
    per-node tests as the report's family decided them (each tested alone when not given)."""
    baseline, candidate = base_set[0], cand_set[0]
    effect = step_effect or step_time_effect(base_set, cand_set)
    differs = work_differences(baseline, candidate)
    if same_accelerator(baseline, candidate) or differs:
        return _run_vs_run(baseline, candidate, effs, differs, effect)
    hardware = hardware if hardware is not None else hardware_effects(base_set, cand_set, effs)
    return [f"- speed (two accelerators, the same work): mean step time candidate / baseline "
            f"{_x(_ratio(_mean(base_set), _mean(cand_set)))}: {effect.message}",
            *(_hardware_line(per, hardware.get(per), effs, side) for per in ("chip", "node"))]


def _mean(snaps: Sequence[RunSnapshot]) -> float | None:
    values = [s.metrics[STEP_KEY] for s in snaps if STEP_KEY in s.metrics]
    return sum(values) / len(values) if values else None


def _run_vs_run(baseline: RunSnapshot, candidate: RunSnapshot, effs: Sequence[Efficiency],
                differs: list[str], effect: Effect) -> list[str]:
    """No speed claim: why, then the run-vs-run time ratios, each in its own unit, and the step times' test."""
    accelerator = baseline.tags.get(device_tags.NAME_TAG) or baseline.tags.get(device_tags.TYPE_TAG)
    why = [f"both sides ran on one accelerator ({accelerator})"
           ] if same_accelerator(baseline, candidate) else []
    why += [f"the work differs ({'; '.join(differs)})"] if differs else []
    base, cand = effs
    step = _ratio(base.step_s, cand.step_s)
    token = step * base.tokens_per_step / cand.tokens_per_step if step and base.tokens_per_step \
        and cand.tokens_per_step else None
    tokens = (f" at {base.tokens_per_step:,.0f} vs {cand.tokens_per_step:,.0f} tokens per step"
              if base.tokens_per_step and cand.tokens_per_step else "")
    return [f"- speed: no speed claim: {' and '.join(why)}",
            f"  - run vs run, candidate / baseline: time per training step {_x(step)}{tokens}; time per token "
            f"{_x(token)}; end to end {_x(_ratio(base.e2e_s, cand.e2e_s))} (over {_steps(baseline) or '?'} vs "
            f"{_steps(candidate) or '?'} steps)",
            f"  - mean step time, run vs run: {effect.message.replace('a device effect', 'beyond the noise')}"]


def cost_line(effs: Sequence[Efficiency], side: tuple[str, str], prices_given: bool) -> str:
    """Cost per 1k samples of each side at the prices given, or how to give them."""
    if not prices_given:
        return "- cost per 1k samples: no prices given (`-P prices=prices.yaml`, see Efficiency)"
    def one(name: str, e: Efficiency) -> str:
        cost = "unknown" if e.cost_per_1k_samples is None else f"{e.cost_per_1k_samples:.4g}"
        return f"{name} {cost}" + (f" (at {e.price_text})" if e.price_text else " (no price for its profile)")
    return f"- cost per 1k samples: {one(side[0], effs[0])}, {one(side[1], effs[1])}"


def first_screen(base_set: Sequence[RunSnapshot], cand_set: Sequence[RunSnapshot], baseline: RunSnapshot,
                 candidate: RunSnapshot, effs: Sequence[Efficiency], figures: Sequence[run_sets.FigureRow],
                 judged: bool, prices_given: bool, hardware: Mapping[str, Effect] | None = None) -> list[str]:
    """The report's opening lines: the sides, the report's error rate, speed (tested, or why not claimed), cost,
    accuracy. ``figures`` and ``hardware`` (:func:`hardware_effects`) as :func:`run_sets.one_family` decided them."""
    side = side_names(baseline, candidate)
    made_up = constructed(*base_set, *cand_set)
    differs = work_differences(baseline, candidate)
    step = next((f.effect for f in figures if f.key == STEP_KEY), None)
    return [f"{header(baseline, candidate)}" + (f" — not the same work: {'; '.join(differs)}:" if differs else ":"),
            *([f"- ⚠ constructed figures, not measurements: {made_up}"] if made_up else []),
            run_sets.family_line(figures, hardware or {}),
            *speed_lines(base_set, cand_set, effs, side, step, hardware),
            cost_line(effs, side, prices_given),
            run_sets.accuracy_line(figures, judged)]
