"""Typed schemas of verlflow's own settings: a device :class:`Profile` and the recipe's ``verlflow:`` block.

    python -c "from verlflow.config.schema import VerlflowBlock; print(VerlflowBlock())"

Each field is declared once here, with its type, its default and a one-line comment: the place to look up
what a key of a profile file or of a recipe's ``verlflow:`` block means. Reading YAML or overrides into these
classes (unknown keys, type conversion) is :func:`verlflow.config.typed_build.build`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from verlflow.errors import VerlflowError


class Device(StrEnum):
    """The accelerator a run drives: the one name for it in profiles, detection, backends and run tags.

    A profile decides it (``device:`` of ``config/profiles/<name>.yaml``); the ``device`` step parameter
    only chooses the profile. It is a ``str`` (``Device.GPU == "gpu"``), so tags and JSON read as before.
    """

    NPU = "npu"
    GPU = "gpu"
    CPU = "cpu"

    @property
    def torch_type(self) -> str:
        """The name torch and verl's ``trainer.device`` use for it: ``cuda`` for a GPU, else the same."""
        return "cuda" if self is Device.GPU else self.value

    @property
    def word(self) -> str:
        """How messages name it: ``NPU``, ``CUDA GPU``, ``CPU``."""
        return "CUDA GPU" if self is Device.GPU else self.value.upper()

    @classmethod
    def of_torch(cls, name: str) -> Device | None:
        """The device for a torch / ``trainer.device`` name (``cuda`` → gpu; ``gpu`` too); None when unknown."""
        return next((d for d in cls if name in (d.value, d.torch_type)), None)


DEVICES = tuple(Device)


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

    def __post_init__(self) -> None:
        """Refuse a device verlflow cannot drive, whichever way the profile was made (file, override)."""
        if self.device not in DEVICES:
            raise VerlflowError(f"profile '{self.name}' has device '{self.device}': use one of {', '.join(DEVICES)}")
        self.device = Device(self.device)

    def to_dict(self) -> dict[str, Any]:
        """The profile as plain data, for ``device_profile.json`` and run comparison."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


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
    # verl backend: rollouts traced into MLflow per training step and agent-loop worker (0 = off).
    rollout_traces: int = 2
    # Seconds between system-metric samples of a train run (0 = no system metrics).
    system_metrics_interval: float = 10.0

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
