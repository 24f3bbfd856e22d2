"""What ``auto`` means on each device: the recipe and the profile a step uses when the user names none.

    python -c "from verlflow.config.device_defaults import default_recipe; print(default_recipe('npu'))"

The default profile is each platform's (:attr:`verlflow.platforms.Platform.default_profile`); here as plain data
so that ``models`` (evaluate's default data) reads it without importing a backend.
"""

from __future__ import annotations

from collections.abc import Mapping

from verlflow.platforms import Device, platform_of

GUIDE_RECIPE = "qwen3-4b-gsm8k-grpo"
SMOKE_RECIPE = "smoke"
# verl's own trainer on the CPU (backend=verl, device=cpu): loads verlflow's CPU plugin into verl.
VERL_CPU_PROFILE = "cpu-verl"


class _DefaultProfiles(Mapping):
    """Device → its platform's default profile, read live, so a kind registered later has one too."""

    def __getitem__(self, device: str) -> str:
        try:
            return platform_of(device).default_profile
        except ValueError:
            raise KeyError(device) from None

    def __iter__(self):
        return iter(Device)

    def __len__(self) -> int:
        return len(Device)


PROFILE_FOR_DEVICE = _DefaultProfiles()


def default_recipe(device: Device | str) -> str:
    """The guide's recipe on an accelerator, the smoke recipe on the CPU."""
    return GUIDE_RECIPE if platform_of(device).accelerator else SMOKE_RECIPE
