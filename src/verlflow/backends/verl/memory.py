"""verl's own process out of memory, told as the local trainer's is: one line with the settings that would fit.

    verlflow train --backend verl …   # CUDA/NPU "out of memory", torch's DefaultCPUAllocator, a MemoryError in verl

The launch's output passes through :class:`MemoryWatch` line by line (:mod:`.launch`); when verl exits non-zero
after an allocator said it ran out, :func:`verl_out_of_memory` is the step's error instead of "verl exited with
status N": where memory ran out (the accelerator or the host), verl's sizing settings as the run holds them (verl
logs its resolved config as the run's params; the launch's own overrides where it died before that), and the
levers in the order that changes the least: the micro batches, the rollout engine's share of the accelerator, the
offloads, then the batch itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from verlflow.out_of_memory import OOM_TEXT, OutOfMemory, out_of_memory_error, sizing_settings

_ACCELERATOR = re.compile(r"\b(CUDA|NPU|HIP|XPU)\b[^\n]*out of memory|OutOfMemoryError", re.IGNORECASE)
_MICRO = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu")
_SHARE = "actor_rollout_ref.rollout.gpu_memory_utilization"
_OFFLOAD = "actor_rollout_ref.actor.fsdp_config.param_offload"


class MemoryWatch:
    """An ``on_line`` for the launch's output that remembers the first line where an allocator ran out (and passes
    every line on to ``then``)."""

    def __init__(self, then: Callable[[str], None] | None = None):
        self.then, self.seen = then, ""

    def __call__(self, line: str) -> None:
        if not self.seen and (OOM_TEXT.search(line) or "MemoryError" in line):
            self.seen = line.strip()
        if self.then is not None:
            self.then(line)


def verl_out_of_memory(seen: str, rc: int, overrides: Mapping[str, Any] | None = None) -> OutOfMemory:
    """The one line for verl that exited ``rc`` after printing ``seen`` (an allocator's words)."""
    values = {**dict(overrides or {}), **_run_params()}
    found = sizing_settings(values)
    ordered = {key: found[key] for key in (*_MICRO, _SHARE, _OFFLOAD) if key in found}
    ordered.update((key, value) for key, value in found.items() if key not in ordered)
    accelerator = bool(_ACCELERATOR.search(seen))
    if not accelerator:  # host memory: the accelerator's share and offloading (weights onto the host) do not help
        ordered = {key: value for key, value in ordered.items() if key != _SHARE and "offload" not in key}
    where = f"in verl {'on the accelerator' if accelerator else 'in host memory'} (it exited with status {rc})"
    return out_of_memory_error(where, ordered, fix=_levers(ordered),
                               limit="the accelerator's memory is full" if accelerator else "")


def _levers(settings: Mapping[str, Any]) -> str:
    """What to change, least disruptive first: a micro batch halved, the rollout's share lowered, the offload on."""
    parts = []
    micro = next(((k, v) for k, v in settings.items() if k in _MICRO and type(v) is int and v > 1), None)
    if micro:
        parts.append(f'-P overrides="{micro[0]}={micro[1] // 2}"')
    share = settings.get(_SHARE)
    if isinstance(share, float) and share > 0.2:
        parts.append(f"{_SHARE}={round(share - 0.1, 2)} (vLLM's share of the accelerator)")
    if _OFFLOAD in settings and str(settings[_OFFLOAD]).lower() == "false":
        parts.append(f"{_OFFLOAD}=true")
    return f"lower a micro batch first, e.g. {', or '.join(parts)}" if parts else ""


def _run_params() -> dict[str, str]:
    """The active run's params (verl logged its resolved config there), {} when there are none to read."""
    from verlflow.tracking import lookups

    try:
        return lookups.active_run_params()
    except Exception:  # the line is due even when the store does not answer
        return {}
