"""The arithmetic of compare's efficiency section: per device, per chip and per node; MFU per phase; cost.

What a hardware decision needs and verl's own figures do not give: verl's ``perf/throughput`` divides by verl's
device count, which on an A3 counts dies (two per 910C chip), and its ``perf/mfu/*`` uses one peak for every Ascend
910 model (354 TFLOPS) and 148 for H20 (``verl/utils/flops_counter.py``). Here every figure is divided by what was
booked — devices as verl counts them (an A3 device is one die), chips (devices / ``dies_per_chip`` of the profile's
hardware record: 1 or 3 A3 dies are 0.5 or 1.5 chips) and nodes (``trainer.nnodes``) — and MFU uses the profile's
own peak and the model's active parameters (:mod:`.model_size`). Per-step figures are per training step,
per-token figures per token (prompt + response, verl's ``perf/total_num_tokens``); where a run's tokens per step
differ the two disagree, and each is labelled. A figure whose input param the run lacks is "unknown", never
computed from a default. Plain computation on :class:`RunSnapshot` objects;
:mod:`.efficiency` writes it up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from verlflow import names
from verlflow.compare.model_size import ModelSize, model_size
from verlflow.compare.prices import Price, read_prices
from verlflow.compare.snapshot import RunSnapshot
from verlflow.device import identity
from verlflow.errors import VerlflowError
from verlflow.platforms import tags as device_tags

__all__ = ["Efficiency", "Hardware", "efficiency_of", "hardware_of", "read_prices", "run_hour_ratios",
           "step_time_ratios", "work_time_ratios"]

UNKNOWN = "unknown"
TOKENS_KEY = "perf/total_num_tokens"
VERL_THROUGHPUT_KEY = "perf/throughput"
RESPONSE_LENGTH_KEY = "response_length/mean"
# FLOPs per token and parameter of each phase: a forward pass is 2 N per token, forward and backward 6 N.
# Attention FLOPs are left out (verl's counter includes them): at 2k-token sequences on a 4B model they add ~10%.
PHASE_FLOPS = {"gen": 2, "old_log_prob": 2, "ref": 2, "update_actor": 6}
# verl's own MFU figure for a phase, where it logs one.
VERL_MFU = {"update_actor": "perf/mfu/actor", "old_log_prob": "perf/mfu/actor_infer", "ref": "perf/mfu/ref"}
PARAMS = {"per_node": "trainer/n_gpus_per_node", "nodes": "trainer/nnodes", "batch": "data/train_batch_size",
          "n": "actor_rollout_ref/rollout/n", "ppo_epochs": "actor_rollout_ref/actor/ppo_epochs",
          "rollout_tp": "actor_rollout_ref/rollout/tensor_model_parallel_size",
          "rollout_dtype": "actor_rollout_ref/rollout/dtype"}
# The hardware record's HBM bandwidth per device (per die on an A3), GB/s: config.schema.Accelerator's field and the
# run's device.<field> tag. Read by name, either spelling (hbm_gbps is the record's; hbm_bandwidth_gbs was agreed
# first), and unknown where a record predates it.
HBM_FIELDS = ("hbm_gbps", "hbm_bandwidth_gbs")
_DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4, "float": 4}
PER = ("device", "chip", "node")


@dataclass
class Hardware:
    """What a run booked, as its params and its profile's hardware record say (None: the param is missing)."""

    devices: int | None  # as verl counts them: trainer.n_gpus_per_node x trainer.nnodes (an A3 die is one)
    nodes: int | None
    dies_per_chip: int
    peak_tflops: float | None  # per device, from the profile's record; None without one (the CPU profiles)
    record: str  # where the record came from
    name: str = ""  # the record's accelerator name: "A3", "H20"
    hbm_bandwidth_gbs: float | None = None  # per device; None where the record has none

    @property
    def chips(self) -> float | None:
        """Chips booked: devices / dies per chip (an A3 node: 16 devices = 8 chips; 3 A3 dies = 1.5 chips)."""
        return None if self.devices is None else self.devices / self.dies_per_chip

    @property
    def device_word(self) -> str:
        """What one of verl's devices is on this hardware: a ``die`` where a chip has several, else a ``device``."""
        return "die" if self.dies_per_chip > 1 else "device"

    def count(self, per: str) -> float | None:
        """How many ``device``s, ``chip``s or ``node``s were booked (None when a param is missing)."""
        return {"device": self.devices, "chip": self.chips, "node": self.nodes}[per]


