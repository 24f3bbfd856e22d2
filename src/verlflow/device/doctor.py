"""What `verlflow doctor` checks: can the guide's recipe launch here? What this machine has against the guide's.

    verlflow doctor --device npu          # same as: mlflow run . --env-manager local -e doctor -P device=npu

Prints one table row per item — device count against ``trainer.n_gpus_per_node`` (when the listing tool fails,
its own first error line, e.g. npu-smi's ``dcmi model initialized failed ... ret is -8020``), the accelerator
model against the one the profile's stack describes (A3 vs an A2 / 910B node, H20 vs another GPU), driver /
firmware / CANN files and whether CANN's ``set_env.sh`` was sourced, ``import torch_npu`` (or CUDA) with the
first line of the real error, the versions of torch, torch_npu, vllm, vllm_ascend, ray, verl, transformers
against the guide's §6.1 stack (``config/stacks``), jemalloc, and the HCCL/NCCL environment — then exits 0 when
the launch can proceed and 2 (naming what blocks it, each with a fix pinned to the stack: torch_npu with its
torch, vllm built from source on Ascend) otherwise. Versions that differ from the guide's are shown, not
blocking: the guide's numbers are a reference, not a requirement.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from verlflow import config
from verlflow.config import Accelerator, Profile
from verlflow.device import detect as hw
from verlflow.device import identity, stacks
from verlflow.errors import VerlflowError
from verlflow.platforms import Device

STATUS = {True: "ok", False: "BLOCKS", None: "differs"}
# A device's memory as listed (MiB / 1024) within this fraction of the record's data-sheet GB is the same memory.
MEMORY_TOLERANCE = 0.10


@dataclass
class Row:
    """One line of the doctor's table."""

    item: str
    found: str
    guide: str
    # True: fine; False: blocks the launch; None: differs from the guide but does not block.
    ok: bool | None
    fix: str = ""
    # Printed under the table whatever the status (the node is not the one the profile describes).
    note: str = ""


