"""The guide's cluster images (its §6.1 versions table) as data, and the check that verlflow installs into them.

    python -c "from verlflow.device.stacks import resolve_into; print(resolve_into('h20', '.').summary())"

``config/stacks/<name>.yaml`` holds each image: Python, platform, and every package's version. ``verlflow
doctor`` shows them as "what the guide used"; :func:`resolve_into` runs ``uv pip compile`` for that platform
and Python (metadata only, no wheels downloaded) on the image's pins plus verlflow, and reports whether it
resolves and which pin, if any, it would change. A package whose PyPI metadata the image itself contradicts
(vllm 0.9.2 asks torch 2.7.0, the H20 image runs 2.7.1) is passed as a uv override and named in the result.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verlflow.config import CONFIG_ROOT, load_named_yaml
from verlflow.errors import VerlflowError
from verlflow.platforms import Device

STACKS_DIR = CONFIG_ROOT / "stacks"


@dataclass
class Stack:
    """One cluster image: where it runs and the versions it holds."""

    name: str
    device: Device
    python: str
    platform: str
    # distribution name → {version, resolve (default true), image_override (default false), why}
    packages: dict[str, dict[str, Any]]
    extra: dict[str, Any] = field(default_factory=dict)

    def version(self, package: str) -> str | None:
        """The version the guide used for ``package`` (pip's name, ``-`` or ``_`` alike), or None."""
        wanted = _norm(package)
        return next((str(v["version"]) for k, v in self.packages.items() if _norm(k) == wanted), None)

    def install_command(self, package: str) -> str:
        """How to install the guide's version of ``package``: the stack's ``install`` line (torch_npu with its
        torch, vllm built from source on Ascend), else ``pip install <name>==<version>``."""
        wanted = _norm(package)
        name, spec = next(((k, v) for k, v in self.packages.items() if _norm(k) == wanted), (package, {}))
        if spec.get("install"):
            return str(spec["install"])
        return f"pip install {name}=={spec['version']}" if spec.get("version") else f"pip install {name}"

    def pins(self) -> dict[str, str]:
        """``name → version`` of the packages the resolution check pins (those not marked ``resolve: false``)."""
        return {k: str(v["version"]) for k, v in self.packages.items() if v.get("resolve", True)}

    def overrides(self) -> dict[str, str]:
        """Pins the image holds against another package's PyPI metadata (passed to uv as overrides)."""
        return {k: str(v["version"]) for k, v in self.packages.items() if v.get("image_override")}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def list_stacks() -> list[str]:
    """Names of the shipped stacks (``a3``, ``h20``)."""
    return sorted(p.stem for p in STACKS_DIR.glob("*.yaml"))


def load_stack(name: str) -> Stack:
    """The stack ``name`` from ``config/stacks`` or a stack file given by ``.yaml`` path (a profile's ``stack:``).

    Read like every other config file (an unknown name lists the shipped ones); a missing key is one line.
    """
    found = load_named_yaml("stack", name, STACKS_DIR)
    data = found.data
    known = ("name", "device", "python", "platform", "packages")
    if missing := [k for k in known if k not in data]:
        raise VerlflowError(f"stack file {found.path} lacks {', '.join(missing)}: give every one of {', '.join(known)}")
    if str(data["device"]) not in Device:
        raise VerlflowError(f"stack file {found.path} has device '{data['device']}': use one of {', '.join(Device)}")
    fields = {k: data[k] for k in known} | {"device": Device(str(data["device"]))}
    return Stack(**fields, extra={k: v for k, v in data.items() if k not in known})


def required_packages(stack: Stack) -> list[str]:
    """The stack's packages marked ``required: true``: without them verl cannot launch the recipe at all."""
    return [k for k, v in stack.packages.items() if v.get("required")]


@dataclass
class Resolution:
    """What ``uv pip compile`` made of the stack plus verlflow."""

    stack: str
    ok: bool
    # name → version uv chose (empty when it failed)
    resolved: dict[str, str]
    # pins uv would change: name → (image's version, resolved version)
    changed: dict[str, tuple[str, str]]
    # uv's own explanation when it failed (its error lines), else ''
    message: str
    overrides: dict[str, str]

    def summary(self) -> str:
        """One line for a person: resolves and keeps every pin, or why not."""
        if not self.ok:
            return f"verlflow does not install into the {self.stack} stack: {self.message}"
        if self.changed:
            moved = ", ".join(f"{k} {a} → {b}" for k, (a, b) in self.changed.items())
            return f"installing verlflow into the {self.stack} stack would change {moved}"
        return f"verlflow installs into the {self.stack} stack; all {len(self.resolved)} packages resolve, no pin moves"


def resolve_into(stack_name: str, project: str | Path, *, replace: dict[str, str] | None = None,
                 timeout_s: float = 600) -> Resolution:
    """Resolve ``project`` (verlflow's folder) together with the stack's pins for the stack's platform.

    ``replace`` swaps pins (``{"transformers": "4.40.0"}``) to show what a conflict looks like. Needs the
    package index (PyPI, or ``UV_INDEX_URL``); an unreachable index is a failed resolution, never a pass.
    """
    stack = load_stack(stack_name)
    pins = {**stack.pins(), **(replace or {})}
    overrides = stack.overrides()
    with tempfile.TemporaryDirectory(prefix="verlflow-stack-") as scratch:
        req = Path(scratch) / "requirements.in"
        req.write_text("".join(f"{k}=={v}\n" for k, v in pins.items())
                       + f"verlflow @ {Path(project).resolve().as_uri()}\n")
        argv = [sys.executable, "-m", "uv", "pip", "compile", str(req), "--python-version", stack.python,
                "--python-platform", stack.platform, "--no-header", "--no-annotate", "--quiet"]
        if overrides:
            over = Path(scratch) / "overrides.txt"
            over.write_text("".join(f"{k}=={v}\n" for k, v in overrides.items()))
            argv += ["--override", str(over)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=scratch)
    if done.returncode != 0:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
        return Resolution(stack_name, False, {}, {}, " ".join(lines)[:1500] or "uv failed", overrides)
    resolved = {}
    for line in done.stdout.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line.strip())
        if match:
            resolved[_norm(match.group(1).split("[")[0])] = match.group(2)
        elif line.strip().startswith("verlflow @"):
            resolved["verlflow"] = "local"
    changed = {k: (v, resolved.get(_norm(k), "absent")) for k, v in pins.items() if resolved.get(_norm(k)) != v}
    return Resolution(stack_name, True, resolved, changed, "", overrides)