def _param_int(snap: RunSnapshot, key: str) -> int | None:
    """A positive integer param of the run; None when it is missing or not one (never a default)."""
    try:
        value = int(float(snap.params[key]))
    except (KeyError, ValueError):
        return None
    return value if value >= 1 else None


def _tag_float(snap: RunSnapshot, key: str) -> float | None:
    try:
        return float((snap.tags.get(key) or "").split(" ")[0])
    except ValueError:
        return None


def hardware_of(snap: RunSnapshot) -> Hardware:
    """Devices, nodes, dies per chip, peak and bandwidth of a run: params, ``device.*`` tags, else its profile."""
    per_node, nodes = _param_int(snap, PARAMS["per_node"]), _param_int(snap, PARAMS["nodes"])
    devices = per_node * nodes if per_node and nodes else None
    dies, peak = _tag_float(snap, device_tags.DIES_PER_CHIP_TAG), _tag_float(snap, device_tags.PEAK_TFLOPS_TAG)
    bandwidth = next((found for f in HBM_FIELDS if (found := _tag_float(snap, device_tags.tag(f)))), None)
    name, record = "", "the run's device.* tags"
    accelerator, source = _record_of(snap)
    if accelerator is not None:
        name = accelerator.name
        if dies is None or peak is None:
            record = source
        dies = dies or accelerator.dies_per_chip
        peak = peak or accelerator.peak_tflops
        bandwidth = bandwidth or next((v for f in HBM_FIELDS if (v := getattr(accelerator, f, None))), None)
    elif peak is None:
        record = "no hardware record (no peak: MFU not computed)"
    return Hardware(devices, nodes, int(dies or 1), peak, record, name, float(bandwidth) if bandwidth else None)


def _record_of(snap: RunSnapshot):
    """The run's hardware record and where it came from: its profile's, else the shipped one its device.name fits."""
    from verlflow import config

    profile = snap.tags.get(names.PROFILE_TAG, "")
    try:
        if profile and (found := config.load_profile(profile).accelerator) is not None:
            return found, f"profile {profile}'s hardware record"
    except VerlflowError:
        pass  # a profile file of another machine
    found = identity.record_from_name(snap.tags.get(device_tags.TYPE_TAG, ""), snap.tags.get(device_tags.NAME_TAG, ""))
    return (found, f"the shipped {found.name} record its device.name fits") if found else (None, "")


def mean_metric(snap: RunSnapshot, key: str) -> float | None:
    """A metric averaged over the run's steps (its history), else its last value; None when never logged."""
    points = [v for _, v in snap.histories.get(key, []) if math.isfinite(v)]
    if points:
        return sum(points) / len(points)
    return snap.metrics.get(key)


def mean_tokens_per_step(snap: RunSnapshot) -> float | None:
    """Tokens per training step (prompt + response, verl's ``perf/total_num_tokens``), averaged over the steps."""
    return mean_metric(snap, TOKENS_KEY)


