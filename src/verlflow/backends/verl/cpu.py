"""The launch side of verl on the CPU (``-P device=cpu -P backend=verl``) and the TRL check for every verl launch.

    mlflow run . --env-manager local -e train -P device=cpu -P backend=verl

The ``cpu-verl`` profile does the work: its environment loads :mod:`.cpu_plugin` into every verl
process (``VERL_USE_EXTERNAL_MODULES``), selects the ``cpu`` platform and gives Ray one fake GPU; its
overrides turn off what needs an accelerator. This module holds the checks made before such a launch, and
:func:`incompatible_trl`, which the NPU/GPU preflight calls
(:func:`verlflow.backends.verl.backend.check_launch`): verl 0.9.x crashes on TRL >= 1 in
``apply_monkey_patch`` on every device, and only the CPU plugin works around it.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError, version

from packaging.version import Version

from verlflow.errors import VerlflowError

CPU_PROFILE = "cpu-verl"
PLUGIN_MODULE = "verlflow.backends.verl.cpu_plugin"
PLUGIN_ENV = "VERL_USE_EXTERNAL_MODULES"
MIN_VERL = Version("0.9.0")


def _installed(package: str) -> Version | None:
    try:
        return Version(version(package))
    except PackageNotFoundError:
        return None


def check_cpu_launch(env: dict[str, str]) -> None:
    """Refuse, in one line, a CPU launch of verl that cannot work: verl < 0.9, or the plugin not loaded.

    ``env`` is the launch environment the profile exports.
    """
    verl = _installed("verl")
    if verl is None:
        raise VerlflowError("verl is not installed: pip install verl (>= 0.9 for the CPU), or use backend=local")
    if Version(verl.base_version) < MIN_VERL:
        raise VerlflowError(f"verl on the CPU needs verl >= {MIN_VERL} (installed: {verl}); "
                            "use backend=local here, or upgrade verl")
    if PLUGIN_MODULE not in env.get(PLUGIN_ENV, "").split(","):
        raise VerlflowError(f"device=cpu with backend=verl needs the '{CPU_PROFILE}' profile (its environment loads "
                            f"{PLUGIN_MODULE} into verl): pass -P profile={CPU_PROFILE}")


def incompatible_trl() -> str | None:
    """One line naming an installed TRL that verl's ``apply_monkey_patch`` crashes on, else None.

    verl (0.9.1 and earlier) imports ``AutoModelForCausalLMWithValueHead`` from ``trl.experimental.ppo`` or
    ``trl`` whenever TRL is importable; TRL >= 1 has neither. For NPU/GPU launches (the CPU plugin
    treats TRL as absent).
    """
    trl = _installed("trl")
    if trl is None or importlib.util.find_spec("trl") is None or trl < Version("1.0.0"):
        return None
    return (f"TRL {trl} is installed and verl's apply_monkey_patch imports AutoModelForCausalLMWithValueHead, "
            "which TRL >= 1 no longer has: pip uninstall trl (verl's GRPO does not need it) or pin trl<1")
