"""Which accelerator a machine or a run is: the shipped record that fits what ``npu-smi`` / ``nvidia-smi`` list,
the run profile's record beside it, and whether two runs ran on one accelerator.

    python -c "from verlflow.device.identity import record_from_name; print(record_from_name('npu', 'Ascend910_9392'))"

A machine is named by its listing tool ("910B2" → ``Ascend910B2``, "NVIDIA H100 80GB HBM3") plus the generation
verlflow derives (``Ascend910B2 (A2)``); a shipped profile fits it when its record's ``listed_as`` pattern finds that
label (:meth:`verlflow.config.Accelerator.lists`), and the record's SKU figures follow the listed SKU
(:meth:`~verlflow.config.Accelerator.for_listed`). Pure functions of names and profiles: the machine is read by
:mod:`verlflow.device.detect`, which calls :func:`node_from` with what it found.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass

from verlflow import config
from verlflow.config import Accelerator, Profile
from verlflow.device.parsers import npu_generation
from verlflow.errors import VerlflowError
from verlflow.platforms import Device, kinds
from verlflow.platforms.tags import (
    DETECTED_PROFILE_TAG,
    DETECTED_TAG,
    MEMORY_TAG,
    NAME_TAG,
    RECORD_FITS_TAG,
    TYPE_TAG,
)

# The override that runs a profile whose record is not the machine's (VerlflowBlock.accept_other_hardware).
ACCEPT_OVERRIDE = "verlflow.accept_other_hardware=true"
# How the A3's chips are named where the board query gave no SKU (npu-smi's table and torch_npu: "Ascend910").
A3_BARE_NAME = "Ascend910"


@dataclass(frozen=True)
class Node:
    """The accelerator a machine lists: its kind, its label (name plus generation), how many, the profiles that fit."""

    device: Device
    listed: str  # "Ascend910B2 (A2)", "Ascend910_9392 (A3)", "NVIDIA H100 80GB HBM3"
    count: int
    profiles: tuple[str, ...]  # shipped profiles whose record fits it, in list order
    # Each model and how many of it, when the devices are not one model (4 × H20 + 4 × H100); empty otherwise.
    mixed: tuple[tuple[str, int], ...] = ()
    # GPUs split into MIG slices (their nvidia-smi indexes): a process sees a slice, not the record's whole GPU.
    mig: tuple[int, ...] = ()
    # Memory per device as listed, GiB: tells the H20-3e (141 GB) from the H20 (96 GB), which share a name.
    memory_gb: float | None = None

    @property
    def profile(self) -> str | None:
        """The shipped profile ``auto`` picks for this node; None when none fits."""
        return self.profiles[0] if self.profiles else None

    def describe(self) -> str:
        """``8 × Ascend910B2 (A2)``: how messages name the node (``4 × NVIDIA H20 + 4 × ...`` when mixed)."""
        if self.mixed:
            return " + ".join(f"{count} × {name}" for name, count in self.mixed)
        return f"{self.count} × {self.listed}"


def generation(device_type: Device | str, name: str) -> str | None:
    """The generation a listed or tagged name implies: ``A2`` (910B SKUs), ``A3`` (``Ascend910_93xx`` and the A3's
    bare ``Ascend910``); None for GPUs and unknown names."""
    if str(device_type) != Device.NPU:
        return None
    return npu_generation(name) or ("A3" if name.strip() == A3_BARE_NAME else None)


def label(name: str, gen: str | None) -> str:
    """The name the records are matched against: ``Ascend910B3 (A2)``, ``NVIDIA H20``."""
    return f"{name} ({gen})" if gen else name


def shipped_profiles() -> list[Profile]:
    """Every shipped profile that loads (one that does not is the config tests' business, not identity's).

    Read once per state of the profile files: a compare asks for every run's hardware, dozens of times."""
    return copy.deepcopy(_profiles_as_files_are(_profile_files()))


def _profile_files() -> tuple[tuple[str, int], ...]:
    folder = config.PROFILES_DIR
    return tuple(sorted((path.name, path.stat().st_mtime_ns) for path in folder.iterdir() if path.is_file()))


@functools.lru_cache(maxsize=4)
def _profiles_as_files_are(files: tuple[tuple[str, int], ...]) -> list[Profile]:
    loaded = []
    for name in config.list_profiles():
        try:
            loaded.append(config.load_profile(name))
        except VerlflowError:
            continue
    return loaded


def fitting_profiles(dev: Device | str, listed: str) -> list[str]:
    """Shipped profiles whose hardware record describes a ``dev`` listed as ``listed`` (``Ascend910B3 (A2)``)."""
    return [p.name for p in shipped_profiles()
            if p.device == dev and p.accelerator is not None and p.accelerator.lists(listed)]


def node_from(device_type: Device | str, name: str, count: int, gen: str | None = None, *,
              mixed: Mapping[str, int] | None = None, mig: tuple[int, ...] = (),
              memory_gb: float | None = None) -> Node | None:
    """The node a listing found (``count`` devices named ``name``; ``mixed``: every model's count where they differ,
    ``mig``: GPUs in MIG mode, ``memory_gb``: per device as listed); None when nothing is listed (a laptop), and for
    a run whose ``device.type`` is missing or a kind this installation does not register."""
    if count <= 0 or not name or name == "unknown" or str(device_type) not in kinds():
        return None
    if not Device(device_type).is_accelerator:
        return None
    listed = label(name, gen or generation(device_type, name))
    return Node(Device(device_type), listed, count, tuple(fitting_profiles(device_type, listed)),
                mixed=tuple((mixed or {}).items()) if len(mixed or {}) > 1 else (), mig=tuple(mig),
                memory_gb=memory_gb)


