"""Efficiency and cost of a run on its hardware: per device, per chip and per node; MFU per phase; cost per 1k samples.

    verlflow compare --baseline <h20 run> --candidate <a3 run> --prices prices.yaml

What a hardware decision needs and verl's own figures do not give: verl's ``perf/throughput`` divides by verl's
device count, which on an A3 counts dies (two per 910C chip), and its ``perf/mfu/*`` uses one peak for every Ascend
910 model (354 TFLOPS) and 148 for H20 (``verl/utils/flops_counter.py``). Here every figure is divided by what was
booked — devices as verl counts them, chips (devices / ``dies_per_chip`` of the profile's hardware record) and nodes
(``trainer.nnodes``) — and MFU uses the profile's own peak. Plain computation on :class:`RunSnapshot` objects,
plus reading the ``prices`` YAML.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from verlflow import names
from verlflow.compare.report import table
from verlflow.compare.snapshot import MISSING, RunSnapshot
from verlflow.device import identity
from verlflow.errors import VerlflowError
from verlflow.names import MODEL_PARAMS_TAG

TOKENS_KEY = "perf/total_num_tokens"
VERL_THROUGHPUT_KEY = "perf/throughput"
# FLOPs per token and parameter of each phase: a forward pass is 2 N per token, forward and backward 6 N.
# Attention FLOPs are left out (verl's counter includes them): at 2k-token sequences on a 4B model they add ~10%.
PHASE_FLOPS = {"gen": 2, "old_log_prob": 2, "ref": 2, "update_actor": 6}
# verl's own MFU figure for a phase, where it logs one.
VERL_MFU = {"update_actor": "perf/mfu/actor", "old_log_prob": "perf/mfu/actor_infer", "ref": "perf/mfu/ref"}
PRICE_UNITS = ("node_hour", "device_hour")
_SIZE_IN_NAME = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*[Bb](?![A-Za-z0-9])")


@dataclass
class Hardware:
    """What a run booked, as its params and its profile's hardware record say."""

    devices: int  # as verl counts them: trainer.n_gpus_per_node x trainer.nnodes (an A3 die is one)
    nodes: int
    dies_per_chip: int
    peak_tflops: float | None  # per device, from the profile's record; None without one (the CPU profiles)
    record: str  # where the record came from

    @property
    def chips(self) -> int:
        """Chips booked: devices / dies per chip (an A3 node: 16 devices = 8 chips)."""
        return max(1, self.devices // self.dies_per_chip)


def _int_param(snap: RunSnapshot, key: str, default: int = 1) -> int:
    try:
        return max(1, int(float(snap.params.get(key, default))))
    except ValueError:
        return default


def hardware_of(snap: RunSnapshot) -> Hardware:
    """Devices, nodes, dies per chip and peak of a run: its params, its ``device.*`` tags, else its named profile."""
    per_node, nodes = _int_param(snap, "trainer/n_gpus_per_node"), _int_param(snap, "trainer/nnodes")
    dies = snap.tags.get("device.dies_per_chip")
    peak = (snap.tags.get("device.peak_tflops") or "").split(" ")[0]
    record = "the run's device.* tags"
    if not dies or not peak:
        accelerator = _profile_accelerator(snap.tags.get(names.PROFILE_TAG, ""))
        record = f"profile {snap.tags.get(names.PROFILE_TAG)}'s hardware record"
        if accelerator is None:  # a profile file of another machine: the record its device.name fits
            accelerator = identity.record_from_name(snap.tags.get("device.type", ""), snap.tags.get("device.name", ""))
            record = f"the shipped {accelerator.name} record its device.name fits" if accelerator else record
        if accelerator is not None:
            dies = dies or str(accelerator.dies_per_chip)
            peak = peak or f"{accelerator.peak_tflops:g}"
        elif not peak:
            record = "no hardware record (no peak: MFU not computed)"
    return Hardware(per_node * nodes, nodes, int(dies or 1), float(peak) if peak else None, record)


def _profile_accelerator(name: str):
    from verlflow import config

    if not name:
        return None
    try:
        return config.load_profile(name).accelerator
    except VerlflowError:
        return None  # a profile file of another machine


def model_params(snap: RunSnapshot) -> tuple[float | None, str]:
    """The model's parameter count and where it came from: the run's tag, else its name (``Qwen3-4B`` → 4e9)."""
    tagged = snap.tags.get(MODEL_PARAMS_TAG)
    if tagged:
        return float(tagged), f"tag {MODEL_PARAMS_TAG}"
    path = snap.params.get("actor_rollout_ref/model/path", "")
    found = _SIZE_IN_NAME.search(Path(path).name)
    if found:
        return float(found.group(1)) * 1e9, f"the model's name ({Path(path).name})"
    return None, "unknown (no tag model.num_params, no size in the model's name)"


def mean_tokens_per_step(snap: RunSnapshot) -> float | None:
    """Tokens per training step (prompt + response, verl's ``perf/total_num_tokens``), averaged over the steps."""
    points = [v for _, v in snap.histories.get(TOKENS_KEY, []) if math.isfinite(v)]
    if points:
        return sum(points) / len(points)
    return snap.metrics.get(TOKENS_KEY)


@dataclass
class Efficiency:
    """One side's throughput per device, chip and node, MFU per phase and, with a price, its cost."""

    role: str
    hardware: Hardware
    step_s: float | None
    e2e_s: float | None
    tokens_per_step: float | None
    samples_per_step: int  # generated responses: data.train_batch_size x rollout.n
    verl_throughput: float | None
    accuracy_gain: float | None  # validation accuracy, last - first validation, in points
    mfu: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # phase -> (ours, verl's)
    params_count: float | None = None
    params_source: str = ""
    price_per_hour: float | None = None  # for everything booked (all nodes or all devices)
    price_text: str = ""

    def tokens_per_s(self, per: str) -> float | None:
        """Tokens per second per ``device`` / ``chip`` / ``node`` at the mean step time."""
        if self.tokens_per_step is None or not self.step_s:
            return None
        count = {"device": self.hardware.devices, "chip": self.hardware.chips, "node": self.hardware.nodes}[per]
        return self.tokens_per_step / self.step_s / count

    def per_hour(self, amount: float | None, per: str) -> float | None:
        """``amount`` per step as an amount per ``device``-hour or ``node``-hour at the mean step time."""
        if amount is None or not self.step_s:
            return None
        count = self.hardware.devices if per == "device" else self.hardware.nodes
        return amount / self.step_s * 3600 / count

    def run_hours(self, per: str) -> float | None:
        """Hardware-hours the whole run took: end-to-end hours × ``device``s / ``chip``s / ``node``s booked."""
        if not self.e2e_s:
            return None
        count = {"device": self.hardware.devices, "chip": self.hardware.chips, "node": self.hardware.nodes}[per]
        return self.e2e_s / 3600 * count

    @property
    def cost_per_1k_samples(self) -> float | None:
        """The price of the booked hardware for the time 1000 samples take at the mean step time."""
        if self.price_per_hour is None or not self.step_s or not self.samples_per_step:
            return None
        return self.price_per_hour * self.step_s / 3600 / self.samples_per_step * 1000

    @property
    def run_cost(self) -> float | None:
        """The price of the booked hardware for the whole run (end-to-end time)."""
        if self.price_per_hour is None or not self.e2e_s:
            return None
        return self.price_per_hour * self.e2e_s / 3600

    @property
    def cost_per_accuracy_point(self) -> float | None:
        """The run's cost per validation-accuracy point it gained (None when it gained none)."""
        if self.run_cost is None or not self.accuracy_gain or self.accuracy_gain <= 0:
            return None
        return self.run_cost / self.accuracy_gain


def _accuracy_gain(snap: RunSnapshot) -> float | None:
    points = [v for _, v in snap.histories.get(names.VAL_ACCURACY, []) if math.isfinite(v)]
    return (points[-1] - points[0]) * 100 if len(points) >= 2 else None


def efficiency_of(snap: RunSnapshot, prices: Mapping[str, tuple[float, str]] | None = None) -> Efficiency:
    """The efficiency of one run (or a side's mean snapshot); ``prices``: profile → (price, unit) from a YAML."""
    hardware = hardware_of(snap)
    samples = _int_param(snap, "data/train_batch_size") * _int_param(snap, "actor_rollout_ref/rollout/n")
    tokens = mean_tokens_per_step(snap)
    n_params, source = model_params(snap)
    eff = Efficiency(snap.role, hardware, snap.metrics.get(f"{names.TIMING_MEAN_PREFIX}step"),
                     snap.metrics.get(names.TIMING_E2E), tokens, samples, snap.metrics.get(VERL_THROUGHPUT_KEY),
                     _accuracy_gain(snap), params_count=n_params, params_source=source)
    for phase, factor in PHASE_FLOPS.items():
        seconds = snap.metrics.get(f"{names.TIMING_MEAN_PREFIX}{phase}")
        ours = None
        if seconds and tokens and n_params and hardware.peak_tflops:
            ours = factor * n_params * tokens / (seconds * hardware.devices * hardware.peak_tflops * 1e12)
        verl = snap.metrics.get(VERL_MFU.get(phase, ""))
        if seconds:
            eff.mfu[phase] = (ours, verl)
    profile = snap.tags.get(names.PROFILE_TAG, "")
    if prices and profile in prices:
        price, unit = prices[profile]
        eff.price_per_hour = price * (hardware.nodes if unit == "node_hour" else hardware.devices)
        eff.price_text = f"{price:g} per {unit.replace('_', '-')}"
    return eff


def read_prices(path: str) -> dict[str, tuple[float, str]]:
    """``-P prices=<yaml>``: profile name → (price, ``node_hour`` | ``device_hour``); one line for a bad file.

    The file maps each profile to one price, per node-hour or per device-hour (verl's devices: A3 dies)::

        h20: {node_hour: 20.0}
        a3: {device_hour: 1.6}
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise VerlflowError(f"prices={path}: no such file: give a YAML file such as 'h20: {{node_hour: 20.0}}'")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise VerlflowError(f"prices={path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not data:
        raise VerlflowError(f"prices={path}: expected a mapping of profile → {{node_hour: N}} or {{device_hour: N}}")
    out = {}
    for profile, entry in data.items():
        valid = isinstance(entry, dict) and len(entry) == 1 and next(iter(entry)) in PRICE_UNITS
        value = next(iter(entry.values())) if valid else None
        if not valid or isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise VerlflowError(f"prices={path}: profile '{profile}' has {entry!r}: give one positive price, "
                                f"{{node_hour: 20.0}} or {{device_hour: 2.5}}")
        out[str(profile)] = (float(value), next(iter(entry)))
    return out


def _num(value: float | None, digits: int = 4) -> str:
    if value is None:
        return MISSING
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"


def _billions(value: float | None) -> str:
    return MISSING if value is None else f"{value / 1e9:.3g} B parameters"


def _pct(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2%}"


def _ratio(base: float | None, cand: float | None) -> str:
    return MISSING if base is None or cand is None or base == 0 else f"{cand / base:.2f}×"


def work_time_ratios(base: Efficiency, cand: Efficiency) -> dict[str, float | None]:
    """Hardware-time for the same work, candidate / baseline, per device, chip and node (the guide's 1.58x per node).

    Seconds per sample at the mean step time times what was booked: where both booked one node of eight chips
    (the guide's A3 and H20), per node and per chip equal the step-time ratio, and per device counts A3 dies twice.
    """
    out: dict[str, float | None] = {}
    for per in ("device", "chip", "node"):
        b, c = base.tokens_per_s(per), cand.tokens_per_s(per)
        out[per] = b / c if b and c else None
    return out


def run_hour_ratios(base: Efficiency, cand: Efficiency) -> dict[str, float | None]:
    """Hardware-hours of the whole runs, candidate / baseline, per device, chip and node.

    For two runs of the same steps on one node of eight chips each (the guide's A3 and H20), per node and per
    chip this is the guide's end-to-end 1.58x; per device it counts each A3 die, so twice that.
    """
    out: dict[str, float | None] = {}
    for per in ("device", "chip", "node"):
        b, c = base.run_hours(per), cand.run_hours(per)
        out[per] = c / b if b and c else None
    return out


def _ratios_text(ratios: Mapping[str, float | None]) -> str:
    return ", ".join(f"per {per} " + (f"{ratios[per]:.2f}×" if ratios[per] else MISSING)
                     for per in ("chip", "node", "device"))


def render_section(base: Efficiency, cand: Efficiency, prices_given: bool) -> str:
    """Markdown: per device / chip / node throughput side by side, MFU per phase, cost (or how to add prices)."""
    ratios = work_time_ratios(base, cand)
    hw = [("devices (as verl counts them)", base.hardware.devices, cand.hardware.devices),
          ("chips", base.hardware.chips, cand.hardware.chips), ("nodes", base.hardware.nodes, cand.hardware.nodes),
          ("peak TFLOPS per device (profile's record)", _num(base.hardware.peak_tflops),
           _num(cand.hardware.peak_tflops)),
          ("record", base.hardware.record, cand.hardware.record)]
    rows = [("tokens/s per device", _num(base.tokens_per_s("device")), _num(cand.tokens_per_s("device")),
             _ratio(base.tokens_per_s("device"), cand.tokens_per_s("device"))),
            ("tokens/s per chip", _num(base.tokens_per_s("chip")), _num(cand.tokens_per_s("chip")),
             _ratio(base.tokens_per_s("chip"), cand.tokens_per_s("chip"))),
            ("tokens/s per node", _num(base.tokens_per_s("node")), _num(cand.tokens_per_s("node")),
             _ratio(base.tokens_per_s("node"), cand.tokens_per_s("node"))),
            ("verl's perf/throughput (tokens/s per verl device)", _num(base.verl_throughput),
             _num(cand.verl_throughput), _ratio(base.verl_throughput, cand.verl_throughput))]
    for per in ("device", "node"):
        for what, amount in (("samples", "samples_per_step"), ("tokens", "tokens_per_step")):
            b, c = base.per_hour(getattr(base, amount), per), cand.per_hour(getattr(cand, amount), per)
            rows.append((f"{what} per {per}-hour", _num(b), _num(c), _ratio(b, c)))
    out = ["## Efficiency per device, per chip and per node", "",
           table(["", base.role, cand.role], hw), "",
           "Throughput at the mean step time (`timing_s_mean/step`, `perf/total_num_tokens`); a sample is one "
           "generated response (`data.train_batch_size` × `rollout.n` per step).", "",
           table(["figure", base.role, cand.role, "candidate / baseline"], rows), "",
           f"Hardware-time per training step (the same work), candidate / baseline: {_ratios_text(ratios)}.", "",
           f"Hardware-hours of the whole run (end-to-end time × what was booked), candidate / baseline: "
           f"{_ratios_text(run_hour_ratios(base, cand))} (the guide's §6.3 end-to-end 1.58× is the per-node and "
           "per-chip figure of two runs of the same steps on one node of eight chips; per device an A3 counts "
           "each die).", ""]
    phases = [p for p in PHASE_FLOPS if p in base.mfu or p in cand.mfu]
    if phases:
        mfu_rows = [(f"`timing_s_mean/{p}`", _pct(base.mfu.get(p, (None, None))[0]),
                     _pct(base.mfu.get(p, (None, None))[1]), _pct(cand.mfu.get(p, (None, None))[0]),
                     _pct(cand.mfu.get(p, (None, None))[1])) for p in phases]
        out += ["### MFU per phase", "",
                f"Ours: {', '.join(f'{f} N' for f in sorted(set(PHASE_FLOPS.values())))} FLOPs per token "
                "(forward phases 2 N, the actor update 6 N) × `perf/total_num_tokens` / (phase time × devices × "
                "the profile's own peak); model size N: "
                f"{_billions(base.params_count)} ({base.params_source}) / {_billions(cand.params_count)} "
                f"({cand.params_source}). verl's `perf/mfu/*` differ because verl uses one peak per device family "
                "(354 TFLOPS for every Ascend 910 model, 148 for H20), counts attention FLOPs and divides by its own "
                "device count.", "",
                table(["phase", f"{base.role} (ours)", f"{base.role} (verl)", f"{cand.role} (ours)",
                       f"{cand.role} (verl)"], mfu_rows), ""]
    out += ["### Cost", ""]
    if not prices_given:
        out += ["No prices given: add `-P prices=prices.yaml` with one price per profile, per node-hour or per "
                "device-hour, e.g. `h20: {node_hour: 20.0}` and `a3: {device_hour: 1.6}`.", ""]
        return "\n".join(out)
    cost_rows = [(e.role, e.price_text or "no price for this profile", _num(e.cost_per_1k_samples),
                  _num(e.run_cost), _num(e.cost_per_accuracy_point)) for e in (base, cand)]
    out += [table(["side", "price", "per 1k samples", "whole run (e2e)", "per validation-accuracy point gained"],
                  cost_rows), ""]
    return "\n".join(out)


def first_screen_lines(base: Efficiency, cand: Efficiency, prices_given: bool, baseline_name: str,
                       candidate_name: str) -> list[str]:
    """The answer in words: who is faster per chip and per node, by how much, and the cost per 1k samples."""
    ratios, whole = work_time_ratios(base, cand), run_hour_ratios(base, cand)
    out = []
    for per in ("chip", "node"):
        r = ratios[per]
        if r is None:
            out.append(f"- per {per}: not measured (no `perf/total_num_tokens` or step time)")
        elif abs(r - 1) < 0.005:
            out.append(f"- per {per}: {candidate_name} and {baseline_name} are equally fast")
        else:
            faster, slower, factor = (baseline_name, candidate_name, r) if r > 1 else (candidate_name, baseline_name,
                                                                                      1 / r)
            end_to_end = f" ({whole[per]:.2f}× {per}-hours end to end, candidate / baseline)" if whole[per] else ""
            out.append(f"- per {per}: {faster} is faster: {slower} needs {factor:.2f}× the {per}-time per "
                       f"training step{end_to_end}")
    if prices_given:
        costs = ", ".join(f"{name} {_num(e.cost_per_1k_samples)}" for name, e in
                          ((baseline_name, base), (candidate_name, cand)))
        out.append(f"- cost per 1k samples: {costs}")
    else:
        out.append("- cost per 1k samples: no prices given (`-P prices=prices.yaml`, see Efficiency)")
    return out


def side_name(snap: RunSnapshot) -> str:
    """How the first screen names a side: its profile (``h20``), else its device, else its role."""
    tags = snap.tags
    return tags.get(names.PROFILE_TAG) or tags.get("device.name") or tags.get("device.type") or snap.role