def import_error(module_check: str, source_files: list[str]) -> str | None:
    """First line of the error of ``python -c <module_check>`` after sourcing the files that exist; None if fine.

    A subprocess, as the launch runs verl: torch_npu imports only after CANN's ``set_env.sh``.
    """
    lines = [f"[ -f {shlex.quote(f)} ] && source {shlex.quote(f)} >/dev/null 2>&1" for f in source_files]
    lines.append(f"exec {shlex.quote(sys.executable)} -c {shlex.quote(module_check)}")
    try:
        done = subprocess.run(["bash", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "timed out after 300 s"
    if done.returncode == 0:
        return None
    text = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in text if "Error" in ln or "error" in ln]
    return (errors or text or [f"exit status {done.returncode}"])[-1][:200]



def _same_version(found: str | None, guide: str | None) -> bool:
    if not found or not guide:
        return False
    return found == guide or found.split("+")[0] == guide.split("+")[0]


def diagnose(dev: Device | str, profile_name: str, *, probe: hw.Probe | None = None,
             environ: Mapping[str, str] | None = None, versions: Mapping[str, str] | None = None,
             check_import: Callable[[str, list[str]], str | None] = import_error) -> list[Row]:
    """The doctor's rows for ``dev`` on ``profile_name``; every input injectable (tests: recorded machines).

    What the node should be comes from the profile alone: its hardware record (``accelerator:``) for the
    device rows, its stack (``stack:``, a file in ``config/stacks``) for the versions and what is required.
    """
    import os

    dev = Device(dev)
    probe = probe or hw.Probe()
    environ = dict(os.environ if environ is None else environ)
    versions = dict(hw.package_versions() if versions is None else versions)
    profile = config.load_profile(profile_name)
    if profile.device is not dev:
        raise VerlflowError(f"profile '{profile.name}' is for device '{profile.device}', not '{dev}': pass a "
                            f"{dev} profile ({', '.join(profiles_for(dev))}) or --device {profile.device}")
    if not profile.stack:
        raise VerlflowError(f"profile '{profile.name}' names no stack: add 'stack: <a file of config/stacks>' "
                            "so doctor knows which versions the node expects")
    stack = stacks.load_stack(profile.stack)
    word = dev.short_word
    rows: list[Row] = []

    wanted = int(profile.verl.get("trainer", {}).get("n_gpus_per_node", 1))
    visible = hw.count_visible(dev, probe=probe, environ=environ)
    fields = hw.collect_device_profile(dev, probe=probe, environ=environ)
    model = accelerator_row(fields, profile)
    rows.append(Row(f"{word}s visible", str(visible), f"n_gpus_per_node={wanted}", visible >= wanted and visible > 0,
                    _count_fix(dev, visible, probe, model)))
    rows.append(model)
    record = identity.run_record(profile, hw.node_of(fields))
    if memory := memory_row(fields, record):
        rows.append(memory)
    rows += _driver_rows(dev, fields, stack, probe, profile, environ)
    error = check_import(dev.platform.import_check, profile.source_files) if visible or versions.get("torch") else \
        f"skipped: no {word} visible"
    rows.append(_import_row(dev, profile, stack, error))
    rows += _package_rows(stack, versions, profile, probe)
    prefix = dev.collective_env_prefix
    comm = {k: v for k, v in hw.capture_env(environ).items() if k.startswith(prefix)}
    rows.append(Row(f"{prefix}* environment", " ".join(f"{k}={v}" for k, v in sorted(comm.items())) or "none set",
                    "defaults", True))
    return rows


def _driver_rows(dev: Device, fields: hw.DeviceProfile, stack: stacks.Stack, probe: hw.Probe, profile: Profile,
                 environ: Mapping[str, str]) -> list[Row]:
    """The driver, toolkit and environment rows of ``dev`` (Ascend: HDK, firmware, CANN, set_env.sh)."""
    rows: list[Row] = []
    if dev is Device.NPU:
        rows.append(Row("driver (HDK)", fields.driver or "not found", stack.extra.get("hdk", ""),
                        None if fields.driver and not fields.driver.startswith(str(stack.extra.get("hdk"))) else
                        bool(fields.driver), "install the Ascend driver (HDK)"))
        rows.append(Row("firmware", fields.firmware or "not found", stack.extra.get("hdk", ""),
                        True if fields.firmware else None))
        cann_ok = bool(fields.cann) and str(fields.cann).startswith(str(stack.extra.get("cann")))
        rows.append(Row("CANN toolkit", fields.cann or "not found", stack.extra.get("cann", ""),
                        (True if cann_ok else None) if fields.cann else False,
                        f"install CANN under {probe.ascend_root}"))
        for path in profile.source_files:
            present = probe.read(path) is not None
            rows.append(Row(Path(path).parent.name + "/" + Path(path).name, "present" if present else "missing",
                            "sourced by the launch", present, f"install the package that provides {path}"))
        sourced = any(environ.get(v) for v in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"))
        rows.append(Row("set_env.sh sourced here", "yes" if sourced else "no", "yes (the launch sources it)",
                        True if sourced else None, "the launch sources it itself; source it to use torch_npu here"))
    elif dev.platform.needs_cuda_torch:
        rows.append(Row("driver", fields.driver or "not found", "", bool(fields.driver), "install the NVIDIA driver"))
        cuda = probe.torch_cuda()
        rows.append(Row("torch CUDA build", cuda or "none (CPU build)", stack.extra.get("cuda", ""),
                        bool(cuda), stack.install_command("torch")))
    return rows


def _package_rows(stack: stacks.Stack, versions: Mapping[str, str], profile: Profile, probe: hw.Probe) -> list[Row]:
    """One row per package of the stack (installed vs the guide's version) and per library preloaded."""
    rows: list[Row] = []
    required = {_item(p) for p in stacks.required_packages(stack)}
    for package in stack.packages:
        item = _item(package)
        found, guide = versions.get(item), stack.version(package)
        blocking = item in required and not found
        ok = False if blocking else (True if _same_version(found, guide) else None)
        rows.append(Row(item, found or "not installed", guide or "", ok, stack.install_command(package)))
    for lib in profile.preload:
        present = probe.read(lib) is not None
        rows.append(Row("jemalloc" if "jemalloc" in lib else lib, "present" if present else "missing",
                        "preloaded when present", True if present else None, "apt-get install libjemalloc2"))
    return rows


def _item(package: str) -> str:
    """A stack's distribution name as the doctor's row and :func:`hw.package_versions` name it (torch_npu)."""
    return package.replace("-", "_")


def profiles_for(dev: Device) -> list[str]:
    """Shipped profiles that drive ``dev`` (for messages that name the valid ones)."""
    return [p.name for p in identity.shipped_profiles() if p.device is dev]


def fitting_profiles(dev: Device, listed: str) -> list[str]:
    """Shipped profiles whose hardware record describes a ``dev`` listed as ``listed`` (``Ascend910B3 (A2)``)."""
    return identity.fitting_profiles(dev, listed)


def node_label(fields: hw.DeviceProfile) -> str:
    """The node's accelerator as listed, with the generation verlflow derives: ``Ascend910B3 (A2)``, ``NVIDIA H20``."""
    return identity.label(fields.name, fields.extra.get("generation"))


def accelerator_row(fields: hw.DeviceProfile, profile: Profile) -> Row:
    """The node's accelerator against the profile's hardware record (A3 vs A2 / 910B, H20 vs another GPU).

    The note always names the node and the shipped profile that fits it. Another model differs, it does not
    block by itself: the device count row says what that costs.
    """
    record = profile.accelerator
    wanted = record.name if record else ""
    if fields.count == 0 or fields.name == "unknown":
        return Row("accelerator", "none listed", wanted, None)
    node = hw.node_of(fields)
    try:
        identity.check_node(node)
    except VerlflowError as no_record:  # two models, or MIG slices: no one record describes the node
        found = (f"{node.describe()} (mixed)" if node.mixed else
                 f"{node.listed}, MIG mode on GPU {', '.join(str(index) for index in node.mig)}")
        return Row("accelerator", found, wanted, False, str(no_record))
    found = node_label(fields)
    fits = fitting_profiles(Device(fields.type), found)
    fitting = (f"the {' or '.join(fits)} profile{'s' if len(fits) > 1 else ''} fit{'' if len(fits) > 1 else 's'} it"
               f" (-P profile={fits[0]})" if fits else
               "no shipped profile fits it: add one (CONTRIBUTING.md, \"Add a device\")")
    if record is None:
        return Row("accelerator", found, "", None, note=f"this node has {fields.count} × {found}, and the "
                   f"{profile.name} profile has no hardware record (accelerator:); {fitting}")
    if record.lists(found):
        record = record.for_listed(found, fields.memory_gb)  # the listed SKU's figures (a 910B2: its own peak)
        return Row("accelerator", found, wanted, True,
                   note=f"this node has {fields.count} × {found}: {record.model} ({record.peak_tflops:g} TFLOPS "
                        f"{record.peak_dtype}), {record.node}; "
                        f"the {profile.name} profile fits it")
    note = f"this node has {fields.count} × {found}, not the {wanted} the {profile.name} profile describes; {fitting}"
    return Row("accelerator", found, wanted, None, note=note)


def memory_row(fields: hw.DeviceProfile, record: Accelerator | None) -> Row | None:
    """Memory per device as listed (GiB) against the record's data-sheet GB; None when either is unknown."""
    if record is None or not fields.memory_gb:
        return None
    same = abs(fields.memory_gb - record.memory_gb) <= MEMORY_TOLERANCE * record.memory_gb
    return Row("memory per device", f"{fields.memory_gb:g} GiB", f"{record.memory_gb:g} GB ({record.model})",
               True if same else None, "" if same else "another memory size: batch and rollout memory settings "
               "tuned for the profile may not fit")


def _import_row(dev: Device, profile: Profile, stack: stacks.Stack, error: str | None) -> Row:
    """Whether torch drives one here (the platform's ``import_check``), and what to install when it does not."""
    extension = dev.platform.torch_extension
    if dev is Device.NPU:
        fix = (f"source {' and '.join(profile.source_files)}; torch_npu must match torch: "
               f"{stack.install_command('torch_npu')}")
    elif dev.platform.needs_cuda_torch:
        fix = f"install the NVIDIA driver and a CUDA build of torch: {stack.install_command('torch')}"
    else:
        fix = f"install {extension or 'the torch build'} for {dev.word}: {stack.install_command(extension or 'torch')}"
    label = f"import {extension}" if extension else f"torch.{dev.torch_type}"
    return Row(label, "ok" if error is None else error, "ok", error is None, fix)


def _count_fix(dev: Device, visible: int, probe: hw.Probe, model: Row) -> str:
    """What to do about too few devices: the listing tool's own error, or the node that is not the profile's."""
    cmd = hw.lister_command(dev)
    lister, word = cmd[0], dev.short_word
    if visible == 0:
        failure = probe.failure(cmd)
        if failure and "not found on PATH" not in failure:
            return f"{dev.platform.lister_name} failed: {failure}"
        where = f"an {model.guide} node" if model.guide else f"a node with {word}s"
        return f"no {word} on this machine ({failure or lister + ' lists none'}): run on {where}"
    override = f"pass -P overrides=\"trainer.n_gpus_per_node={visible}\""
    if model.note and model.ok is not True:
        return f"{model.note}; run on an {model.guide} node, or {override} to run here"
    return override


def render(rows: list[Row]) -> str:
    """The rows as an aligned text table."""
    head = ("item", "this machine", "guide", "status")
    body = [(r.item, r.found, r.guide, STATUS[r.ok]) for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(4)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