def check_node(node: Node | None) -> None:
    """Refuse (one line) a node no single record describes: devices of two models, or GPUs split by MIG.

    Why: a run carries one record (its peak, memory, chips per node) and compare divides by it; on 4 × H20 +
    4 × H100 either record is wrong for half the devices, and a MIG slice has a fraction of the whole GPU's
    compute and memory that its record gives. Not waived by ``accept_other_hardware``: that runs another record
    on one model, which is still one record's figures; here no record's figures are the machine's.
    """
    if node is None:
        return
    word = node.device.short_word
    if node.mixed:
        raise VerlflowError(
            f"this node's {word}s are not one model ({node.describe()}): a run carries one hardware record, so its "
            f"per-{word}, MFU and cost figures would be wrong for some of them; run on a node whose {word}s are one "
            f"model, or show one model's {word}s only ({node.device.platform.visible_devices_var}=<their indexes>)")
    if node.mig:
        gpus = ", ".join(str(index) for index in node.mig)
        raise VerlflowError(
            f"{word} {gpus} of this node ({node.listed}) {'is' if len(node.mig) == 1 else 'are'} in MIG mode: a run "
            f"would see MIG slices, each a fraction of the whole {word} whose compute and memory the hardware record "
            f"gives (its MFU, per-{word} and memory figures would be wrong); verlflow has no record of a slice: "
            f"disable MIG (nvidia-smi -i {node.mig[0]} -mig 0, then reset the {word}) to train on whole {word}s")


def fitting_text(node: Node) -> str:
    """``the a2 profile fits it (-P profile=a2)``, or what to do when no shipped profile does."""
    if not node.profiles:
        return "no shipped profile fits it: add one (docs/hardware.md)"
    many = len(node.profiles) > 1
    return (f"the {' or '.join(node.profiles)} profile{'s' if many else ''} fit{'' if many else 's'} it "
            f"(-P profile={node.profiles[0]})")


def check_fits(profile: Profile, node: Node | None, *, accepted: bool) -> None:
    """Refuse (one line) a profile whose record is not the accelerator this machine lists, unless ``accepted``.

    Why: the record's peak, memory and chip counts become the run's ``device.*`` tags and compare's MFU, per-chip
    and cost figures; a wrong record makes every one of them wrong (an H100 run tagged H20: MFU 40 % for 6 %).
    Nothing is refused when nothing is listed (a dry run on a laptop) or the profile has no record.
    """
    record = profile.accelerator
    if accepted or node is None or record is None or node.device is not profile.device or record.lists(node.listed):
        return
    raise VerlflowError(
        f"profile '{profile.name}' describes {record.name} ({record.model}) but this node has {node.describe()}: "
        f"{fitting_text(node)}; to run the {profile.name} record here anyway pass "
        f"-P overrides=\"{ACCEPT_OVERRIDE}\" (its figures then describe another machine)")


def run_record(profile: Profile | None, node: Node | None) -> Accelerator | None:
    """The record a run on ``node`` carries: the profile's, with the listed SKU's figures (910B2 → its peak)."""
    if profile is None or profile.accelerator is None:
        return None
    if node is None:
        return profile.accelerator.for_listed("")
    return profile.accelerator.for_listed(node.listed, memory_gb=node.memory_gb)


def identity_tags(profile: Profile | None, node: Node | None) -> dict[str, str]:
    """Detected identity beside the profile's: ``device.detected``, ``device.detected_profile``,
    ``device.record_fits`` (the record itself is :meth:`Accelerator.tags`); empty when nothing is listed."""
    if node is None:
        return {}
    tags = {DETECTED_TAG: node.listed, DETECTED_PROFILE_TAG: node.profile or "none"}
    if profile is not None and profile.accelerator is not None:
        tags[RECORD_FITS_TAG] = str(profile.accelerator.lists(node.listed)).lower()
    return tags


def record_from_name(device_type: Device | str, name: str, memory_gb: float | None = None) -> Accelerator | None:
    """The shipped record of an accelerator named ``name`` (a run's ``device.name`` tag), SKU figures included;
    ``memory_gb`` (its ``device.memory_gb`` tag) tells SKUs of one name apart (the H20 from the H20-3e).

    For runs logged without a hardware record: ``Ascend910_9392`` is an A3 (2 dies per chip, 376 TFLOPS per die),
    ``Ascend910B2`` an A2 with the 910B2's peak; None when no shipped record fits (a CPU, an unknown GPU).
    """
    node = node_from(device_type, name, 1)
    if node is None or node.profile is None:
        return None
    return config.load_profile(node.profile).accelerator.for_listed(node.listed, memory_gb=memory_gb)


def accelerator_key(tags: Mapping[str, str]) -> str | None:
    """What identifies a run's accelerator: its shipped record and SKU, else its listed name; None when untagged."""
    kind, name = tags.get(TYPE_TAG) or "", (tags.get(NAME_TAG) or "").strip()
    if not kind or not name or name == "unknown":
        return None
    record = (record_from_name(kind, name, _number(tags.get(MEMORY_TAG)))
              if kind in Device and Device(kind).is_accelerator else None)
    return f"{kind}: {record.name} {record.model}" if record else f"{kind}: {name}"


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def same_accelerator(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Whether two runs (their tags) ran on one accelerator, whatever profile file described it.

    Two profile files of the same CPU, or ``h100`` and a copy of it, are one device to ``compare``: their
    per-chip difference is settings and noise, not hardware. False when either run's device is unknown.
    """
    key = accelerator_key(a)
    return key is not None and key == accelerator_key(b)