@dataclass
class Efficiency:
    """One side's throughput per device, chip and node, MFU per phase and, with a price, its cost."""

    role: str
    hardware: Hardware
    step_s: float | None
    e2e_s: float | None
    tokens_per_step: float | None
    samples_per_step: int | None  # generated responses: data.train_batch_size x rollout.n (None: a param missing)
    verl_throughput: float | None
    accuracy_gain: float | None  # validation accuracy, last - first validation, in points
    mfu: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # phase -> (ours, verl's)
    model: ModelSize = field(default_factory=lambda: ModelSize(None, None, UNKNOWN))
    ppo_epochs: int | None = None
    gen_bandwidth: float | None = None  # generation's HBM bandwidth utilisation (a lower bound), 0..1
    gen_bandwidth_note: str = ""
    missing: list[str] = field(default_factory=list)  # the params this run lacks (their figures are unknown)
    price: Price | None = None
    price_text: str = ""

    @property
    def params_count(self) -> float | None:
        """Parameters one token passes through (the active ones of an MoE model): the N of the FLOPs."""
        return self.model.active

    @property
    def params_source(self) -> str:
        """Where :attr:`params_count` came from."""
        return self.model.source

    def tokens_per_s(self, per: str) -> float | None:
        """Tokens per second per ``device`` / ``chip`` / ``node`` at the mean step time."""
        count = self.hardware.count(per)
        if self.tokens_per_step is None or not self.step_s or not count:
            return None
        return self.tokens_per_step / self.step_s / count

    def per_hour(self, amount: float | None, per: str) -> float | None:
        """``amount`` per step as an amount per ``device``-, ``chip``- or ``node``-hour at the mean step time."""
        count = self.hardware.count(per)
        if amount is None or not self.step_s or not count:
            return None
        return amount / self.step_s * 3600 / count

    def step_hardware_s(self, per: str) -> float | None:
        """Hardware-seconds per training step: mean step time × ``device``s / ``chip``s / ``node``s booked."""
        count = self.hardware.count(per)
        return self.step_s * count if self.step_s and count else None

    def token_hardware_s(self, per: str) -> float | None:
        """Hardware-seconds per token: :meth:`step_hardware_s` / tokens per step."""
        step = self.step_hardware_s(per)
        return step / self.tokens_per_step if step and self.tokens_per_step else None

    def run_hours(self, per: str) -> float | None:
        """Hardware-hours the whole run took: end-to-end hours × ``device``s / ``chip``s / ``node``s booked."""
        count = self.hardware.count(per)
        return self.e2e_s / 3600 * count if self.e2e_s and count else None

    @property
    def price_per_hour(self) -> float | None:
        """The price of everything booked per hour: the unit price × the chips, nodes or devices booked."""
        count = self.hardware.count(self.price.per) if self.price else None
        return self.price.amount * count if self.price and count else None

    def _cost_of(self, seconds: float | None) -> float | None:
        return self.price_per_hour * seconds / 3600 if self.price_per_hour is not None and seconds else None

    @property
    def cost_per_step(self) -> float | None:
        """The price of one training step (mean step time) on the booked hardware."""
        return self._cost_of(self.step_s)

    @property
    def cost_per_1m_tokens(self) -> float | None:
        """The price of one million tokens (prompt + response) at the mean step time."""
        step = self.cost_per_step
        return step / self.tokens_per_step * 1e6 if step is not None and self.tokens_per_step else None

    @property
    def cost_per_1k_samples(self) -> float | None:
        """The price of the booked hardware for the time 1000 samples take at the mean step time."""
        step = self.cost_per_step
        return step / self.samples_per_step * 1000 if step is not None and self.samples_per_step else None

    @property
    def run_cost(self) -> float | None:
        """The price of the booked hardware for the whole run (end-to-end time)."""
        return self._cost_of(self.e2e_s)

    @property
    def cost_per_accuracy_point(self) -> float | None:
        """The run's cost per validation-accuracy point it gained (None when it gained none)."""
        if self.run_cost is None or not self.accuracy_gain or self.accuracy_gain <= 0:
            return None
        return self.run_cost / self.accuracy_gain


def _accuracy_gain(snap: RunSnapshot) -> float | None:
    points = [v for _, v in snap.histories.get(names.VAL_ACCURACY, []) if math.isfinite(v)]
    return (points[-1] - points[0]) * 100 if len(points) >= 2 else None


def _mfu(eff: Efficiency, phase: str, seconds: float) -> float | None:
    """FLOPs of ``phase`` (2 or 6 N per token, the update × ``ppo_epochs``) / (time × devices × peak)."""
    n, hw, tokens = eff.params_count, eff.hardware, eff.tokens_per_step
    passes = 1 if phase != "update_actor" else eff.ppo_epochs
    if not (n and tokens and hw.devices and hw.peak_tflops and passes):
        return None
    return PHASE_FLOPS[phase] * n * tokens * passes / (seconds * hw.devices * hw.peak_tflops * 1e12)


def gen_bandwidth(snap: RunSnapshot, eff: Efficiency) -> tuple[float | None, str]:
    """Generation's HBM bandwidth utilisation, a lower bound, and how it was found (or why it is unknown).

    Decoding reads the weights once per iteration, and at small batch that read bounds it: the H20 has much
    bandwidth and little compute, the A3 the reverse. Lower bound: each rollout replica (``tensor_model_parallel
    _size`` devices) decodes all its sequences in one wave, so it reads its weights (all parameters: a batch
    touches nearly every expert of an MoE) once per response token; KV-cache reads are not counted. Bytes
    = mean response length × parameters × bytes per parameter (``rollout.dtype``), per replica, over generation
    time × the replica's devices × each device's bandwidth from the hardware record.
    """
    gen_s = snap.metrics.get(f"{names.TIMING_MEAN_PREFIX}gen")
    length = mean_metric(snap, RESPONSE_LENGTH_KEY)
    tp = _param_int(snap, PARAMS["rollout_tp"])
    dtype_bytes = _DTYPE_BYTES.get(str(snap.params.get(PARAMS["rollout_dtype"], "")).lower())
    needs = {"HBM bandwidth in the hardware record": eff.hardware.hbm_bandwidth_gbs,
             "timing_s_mean/gen": gen_s, RESPONSE_LENGTH_KEY: length, f"param {PARAMS['rollout_tp']}": tp,
             f"param {PARAMS['rollout_dtype']}": dtype_bytes, "the model's size": eff.model.total}
    lacking = [what for what, value in needs.items() if not value]
    if lacking:
        return None, f"unknown (missing: {', '.join(lacking)})"
    weight_bytes = eff.model.total * dtype_bytes
    used = length * weight_bytes / (gen_s * tp * eff.hardware.hbm_bandwidth_gbs * 1e9)
    return used, (f"{length:.0f} response tokens × {weight_bytes / 1e9:.3g} GB of weights / ({gen_s:g} s × {tp} "
                  f"devices × {eff.hardware.hbm_bandwidth_gbs:g} GB/s)")


