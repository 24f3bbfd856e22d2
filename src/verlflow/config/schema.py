"""Typed schemas of verlflow's own settings: a device :class:`Profile` and the recipe's ``verlflow:`` block.

    python -c "from verlflow.config.schema import VerlflowBlock; print(VerlflowBlock())"

Each field is declared once here, with its type, its default and a one-line comment: the place to look up
what a key of a profile file or of a recipe's ``verlflow:`` block means. Reading YAML or overrides into these
classes (unknown keys, type conversion) is :func:`verlflow.config.typed_build.build`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from verlflow.errors import VerlflowError
from verlflow.platforms import Device
from verlflow.platforms import tags as device_tags
from verlflow.platforms.tags import RECORD_TAG


@dataclass
class Sku:
    """One SKU of a record's accelerator family whose figures differ from the record's (an A2's 910B1/B2/B4).

    ``skus:`` of a profile's ``accelerator:``. The listing tool names the SKU (``npu-smi`` prints ``910B2``), so the
    run carries its own peak and bandwidth (:meth:`Accelerator.for_listed`), not the family's default.
    """

    # Regular expression searched in the listed name ("Ascend910B2 (A2)"): "910B2C?" for the 910B2 and 910B2C.
    listed_as: str
    # The SKU as its vendor names it: "Ascend 910B2".
    model: str
    # Peak dense throughput per device, TFLOPS, in the record's ``peak_dtype``.
    peak_tflops: float
    # Where the peak comes from (a data sheet, a paper, or "publicly reported" with the derivation).
    peak_source: str
    # Memory per device, GB, where it differs from the record's (the 910B4: 32).
    memory_gb: float | None = None
    # HBM bandwidth per device, GB/s, where it differs from the record's, and its source.
    hbm_gbps: float | None = None
    hbm_source: str = ""
    # Where the listed name does not tell this SKU from the record's: the least memory per device (GiB, as the
    # listing tool prints it) that makes it this SKU (the H20-3e, 141 GB, listed as "NVIDIA H20" as the 96 GB is).
    listed_memory_gb: float | None = None

    def fits(self, listed: str, memory_gb: float | None) -> bool:
        """Whether a device listed as ``listed`` with ``memory_gb`` GiB per device is this SKU."""
        if re.search(self.listed_as, listed) is None:
            return False
        return self.listed_memory_gb is None or (memory_gb is not None and memory_gb >= self.listed_memory_gb)


@dataclass
class Accelerator:
    """A profile's hardware record: which accelerator, how verl counts it, what one device can do.

    ``accelerator:`` of ``config/profiles/<name>.yaml``. Doctor, preflight, the device tags and ``compare``
    read these fields, so a new node is a profile file (plus a stack file), not a change to code.
    """

    # What people call the node: "A3", "A2", "H20" (doctor: "run on an A2 node"; matched in the listed name).
    name: str
    # The accelerator as its vendor names it, SKU included: "Ascend 910B3", "NVIDIA H100 SXM5 80GB".
    model: str
    # The machine it sits in: "Atlas 800T A2 (8 x 910B)", "HGX H100 8-GPU".
    node: str
    # Devices per node as verl counts them (a full node's trainer.n_gpus_per_node; an A3 die is one device).
    devices_per_node: int
    # Memory per device, GB as the data sheet counts it (npu-smi / nvidia-smi MiB / 1024 lands within a few %).
    memory_gb: float
    # Peak dense throughput per device, TFLOPS, in ``peak_dtype`` (no sparsity), derived from ``peak_source``.
    peak_tflops: float
    # Where the peak comes from: the data sheet's name (or "publicly reported" where no data sheet gives it).
    peak_source: str
    # Links between the devices of a node: "HCCS", "NVLink 4 (900 GB/s per GPU)".
    interconnect: str
    # Precision of ``peak_tflops``: bf16 or fp16 (the data sheet's dense figure).
    peak_dtype: str = "bf16"
    # Chips per device (1 everywhere so far: a device is never more than one chip).
    chips_per_device: int = 1
    # Dies per chip; verl counts each die as a device (910C: 2, so 8 chips = 16 devices).
    dies_per_chip: int = 1
    # Regular expression searched in the listing tool's name plus verlflow's generation ("Ascend910B3 (A2)",
    # "NVIDIA H100 80GB HBM3"); empty = ``name`` as a whole word.
    listed_as: str = ""
    # HBM bandwidth per device, GB/s (per die where a chip holds several): generation at small batch is bound by it.
    hbm_gbps: float | None = None
    # Where the bandwidth comes from (data sheet or paper); required with ``hbm_gbps``.
    hbm_source: str = ""
    # Where the memory size comes from (data sheet, or what the listing tool prints).
    memory_source: str = ""
    # SKUs of this family with their own figures (see :class:`Sku`); the record's own figures are the default SKU's.
    skus: list[Sku] = field(default_factory=list)

    def __post_init__(self) -> None:
        """Refuse counts that contradict each other, a precision the peak cannot be in, a figure without source."""
        if self.peak_dtype not in ("bf16", "fp16"):
            raise VerlflowError(f"accelerator '{self.name}' has peak_dtype '{self.peak_dtype}': use bf16 or fp16")
        for key in ("devices_per_node", "chips_per_device", "dies_per_chip"):
            if getattr(self, key) < 1:
                raise VerlflowError(f"accelerator '{self.name}' has {key}={getattr(self, key)}: give 1 or more")
        if self.dies_per_chip > 1 and self.devices_per_node % self.dies_per_chip:
            raise VerlflowError(f"accelerator '{self.name}' has devices_per_node={self.devices_per_node}, not a "
                                f"multiple of dies_per_chip={self.dies_per_chip}: verl counts every die")
        for sku in [self, *self.skus]:
            if sku.hbm_gbps is not None and (sku.hbm_gbps <= 0 or not sku.hbm_source):
                raise VerlflowError(f"accelerator '{self.name}' ({sku.model}) has hbm_gbps={sku.hbm_gbps}: give a "
                                    "positive GB/s per device and its hbm_source")
            if sku.peak_tflops <= 0 or not sku.peak_source:
                raise VerlflowError(f"accelerator '{self.name}' ({sku.model}) has peak_tflops={sku.peak_tflops}: "
                                    "give a positive TFLOPS per device and its peak_source")

    @property
    def chips_per_node(self) -> int:
        """Chips in a node: devices / dies per chip (an A3: 16 devices = 8 chips x 2 dies)."""
        return self.devices_per_node * self.chips_per_device // self.dies_per_chip

    def pattern(self) -> str:
        """The regular expression that recognises this accelerator in a listed name (see ``listed_as``)."""
        return self.listed_as or rf"(?<![A-Za-z0-9]){re.escape(self.name)}(?![A-Za-z0-9])"

    def lists(self, listed: str) -> bool:
        """Whether ``listed`` (``Ascend910B3 (A2)``, ``NVIDIA H20``) is this accelerator."""
        return re.search(self.pattern(), listed) is not None

    def for_listed(self, listed: str, memory_gb: float | None = None) -> Accelerator:
        """This record with the figures of the SKU ``listed`` names (``Ascend910B2 (A2)`` → the 910B2's peak), or
        that its listed memory per device (GiB) tells apart (a 141 GB "NVIDIA H20" → the H20-3e).

        Why: one A2 profile serves every 910B SKU, and each SKU's peak and bandwidth differ by up to 1.7x; the
        run must carry its own. The record itself when no SKU matches; the result lists no SKUs.
        """
        sku = next((s for s in self.skus if s.fits(listed, memory_gb)), None)
        if sku is None:
            return dataclasses.replace(self, skus=[]) if self.skus else self
        return dataclasses.replace(
            self, model=sku.model, peak_tflops=sku.peak_tflops, peak_source=sku.peak_source,
            memory_gb=sku.memory_gb if sku.memory_gb is not None else self.memory_gb,
            hbm_gbps=sku.hbm_gbps if sku.hbm_gbps is not None else self.hbm_gbps,
            hbm_source=sku.hbm_source or self.hbm_source, skus=[])

    def tags(self) -> dict[str, str]:
        """The record as ``device.*`` run tags (model, devices per node, memory, peak, bandwidth, interconnect)."""
        tags = {RECORD_TAG: self.name, device_tags.MODEL_TAG: self.model, device_tags.NODE_TAG: self.node,
                device_tags.DEVICES_PER_NODE_TAG: str(self.devices_per_node),
                device_tags.PEAK_TFLOPS_TAG: f"{self.peak_tflops:g} {self.peak_dtype}",
                device_tags.DIES_PER_CHIP_TAG: str(self.dies_per_chip),
                device_tags.INTERCONNECT_TAG: self.interconnect}
        if self.hbm_gbps:
            tags[device_tags.HBM_GBPS_TAG] = f"{self.hbm_gbps:g}"
        return tags


@dataclass
class Profile:
    """What differs between two machines running the same recipe (``config/profiles/<name>.yaml``)."""

    # The file's stem (a3, h20, cpu, …); set from the file name, not a key of the file.
    name: str
    # npu | gpu | cpu: which accelerator this profile drives.
    device: Device
    # One line for people: what machine this is.
    description: str = ""
    # Exported before launch (A3: TASK_QUEUE_ENABLE=2 enables the two-level task pipeline).
    env: dict[str, str] = field(default_factory=dict)
    # Shell files sourced before launch, when they exist (CANN's set_env.sh, ATB's set_env.sh).
    source_files: list[str] = field(default_factory=list)
    # Shared libraries put on LD_PRELOAD when present (jemalloc on aarch64, as the guide does).
    preload: list[str] = field(default_factory=list)
    # verl overrides of this profile, a tree shaped like verl's config.
    verl: dict[str, Any] = field(default_factory=dict)
    # The hardware record (see :class:`Accelerator`); None for the CPU profiles.
    accelerator: Accelerator | None = None
    # The software image this node expects: a stack name (``config/stacks/<name>.yaml``) or a ``.yaml`` path
    # (relative to the profile file); '' for the CPU profiles.
    stack: str = ""

    def __post_init__(self) -> None:
        """Refuse a device verlflow cannot drive, and a record that contradicts the profile's verl counts."""
        if self.device not in Device:  # a registered kind (verlflow.platforms)
            raise VerlflowError(f"profile '{self.name}' has device '{self.device}': use one of {', '.join(Device)}")
        self.device = Device(self.device)
        per_node = self.verl.get("trainer", {}).get("n_gpus_per_node") if isinstance(self.verl, dict) else None
        if self.accelerator is not None and per_node is not None and int(per_node) != self.accelerator.devices_per_node:
            raise VerlflowError(f"profile '{self.name}' sets trainer.n_gpus_per_node={per_node} but its accelerator "
                                f"has devices_per_node={self.accelerator.devices_per_node}: make them equal")

    def to_dict(self) -> dict[str, Any]:
        """The profile as plain data, for ``device_profile.json`` and run comparison."""
        return {f.name: asdict(v) if is_dataclass(v) else v for f in fields(self) for v in [getattr(self, f.name)]}


# Profile fields a ``profile.<field>=…`` override may not set: the name is the file's, and the ``verl`` tree's
# keys are overridden as plain verl keys.
PROFILE_OVERRIDE_FIXED = ("name", "verl")


@dataclass(frozen=True)
class VerlflowBlock(Mapping):
    """The recipe's ``verlflow:`` block: settings verlflow itself reads (verl never sees them).

    Set in a recipe file under ``verlflow:`` or on the command line as ``verlflow.<key>=…``. Read fields as
    attributes (``cfg.verlflow.output_dir``); the read-only mapping interface (``block.get(key, default)``)
    serves helpers that also take a plain dict.
    """

    # Registered model name of this recipe's runs ('' = none: register and main then need -P model_name=…).
    model_name: str = ""
    # Data the main pipeline preprocesses when -P source= is empty (a hub dataset id, synthetic, synthetic-easy).
    data_source: str = "openai/gsm8k"
    # Root of the per-run folders, <root>/<run id>/ (None = the backend's own: outputs/verl or outputs/local).
    output_dir: str | None = None
    # verl backend: module launched instead of verl's trainer, or a .py file (the tests' stand-in).
    launch_module: str = "verl.trainer.main_ppo"
    # verl backend: launch without checking devices, data files and the model folder.
    skip_preflight: bool = False
    # Local trainer: validation rows used (None = the recipe's data.val_max_samples).
    val_limit: int | None = None
    # Rollouts traced into MLflow (the run's Traces tab; 0 = off): verl backend, per training step and
    # agent-loop worker; local trainer, per step that logs its samples table.
    rollout_traces: int = 2
    # Seconds between system-metric samples of a train run (0 = no system metrics).
    system_metrics_interval: float = 10.0
    # Local trainer: one torch thread, deterministic algorithms, every generator seeded from the rollout seed, so
    # two runs of one config are bit-identical (tag verlflow.deterministic; compare notes runs without it).
    deterministic: bool = False
    # Training steps to profile (e.g. [2]): the local trainer runs torch.profiler over them; the verl backend turns on
    # verl's global_profiler with the tool that fits the profile. Traces and a summary table go to profile/step_<N>/.
    profile_steps: tuple[int, ...] = ()
    # Run a profile whose hardware record is not the accelerator npu-smi / nvidia-smi list here (refused otherwise,
    # before the run opens): its peak, memory and chip counts then describe another machine (tag device.record_fits).
    accept_other_hardware: bool = False

    def __getitem__(self, key: str) -> Any:
        """The field ``key`` (a ``KeyError`` for a name that is not a field)."""
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        """The field names, in declaration order."""
        return iter(self.keys())

    def __len__(self) -> int:
        """The number of fields."""
        return len(self.keys())

    def keys(self) -> tuple[str, ...]:  # type: ignore[override]
        """Every key a ``verlflow:`` block may hold, in declaration order."""
        return tuple(f.name for f in fields(self))
