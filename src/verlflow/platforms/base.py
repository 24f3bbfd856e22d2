"""The platform of one device kind, and the registry every call site asks instead of branching on the kind.

A :class:`Platform` is what differs between an Ascend NPU, a CUDA GPU and the host CPU (verl models the same as
``PlatformBase``): torch's name for it, the variable that narrows what a process sees, the Ray resource, the
collective library, verl's profiler tool, the command that lists the devices, the system-metric names and the
default profile. :class:`Device` is a kind's name (``npu``): a ``str`` accepted only for a registered kind, so
profiles, tags and ``-P device=`` read as before, and a new kind is one module calling :func:`register`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_PLATFORMS: dict[str, Platform] = {}
_DEVICES: dict[str, Device] = {}


@dataclass(frozen=True)
class Platform:
    """What verlflow needs to know about one device kind; every field is data, read by the call sites."""

    kind: str  # the Device value: the profile's `device:`, the `device.type` tag, `-P device=`
    word: str  # how messages name one: "NPU", "CUDA GPU", "CPU"
    torch_type: str  # torch's and verl's trainer.device name: "npu", "cuda", "cpu"
    default_profile: str  # the shipped profile `auto` picks when no record fits the machine
    accelerator: bool = True  # False for the host CPU: the smoke recipe, float32, the local trainer by default
    torch_extension: str | None = None  # the module that makes torch drive it ("torch_npu"), if any
    needs_cuda_torch: bool = False  # a CPU build of torch cannot drive it (torch.version.cuda must be set)
    visible_devices_var: str | None = None  # what narrows the devices a process sees (verl's keyword)
    ray_resource: str | None = None  # the Ray resource its workers ask for
    collective_backend: str = "gloo"  # torch.distributed's backend: hccl, nccl, gloo
    collective_env_prefix: str | None = None  # prefix of the collective library's settings (HCCL_, NCCL_)
    profiler_tool: str = "torch"  # verl's global_profiler.tool for verlflow.profile_steps
    lister: tuple[str, ...] = ()  # the command that lists the devices (npu-smi info, nvidia-smi)
    # The module that reads the lister's output into a device profile (`count_listed(probe)` and
    # `fields(probe, environ)`, see verlflow.device.detect); None: nothing to list (the host CPU).
    collector: str | None = None
    import_check: str = ""  # python that fails unless torch can drive one here (doctor's row)
    # What its system/<kind>_<i>_<name> metrics call util, mem_mb, mem_pct and power (compare's utilisation).
    system_metric_keys: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def short_word(self) -> str:
        """How tables name one of them: ``NPU``, ``GPU``, ``CPU``."""
        return self.kind.upper()

    @property
    def lister_name(self) -> str:
        """How a message names the lister: ``npu-smi info``, ``nvidia-smi``; '' when there is none."""
        return " ".join(self.lister)


class _DeviceKinds(type):
    """Lets ``Device`` be iterated and tested like the enum it was: ``tuple(Device)``, ``"npu" in Device``."""

    def __iter__(cls) -> Iterator[Device]:
        return iter([Device(kind) for kind in _PLATFORMS])

    def __contains__(cls, value: object) -> bool:
        return isinstance(value, str) and value in _PLATFORMS

    def __len__(cls) -> int:
        return len(_PLATFORMS)


class Device(str, metaclass=_DeviceKinds):
    """The accelerator a run drives: the one name for it in profiles, detection, backends and run tags.

    A profile decides it (``device:`` of ``config/profiles/<name>.yaml``); the ``device`` step parameter only
    chooses the profile. It is a ``str`` (``Device.GPU == "gpu"``), one object per kind (``is`` compares), and
    only a registered kind is one: ``Device("tpu")`` raises ValueError. What differs by kind is its
    :attr:`platform`; the properties below are the ones the call sites read most.
    """

    __slots__ = ()
    NPU: Device
    GPU: Device
    CPU: Device

    def __new__(cls, value: object) -> Device:
        """The registered kind named ``value``; ValueError naming the valid ones otherwise."""
        if isinstance(value, Device):
            return value
        kind = str(value)
        if kind not in _PLATFORMS:
            raise ValueError(f"{kind!r} is not a valid Device: use one of {', '.join(_PLATFORMS)}")
        return _DEVICES[kind]

    @property
    def value(self) -> str:
        """The kind as a plain string (as the enum's ``.value`` was)."""
        return str.__str__(self)

    @property
    def platform(self) -> Platform:
        """Everything that differs by kind."""
        return _PLATFORMS[self]

    @property
    def torch_type(self) -> str:
        """The name torch and verl's ``trainer.device`` use for it: ``cuda`` for a GPU, else the same."""
        return self.platform.torch_type

    @property
    def word(self) -> str:
        """How messages name it: ``NPU``, ``CUDA GPU``, ``CPU``."""
        return self.platform.word

    @property
    def short_word(self) -> str:
        """How tables name one of them: ``NPU``, ``GPU``, ``CPU``."""
        return self.platform.short_word

    @property
    def is_accelerator(self) -> bool:
        """False for the host CPU."""
        return self.platform.accelerator

    @property
    def visible_devices_var(self) -> str | None:
        """The variable that narrows what a process sees (verl's ``get_visible_devices_keyword``); None on CPU."""
        return self.platform.visible_devices_var

    @property
    def ray_resource(self) -> str | None:
        """The Ray resource name its workers ask for (``NPU`` / ``GPU``); None on CPU."""
        return self.platform.ray_resource

    @property
    def collective_env_prefix(self) -> str | None:
        """Prefix of its collective library's settings (``HCCL_`` on Ascend, ``NCCL_`` on CUDA); None on CPU."""
        return self.platform.collective_env_prefix

    @classmethod
    def of_torch(cls, name: str) -> Device | None:
        """The device for a torch / ``trainer.device`` name (``cuda`` → gpu; ``gpu`` too); None when unknown."""
        return next((d for d in cls if name in (d.value, d.torch_type)), None)

    def __reduce__(self):
        return Device, (self.value,)


def register(platform: Platform) -> Platform:
    """Make ``platform.kind`` a :class:`Device` (a second registration of a kind replaces the first)."""
    _PLATFORMS[platform.kind] = platform
    _DEVICES.setdefault(platform.kind, str.__new__(Device, platform.kind))
    return platform


def unregister(kind: str) -> None:
    """Forget a kind added with :func:`register` (a test's made-up kind); the shipped ones stay."""
    if kind not in ("npu", "gpu", "cpu"):  # the shipped kinds: every profile and tag names them
        _PLATFORMS.pop(kind, None)
        _DEVICES.pop(kind, None)


def platform_of(kind: Device | str) -> Platform:
    """The platform of ``kind`` (a Device or its name); ValueError naming the valid kinds when it is none."""
    return Device(kind).platform


def kinds() -> tuple[Device, ...]:
    """Every registered kind, in registration order (npu, gpu, cpu, then any added)."""
    return tuple(Device)
