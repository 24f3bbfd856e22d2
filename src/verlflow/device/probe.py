"""The machine as this package sees it: run a command, read a file, look for a module (:class:`Probe`).

Tests build a :class:`Probe` from recorded ``npu-smi`` / ``nvidia-smi`` / CANN outputs, so every path of
:mod:`verlflow.device.detect` runs without the hardware. Nothing here imports torch or torch_npu at import time.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verlflow.device.parsers import first_error_line
from verlflow.errors import VerlflowError


def run_command(cmd: Sequence[str]) -> str | None:
    """stdout of ``cmd``, or None when it is not installed, fails, or hangs for 60 s."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def command_failure(cmd: Sequence[str]) -> str | None:
    """Why ``cmd`` gave no output to parse: not installed, or its own first error line; None when it succeeds.

    Asked only after :func:`run_command` came back empty, so a user sees npu-smi's ``dcmi model initialized
    failed ... ret is -8020`` instead of "no NPU on this machine".
    """
    if shutil.which(cmd[0]) is None:
        return f"{cmd[0]} not found on PATH"
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", timeout=60)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd)} did not answer in 60 s"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(cmd)} could not run: {exc}"
    if done.returncode == 0:
        return None
    return first_error_line(done.stderr) or first_error_line(done.stdout) or f"exit status {done.returncode}"


def read_text(path: str) -> str | None:
    """The file's text, or None when it is missing or unreadable."""
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def module_installed(name: str) -> bool:
    """Whether a top-level module is installed, found without importing it.

    Importing torch_npu fails until CANN's set_env.sh is sourced, which the launcher does for
    verl's process, not for ours; so "installed" is the honest test here.
    """
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_torch_npu() -> bool:
    """Import torch_npu (it registers ``torch.npu``); False when it is not installed.

    An installed torch_npu that fails to import (CANN's ``set_env.sh`` not sourced, a torch it was not
    built for) raises :class:`VerlflowError` with the first line of the real error, not a traceback.
    """
    if not module_installed("torch_npu"):
        return False
    try:
        import torch_npu  # noqa: F401
    except Exception as exc:  # ImportError, OSError (missing libascend*.so), RuntimeError from its init
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise VerlflowError(
            f"torch_npu is installed but fails to import ({first[:200]}): source "
            "/usr/local/Ascend/ascend-toolkit/set_env.sh, or check that torch_npu matches torch") from None
    return True


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` (the CUDA torch was built with), read from torch/version.py
    without importing torch; None for CPU / NPU builds or when torch is absent."""
    if "torch" in sys.modules:
        return getattr(getattr(sys.modules["torch"], "version", None), "cuda", None)
    spec = importlib.util.find_spec("torch")
    for location in (spec.submodule_search_locations or []) if spec else []:
        found = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]",
                          read_text(os.path.join(location, "version.py")) or "", re.MULTILINE)
        if found:
            return found.group(1)
    return None


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class Probe:
    """How this module sees the machine; the default looks at the real one.

    Tests build one with :meth:`recorded` from fixture texts: "this machine prints the A3
    ``npu-smi info`` of fixture X and has CANN file Y" is one call.
    """

    run: Callable[[Sequence[str]], str | None] = run_command
    read: Callable[[str], str | None] = read_text
    import_ok: Callable[[str], bool] = module_installed
    torch_cuda: Callable[[], str | None] = torch_cuda_version
    # why a command gave nothing (see :func:`command_failure`); asked only when ``run`` returned None
    failure: Callable[[Sequence[str]], str | None] = command_failure
    ascend_root: str = "/usr/local/Ascend"
    machine: str = field(default_factory=platform.machine)
    cpu_count: int = field(default_factory=_cpu_count)

    @classmethod
    def recorded(
        cls,
        commands: Mapping[str, str] | None = None,
        files: Mapping[str, str] | None = None,
        modules: Sequence[str] = (),
        *,
        failing: Mapping[str, str] | None = None,
        torch_cuda: str | None = None,
        machine: str = "x86_64",
        cpu_count: int = 8,
        ascend_root: str = "/usr/local/Ascend",
    ) -> Probe:
        """A machine that prints ``commands[" ".join(cmd)]`` and holds ``files[path]``; ``failing`` commands
        exit non-zero printing their recorded text; any other command is missing, any other file absent, only
        ``modules`` installed."""
        commands, files, failing = dict(commands or {}), dict(files or {}), dict(failing or {})

        def failure(cmd: Sequence[str]) -> str | None:
            line = " ".join(cmd)
            if line in failing:
                return first_error_line(failing[line]) or "exit status 1"
            return None if line in commands else f"{cmd[0]} not found on PATH"

        return cls(
            run=lambda cmd: commands.get(" ".join(cmd)),
            failure=failure,
            read=files.get,
            import_ok=lambda name: name in modules,
            torch_cuda=lambda: torch_cuda,
            ascend_root=ascend_root,
            machine=machine,
            cpu_count=cpu_count,
        )
