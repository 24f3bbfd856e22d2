"""The two runs' profiles side by side: time per phase and the operators that differ most (``profile/step_<N>``).

    verlflow compare --baseline <run profiled with verlflow.profile_steps=[2]> --candidate <another>

Reads the summary tables :mod:`verlflow.tracking.profiling` logged (from torch's Chrome traces or, on an NPU, the
Ascend profiler's databases: the same rows, so an A3 run and an H20 run compare); plain computation and Markdown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from verlflow.compare.report import table
from verlflow.compare.snapshot import MISSING

# Operators shown: the ones whose time differs most between the runs.
SHOWN_OPERATORS = 10
Summary = Mapping[int, Sequence[Mapping[str, Any]]]


def _times(rows: Sequence[Mapping[str, Any]], kind: str) -> dict[str, float]:
    return {str(r["name"]): float(r["time_ms"]) for r in rows if r.get("kind") == kind}


def _ms(value: float | None) -> str:
    return MISSING if value is None else f"{value:,.1f}"


def _ratio(base: float | None, cand: float | None) -> str:
    return MISSING if not base or cand is None else f"{cand / base:.2f}×"


def compared_step(baseline: Summary, candidate: Summary) -> int | None:
    """The profiled step both runs have (the first), else None."""
    common = sorted(set(baseline) & set(candidate))
    return common[0] if common else None


def phase_rows(base: Sequence[Mapping[str, Any]], cand: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """(phase, baseline ms, candidate ms, ratio) for every phase either run annotated, the step first."""
    b, c = _times(base, "phase"), _times(cand, "phase")
    order = sorted(set(b) | set(c), key=lambda name: (name != "step", -max(b.get(name, 0), c.get(name, 0))))
    return [(name, _ms(b.get(name)), _ms(c.get(name)), _ratio(b.get(name), c.get(name))) for name in order]


def operator_rows(base: Sequence[Mapping[str, Any]], cand: Sequence[Mapping[str, Any]],
                  limit: int = SHOWN_OPERATORS, kind: str = "operator") -> list[tuple[str, ...]]:
    """The operators (or ``kernel``s) whose time differs most (absolute milliseconds): both times, the difference."""
    b, c = _times(base, kind), _times(cand, kind)
    names = sorted(set(b) | set(c), key=lambda name: -abs(c.get(name, 0.0) - b.get(name, 0.0)))[:limit]
    return [(f"`{name}`", _ms(b.get(name)), _ms(c.get(name)), f"{c.get(name, 0.0) - b.get(name, 0.0):+,.1f}")
            for name in names]


def render_section(baseline: Summary, candidate: Summary) -> str:
    """Markdown: the profiled step's phases and top operators of both runs; '' when neither run was profiled."""
    if not baseline and not candidate:
        return ""
    out = ["## Profiles: where a step's time goes", ""]
    step = compared_step(baseline, candidate)
    if step is None:
        sides = (("baseline", baseline), ("candidate", candidate))
        have = [f"{role}: steps {sorted(summary) or 'none'}" for role, summary in sides]
        return "\n".join(out + [f"No step profiled in both runs ({'; '.join(have)}): profile the same step with "
                                "`verlflow.profile_steps=[N]`.", ""])
    base, cand = baseline[step], candidate[step]
    out += [f"Step {step}, from each run's `profile/step_{step}/summary.json` (the traces are beside it). Time per "
            "phase (verl's timer names), milliseconds:", "",
            table(["phase", "baseline", "candidate", "candidate / baseline"], phase_rows(base, cand)), "",
            "The operators that differ most (top-level operators per thread, milliseconds):", "",
            table(["operator", "baseline", "candidate", "difference"], operator_rows(base, cand)), ""]
    kernels = operator_rows(base, cand, kind="kernel")
    if kernels:
        out += ["The device kernels that differ most (time on the device, milliseconds; an NPU's other device "
                "tasks — communication waits, copies — by their task type in brackets; kernel names differ "
                "between vendors, so compare the totals as much as the names):", "",
                table(["kernel", "baseline", "candidate", "difference"], kernels), "",
                f"Device kernel time in all: baseline {_ms(_total(base, 'kernel'))}, candidate "
                f"{_ms(_total(cand, 'kernel'))} (the summary's top kernels).", ""]
    return "\n".join(out)


def _total(rows: Sequence[Mapping[str, Any]], kind: str) -> float | None:
    times = _times(rows, kind)
    return sum(times.values()) if times else None