def efficiency_of(snap: RunSnapshot, prices: Mapping[str, Price] | None = None) -> Efficiency:
    """The efficiency of one run (or a side's mean snapshot); ``prices``: profile → :class:`Price` from a YAML."""
    hardware = hardware_of(snap)
    ints = {what: _param_int(snap, PARAMS[what]) for what in ("per_node", "nodes", "batch", "n", "ppo_epochs")}
    batch, n = ints["batch"], ints["n"]
    eff = Efficiency(snap.role, hardware, snap.metrics.get(f"{names.TIMING_MEAN_PREFIX}step"),
                     snap.metrics.get(names.TIMING_E2E), mean_tokens_per_step(snap), batch * n if batch and n else None,
                     snap.metrics.get(VERL_THROUGHPUT_KEY), _accuracy_gain(snap), model=model_size(snap),
                     ppo_epochs=ints["ppo_epochs"], missing=[PARAMS[w] for w, v in ints.items() if v is None])
    for phase in PHASE_FLOPS:
        seconds = snap.metrics.get(f"{names.TIMING_MEAN_PREFIX}{phase}")
        if seconds:
            eff.mfu[phase] = (_mfu(eff, phase, seconds), snap.metrics.get(VERL_MFU.get(phase, "")))
    eff.gen_bandwidth, eff.gen_bandwidth_note = gen_bandwidth(snap, eff)
    profile = snap.tags.get(names.PROFILE_TAG, "")
    if prices and profile in prices:
        eff.price = prices[profile]
        eff.price_text = price_text(eff.price, hardware)
    return eff


def price_text(price: Price, hardware: Hardware) -> str:
    """``3 per chip-hour × 8 chips``; a device-hour price on a multi-die chip says that a device is one die."""
    count = hardware.count(price.per)
    word = hardware.device_word if price.per == "device" else price.per
    booked = f" × {count:g} {word}{'' if count == 1 else 's'}" if count is not None else f" × unknown {word}s"
    note = f" (one {hardware.name or 'such'} device = one die)" if price.per == "device" and word == "die" else ""
    return f"{price.amount:g} per {price.unit.replace('_', '-')}{note}{booked}"


def _ratios(base: Efficiency, cand: Efficiency, figure: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for per in PER:
        b, c = getattr(base, figure)(per), getattr(cand, figure)(per)
        out[per] = c / b if b and c else None
    return out


def step_time_ratios(base: Efficiency, cand: Efficiency) -> dict[str, float | None]:
    """Hardware-time per training step, candidate / baseline, per device, chip and node (mean step time × booked)."""
    return _ratios(base, cand, "step_hardware_s")


def work_time_ratios(base: Efficiency, cand: Efficiency) -> dict[str, float | None]:
    """Hardware-time per token (the same work), candidate / baseline, per device, chip and node.

    Equal to :func:`step_time_ratios` when both runs' steps carry the same tokens; where they differ (longer
    responses on one side) only this one compares the same work. Per device it counts each A3 die.
    """
    return _ratios(base, cand, "token_hardware_s")


def run_hour_ratios(base: Efficiency, cand: Efficiency) -> dict[str, float | None]:
    """Hardware-hours of the whole runs, candidate / baseline, per device, chip and node.

    For two runs of the same steps on one node of eight chips each (the guide's A3 and H20), per node and per
    chip this is the guide's end-to-end 1.58x; per device it counts each A3 die, so twice that.
    """
    return _ratios(base, cand, "run_hours")


def side_name(snap: RunSnapshot) -> str:
    """How the first screen names a side: its profile (``h20``), else its device, else its role."""
    tags = snap.tags
    return tags.get(names.PROFILE_TAG) or tags.get(device_tags.NAME_TAG) or tags.get(device_tags.TYPE_TAG) or snap.role

